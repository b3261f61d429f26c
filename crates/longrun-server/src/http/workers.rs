//! The remote worker protocol (docs/api.md §4), for keys of role `worker`:
//! long-polling batch claims, fenced heartbeats and outcomes.
//!
//! Workers serve every tenant's tasks of the kinds they ask for (they are the
//! operator's fleet); claims are fair across tenants and honour each
//! tenant's `max_running`.

use std::borrow::Cow;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use longrun_api::{
    BudgetBody, CancelledRequest, ClaimRequest, ClaimResponse, CompleteRequest, FailRequest, HeartbeatRequest,
    HeartbeatResponse, OutcomeItem, OutcomeItemResult, OutcomeKind, OutcomeResponse, OutcomesRequest, OutcomesResponse,
    PausedRequest, Problem, ProgressRequest, TaskBody,
};
use longrun_core::lease::{MAX_LEASE, MIN_LEASE};
use longrun_core::{Id, IdKind, validate};
use longrun_store::{ClaimParams, FinishParams, HeartbeatParams, Outcome, ProgressUpdate, StoreError, Task};
use longrun_worker::reports::{self, ReportError};
use serde_json::Value;

use crate::app::ApiError;
use crate::app::AppState;
use crate::http::auth::Caller;
use crate::http::extract::JsonBody;

pub const MAX_TASKS_PER_CLAIM: u32 = 100;
pub const MAX_CLAIM_WAIT_SECONDS: u64 = 60;
pub const MAX_KINDS_PER_CLAIM: usize = 32;
/// Most items in one `POST /v1/worker/outcomes`.
pub const MAX_OUTCOMES_PER_BATCH: usize = 1000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/worker/claims", post(claim))
        .route("/v1/worker/tasks/{id}/heartbeat", post(heartbeat))
        .route("/v1/worker/tasks/{id}/complete", post(complete))
        .route("/v1/worker/tasks/{id}/fail", post(fail))
        .route("/v1/worker/tasks/{id}/cancelled", post(cancelled))
        .route("/v1/worker/tasks/{id}/paused", post(paused))
        .route("/v1/worker/outcomes", post(outcomes))
}

fn require_worker(caller: &Caller) -> Result<(), ApiError> {
    match caller.role {
        longrun_core::apikey::Role::Worker | longrun_core::apikey::Role::Admin => Ok(()),
        longrun_core::apikey::Role::Client => Err(ApiError::Forbidden),
    }
}

#[utoipa::path(post, path = "/v1/worker/claims", tag = "workers", security(("bearer" = [])), request_body = ClaimRequest,
    responses((status = 200, description = "Leased tasks (possibly none)", body = ClaimResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn claim(
    State(app): State<AppState>,
    caller: Caller,
    JsonBody(request): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    require_worker(&caller)?;
    if request.kinds.is_empty() || request.kinds.len() > MAX_KINDS_PER_CLAIM {
        return Err(ApiError::InvalidRequest(format!(
            "kinds must name 1–{MAX_KINDS_PER_CLAIM} kinds"
        )));
    }
    for kind in &request.kinds {
        validate::kind_name(kind).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    }
    if !(1..=MAX_TASKS_PER_CLAIM).contains(&request.max_tasks) {
        return Err(ApiError::InvalidRequest(format!(
            "max_tasks must be between 1 and {MAX_TASKS_PER_CLAIM}"
        )));
    }
    let lease = Duration::from_secs(request.lease_seconds);
    if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
        return Err(ApiError::InvalidRequest(format!(
            "lease_seconds must be between {} and {}",
            MIN_LEASE.as_secs(),
            MAX_LEASE.as_secs()
        )));
    }
    if request.wait_seconds > MAX_CLAIM_WAIT_SECONDS {
        return Err(ApiError::InvalidRequest(format!(
            "wait_seconds must be at most {MAX_CLAIM_WAIT_SECONDS}"
        )));
    }
    let worker_id = request.worker_id.unwrap_or_else(|| caller.key_id.to_string());
    if worker_id.is_empty() || worker_id.len() > 128 {
        return Err(ApiError::InvalidRequest("worker_id must be 1–128 characters".into()));
    }

    let give_up_at = tokio::time::Instant::now() + Duration::from_secs(request.wait_seconds);
    let kinds: std::sync::Arc<[String]> = request.kinds.into();
    // What made this look: the claim's start, a wake-up, the fallback poll.
    let mut after = "start";
    loop {
        // Subscribe before looking, so work that arrives in between wakes
        // us (work of other kinds does not).
        let mut work = app.signals.watch_work_of(kinds.clone());
        let tasks = app
            .store
            .task_claim(ClaimParams {
                kinds: kinds.to_vec(),
                max_tasks: request.max_tasks,
                lease,
                worker_id: worker_id.clone(),
                now: app.clock.now(),
            })
            .await?;
        // Looks that found nothing are round trips (on SQLite, turns of its
        // one writer): after a wake-up, one that was not for this claimer.
        let found = if tasks.is_empty() { "none" } else { "tasks" };
        metrics::counter!("longrun_claim_rounds_total", "found" => found, "after" => after).increment(1);
        let now = tokio::time::Instant::now();
        // A claim leases many operations: each is named, so a trace of one
        // follows it from its submission to this worker.
        for t in &tasks {
            tracing::debug!(op.id = %t.operation_id, attempt = t.attempt, worker = %worker_id, "leased");
        }
        if !tasks.is_empty() || now >= give_up_at {
            return Ok(Json(claimed(tasks)));
        }
        let wake_at = give_up_at.min(now + app.config.claim_poll);
        after = "poll";
        let woken = async {
            tokio::select! {
                () = work.changed() => after = "wake",
                () = tokio::time::sleep_until(wake_at) => {}
            }
        };
        // Waiting, the claim may be handed a submission as it is accepted
        // (see `handoff`), where the store can.
        let handed = if app.store.hands_off() {
            app.handoffs.wait(&kinds, &worker_id, lease, woken).await
        } else {
            woken.await;
            None
        };
        if let Some(task) = handed {
            tracing::debug!(op.id = %task.operation_id, worker = %worker_id, "leased as submitted");
            return Ok(Json(claimed(vec![task])));
        }
    }
}

/// A claim's answer.
fn claimed(tasks: Vec<Task>) -> ClaimResponse {
    ClaimResponse {
        tasks: tasks
            .into_iter()
            .map(|t| TaskBody {
                operation_id: t.operation_id.to_string(),
                kind: t.kind,
                input: t.input,
                attempt: t.attempt,
                lease_token: t.lease_token,
                lease_expires_at: t.lease_expires_at.to_rfc3339(),
                deadline_at: t.deadline_at.map(|d| d.to_rfc3339()),
                budget: t.budget_max_cost.map(|max_cost_units| BudgetBody { max_cost_units }),
                checkpoint: t.checkpoint,
            })
            .collect(),
    }
}

/// A task id in a worker path. An unknown id is answered like a stale lease:
/// the worker cannot hold a lease on it.
fn task_id(raw: &str) -> Result<Id, ApiError> {
    Id::parse(IdKind::Operation, raw)
        .ok_or_else(|| ApiError::InvalidRequest("the path must name an operation id (op_…)".into()))
}

fn lease_error(id: &Id) -> impl FnOnce(StoreError) -> ApiError + '_ {
    move |e| match e {
        StoreError::LeaseLost => ApiError::LeaseLost {
            operation_id: id.clone(),
        },
        other => other.into(),
    }
}

/// What a broken limit is answered with.
fn report_error(e: ReportError) -> ApiError {
    match e {
        ReportError::Invalid(message) => ApiError::InvalidRequest(message),
        ReportError::TooLarge(message) => ApiError::PayloadTooLarge(message),
    }
}

/// A progress report as the store takes it, within the limits every worker keeps.
fn check_progress(progress: ProgressRequest) -> Result<ProgressUpdate, ApiError> {
    reports::check_progress(reports::progress_from_wire(progress)).map_err(report_error)
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/heartbeat", tag = "workers", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")), request_body = HeartbeatRequest,
    responses((status = 200, description = "Renews the lease; says whether to stop", body = HeartbeatResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn heartbeat(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    require_worker(&caller)?;
    let id = task_id(&id)?;
    let params = check_heartbeat(
        &app,
        id.clone(),
        request.lease_token,
        request.progress,
        request.cost_units,
        request.cancellable,
        request.checkpoint,
    )?;
    let ack = app.store.task_heartbeat(params).await.map_err(lease_error(&id))?;
    Ok(Json(HeartbeatResponse {
        lease_expires_at: ack.lease_expires_at.to_rfc3339(),
        cancel_requested: ack.cancel_requested,
        cancel_reason: ack.cancel_reason,
        pause_requested: ack.pause_requested,
    }))
}

async fn finish(app: &AppState, params: FinishParams) -> Result<Json<OutcomeResponse>, ApiError> {
    let id = params.operation_id.clone();
    let op = app.store.task_finish(params).await.map_err(lease_error(&id))?;
    count_pause(&op);
    app.slot_freed(&op.tenant, &op.kind, op.id.as_str(), op.version).await;
    Ok(Json(outcome_response(&op)))
}

/// Counts a pause a worker honoured (`/metrics`), as `PATCH` counts the others.
fn count_pause(op: &longrun_store::Operation) {
    if op.state == longrun_core::State::Paused {
        metrics::counter!("longrun_operations_intents_total", "change" => "paused").increment(1);
    }
}

/// A checkpoint within its size bound.
fn check_checkpoint(checkpoint: Option<Value>) -> Result<Option<Value>, ApiError> {
    if let Some(c) = &checkpoint {
        reports::check_checkpoint(c).map_err(report_error)?;
    }
    Ok(checkpoint)
}

/// What an outcome call answers for `op`.
fn outcome_response(op: &longrun_store::Operation) -> OutcomeResponse {
    OutcomeResponse {
        operation_id: op.id.to_string(),
        state: Cow::Borrowed(op.state.as_str()),
        version: op.version,
        attempt: op.attempt,
    }
}

/// A heartbeat as the store takes it, once its fields are checked.
fn check_heartbeat(
    app: &AppState,
    operation_id: Id,
    lease_token: String,
    progress: Option<ProgressRequest>,
    cost_units: Option<f64>,
    cancellable: Option<bool>,
    checkpoint: Option<Value>,
) -> Result<HeartbeatParams, ApiError> {
    let progress = progress.map(check_progress).transpose()?;
    let checkpoint = check_checkpoint(checkpoint)?;
    reports::check_cost(cost_units).map_err(report_error)?;
    Ok(HeartbeatParams {
        operation_id,
        lease_token,
        progress,
        cost_units,
        cancellable,
        checkpoint,
        now: app.clock.now(),
    })
}

/// An outcome as the store takes it, once its fields are checked: the same
/// limits for the single endpoints and the batch.
fn check_outcome(
    app: &AppState,
    operation_id: Id,
    lease_token: String,
    outcome: Outcome,
    progress: Option<ProgressRequest>,
) -> Result<FinishParams, ApiError> {
    reports::check_outcome(&operation_id, &outcome).map_err(report_error)?;
    Ok(FinishParams {
        operation_id,
        lease_token,
        outcome,
        progress: progress.map(check_progress).transpose()?,
        now: app.clock.now(),
    })
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/complete", tag = "workers", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")), request_body = CompleteRequest,
    responses((status = 200, description = "Succeeded", body = OutcomeResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn complete(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<CompleteRequest>,
) -> Result<Json<OutcomeResponse>, ApiError> {
    require_worker(&caller)?;
    let outcome = Outcome::Succeeded { result: request.result };
    let params = check_outcome(&app, task_id(&id)?, request.lease_token, outcome, request.progress)?;
    finish(&app, params).await
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/fail", tag = "workers", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")), request_body = FailRequest,
    responses((status = 200, description = "Failed (or retried, if retryable and attempts are left)", body = OutcomeResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn fail(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<FailRequest>,
) -> Result<Json<OutcomeResponse>, ApiError> {
    require_worker(&caller)?;
    let outcome = Outcome::Failed {
        error: reports::error_from_wire(request.error),
    };
    let params = check_outcome(&app, task_id(&id)?, request.lease_token, outcome, request.progress)?;
    finish(&app, params).await
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/cancelled", tag = "workers", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")), request_body = CancelledRequest,
    responses((status = 200, description = "Cancelled (acknowledged)", body = OutcomeResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn cancelled(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<CancelledRequest>,
) -> Result<Json<OutcomeResponse>, ApiError> {
    require_worker(&caller)?;
    let params = check_outcome(
        &app,
        task_id(&id)?,
        request.lease_token,
        Outcome::Cancelled,
        request.progress,
    )?;
    finish(&app, params).await
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/paused", tag = "workers", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")), request_body = PausedRequest,
    responses((status = 200, description = "Paused as asked: the lease ends, and a resume hands the checkpoint to the next claim. `409 intent_conflict` when no pause was asked for; after a cancel request the work ends as the cancel says", body = OutcomeResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn paused(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<PausedRequest>,
) -> Result<Json<OutcomeResponse>, ApiError> {
    require_worker(&caller)?;
    let params = check_outcome(
        &app,
        task_id(&id)?,
        request.lease_token,
        Outcome::Paused {
            checkpoint: request.checkpoint,
        },
        request.progress,
    )?;
    finish(&app, params).await
}

/// An item's answer when it is refused.
fn refused_item(operation_id: String, error: &ApiError, request_id: &str) -> OutcomeItemResult {
    let problem = error.item_problem(request_id);
    OutcomeItemResult {
        status: problem.status,
        operation_id,
        problem: Some(problem),
        ..OutcomeItemResult::default()
    }
}

/// An item checked and ready for the store.
enum Checked {
    Heartbeat(HeartbeatParams),
    Finish(FinishParams),
}

fn check_item(app: &AppState, item: OutcomeItem) -> Result<Checked, ApiError> {
    let id = task_id(&item.operation_id)?;
    let misplaced =
        |field: &str, allowed: &str| ApiError::InvalidRequest(format!("`{field}` belongs only to a `{allowed}` item"));
    if item.result.is_some() && item.outcome != OutcomeKind::Complete {
        return Err(misplaced("result", "complete"));
    }
    if item.error.is_some() && item.outcome != OutcomeKind::Fail {
        return Err(misplaced("error", "fail"));
    }
    if (item.cost_units.is_some() || item.cancellable.is_some()) && item.outcome != OutcomeKind::Heartbeat {
        return Err(misplaced("cost_units` or `cancellable", "heartbeat"));
    }
    if item.checkpoint.is_some() && !matches!(item.outcome, OutcomeKind::Heartbeat | OutcomeKind::Paused) {
        return Err(ApiError::InvalidRequest(
            "`checkpoint` belongs only to a `heartbeat` or `paused` item".into(),
        ));
    }
    let outcome = match item.outcome {
        OutcomeKind::Heartbeat => {
            return check_heartbeat(
                app,
                id,
                item.lease_token,
                item.progress,
                item.cost_units,
                item.cancellable,
                item.checkpoint,
            )
            .map(Checked::Heartbeat);
        }
        OutcomeKind::Paused => Outcome::Paused {
            checkpoint: item.checkpoint,
        },
        OutcomeKind::Complete => Outcome::Succeeded { result: item.result },
        OutcomeKind::Fail => Outcome::Failed {
            error: reports::error_from_wire(
                item.error
                    .ok_or_else(|| ApiError::InvalidRequest("a `fail` item needs `error`".into()))?,
            ),
        },
        OutcomeKind::Cancelled => Outcome::Cancelled,
    };
    check_outcome(app, id, item.lease_token, outcome, item.progress).map(Checked::Finish)
}

#[utoipa::path(post, path = "/v1/worker/outcomes", tag = "workers", security(("bearer" = [])), request_body = OutcomesRequest,
    responses((status = 200, description = "One result per item, in item order; each item is fenced by its own lease token and succeeds or fails alone. Heartbeats are applied before the outcomes of the same batch.", body = OutcomesResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn outcomes(
    State(app): State<AppState>,
    caller: Caller,
    axum::Extension(request_id): axum::Extension<crate::http::RequestId>,
    JsonBody(request): JsonBody<OutcomesRequest>,
) -> Result<Json<OutcomesResponse>, ApiError> {
    require_worker(&caller)?;
    if request.outcomes.is_empty() || request.outcomes.len() > MAX_OUTCOMES_PER_BATCH {
        return Err(ApiError::InvalidRequest(format!(
            "outcomes must hold 1–{MAX_OUTCOMES_PER_BATCH} items"
        )));
    }
    // Every item gets its slot now: refused at once, or answered below.
    let mut results: Vec<OutcomeItemResult> = Vec::with_capacity(request.outcomes.len());
    let (mut heartbeats, mut finishes) = (Vec::new(), Vec::new());
    for (slot, item) in request.outcomes.into_iter().enumerate() {
        let operation_id = item
            .get("operation_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        // Each item is read alone, so a malformed one refuses only itself.
        let item = serde_json::from_value::<OutcomeItem>(Value::Object(item))
            .map_err(|e| ApiError::InvalidRequest(format!("invalid outcome: {e}")));
        results.push(match item.and_then(|item| check_item(&app, item)) {
            Ok(Checked::Heartbeat(p)) => {
                heartbeats.push((slot, p));
                OutcomeItemResult::default()
            }
            Ok(Checked::Finish(p)) => {
                finishes.push((slot, p));
                OutcomeItemResult::default()
            }
            Err(e) => refused_item(operation_id, &e, request_id.as_str()),
        });
    }
    let refused = |id: &Id, e: StoreError| {
        let error = lease_error(id)(e);
        refused_item(id.to_string(), &error, request_id.as_str())
    };
    let (slots, params): (Vec<usize>, Vec<HeartbeatParams>) = heartbeats.into_iter().unzip();
    let ids: Vec<Id> = params.iter().map(|p| p.operation_id.clone()).collect();
    for ((slot, id), ack) in slots
        .into_iter()
        .zip(ids)
        .zip(app.store.task_heartbeat_many(params).await)
    {
        results[slot] = match ack {
            Ok(ack) => OutcomeItemResult {
                status: 200,
                operation_id: id.to_string(),
                version: Some(ack.version),
                lease_expires_at: Some(ack.lease_expires_at.to_rfc3339()),
                cancel_requested: Some(ack.cancel_requested),
                cancel_reason: ack.cancel_reason,
                pause_requested: Some(ack.pause_requested),
                ..OutcomeItemResult::default()
            },
            Err(e) => refused(&id, e),
        };
    }
    let (slots, params): (Vec<usize>, Vec<FinishParams>) = finishes.into_iter().unzip();
    let ids: Vec<Id> = params.iter().map(|p| p.operation_id.clone()).collect();
    for ((slot, id), op) in slots.into_iter().zip(ids).zip(app.store.task_finish_many(params).await) {
        results[slot] = match op {
            Ok(op) => {
                count_pause(&op);
                app.slot_freed(&op.tenant, &op.kind, op.id.as_str(), op.version).await;
                let body = outcome_response(&op);
                OutcomeItemResult {
                    status: 200,
                    operation_id: body.operation_id,
                    state: Some(body.state),
                    version: Some(body.version),
                    attempt: Some(body.attempt),
                    ..OutcomeItemResult::default()
                }
            }
            Err(e) => refused(&id, e),
        };
    }
    for r in &results {
        tracing::debug!(op.id = %r.operation_id, status = r.status, state = ?r.state, "reported");
    }
    Ok(Json(OutcomesResponse { results }))
}
