//! Webhook deliveries as [`Script`]s both stores run: what is due, each
//! attempt's record, the delivery log, and the tenants' signing secrets.
//! The use cases that take due deliveries and record attempts are
//! `plan/webhooks.rs`.

use super::*;

fn delivery(r: &Row) -> Result<Delivery> {
    Ok(Delivery {
        event_id: Id::from_trusted(r.text(0)?),
        operation_id: Id::from_trusted(r.text(1)?),
        tenant: r.text(2)?,
        url: r.text(3)?,
        event_type: r.text(4)?,
        payload: r.text(5)?,
        attempts: r.int(6)?,
    })
}

/// Queues the webhook `webhook` of `op`'s change, in the change's
/// transaction; `None` when `op` has no callback URL.
pub(crate) fn delivery_queued(op: &Operation, webhook: WebhookType) -> Option<Script<()>> {
    let url = op.callback_url.as_deref()?;
    let event_type = webhook.as_str();
    Some(Script::one(
        "INSERT INTO webhook_deliveries (event_id, operation_id, tenant, url, type, payload, created_at, status,
                                         next_attempt_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?7)",
        vec![
            Id::generate(longrun_core::IdKind::Event).into_string().into(),
            op.id.as_str().into(),
            op.tenant.as_str().into(),
            url.into(),
            event_type.into(),
            webhook_payload(op, event_type).into(),
            op.updated_at.into(),
        ],
        nothing,
    ))
}

/// The webhook a claim queues for `op`, which it just started: work that
/// was queued reached `running`; a retry's start is no transition (it was
/// running already) and queues none.
pub(crate) fn start_delivery_queued(op: &Operation, was_queued: bool) -> Option<Script<()>> {
    if !was_queued {
        return None;
    }
    delivery_queued(op, WebhookType::Reached(op.state))
}

/// Deliveries due at `now` that no node holds, soonest first; on
/// PostgreSQL locked, skipping those another node's transaction holds.
pub(crate) fn deliveries_due(now: Timestamp, limit: u32) -> Script<Vec<Delivery>> {
    Script::one(
        "SELECT event_id, operation_id, tenant, url, type, payload, attempts FROM webhook_deliveries
          WHERE status = 'pending' AND next_attempt_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
          ORDER BY next_attempt_at LIMIT ?2 {skip_locked}",
        vec![now.into(), i64::from(limit).into()],
        |d| all(d, delivery),
    )
}

/// Holds `due` until `until`: no other round takes them meanwhile.
pub(crate) fn deliveries_held(due: &[Delivery], until: Timestamp) -> Script<()> {
    Script {
        stmts: due
            .iter()
            .map(|d| Stmt {
                sql: "UPDATE webhook_deliveries SET lease_until = ?2 WHERE event_id = ?1",
                args: vec![d.event_id.as_str().into(), until.into()],
            })
            .collect(),
        decode: nothing,
    }
}

/// An attempt's outcome on its pending delivery: the delivery's operation
/// and event type, or `None` when it is no longer pending.
pub(crate) fn delivery_attempted(p: &AttemptParams) -> Script<Option<(String, String)>> {
    let attempt = attempt_row(&p.outcome);
    Script::one(
        "UPDATE webhook_deliveries SET status = ?2, attempts = ?3, next_attempt_at = ?4, lease_until = NULL
          WHERE event_id = ?1 AND status = 'pending' RETURNING operation_id, type",
        vec![
            p.event_id.as_str().into(),
            attempt.status.into(),
            p.attempt.into(),
            attempt.next_attempt_at.into(),
        ],
        |d| optional(d, |r| Ok((r.text(0)?, r.text(1)?))),
    )
}

/// The attempt's record in the delivery log (once, whoever records it).
pub(crate) fn attempt_insert(p: &AttemptParams, operation_id: &str, event_type: &str) -> Script<()> {
    let attempt = attempt_row(&p.outcome);
    Script::one(
        "INSERT INTO webhook_attempts (event_id, attempt, operation_id, type, at, status_code, error, next_attempt_at,
                                       latency_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (event_id, attempt) DO NOTHING",
        vec![
            p.event_id.as_str().into(),
            p.attempt.into(),
            operation_id.into(),
            event_type.into(),
            p.now.into(),
            attempt.status_code.map(i64::from).into(),
            attempt.error.into(),
            attempt.next_attempt_at.into(),
            p.latency_ms.into(),
        ],
        nothing,
    )
}

/// Every webhook attempt for the tenant's operation `id`, oldest first;
/// `None` when the tenant has no such operation.
pub(crate) fn webhook_log(tenant: &str, id: &Id) -> Script<Option<Vec<AttemptRecord>>> {
    Script::one(
        "SELECT a.event_id, a.type, a.attempt, a.status_code, a.error, a.at, a.next_attempt_at, a.latency_ms
           FROM operations o LEFT JOIN webhook_attempts a ON a.operation_id = o.id
          WHERE o.id = ?1 AND o.tenant = ?2 ORDER BY a.at, a.event_id, a.attempt",
        vec![id.as_str().into(), tenant.into()],
        |d| {
            if d.rows.is_empty() {
                return Ok(None);
            }
            let attempts = d.rows.iter().filter(|r| !matches!(r.0.first(), Some(Val::Null(_))));
            attempts
                .map(|r| {
                    Ok(AttemptRecord {
                        event_id: Id::from_trusted(r.text(0)?),
                        event_type: r.text(1)?,
                        attempt: r.int(2)?,
                        status_code: r.opt_int(3)?.and_then(|s| u16::try_from(s).ok()),
                        error: r.opt_text(4)?,
                        at: r.ts(5)?,
                        next_attempt_at: r.opt_ts(6)?,
                        latency_ms: r.opt_int(7)?,
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some)
        },
    )
}

/// The tenant's signing secrets in force, newest first; `candidate`
/// becomes its first one if it has none.
pub(crate) fn webhook_secrets(tenant: &str, candidate: &str, now: Timestamp) -> Script<Vec<String>> {
    Script {
        stmts: vec![
            Stmt {
                sql: "INSERT INTO webhook_secrets (tenant, secret, created_at)
                      SELECT ?1, ?2, ?3 WHERE NOT EXISTS (
                        SELECT 1 FROM webhook_secrets WHERE tenant = ?1 AND (retired_at IS NULL OR retired_at > ?3))
                      ON CONFLICT DO NOTHING",
                args: vec![tenant.into(), candidate.into(), now.into()],
            },
            Stmt {
                sql: "SELECT secret FROM webhook_secrets WHERE tenant = ?1 AND (retired_at IS NULL OR retired_at > ?2)
                       ORDER BY created_at DESC, secret",
                args: vec![tenant.into(), now.into()],
            },
        ],
        decode: |d| all(d, |r| r.text(0)),
    }
}

/// A new signing secret; those in force are retired after `overlap`.
pub(crate) fn webhook_secret_rotate(tenant: &str, new_secret: &str, now: Timestamp, overlap: Duration) -> Script<()> {
    Script {
        stmts: vec![
            Stmt {
                sql: "UPDATE webhook_secrets SET retired_at = ?2 WHERE tenant = ?1 AND retired_at IS NULL",
                args: vec![tenant.into(), now.plus(overlap).into()],
            },
            Stmt {
                sql: "INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES (?1, ?2, ?3)",
                args: vec![tenant.into(), new_secret.into(), now.into()],
            },
        ],
        decode: nothing,
    }
}
