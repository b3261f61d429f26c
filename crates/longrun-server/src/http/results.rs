//! Results as artifacts (docs/api.md §3 "Results", §4 upload).
//!
//! - `PUT /v1/worker/tasks/{id}/artifact` (worker, `Lease-Token` header):
//!   the body is streamed into the artifact store — never held whole in
//!   memory — size-limited and hashed on the way; `complete` publishes it.
//!   `PUT /v1/worker/tasks/{id}/artifacts/{name}` does the same for a named
//!   artifact (`result.artifacts.{name}`).
//! - `GET /v1/worker/tasks/{id}/uploads/{upload_id}` (worker, `Lease-Token`):
//!   the bytes of an upload the operation's input names.
//! - `GET /v1/operations/{id}/result`: the result resource with a download
//!   link minted for this request (HMAC-signed, short-lived, never stored).
//! - `GET /v1/results/{res_id}/content?expires=…&kid=…&signature=…`: the
//!   bytes, streamed, with `Range` support. The link is the authorisation:
//!   no API key, and it opens that one artifact only.

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures_util::TryStreamExt;
use longrun_api::{ArtifactUploadBody, JoinRequest, PieceStoredBody, ResultBody};
use longrun_core::{Id, IdKind, links};
use longrun_engine::bytes::BytesError;
use longrun_engine::bytes::artifacts::ArtifactError;
use longrun_engine::bytes::results::{TaskArtifact, store_upload};
use longrun_store::{DEFAULT_ARTIFACT, ResultRecord, StoreError};
use serde::Deserialize;

use crate::app::ApiError;
use crate::app::AppState;
use crate::app::reads::result_links;
use crate::http::auth::Caller;
use crate::http::error::Problem;
use crate::http::extract::QueryParams;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/worker/tasks/{id}/artifact",
            put(upload).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/worker/tasks/{id}/artifacts/{name}",
            put(upload_named).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/worker/tasks/{id}/artifacts/{name}/pieces/{offset}",
            put(upload_piece).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/worker/tasks/{id}/artifacts/{name}/join", post(join_pieces))
        .route("/v1/worker/tasks/{id}/uploads/{upload_id}", get(read_upload))
        .route("/v1/operations/{id}/result", get(result))
        .route("/v1/results/{id}/content", get(content))
}

#[utoipa::path(put, path = "/v1/worker/tasks/{id}/artifact", tag = "workers", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"), ("Lease-Token" = String, Header, description = "The task's lease token", pattern = "^[\\x21-\\x7e]+$")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The artifact, streamed; its Content-Type is kept"),
    responses((status = 201, description = "Stored; `complete` publishes it", body = ArtifactUploadBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn upload(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    store_artifact(app, caller, id, DEFAULT_ARTIFACT, headers, request).await
}

#[utoipa::path(put, path = "/v1/worker/tasks/{id}/artifacts/{name}", tag = "workers", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
        ("name" = String, Path, description = "The artifact's name (`result.artifacts.{name}`)", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
        ("Lease-Token" = String, Header, description = "The task's lease token", pattern = "^[\\x21-\\x7e]+$")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The artifact, streamed; its Content-Type is kept"),
    responses((status = 201, description = "Stored; `complete` (or the worker's `fail`) publishes it", body = ArtifactUploadBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn upload_named(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    check_artifact_name(&name)?;
    store_artifact(app, caller, id, &name, headers, request).await
}

fn check_artifact_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if !valid {
        return Err(ApiError::InvalidRequest(
            "an artifact name is 1 to 64 of a-z, 0-9, _ and -, starting with a letter or digit".into(),
        ));
    }
    Ok(())
}

#[utoipa::path(put, path = "/v1/worker/tasks/{id}/artifacts/{name}/pieces/{offset}", tag = "workers", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
        ("name" = String, Path, description = "The artifact's name (`default` for `result.artifact`)", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
        ("offset" = u64, Path, description = "Where the piece starts: where the stored pieces before it end"),
        ("Lease-Token" = String, Header, description = "The task's lease token", pattern = "^[\\x21-\\x7e]+$")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The piece, streamed"),
    responses((status = 200, description = "Stored; pieces at or past `offset` from earlier attempts were replaced. Pieces outlive attempts and pauses; `…/join` makes them the artifact. `409 upload_offset_mismatch` (with `Upload-Offset`) when the stored pieces do not end at `offset`", body = PieceStoredBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn upload_piece(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, name, offset)): Path<(String, String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    check_artifact_name(&name)?;
    let (id, lease_token) = worker_task(&caller, &id, &headers)?;
    let offset: u64 = offset
        .parse()
        .map_err(|_| ApiError::InvalidRequest("the offset must be a whole number of bytes".into()))?;
    let stream = request.into_body().into_data_stream().map_err(std::io::Error::other);
    let body = Box::pin(tokio_util::io::StreamReader::new(stream));
    let end = longrun_engine::bytes::results::store_artifact_piece(
        app.store.as_ref(),
        app.artifacts.as_ref(),
        TaskArtifact {
            operation_id: &id,
            lease_token: &lease_token,
            name: &name,
            content_type: "",
        },
        offset,
        body,
        app.config.max_artifact_bytes,
        app.clock.now(),
    )
    .await
    .map_err(task_error(&id))?;
    Ok(Json(PieceStoredBody { upload_offset: end }).into_response())
}

#[utoipa::path(post, path = "/v1/worker/tasks/{id}/artifacts/{name}/join", tag = "workers", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
        ("name" = String, Path, description = "The artifact's name (`default` for `result.artifact`)", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = JoinRequest,
    responses((status = 201, description = "The pieces joined into the artifact; `complete` (or the worker's `fail`) publishes it. `409 upload_offset_mismatch` (with `Upload-Offset`) when the pieces do not hold `size_bytes`", body = ArtifactUploadBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn join_pieces(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, name)): Path<(String, String)>,
    crate::http::extract::JsonBody(request): crate::http::extract::JsonBody<JoinRequest>,
) -> Result<Response, ApiError> {
    check_artifact_name(&name)?;
    if caller.role == longrun_core::apikey::Role::Client {
        return Err(ApiError::Forbidden);
    }
    let id = Id::parse(IdKind::Operation, &id)
        .ok_or_else(|| ApiError::InvalidRequest("the path must name an operation id (op_…)".into()))?;
    let content_type = request
        .content_type
        .unwrap_or_else(|| "application/octet-stream".into());
    if content_type.is_empty() || content_type.len() > 255 || !content_type.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(ApiError::InvalidRequest(
            "content_type must be 1–255 visible ASCII characters".into(),
        ));
    }
    let joined = longrun_engine::bytes::results::join_artifact_pieces(
        app.store.as_ref(),
        app.artifacts.as_ref(),
        TaskArtifact {
            operation_id: &id,
            lease_token: &request.lease_token,
            name: &name,
            content_type: &content_type,
        },
        request.size_bytes,
        app.clock.now(),
    )
    .await
    .map_err(task_error(&id))?;
    let body = ArtifactUploadBody {
        id: joined.id,
        content_type,
        size_bytes: joined.size_bytes,
        sha256: joined.sha256,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// What a refused worker artifact call answers: a stale lease, an
/// artifact past its bound, or the store's own refusal.
fn task_error(id: &Id) -> impl FnOnce(BytesError) -> ApiError + '_ {
    move |e| match e {
        BytesError::Store(StoreError::LeaseLost) => ApiError::LeaseLost {
            operation_id: id.clone(),
        },
        BytesError::Store(StoreError::TooLarge { max_bytes })
        | BytesError::Objects(ArtifactError::TooLarge { max_bytes }) => too_large(max_bytes),
        BytesError::Store(other) => other.into(),
        BytesError::Objects(ArtifactError::NotFound) => ApiError::NotFound,
        BytesError::Objects(other) => ApiError::Internal(other.to_string()),
    }
}

fn worker_task(caller: &Caller, id: &str, headers: &HeaderMap) -> Result<(Id, String), ApiError> {
    if caller.role == longrun_core::apikey::Role::Client {
        return Err(ApiError::Forbidden);
    }
    let id = Id::parse(IdKind::Operation, id)
        .ok_or_else(|| ApiError::InvalidRequest("the path must name an operation id (op_…)".into()))?;
    let lease_token = headers
        .get("lease-token")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::InvalidRequest("the Lease-Token header is required".into()))?
        .to_owned();
    Ok((id, lease_token))
}

async fn store_artifact(
    app: AppState,
    caller: Caller,
    id: String,
    name: &str,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (id, lease_token) = worker_task(&caller, &id, &headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    if content_type.len() > 255 {
        return Err(ApiError::InvalidRequest("Content-Type is too long".into()));
    }
    if let Some(length) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > app.config.max_artifact_bytes
    {
        return Err(too_large(app.config.max_artifact_bytes));
    }
    let stream = request.into_body().into_data_stream().map_err(std::io::Error::other);
    let body = Box::pin(tokio_util::io::StreamReader::new(stream));
    let uploaded = store_upload(
        app.store.as_ref(),
        app.artifacts.as_ref(),
        TaskArtifact {
            operation_id: &id,
            lease_token: &lease_token,
            name,
            content_type: &content_type,
        },
        body,
        app.config.max_artifact_bytes,
        app.clock.now(),
    )
    .await
    .map_err(task_error(&id))?;
    let body = ArtifactUploadBody {
        id: uploaded.id,
        content_type,
        size_bytes: uploaded.size_bytes,
        sha256: uploaded.sha256,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[utoipa::path(get, path = "/v1/worker/tasks/{id}/uploads/{upload_id}", tag = "workers", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"),
        ("upload_id" = String, Path, description = "An upload the operation's input names (upl_…)"),
        ("Lease-Token" = String, Header, description = "The task's lease token", pattern = "^[\\x21-\\x7e]+$")),
    responses((status = 200, description = "The upload's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn read_upload(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, upload_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (id, lease_token) = worker_task(&caller, &id, &headers)?;
    let upload_id = Id::parse(IdKind::Upload, &upload_id).ok_or(ApiError::NotFound)?;
    let reader = longrun_engine::bytes::uploads::open_for_task(
        app.store.as_ref(),
        app.artifacts.as_ref(),
        &id,
        &lease_token,
        &upload_id,
    )
    .await
    .map_err(task_error(&id))?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024));
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

fn too_large(max: u64) -> ApiError {
    ApiError::PayloadTooLarge(format!("artifacts are limited to {max} bytes"))
}

#[utoipa::path(get, path = "/v1/operations/{id}/result", tag = "results", security(("bearer" = [])), params(("id" = String, Path, description = "The operation id (op_…)")),
    responses((status = 200, description = "The result artifact and a short-lived download link", body = ResultBody), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn result(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ResultBody>, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Operation, &id).ok_or(ApiError::NotFound)?;
    Ok(Json(result_links(&app, &caller.tenant, id).await?))
}

/// Refusals of a download link: tampered or expired links are `403
/// forbidden` (the detail says which); a result past its lifetime is `410
/// result_expired`.
#[utoipa::path(get, path = "/v1/results/{id}/content", tag = "results",
    params(("id" = String, Path, description = "The result id (res_…)"),
        ("expires" = i64, Query), ("kid" = String, Query), ("signature" = String, Query),
        ("Range" = Option<String>, Header, description = "One byte range")),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>,
         headers(("Content-Disposition" = String), ("ETag" = String), ("Accept-Ranges" = String))),
        (status = 206, description = "The requested range", content_type = "application/octet-stream", body = Vec<u8>,
         headers(("Content-Range" = String))),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn content(
    State(app): State<AppState>,
    Path(id): Path<String>,
    QueryParams(link): QueryParams<LinkQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let refused = |why: &str| ApiError::LinkRefused(why.to_owned());
    let result_id = Id::parse(IdKind::Result, &id).ok_or_else(|| refused("the link's signature does not match"))?;
    let key = app
        .link_key(&link.kid)
        .await?
        .ok_or_else(|| refused("the link's signature does not match"))?;
    let now_secs = app.clock.now().as_millis() / 1000;
    links::verify(&key, result_id.as_str(), link.expires, &link.signature, now_secs)
        .map_err(|e| refused(&e.to_string()))?;
    let record = app.store.result_get(&result_id).await?.ok_or(ApiError::Gone)?;
    // A result never expires after its operation (the store caps it), so its
    // own expiry decides; no read of the operation on the download path.
    if record.is_expired(app.clock.now()) {
        return Err(ApiError::ResultExpired {
            operation_id: record.operation_id,
        });
    }
    if record.state != "published" {
        return Err(refused("the link's signature does not match"));
    }
    serve(&app, &record, &headers).await
}

/// The artifact's bytes: whole (`200`) or one range (`206`); an
/// unsatisfiable range is `416`.
async fn serve(app: &AppState, record: &ResultRecord, headers: &HeaderMap) -> Result<Response, ApiError> {
    let size = u64::try_from(record.size_bytes).unwrap_or(0);
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => None,
        Some(spec) => match parse_range(spec, size) {
            RangeSpec::One(start, end) => Some((start, end)),
            // Several ranges, or a unit we do not know: the whole body.
            RangeSpec::Ignore => None,
            RangeSpec::Unsatisfiable => {
                let mut response = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
                let value = HeaderValue::from_str(&format!("bytes */{size}")).expect("a valid header");
                response.headers_mut().insert(header::CONTENT_RANGE, value);
                let mut problem =
                    ApiError::InvalidRequest(format!("the range is outside the {size} bytes of the result")).problem();
                problem.status = StatusCode::RANGE_NOT_SATISFIABLE.as_u16();
                response.extensions_mut().insert(problem);
                return Ok(response);
            }
        },
    };
    let (start, end) = range.unwrap_or((0, size.saturating_sub(1)));
    let length = if size == 0 { 0 } else { end - start + 1 };
    let reader = app
        .artifacts
        .open(&record.storage_key, start, length)
        .await
        .map_err(|e| match e {
            ArtifactError::NotFound => ApiError::ResultExpired {
                operation_id: record.operation_id.clone(),
            },
            other => ApiError::Internal(other.to_string()),
        })?;
    // Large chunks: the default 4 KiB ones cap a download at a few dozen MiB/s.
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024));
    let status = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    let value = |s: String| HeaderValue::from_str(&s).expect("a valid header");
    h.insert(header::CONTENT_TYPE, value(record.content_type.clone()));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::ETAG, value(format!("\"{}\"", record.sha256)));
    let extension = match record.content_type.split(';').next().unwrap_or("") {
        "text/csv" => "csv",
        "application/jsonl" | "application/x-ndjson" => "jsonl",
        "application/json" => "json",
        _ => "bin",
    };
    h.insert(
        header::CONTENT_DISPOSITION,
        value(format!("attachment; filename=\"{}.{extension}\"", record.operation_id)),
    );
    if range.is_some() {
        h.insert(header::CONTENT_RANGE, value(format!("bytes {start}-{end}/{size}")));
    }
    Ok(response)
}

#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    One(u64, u64),
    Ignore,
    Unsatisfiable,
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` (RFC 9110 §14.1.2), one range only.
fn parse_range(spec: &str, size: u64) -> RangeSpec {
    let Some(ranges) = spec.trim().strip_prefix("bytes=") else {
        return RangeSpec::Ignore;
    };
    if ranges.contains(',') {
        return RangeSpec::Ignore;
    }
    let Some((first, last)) = ranges.trim().split_once('-') else {
        return RangeSpec::Ignore;
    };
    let (first, last) = (first.trim(), last.trim());
    let parsed = match (first.is_empty(), last.is_empty()) {
        (true, false) => last
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| (size.saturating_sub(n), size.saturating_sub(1))),
        (false, true) => first.parse::<u64>().ok().map(|a| (a, size.saturating_sub(1))),
        (false, false) => match (first.parse::<u64>(), last.parse::<u64>()) {
            (Ok(a), Ok(b)) if a <= b => Some((a, b.min(size.saturating_sub(1)))),
            _ => return RangeSpec::Ignore,
        },
        (true, true) => return RangeSpec::Ignore,
    };
    match parsed {
        Some((a, b)) if size > 0 && a < size && a <= b => RangeSpec::One(a, b),
        _ => RangeSpec::Unsatisfiable,
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct LinkQuery {
    expires: i64,
    kid: String,
    signature: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeSpec::One(0, 9));
        assert_eq!(parse_range("bytes=90-", 100), RangeSpec::One(90, 99));
        assert_eq!(parse_range("bytes=-10", 100), RangeSpec::One(90, 99));
        assert_eq!(parse_range("bytes=50-500", 100), RangeSpec::One(50, 99));
        assert_eq!(parse_range("bytes=100-", 100), RangeSpec::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), RangeSpec::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeSpec::Ignore);
        assert_eq!(parse_range("items=0-1", 100), RangeSpec::Ignore);
        assert_eq!(parse_range("bytes=9-3", 100), RangeSpec::Ignore);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any Range value and size: one range inside the body, the whole
        /// body, or unsatisfiable; never a panic or a range past the end.
        #[test]
        fn any_range_is_inside_the_body_or_not_served_as_one(raw in any::<String>(), a in any::<u64>(), b in any::<u64>(), size in 0u64..1 << 40) {
            for spec in [raw, format!("bytes={a}-{b}"), format!("bytes=-{a}"), format!("bytes={a}-")] {
                if let RangeSpec::One(first, last) = parse_range(&spec, size) {
                    prop_assert!(first <= last && last < size, "{spec} of {size}: {first}-{last}");
                }
            }
        }
    }
}
