//! What clients ask of live work — cancel, pause, resume — written once for
//! every backend: lock the operation, check the rules of `shared`, apply.

use std::ops::ControlFlow;

use serde_json::json;

use super::driver::EndRow;
use super::{Driver, Effect, apply};
use crate::shared::{Ending, IntentChange, cancel_checks, decide_intent};
use crate::{CancelOutcome, CancelParams, IntentParams, Operation, Result, StoreError};

/// Requests cancellation (see `Store::operation_cancel`): queued work (and
/// running work waiting for a retry, which has no worker to tell) is
/// cancelled at once; a worker holding the work is asked to stop.
pub(crate) async fn operation_cancel<D: Driver>(d: &mut D, p: &CancelParams) -> Result<CancelOutcome> {
    // Locked: a cancel and a worker's outcome must not interleave.
    let op = d
        .operation_locked(&p.tenant, &p.id)
        .await?
        .ok_or(StoreError::NotFound)?;
    if let ControlFlow::Break(answered) = cancel_checks(op, p)? {
        return Ok(answered);
    }
    let id = p.id.as_str().to_owned();
    let (by, reason) = (p.requested_by.clone(), p.reason.clone());
    if d.task_leased(&id).await? == Some(true) {
        let effects = [Effect::RequestCancel { id, by, reason }];
        let requested = apply(d, &effects, p.now).await?.pop().flatten();
        return requested.map(CancelOutcome::Requested).ok_or(StoreError::NotFound);
    }
    let effects = [
        Effect::RecordCancel {
            id: id.clone(),
            by,
            reason,
        },
        Effect::End(EndRow {
            id,
            ending: Ending::cancelled(),
            now: p.now,
            guard: None,
        }),
    ];
    let cancelled = apply(d, &effects, p.now).await?.pop().flatten();
    cancelled.map(CancelOutcome::CancelledNow).ok_or(StoreError::LeaseLost)
}

/// Pauses or resumes under `If-Match` (see `Store::operation_intent`).
pub(crate) async fn operation_intent<D: Driver>(d: &mut D, p: &IntentParams) -> Result<Operation> {
    let op = d
        .operation_locked(&p.tenant, &p.id)
        .await?
        .ok_or(StoreError::NotFound)?;
    let holder = d.intent_holder(&op).await?;
    let id = p.id.as_str().to_owned();
    let effect = match decide_intent(&op, holder, p)? {
        IntentChange::Unchanged => return Ok(op),
        IntentChange::Pause => Effect::Pause {
            id,
            attempt: None,
            progress: None,
            checkpoint: None,
            data: json!({}),
        },
        change @ (IntentChange::RequestPause | IntentChange::WithdrawPause) => {
            let (at, event) = change.pause_request(p.now);
            Effect::SetPauseRequest {
                id,
                at,
                event,
                data: json!({}),
            }
        }
        IntentChange::Resume => Effect::Resume {
            id,
            available_at: crate::available_at(op.not_before, p.now),
        },
    };
    apply(d, &[effect], p.now)
        .await?
        .pop()
        .flatten()
        .ok_or(StoreError::NotFound)
}
