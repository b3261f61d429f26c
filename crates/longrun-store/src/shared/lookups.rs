//! Reads off the job path as [`Script`]s both stores run: results,
//! tombstones, idempotency records, the console's summaries of live work
//! and tenants, typical durations.

use longrun_core::fingerprint::Fingerprint;

use super::*;

fn result(r: &Row) -> Result<ResultRecord> {
    Ok(ResultRecord {
        id: Id::from_trusted(r.text(0)?),
        operation_id: Id::from_trusted(r.text(1)?),
        tenant: r.text(2)?,
        storage_key: r.text(3)?,
        content_type: r.text(4)?,
        size_bytes: r.int(5)?,
        sha256: r.text(6)?,
        state: r.text(7)?,
        created_at: r.ts(8)?,
        expires_at: r.opt_ts(9)?,
        name: r.text(10)?,
    })
}

/// The result artifacts of an operation of `tenant`, published or expired, by name.
pub(crate) fn result_for_operation(tenant: &str, id: &Id) -> Script<Vec<ResultRecord>> {
    Script::one(
        "SELECT id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state, created_at,
                expires_at, name
           FROM results WHERE operation_id = ?1 AND tenant = ?2 AND state <> 'uploaded' ORDER BY name",
        vec![id.as_str().into(), tenant.into()],
        |d| all(d, result),
    )
}

pub(crate) fn result_get(id: &Id) -> Script<Option<ResultRecord>> {
    Script::one(
        "SELECT id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state, created_at,
                expires_at, name
           FROM results WHERE id = ?1",
        vec![id.as_str().into()],
        |d| optional(d, result),
    )
}

/// When the operation was removed, while its tombstone lives.
pub(crate) fn operation_tombstone(tenant: &str, id: &Id) -> Script<Option<Timestamp>> {
    Script::one(
        "SELECT removed_at FROM tombstones WHERE operation_id = ?1 AND tenant = ?2",
        vec![id.as_str().into(), tenant.into()],
        |d| optional(d, |r| r.ts(0)),
    )
}

pub(crate) fn operation_tenant(id: &Id) -> Script<Option<String>> {
    Script::one(
        "SELECT tenant FROM operations WHERE id = ?1",
        vec![id.as_str().into()],
        |d| optional(d, |r| r.text(0)),
    )
}

/// The idempotency record that made the operation, while it is kept.
pub(crate) fn idempotency_record(tenant: &str, id: &Id) -> Script<Option<IdempotencyRecord>> {
    Script::one(
        "SELECT k.key, k.kind, k.created_at, k.replays FROM operations o
           JOIN idempotency_keys k ON k.tenant = o.tenant AND k.kind = o.kind AND k.key = o.idempotency_key
          WHERE o.id = ?1 AND o.tenant = ?2 AND k.operation_id = o.id",
        vec![id.as_str().into(), tenant.into()],
        |d| {
            optional(d, |r| {
                Ok(IdempotencyRecord {
                    key: r.text(0)?,
                    kind: r.text(1)?,
                    created_at: r.ts(2)?,
                    replays: r.int(3)?,
                })
            })
        },
    )
}

/// The median time to success of the kind's last 101 successes.
pub(crate) fn kind_typical_duration(kind: &str) -> Script<Option<Duration>> {
    Script::one(
        "SELECT completed_at - created_at FROM operations WHERE {pg: rest_state}{sqlite: state} = 'succeeded' AND kind = ?1
          ORDER BY completed_at DESC LIMIT 101",
        vec![kind.into()],
        |d| {
            let mut durations = all(d, |r| r.int(0))?;
            if durations.is_empty() {
                return Ok(None);
            }
            durations.sort_unstable();
            let median = durations[durations.len() / 2].max(0);
            Ok(Some(Duration::from_millis(u64::try_from(median).unwrap_or(0))))
        },
    )
}

/// Live work by kind and state (of one tenant, or all), with its oldest.
///
/// Read from the tasks (live work only), each joined to its operation:
/// `CROSS JOIN` keeps SQLite to that order whatever its statistics say
/// (taken while the queue was empty, they made it read every stored
/// operation and look for its task); PostgreSQL plans it as the inner join
/// it is.
pub(crate) fn active_summary(tenant: Option<&str>) -> Script<Vec<ActiveGroup>> {
    Script::one(
        "SELECT o.kind, o.state, COUNT(*), MIN(o.created_at) FROM tasks t CROSS JOIN operations o
          WHERE o.id = t.operation_id AND (?1 IS NULL OR t.tenant = ?1)
          GROUP BY o.kind, o.state ORDER BY o.kind, o.state",
        vec![tenant.into()],
        |d| {
            all(d, |r| {
                Ok(ActiveGroup {
                    kind: r.text(0)?,
                    state: r.state(1)?,
                    count: r.count(2)?,
                    oldest_created_at: r.ts(3)?,
                })
            })
        },
    )
}

/// The leases held (of one tenant, or all), soonest to lapse first.
pub(crate) fn lease_list(tenant: Option<&str>, limit: u32) -> Script<Vec<LeaseInfo>> {
    Script::one(
        "SELECT t.operation_id, t.tenant, t.kind, t.worker_id, o.attempt, t.lease_expires_at, t.lease_ms, o.progress
           FROM tasks t JOIN operations o ON o.id = t.operation_id
          WHERE t.status = 'leased' AND (?1 IS NULL OR t.tenant = ?1)
          ORDER BY t.lease_expires_at LIMIT ?2",
        vec![tenant.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                let expires = r.ts(5)?;
                Ok(LeaseInfo {
                    operation_id: Id::from_trusted(r.text(0)?),
                    tenant: r.text(1)?,
                    kind: r.text(2)?,
                    worker_id: r.opt_text(3)?,
                    attempt: r.int(4)?,
                    lease_expires_at: expires,
                    last_heartbeat_at: r.opt_int(6)?.map(|ms| Timestamp(expires.0 - ms)),
                    progress: r.json(7)?.map(|v| progress_from_json(&v)),
                })
            })
        },
    )
}

/// Every tenant's limits, with its live and running work.
pub(crate) fn tenant_usage() -> Script<Vec<TenantUsage>> {
    Script::one(
        "SELECT n.name, n.max_active, n.max_running, n.rate,
                (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name),
                (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name AND t.status = 'leased')
           FROM tenants n ORDER BY n.name",
        vec![],
        |d| {
            all(d, |r| {
                Ok(TenantUsage {
                    limits: TenantLimits {
                        name: r.text(0)?,
                        max_active: r.opt_int(1)?,
                        max_running: r.opt_int(2)?,
                        rate: r.opt_real(3)?,
                    },
                    active: r.count(4)?,
                    running: r.count(5)?,
                })
            })
        },
    )
}

/// What maintenance has yet to do: live work by kind and state with its
/// oldest, and what retention, garbage collection and webhook delivery have
/// waiting at `now`.
pub(crate) fn backlog(now: Timestamp) -> Script<Backlog> {
    Script {
        stmts: vec![
            Stmt {
                // From the tasks, as `active_summary` reads them.
                sql: "SELECT o.kind, o.state, MIN(o.created_at) FROM tasks t CROSS JOIN operations o
                       WHERE o.id = t.operation_id GROUP BY o.kind, o.state",
                args: vec![],
            },
            Stmt {
                sql: "SELECT (SELECT COUNT(*) FROM operations WHERE expires_at IS NOT NULL AND expires_at <= ?1)
                           + (SELECT COUNT(*) FROM results WHERE state = 'published' AND expires_at <= ?1)
                           + (SELECT COUNT(*) FROM tombstones WHERE expires_at <= ?1),
                             (SELECT COUNT(*) FROM artifact_garbage),
                             (SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= ?1),
                             (SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0)",
                args: vec![now.into()],
            },
        ],
        decode: |d| {
            let oldest_active = d.before.first().map_or(&[][..], Vec::as_slice);
            let oldest_active = oldest_active
                .iter()
                .map(|r| Ok((r.text(0)?, r.state(1)?, r.ts(2)?)))
                .collect::<Result<_>>()?;
            one(d, |r| {
                Ok(Backlog {
                    oldest_active: Vec::new(),
                    retention_due: r.count(0)?,
                    garbage_objects: r.count(1)?,
                    webhooks_due: r.count(2)?,
                    webhooks_failing: r.count(3)?,
                })
            })
            .map(|b| Backlog { oldest_active, ..b })
        },
    }
}

/// The record an earlier submission left of `p`'s key: its fingerprint
/// and the operation it made (`None` when the key is new). Read where
/// a submission found its key taken; see [`key_replayed`].
pub(crate) fn key_record(p: &AcceptParams, key: &str) -> Script<Option<(Fingerprint, Id)>> {
    Script::one(
        "SELECT fingerprint, operation_id FROM idempotency_keys WHERE tenant = ?1 AND kind = ?2 AND key = ?3",
        vec![p.tenant.as_str().into(), p.kind.as_str().into(), key.into()],
        |d| {
            optional(d, |r| {
                let stored = r
                    .bytes(0)?
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("a stored fingerprint is not 32 bytes".into()))?;
                Ok((Fingerprint(stored), Id::from_trusted(r.text(1)?)))
            })
        },
    )
}

/// Whether a submission whose key is taken replays the operation the key
/// made (`Ok`, the request is the same one; compared in constant time) or
/// is refused (`Err`, it differs: answer `KeyReused` naming that
/// operation). A replay is counted with [`key_replayed`].
pub(crate) fn key_taken(
    fingerprint: &Fingerprint,
    stored: &Fingerprint,
    operation_id: Id,
) -> std::result::Result<Id, Id> {
    if fingerprint.matches(stored) {
        Ok(operation_id)
    } else {
        Err(operation_id)
    }
}

/// Counts one more replay of `p`'s key (the console shows it).
pub(crate) fn key_replayed(p: &AcceptParams, key: &str) -> Script<()> {
    Script::one(
        "UPDATE idempotency_keys SET replays = replays + 1 WHERE tenant = ?1 AND kind = ?2 AND key = ?3",
        vec![p.tenant.as_str().into(), p.kind.as_str().into(), key.into()],
        |_| Ok(()),
    )
}

/// The tenant's `max_active` quota, its row locked for the rest of the
/// transaction (`None`: no quota).
pub(crate) fn tenant_max_active(tenant: &str) -> Script<Option<i64>> {
    Script::one(
        "SELECT max_active FROM tenants WHERE name = ?1 {for_update}",
        vec![tenant.into()],
        |d| Ok(optional(d, |r| r.opt_int(0))?.flatten()),
    )
}

/// The tenant's active work: its tasks (its operations not yet ended),
/// counted through the partial indexes of ready and of leased tasks.
pub(crate) fn tenant_active(tenant: &str) -> Script<i64> {
    Script::one(
        "SELECT (SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'ready')
              + (SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'leased')",
        vec![tenant.into()],
        |d| one(d, |r| r.int(0)),
    )
}

/// The operation a key made, among the tenant's `kinds` (keys are scoped
/// by tenant and kind: one primary-key lookup each, first found wins).
pub(crate) fn operation_by_key(tenant: &str, kinds: &[String], key: &str) -> Script<Option<Id>> {
    Script {
        stmts: kinds
            .iter()
            .map(|kind| Stmt {
                sql: "SELECT operation_id FROM idempotency_keys WHERE tenant = ?1 AND kind = ?2 AND key = ?3",
                args: vec![tenant.into(), kind.as_str().into(), key.into()],
            })
            .collect(),
        decode: |d| {
            let found = d.before.iter().chain(std::iter::once(&d.rows)).flatten().next();
            found.map(|r| Ok(Id::from_trusted(r.text(0)?))).transpose()
        },
    }
}

/// Ends now the leases `worker_id` holds (its process is gone), so the
/// reaper takes their tasks at once; how many.
pub(crate) fn leases_of_worker_expired(worker_id: &str, now: Timestamp) -> Script<u64> {
    Script::one(
        "UPDATE tasks SET lease_expires_at = ?2 WHERE status = 'leased' AND worker_id = ?1 AND lease_expires_at >= ?2",
        vec![worker_id.into(), (now.0 - 1).into()],
        |d| Ok(d.changed),
    )
}
