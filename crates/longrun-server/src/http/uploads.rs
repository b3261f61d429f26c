//! Uploads: inputs streamed before a submission names them (docs/api.md §9
//! "Uploads and artifacts"), resumable as the IETF resumable-uploads draft
//! describes.
//!
//! - `POST /v1/uploads` creates an upload and streams its body into it.
//!   `Upload-Complete: ?1` (or no such header) says the body is all of it;
//!   `?0` says more follows. The answer is `201` with `Location`,
//!   `Upload-Offset` and `Upload-Complete`. A client that wants to survive a
//!   cut connection sends an empty `POST` with `Upload-Complete: ?0` first,
//!   so it knows the upload's URL before it sends any bytes.
//! - `HEAD /v1/uploads/{id}` answers `Upload-Offset`: the bytes kept so far.
//!   A body cut mid-way keeps what arrived.
//! - `PATCH /v1/uploads/{id}` with `Upload-Offset` (which must be the
//!   current offset, else `409 upload_offset_mismatch` with the right one)
//!   and `Upload-Complete` appends.
//! - `GET /v1/uploads/{id}`: the representation (JSON).
//!
//! A body cut short is stored and appended only once the server has read
//! to the cut (and, on the file system, flushed it): a `HEAD` or `PATCH`
//! that arrives meanwhile waits for that append (up to [`SETTLE_WAIT`]), as
//! the draft asks, so it learns the offset that includes it instead of
//! resending bytes that are about to be kept. The request appending holds
//! the right to append in the store (`Store::upload_append_lease`, renewed
//! while its body streams), so the wait holds across nodes: a client that
//! resumes through another node behind a balancer gets the same offset.
//!
//! `Content-Digest: sha-256=:…:` checks one request's bytes (a mismatch
//! keeps none of them); `Repr-Digest` declares the whole upload's digest,
//! checked when it completes (a mismatch removes the upload). Both are
//! `400 digest_mismatch`. Other tenants' ids are `404`.

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::TryStreamExt;
use longrun_api::UploadBody;
use longrun_core::{Id, IdKind, Timestamp};
use longrun_engine::bytes::artifacts::ArtifactError;
use longrun_engine::bytes::uploads::{self, Piece};
use longrun_store::{
    AppendLease, AppendLeaseParams, UploadAppendParams, UploadCompleteParams, UploadCreateParams, UploadRecord,
};
use std::sync::Arc;

use crate::app::ApiError;
use crate::app::AppState;
use crate::http::auth::Caller;
use crate::http::error::Problem;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/uploads", post(create).layer(DefaultBodyLimit::disable()))
        .route(
            "/v1/uploads/{upload_id}",
            axum::routing::get(show)
                .head(offset)
                .patch(append)
                .layer(DefaultBodyLimit::disable()),
        )
}

/// An upload as clients see it.
pub fn upload_body(u: &UploadRecord) -> UploadBody {
    UploadBody {
        id: u.id.to_string(),
        size_bytes: u.offset,
        complete: u.complete,
        sha256: u.sha256.clone(),
        content_type: u.content_type.clone(),
        created_at: u.created_at.to_rfc3339(),
        expires_at: u.expires_at.to_rfc3339(),
    }
}

/// Longest a `HEAD` or `PATCH` waits for an append in flight.
pub const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long an append holds the right to append before renewing it (every
/// third of it, while its body streams): what a node that dies mid-append
/// keeps others waiting at most.
const APPEND_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// How often a request waiting for another's append looks again.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// The right to append to one upload, held by this request in the store
/// (so on every node): renewed in the background while held, given back by
/// [`AppendHold::release`] (or, if the request is dropped, when this is).
struct AppendHold {
    renewing: tokio::task::JoinHandle<()>,
    release: Option<(Arc<dyn longrun_store::Store>, Id, String)>,
}

impl AppendHold {
    /// Takes the right to append to the tenant's upload `id`, waiting (up to
    /// [`SETTLE_WAIT`]) while another request on any node holds it; `None`
    /// if it is still held then (the store's offset compare still refuses
    /// a stale append).
    async fn take(app: &AppState, tenant: &str, id: &Id) -> Result<Option<Self>, ApiError> {
        let token = longrun_core::id::random_base32::<16>();
        let lease = |now: Timestamp| AppendLeaseParams {
            tenant: tenant.to_owned(),
            id: id.clone(),
            token: token.clone(),
            until: now.plus(APPEND_LEASE),
            now,
        };
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            match app.store.upload_append_lease(lease(app.clock.now())).await? {
                AppendLease::Held => break,
                AppendLease::Busy { .. } if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(SETTLE_POLL).await;
                }
                AppendLease::Busy { .. } => return Ok(None),
            }
        }
        let (store, clock) = (app.store.clone(), app.clock.clone());
        let renew = lease(clock.now());
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(APPEND_LEASE / 3).await;
                let now = clock.now();
                let renewed = AppendLeaseParams {
                    until: now.plus(APPEND_LEASE),
                    now,
                    ..renew.clone()
                };
                if !matches!(store.upload_append_lease(renewed).await, Ok(AppendLease::Held)) {
                    return;
                }
            }
        });
        Ok(Some(Self {
            renewing,
            release: Some((app.store.clone(), id.clone(), token)),
        }))
    }

    /// Gives the right back before the answer goes out, so that the
    /// client's next request finds it free.
    async fn release(mut self) {
        self.renewing.abort();
        if let Some((store, id, token)) = self.release.take() {
            let _ = store.upload_append_release(&id, &token).await;
        }
    }
}

impl Drop for AppendHold {
    fn drop(&mut self) {
        self.renewing.abort();
        if let Some((store, id, token)) = self.release.take() {
            tokio::spawn(async move {
                let _ = store.upload_append_release(&id, &token).await;
            });
        }
    }
}

/// Waits (up to [`SETTLE_WAIT`]) while a request on any node appends to the
/// tenant's upload `id`, so that an offset read next includes what it keeps.
async fn settle(app: &AppState, tenant: &str, id: &Id) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    while tokio::time::Instant::now() < deadline
        && app.store.upload_appending(tenant, id, app.clock.now()).await?.is_some()
    {
        tokio::time::sleep(SETTLE_POLL).await;
    }
    Ok(())
}

/// The upload headers of the resumable-uploads draft, and `Location`.
fn upload_response(status: StatusCode, upload: &UploadRecord) -> Response {
    let mut response = (status, Json(upload_body(upload))).into_response();
    let h = response.headers_mut();
    h.insert("upload-offset", HeaderValue::from(upload.offset));
    h.insert(
        "upload-complete",
        HeaderValue::from_static(if upload.complete { "?1" } else { "?0" }),
    );
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/v1/uploads/{}", upload.id)).expect("ids are header-safe"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `Upload-Complete` as a structured-field boolean; `None` when absent.
fn upload_complete(headers: &HeaderMap) -> Result<Option<bool>, ApiError> {
    match headers.get("upload-complete").map(HeaderValue::as_bytes) {
        None => Ok(None),
        Some(b"?1") => Ok(Some(true)),
        Some(b"?0") => Ok(Some(false)),
        Some(_) => Err(ApiError::InvalidRequest("Upload-Complete must be ?0 or ?1".into())),
    }
}

/// The sha-256 member of a `Content-Digest` or `Repr-Digest` header (RFC
/// 9530), as lowercase hex; `None` when absent or naming only other algorithms.
fn digest(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let bad = || ApiError::InvalidRequest(format!("{name} must be a dictionary like sha-256=:<base64>:"));
    let text = value.to_str().map_err(|_| bad())?;
    let mut sha256 = None;
    // Every member is `algorithm=:base64:`; only sha-256 is read.
    for member in text.split(',') {
        let (algorithm, encoded) = member.trim().split_once('=').ok_or_else(bad)?;
        let encoded = encoded
            .strip_prefix(':')
            .and_then(|e| e.strip_suffix(':'))
            .filter(|e| {
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
            })
            .ok_or_else(bad)?;
        let algorithm_ok = algorithm.starts_with(|c: char| c.is_ascii_lowercase())
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !algorithm_ok {
            return Err(bad());
        }
        if algorithm == "sha-256" {
            let bytes = data_encoding::BASE64.decode(encoded.as_bytes()).map_err(|_| bad())?;
            if bytes.len() != 32 {
                return Err(bad());
            }
            sha256 = Some(data_encoding::HEXLOWER.encode(&bytes));
        }
    }
    Ok(sha256)
}

fn content_type(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::InvalidRequest("Content-Type must be ASCII".into()))
        })
        .transpose()?
        .unwrap_or("application/octet-stream");
    if value.len() > 255 {
        return Err(ApiError::InvalidRequest("Content-Type is too long".into()));
    }
    Ok(value.to_owned())
}

fn too_large(max: u64) -> ApiError {
    ApiError::PayloadTooLarge(format!("uploads are limited to {max} bytes"))
}

/// Refuses a body whose declared length would pass the limit before reading it.
fn check_length(app: &AppState, headers: &HeaderMap, offset: i64) -> Result<u64, ApiError> {
    let max = app.config.max_upload_bytes;
    let room = max.saturating_sub(u64::try_from(offset).unwrap_or(u64::MAX));
    if let Some(length) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > room
    {
        return Err(too_large(max));
    }
    Ok(room)
}

fn body_reader(request: Request) -> longrun_engine::bytes::artifacts::ByteReader {
    let stream = request.into_body().into_data_stream().map_err(std::io::Error::other);
    Box::pin(tokio_util::io::StreamReader::new(stream))
}

fn artifact_error(e: ArtifactError) -> ApiError {
    match e {
        ArtifactError::TooLarge { max_bytes } => too_large(max_bytes),
        other => ApiError::Internal(other.to_string()),
    }
}

#[utoipa::path(post, path = "/v1/uploads", tag = "uploads", security(("bearer" = [])),
    params(
        ("Upload-Complete" = Option<String>, Header, description = "`?1` (the default): the body is the whole upload; `?0`: more follows with PATCH", pattern = "^\\?[01]$"),
        ("Content-Digest" = Option<String>, Header, description = "`sha-256=:<base64>:` of this request's body (a dictionary; members of other algorithms are ignored)", pattern = "^[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:( *, *[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:)*$"),
        ("Repr-Digest" = Option<String>, Header, description = "`sha-256=:<base64>:` of the whole upload, checked when it completes", pattern = "^[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:( *, *[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:)*$"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The bytes, streamed; the Content-Type is kept"),
    responses((status = 201, description = "The upload, with `Location`, `Upload-Offset` and `Upload-Complete`", body = UploadBody),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn create(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let complete = upload_complete(&headers)?.unwrap_or(true);
    let (request_digest, whole_digest) = (digest(&headers, "content-digest")?, digest(&headers, "repr-digest")?);
    let content_type = content_type(&headers)?;
    let room = check_length(&app, &headers, 0)?;
    let now = app.clock.now();
    let created = app
        .store
        .upload_create(UploadCreateParams {
            id: Id::generate(IdKind::Upload),
            tenant: caller.tenant.clone(),
            content_type,
            expected_sha256: whole_digest,
            now,
            expires_at: now.plus(app.config.upload_retention),
        })
        .await?;
    let hold = AppendHold::take(&app, &caller.tenant, &created.id).await?;
    let written = receive(&app, &caller, &created, request, room, complete, request_digest).await;
    if let Some(hold) = hold {
        hold.release().await;
    }
    if written.is_err() && complete {
        // A whole upload that failed leaves nothing behind to resume.
        let _ = app.store.upload_remove(&caller.tenant, &created.id, now).await;
    }
    Ok(upload_response(StatusCode::CREATED, &written?))
}

#[utoipa::path(patch, path = "/v1/uploads/{upload_id}", tag = "uploads", security(("bearer" = [])),
    params(("upload_id" = String, Path, description = "The upload id (upl_…)"),
        ("Upload-Offset" = i64, Header, description = "Where this body starts: the upload's current offset", minimum = 0),
        ("Upload-Complete" = String, Header, description = "`?1`: this body ends the upload; `?0`: more follows", pattern = "^\\?[01]$"),
        ("Content-Digest" = Option<String>, Header, description = "`sha-256=:<base64>:` of this request's body (a dictionary; members of other algorithms are ignored)", pattern = "^[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:( *, *[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:)*$"),
        ("Repr-Digest" = Option<String>, Header, description = "`sha-256=:<base64>:` of the whole upload, checked when it completes", pattern = "^[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:( *, *[a-z][a-z0-9-]*=:[A-Za-z0-9+/=]*:)*$")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The next bytes, streamed (the draft's `application/partial-upload` is accepted too, as is any type)"),
    responses((status = 200, description = "The upload after the append", body = UploadBody),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`; `upload_offset_mismatch` carries the current `Upload-Offset`", body = Problem, content_type = "application/problem+json")))]
async fn append(
    State(app): State<AppState>,
    caller: Caller,
    Path(upload_id): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Upload, &upload_id).ok_or(ApiError::NotFound)?;
    let at: i64 = headers
        .get("upload-offset")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .filter(|o: &i64| *o >= 0)
        .ok_or_else(|| ApiError::InvalidRequest("Upload-Offset must be a non-negative integer".into()))?;
    let complete = upload_complete(&headers)?
        .ok_or_else(|| ApiError::InvalidRequest("Upload-Complete (?0 or ?1) is required".into()))?;
    let request_digest = digest(&headers, "content-digest")?;
    let whole_digest = digest(&headers, "repr-digest")?;
    // Another tenant's id is a 404 at once (the store refuses the right to
    // append to it), never a wait on its appends.
    let hold = AppendHold::take(&app, &caller.tenant, &id).await?;
    let written = append_held(
        &app,
        &caller,
        &id,
        at,
        &headers,
        whole_digest,
        request,
        complete,
        request_digest,
    )
    .await;
    if let Some(hold) = hold {
        hold.release().await;
    }
    Ok(upload_response(StatusCode::OK, &written?))
}

/// [`append`], holding the right to append.
#[allow(clippy::too_many_arguments)]
async fn append_held(
    app: &AppState,
    caller: &Caller,
    id: &Id,
    at: i64,
    headers: &HeaderMap,
    whole_digest: Option<String>,
    request: Request,
    complete: bool,
    request_digest: Option<String>,
) -> Result<UploadRecord, ApiError> {
    let mut upload = app
        .store
        .upload_get(&caller.tenant, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    // Refused before a byte of the body is read.
    if upload.complete || upload.offset != at {
        return Err(ApiError::UploadOffsetMismatch {
            offset: upload.offset,
            complete: upload.complete,
        });
    }
    let room = check_length(app, headers, at)?;
    if upload.expected_sha256.is_none() {
        upload.expected_sha256 = whole_digest;
    }
    receive(app, caller, &upload, request, room, complete, request_digest).await
}

/// Stores the body as the upload's next piece, appends it at the upload's
/// offset, and completes the upload when asked and the body was whole.
async fn receive(
    app: &AppState,
    caller: &Caller,
    upload: &UploadRecord,
    request: Request,
    room: u64,
    complete: bool,
    request_digest: Option<String>,
) -> Result<UploadRecord, ApiError> {
    let artifacts = app.artifacts.as_ref();
    let piece = uploads::store_piece(artifacts, &upload.id, upload.offset, body_reader(request), room)
        .await
        .map_err(artifact_error)?;
    let forget = |piece: &Piece| {
        let key = piece.chunk.storage_key.clone();
        async move {
            let _ = artifacts.delete(&key).await;
        }
    };
    if let Some(expected) = &request_digest
        && (piece.cut || *expected != piece.sha256)
    {
        forget(&piece).await;
        return Err(ApiError::DigestMismatch(
            "the body's SHA-256 is not the one Content-Digest names; none of it was kept".into(),
        ));
    }
    let whole = complete && !piece.cut && upload.offset == 0;
    if whole
        && let Some(expected) = &upload.expected_sha256
        && *expected != piece.sha256
    {
        forget(&piece).await;
        let _ = app
            .store
            .upload_remove(&caller.tenant, &upload.id, app.clock.now())
            .await;
        return Err(digest_mismatch_of_whole());
    }
    let appended = app
        .store
        .upload_append(UploadAppendParams {
            tenant: caller.tenant.clone(),
            id: upload.id.clone(),
            offset: upload.offset,
            chunk: piece.chunk.clone(),
            sha256: whole.then(|| piece.sha256.clone()),
            expected_sha256: upload.expected_sha256.clone(),
            now: app.clock.now(),
        })
        .await;
    let appended = match appended {
        Ok(appended) => appended,
        Err(e) => {
            // Another request appended first (or the upload is gone): this
            // piece is no one's.
            forget(&piece).await;
            return Err(e.into());
        }
    };
    if piece.chunk.size_bytes == 0 && !whole {
        forget(&piece).await;
    }
    if !complete || piece.cut || appended.complete {
        return Ok(appended);
    }
    finish(app, caller, appended).await
}

fn digest_mismatch_of_whole() -> ApiError {
    ApiError::DigestMismatch("the upload's SHA-256 is not the one Repr-Digest named; the upload was removed".into())
}

/// Joins the pieces of an upload that received its last byte into one
/// object and completes it.
async fn finish(app: &AppState, caller: &Caller, upload: UploadRecord) -> Result<UploadRecord, ApiError> {
    let (object, sha256) = uploads::join(app.artifacts.as_ref(), &upload)
        .await
        .map_err(artifact_error)?;
    let now = app.clock.now();
    if let Some(expected) = &upload.expected_sha256
        && *expected != sha256
    {
        if !upload.chunks.contains(&object) {
            let _ = app.artifacts.delete(&object.storage_key).await;
        }
        let _ = app.store.upload_remove(&caller.tenant, &upload.id, now).await;
        return Err(digest_mismatch_of_whole());
    }
    let completed = app
        .store
        .upload_complete(UploadCompleteParams {
            tenant: caller.tenant.clone(),
            id: upload.id.clone(),
            size_bytes: upload.offset,
            object: object.clone(),
            sha256,
            now,
        })
        .await;
    if completed.is_err() && !upload.chunks.contains(&object) {
        let _ = app.artifacts.delete(&object.storage_key).await;
    }
    Ok(completed?)
}

#[utoipa::path(head, path = "/v1/uploads/{upload_id}", tag = "uploads", security(("bearer" = [])),
    params(("upload_id" = String, Path, description = "The upload id (upl_…)")),
    responses((status = 204, description = "`Upload-Offset`: the bytes kept so far; `Upload-Complete`",
        headers(("Upload-Offset" = i64), ("Upload-Complete" = String))),
        (status = "default", description = "A refusal (401, 403, 404 for an unknown or foreign id …); HEAD answers have no body")))]
async fn offset(
    State(app): State<AppState>,
    caller: Caller,
    Path(upload_id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Upload, &upload_id).ok_or(ApiError::NotFound)?;
    // An unknown or foreign id has no append to wait for: a 404 at once.
    settle(&app, &caller.tenant, &id).await?;
    let upload = find(&app, &caller, &upload_id).await?;
    let mut response = upload_response(StatusCode::NO_CONTENT, &upload);
    *response.body_mut() = axum::body::Body::empty();
    response.headers_mut().remove(header::CONTENT_TYPE);
    Ok(response)
}

#[utoipa::path(get, path = "/v1/uploads/{upload_id}", tag = "uploads", security(("bearer" = [])),
    params(("upload_id" = String, Path, description = "The upload id (upl_…)")),
    responses((status = 200, description = "The upload", body = UploadBody),
        (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn show(
    State(app): State<AppState>,
    caller: Caller,
    Path(upload_id): Path<String>,
) -> Result<Response, ApiError> {
    let upload = find(&app, &caller, &upload_id).await?;
    Ok(upload_response(StatusCode::OK, &upload))
}

/// The tenant's upload: unknown, malformed, foreign and removed ids are the
/// same `404`.
async fn find(app: &AppState, caller: &Caller, id: &str) -> Result<UploadRecord, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Upload, id).ok_or(ApiError::NotFound)?;
    app.store
        .upload_get(&caller.tenant, &id)
        .await?
        .ok_or(ApiError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_from_structured_fields() {
        let mut headers = HeaderMap::new();
        // sha-256 of "hello world".
        headers.insert(
            "content-digest",
            HeaderValue::from_static("sha-512=:AAAA:, sha-256=:uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=:"),
        );
        assert_eq!(
            digest(&headers, "content-digest").unwrap().as_deref(),
            Some("b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9")
        );
        assert_eq!(digest(&headers, "repr-digest").unwrap(), None);
        for bad in ["sha-256=abc", "sha-256=:AAAA:", "nonsense", "x=y", "", "Sha=:AA==:"] {
            headers.insert("repr-digest", HeaderValue::from_static(bad));
            assert!(digest(&headers, "repr-digest").is_err(), "{bad}");
        }
    }
}
