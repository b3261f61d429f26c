//! The fetches and small writes of the maintenance use cases (deadlines,
//! the reaper, retention, tenant deletion, the right to append), as
//! [`Script`]s: the [`Driver`](super::Driver)'s default methods run them,
//! so a backend writes none of them. On PostgreSQL each fetch of shared
//! work locks what it returns and skips what another node holds; SQLite's
//! one writer needs neither. PostgreSQL's partial indexes of live work
//! filter on `rest_state IS NULL` (schema 18: no index reads `state`, so a
//! claim is a HOT update), SQLite's on `state`: each fetch names its own.

use longrun_core::{Id, State, Timestamp};

use super::retention::{Expiring, Tombstone};
use crate::Result;
use crate::shared::{Done, Lapsed, Script, Stmt, UploadLease, all, nothing, one, optional};

/// An operation past its deadline whose task waits in the queue (a first
/// attempt, or a retry waiting for its backoff).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverdueWaiting {
    pub id: String,
    pub state: State,
}

/// Running work the server asked to stop, with the reason it gave.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StopRequested {
    pub id: String,
    pub reason: Option<String>,
}

/// Running work asked to pause, and since when.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PauseRequested {
    pub id: String,
    pub requested_at: Timestamp,
}

fn ids(d: Done) -> Result<Vec<String>> {
    all(d, |r| r.text(0))
}

pub(super) fn task_leased(id: &str) -> Script<Option<bool>> {
    Script::one(
        "SELECT status = 'leased' FROM tasks WHERE operation_id = ?1",
        vec![id.into()],
        |d| optional(d, |r| r.bool(0)),
    )
}

pub(crate) fn overdue_waiting(now: Timestamp, limit: u32) -> Script<Vec<OverdueWaiting>> {
    Script::one(
        "SELECT o.id, o.state FROM operations o JOIN tasks t ON t.operation_id = o.id
          WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1
            AND {pg: o.rest_state IS NULL}{sqlite: o.state IN ('queued', 'running')}
            AND t.status = 'ready'
          ORDER BY o.deadline_at LIMIT ?2 {pg: FOR UPDATE OF o, t SKIP LOCKED}",
        vec![now.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                Ok(OverdueWaiting {
                    id: r.text(0)?,
                    state: r
                        .text(1)?
                        .parse()
                        .map_err(|e: longrun_core::state::UnknownState| crate::StoreError::Corrupt(e.to_string()))?,
                })
            })
        },
    )
}

pub(crate) fn overdue_running(now: Timestamp, limit: u32) -> Script<Vec<String>> {
    Script::one(
        "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
          WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1
            AND {pg: o.rest_state IS NULL}{sqlite: o.state IN ('queued', 'running')}
            AND t.status = 'leased' AND o.cancel_requested_at IS NULL AND o.cancellable
          ORDER BY o.deadline_at LIMIT ?2 {pg: FOR UPDATE OF o, t SKIP LOCKED}",
        vec![now.into(), i64::from(limit).into()],
        ids,
    )
}

pub(crate) fn stops_unacknowledged(cutoff: Timestamp, limit: u32) -> Script<Vec<StopRequested>> {
    Script::one(
        "SELECT id, cancel_reason FROM operations
          WHERE {pg: rest_state IS NULL AND} state = 'running' AND cancel_requested_by = 'system'
            AND cancel_requested_at <= ?1
          ORDER BY cancel_requested_at LIMIT ?2 {skip_locked}",
        vec![cutoff.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                Ok(StopRequested {
                    id: r.text(0)?,
                    reason: r.opt_text(1)?,
                })
            })
        },
    )
}

pub(crate) fn pauses_unanswered(cutoff: Timestamp, limit: u32) -> Script<Vec<PauseRequested>> {
    Script::one(
        "SELECT id, pause_requested_at FROM operations
          WHERE {pg: rest_state IS NULL AND} state = 'running' AND pause_requested_at <= ?1
          ORDER BY pause_requested_at LIMIT ?2 {skip_locked}",
        vec![cutoff.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                Ok(PauseRequested {
                    id: r.text(0)?,
                    requested_at: r.ts(1)?,
                })
            })
        },
    )
}

pub(super) fn leases_lapsed(now: Timestamp, limit: u32) -> Script<Vec<(String, Lapsed)>> {
    Script::one(
        "SELECT t.operation_id, o.attempt, o.cancel_requested_at IS NOT NULL, o.cancel_requested_by,
                o.cancel_reason, COALESCE(k.rerun_safe, FALSE), COALESCE(k.max_attempts, 1),
                o.pause_requested_at IS NOT NULL
           FROM tasks t
           JOIN operations o ON o.id = t.operation_id
           LEFT JOIN kinds k ON k.name = t.kind
          WHERE t.status = 'leased' AND t.lease_expires_at < ?1
          ORDER BY t.lease_expires_at LIMIT ?2 {pg: FOR UPDATE OF t, o SKIP LOCKED}",
        vec![now.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                Ok((
                    r.text(0)?,
                    Lapsed {
                        attempt: r.int(1)?,
                        cancel_requested: r.bool(2)?,
                        cancel_requested_by: r.opt_text(3)?,
                        cancel_reason: r.opt_text(4)?,
                        rerun_safe: r.bool(5)?,
                        max_attempts: r.int(6)?,
                        pause_requested: r.bool(7)?,
                    },
                ))
            })
        },
    )
}

pub(super) fn results_expiring(now: Timestamp, limit: u32) -> Script<Vec<(String, String)>> {
    Script::one(
        "SELECT id, storage_key FROM results WHERE state = 'published' AND expires_at <= ?1
          ORDER BY expires_at LIMIT ?2 {skip_locked}",
        vec![now.into(), i64::from(limit).into()],
        |d| all(d, |r| Ok((r.text(0)?, r.text(1)?))),
    )
}

pub(super) fn result_expire(id: &str, storage_key: &str, now: Timestamp) -> Script<()> {
    Script {
        stmts: vec![
            Stmt {
                sql: "UPDATE results SET state = 'expired' WHERE id = ?1",
                args: vec![id.into()],
            },
            Stmt {
                sql: "INSERT INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                args: vec![storage_key.into(), now.into()],
            },
        ],
        decode: nothing,
    }
}

pub(super) fn operations_expiring(now: Timestamp, limit: u32) -> Script<Vec<Expiring>> {
    Script::one(
        "SELECT id, tenant, expires_at, kind, idempotency_key, callback_url IS NOT NULL FROM operations
          WHERE expires_at IS NOT NULL AND expires_at <= ?1
          ORDER BY expires_at LIMIT ?2 {skip_locked}",
        vec![now.into(), i64::from(limit).into()],
        |d| {
            all(d, |r| {
                Ok(Expiring {
                    id: r.text(0)?,
                    tenant: r.text(1)?,
                    expired_at: r.ts(2)?,
                    kind: r.text(3)?,
                    idempotency_key: r.opt_text(4)?,
                    hooked: r.bool(5)?,
                })
            })
        },
    )
}

pub(super) fn tombstone_set(t: &Tombstone) -> Script<()> {
    Script::one(
        "INSERT INTO tombstones (operation_id, tenant, removed_at, expires_at, kind, idempotency_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (operation_id) DO UPDATE SET removed_at = excluded.removed_at, expires_at = excluded.expires_at,
                                                  kind = excluded.kind, idempotency_key = excluded.idempotency_key",
        vec![
            t.operation_id.as_str().into(),
            t.tenant.as_str().into(),
            t.removed_at.into(),
            t.expires_at.into(),
            t.kind.as_str().into(),
            t.idempotency_key.as_deref().into(),
        ],
        nothing,
    )
}

pub(super) fn deliveries_finished(cutoff: Timestamp, limit: u32) -> Script<Vec<String>> {
    Script::one(
        "SELECT event_id FROM webhook_deliveries WHERE status <> 'pending' AND created_at <= ?1
          ORDER BY created_at LIMIT ?2 {skip_locked}",
        vec![cutoff.into(), i64::from(limit).into()],
        ids,
    )
}

pub(super) fn uploads_unused(now: Timestamp, limit: u32) -> Script<Vec<String>> {
    Script::one(
        "SELECT id FROM uploads WHERE expires_at <= ?1
            AND NOT EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
          ORDER BY expires_at LIMIT ?2 {skip_locked}",
        vec![now.into(), i64::from(limit).into()],
        ids,
    )
}

/// Deletes the events of operations `ids`, found through their rows (so
/// before those go), in one statement however many there are (the ids go
/// as one JSON array).
pub(super) fn events_remove(ids: &[&str]) -> Script<()> {
    Script::one(
        "DELETE FROM operation_events WHERE op_seq IN (SELECT seq FROM operations WHERE id IN
           (SELECT value FROM {sqlite: json_each(?1)}{pg: json_array_elements_text(?1::JSON)}))",
        vec![serde_json::to_string(ids).expect("strings serialize").into()],
        nothing,
    )
}

/// Deletes an upload's row; its pieces' objects become garbage.
pub(super) fn upload_drop(id: &str, now: Timestamp) -> Script<()> {
    Script {
        stmts: vec![
            Stmt {
                sql: "INSERT {sqlite: OR IGNORE} INTO artifact_garbage (storage_key, created_at)
                      SELECT {sqlite: json_extract(c.value, '$.storage_key')}{pg: c.value ->> 'storage_key'}, ?2
                        FROM uploads, {sqlite: json_each(uploads.chunks)}{pg: json_array_elements(uploads.chunks::JSON)} AS c
                       WHERE uploads.id = ?1 {pg: ON CONFLICT DO NOTHING}",
                args: vec![id.into(), now.into()],
            },
            Stmt {
                sql: "DELETE FROM uploads WHERE id = ?1",
                args: vec![id.into()],
            },
        ],
        decode: nothing,
    }
}

pub(super) fn tenant_results(tenant: &str) -> Script<u64> {
    Script::one(
        "SELECT COUNT(*) FROM results WHERE tenant = ?1",
        vec![tenant.into()],
        |d| one(d, |r| r.count(0)),
    )
}

pub(super) fn tenant_deliveries(tenant: &str) -> Script<u64> {
    Script::one(
        "SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = ?1",
        vec![tenant.into()],
        |d| one(d, |r| r.count(0)),
    )
}

pub(super) fn tenant_operations(tenant: &str) -> Script<Vec<String>> {
    Script::one("SELECT id FROM operations WHERE tenant = ?1", vec![tenant.into()], ids)
}

pub(super) fn tenant_uploads(tenant: &str) -> Script<Vec<String>> {
    Script::one("SELECT id FROM uploads WHERE tenant = ?1", vec![tenant.into()], ids)
}

pub(super) fn tenant_results_to_garbage(tenant: &str, now: Timestamp) -> Script<()> {
    Script::one(
        "INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE tenant = ?1 AND state <> 'expired' ON CONFLICT DO NOTHING",
        vec![tenant.into(), now.into()],
        nothing,
    )
}

pub(super) fn upload_lease_set(id: &Id, lease: &UploadLease) -> Script<()> {
    Script::one(
        "UPDATE uploads SET appending_token = ?2, appending_until = ?3 WHERE id = ?1",
        vec![id.as_str().into(), lease.token.as_deref().into(), lease.until.into()],
        nothing,
    )
}
