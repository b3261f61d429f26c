//! Webhook deliveries: what is due, each attempt's record, the delivery log,
//! and the tenants' signing secrets.

use super::*;

pub(super) fn webhook_due(c: &Connection, now: Timestamp, limit: u32, lease: Duration) -> Result<Vec<Delivery>> {
    let due: Vec<Delivery> = c
        .prepare_cached(
            // Streams in index order; `limit` is taken below.
            "SELECT event_id, operation_id, tenant, url, type, payload, attempts FROM webhook_deliveries
              WHERE status = 'pending' AND next_attempt_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
              ORDER BY next_attempt_at",
        )?
        .query_map(params![now.0], |r| {
            Ok(Delivery {
                event_id: Id::from_trusted(r.get(0)?),
                operation_id: Id::from_trusted(r.get(1)?),
                tenant: r.get(2)?,
                url: r.get(3)?,
                event_type: r.get(4)?,
                payload: r.get(5)?,
                attempts: r.get(6)?,
            })
        })?
        .take(limit as usize)
        .collect::<rusqlite::Result<_>>()?;
    let until = now.plus(lease);
    for d in &due {
        c.prepare_cached("UPDATE webhook_deliveries SET lease_until = ?2 WHERE event_id = ?1")?
            .execute(params![d.event_id.as_str(), until.0])?;
    }
    Ok(due)
}

pub(super) fn webhook_attempt(c: &Connection, p: &AttemptParams) -> Result<()> {
    let attempt = crate::shared::attempt_row(&p.outcome);
    let updated: Option<(String, String)> = c
        .prepare_cached(
            "UPDATE webhook_deliveries SET status = ?2, attempts = ?3, next_attempt_at = ?4, lease_until = NULL
              WHERE event_id = ?1 AND status = 'pending' RETURNING operation_id, type",
        )?
        .query_row(
            params![p.event_id.as_str(), attempt.status, p.attempt, attempt.next_attempt_at],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((operation_id, event_type)) = updated else {
        return Err(StoreError::NotFound);
    };
    c.prepare_cached(
        "INSERT INTO webhook_attempts (event_id, attempt, operation_id, type, at, status_code, error, next_attempt_at, latency_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (event_id, attempt) DO NOTHING",
    )?
    .execute(params![
        p.event_id.as_str(),
        p.attempt,
        operation_id,
        event_type,
        p.now.0,
        attempt.status_code,
        attempt.error,
        attempt.next_attempt_at,
        p.latency_ms
    ])?;
    Ok(())
}
