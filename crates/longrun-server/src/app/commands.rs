//! What a change to an existing operation means, decided once for the HTTP
//! API and the console: cancelling (`200` when it ends now or had ended,
//! `202` when its worker has been asked), changing its deadline or labels
//! under `If-Match`, and pausing or resuming it. The store applies each
//! change atomically; here are the checks before it, the mapping of its
//! refusals to problems, and the wake-ups of in-process workers after it.
//! Handlers parse, call these, render.

use std::time::Duration;

use longrun_core::Id;
use longrun_core::validate::{self, MAX_DEADLINE_SECONDS};
use longrun_store::{CancelOutcome, CancelParams, DesiredState, IntentParams, Operation, StoreError, UpdateParams};

use super::ApiError;
use super::AppState;
use longrun_api::{DesiredStateBody, UpdateRequest};

/// Whether a change is done, or asked of the operation's worker (a cancel
/// or a pause of running work): the API answers `200` or `202`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The operation is as asked.
    Done,
    /// Its worker has been asked; the operation will follow.
    Asked,
}

/// The longest cancellation reason, in characters.
pub const MAX_CANCEL_REASON_CHARS: usize = 1024;

/// Cancels `id` on behalf of `requested_by`: `Done` with the operation when it
/// is cancelled now or already ended, `Asked` when its worker has been asked.
/// The API and the console cancel through here.
pub(crate) async fn cancel(
    app: &AppState,
    tenant: &str,
    requested_by: &str,
    id: &Id,
    reason: Option<String>,
    if_match: Option<i64>,
) -> Result<(Operation, Applied), ApiError> {
    if reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_CANCEL_REASON_CHARS)
    {
        return Err(ApiError::InvalidRequest(format!(
            "reason is longer than {MAX_CANCEL_REASON_CHARS} characters"
        )));
    }
    let params = CancelParams {
        tenant: tenant.to_owned(),
        id: id.clone(),
        requested_by: requested_by.to_owned(),
        reason,
        if_match,
        now: app.clock.now(),
    };
    let outcome = app.store.operation_cancel(params).await;
    if let Err(StoreError::NotFound) = outcome {
        return Err(app.missing(tenant, id).await);
    }
    let outcome = outcome.map_err(|e| match e {
        StoreError::NotCancellable => ApiError::OperationNotCancellable {
            operation_id: id.clone(),
        },
        StoreError::PreconditionFailed { current_version } => ApiError::PreconditionFailed {
            given: if_match.unwrap_or(0),
            current: current_version,
        },
        other => other.into(),
    })?;
    Ok(match outcome {
        CancelOutcome::AlreadyTerminal(op) => (app.visible(op)?, Applied::Done),
        CancelOutcome::CancelledNow(op) => (op, Applied::Done),
        CancelOutcome::Requested(op) => {
            app.signals.cancel_requested(&op.id);
            (op, Applied::Asked)
        }
        CancelOutcome::AlreadyRequested(op) => (op, Applied::Asked),
    })
}

/// Applies a `PATCH` made at version `if_match`: a new deadline and/or
/// labels, or a new `desired_state` (`Asked` when a worker has been asked to
/// pause). The API and the console change operations through here.
pub(crate) async fn update(
    app: &AppState,
    tenant: &str,
    id: Id,
    if_match: i64,
    request: UpdateRequest,
) -> Result<(Operation, Applied), ApiError> {
    if let Some(desired) = request.desired_state {
        if request.deadline_seconds.is_some() || request.labels.is_some() || request.not_before.is_some() {
            return Err(ApiError::InvalidRequest(
                "desired_state is changed on its own, not with deadline_seconds, labels or not_before".into(),
            ));
        }
        return set_intent(app, tenant, id, desired, if_match).await;
    }
    if let Some(labels) = &request.labels {
        validate::labels(labels).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    }
    let current = app.operation(tenant, &id).await?;
    let deadline_at = match request.deadline_seconds {
        None => None,
        Some(None) => Some(None),
        Some(Some(seconds)) => {
            let spec = app.kind_spec(&current.kind).await?;
            let max = spec
                .and_then(|s| s.max_deadline_seconds)
                .map_or(MAX_DEADLINE_SECONDS, |s| s as u64)
                .min(MAX_DEADLINE_SECONDS);
            validate::deadline_seconds(seconds, max).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
            Some(Some(current.created_at.plus(Duration::from_secs(seconds))))
        }
    };
    let now = app.clock.now();
    let not_before = match request.not_before {
        None => None,
        Some(None) => Some(None),
        Some(Some(text)) => {
            Some(validate::not_before(Some(&text), None, now).map_err(|e| ApiError::InvalidRequest(e.to_string()))?)
        }
    };
    let params = UpdateParams {
        tenant: tenant.to_owned(),
        id: id.clone(),
        if_match,
        deadline_at,
        labels: request.labels,
        not_before,
        now,
    };
    let op = app.store.operation_update(params).await.map_err(|e| match e {
        StoreError::PreconditionFailed { current_version } => ApiError::PreconditionFailed {
            given: if_match,
            current: current_version,
        },
        StoreError::Terminal { current_version } => ApiError::TerminalIntentWins {
            current: current_version,
        },
        other => other.into(),
    })?;
    Ok((op, Applied::Done))
}

/// `PATCH {"desired_state"}`: pause or resume (the rules are the store's,
/// `Store::operation_intent`).
async fn set_intent(
    app: &AppState,
    tenant: &str,
    id: Id,
    desired: DesiredStateBody,
    if_match: i64,
) -> Result<(Operation, Applied), ApiError> {
    let desired = match desired {
        DesiredStateBody::Paused => DesiredState::Paused,
        DesiredStateBody::Running => DesiredState::Running,
    };
    // Unknown, foreign and removed ids answer as every read does (404, 410).
    let before = app.operation(tenant, &id).await?;
    let params = IntentParams {
        tenant: tenant.to_owned(),
        id,
        desired,
        if_match: Some(if_match),
        now: app.clock.now(),
    };
    let op = app.store.operation_intent(params).await.map_err(|e| match e {
        StoreError::PreconditionFailed { current_version } => ApiError::PreconditionFailed {
            given: if_match,
            current: current_version,
        },
        other => other.into(),
    })?;
    let asked_of_worker = op.pause_requested();
    // A change is one version past the one the client named.
    if op.version != if_match {
        let what = match op.state {
            longrun_core::State::Paused => "paused",
            _ if asked_of_worker => "pause_requested",
            _ if before.pause_requested() => "pause_withdrawn",
            _ => "resumed",
        };
        metrics::counter!("longrun_operations_intents_total", "change" => what).increment(1);
        if op.state == longrun_core::State::Queued {
            app.signals.work_available_for(&op.kind, op.id.as_str(), op.version);
        }
    }
    if asked_of_worker {
        // A task running in this process hears it now, not at its next heartbeat.
        app.signals.pause_requested(&op.id);
    }
    // Asked of a worker, the pause is accepted, not done (as a cancel of running work).
    let applied = if asked_of_worker { Applied::Asked } else { Applied::Done };
    Ok((op, applied))
}
