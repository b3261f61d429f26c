//! How records are kept in columns: the JSON forms of progress, artifacts,
//! upload pieces and snapshots, the webhook body as queued, a delivery
//! attempt's row, and pages of a list.

use super::*;

/// The body of the webhook `event_type` of `op`'s change, as queued (the
/// same text on every attempt, so every attempt carries one signature
/// input).
pub(crate) fn webhook_payload(op: &Operation, event_type: &str) -> String {
    let event = longrun_api::WebhookEvent {
        event_type: event_type.to_owned(),
        timestamp: op.updated_at.to_rfc3339(),
        data: longrun_api::WebhookData {
            operation_id: op.id.to_string(),
            version: op.version,
            state: op.state.as_str().to_owned(),
            kind: op.kind.clone(),
            schedule_id: op.schedule_id().map(str::to_owned),
        },
    };
    serde_json::to_string(&event).expect("a webhook body serializes")
}

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

/// The published artifacts of an operation as its `artifact` column keeps
/// them: the default one alone in its own form (as before named artifacts
/// existed), or `{"artifacts": {name: artifact}}` when any is named; `None`
/// when there are none.
pub(crate) fn artifacts_to_json(default: Option<&ArtifactRef>, named: &BTreeMap<String, ArtifactRef>) -> Option<Value> {
    if named.is_empty() {
        return default.map(artifact_to_json);
    }
    let mut all: serde_json::Map<String, Value> = named
        .iter()
        .map(|(name, a)| (name.clone(), artifact_to_json(a)))
        .collect();
    if let Some(a) = default {
        all.insert(DEFAULT_ARTIFACT.to_owned(), artifact_to_json(a));
    }
    Some(json!({ "artifacts": all }))
}

/// The inverse of [`artifacts_to_json`]: the default artifact and the named ones.
pub(crate) fn artifacts_from_json(v: Option<&Value>) -> (Option<ArtifactRef>, BTreeMap<String, ArtifactRef>) {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return (None, BTreeMap::new());
    };
    let Some(all) = v.get("artifacts").and_then(Value::as_object) else {
        return (artifact_from_json(v), BTreeMap::new());
    };
    let mut named: BTreeMap<String, ArtifactRef> = all
        .iter()
        .filter_map(|(name, a)| Some((name.clone(), artifact_from_json(a)?)))
        .collect();
    (named.remove(DEFAULT_ARTIFACT), named)
}

/// Adds `published` (name, artifact) to an operation's artifacts.
pub(crate) fn with_published(mut op: Operation, published: Vec<(String, ArtifactRef)>) -> Operation {
    for (name, artifact) in published {
        if name == DEFAULT_ARTIFACT {
            op.artifact = Some(artifact);
        } else {
            op.artifacts.insert(name, artifact);
        }
    }
    op
}

/// Keeps `op`'s artifacts (as [`with_published`] left them) in its row:
/// the one statement both stores' endings run after publishing results.
pub(crate) fn artifacts_recorded(op: &Operation) -> Script<()> {
    let artifact = artifacts_to_json(op.artifact.as_ref(), &op.artifacts).map(|v| v.to_string());
    Script::one(
        "UPDATE {sqlite: OR FAIL} operations SET artifact = ?2 WHERE id = ?1",
        vec![op.id.as_str().into(), artifact.into()],
        |_| Ok(()),
    )
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

/// A progress as stored ([`ProgressJson`]'s short names, or the API's, as
/// rows written before keep it).
pub(crate) fn progress_from_json(v: &Value) -> Progress {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let field = |short: &str, long: &str| v.get(short).or_else(|| v.get(long));
    Progress {
        completed_units: field("done", "completed_units").and_then(Value::as_f64),
        total_units: field("total", "total_units").and_then(Value::as_f64),
        unit: text("unit"),
        phase: text("phase"),
        details: v.get("details").filter(|d| !d.is_null()).cloned(),
        updated_at: field("at", "updated_at").and_then(Value::as_i64).map(Timestamp),
    }
}

/// The representation-relevant fields of `op` (not its input) as JSON text,
/// kept with each event (read back by [`snapshot_from_json`]).
///
/// Written straight from borrowed fields, not through a `serde_json::Value`:
/// every change of the job path stores one, and building the map (a key
/// string and a node per field) cost as much as writing it out — together a
/// tenth of the SQLite writer thread in a profile of the in-process drain.
///
/// Only what can differ between two events of one operation is kept, and
/// only when it differs from its default: events are the largest table the
/// job path writes (docs/scaling.md). The operation's fixed fields (id,
/// tenant, kind, idempotency key, creation time) come back from its row,
/// and the version, state and `updated_at` from the event's own columns
/// (every event is recorded at its operation's `updated_at`). Absent
/// fields, empty labels, `attempt` 0, `cost_units` 0 and `cancellable`
/// true are left out. A snapshot that still carries these fields (written
/// before) reads back the same.
///
/// A terminal operation's event keeps none (`None`, a `NULL` column): a
/// terminal operation's version never moves again, so its row is the
/// representation at that version, as `GET` shows it.
pub(crate) fn event_snapshot(op: &Operation) -> Option<String> {
    (!op.state.is_terminal()).then(|| snapshot_text(op))
}

/// The snapshot text of `op`, terminal or not (see [`event_snapshot`]).
pub(crate) fn snapshot_text(op: &Operation) -> String {
    #[derive(serde::Serialize)]
    struct Snapshot<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        callback_url: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deadline_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        budget_max_cost: Option<f64>,
        #[serde(skip_serializing_if = "is_zero")]
        attempt: i64,
        #[serde(skip_serializing_if = "is_zero_units")]
        cost_units: f64,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        labels: &'a BTreeMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        progress: Option<ProgressJson<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<ErrorJson<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cancel: Option<CancelJson<'a>>,
        #[serde(skip_serializing_if = "is_true")]
        cancellable: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        started_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        completed_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        expires_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        artifact: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rerun_of: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pause_requested_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        not_before: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        priority: Option<i16>,
    }
    #[derive(serde::Serialize)]
    struct ErrorJson<'a> {
        code: &'a str,
        message: &'a str,
        retryable: bool,
    }
    #[derive(serde::Serialize)]
    struct CancelJson<'a> {
        requested_at: i64,
        requested_by: &'a str,
        reason: Option<&'a str>,
    }
    let snapshot = Snapshot {
        attempt: op.attempt,
        callback_url: op.callback_url.as_deref(),
        deadline_at: op.deadline_at.map(|t| t.0),
        budget_max_cost: op.budget_max_cost,
        cost_units: op.cost_units,
        labels: &op.labels,
        progress: op.progress.as_ref().map(ProgressJson::of),
        result: op.result.as_ref(),
        error: op.error.as_ref().map(|e| ErrorJson {
            code: &e.code,
            message: &e.message,
            retryable: e.retryable,
        }),
        cancel: op.cancel.as_ref().map(|c| CancelJson {
            requested_at: c.requested_at.0,
            requested_by: &c.requested_by,
            reason: c.reason.as_deref(),
        }),
        cancellable: op.cancellable,
        started_at: op.started_at.map(|t| t.0),
        completed_at: op.completed_at.map(|t| t.0),
        expires_at: op.expires_at.map(|t| t.0),
        artifact: artifacts_to_json(op.artifact.as_ref(), &op.artifacts),
        rerun_of: op.rerun_of.as_ref().map(Id::as_str),
        pause_requested_at: op.pause_requested_at.map(|t| t.0),
        not_before: op.not_before.map(|t| t.0),
        priority: (op.priority != crate::PRIORITY_DEFAULT).then_some(op.priority),
    };
    serde_json::to_string(&snapshot).expect("a snapshot is always serializable")
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_zero_units(n: &f64) -> bool {
    *n == 0.0
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A progress as the `progress` column and snapshots keep it: the API's
/// field names but three, shorter (`done`, `total`, `at` for
/// `completed_units`, `total_units`, `updated_at`): 25 bytes less in every
/// row and snapshot that holds a progress, most operations' (see
/// docs/scaling.md). [`progress_from_json`] reads both spellings.
#[derive(serde::Serialize)]
pub(crate) struct ProgressJson<'a> {
    #[serde(rename = "done", skip_serializing_if = "Option::is_none")]
    pub(super) completed_units: Option<f64>,
    #[serde(rename = "total", skip_serializing_if = "Option::is_none")]
    pub(super) total_units: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) unit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) phase: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) details: Option<&'a Value>,
    #[serde(rename = "at", skip_serializing_if = "Option::is_none")]
    pub(super) updated_at: Option<i64>,
}

/// A progress as JSON text, for the `progress` column.
pub(crate) fn progress_text(p: &Progress) -> String {
    serde_json::to_string(&ProgressJson::of(p)).expect("a progress is always serializable")
}

impl<'a> ProgressJson<'a> {
    pub(crate) fn of(p: &'a Progress) -> Self {
        Self {
            completed_units: p.completed_units,
            total_units: p.total_units,
            unit: p.unit.as_deref(),
            phase: p.phase.as_deref(),
            details: p.details.as_ref(),
            updated_at: p.updated_at.map(|t| t.0),
        }
    }
}

/// The operation at an event of `row` (the operation as stored now) at
/// `version`, in `state`, recorded `at`, from the event's snapshot `v`: its
/// fixed fields from `row`, the rest from `v` (fields `v` still carries, as
/// snapshots written before did, win). An event without a snapshot is
/// the row itself when it is at the row's version (the terminal event, see
/// [`event_snapshot`]), and unknown otherwise.
pub(crate) fn snapshot_from_json(
    v: Option<&Value>,
    row: &Operation,
    version: i64,
    state: State,
    at: Timestamp,
) -> Option<Operation> {
    let Some(v) = v else {
        return (version == row.version).then(|| Operation {
            input: None,
            reruns: None,
            ..row.clone()
        });
    };
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let time = |k: &str| v.get(k).and_then(Value::as_i64).map(Timestamp);
    v.as_object()?;
    Some(Operation {
        id: text("id").map_or_else(|| row.id.clone(), Id::from_trusted),
        tenant: text("tenant").unwrap_or_else(|| row.tenant.clone()),
        kind: text("kind").unwrap_or_else(|| row.kind.clone()),
        state: text("state").and_then(|s| s.parse().ok()).unwrap_or(state),
        version: v.get("version").and_then(Value::as_i64).unwrap_or(version),
        attempt: v.get("attempt").and_then(Value::as_i64).unwrap_or(0),
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
        idempotency_key: text("idempotency_key").or_else(|| row.idempotency_key.clone()),
        created_at: time("created_at").unwrap_or(row.created_at),
        started_at: time("started_at"),
        completed_at: time("completed_at"),
        updated_at: time("updated_at").unwrap_or(at),
        expires_at: time("expires_at"),
        artifact: None,
        artifacts: BTreeMap::new(),
        rerun_of: text("rerun_of").map(Id::from_trusted),
        reruns: None,
        pause_requested_at: time("pause_requested_at"),
        not_before: time("not_before"),
        priority: v
            .get("priority")
            .and_then(Value::as_i64)
            .and_then(|p| i16::try_from(p).ok())
            .unwrap_or(crate::PRIORITY_DEFAULT),
    })
    .map(|mut op| {
        (op.artifact, op.artifacts) = artifacts_from_json(v.get("artifact"));
        op
    })
}

pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// The upload an object belongs to, by its storage key: upload pieces and
/// joined uploads are stored under `uploads/{upload id}/` (longrun-engine's
/// `uploads.rs`), so a key is matched against one upload's pieces, never
/// against every upload's.
pub(crate) fn upload_of_key(key: &str) -> Option<&str> {
    key.strip_prefix("uploads/")?
        .split('/')
        .next()
        .filter(|id| !id.is_empty())
}

/// How a storage key appears in an upload's `chunks` column (a JSON string).
pub(crate) fn key_in_chunks(key: &str) -> String {
    serde_json::to_string(key).unwrap_or_default()
}

pub(crate) fn chunks_to_json(chunks: &[UploadChunk]) -> String {
    serde_json::to_string(chunks).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn chunks_from_json(text: &str) -> Vec<UploadChunk> {
    serde_json::from_str(text).unwrap_or_default()
}

/// A page of a list read one row past `page_size` (with each row's `seq`):
/// that extra row says another page follows, from the last kept row's seq.
pub(crate) fn page(mut operations: Vec<Operation>, seqs: &[i64], page_size: i64) -> OperationPage {
    let next_before_seq = if operations.len() as i64 > page_size {
        operations.truncate(page_size as usize);
        seqs.get(page_size as usize - 1).copied()
    } else {
        None
    };
    OperationPage {
        operations,
        next_before_seq,
    }
}

/// How one delivery attempt is recorded, for every backend.
pub(crate) struct AttemptRow<'a> {
    /// The delivery's status after it: `delivered`, `pending` (another
    /// attempt is due) or `given_up`.
    pub status: &'static str,
    pub status_code: Option<u16>,
    pub error: Option<&'a str>,
    /// Milliseconds; `None` once delivered or given up.
    pub next_attempt_at: Option<i64>,
}

/// What an attempt's outcome writes.
pub(crate) fn attempt_row(outcome: &AttemptOutcome) -> AttemptRow<'_> {
    match outcome {
        AttemptOutcome::Delivered { status_code } => AttemptRow {
            status: "delivered",
            status_code: Some(*status_code),
            error: None,
            next_attempt_at: None,
        },
        AttemptOutcome::Failed {
            status_code,
            error,
            next_attempt_at,
        } => AttemptRow {
            status: if next_attempt_at.is_some() {
                "pending"
            } else {
                "given_up"
            },
            status_code: *status_code,
            error: Some(error.as_str()),
            next_attempt_at: next_attempt_at.map(|t| t.0),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot `text` of `op` read back as the event at `op`'s version.
    fn read_back(text: &str, op: &Operation) -> Operation {
        let v = serde_json::from_str(text).unwrap();
        snapshot_from_json(Some(&v), op, op.version, op.state, op.updated_at).unwrap()
    }

    /// A new operation's snapshot leaves out its absent and default fields,
    /// its fixed fields and what the event's own columns hold: it is empty,
    /// and reads back as the operation all the same.
    #[test]
    fn a_new_operations_snapshot_is_empty() {
        let params = crate::conformance::accept_params("t1", "k", Some("key-1"), json!({"n": 1}));
        let fresh = created_operation(&params);
        let text = snapshot_text(&fresh);
        assert_eq!(text, "{}");
        assert_eq!(read_back(&text, &fresh), Operation { input: None, ..fresh });
    }

    /// A terminal operation's event keeps no snapshot: the row, whose
    /// version never moves again, is the representation at that version;
    /// an earlier version without a snapshot stays unknown.
    #[test]
    fn a_terminal_event_reads_its_row() {
        let params = crate::conformance::accept_params("t1", "k", None, json!({"n": 1}));
        let fresh = created_operation(&params);
        assert!(event_snapshot(&fresh).is_some());
        let ended = Operation {
            state: State::Succeeded,
            version: 3,
            result: Some(json!({"ok": true})),
            reruns: Some(Vec::new()),
            ..fresh
        };
        assert_eq!(event_snapshot(&ended), None);
        let read = snapshot_from_json(None, &ended, 3, State::Succeeded, ended.updated_at).unwrap();
        assert_eq!(
            read,
            Operation {
                input: None,
                reruns: None,
                ..ended.clone()
            }
        );
        assert_eq!(
            snapshot_from_json(None, &ended, 2, State::Running, ended.updated_at),
            None
        );
    }

    /// A snapshot written before snapshots left fields out (every field
    /// present, `null`s included) reads back as it did.
    #[test]
    fn a_snapshot_with_every_field_reads_back_the_same() {
        let params = crate::conformance::accept_params("t1", "k", Some("key-1"), json!({"n": 1}));
        let fresh = created_operation(&params);
        let old = json!({
            "id": fresh.id.as_str(), "tenant": "t1", "kind": "k", "state": "queued", "version": 1,
            "attempt": 0, "callback_url": null, "cost_units": 0.0, "labels": {}, "progress": null,
            "result": null, "error": null, "cancel": null, "cancellable": true, "idempotency_key": "key-1",
            "created_at": fresh.created_at.0, "started_at": null, "completed_at": null,
            "updated_at": fresh.updated_at.0, "expires_at": null
        });
        // The base and the event say otherwise: the old snapshot's own fields win.
        let other = Operation {
            id: Id::from_trusted("op_other".into()),
            tenant: "t9".into(),
            kind: "other".into(),
            idempotency_key: None,
            created_at: Timestamp(1),
            ..fresh.clone()
        };
        let read = snapshot_from_json(Some(&old), &other, 9, State::Failed, Timestamp(2)).unwrap();
        assert_eq!(read, Operation { input: None, ..fresh });
    }

    #[test]
    fn a_snapshot_reads_back_as_the_operation_without_its_input() {
        let artifact = |id: &str| ArtifactRef {
            id: Id::from_trusted(id.to_owned()),
            content_type: "text/csv".into(),
            size_bytes: 12,
            sha256: "ab".repeat(32),
            expires_at: Timestamp(9_000),
        };
        let op = Operation {
            id: Id::from_trusted("op_snapshot".to_owned()),
            tenant: "acme".into(),
            kind: "export".into(),
            state: State::Failed,
            version: 7,
            attempt: 2,
            input: Some(json!({"kept": "not in snapshots"})),
            callback_url: Some("https://hooks.example/x".into()),
            deadline_at: Some(Timestamp(5_000)),
            budget_max_cost: Some(2.5),
            cost_units: 1.25,
            labels: BTreeMap::from([("team".to_owned(), "data \"quoted\"".to_owned())]),
            progress: Some(Progress {
                completed_units: Some(3.0),
                total_units: Some(10.0),
                unit: Some("rows".into()),
                phase: Some("copy".into()),
                details: Some(json!({"shard": [1, 2]})),
                updated_at: Some(Timestamp(4_000)),
            }),
            result: None,
            error: Some(OperationError {
                code: "boom".into(),
                message: "it broke\n".into(),
                retryable: true,
            }),
            cancel: Some(CancelRequest {
                requested_at: Timestamp(4_500),
                requested_by: "key_x".into(),
                reason: Some("enough".into()),
            }),
            cancellable: false,
            created_at: Timestamp(1_000),
            started_at: Some(Timestamp(2_000)),
            completed_at: Some(Timestamp(6_000)),
            updated_at: Timestamp(6_000),
            expires_at: Some(Timestamp(8_000)),
            idempotency_key: Some("k-1".into()),
            artifact: Some(artifact("res_default")),
            artifacts: BTreeMap::from([("report".to_owned(), artifact("res_named"))]),
            rerun_of: Some(Id::from_trusted("op_original".to_owned())),
            reruns: None,
            pause_requested_at: Some(Timestamp(5_500)),
            not_before: Some(Timestamp(1_500)),
            priority: 8,
        };
        let text = snapshot_text(&op);
        for fixed in [
            "op_snapshot",
            "acme",
            "k-1",
            "\"version\"",
            "\"state\"",
            "\"updated_at\":6000",
        ] {
            assert!(!text.contains(fixed), "{fixed} in {text}");
        }
        let read = read_back(&text, &op);
        assert_eq!(
            read,
            Operation {
                input: None,
                ..op.clone()
            }
        );

        let bare = Operation {
            progress: None,
            error: None,
            cancel: None,
            artifact: None,
            artifacts: BTreeMap::new(),
            ..op
        };
        let read = read_back(&snapshot_text(&bare), &bare);
        assert_eq!(read, Operation { input: None, ..bare });
    }

    /// A progress is kept with the short names and read back the same;
    /// one kept with the API's names (rows written before) too.
    #[test]
    fn a_progress_reads_back_in_either_spelling() {
        let p = Progress {
            completed_units: Some(3.0),
            total_units: Some(10.0),
            unit: Some("rows".into()),
            phase: Some("copy".into()),
            details: Some(json!({"file": "a.csv"})),
            updated_at: Some(Timestamp(1_800_000_000_000)),
        };
        let text = progress_text(&p);
        assert_eq!(
            text,
            r#"{"done":3.0,"total":10.0,"unit":"rows","phase":"copy","details":{"file":"a.csv"},"at":1800000000000}"#
        );
        assert_eq!(progress_from_json(&serde_json::from_str(&text).unwrap()), p);
        let before = json!({"completed_units": 3.0, "total_units": 10.0, "unit": "rows", "phase": "copy",
                            "details": {"file": "a.csv"}, "updated_at": 1_800_000_000_000_i64});
        assert_eq!(progress_from_json(&before), p);
    }
}
