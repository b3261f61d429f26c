//! What clients ask of live work: cancel, pause and resume.

use super::*;

pub(super) fn operation_cancel(c: &Connection, policy: WritePolicy, p: &CancelParams) -> Result<CancelOutcome> {
    let op = operation_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    if let std::ops::ControlFlow::Break(answered) = crate::shared::cancel_checks(op, p)? {
        return Ok(answered);
    }
    // Running work waiting for a retry has no worker to tell: like queued
    // work, it is cancelled at once.
    let leased: Option<bool> = c
        .prepare_cached("SELECT status = 'leased' FROM tasks WHERE operation_id = ?1")?
        .query_row(params![p.id.as_str()], |r| r.get(0))
        .optional()?;
    let id = p.id.as_str();
    if leased == Some(true) {
        cancel_request(c, id, &p.requested_by, p.reason.as_deref(), p.now)?;
        let op = operation_by_id(c, id)?.ok_or(StoreError::NotFound)?;
        return Ok(CancelOutcome::Requested(op));
    }
    c.prepare_cached(
        "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4 WHERE id = ?1",
    )?
    .execute(params![id, p.now.0, p.requested_by, p.reason])?;
    let op = operation_end(c, policy, id, &Ending::cancelled(), p.now)?;
    Ok(CancelOutcome::CancelledNow(op))
}

/// Records a cancellation request on a running operation; returns the new version.
pub(super) fn cancel_request(c: &Connection, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<i64> {
    let requested = update_and_read(
        c,
        id,
        "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4,
                version = version + 1, updated_at = ?2
          WHERE id = ?1 AND state = 'running'",
        params![now.0, by, reason],
    )?
    .ok_or(StoreError::NotFound)?;
    let data = json!({"requested_by": by, "reason": reason});
    event_insert(c, &requested, EventType::CancelRequested, &data)?;
    Ok(requested.version)
}

/// Takes a queued or running operation out of the queue as `paused`: its
/// task row goes (no claim can take it, and a worker's lease ends), what a
/// pausing worker reports is kept, and the `paused` event and webhook are
/// written. `attempt` is the attempt a resume runs (`None`: unchanged).
pub(super) fn operation_pause(
    c: &Connection,
    id: &str,
    attempt: Option<i64>,
    progress: Option<&Progress>,
    checkpoint: Option<&Value>,
    data: &Value,
    now: Timestamp,
) -> Result<Operation> {
    let paused = update_and_read(
        c,
        id,
        "UPDATE OR FAIL operations SET state = 'paused', version = version + 1, updated_at = ?2,
                attempt = COALESCE(?3, attempt), progress = COALESCE(?4, progress),
                checkpoint = COALESCE(?5, checkpoint), pause_requested_at = NULL
          WHERE id = ?1 AND state IN ('queued', 'running')",
        params![
            now.0,
            attempt,
            progress.map(progress_text),
            checkpoint.map(Value::to_string)
        ],
    )?
    .ok_or(StoreError::NotFound)?;
    c.prepare_cached("DELETE FROM tasks WHERE operation_id = ?1")?
        .execute(params![id])?;
    event_insert(c, &paused, EventType::Paused, data)?;
    outbox_insert_as(c, &paused, WebhookType::Paused)?;
    Ok(paused)
}

pub(super) fn operation_intent(c: &Connection, p: &IntentParams) -> Result<Operation> {
    let op = operation_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    let holder = c
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE operation_id = ?1 AND status = 'leased'),
                    COALESCE((SELECT pausable FROM kinds WHERE name = ?2), 0)",
        )?
        .query_row(params![p.id.as_str(), op.kind], |r| {
            Ok(Holder {
                leased: r.get(0)?,
                pausable: r.get(1)?,
            })
        })?;
    let id = p.id.as_str();
    let change = decide_intent(&op, holder, p)?;
    match change {
        IntentChange::Unchanged => Ok(op),
        IntentChange::Pause => operation_pause(c, id, None, None, None, &json!({}), p.now),
        IntentChange::RequestPause | IntentChange::WithdrawPause => {
            let (requested_at, event) = change.pause_request(p.now);
            let changed = update_and_read(
                c,
                id,
                "UPDATE OR FAIL operations SET pause_requested_at = ?2, version = version + 1, updated_at = ?3
                  WHERE id = ?1 AND state IN ('queued', 'running')",
                params![requested_at.map(|t| t.0), p.now.0],
            )?
            .ok_or(StoreError::NotFound)?;
            event_insert(c, &changed, event, &json!({}))?;
            Ok(changed)
        }
        IntentChange::Resume => {
            let resumed = update_and_read(
                c,
                id,
                "UPDATE OR FAIL operations SET state = 'queued', version = version + 1, updated_at = ?2
                  WHERE id = ?1 AND state = 'paused'",
                params![p.now.0],
            )?
            .ok_or(StoreError::NotFound)?;
            c.prepare_cached(
                "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
                 SELECT id, seq, tenant, kind, 'ready', ?2 FROM operations WHERE id = ?1",
            )?
            .execute(params![id, p.now.0])?;
            event_insert(c, &resumed, EventType::Resumed, &json!({}))?;
            outbox_insert_as(c, &resumed, WebhookType::Resumed)?;
            Ok(resumed)
        }
    }
}
