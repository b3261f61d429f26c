//! The operation resource (docs/api.md §3): submit, read, list, history, cancel.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use longrun_core::validate;
use longrun_core::{Id, IdKind, IdempotencyKey, State as OpState, Timestamp, retry_after};
use longrun_store::{AcceptParams, ListParams, Operation};
use serde::Deserialize;

use crate::app::ApiError;
use crate::app::AppState;
use crate::app::commands;
use crate::app::submissions::{accept, accept_error, accepted, prepare_rerun, prepare_submission};
use crate::http::auth::Caller;
use crate::http::error::Problem;
use crate::http::extract::{JsonBody, OptionalJsonBody, QueryParams};
use crate::http::wire::{
    self, BatchItemResult, BatchSubmitRequest, BatchSubmitResponse, CancelRequestBody, CancellationBody, DeliveryLog,
    History, OperationBody, OperationList, RerunRequest, SubmitRequest, UpdateRequest,
};

use crate::app::reads::{decode_page_token, encode_page_token, idempotency_expires, page_size};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/operations", post(submit).get(list))
        .route("/v1/operations/batch", post(submit_batch))
        .route("/v1/operations/{id}", get(read).delete(cancel_alias).patch(update))
        .route("/v1/operations/{id}/history", get(history))
        .route("/v1/operations/{id}/cancellation", put(cancel).get(cancellation))
        .route("/v1/operations/{id}/deliveries", get(deliveries))
        .route("/v1/operations/{id}/reruns", post(rerun))
}

/// The optional `Idempotency-Key` header, syntax-checked.
pub struct IdempotencyKeyHeader(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get("idempotency-key") {
            None => Ok(IdempotencyKeyHeader(None)),
            Some(value) => IdempotencyKey::parse(value.as_bytes())
                .map(|k| IdempotencyKeyHeader(Some(k)))
                .map_err(|e| ApiError::InvalidRequest(e.to_string())),
        }
    }
}

/// What a read of an operation asks of it, taken from its headers as they
/// are parsed (no copy of the headers is held through a long-poll). A
/// malformed `If-None-Match` is refused by the handler, after the checks
/// that come first (role, id).
pub struct ReadConditions {
    wait: Option<u64>,
    seen_tags: Result<Option<EntityTags>, ApiError>,
    has_condition: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for ReadConditions {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(ReadConditions {
            wait: prefer_wait(&parts.headers),
            seen_tags: entity_tags(&parts.headers, header::IF_NONE_MATCH),
            has_condition: parts.headers.contains_key(header::IF_NONE_MATCH),
        })
    }
}

/// The operation id of a path (the extractor's own copy, kept as the id).
fn parse_operation_id(raw: String) -> Result<Id, ApiError> {
    // A malformed id is answered exactly like an unknown one.
    Id::parse_owned(IdKind::Operation, raw).ok_or(ApiError::NotFound)
}

pub fn etag(version: i64) -> HeaderValue {
    // Written into a buffer on the stack: `format!` would allocate a string
    // only to have the header copy it (every GET of an operation sends one).
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(version).as_bytes();
    let mut quoted = [b'"'; 22];
    quoted[1..=digits.len()].copy_from_slice(digits);
    HeaderValue::from_bytes(&quoted[..digits.len() + 2]).expect("an integer ETag is a valid header")
}

/// Versions named by `If-None-Match` / `If-Match` (`*` matches any).
enum EntityTags {
    Any,
    Versions(Vec<i64>),
}

fn entity_tags(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<EntityTags>, ApiError> {
    let Some(value) = headers.get(&name) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::InvalidRequest(format!("{name} is not valid text")))?;
    // An empty field is no condition (what a client sending one means).
    if text.trim().is_empty() {
        return Ok(None);
    }
    if text.trim() == "*" {
        return Ok(Some(EntityTags::Any));
    }
    let mut versions = Vec::new();
    for tag in text.split(',') {
        let tag = tag.trim();
        let tag = tag.strip_prefix("W/").unwrap_or(tag);
        let version = tag
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<i64>().ok())
            .ok_or_else(|| ApiError::InvalidRequest(format!("{name} must list ETags like \"3\"")))?;
        versions.push(version);
    }
    Ok(Some(EntityTags::Versions(versions)))
}

/// `Some(version)` when `If-Match` names one version; `None` when absent or `*`.
pub(crate) fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    match entity_tags(headers, header::IF_MATCH)? {
        None | Some(EntityTags::Any) => Ok(None),
        Some(EntityTags::Versions(v)) if v.len() == 1 => Ok(Some(v[0])),
        Some(EntityTags::Versions(_)) => Err(ApiError::InvalidRequest("If-Match must name one ETag".into())),
    }
}

#[cfg(test)]
fn not_modified(headers: &HeaderMap, version: i64) -> Result<bool, ApiError> {
    Ok(names(entity_tags(headers, header::IF_NONE_MATCH)?.as_ref(), version))
}

/// Whether `If-None-Match` (as parsed) names `version`.
fn names(tags: Option<&EntityTags>, version: i64) -> bool {
    match tags {
        None => false,
        Some(EntityTags::Any) => true,
        Some(EntityTags::Versions(v)) => v.contains(&version),
    }
}

/// How long a client should wait before polling `op` again.
/// See `longrun_core::retry_after`: from the operation's age and its kind's
/// typical duration. (If the duration cannot be read, age alone decides.)
/// Work that starts later is asked after at its start, not in a poll loop.
async fn poll_hint(app: &AppState, op: &Operation) -> Duration {
    let now = app.clock.now();
    if op.state == longrun_core::State::Queued
        && let Some(start) = op.not_before.filter(|start| *start > now)
    {
        return start.since(now);
    }
    let typical = app.typical_duration(&op.kind).await.ok().flatten();
    retry_after::retry_after(now.since(op.created_at), typical)
}

/// ETag always; `Retry-After` while the operation is not terminal.
async fn set_observation_headers(app: &AppState, op: &Operation, headers: &mut HeaderMap) {
    headers.insert(header::ETAG, etag(op.version));
    if !op.state.is_terminal() {
        let seconds = retry_after::header_seconds(poll_hint(app, op).await);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
}

/// The representation of `op` with its ETag and, while it is not terminal,
/// a `Retry-After`.
pub(crate) async fn operation_response(app: &AppState, op: &Operation, status: StatusCode) -> Response {
    let stamp = crate::cache::stamp((op.version, op.updated_at, &op.reruns));
    let body = app.rendered.get_or_render(op.id.as_str(), stamp, || {
        serde_json::to_vec(&wire::operation(op)).expect("an operation serializes")
    });
    let json = HeaderValue::from_static("application/json");
    let mut response = (status, [(header::CONTENT_TYPE, json)], body).into_response();
    set_observation_headers(app, op, response.headers_mut()).await;
    response
}

/// Longest `Prefer: wait` honoured, in seconds.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// `Prefer: wait=N` (RFC 7240), capped at 60 s; other preferences and
/// malformed values are ignored, as preferences may be.
pub fn prefer_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pref| {
            let pref = pref.split(';').next()?.trim();
            let (name, value) = pref.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("wait")
                .then(|| value.trim().trim_matches('"').parse::<u64>().ok())?
        })
        .next()
        .map(|n| n.min(MAX_WAIT_SECONDS))
}

fn preference_applied(wait: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("wait={wait}")).expect("a number is a valid header")
}

fn too_many_waiters() -> ApiError {
    ApiError::RateLimited {
        detail: "the tenant has too many long-polls and event streams open".into(),
        retry_after: Duration::from_secs(1),
    }
}

/// Re-reads `op` each time it changes until `done` holds or `wait` passes;
/// returns the last read. While it waits it holds the operation's id, not
/// the operation: a long-poll is held by the thousand.
async fn wait_for_change(
    app: &AppState,
    waiter: &mut crate::changes::Waiter,
    tenant: &str,
    op: Arc<Operation>,
    wait: Duration,
    done: impl Fn(&Operation) -> bool,
) -> Result<Arc<Operation>, ApiError> {
    if done(&op) {
        return Ok(op);
    }
    let id = op.id.clone();
    drop(op);
    let give_up_at = tokio::time::Instant::now() + wait;
    loop {
        let gave_up = tokio::select! {
            () = waiter.changed() => false,
            () = tokio::time::sleep_until(give_up_at) => true,
        };
        let op = app
            .store
            .operation_shared(tenant, &id)
            .await?
            .ok_or(ApiError::NotFound)?;
        if gave_up || done(&op) {
            return Ok(op);
        }
    }
}

/// Names the operation in the request's span, for a request whose path
/// does not (the edge names the one a path carries).
fn record_operation_id(id: &Id) {
    tracing::Span::current().record("op.id", id.as_str());
}

#[utoipa::path(post, path = "/v1/operations", tag = "operations", security(("bearer" = [])),
    request_body = SubmitRequest,
    params(
        ("Idempotency-Key" = String, Header, description = "1–255 visible ASCII characters; required by default",
         min_length = 1, max_length = 255, pattern = "^[\\x21-\\x7e]+$"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (N ≤ 60): hold until terminal or N s"),
    ),
    responses(
        (status = 202, description = "Accepted (or a replay of an unfinished operation)", body = OperationBody,
         headers(("Location" = String), ("ETag" = String, description = "The version, quoted"), ("Retry-After" = u64, description = "Seconds to wait before polling again (non-terminal only)"), ("Idempotency-Expires" = String, description = "HTTP-date"),
                 ("Idempotent-Replayed" = String, description = "`true` on a replay"), ("Preference-Applied" = String))),
        (status = 200, description = "A replay of a terminal operation, or terminal within `Prefer: wait`", body = OperationBody,
         headers(("Location" = String), ("ETag" = String), ("Idempotency-Expires" = String), ("Idempotent-Replayed" = String))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn submit(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    JsonBody(request): JsonBody<SubmitRequest>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let now = app.clock.now();
    let params = prepare_submission(&app, &caller.tenant, key, request, now, None).await?;
    answer_submission(app, caller, &headers, params, now).await
}

/// Accepts a prepared submission and answers it as `POST /v1/operations`
/// does (also for re-runs): `202`, or `200` for a terminal replay or one
/// that ended within `Prefer: wait`.
async fn answer_submission(
    app: AppState,
    caller: Caller,
    headers: &HeaderMap,
    params: AcceptParams,
    now: Timestamp,
) -> Result<Response, ApiError> {
    let wait = prefer_wait(headers);
    // Watch the new id before it exists, so its first change cannot be missed.
    let mut waiter = match wait {
        Some(_) => Some(
            app.changes
                .watch(&caller.tenant, &params.id)
                .map_err(|_| too_many_waiters())?,
        ),
        None => None,
    };
    let (op, replayed) = accept(&app, params).await?;
    let mut op = Arc::new(op);
    record_operation_id(&op.id);

    // `Prefer: wait=N`: one round trip for short work.
    if let (Some(wait), Some(w)) = (wait, waiter.as_mut()) {
        if replayed {
            // The watch was on the id we did not use; watch the original.
            *w = app
                .changes
                .watch(&caller.tenant, &op.id)
                .map_err(|_| too_many_waiters())?;
            op = app
                .store
                .operation_shared(&caller.tenant, &op.id)
                .await?
                .ok_or(ApiError::NotFound)?;
        }
        op = wait_for_change(&app, w, &caller.tenant, op, Duration::from_secs(wait), |op| {
            op.state.is_terminal()
        })
        .await?;
    }
    drop(waiter);

    let status = if op.state.is_terminal() && (replayed || wait.is_some()) {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut response = operation_response(&app, &op, status).await;
    let headers = response.headers_mut();
    if let Some(wait) = wait {
        headers.insert("preference-applied", preference_applied(wait));
    }
    let location = format!("/v1/operations/{}", op.id);
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("ids are header-safe"),
    );
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if op.idempotency_key.is_some() {
        let expires = idempotency_expires(&app, &op, now);
        headers.insert(
            "idempotency-expires",
            HeaderValue::from_str(&expires.to_http_date()).expect("a date"),
        );
    }
    Ok(response)
}

#[utoipa::path(post, path = "/v1/operations/{id}/reruns", tag = "operations", security(("bearer" = [])),
    request_body(content = Option<RerunRequest>, description = "Overrides; an empty body re-runs as it was"),
    params(
        ("id" = String, Path, description = "The operation to re-run (op_…)"),
        ("Idempotency-Key" = String, Header, description = "1–255 visible ASCII characters; required by default",
         min_length = 1, max_length = 255, pattern = "^[\\x21-\\x7e]+$"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (N ≤ 60): hold until terminal or N s"),
    ),
    responses(
        (status = 202, description = "Accepted: a new operation with `rerun_of`", body = OperationBody,
         headers(("Location" = String), ("ETag" = String), ("Retry-After" = u64), ("Idempotency-Expires" = String), ("Idempotent-Replayed" = String))),
        (status = 200, description = "A replay of a terminal re-run, or terminal within `Prefer: wait`", body = OperationBody),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`; `input_not_kept` (409) when the original's input is gone", body = Problem, content_type = "application/problem+json"),
    ))]
async fn rerun(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    OptionalJsonBody(request): OptionalJsonBody<RerunRequest>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Operation, &id).ok_or(ApiError::NotFound)?;
    let now = app.clock.now();
    let params = prepare_rerun(&app, &caller.tenant, &id, key, request.unwrap_or_default(), now).await?;
    answer_submission(app, caller, &headers, params, now).await
}

/// Most submissions in one batch.
pub const MAX_BATCH_SUBMISSIONS: usize = 1000;

#[utoipa::path(post, path = "/v1/operations/batch", tag = "operations", security(("bearer" = [])), request_body = BatchSubmitRequest,
    responses((status = 200, description = "One result per item, in item order, each as its single submission would answer (202 new, 200 replay of a terminal operation, 409, 422, 429 …); every accepted item is durable before the response. An item refused alone refuses nothing else. Two items with the same key converge on one operation (one created, the other a replay; which one is not promised).", body = BatchSubmitResponse), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn submit_batch(
    State(app): State<AppState>,
    caller: Caller,
    axum::Extension(request_id): axum::Extension<crate::http::RequestId>,
    JsonBody(request): JsonBody<BatchSubmitRequest>,
) -> Result<Json<BatchSubmitResponse>, ApiError> {
    caller.require_client()?;
    if request.operations.is_empty() || request.operations.len() > MAX_BATCH_SUBMISSIONS {
        return Err(ApiError::InvalidRequest(format!(
            "operations must hold 1–{MAX_BATCH_SUBMISSIONS} items"
        )));
    }
    let now = app.clock.now();
    let total = request.operations.len();
    let mut results: Vec<Option<BatchItemResult>> = (0..total).map(|_| None).collect();
    let (mut slots, mut accepts) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (i, item) in request.operations.into_iter().enumerate() {
        let key = match item
            .idempotency_key
            .as_deref()
            .map(|k| IdempotencyKey::parse(k.as_bytes()))
            .transpose()
        {
            Ok(key) => key,
            Err(e) => {
                results[i] = Some(item_refused(
                    &ApiError::InvalidRequest(format!("idempotency_key: {e}")),
                    request_id.as_str(),
                ));
                continue;
            }
        };
        match prepare_submission(&app, &caller.tenant, key, item.into_request(), now, None).await {
            Ok(params) => {
                slots.push(i);
                accepts.push(params);
            }
            Err(e) => results[i] = Some(item_refused(&e, request_id.as_str())),
        }
    }
    for (slot, outcome) in slots.into_iter().zip(app.store.operation_accept_many(accepts).await) {
        results[slot] = Some(match outcome.map_err(accept_error).and_then(|o| accepted(&app, o)) {
            // A replay of an ended operation is 200, as a single submission's.
            Ok((op, replayed)) if replayed && op.state.is_terminal() => item_accepted(StatusCode::OK, &op, true),
            Ok((op, replayed)) => item_accepted(StatusCode::ACCEPTED, &op, replayed),
            Err(e) => item_refused(&e, request_id.as_str()),
        });
    }
    Ok(Json(BatchSubmitResponse {
        results: results.into_iter().map(|r| r.expect("every item answered")).collect(),
    }))
}

/// A batch item answered with its operation.
fn item_accepted(status: StatusCode, op: &Operation, replayed: bool) -> BatchItemResult {
    BatchItemResult {
        status: status.as_u16(),
        replayed,
        operation: Some(wire::operation(op)),
        problem: None,
    }
}

/// A batch item refused.
fn item_refused(error: &ApiError, request_id: &str) -> BatchItemResult {
    let problem = error.item_problem(request_id);
    BatchItemResult {
        status: problem.status,
        replayed: false,
        operation: None,
        problem: Some(problem),
    }
}

/// `GET /v1/operations/{id}`, conditional (`If-None-Match` → `304`) and, with
/// `Prefer: wait=N`, long-polling: held until the version changes (woken by
/// the change itself) or N s pass.
///
/// A poll of an operation that has not changed since the server last read
/// it is answered from memory. A client always reads its own writes and
/// whatever change woke its long-poll; with several PostgreSQL nodes, a
/// write made through another node is read once its notification arrives.
#[utoipa::path(get, path = "/v1/operations/{id}", tag = "operations", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
        ("If-None-Match" = Option<String>, Header, description = "ETags seen before, or `*` (empty: none)", pattern = "^(\\*|(W/)?\"[0-9]{1,18}\"( *, *(W/)?\"[0-9]{1,18}\")*)?$"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (N ≤ 60): long-poll until the version changes"),
    ),
    responses(
        (status = 200, description = "The operation", body = OperationBody, headers(("ETag" = String, description = "The version, quoted"), ("Retry-After" = u64, description = "Seconds to wait before polling again (non-terminal only)"), ("Preference-Applied" = String))),
        (status = 304, description = "Not modified", headers(("ETag" = String, description = "The version, quoted"), ("Retry-After" = u64, description = "Seconds to wait before polling again (non-terminal only)"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn read(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    conditions: ReadConditions,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    let ReadConditions {
        wait,
        seen_tags,
        has_condition,
    } = conditions;
    let seen_tags = seen_tags?;
    let mut waiter = match wait {
        Some(_) => Some(app.changes.watch(&caller.tenant, &id).map_err(|_| too_many_waiters())?),
        None => None,
    };
    let mut op = app.operation_shared(&caller.tenant, &id).await?;
    if let (Some(wait), Some(w)) = (wait, waiter.as_mut()) {
        // Worth waiting only for something that can still change, and (with
        // If-None-Match) only while the client's version is the current one.
        let seen = op.version;
        let worth_waiting = !op.state.is_terminal() && (!has_condition || names(seen_tags.as_ref(), seen));
        if worth_waiting {
            op = wait_for_change(&app, w, &caller.tenant, op, Duration::from_secs(wait), |op| {
                op.version != seen
            })
            .await?;
        }
    }
    drop(waiter);
    let mut response = if names(seen_tags.as_ref(), op.version) {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        set_observation_headers(&app, &op, response.headers_mut()).await;
        response
    } else {
        operation_response(&app, &op, StatusCode::OK).await
    };
    if let Some(wait) = wait {
        response
            .headers_mut()
            .insert("preference-applied", preference_applied(wait));
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    kind: Option<String>,
    label: Option<String>,
    page_size: Option<u32>,
    page_token: Option<String>,
}

#[utoipa::path(get, path = "/v1/operations", tag = "operations", security(("bearer" = [])),
    params(
        ("state" = Option<String>, Query, description = "queued, running, paused, succeeded, failed or cancelled",
         pattern = "^(queued|running|paused|succeeded|failed|cancelled)$"),
        ("kind" = Option<String>, Query, pattern = "^[a-z0-9][a-z0-9_.-]{0,63}$"),
        ("label" = Option<String>, Query, description = "key:value", pattern = "^[a-z0-9_./-]{1,63}:[\\s\\S]{0,256}$"),
        ("page_size" = Option<u32>, Query, description = "1–100 (0 or absent: 50)", maximum = 100),
        ("page_token" = Option<String>, Query, description = "next_page_token of the previous page", pattern = "^[0-9a-z]{1,12}$"),
    ),
    responses((status = 200, description = "Newest first", body = OperationList), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn list(
    State(app): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<OperationList>, ApiError> {
    caller.require_client()?;
    let page_size = page_size(query.page_size)?;
    let state = query
        .state
        .map(|s| {
            s.parse::<OpState>()
                .map_err(|e| ApiError::InvalidRequest(e.to_string()))
        })
        .transpose()?;
    if let Some(kind) = &query.kind {
        validate::kind_name(kind).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    }
    let label = query
        .label
        .map(|l| validate::label_selector(&l).map_err(|e| ApiError::InvalidRequest(e.to_string())))
        .transpose()?;
    let before_seq = query.page_token.as_deref().map(decode_page_token).transpose()?;
    let page = app
        .store
        .operation_list(ListParams {
            tenant: Some(caller.tenant),
            state,
            kind: query.kind,
            label,
            page_size,
            before_seq,
            visible_at: Some(app.clock.now()),
            ..Default::default()
        })
        .await?;
    Ok(Json(OperationList {
        operations: page.operations.iter().map(wire::operation).collect(),
        next_page_token: page.next_before_seq.map(encode_page_token),
    }))
}

#[utoipa::path(get, path = "/v1/operations/{id}/history", tag = "operations", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")),
    responses((status = 200, description = "Every change, oldest first", body = History), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn history(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<History>, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    app.operation(&caller.tenant, &id).await?;
    let events = app.store.operation_history(&caller.tenant, &id).await?;
    let events = app.found(&caller.tenant, &id, events).await?;
    Ok(Json(History {
        operation_id: id.to_string(),
        events: events.iter().map(wire::event).collect(),
    }))
}

#[utoipa::path(put, path = "/v1/operations/{id}/cancellation", tag = "operations", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"), ("If-Match" = Option<String>, Header, description = "Cancel only at this version (`*` or empty: any)", pattern = "^(\\*|(W/)?\"[0-9]{1,18}\")?$")),
    request_body(content = Option<CancelRequestBody>, description = "Optional reason"),
    responses(
        (status = 200, description = "Cancelled now, or already terminal (unchanged)", body = OperationBody, headers(("ETag" = String))),
        (status = 202, description = "Running: the worker has been asked", body = OperationBody, headers(("ETag" = String, description = "The version, quoted"), ("Retry-After" = u64, description = "Seconds to wait before polling again (non-terminal only)"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    OptionalJsonBody(body): OptionalJsonBody<CancelRequestBody>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    let reason = body.unwrap_or_default().reason;
    let if_match = if_match(&headers)?;
    let (op, applied) = commands::cancel(&app, &caller.tenant, caller.key_id.as_str(), &id, reason, if_match).await?;
    Ok(operation_response(&app, &op, status_of(applied)).await)
}

/// `DELETE /v1/operations/{id}`: the same as `PUT …/cancellation`.
#[utoipa::path(delete, path = "/v1/operations/{id}", tag = "operations", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
           ("If-Match" = Option<String>, Header, description = "Cancel only at this version (`*` or empty: any)", pattern = "^(\\*|(W/)?\"[0-9]{1,18}\")?$")),
    responses(
        (status = 200, description = "Cancelled now, or already terminal (unchanged)", body = OperationBody),
        (status = 202, description = "Running: the worker has been asked", body = OperationBody),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel_alias(
    state: State<AppState>,
    caller: Caller,
    id: Path<String>,
    headers: HeaderMap,
    body: OptionalJsonBody<CancelRequestBody>,
) -> Result<Response, ApiError> {
    cancel(state, caller, id, headers, body).await
}

#[utoipa::path(get, path = "/v1/operations/{id}/cancellation", tag = "operations", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")),
    responses((status = 200, description = "Who asked, when, why, and the outcome", body = CancellationBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn cancellation(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<CancellationBody>, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    let op = app.operation(&caller.tenant, &id).await?;
    Ok(Json(wire::cancellation(&op)))
}

/// `PATCH /v1/operations/{id}`: a new `deadline_seconds` (counted from
/// creation, like at submission; `null` removes it) and/or new `labels`,
/// under `If-Match`.
#[utoipa::path(patch, path = "/v1/operations/{id}", tag = "operations", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"), ("If-Match" = String, Header, description = "The ETag the change is based on (required)", pattern = "^(W/)?\"[0-9]{1,18}\"$")),
    request_body = UpdateRequest,
    responses((status = 200, description = "Changed", body = OperationBody, headers(("ETag" = String, description = "The version, quoted"), ("Retry-After" = u64, description = "Seconds to wait before polling again (non-terminal only)"))), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn update(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<UpdateRequest>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    let if_match = if_match(&headers)?.ok_or(ApiError::PreconditionRequired)?;
    let (op, applied) = commands::update(&app, &caller.tenant, id, if_match, request).await?;
    Ok(operation_response(&app, &op, status_of(applied)).await)
}

/// `GET /v1/operations/{id}/deliveries`: every webhook delivery attempt, oldest first.
#[utoipa::path(get, path = "/v1/operations/{id}/deliveries", tag = "webhooks", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")),
    responses((status = 200, description = "Every webhook delivery attempt", body = DeliveryLog), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn deliveries(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<DeliveryLog>, ApiError> {
    caller.require_client()?;
    let id = parse_operation_id(id)?;
    app.operation(&caller.tenant, &id).await?;
    let log = app.store.webhook_log(&caller.tenant, &id).await?;
    let log = app.found(&caller.tenant, &id, log).await?;
    Ok(Json(DeliveryLog {
        deliveries: log.iter().map(wire::delivery).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_is_the_version_in_quotes() {
        for version in [0, 1, 9, 10, 42, 1_000_007, i64::MAX, -1, i64::MIN] {
            assert_eq!(etag(version).to_str().unwrap(), format!("\"{version}\""));
        }
    }

    #[test]
    fn entity_tag_lists() {
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"3\", W/\"4\""));
        assert!(not_modified(&headers, 4).unwrap());
        assert!(!not_modified(&headers, 5).unwrap());
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert!(not_modified(&headers, 9).unwrap());
        headers.insert(header::IF_MATCH, HeaderValue::from_static("\"7\""));
        assert_eq!(if_match(&headers).unwrap(), Some(7));
        headers.insert(header::IF_MATCH, HeaderValue::from_static("seven"));
        assert!(if_match(&headers).is_err());
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn with(name: header::HeaderName, value: &str) -> Option<HeaderMap> {
        let value = HeaderValue::from_str(value).ok()?;
        let mut headers = HeaderMap::new();
        headers.insert(name, value);
        Some(headers)
    }

    proptest! {
        /// Any If-Match / If-None-Match value: a condition or `400
        /// invalid_request`, never a panic.
        #[test]
        fn any_entity_tag_field_is_a_condition_or_invalid_request(raw in any::<String>()) {
            for name in [header::IF_MATCH, header::IF_NONE_MATCH] {
                let Some(headers) = with(name.clone(), &raw) else { continue };
                if let Err(e) = entity_tags(&headers, name) {
                    prop_assert_eq!(e.code(), "invalid_request");
                }
            }
        }

        /// Every list of tags a client may write means those versions.
        #[test]
        fn written_tag_lists_mean_their_versions(versions in prop::collection::vec((0i64..i64::MAX, any::<bool>()), 1..5)) {
            let text = versions
                .iter()
                .map(|(v, weak)| format!("{}\"{v}\"", if *weak { "W/" } else { "" }))
                .collect::<Vec<_>>()
                .join(" , ");
            let headers = with(header::IF_NONE_MATCH, &text).unwrap();
            for (v, _) in &versions {
                prop_assert!(not_modified(&headers, *v).unwrap());
            }
        }

        /// Any Prefer header: a wait of at most 60 s or none.
        #[test]
        fn any_prefer_header_waits_at_most_the_cap(raw in any::<String>(), n in any::<u64>()) {
            if let Some(headers) = with(header::HeaderName::from_static("prefer"), &raw) {
                prop_assert!(prefer_wait(&headers).is_none_or(|w| w <= MAX_WAIT_SECONDS));
            }
            let headers = with(header::HeaderName::from_static("prefer"), &format!("respond-async, wait={n}")).unwrap();
            prop_assert_eq!(prefer_wait(&headers), Some(n.min(MAX_WAIT_SECONDS)));
        }

        /// Any page token: a position or `400 invalid_request`; every
        /// position the server writes reads back.
        #[test]
        fn page_tokens_round_trip_and_anything_else_is_refused(raw in any::<String>(), seq in 0i64..4_000_000_000_000_000_000) {
            if let Err(e) = decode_page_token(&raw) {
                prop_assert_eq!(e.code(), "invalid_request");
            }
            prop_assert_eq!(decode_page_token(&encode_page_token(seq)).unwrap(), seq);
        }
    }
}

/// `200` for a change done, `202` for one asked of the operation's worker.
fn status_of(applied: commands::Applied) -> StatusCode {
    match applied {
        commands::Applied::Done => StatusCode::OK,
        commands::Applied::Asked => StatusCode::ACCEPTED,
    }
}
