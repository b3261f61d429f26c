//! The worker protocol's bodies (docs/api.md §4, §9): claims, heartbeats and
//! outcomes, each fenced by the task's lease token, and the bodies of the
//! artifact uploads.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Problem;
use crate::de::{object, required_object, required_whole_number};

fn default_max_tasks() -> u32 {
    1
}

fn default_lease_seconds() -> u64 {
    30
}

/// `POST /v1/worker/claims`: lease up to `max_tasks` queued tasks of these
/// kinds, long-polling up to `wait_seconds` when none is ready.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The kinds this worker runs (1–32).
    pub kinds: Vec<String>,
    /// At most this many tasks (1–100).
    #[serde(default = "default_max_tasks")]
    pub max_tasks: u32,
    /// How long each lease lasts without a heartbeat.
    #[serde(default = "default_lease_seconds")]
    pub lease_seconds: u64,
    /// How long to wait for work (at most 60).
    #[serde(default)]
    pub wait_seconds: u64,
    /// Names the worker in leases and logs (the key's id by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
}

/// The leased tasks (possibly none).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimResponse {
    /// In the order they were claimed.
    pub tasks: Vec<TaskBody>,
}

/// One leased task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskBody {
    /// The operation the task runs.
    pub operation_id: String,
    /// Its kind.
    pub kind: String,
    /// The submission's input.
    pub input: Value,
    /// 1 for the first attempt.
    pub attempt: i64,
    /// Fences every later report: only the current lease's are applied.
    pub lease_token: String,
    /// When the lease ends without a heartbeat.
    pub lease_expires_at: String,
    /// When the operation fails with `deadline_exceeded`.
    pub deadline_at: Option<String>,
    /// The operation's budget.
    pub budget: Option<BudgetBody>,
    /// Where to resume from: the last checkpoint saved for the operation
    /// (an earlier attempt's, one saved before a pause, or one a
    /// `from_checkpoint` re-run copied); absent for a fresh start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
}

/// A task's budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BudgetBody {
    /// Cost units the work may use.
    pub max_cost_units: f64,
}

/// Progress as a worker reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgressRequest {
    /// Units done.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub completed_units: Option<f64>,
    /// Units in all, when known.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub total_units: Option<f64>,
    /// What a unit is (`rows`, `bytes`).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 32)]
    pub unit: Option<String>,
    /// The step the work is in.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub phase: Option<String>,
    /// Kind-specific JSON (at most 4 KiB).
    #[serde(default)]
    pub details: Option<Value>,
}

/// `POST /v1/worker/tasks/{id}/heartbeat`: renews the lease, reports
/// progress and cost.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// The latest progress.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
    /// Cost so far, all told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub cost_units: Option<f64>,
    /// `false` marks the commit point: cancellation is refused from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellable: Option<bool>,
    /// Where to resume from if this attempt ends early (JSON, at most
    /// 64 KiB): kept with the operation and handed to the next claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatResponse {
    /// The renewed lease's end.
    pub lease_expires_at: String,
    /// A client asked to cancel: stop and report `cancelled`.
    pub cancel_requested: bool,
    /// The client's reason.
    pub cancel_reason: Option<String>,
    /// A client asked to pause: save a checkpoint and report `paused`.
    pub pause_requested: bool,
}

/// `POST /v1/worker/tasks/{id}/complete`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// The inline result (at most 64 KiB; larger results are artifacts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The last progress report, stored with the outcome.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
}

/// `POST /v1/worker/tasks/{id}/fail`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// Why it failed.
    #[serde(deserialize_with = "required_object")]
    pub error: ErrorRequest,
    /// The last progress report, stored with the outcome.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
}

/// A worker's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorRequest {
    /// A stable code of the worker's choosing.
    #[schema(pattern = "^[a-z0-9][a-z0-9_.-]{0,63}$")]
    pub code: String,
    /// For people.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub message: String,
    /// Retried (while attempts are left) when `true`.
    #[serde(default)]
    pub retryable: bool,
}

/// `POST /v1/worker/tasks/{id}/paused`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PausedRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// Where to resume from (JSON, at most 64 KiB); without it the last
    /// checkpoint saved with a heartbeat is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
    /// The last progress report, stored with the outcome.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
}

/// `POST /v1/worker/tasks/{id}/cancelled`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelledRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// The last progress report, stored with the outcome.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
}

/// What an outcome call answers: the operation's new state and version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutcomeResponse {
    /// The operation.
    pub operation_id: String,
    /// Its state after the outcome (`queued` for a retry).
    #[schema(value_type = String)]
    pub state: Cow<'static, str>,
    /// Its version after the outcome.
    pub version: i64,
    /// Attempts started so far.
    pub attempt: i64,
}

/// What one item of a batch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// Succeeded, with an optional inline result.
    Complete,
    /// Failed, with an error.
    Fail,
    /// Stopped as a cancel request asked.
    Cancelled,
    /// Still running: renew the lease.
    Heartbeat,
    /// Stopped as a pause request asked.
    Paused,
}

/// `POST /v1/worker/outcomes`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomesRequest {
    /// 1–1,000 items, each an `OutcomeItem` fenced by its own lease token,
    /// each read, checked and answered alone (a malformed item, or one
    /// breaking an item rule, refuses only itself).
    #[schema(min_items = 1, max_items = 1000, value_type = Vec<Object>)]
    pub outcomes: Vec<serde_json::Map<String, Value>>,
}

/// The same document as [`OutcomesRequest`], written straight from typed
/// items: what a worker sends. (The server reads each item as an object
/// first, so one malformed item refuses only itself.)
#[derive(Debug, Serialize)]
pub struct OutcomesBody<'a> {
    /// The items, in the order their answers come back.
    pub outcomes: &'a [OutcomeItem],
}

/// One report: the fields of the single endpoint its `outcome` names.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeItem {
    /// The task's operation.
    pub operation_id: String,
    /// The task's lease token.
    pub lease_token: String,
    /// What is reported.
    pub outcome: OutcomeKind,
    /// `complete`: the inline result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// `fail`: the error.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRequest>,
    /// The latest progress (an outcome's is stored with it).
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRequest>,
    /// `heartbeat`: total cost so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub cost_units: Option<f64>,
    /// `heartbeat`: `false` marks the commit point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellable: Option<bool>,
    /// `heartbeat` and `paused`: where to resume from (JSON, at most 64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
}

impl OutcomeItem {
    /// An item reporting `outcome` for the task, nothing else set.
    pub fn new(operation_id: impl Into<String>, lease_token: impl Into<String>, outcome: OutcomeKind) -> Self {
        Self {
            operation_id: operation_id.into(),
            lease_token: lease_token.into(),
            outcome,
            result: None,
            error: None,
            progress: None,
            cost_units: None,
            cancellable: None,
            checkpoint: None,
        }
    }
}

/// The answer to a batch of outcomes.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutcomesResponse {
    /// One per item, in item order.
    pub results: Vec<OutcomeItemResult>,
}

/// One item's answer: its HTTP status, and the single endpoint's body or its problem.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutcomeItemResult {
    /// The status the single endpoint would have answered.
    pub status: u16,
    /// The item's operation.
    pub operation_id: String,
    /// Why the item was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
    /// Outcomes: the operation's state after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub state: Option<Cow<'static, str>>,
    /// The operation's version after the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// Outcomes: attempts started so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    /// Heartbeats: the renewed lease and whether to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
    /// Heartbeats: a client asked to cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<bool>,
    /// Heartbeats: the client's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// Heartbeats: a client asked to pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_requested: Option<bool>,
}

/// An artifact stored by a worker (not yet published: the outcome does that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArtifactUploadBody {
    /// `res_…`
    pub id: String,
    /// As the upload's `Content-Type` said.
    pub content_type: String,
    /// Its size.
    pub size_bytes: u64,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
}

/// Where an artifact's stored pieces end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PieceStoredBody {
    /// Where the artifact's stored pieces now end: the next piece's offset.
    pub upload_offset: u64,
}

/// `POST …/artifacts/{name}/join`: make the stored pieces the artifact.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// The artifact's content type (kept, as an upload's `Content-Type` is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 255, pattern = "^[\\x20-\\x7e]+$")]
    pub content_type: Option<String>,
    /// What the pieces must hold, all told.
    #[serde(deserialize_with = "required_whole_number")]
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub size_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_worker_writes_the_server_reads_item_by_item() {
        let items = [
            OutcomeItem {
                result: Some(serde_json::json!({"rows": 3})),
                ..OutcomeItem::new("op_1", "lease-1", OutcomeKind::Complete)
            },
            OutcomeItem {
                cost_units: Some(2.5),
                ..OutcomeItem::new("op_2", "lease-2", OutcomeKind::Heartbeat)
            },
        ];
        let text = serde_json::to_string(&OutcomesBody { outcomes: &items }).unwrap();
        let read: OutcomesRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(read.outcomes.len(), 2);
        for (map, item) in read.outcomes.into_iter().zip(&items) {
            let back: OutcomeItem = serde_json::from_value(Value::Object(map)).unwrap();
            assert_eq!(
                serde_json::to_value(&back).unwrap(),
                serde_json::to_value(item).unwrap()
            );
        }
        // Unset fields are left out, not sent as `null`.
        assert!(!text.contains("null"), "{text}");
    }
}
