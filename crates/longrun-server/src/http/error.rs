//! How the API's refusals ([`ApiError`], the application's: one variant per
//! stable `code` of docs/api.md §6) are rendered over HTTP: status, headers
//! and RFC 9457 problem+json, in one place.
//!
//! Handlers return [`ApiError`]; its response carries the problem as an
//! extension and the [`edge`](crate::http::edge) middleware writes the body,
//! adding the request id. Responses that did not come from an `ApiError`
//! (a panic caught, anything from a layer) are turned into problems there too,
//! so a client never sees plain text.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use longrun_api::Problem;

use crate::app::ApiError;

impl ApiError {
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

/// What went wrong inside, on the response of an internal error: the edge
/// logs it on the request's one error line, with its id, method and path
/// (the client is told only that something failed).
#[derive(Debug, Clone)]
pub(crate) struct InternalError(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.status().into_response();
        if let ApiError::Internal(message) = &self {
            response.extensions_mut().insert(InternalError(message.clone()));
        }
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
