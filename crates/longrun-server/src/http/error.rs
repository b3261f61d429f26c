//! One error type for the HTTP edge, one variant per stable `code` of
//! docs/api.md §6, rendered as RFC 9457 problem+json in one place.
//!
//! Handlers return [`ApiError`]; its response carries the problem as an
//! extension and the [`edge`](crate::http::edge) middleware writes the body,
//! adding the request id. Responses that did not come from an `ApiError`
//! (a panic caught, anything from a layer) are turned into problems there too,
//! so a client never sees plain text.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use longrun_api::Problem;
use longrun_core::Id;
use longrun_store::StoreError;

/// Every refusal of the HTTP edge, one variant per stable problem `code`
/// (docs/api.md §6); `Display` is the problem's `detail`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// `400 invalid_request`: the request breaks a rule of its own.
    #[error("{0}")]
    InvalidRequest(String),
    /// `400 idempotency_key_required`.
    #[error("this endpoint requires an Idempotency-Key header")]
    IdempotencyKeyRequired,
    /// `401 unauthenticated`.
    #[error("missing or invalid API key")]
    Unauthenticated,
    /// `403 forbidden`: the key's role may not.
    #[error("this API key's role may not do that")]
    Forbidden,
    /// `404 not_found` (also for other tenants' ids).
    #[error("no such resource")]
    NotFound,
    /// `405 method_not_allowed`.
    #[error("the HTTP method is not allowed on this resource")]
    MethodNotAllowed,
    /// `409 idempotency_key_reused`: the key named another request.
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused {
        /// The operation the key made.
        operation_id: Id,
    },
    /// `409 operation_not_cancellable`: past its commit point.
    #[error("the operation passed its commit point and can no longer be cancelled")]
    OperationNotCancellable {
        /// The operation.
        operation_id: Id,
    },
    /// `409 lease_lost`: a stale lease token.
    #[error("the lease is no longer held by this worker")]
    LeaseLost {
        /// The task's operation.
        operation_id: Id,
    },
    /// `410 gone`: removed by retention.
    #[error("the resource was removed")]
    Gone,
    /// `403 forbidden`: a download link that is tampered with or expired.
    #[error("{0}")]
    LinkRefused(String),
    /// `410 result_expired`.
    #[error("the result has expired")]
    ResultExpired {
        /// The operation.
        operation_id: Id,
    },
    /// `412 precondition_failed`: `If-Match` named an older version.
    #[error("If-Match names version {given}, the current version is {current}")]
    PreconditionFailed {
        /// The version `If-Match` named.
        given: i64,
        /// The current version.
        current: i64,
    },
    /// `412 precondition_failed` for a change to a terminal operation.
    #[error("the operation is terminal (version {current}); terminal intent wins over this change")]
    TerminalIntentWins {
        /// The current version.
        current: i64,
    },
    /// `428 precondition_required`: `If-Match` is missing.
    #[error("this request requires an If-Match header")]
    PreconditionRequired,
    /// `413 payload_too_large`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// `415 unsupported_media_type`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// `422 invalid_input`: the kind refused the input.
    #[error("{0}")]
    InvalidInput(String),
    /// `422 unsupported_kind`.
    #[error("{0}")]
    UnsupportedKind(String),
    /// `422 invalid_callback_url`.
    #[error("{0}")]
    InvalidCallbackUrl(String),
    /// `429 quota_exceeded`: the tenant is at `max_active`.
    #[error("{detail}")]
    QuotaExceeded {
        /// Which quota.
        detail: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `429 rate_limited`.
    #[error("{detail}")]
    RateLimited {
        /// Which limit.
        detail: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `503 temporarily_unavailable`: nothing was applied.
    #[error("{detail}")]
    TemporarilyUnavailable {
        /// What is unavailable.
        detail: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `409 input_not_kept`: a re-run of an operation whose input is gone.
    #[error(
        "the operation's input is no longer kept (a success drops it unless the server keeps inputs); it cannot be re-run"
    )]
    InputNotKept {
        /// The original.
        operation_id: Id,
    },
    /// `409 intent_conflict`: cancellation was requested or the work ended.
    #[error("cancellation was requested or the operation ended (version {current}): no pause or resume is applied")]
    IntentConflict {
        /// The current version.
        current: i64,
    },
    /// `409 intent_conflict`: the start of work that started cannot move.
    #[error("the operation has started (version {current}): `not_before` moves only while it is queued")]
    Started {
        /// The current version.
        current: i64,
    },
    /// `409 not_pausable`: running work of a kind that cannot pause.
    #[error("the operation is running and its kind cannot pause")]
    NotPausable {
        /// The current version.
        current: i64,
    },
    /// `400 digest_mismatch`: the bytes do not match their digest.
    #[error("{0}")]
    DigestMismatch(String),
    /// `409 upload_offset_mismatch`, with `Upload-Offset`.
    #[error("the upload's offset is {offset}{}", if *complete { " and it is complete" } else { "" })]
    UploadOffsetMismatch {
        /// Where the stored bytes end.
        offset: i64,
        /// Whether the upload is complete.
        complete: bool,
    },
    /// The message is logged, never shown.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// The stable problem code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::IdempotencyKeyRequired => "idempotency_key_required",
            ApiError::Unauthenticated => "unauthenticated",
            ApiError::Forbidden | ApiError::LinkRefused(_) => "forbidden",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            ApiError::OperationNotCancellable { .. } => "operation_not_cancellable",
            ApiError::LeaseLost { .. } => "lease_lost",
            ApiError::Gone => "gone",
            ApiError::ResultExpired { .. } => "result_expired",
            ApiError::PreconditionFailed { .. } | ApiError::TerminalIntentWins { .. } => "precondition_failed",
            ApiError::PreconditionRequired => "precondition_required",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::InvalidInput(_) => "invalid_input",
            ApiError::UnsupportedKind(_) => "unsupported_kind",
            ApiError::InvalidCallbackUrl(_) => "invalid_callback_url",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::TemporarilyUnavailable { .. } => "temporarily_unavailable",
            ApiError::InputNotKept { .. } => "input_not_kept",
            ApiError::IntentConflict { .. } | ApiError::Started { .. } => "intent_conflict",
            ApiError::NotPausable { .. } => "not_pausable",
            ApiError::DigestMismatch(_) => "digest_mismatch",
            ApiError::UploadOffsetMismatch { .. } => "upload_offset_mismatch",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_) | ApiError::IdempotencyKeyRequired | ApiError::DigestMismatch(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::LinkRefused(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::IdempotencyKeyReused { .. }
            | ApiError::OperationNotCancellable { .. }
            | ApiError::LeaseLost { .. }
            | ApiError::UploadOffsetMismatch { .. }
            | ApiError::InputNotKept { .. }
            | ApiError::IntentConflict { .. }
            | ApiError::Started { .. }
            | ApiError::NotPausable { .. } => StatusCode::CONFLICT,
            ApiError::Gone | ApiError::ResultExpired { .. } => StatusCode::GONE,
            ApiError::PreconditionFailed { .. } | ApiError::TerminalIntentWins { .. } => {
                StatusCode::PRECONDITION_FAILED
            }
            ApiError::PreconditionRequired => StatusCode::PRECONDITION_REQUIRED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::InvalidInput(_) | ApiError::UnsupportedKind(_) | ApiError::InvalidCallbackUrl(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::QuotaExceeded { .. } | ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::TemporarilyUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "Invalid request",
            ApiError::IdempotencyKeyRequired => "Idempotency key required",
            ApiError::Unauthenticated => "Unauthenticated",
            ApiError::Forbidden | ApiError::LinkRefused(_) => "Forbidden",
            ApiError::NotFound => "Not found",
            ApiError::MethodNotAllowed => "Method not allowed",
            ApiError::IdempotencyKeyReused { .. } => "Idempotency key reused",
            ApiError::OperationNotCancellable { .. } => "Operation not cancellable",
            ApiError::LeaseLost { .. } => "Lease lost",
            ApiError::Gone => "Gone",
            ApiError::ResultExpired { .. } => "Result expired",
            ApiError::PreconditionFailed { .. } | ApiError::TerminalIntentWins { .. } => "Precondition failed",
            ApiError::PreconditionRequired => "Precondition required",
            ApiError::PayloadTooLarge(_) => "Payload too large",
            ApiError::UnsupportedMediaType(_) => "Unsupported media type",
            ApiError::InvalidInput(_) => "Invalid input",
            ApiError::UnsupportedKind(_) => "Unsupported kind",
            ApiError::InvalidCallbackUrl(_) => "Invalid callback URL",
            ApiError::QuotaExceeded { .. } => "Quota exceeded",
            ApiError::RateLimited { .. } => "Rate limited",
            ApiError::TemporarilyUnavailable { .. } => "Temporarily unavailable",
            ApiError::InputNotKept { .. } => "Input not kept",
            ApiError::IntentConflict { .. } | ApiError::Started { .. } => "Intent conflict",
            ApiError::NotPausable { .. } => "Not pausable",
            ApiError::DigestMismatch(_) => "Digest mismatch",
            ApiError::UploadOffsetMismatch { .. } => "Upload offset mismatch",
            ApiError::Internal(_) => "Internal error",
        }
    }

    /// Whether the same request may succeed later without change.
    fn retryable(&self) -> bool {
        matches!(
            self,
            ApiError::QuotaExceeded { .. }
                | ApiError::RateLimited { .. }
                | ApiError::TemporarilyUnavailable { .. }
                | ApiError::Internal(_)
        )
    }

    fn operation_id(&self) -> Option<&Id> {
        match self {
            ApiError::IdempotencyKeyReused { operation_id }
            | ApiError::OperationNotCancellable { operation_id }
            | ApiError::LeaseLost { operation_id }
            | ApiError::ResultExpired { operation_id }
            | ApiError::InputNotKept { operation_id } => Some(operation_id),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::QuotaExceeded { retry_after, .. }
            | ApiError::RateLimited { retry_after, .. }
            | ApiError::TemporarilyUnavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The problem body (without its request id, which the edge adds).
    pub fn problem(&self) -> Problem {
        let detail = match self {
            ApiError::Internal(_) => "the server failed to handle the request; it has been logged".to_owned(),
            other => other.to_string(),
        };
        Problem {
            problem_type: format!("urn:longrun:problem:{}", self.code()),
            title: self.title().into(),
            status: self.status().as_u16(),
            code: self.code().into(),
            detail,
            request_id: String::new(),
            operation_id: self.operation_id().map(|id| id.to_string()),
            retryable: self.retryable(),
        }
    }

    /// The problem body of one item of a batch, carrying the id of the
    /// request it came in (the edge adds it only to whole responses).
    pub(crate) fn item_problem(&self, request_id: &str) -> Problem {
        Problem {
            request_id: request_id.to_owned(),
            ..self.problem()
        }
    }

    /// The problem for a response that did not come from an `ApiError`.
    pub fn for_status(status: StatusCode) -> ApiError {
        match status {
            StatusCode::NOT_FOUND => ApiError::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge("the request body is too large".into()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                ApiError::UnsupportedMediaType("the request body must be application/json".into())
            }
            StatusCode::UNAUTHORIZED => ApiError::Unauthenticated,
            StatusCode::FORBIDDEN => ApiError::Forbidden,
            s if s.is_client_error() => ApiError::InvalidRequest("the request could not be understood".into()),
            _ => ApiError::Internal(format!("an unexpected {status} response")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(message) = &self {
            tracing::error!(error = %message, "internal error");
        }
        let mut response = self.status().into_response();
        if let Some(retry_after) = self.retry_after() {
            let seconds = longrun_core::retry_after::header_seconds(retry_after).max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let ApiError::UploadOffsetMismatch { offset, complete } = &self {
            let h = response.headers_mut();
            h.insert("upload-offset", HeaderValue::from(*offset));
            h.insert(
                "upload-complete",
                HeaderValue::from_static(if *complete { "?1" } else { "?0" }),
            );
        }
        if matches!(self, ApiError::Unauthenticated) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(self.problem());
        response
    }
}

/// What a request refused for an unavailable database is told to wait.
const DATABASE_RETRY_AFTER: Duration = Duration::from_secs(2);

impl ApiError {
    /// What a store error means to a caller (no logging: see `From`).
    pub fn of_store(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::NotFound,
            StoreError::Gone => ApiError::Gone,
            StoreError::UploadOffsetMismatch { offset, complete } => {
                ApiError::UploadOffsetMismatch { offset, complete }
            }
            StoreError::IntentConflict { current_version } => ApiError::IntentConflict {
                current: current_version,
            },
            StoreError::Started { current_version } => ApiError::Started {
                current: current_version,
            },
            StoreError::NotPausable { current_version } => ApiError::NotPausable {
                current: current_version,
            },
            StoreError::Unavailable(_) => ApiError::TemporarilyUnavailable {
                detail: "the database is unavailable; nothing was applied, retry shortly".into(),
                retry_after: DATABASE_RETRY_AFTER,
            },
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if let StoreError::Unavailable(why) = &e {
            tracing::warn!(error = %why, "the database is unavailable");
        }
        ApiError::of_store(e)
    }
}
