//! The problem+json body every refusal carries (RFC 9457 plus Longrun's
//! stable `code`), and the list of those codes.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// Every stable problem code (CONTRACT §6; `method_not_allowed` is ours).
/// Only its schema is used: the server's errors name their codes.
#[derive(utoipa::ToSchema)]
#[allow(non_camel_case_types, dead_code, missing_docs)]
pub enum ProblemCode {
    invalid_request,
    idempotency_key_required,
    unauthenticated,
    forbidden,
    not_found,
    method_not_allowed,
    idempotency_key_reused,
    operation_not_cancellable,
    lease_lost,
    gone,
    result_expired,
    precondition_failed,
    precondition_required,
    payload_too_large,
    unsupported_media_type,
    invalid_input,
    unsupported_kind,
    invalid_callback_url,
    quota_exceeded,
    rate_limited,
    internal,
    temporarily_unavailable,
    digest_mismatch,
    upload_offset_mismatch,
    input_not_kept,
    intent_conflict,
    not_pausable,
}

/// The problem+json body (RFC 9457 plus our `code`, `request_id`, `retryable`).
///
/// It reads leniently (only `code` is needed): a refusal may come from a
/// proxy or an older server, and a client decides on `code` alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the problem type.
    #[serde(rename = "type", default)]
    #[schema(required = true)]
    pub problem_type: String,
    /// A short summary of the code, the same for every occurrence.
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub title: Cow<'static, str>,
    /// The HTTP status.
    #[serde(default)]
    #[schema(required = true)]
    pub status: u16,
    /// What to decide on.
    #[schema(value_type = ProblemCode)]
    pub code: Cow<'static, str>,
    /// This occurrence, for people.
    #[serde(default)]
    #[schema(required = true)]
    pub detail: String,
    /// The request's `X-Request-Id`, for the operator.
    #[serde(default)]
    #[schema(required = true)]
    pub request_id: String,
    /// The operation the problem is about, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// Whether the same request may succeed later.
    #[serde(default)]
    #[schema(required = true)]
    pub retryable: bool,
}
