//! The problem+json body every refusal carries (RFC 9457 plus Longrun's
//! stable `code`), and the list of those codes.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// Every stable problem code (docs/api.md §6; `method_not_allowed` is ours).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_reads_from_its_code_alone_and_not_without_it() {
        // A proxy or an older server may answer a bare problem: the code is
        // what a client decides on, the rest defaults.
        let bare: Problem = serde_json::from_str(r#"{"code":"rate_limited","extra":1}"#).unwrap();
        assert_eq!(bare.code, "rate_limited");
        assert_eq!((bare.status, bare.retryable, bare.request_id.as_str()), (0, false, ""));
        assert!(serde_json::from_str::<Problem>(r#"{"title":"Bad Gateway","status":502}"#).is_err());

        let full = Problem {
            problem_type: "urn:longrun:problem:lease_lost".into(),
            title: Cow::Borrowed("Lease lost"),
            status: 409,
            code: Cow::Borrowed("lease_lost"),
            detail: "the lease is no longer held by this worker".into(),
            request_id: "req_1".into(),
            operation_id: None,
            retryable: false,
        };
        let text = serde_json::to_string(&full).unwrap();
        assert!(!text.contains("operation_id"), "absent, not null: {text}");
        assert_eq!(serde_json::from_str::<Problem>(&text).unwrap(), full);
    }
}
