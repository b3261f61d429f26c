//! Wire types: the public JSON shapes of CONTRACT §3. Storage records are
//! mapped here and nowhere else, because what is serialized is contract.

use std::collections::BTreeMap;

use longrun_core::{Id, Timestamp};
use longrun_store::{Event, Operation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A submission. The schema states every rule the server checks on its own
/// (`400 invalid_request`); what depends on the kind (its input), on
/// policy (callback addresses) or on state (quotas, keys) is answered
/// `422` / `409` / `429`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    #[schema(pattern = "^[a-z0-9][a-z0-9_.-]{0,63}$", example = "export")]
    pub kind: String,
    /// Kind-specific JSON; `null` is the same as absent.
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default, deserialize_with = "object")]
    pub callback: Option<CallbackRequest>,
    /// Seconds from creation; a kind may allow less than 30 days.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<u64>,
    #[serde(default, deserialize_with = "object")]
    pub budget: Option<BudgetRequest>,
    #[serde(default)]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Labels as the server checks them: at most 32; keys of a-z, 0-9, `_ . - /`
/// up to 63 characters; string values up to 256 characters.
fn labels_schema() -> utoipa::openapi::schema::Object {
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

/// A whole number of seconds, also when a client's JSON encoder writes it
/// as `326.0` (JSON Schema's `integer` admits that spelling).
fn whole_number<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<Value>::deserialize(deserializer)?
        .map(|v| as_whole_number(&v).ok_or_else(|| serde::de::Error::custom("expected a whole number of seconds")))
        .transpose()
}

/// A required whole number (of bytes, say), also when written as `326.0`.
pub(crate) fn required_whole_number<'de, D>(deserializer: D) -> Result<u64, D::Error>
where
    D: serde::Deserializer<'de>,
{
    as_whole_number(&Value::deserialize(deserializer)?)
        .ok_or_else(|| serde::de::Error::custom("expected a whole number"))
}

/// A nested body field that must be a JSON object (or `null`/absent): serde's
/// derived structs would also take an array in field order, which the
/// document does not allow. Read in one pass (no intermediate `Value`): the
/// field's own struct is fed the map directly, and anything but a map is
/// refused.
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_option(Nullable(std::marker::PhantomData))
}

/// [`object`] for a required field.
pub(crate) fn required_object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_map(OnlyMap(std::marker::PhantomData))
}

struct OnlyMap<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for OnlyMap<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

struct Nullable<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Nullable<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object or null")
    }

    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        required_object(deserializer).map(Some)
    }
}

/// Within int64, the format the document states.
fn as_whole_number(value: &Value) -> Option<u64> {
    let whole = match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < i64::MAX as f64)
                .map(|f| f as u64)
        }),
        _ => None,
    };
    whole.filter(|w| i64::try_from(*w).is_ok())
}

/// `POST /v1/operations/batch` (CONTRACT §9).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitRequest {
    /// 1–1,000 submissions, answered in this order.
    #[schema(min_items = 1, max_items = 1000)]
    pub operations: Vec<BatchSubmitItem>,
}

/// One submission of a batch: the fields of `POST /v1/operations`, with
/// its `Idempotency-Key` as a field.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitItem {
    #[serde(default)]
    #[schema(example = "import-2026-11-30-0001")]
    pub idempotency_key: Option<String>,
    /// Checked per item: a bad kind refuses only its item.
    #[schema(example = "export")]
    pub kind: String,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default, deserialize_with = "object")]
    pub callback: Option<CallbackRequest>,
    /// Checked per item, like the rest of the item's rules.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 0)]
    pub deadline_seconds: Option<u64>,
    #[serde(default, deserialize_with = "object")]
    #[schema(value_type = Option<BatchBudget>)]
    pub budget: Option<BudgetRequest>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A batch item's budget: its bounds are checked per item. (Only its
/// schema is used; items parse into [`BudgetRequest`].)
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BatchBudget {
    pub max_cost_units: f64,
}

impl BatchSubmitItem {
    pub fn into_request(self) -> SubmitRequest {
        SubmitRequest {
            kind: self.kind,
            input: self.input,
            callback: self.callback,
            deadline_seconds: self.deadline_seconds,
            budget: self.budget,
            labels: self.labels,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchSubmitResponse {
    pub results: Vec<BatchItemResult>,
}

/// One item's answer: the status and body its single submission would get.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchItemResult {
    pub status: u16,
    /// `true` when the key named an existing operation (`Idempotent-Replayed`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<crate::http::error::Problem>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackRequest {
    pub url: String,
}

/// `POST /v1/operations/{id}/reruns`: a new operation of the original's kind
/// and input. Each field left out is the original's (its deadline counts
/// again from the re-run's creation).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<u64>,
    #[serde(default, deserialize_with = "object")]
    pub budget: Option<BudgetRequest>,
    #[serde(default)]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "object")]
    pub callback: Option<CallbackRequest>,
    /// Start from the last checkpoint the original's workers saved (where a
    /// failed export stopped, say); from the beginning if it saved none.
    #[serde(default)]
    pub from_checkpoint: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRequest {
    #[schema(exclusive_minimum = 0)]
    pub max_cost_units: f64,
}

/// `PATCH` body. `deadline_seconds: null` removes the deadline; an absent
/// field is left as it is.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// `paused` holds queued work back from claims; `running` resumes it.
    /// Changed on its own (not with other fields).
    #[serde(default)]
    pub desired_state: Option<DesiredStateBody>,
    #[serde(default, deserialize_with = "present_whole_number")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<Option<u64>>,
    #[serde(default)]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// The intents a client may set with `PATCH`.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DesiredStateBody {
    Running,
    Paused,
}

/// Tells "present but null" (`Some(None)`) from "absent" (`None`).
fn present_whole_number<'de, D>(deserializer: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    whole_number(deserializer).map(Some)
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequestBody {
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationBody {
    pub id: String,
    pub kind: String,
    /// The operation this one re-runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
    /// Its re-runs, oldest first: present when it has any and one operation
    /// is read (`GET /v1/operations/{id}`). Creating a re-run leaves the
    /// original's version, and so its ETag, unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reruns: Option<Vec<String>>,
    pub state: &'static str,
    /// What the client wants of the run: `running`, `paused` (also while a
    /// worker is asked to pause and `state` is still `running`), or
    /// `cancelled` once cancellation is requested (terminal intent).
    #[schema(pattern = "^(running|paused|cancelled)$")]
    pub desired_state: &'static str,
    pub terminal: bool,
    pub cancel_requested: bool,
    pub version: i64,
    pub attempt: i64,
    pub created_at: String,
    pub started_at: Option<String>,
    pub completed_at: Option<String>,
    pub updated_at: String,
    pub deadline_at: Option<String>,
    pub progress: Option<ProgressBody>,
    pub cost: CostBody,
    /// `{"value": …}` for an inline result; `{"artifact"?, "artifacts"?: {name: …}}`
    /// for one with artifacts, beside the members of the worker's object
    /// result (the import's `summary`). A failed operation may carry the
    /// artifacts its worker published (error reports, partial outputs).
    pub result: Option<Value>,
    pub error: Option<ErrorBody>,
    pub labels: BTreeMap<String, String>,
    pub expires_at: Option<String>,
    pub links: Links,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProgressBody {
    pub completed_units: Option<f64>,
    pub total_units: Option<f64>,
    pub unit: Option<String>,
    pub phase: Option<String>,
    pub details: Option<Value>,
    pub updated_at: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CostBody {
    pub units: f64,
    pub max_units: Option<f64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Links {
    #[serde(rename = "self")]
    pub self_: String,
    pub cancel: String,
    pub events: String,
    pub result: Option<String>,
}

fn rfc3339(t: Option<Timestamp>) -> Option<String> {
    t.map(Timestamp::to_rfc3339)
}

impl From<&Operation> for OperationBody {
    fn from(op: &Operation) -> Self {
        let base = format!("/v1/operations/{}", op.id);
        OperationBody {
            id: op.id.to_string(),
            kind: op.kind.clone(),
            rerun_of: op.rerun_of.as_ref().map(Id::to_string),
            reruns: op
                .reruns
                .as_ref()
                .filter(|ids| !ids.is_empty())
                .map(|ids| ids.iter().map(Id::to_string).collect()),
            state: op.state.as_str(),
            desired_state: if op.cancel.is_some() || op.state == longrun_core::State::Cancelled {
                "cancelled"
            } else if op.state == longrun_core::State::Paused || op.pause_requested() {
                "paused"
            } else {
                "running"
            },
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
            expires_at: rfc3339(op.expires_at),
            links: Links {
                cancel: format!("{base}/cancellation"),
                events: format!("{base}/events"),
                result: (op.artifact.is_some() || !op.artifacts.is_empty()).then(|| format!("{base}/result")),
                self_: base,
            },
        }
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

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationList {
    pub operations: Vec<OperationBody>,
    pub next_page_token: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventBody {
    pub version: i64,
    pub state: &'static str,
    #[serde(rename = "type")]
    pub event_type: String,
    pub at: String,
    pub data: Value,
}

impl From<&Event> for EventBody {
    fn from(e: &Event) -> Self {
        EventBody {
            version: e.version,
            state: e.state.as_str(),
            event_type: e.event_type.clone(),
            at: e.at.to_rfc3339(),
            data: e.data.clone(),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct History {
    pub operation_id: String,
    pub events: Vec<EventBody>,
}

/// `GET …/cancellation`: who asked, when, why, and how it ended.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CancellationBody {
    pub operation_id: String,
    pub requested: bool,
    pub requested_at: Option<String>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    pub cancellable: bool,
    pub state: &'static str,
    /// `pending` while the worker has not answered; the terminal state after.
    pub outcome: Option<&'static str>,
}

impl From<&Operation> for CancellationBody {
    fn from(op: &Operation) -> Self {
        let request = op.cancel.as_ref();
        CancellationBody {
            operation_id: op.id.to_string(),
            requested: request.is_some(),
            requested_at: request.map(|r| r.requested_at.to_rfc3339()),
            requested_by: request.map(|r| r.requested_by.clone()),
            reason: request.and_then(|r| r.reason.clone()),
            cancellable: op.cancellable && !op.state.is_terminal(),
            state: op.state.as_str(),
            outcome: request.map(|_| {
                if op.state.is_terminal() {
                    op.state.as_str()
                } else {
                    "pending"
                }
            }),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryLog {
    pub deliveries: Vec<DeliveryBody>,
}

/// One delivery attempt of one webhook event.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryBody {
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub attempt: i64,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub at: String,
    /// When the next attempt is due; `null` once delivered or given up.
    pub next_attempt_at: Option<String>,
    /// How long the attempt took, in milliseconds (`null` for attempts
    /// recorded before this was measured).
    pub latency_ms: Option<i64>,
}

impl From<&longrun_store::AttemptRecord> for DeliveryBody {
    fn from(a: &longrun_store::AttemptRecord) -> Self {
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
}
