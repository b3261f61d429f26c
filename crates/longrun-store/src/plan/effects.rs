//! What a use case decides to write ([`Effect`]), and [`apply`], which
//! turns effects into a driver's row writes, the events that record them
//! and the webhooks they queue: the one place that says which event and
//! which webhook each change of an operation carries.

use std::collections::HashMap;

use longrun_core::Timestamp;
use longrun_core::lease::retry_backoff;
use serde_json::{Value, json};

use super::driver::EndRow;
use super::{Driver, EventType, WebhookType, writes};
use crate::shared::{Stmt, UpdateChange, artifacts_recorded, with_published};
use crate::{Operation, Progress, Result, StoreError};

/// A change of one operation, as a use case decided it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// End it (`ended` event, state webhook). Without a guard, an operation
    /// that ended meanwhile refuses the whole apply with `LeaseLost`; with
    /// one, it is left out of the answer.
    End(EndRow),
    /// Ask its worker to stop (`cancel_requested`).
    RequestCancel {
        id: String,
        by: String,
        reason: Option<String>,
    },
    /// Say who cancels it, before an `End` that cancels it at once.
    RecordCancel {
        id: String,
        by: String,
        reason: Option<String>,
    },
    /// Retry after the backoff of attempt `next_attempt` (`retry_scheduled`,
    /// its data completed with the attempt and when it becomes available).
    Retry {
        id: String,
        next_attempt: i64,
        progress: Option<Progress>,
        data: Value,
    },
    /// Out of the queue as `paused` (`paused` event and webhook).
    Pause {
        id: String,
        attempt: Option<i64>,
        progress: Option<Progress>,
        checkpoint: Option<Value>,
        data: Value,
    },
    /// Back in the queue (`resumed` event and webhook).
    /// Back to the queue, its task claimable from `available_at`.
    Resume { id: String, available_at: Timestamp },
    /// Set or clear the pause request, recorded as `event`.
    SetPauseRequest {
        id: String,
        at: Option<Timestamp>,
        event: EventType,
        data: Value,
    },
    /// Change deadline and labels (`updated`).
    SetDeadlineAndLabels { id: String, change: UpdateChange },
    /// Renew the lease (no new version).
    RenewLease { id: String, until: Timestamp },
    /// Keep the worker's checkpoint (no new version).
    SaveCheckpoint { id: String, checkpoint: Value },
    /// Store a worker's report (`progress`).
    ReportProgress {
        id: String,
        progress: Option<Progress>,
        cost_units: f64,
        cancellable: bool,
        data: Value,
    },
}

/// Applies `effects` in order through `driver` at `now` and answers, for
/// each, the operation it left at a new version (`None` for an effect that
/// makes none, and for a guarded ending that found its operation changed).
/// Consecutive endings go to the driver together (set-based on
/// PostgreSQL), and their events in one call.
pub(crate) async fn apply<D: Driver>(d: &mut D, effects: &[Effect], now: Timestamp) -> Result<Vec<Option<Operation>>> {
    let mut answers: Vec<Option<Operation>> = Vec::with_capacity(effects.len());
    let mut i = 0;
    while i < effects.len() {
        let run = effects[i..].iter().take_while(|e| matches!(e, Effect::End(_))).count();
        if run > 0 {
            answers.extend(end_all(d, &effects[i..i + run]).await?);
            i += run;
        } else {
            answers.push(apply_one(d, &effects[i], now).await?);
            i += 1;
        }
    }
    Ok(answers)
}

/// Applies a run of `Effect::End`s in one driver call.
async fn end_all<D: Driver>(d: &mut D, effects: &[Effect]) -> Result<Vec<Option<Operation>>> {
    let rows: Vec<&EndRow> = effects
        .iter()
        .map(|e| match e {
            Effect::End(row) => row,
            _ => unreachable!("a run of endings"),
        })
        .collect();
    let mut ended = d.operations_end(&rows).await?;
    settle_artifacts(d, &rows, &mut ended).await?;
    let mut answers = Vec::with_capacity(rows.len());
    for row in &rows {
        match ended.remove(&row.id) {
            Some(op) => answers.push(Some(op)),
            None if row.guard.is_some() => answers.push(None),
            None => return Err(StoreError::LeaseLost),
        }
    }
    let recorded: Vec<(&Operation, EventType, Value)> = rows
        .iter()
        .zip(&answers)
        .filter_map(|(row, op)| {
            op.as_ref()
                .map(|op| (op, EventType::Ended(row.ending.to), row.ending.event_data()))
        })
        .collect();
    d.events_insert(&recorded).await?;
    for (op, _, _) in &recorded {
        webhook_queue(d, op, WebhookType::Reached(op.state)).await?;
    }
    Ok(answers)
}

/// What ending does beyond the operation's row, for those of `rows` that
/// `ended`: the results a worker uploaded are published (an ending that
/// publishes, kept from the moment it ended; recorded in the operation's
/// row) or discarded, and the pieces of an ending that drops them go.
async fn settle_artifacts<D: Driver>(
    d: &mut D,
    rows: &[&EndRow],
    ended: &mut HashMap<String, Operation>,
) -> Result<()> {
    // Results are kept from the moment their operation ended.
    let (mut publish, mut discard) = (Vec::new(), Vec::new());
    let mut discard_at = Timestamp(0);
    for row in rows {
        let Some(op) = ended.get(&row.id) else { continue };
        if row.ending.publishes {
            publish.push((row.id.as_str(), op.updated_at));
        } else {
            discard.push(row.id.as_str());
            discard_at = discard_at.max(op.updated_at);
        }
    }
    for (id, published) in d.results_publish(&publish).await? {
        if let Some(op) = ended.remove(&id) {
            let op = with_published(op, published);
            d.script(&artifacts_recorded(&op)).await?;
            ended.insert(id, op);
        }
    }
    d.results_discard(&discard, discard_at).await?;
    for row in rows {
        if row.ending.drops_pieces() && ended.contains_key(&row.id) {
            d.pieces_drop(&row.id, None, None, row.now).await?;
        }
    }
    Ok(())
}

/// Applies one effect other than an ending.
async fn apply_one<D: Driver>(d: &mut D, effect: &Effect, now: Timestamp) -> Result<Option<Operation>> {
    Ok(match effect {
        Effect::End(_) => unreachable!("endings go through end_all"),
        Effect::RequestCancel { id, by, reason } => {
            let op = updated(d, writes::cancel_request(id, by, reason.as_deref(), now)).await?;
            let data = json!({"requested_by": by, "reason": reason});
            record(d, op, EventType::CancelRequested, data, None).await?
        }
        Effect::RecordCancel { id, by, reason } => {
            d.operation_update(&writes::cancel_record(id, by, reason.as_deref(), now))
                .await?;
            None
        }
        Effect::Retry {
            id,
            next_attempt,
            progress,
            data,
        } => {
            let available_at = now.plus(retry_backoff(*next_attempt));
            d.script(&writes::task_requeue(id, available_at)).await?;
            let op = updated(d, writes::retry_schedule(id, *next_attempt, progress.as_ref(), now)).await?;
            let mut data = data.clone();
            if let Some(fields) = data.as_object_mut() {
                fields.insert("next_attempt".into(), json!(next_attempt));
                fields.insert("available_at".into(), json!(available_at.to_rfc3339()));
            }
            record(d, op, EventType::RetryScheduled, data, None).await?
        }
        Effect::Pause {
            id,
            attempt,
            progress,
            checkpoint,
            data,
        } => {
            let paused = writes::pause(id, *attempt, progress.as_ref(), checkpoint.as_ref(), now);
            let op = updated(d, paused).await?;
            d.script(&writes::task_drop(id)).await?;
            record(d, op, EventType::Paused, data.clone(), Some(WebhookType::Paused)).await?
        }
        Effect::Resume { id, available_at } => {
            let op = updated(d, writes::resume(id, now)).await?;
            d.script(&writes::task_restore(id, *available_at)).await?;
            record(d, op, EventType::Resumed, json!({}), Some(WebhookType::Resumed)).await?
        }
        Effect::SetPauseRequest { id, at, event, data } => {
            let op = updated(d, writes::pause_request_set(id, *at, now)).await?;
            record(d, op, *event, data.clone(), None).await?
        }
        Effect::SetDeadlineAndLabels { id, change } => {
            let labels = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let op = updated(d, writes::deadline_and_labels_set(id, change, labels, now)).await?;
            if let Some(at) = change.available_at {
                d.script(&writes::task_available_at(id, at)).await?;
            }
            record(d, op, EventType::Updated, change.data.clone(), None).await?
        }
        Effect::RenewLease { id, until } => {
            d.script(&writes::lease_renew(id, *until)).await?;
            None
        }
        Effect::SaveCheckpoint { id, checkpoint } => {
            d.script(&writes::checkpoint_save(id, checkpoint)).await?;
            None
        }
        Effect::ReportProgress {
            id,
            progress,
            cost_units,
            cancellable,
            data,
        } => {
            let op = d
                .operation_update(&writes::progress_set(
                    id,
                    progress.as_ref(),
                    *cost_units,
                    *cancellable,
                    now,
                ))
                .await?
                .ok_or(StoreError::LeaseLost)?;
            record(d, op, EventType::Progress, data.clone(), None).await?
        }
    })
}

/// The operation `stmt` updates, read back; `NotFound` if it matched none.
async fn updated<D: Driver>(d: &mut D, stmt: Stmt) -> Result<Operation> {
    d.operation_update(&stmt).await?.ok_or(StoreError::NotFound)
}

/// Queues the webhook `webhook` of `op`'s change, if it has a callback.
async fn webhook_queue<D: Driver>(d: &mut D, op: &Operation, webhook: WebhookType) -> Result<()> {
    match crate::shared::delivery_queued(op, webhook) {
        Some(queued) => d.script(&queued).await,
        None => Ok(()),
    }
}

/// Records `op`'s new version as `event` (and queues `webhook`); answers it.
async fn record<D: Driver>(
    d: &mut D,
    op: Operation,
    event: EventType,
    data: Value,
    webhook: Option<WebhookType>,
) -> Result<Option<Operation>> {
    d.events_insert(&[(&op, event, data)]).await?;
    if let Some(webhook) = webhook {
        webhook_queue(d, &op, webhook).await?;
    }
    Ok(Some(op))
}
