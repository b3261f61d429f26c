//! What a submission is, decided once for the HTTP API (single, batch,
//! re-run) and the console: every cheap deterministic check of docs/api.md §3
//! (acceptance paused, key policy, kind and its input, labels, budget,
//! deadline caps, callback policy), the idempotency fingerprint over the
//! semantic request, and what an acceptance means to the caller. Handlers
//! parse, call these, render.

use std::time::Duration;

use longrun_core::validate::{self, MAX_DEADLINE_SECONDS};
use longrun_core::{Id, IdKind, IdempotencyKey, Timestamp};
use longrun_store::{AcceptOutcome, AcceptParams, Operation, PRIORITY_DEFAULT, StoreError};
use serde_json::{Value, json};

use super::ApiError;
use super::AppState;
use longrun_api::{BudgetRequest, CallbackRequest, RerunRequest, SubmitRequest};
use longrun_core::validate::MAX_NAMED_UPLOADS;

/// When a tenant is at `max_active`, when to try again.
pub const QUOTA_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// A re-run of `id` as a submission: the original's fields, less what
/// `request` overrides. The API and the console re-run through here.
pub(crate) async fn prepare_rerun(
    app: &AppState,
    tenant: &str,
    id: &Id,
    key: Option<IdempotencyKey>,
    request: RerunRequest,
    now: Timestamp,
) -> Result<AcceptParams, ApiError> {
    let original = app.operation(tenant, id).await?;
    let Some(input) = original.input.clone() else {
        return Err(ApiError::InputNotKept {
            operation_id: id.clone(),
        });
    };
    // What is not overridden is the original's; its deadline counts again
    // from now.
    let deadline_seconds = request.deadline_seconds.or_else(|| {
        original
            .deadline_at
            .map(|at| u64::try_from((at.0 - original.created_at.0).max(1000) / 1000).unwrap_or(1))
    });
    let submission = SubmitRequest {
        kind: original.kind.clone(),
        input: Some(input),
        callback: request
            .callback
            .or_else(|| original.callback_url.clone().map(|url| CallbackRequest { url })),
        deadline_seconds,
        budget: request.budget.or(original
            .budget_max_cost
            .map(|units| BudgetRequest { max_cost_units: units })),
        labels: request.labels.or_else(|| Some(original.labels.clone())),
        not_before: request.not_before,
        start_after_seconds: request.start_after_seconds,
        priority: request.priority.or(u64::try_from(original.priority).ok()),
    };
    let rerun = Rerun {
        of: id.clone(),
        from_checkpoint: request.from_checkpoint,
    };
    prepare_submission(app, tenant, key, submission, now, Some(rerun)).await
}

/// Checks a submission and turns it into what the store accepts: every
/// cheap deterministic check of docs/api.md §3 (acceptance paused, key policy,
/// kind, labels, input size and the kind's own validation, budget, deadline
/// caps, callback policy), then the idempotency fingerprint over the
/// semantic request. The single and the batch endpoint share it.
pub(crate) async fn prepare_submission(
    app: &AppState,
    tenant: &str,
    key: Option<IdempotencyKey>,
    request: SubmitRequest,
    now: Timestamp,
    rerun: Option<Rerun>,
) -> Result<AcceptParams, ApiError> {
    app.check_accepting(&request.kind).await?;
    if key.is_none() && app.config.require_idempotency_key {
        return Err(ApiError::IdempotencyKeyRequired);
    }
    validate::kind_name(&request.kind).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let labels = request.labels.unwrap_or_default();
    validate::labels(&labels).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let input = request.input.unwrap_or(Value::Null);
    validate::input_size(&input).map_err(|e| ApiError::PayloadTooLarge(e.to_string()))?;
    let budget = request.budget.map(|b| b.max_cost_units);
    if let Some(units) = budget {
        validate::max_cost_units(units).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    }

    let spec = app
        .kind_spec(&request.kind)
        .await?
        .ok_or_else(|| ApiError::UnsupportedKind(format!("no kind named {:?} is declared", request.kind)))?;
    if let Some(handler) = app.registry.get(&request.kind) {
        handler
            .validate(&input)
            .map_err(|e| ApiError::InvalidInput(e.to_string()))?;
    }
    let max_deadline = spec
        .max_deadline_seconds
        .map_or(MAX_DEADLINE_SECONDS, |s| s as u64)
        .min(MAX_DEADLINE_SECONDS);
    let deadline_seconds = request
        .deadline_seconds
        .or(spec.default_deadline_seconds.map(|s| s as u64));
    if let Some(seconds) = deadline_seconds {
        validate::deadline_seconds(seconds, max_deadline).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    }
    // Work that starts later: its deadline still counts from creation (one
    // that passes before the start ends it `deadline_exceeded` unstarted).
    let not_before = validate::not_before(request.not_before.as_deref(), request.start_after_seconds, now)
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let priority =
        validate::priority(request.priority, PRIORITY_DEFAULT).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let callback_url = match request.callback {
        Some(callback) => Some(super::callback::check_url(&callback.url, &app.config.callback_policy)?),
        None => None,
    };
    let uploads = named_uploads(app, tenant, &input, now).await?;

    // The semantic request: every field that changes what the work is, and
    // nothing volatile. Omitted optional fields and their defaults agree.
    let mut semantic = json!({
        "api_version": "v1",
        "kind": request.kind,
        "input": input,
        "callback": callback_url.as_ref().map(|url| json!({"url": url})),
        "deadline_seconds": request.deadline_seconds,
        "budget": budget.map(|units| json!({"max_cost_units": units})),
        "labels": labels,
    });
    // The start as asked (a relative one as its seconds: a retry asks the
    // same) and a priority other than the default; absent, they leave the
    // fingerprint of a request without them as it was.
    if let Some(start) = not_before.filter(|_| request.not_before.is_some()) {
        semantic["not_before"] = json!(start.to_rfc3339());
    }
    if let Some(seconds) = request.start_after_seconds {
        semantic["start_after_seconds"] = json!(seconds);
    }
    if priority != PRIORITY_DEFAULT {
        semantic["priority"] = json!(priority);
    }
    // A re-run is another request than a submission of the same input: the
    // same key on both conflicts instead of replaying the other.
    if let Some(rerun) = &rerun {
        semantic["rerun_of"] = json!(rerun.of.as_str());
        if rerun.from_checkpoint {
            semantic["from_checkpoint"] = json!(true);
        }
    }
    let from_checkpoint = rerun.as_ref().is_some_and(|r| r.from_checkpoint);
    Ok(AcceptParams {
        id: Id::generate(IdKind::Operation),
        tenant: tenant.to_owned(),
        kind: request.kind,
        input,
        callback_url,
        deadline_at: deadline_seconds.map(|s| now.plus(Duration::from_secs(s))),
        budget_max_cost: budget,
        labels,
        idempotency: key.map(|k| (k, app.fingerprinter.fingerprint(&semantic))),
        uploads,
        rerun_of: rerun.map(|r| r.of),
        from_checkpoint,
        not_before,
        priority,
        now,
    })
}

/// What a re-run adds to a submission: the original, and whether to start
/// from its last checkpoint.
pub(crate) struct Rerun {
    of: Id,
    from_checkpoint: bool,
}

/// Accepts a prepared submission: the operation, and whether it is a
/// replay. The API and the console submit through here.
pub(crate) async fn accept(app: &AppState, params: AcceptParams) -> Result<(Operation, bool), ApiError> {
    if let Some(op) = hand_off(app, &params).await? {
        return Ok((op, false));
    }
    let outcome = app.store.operation_accept(params).await.map_err(accept_error)?;
    accepted(app, outcome)
}

/// Accepts `params` leased to a claim waiting for its kind, if one is and
/// the store can (see `handoff`): the operation as created, or `None` when
/// it is to be accepted as usual.
async fn hand_off(app: &AppState, params: &AcceptParams) -> Result<Option<Operation>, ApiError> {
    if !app.store.hands_off() || !params.may_be_handed_off() {
        return Ok(None);
    }
    let Some(claim) = app.handoffs.take(&params.kind) else {
        return Ok(None);
    };
    // Leased, the task must reach the claim: a submitter whose request goes
    // away (its future dropped) must not drop the claim with the lease
    // already committed, which would leave the task to lapse and, for a
    // kind not safe to re-run, end as `outcome_unknown` without having run.
    // So the write and the answer run as a task of their own. Dropping
    // `claim` unanswered (nothing written, or an error) lets it look again.
    let (store, signals, params) = (app.store.clone(), app.signals.clone(), params.clone());
    let handed = tokio::spawn(async move {
        let Some((op, task)) = store.operation_accept_leased(&params, &claim.to).await? else {
            return Ok(None);
        };
        metrics::counter!("longrun_claims_handed_total").increment(1);
        signals.work_taken(op.id.as_str(), op.version);
        let id = task.operation_id.clone();
        if !claim.hand(task) {
            tracing::warn!(op.id = %id, "the claim handed this submission went away; its lease will run out");
        }
        Ok(Some(op))
    });
    handed
        .await
        .map_err(|_| accept_error(StoreError::Stopped("a hand-off")))?
        .map_err(accept_error)
}

/// What an acceptance means to the caller: the operation and whether it
/// is a replay, or the refusal of a reused key. New work wakes the claimers.
pub(crate) fn accepted(app: &AppState, outcome: AcceptOutcome) -> Result<(Operation, bool), ApiError> {
    match outcome {
        AcceptOutcome::Created(op) => {
            app.signals.work_available_for(&op.kind, op.id.as_str(), op.version);
            Ok((op, false))
        }
        // A replay of an operation past its expiry answers as one already
        // removed does.
        AcceptOutcome::Replayed(op) => Ok((app.visible(op)?, true)),
        AcceptOutcome::KeyReused { operation_id } => Err(ApiError::IdempotencyKeyReused { operation_id }),
    }
}

/// What a refused acceptance answers.
pub(crate) fn accept_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Gone => ApiError::Gone,
        StoreError::QuotaExceeded { active, max_active } => ApiError::QuotaExceeded {
            detail: format!("the tenant has {active} operations not yet ended; its limit is {max_active}"),
            retry_after: QUOTA_RETRY_AFTER,
        },
        other => other.into(),
    }
}

/// The uploads a submission's input names (any string in it that is an
/// upload id), each checked to be a complete upload of the tenant that is
/// still kept: the submission's transaction then keeps it alive with the
/// operation.
async fn named_uploads(
    app: &AppState,
    tenant: &str,
    input: &serde_json::Value,
    now: Timestamp,
) -> Result<Vec<Id>, ApiError> {
    let ids = longrun_core::validate::named_uploads(input);
    if ids.len() > MAX_NAMED_UPLOADS {
        return Err(ApiError::InvalidInput(format!(
            "the input names {} uploads; at most {MAX_NAMED_UPLOADS}",
            ids.len()
        )));
    }
    for id in &ids {
        let usable = match app.store.upload_get(tenant, id).await {
            Ok(upload) => upload.is_some_and(|u| u.is_usable(now)),
            Err(StoreError::NotFound) => false,
            Err(e) => return Err(e.into()),
        };
        if !usable {
            return Err(ApiError::InvalidInput(format!(
                "the input names {id}, which is not a complete upload of this tenant"
            )));
        }
    }
    Ok(ids)
}
