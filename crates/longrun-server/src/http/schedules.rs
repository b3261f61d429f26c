//! The schedule resource (docs/schedules.md): create, read, list, change
//! under `If-Match`, delete, its firing records, and a firing on demand.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use longrun_core::{Id, IdKind};
use longrun_store::ScheduleRecord;
use serde::Deserialize;

use crate::app::ApiError;
use crate::app::AppState;
use crate::app::reads::page_size;
use crate::app::schedules::{self, Definition};
use crate::http::auth::Caller;
use crate::http::error::Problem;
use crate::http::extract::{JsonBody, QueryParams};
use crate::http::operations::{etag, if_match, operation_response};
use longrun_api::{BackfillRequest, ScheduleBody, ScheduleFires, ScheduleList, SchedulePatch, ScheduleRequest};

const MAX_FIRES: u32 = 100;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/schedules", post(create).get(list))
        .route("/v1/schedules/{id}", get(read).patch(update).delete(remove))
        .route("/v1/schedules/{id}/fires", get(fires))
        .route("/v1/schedules/{id}/trigger", post(trigger))
        .route("/v1/schedules/{id}/backfill", post(backfill))
}

fn parse_schedule_id(raw: &str) -> Result<Id, ApiError> {
    // A malformed id is answered exactly like an unknown one.
    Id::parse(IdKind::Schedule, raw).ok_or(ApiError::NotFound)
}

fn schedule_response(record: &ScheduleRecord, status: StatusCode) -> Result<Response, ApiError> {
    let mut response = (status, Json(schedules::body(record)?)).into_response();
    response.headers_mut().insert(header::ETAG, etag(record.version));
    Ok(response)
}

/// `POST /v1/schedules`: `201` with the schedule and its next firing times.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", security(("bearer" = [])),
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Created", body = ScheduleBody, headers(("Location" = String), ("ETag" = String, description = "The version, quoted"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn create(
    State(app): State<AppState>,
    caller: Caller,
    JsonBody(request): JsonBody<ScheduleRequest>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let now = app.clock.now();
    let paused = request.paused.unwrap_or(false);
    let Definition { request, cadence } = schedules::check(&app, &caller.tenant, request, now).await?;
    let record = ScheduleRecord {
        id: Id::generate(IdKind::Schedule),
        tenant: caller.tenant.clone(),
        version: 1,
        paused,
        spec: serde_json::to_value(&request).map_err(|e| ApiError::Internal(e.to_string()))?,
        next_fire_at: cadence.next_after(now),
        last_operation_id: None,
        buffered_fire_at: None,
        created_at: now,
        updated_at: now,
    };
    app.store.schedule_insert(record.clone()).await?;
    let mut response = schedule_response(&record, StatusCode::CREATED)?;
    let location = format!("/v1/schedules/{}", record.id);
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("ids are header-safe"),
    );
    Ok(response)
}

/// `GET /v1/schedules/{id}`.
#[utoipa::path(get, path = "/v1/schedules/{id}", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)")),
    responses(
        (status = 200, description = "The schedule", body = ScheduleBody, headers(("ETag" = String, description = "The version, quoted"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn read(State(app): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = parse_schedule_id(&id)?;
    let record = app
        .store
        .schedule_get(&caller.tenant, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    schedule_response(&record, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    page_size: Option<u32>,
    page_token: Option<String>,
}

/// `GET /v1/schedules`: the tenant's schedules in id order (creation order to the millisecond), in keyset pages.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", security(("bearer" = [])),
    params(
        ("page_size" = Option<u32>, Query, description = "1–100 (0 or absent: 50)", maximum = 100),
        ("page_token" = Option<String>, Query, description = "next_page_token of the previous page", pattern = "^sch_[0-9a-z]{1,40}$"),
    ),
    responses(
        (status = 200, description = "A page", body = ScheduleList),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list(
    State(app): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<ScheduleList>, ApiError> {
    caller.require_client()?;
    let page_size = page_size(query.page_size)?;
    // A page token is the last id of the previous page: any string of the
    // documented pattern is a position (past the end: an empty page).
    let after = match query.page_token {
        None => None,
        Some(token) => {
            let shaped = token.strip_prefix("sch_").is_some_and(|rest| {
                (1..=40).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
            });
            if !shaped {
                return Err(ApiError::InvalidRequest(
                    "page_token is not one this server gave".into(),
                ));
            }
            Some(Id::from_trusted(token))
        }
    };
    let records = app.store.schedule_list(&caller.tenant, after, page_size).await?;
    let next_page_token = (records.len() as u32 == page_size)
        .then(|| records.last().map(|r| r.id.to_string()))
        .flatten();
    Ok(Json(ScheduleList {
        schedules: records.iter().map(schedules::body).collect::<Result<_, _>>()?,
        next_page_token,
    }))
}

/// `PATCH /v1/schedules/{id}` under `If-Match`: pause, resume, or change
/// the definition (checked as at creation).
#[utoipa::path(patch, path = "/v1/schedules/{id}", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)"), ("If-Match" = String, Header, description = "The ETag the change is based on (required)", pattern = "^(W/)?\"[0-9]{1,18}\"$")),
    request_body = SchedulePatch,
    responses(
        (status = 200, description = "Changed", body = ScheduleBody, headers(("ETag" = String, description = "The version, quoted"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn update(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(patch): JsonBody<SchedulePatch>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let given = if_match(&headers)?.ok_or(ApiError::PreconditionRequired)?;
    let id = parse_schedule_id(&id)?;
    let next = schedules::update(&app, &caller.tenant, &id, given, patch).await?;
    schedule_response(&next, StatusCode::OK)
}

/// `DELETE /v1/schedules/{id}`: no further firing; the operations it
/// started stay.
#[utoipa::path(delete, path = "/v1/schedules/{id}", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn remove(State(app): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    caller.require_client()?;
    let id = parse_schedule_id(&id)?;
    if app.store.schedule_delete(&caller.tenant, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FiresQuery {
    limit: Option<u32>,
}

/// `GET /v1/schedules/{id}/fires`: recent firing times and what each
/// became, newest first.
#[utoipa::path(get, path = "/v1/schedules/{id}/fires", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)"),
        ("limit" = Option<u32>, Query, description = "1–100 (0 or absent: 100)", maximum = 100)),
    responses(
        (status = 200, description = "Its firing records", body = ScheduleFires),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn fires(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<FiresQuery>,
) -> Result<Json<ScheduleFires>, ApiError> {
    caller.require_client()?;
    let id = parse_schedule_id(&id)?;
    let limit = match query.limit {
        None | Some(0) => MAX_FIRES,
        Some(n) if n > MAX_FIRES => {
            return Err(ApiError::InvalidRequest(format!("limit {n} is more than {MAX_FIRES}")));
        }
        Some(n) => n,
    };
    app.store
        .schedule_get(&caller.tenant, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let fires = app.store.schedule_fires(&id, limit).await?;
    Ok(Json(ScheduleFires {
        fires: fires.iter().map(schedules::fire_body).collect(),
    }))
}

/// `POST /v1/schedules/{id}/trigger`: fires it now (whatever its overlap
/// policy); `202` with the operation.
#[utoipa::path(post, path = "/v1/schedules/{id}/trigger", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)")),
    responses(
        (status = 202, description = "The firing's operation", body = longrun_api::OperationBody, headers(("Location" = String), ("ETag" = String, description = "The version, quoted"))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn trigger(State(app): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = parse_schedule_id(&id)?;
    let op = schedules::trigger(&app, &caller.tenant, &id).await?;
    let mut response = operation_response(&app, &op, StatusCode::ACCEPTED).await;
    let location = format!("/v1/operations/{}", op.id);
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("ids are header-safe"),
    );
    Ok(response)
}

/// `POST /v1/schedules/{id}/backfill`: fires the times of `[start, end]`
/// that have no operation yet; `202` with their firing records.
#[utoipa::path(post, path = "/v1/schedules/{id}/backfill", tag = "schedules", security(("bearer" = [])),
    params(("id" = String, Path, description = "The schedule id (sch_…)")),
    request_body = BackfillRequest,
    responses(
        (status = 202, description = "The firings it started (times that had an operation keep it and are left out)", body = ScheduleFires),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn backfill(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<BackfillRequest>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let instant = |name: &str, text: &str| {
        longrun_core::Timestamp::parse_rfc3339(text)
            .ok_or_else(|| ApiError::InvalidRequest(format!("{name} is not an RFC 3339 date-time")))
    };
    let (start, end) = (instant("start", &request.start)?, instant("end", &request.end)?);
    let id = parse_schedule_id(&id)?;
    let fires = schedules::backfill(&app, &caller.tenant, &id, start, end).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(ScheduleFires {
            fires: fires.iter().map(schedules::fire_body).collect(),
        }),
    )
        .into_response())
}
