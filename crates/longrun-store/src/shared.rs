//! Pure helpers every backend shares: the JSON forms of progress, artifacts
//! and snapshots kept in the database, and the rules for merging progress and
//! for how a stop the server asked for ends.

use std::time::Duration;

use longrun_core::{Id, State, Timestamp};
use serde_json::{Value, json};

use crate::*;

/// Who a cancellation by the server itself is attributed to.
pub(crate) const SYSTEM: &str = "system";
/// Cancel reasons that end the operation `failed` with the reason as its code.
pub(crate) const FAILING_CANCEL_REASONS: [&str; 2] = ["deadline_exceeded", "budget_exhausted"];

pub(crate) fn artifact_to_json(a: &ArtifactRef) -> Value {
    json!({
        "id": a.id.as_str(),
        "content_type": a.content_type,
        "size_bytes": a.size_bytes,
        "sha256": a.sha256,
        "expires_at": a.expires_at.0,
    })
}

pub(crate) fn artifact_from_json(v: &Value) -> Option<ArtifactRef> {
    Some(ArtifactRef {
        id: Id::from_trusted(v.get("id")?.as_str()?.to_owned()),
        content_type: v.get("content_type")?.as_str()?.to_owned(),
        size_bytes: v.get("size_bytes")?.as_i64()?,
        sha256: v.get("sha256")?.as_str()?.to_owned(),
        expires_at: Timestamp(v.get("expires_at")?.as_i64()?),
    })
}

pub(crate) fn progress_to_json(p: &Progress) -> Value {
    json!({
        "completed_units": p.completed_units,
        "total_units": p.total_units,
        "unit": p.unit,
        "phase": p.phase,
        "details": p.details,
        "updated_at": p.updated_at.map(|t| t.0),
    })
}

pub(crate) fn progress_from_json(v: &Value) -> Progress {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    Progress {
        completed_units: v.get("completed_units").and_then(Value::as_f64),
        total_units: v.get("total_units").and_then(Value::as_f64),
        unit: text("unit"),
        phase: text("phase"),
        details: v.get("details").filter(|d| !d.is_null()).cloned(),
        updated_at: v.get("updated_at").and_then(Value::as_i64).map(Timestamp),
    }
}

/// Merges a worker's report into the stored progress. Completed units never
/// go backwards; fields the worker leaves out keep their value.
pub(crate) fn merge_progress(old: Option<&Progress>, update: &ProgressUpdate) -> Progress {
    let old = old.cloned().unwrap_or_default();
    let completed_units = match (old.completed_units, update.completed_units) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => b.or(a),
    };
    Progress {
        completed_units,
        total_units: update.total_units.or(old.total_units),
        unit: update.unit.clone().or(old.unit),
        phase: update.phase.clone().or(old.phase),
        details: update.details.clone().or(old.details),
        updated_at: old.updated_at,
    }
}

/// The error a cancellation by the server itself ends with, if it was one.
pub(crate) fn failing_cancel(requested_by: Option<&str>, reason: Option<&str>) -> Option<OperationError> {
    let reason = reason.filter(|r| requested_by == Some(SYSTEM) && FAILING_CANCEL_REASONS.contains(r))?;
    Some(OperationError {
        code: reason.to_owned(),
        message: match reason {
            "deadline_exceeded" => "the operation's deadline passed".to_owned(),
            _ => "the operation's cost budget was exhausted".to_owned(),
        },
        retryable: false,
    })
}

/// The representation-relevant fields of `op` (not its input) as JSON, kept
/// with each event.
pub(crate) fn snapshot_to_json(op: &Operation) -> Value {
    json!({
        "id": op.id.as_str(),
        "tenant": op.tenant,
        "kind": op.kind,
        "state": op.state.as_str(),
        "version": op.version,
        "attempt": op.attempt,
        "callback_url": op.callback_url,
        "deadline_at": op.deadline_at.map(|t| t.0),
        "budget_max_cost": op.budget_max_cost,
        "cost_units": op.cost_units,
        "labels": op.labels,
        "progress": op.progress.as_ref().map(progress_to_json),
        "result": op.result,
        "error": op.error.as_ref().map(|e| json!({"code": e.code, "message": e.message, "retryable": e.retryable})),
        "cancel": op.cancel.as_ref().map(|c| json!({
            "requested_at": c.requested_at.0, "requested_by": c.requested_by, "reason": c.reason,
        })),
        "cancellable": op.cancellable,
        "idempotency_key": op.idempotency_key,
        "created_at": op.created_at.0,
        "started_at": op.started_at.map(|t| t.0),
        "completed_at": op.completed_at.map(|t| t.0),
        "updated_at": op.updated_at.0,
        "expires_at": op.expires_at.map(|t| t.0),
        "artifact": op.artifact.as_ref().map(artifact_to_json),
    })
}

pub(crate) fn snapshot_from_json(v: &Value) -> Option<Operation> {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let time = |k: &str| v.get(k).and_then(Value::as_i64).map(Timestamp);
    Some(Operation {
        id: Id::from_trusted(text("id")?),
        tenant: text("tenant")?,
        kind: text("kind")?,
        state: text("state")?.parse().ok()?,
        version: v.get("version")?.as_i64()?,
        attempt: v.get("attempt")?.as_i64()?,
        input: None,
        callback_url: text("callback_url"),
        deadline_at: time("deadline_at"),
        budget_max_cost: v.get("budget_max_cost").and_then(Value::as_f64),
        cost_units: v.get("cost_units").and_then(Value::as_f64).unwrap_or(0.0),
        labels: serde_json::from_value(v.get("labels").cloned().unwrap_or_default()).unwrap_or_default(),
        progress: v.get("progress").filter(|p| !p.is_null()).map(progress_from_json),
        result: v.get("result").filter(|r| !r.is_null()).cloned(),
        error: v.get("error").filter(|e| !e.is_null()).map(|e| OperationError {
            code: e.get("code").and_then(Value::as_str).unwrap_or_default().to_owned(),
            message: e.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
            retryable: e.get("retryable").and_then(Value::as_bool).unwrap_or(false),
        }),
        cancel: v.get("cancel").filter(|c| !c.is_null()).map(|c| CancelRequest {
            requested_at: Timestamp(c.get("requested_at").and_then(Value::as_i64).unwrap_or(0)),
            requested_by: c
                .get("requested_by")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            reason: c.get("reason").and_then(Value::as_str).map(str::to_owned),
        }),
        cancellable: v.get("cancellable").and_then(Value::as_bool).unwrap_or(true),
        idempotency_key: text("idempotency_key"),
        created_at: time("created_at")?,
        started_at: time("started_at"),
        completed_at: time("completed_at"),
        updated_at: time("updated_at")?,
        expires_at: time("expires_at"),
        artifact: v.get("artifact").and_then(artifact_from_json),
    })
}

pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn deadline_error_before_start() -> OperationError {
    OperationError {
        code: "deadline_exceeded".into(),
        message: "the deadline passed before the operation could start".into(),
        retryable: false,
    }
}

/// The fenced view of a running task: present only for the current lease holder.
pub(crate) struct Fenced {
    pub version: i64,
    pub attempt: i64,
    pub max_attempts: i64,
    pub budget_max_cost: Option<f64>,
    pub lease_ms: i64,
    pub progress: Option<Progress>,
    pub cost_units: f64,
    pub cancellable: bool,
    pub cancel_requested: bool,
    pub cancel_reason: Option<String>,
    pub cancel_requested_by: Option<String>,
}

/// What a heartbeat does to its operation; every backend applies the same.
pub(crate) struct HeartbeatEffect {
    pub progress: Option<Progress>,
    pub cost_units: f64,
    pub cancellable: bool,
    /// The `progress` event's data when something visible changed (a new
    /// version); `None` for an idle heartbeat, which keeps the version.
    pub event: Option<Value>,
    /// The budget is exceeded now and no stop was asked for yet.
    pub over_budget: bool,
}

pub(crate) fn heartbeat_effect(current: &Fenced, p: &HeartbeatParams) -> HeartbeatEffect {
    let progress = final_progress(current, p.progress.as_ref(), p.now).or_else(|| current.progress.clone());
    // Cost only grows; once past the commit point, an operation stays uncancellable.
    let cost_units = p.cost_units.map_or(current.cost_units, |c| c.max(current.cost_units));
    let cancellable = current.cancellable && p.cancellable.unwrap_or(true);
    let changed =
        progress != current.progress || cost_units != current.cost_units || cancellable != current.cancellable;
    let event = changed.then(|| {
        // The event's own `at` says when; the record's internal timestamp stays out.
        let public_progress = progress.as_ref().map(|p| {
            let mut v = progress_to_json(p);
            if let Some(fields) = v.as_object_mut() {
                fields.remove("updated_at");
            }
            v
        });
        json!({"progress": public_progress, "cost_units": cost_units, "cancellable": cancellable})
    });
    let over_budget =
        !current.cancel_requested && cancellable && current.budget_max_cost.is_some_and(|max| cost_units > max);
    HeartbeatEffect {
        progress,
        cost_units,
        cancellable,
        event,
        over_budget,
    }
}

/// What a worker's outcome does to its operation, decided once for every
/// backend: end it in a terminal state, or (a retryable failure with attempts
/// left and no stop requested) put it back in the queue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FinishDecision {
    End {
        to: State,
        result: Option<Value>,
        error: Option<OperationError>,
    },
    Retry {
        next_attempt: i64,
        /// The `retry_scheduled` event's data (the backoff is added by the applier).
        data: Value,
    },
}

pub(crate) fn decide_finish(current: &Fenced, outcome: &Outcome) -> FinishDecision {
    match outcome {
        Outcome::Succeeded { result } => FinishDecision::End {
            to: State::Succeeded,
            result: Some(result.clone().unwrap_or(Value::Null)),
            error: None,
        },
        // The worker says another attempt may succeed and attempts are left:
        // retry after a backoff; the public state stays running.
        Outcome::Failed { error }
            if error.retryable && !current.cancel_requested && current.attempt < current.max_attempts =>
        {
            FinishDecision::Retry {
                next_attempt: current.attempt + 1,
                data: json!({
                    "reason": "worker_error",
                    "error": {"code": error.code, "message": error.message, "retryable": true},
                }),
            }
        }
        Outcome::Failed { error } => FinishDecision::End {
            to: State::Failed,
            result: None,
            error: Some(error.clone()),
        },
        // A stop the server asked for (deadline, budget) ends `failed` with
        // its code; a client's cancel ends `cancelled`.
        Outcome::Cancelled => {
            match failing_cancel(current.cancel_requested_by.as_deref(), current.cancel_reason.as_deref()) {
                Some(error) => FinishDecision::End {
                    to: State::Failed,
                    result: None,
                    error: Some(error),
                },
                None => FinishDecision::End {
                    to: State::Cancelled,
                    result: None,
                    error: None,
                },
            }
        }
    }
}

/// The progress to store with an outcome: the worker's last, coalesced
/// report merged into the stored one; `None` when it changes nothing.
pub(crate) fn final_progress(current: &Fenced, update: Option<&ProgressUpdate>, now: Timestamp) -> Option<Progress> {
    let update = update?;
    let mut merged = merge_progress(current.progress.as_ref(), update);
    let unchanged = current.progress.as_ref().is_some_and(|old| {
        let mut old = old.clone();
        old.updated_at = merged.updated_at;
        old == merged
    });
    (!unchanged).then(|| {
        merged.updated_at = Some(now);
        merged
    })
}
