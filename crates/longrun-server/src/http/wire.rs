//! Storage records mapped to the public JSON shapes of docs/api.md §3, here
//! and nowhere else, because what is serialized is contract. The shapes
//! themselves are `longrun-api`'s (shared with the SDK and remote workers);
//! they are re-exported here for the handlers.

use std::borrow::Cow;

use longrun_core::{Id, Timestamp};
use longrun_store::{Event, Operation};
use serde_json::Value;

pub use longrun_api::{
    BatchItemResult, BatchSubmitRequest, BatchSubmitResponse, CancelRequestBody, CancellationBody, CostBody,
    DeliveryBody, DeliveryLog, ErrorBody, EventBody, History, Links, OperationBody, OperationList, ProgressBody,
    RerunRequest, SubmitRequest, UpdateRequest,
};

fn rfc3339(t: Option<Timestamp>) -> Option<String> {
    t.map(Timestamp::to_rfc3339)
}

/// The operation as clients read it.
pub fn operation(op: &Operation) -> OperationBody {
    let base = format!("/v1/operations/{}", op.id);
    OperationBody {
        id: op.id.to_string(),
        kind: op.kind.clone(),
        rerun_of: op.rerun_of.as_ref().map(Id::to_string),
        schedule_id: op.schedule_id().map(str::to_owned),
        reruns: op
            .reruns
            .as_ref()
            .filter(|ids| !ids.is_empty())
            .map(|ids| ids.iter().map(Id::to_string).collect()),
        state: Cow::Borrowed(op.state.as_str()),
        desired_state: Cow::Borrowed(if op.cancel.is_some() || op.state == longrun_core::State::Cancelled {
            "cancelled"
        } else if op.state == longrun_core::State::Paused || op.pause_requested() {
            "paused"
        } else {
            "running"
        }),
        terminal: op.state.is_terminal(),
        cancel_requested: op.cancel.is_some(),
        version: op.version,
        attempt: op.attempt,
        created_at: op.created_at.to_rfc3339(),
        started_at: rfc3339(op.started_at),
        completed_at: rfc3339(op.completed_at),
        updated_at: op.updated_at.to_rfc3339(),
        deadline_at: rfc3339(op.deadline_at),
        progress: op.progress.as_ref().map(|p| ProgressBody {
            completed_units: p.completed_units,
            total_units: p.total_units,
            unit: p.unit.clone(),
            phase: p.phase.clone(),
            details: p.details.clone(),
            updated_at: rfc3339(p.updated_at),
        }),
        cost: CostBody {
            units: op.cost_units,
            max_units: op.budget_max_cost,
        },
        result: result_body(op),
        error: op.error.as_ref().map(|e| ErrorBody {
            code: e.code.clone(),
            message: e.message.clone(),
            retryable: e.retryable,
        }),
        labels: op.labels.clone(),
        not_before: rfc3339(op.not_before),
        priority: op.priority,
        expires_at: rfc3339(op.expires_at),
        links: Links {
            cancel: format!("{base}/cancellation"),
            events: format!("{base}/events"),
            result: (op.artifact.is_some() || !op.artifacts.is_empty()).then(|| format!("{base}/result")),
            self_: base,
        },
    }
}

fn artifact_json(a: &longrun_store::ArtifactRef) -> Value {
    serde_json::json!({
        "id": a.id.as_str(),
        "content_type": a.content_type,
        "size_bytes": a.size_bytes,
        "sha256": a.sha256,
        "expires_at": a.expires_at.to_rfc3339(),
    })
}

/// `result`: an inline value as `{"value": …}`; a result with artifacts as
/// `{"artifact"?, "artifacts"?}` beside the members of the worker's object
/// value, if any (the import's `summary`). A failed operation shows the
/// artifacts its worker published (error reports, partial outputs).
fn result_body(op: &Operation) -> Option<Value> {
    if op.artifact.is_none() && op.artifacts.is_empty() {
        return op.result.as_ref().map(|value| serde_json::json!({ "value": value }));
    }
    let mut body = match &op.result {
        Some(Value::Object(members)) => members.clone(),
        Some(Value::Null) | None => serde_json::Map::new(),
        Some(other) => serde_json::Map::from_iter([("value".to_owned(), other.clone())]),
    };
    body.remove("artifacts");
    body.remove("artifact");
    if let Some(a) = &op.artifact {
        body.insert("artifact".into(), artifact_json(a));
    }
    if !op.artifacts.is_empty() {
        let named = op
            .artifacts
            .iter()
            .map(|(name, a)| (name.clone(), artifact_json(a)))
            .collect();
        body.insert("artifacts".into(), Value::Object(named));
    }
    Some(Value::Object(body))
}

/// One stored version as clients read it.
pub fn event(e: &Event) -> EventBody {
    EventBody {
        version: e.version,
        state: Cow::Borrowed(e.state.as_str()),
        event_type: e.event_type.clone(),
        at: e.at.to_rfc3339(),
        data: e.data.clone(),
    }
}

/// The cancellation resource of `op`.
pub fn cancellation(op: &Operation) -> CancellationBody {
    let request = op.cancel.as_ref();
    CancellationBody {
        operation_id: op.id.to_string(),
        requested: request.is_some(),
        requested_at: request.map(|r| r.requested_at.to_rfc3339()),
        requested_by: request.map(|r| r.requested_by.clone()),
        reason: request.and_then(|r| r.reason.clone()),
        cancellable: op.cancellable && !op.state.is_terminal(),
        state: Cow::Borrowed(op.state.as_str()),
        outcome: request.map(|_| {
            Cow::Borrowed(if op.state.is_terminal() {
                op.state.as_str()
            } else {
                "pending"
            })
        }),
    }
}

/// One delivery attempt as clients read it.
pub fn delivery(a: &longrun_store::AttemptRecord) -> DeliveryBody {
    DeliveryBody {
        event_id: a.event_id.to_string(),
        event_type: a.event_type.clone(),
        attempt: a.attempt,
        status_code: a.status_code,
        error: a.error.clone(),
        at: a.at.to_rfc3339(),
        next_attempt_at: rfc3339(a.next_attempt_at),
        latency_ms: a.latency_ms,
    }
}
