//! What clients ask of live work: cancel, pause and resume.

use super::*;

pub(super) async fn cancel_request(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    by: &str,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<i64> {
    let sql = format!(
        "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4,
                version = version + 1, updated_at = $2
          WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
    );
    let requested = update_returning(c, sqlx::query(&sql).bind(id).bind(now.0).bind(by).bind(reason))
        .await?
        .ok_or(StoreError::NotFound)?;
    event_insert(
        c,
        ch,
        &requested,
        EventType::CancelRequested,
        &json!({"requested_by": by, "reason": reason}),
    )
    .await?;
    Ok(requested.version)
}

/// Pauses or resumes (see `Store::operation_intent`). The operation's row
/// is locked first, as a cancel locks it, so the two take turns. A claim
/// locks the task row first and the operation's after: its task is taken
/// with `NOWAIT`, and a claim in progress means the work is being started —
/// held by a worker, so not pausable — instead of a deadlock.
pub(super) async fn operation_intent(c: &mut PgConnection, ch: &mut Changes, p: &IntentParams) -> Result<Operation> {
    let op = lock_operation(c, &p.tenant, &p.id).await?;
    let pausable: bool = sqlx::query_scalar("SELECT COALESCE((SELECT pausable FROM kinds WHERE name = $1), FALSE)")
        .bind(&op.kind)
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    // A lock not granted aborts the transaction, up to this savepoint: a
    // pause of a pausable kind goes on to ask the worker.
    sqlx::query("SAVEPOINT task_lock").execute(&mut *c).await.map_err(db)?;
    let status: Option<String> =
        match sqlx::query_scalar("SELECT status FROM tasks WHERE operation_id = $1 FOR UPDATE NOWAIT")
            .bind(p.id.as_str())
            .fetch_optional(&mut *c)
            .await
        {
            Ok(status) => status,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                sqlx::query("ROLLBACK TO SAVEPOINT task_lock")
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                Some("leased".into())
            }
            Err(e) => return Err(db(e)),
        };
    let id = p.id.as_str();
    let holder = Holder {
        leased: status.as_deref() == Some("leased"),
        pausable,
    };
    let change = decide_intent(&op, holder, p)?;
    match change {
        IntentChange::Unchanged => Ok(op),
        IntentChange::Pause => operation_pause(c, ch, id, None, None, None, &json!({}), p.now).await,
        IntentChange::RequestPause | IntentChange::WithdrawPause => {
            let (requested_at, event) = change.pause_request(p.now);
            let sql = format!(
                "UPDATE operations SET pause_requested_at = $2, version = version + 1, updated_at = $3
                  WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
            );
            let query = sqlx::query(&sql).bind(id).bind(requested_at.map(|t| t.0)).bind(p.now.0);
            let changed = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
            event_insert(c, ch, &changed, event, &json!({})).await?;
            Ok(changed)
        }
        IntentChange::Resume => {
            let sql = format!(
                "UPDATE operations SET state = 'queued', version = version + 1, updated_at = $2
                  WHERE id = $1 AND state = 'paused' RETURNING {OP_COLUMNS}"
            );
            let query = sqlx::query(&sql).bind(id).bind(p.now.0);
            let resumed = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
            sqlx::query(
                "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
                 SELECT id, seq, tenant, kind, 'ready', $2 FROM operations WHERE id = $1",
            )
            .bind(id)
            .bind(p.now.0)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            event_insert(c, ch, &resumed, EventType::Resumed, &json!({})).await?;
            outbox_insert_as(c, &resumed, WebhookType::Resumed).await?;
            Ok(resumed)
        }
    }
}

/// Takes a queued or running operation out of the queue as `paused` (as
/// SQLite's `operation_pause`): its task row goes, what a pausing worker
/// reports is kept, and the `paused` event and webhook are written.
/// `attempt` is the attempt a resume runs (`None`: unchanged).
#[allow(clippy::too_many_arguments)]
pub(super) async fn operation_pause(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    attempt: Option<i64>,
    progress: Option<&Progress>,
    checkpoint: Option<&Value>,
    data: &Value,
    now: Timestamp,
) -> Result<Operation> {
    let sql = format!(
        "UPDATE operations SET state = 'paused', version = version + 1, updated_at = $2,
                attempt = COALESCE($3, attempt), progress = COALESCE($4, progress),
                checkpoint = COALESCE($5, checkpoint), pause_requested_at = NULL
          WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
    );
    let query = sqlx::query(&sql)
        .bind(id)
        .bind(now.0)
        .bind(attempt)
        .bind(progress.map(progress_text))
        .bind(checkpoint.map(Value::to_string));
    let paused = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
    sqlx::query("DELETE FROM tasks WHERE operation_id = $1")
        .bind(id)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    event_insert(c, ch, &paused, EventType::Paused, data).await?;
    outbox_insert_as(c, &paused, WebhookType::Paused).await?;
    Ok(paused)
}

pub(super) async fn operation_cancel(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    p: &CancelParams,
) -> Result<CancelOutcome> {
    // Lock the row: a cancel and a worker's outcome must not interleave.
    let op = lock_operation(c, &p.tenant, &p.id).await?;
    if let std::ops::ControlFlow::Break(answered) = crate::shared::cancel_checks(op, p)? {
        return Ok(answered);
    }
    let leased: Option<bool> = sqlx::query_scalar("SELECT status = 'leased' FROM tasks WHERE operation_id = $1")
        .bind(p.id.as_str())
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let id = p.id.as_str();
    if leased == Some(true) {
        cancel_request(c, ch, id, &p.requested_by, p.reason.as_deref(), p.now).await?;
        let op = operation_by_id(c, id).await?.ok_or(StoreError::NotFound)?;
        return Ok(CancelOutcome::Requested(op));
    }
    sqlx::query(
        "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(p.now.0)
    .bind(&p.requested_by)
    .bind(&p.reason)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let op = operation_end(c, ch, policy, id, &Ending::cancelled(), p.now).await?;
    Ok(CancelOutcome::CancelledNow(op))
}
