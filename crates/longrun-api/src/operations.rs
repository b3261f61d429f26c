//! The public protocol's bodies (docs/api.md §3, §9): what a client sends to
//! submit, re-run, change and cancel operations, and what it reads back.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Problem;
use crate::de::{object, present, present_whole_number, whole_number};

/// A submission. The schema states every rule the server checks on its own
/// (`400 invalid_request`); what depends on the kind (its input), on
/// policy (callback addresses) or on state (quotas, keys) is answered
/// `422` / `409` / `429`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The kind of work, as the server's workers register it.
    #[schema(pattern = "^[a-z0-9][a-z0-9_.-]{0,63}$", example = "export")]
    pub kind: String,
    /// Kind-specific JSON; `null` is the same as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Where to deliver this operation's webhooks.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRequest>,
    /// Seconds from creation; a kind may allow less than 30 days.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<u64>,
    /// The most cost the work may report before it is stopped.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRequest>,
    /// Labels to filter lists by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// When the work may start (RFC 3339); not claimed before. Its
    /// deadline still counts from creation. Not with `start_after_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime, example = "2026-12-06T02:00:00Z")]
    pub not_before: Option<String>,
    /// The same as `not_before`, in seconds from now (not with `not_before`).
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 31_536_000)]
    pub start_after_seconds: Option<u64>,
    /// 1–9, higher claimed first within the tenant; 5 when left out.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<u64>,
}

/// Labels as the server checks them: at most 32; keys of a-z, 0-9, `_ . - /`
/// up to 63 characters; string values up to 256 characters.
pub(crate) fn labels_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::Object,
            Type::Null,
        ]))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[a-z0-9_./-]{1,63}$")),
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(utoipa::openapi::RefOr::T(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(longrun_core::validate::MAX_LABEL_VALUE_LEN))
                .into(),
        ))))
        .max_properties(Some(longrun_core::validate::MAX_LABELS))
        .build()
}

/// `POST /v1/operations/batch` (docs/api.md §9).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitRequest {
    /// 1–1,000 submissions, answered in this order.
    #[schema(min_items = 1, max_items = 1000)]
    pub operations: Vec<BatchSubmitItem>,
}

/// One submission of a batch: the fields of `POST /v1/operations`, with
/// its `Idempotency-Key` as a field. The SDK's `Submission` (and a line of
/// `longrun submit --batch`) is this shape.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitItem {
    /// The item's idempotency key; each item has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "import-2026-11-30-0001")]
    pub idempotency_key: Option<String>,
    /// Checked per item: a bad kind refuses only its item.
    #[schema(example = "export")]
    pub kind: String,
    /// Kind-specific JSON; `null` is the same as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Where to deliver this operation's webhooks.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRequest>,
    /// Checked per item, like the rest of the item's rules.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub deadline_seconds: Option<u64>,
    /// The most cost the work may report before it is stopped.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BatchBudget>)]
    pub budget: Option<BudgetRequest>,
    /// Labels to filter lists by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// When the work may start (RFC 3339); not claimed before. Its
    /// deadline still counts from creation. Not with `start_after_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "2026-12-06T02:00:00Z")]
    pub not_before: Option<String>,
    /// The same as `not_before`, in seconds from now (not with `not_before`).
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub start_after_seconds: Option<u64>,
    /// 1–9, higher claimed first within the tenant; 5 when left out.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub priority: Option<u64>,
}

/// A batch item's budget: its bounds are checked per item. (Only its
/// schema is used; items parse into [`BudgetRequest`].)
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BatchBudget {
    /// Cost units the work may use.
    pub max_cost_units: f64,
}

impl BatchSubmitItem {
    /// A submission of `kind` with `input`, nothing else set.
    pub fn new(kind: impl Into<String>, input: Value) -> Self {
        Self {
            kind: kind.into(),
            input: Some(input),
            ..Self::default()
        }
    }

    /// The single submission's body: the item without its key.
    pub fn into_request(self) -> SubmitRequest {
        SubmitRequest {
            kind: self.kind,
            input: self.input,
            callback: self.callback,
            deadline_seconds: self.deadline_seconds,
            budget: self.budget,
            labels: self.labels,
            not_before: self.not_before,
            start_after_seconds: self.start_after_seconds,
            priority: self.priority,
        }
    }
}

/// The answer to a batch: one result per item, in item order.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchSubmitResponse {
    /// One per item, in item order.
    pub results: Vec<BatchItemResult>,
}

/// One item's answer: the status and body its single submission would get.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchItemResult {
    /// The HTTP status the single submission would have had.
    pub status: u16,
    /// `true` when the key named an existing operation (`Idempotent-Replayed`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// The operation, when the item was accepted or replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationBody>,
    /// Why the item was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// Where an operation's webhooks go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackRequest {
    /// An `https` URL (or `http` where the server allows it).
    pub url: String,
}

/// `POST /v1/operations/{id}/reruns`: a new operation of the original's kind
/// and input. Each field left out is the original's (its deadline counts
/// again from the re-run's creation).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    /// Seconds from the re-run's creation.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<u64>,
    /// The re-run's budget.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRequest>,
    /// The re-run's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Where the re-run's webhooks go.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRequest>,
    /// Start from the last checkpoint the original's workers saved (where a
    /// failed export stopped, say); from the beginning if it saved none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_checkpoint: bool,
    /// When the re-run may start (RFC 3339); at once when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime, example = "2026-12-06T02:00:00Z")]
    pub not_before: Option<String>,
    /// The same as `not_before`, in seconds from now (not with `not_before`).
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 31_536_000)]
    pub start_after_seconds: Option<u64>,
    /// 1–9, higher claimed first within the tenant; the original's when left out.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<u64>,
}

/// A budget: the most cost units the work may report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRequest {
    /// Cost units the work may use; more stops it.
    #[schema(exclusive_minimum = 0)]
    pub max_cost_units: f64,
}

/// `PATCH` body. `deadline_seconds: null` removes the deadline; an absent
/// field is left as it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// `paused` holds queued work back from claims; `running` resumes it.
    /// Changed on its own (not with other fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_state: Option<DesiredStateBody>,
    /// Seconds from creation; `null` removes the deadline.
    #[serde(
        default,
        deserialize_with = "present_whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<Option<u64>>,
    /// The labels, replaced whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// A new start (RFC 3339) while the operation is queued; `null` lets it
    /// start at once. Moving the start of work that started is `409
    /// intent_conflict`.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub not_before: Option<Option<String>>,
}

/// The intents a client may set with `PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DesiredStateBody {
    /// Run (or resume) the work.
    Running,
    /// Hold the work: queued work is not claimed, running work is asked to pause.
    Paused,
}

/// `PUT …/cancellation`: why the client cancels.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequestBody {
    /// Kept with the request, shown in `GET …/cancellation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The operation representation (docs/api.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationBody {
    /// `op_…`, opaque.
    pub id: String,
    /// The kind of work.
    pub kind: String,
    /// The operation this one re-runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
    /// The schedule (`sch_…`) this operation is a firing of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
    /// Its re-runs, oldest first: present when it has any and one operation
    /// is read (`GET /v1/operations/{id}`). Creating a re-run leaves the
    /// original's version, and so its ETag, unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reruns: Option<Vec<String>>,
    /// `queued`, `running`, `paused`, `succeeded`, `failed` or `cancelled`.
    #[schema(value_type = String)]
    pub state: Cow<'static, str>,
    /// What the client wants of the run: `running`, `paused` (also while a
    /// worker is asked to pause and `state` is still `running`), or
    /// `cancelled` once cancellation is requested (terminal intent).
    #[schema(value_type = String, pattern = "^(running|paused|cancelled)$")]
    pub desired_state: Cow<'static, str>,
    /// Whether `state` is final.
    pub terminal: bool,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// Moves by one with every change; the ETag.
    pub version: i64,
    /// Attempts started so far.
    pub attempt: i64,
    /// RFC 3339.
    pub created_at: String,
    /// When the first attempt started.
    pub started_at: Option<String>,
    /// When it became terminal.
    pub completed_at: Option<String>,
    /// When it last changed.
    pub updated_at: String,
    /// When it fails with `deadline_exceeded` if not finished.
    pub deadline_at: Option<String>,
    /// The latest progress its worker reported.
    pub progress: Option<ProgressBody>,
    /// Cost reported so far, and the budget.
    pub cost: CostBody,
    /// `{"value": …}` for an inline result; `{"artifact"?, "artifacts"?: {name: …}}`
    /// for one with artifacts, beside the members of the worker's object
    /// result (the import's `summary`). A failed operation may carry the
    /// artifacts its worker published (error reports, partial outputs).
    pub result: Option<Value>,
    /// Why it failed.
    pub error: Option<ErrorBody>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// When it may start; `null`: as soon as a worker is free.
    #[serde(default)]
    pub not_before: Option<String>,
    /// 1–9, higher claimed first within its tenant.
    #[serde(default = "default_priority")]
    #[schema(minimum = 1, maximum = 9)]
    pub priority: i16,
    /// When retention removes it.
    pub expires_at: Option<String>,
    /// Its resources.
    pub links: Links,
}

/// The priority of work that names none (the middle of 1–9).
pub const DEFAULT_PRIORITY: i16 = 5;

fn default_priority() -> i16 {
    DEFAULT_PRIORITY
}

/// Progress as a worker reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProgressBody {
    /// Units done.
    pub completed_units: Option<f64>,
    /// Units in all, when known.
    pub total_units: Option<f64>,
    /// What a unit is (`rows`, `bytes`).
    pub unit: Option<String>,
    /// The step the work is in.
    pub phase: Option<String>,
    /// Kind-specific JSON.
    pub details: Option<Value>,
    /// When it was reported.
    pub updated_at: Option<String>,
}

/// Cost so far against the budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CostBody {
    /// Units reported.
    pub units: f64,
    /// The budget, if any.
    pub max_units: Option<f64>,
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable code (`deadline_exceeded`, `outcome_unknown`, or the worker's own).
    pub code: String,
    /// For people.
    pub message: String,
    /// Whether a re-run may succeed.
    pub retryable: bool,
}

/// An operation's resources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Links {
    /// The operation.
    #[serde(rename = "self")]
    pub self_: String,
    /// Its cancellation.
    pub cancel: String,
    /// Its event stream.
    pub events: String,
    /// Its result resource, when it has artifacts.
    pub result: Option<String>,
}

/// A page of operations.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationList {
    /// Newest first.
    pub operations: Vec<OperationBody>,
    /// Pass as `page_token` for the next page; `null` after the last.
    pub next_page_token: Option<String>,
}

/// One stored version of an operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventBody {
    /// The version it made.
    pub version: i64,
    /// The state after it.
    #[schema(value_type = String)]
    pub state: Cow<'static, str>,
    /// What happened (`created`, `progress`, `succeeded`, …).
    #[serde(rename = "type")]
    pub event_type: String,
    /// When.
    pub at: String,
    /// What changed.
    pub data: Value,
}

/// An operation's history, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct History {
    /// The operation.
    pub operation_id: String,
    /// Every stored version, in order.
    pub events: Vec<EventBody>,
}

/// `GET …/cancellation`: who asked, when, why, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CancellationBody {
    /// The operation.
    pub operation_id: String,
    /// Whether cancellation was requested.
    pub requested: bool,
    /// When.
    pub requested_at: Option<String>,
    /// The key that asked.
    pub requested_by: Option<String>,
    /// The reason given.
    pub reason: Option<String>,
    /// Whether a request now could still stop the work.
    pub cancellable: bool,
    /// The operation's state.
    #[schema(value_type = String)]
    pub state: Cow<'static, str>,
    /// `pending` while the worker has not answered; the terminal state after.
    #[schema(value_type = Option<String>)]
    pub outcome: Option<Cow<'static, str>>,
}

/// An operation's webhook deliveries.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeliveryLog {
    /// Every attempt, oldest first.
    pub deliveries: Vec<DeliveryBody>,
}

/// One delivery attempt of one webhook event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeliveryBody {
    /// The `webhook-id`, the same on every attempt.
    pub event_id: String,
    /// The event's type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// 1 for the first attempt.
    pub attempt: i64,
    /// What the receiver answered, if it answered.
    pub status_code: Option<u16>,
    /// Why the attempt failed, if it did.
    pub error: Option<String>,
    /// When it was made.
    pub at: String,
    /// When the next attempt is due; `null` once delivered or given up.
    pub next_attempt_at: Option<String>,
    /// How long the attempt took, in milliseconds (`null` for attempts
    /// recorded before this was measured).
    pub latency_ms: Option<i64>,
}

#[cfg(test)]
mod nested_objects {
    use super::*;

    #[test]
    fn a_nested_field_is_an_object_null_or_absent_never_an_array() {
        let parse =
            |json: &str| serde_json::from_str::<SubmitRequest>(json).map(|r| r.budget.map(|b| b.max_cost_units));
        assert_eq!(parse(r#"{"kind":"k"}"#).unwrap(), None);
        assert_eq!(parse(r#"{"kind":"k","budget":null}"#).unwrap(), None);
        assert_eq!(
            parse(r#"{"kind":"k","budget":{"max_cost_units":2.5}}"#).unwrap(),
            Some(2.5)
        );
        assert!(parse(r#"{"kind":"k","budget":[2.5]}"#).is_err());
        assert!(parse(r#"{"kind":"k","budget":{"max_cost_units":1,"extra":1}}"#).is_err());
    }

    #[test]
    fn a_request_written_by_a_client_reads_back_as_the_same_request() {
        let update = UpdateRequest {
            deadline_seconds: Some(None),
            ..UpdateRequest::default()
        };
        let json = serde_json::to_string(&update).unwrap();
        assert_eq!(json, r#"{"deadline_seconds":null}"#, "null removes the deadline");
        let back: UpdateRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.deadline_seconds, Some(None));
        assert_eq!(serde_json::to_string(&UpdateRequest::default()).unwrap(), "{}");

        let item = BatchSubmitItem {
            idempotency_key: Some("k-1".into()),
            budget: Some(BudgetRequest { max_cost_units: 3.0 }),
            ..BatchSubmitItem::new("export", serde_json::json!({"rows": 1}))
        };
        let json = serde_json::to_value(&item).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"idempotency_key": "k-1", "kind": "export", "input": {"rows": 1}, "budget": {"max_cost_units": 3.0}})
        );
        let single = serde_json::to_value(item.into_request()).unwrap();
        assert!(
            single.get("idempotency_key").is_none(),
            "a single submission's key is a header"
        );
    }
}
