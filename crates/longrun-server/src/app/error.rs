//! Every refusal of the API, one variant per stable problem `code`
//! (docs/api.md §6): what the application decides. How each is rendered
//! — its HTTP status, headers and problem+json body — is the edge's
//! (`http/error.rs`); the console renders the same refusals as pages.

use std::time::Duration;

use longrun_core::Id;
use longrun_store::StoreError;

/// Every refusal of the API, one variant per stable problem `code`
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

    /// Whether the same request may succeed later without change.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            ApiError::QuotaExceeded { .. }
                | ApiError::RateLimited { .. }
                | ApiError::TemporarilyUnavailable { .. }
                | ApiError::Internal(_)
        )
    }

    /// The operation the refusal is about, when there is one.
    pub fn operation_id(&self) -> Option<&Id> {
        match self {
            ApiError::IdempotencyKeyReused { operation_id }
            | ApiError::OperationNotCancellable { operation_id }
            | ApiError::LeaseLost { operation_id }
            | ApiError::ResultExpired { operation_id }
            | ApiError::InputNotKept { operation_id } => Some(operation_id),
            _ => None,
        }
    }

    /// How long the caller is asked to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::QuotaExceeded { retry_after, .. }
            | ApiError::RateLimited { retry_after, .. }
            | ApiError::TemporarilyUnavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
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
