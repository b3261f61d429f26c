//! Records and params of the [`Store`](crate::Store) trait. Storage types, not
//! wire types: the HTTP edge maps them to the public representation.

use std::collections::BTreeMap;
use std::time::Duration;

use longrun_core::apikey::Role;
use longrun_core::fingerprint::Fingerprint;
use longrun_core::{Id, IdempotencyKey, State, Timestamp};
use serde_json::Value;

/// An operation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub id: Id,
    pub tenant: String,
    pub kind: String,
    pub state: State,
    pub version: i64,
    pub attempt: i64,
    /// Dropped (None) once the operation ends, unless inputs are kept.
    pub input: Option<Value>,
    pub callback_url: Option<String>,
    pub deadline_at: Option<Timestamp>,
    pub budget_max_cost: Option<f64>,
    pub cost_units: f64,
    pub labels: BTreeMap<String, String>,
    pub progress: Option<Progress>,
    pub result: Option<Value>,
    pub error: Option<OperationError>,
    pub cancel: Option<CancelRequest>,
    pub cancellable: bool,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub updated_at: Timestamp,
    /// When the record itself will be removed; set when it becomes terminal.
    pub expires_at: Option<Timestamp>,
    /// The `Idempotency-Key` it was submitted with, if any; its record lives
    /// exactly as long as the operation's.
    pub idempotency_key: Option<String>,
    /// The published default artifact, when the result is one.
    pub artifact: Option<ArtifactRef>,
    /// Published artifacts with a name other than [`DEFAULT_ARTIFACT`].
    pub artifacts: BTreeMap<String, ArtifactRef>,
    /// The operation this one re-runs (`POST /v1/operations/{id}/reruns`).
    pub rerun_of: Option<Id>,
    /// Its re-runs, oldest first: read by `operation_get` only (`None`
    /// elsewhere: not read, not "none").
    pub reruns: Option<Vec<Id>>,
    /// When a pause of the running work was asked for and its worker has
    /// not answered yet (`desired_state` is then `paused` while `state` is
    /// still `running`).
    pub pause_requested_at: Option<Timestamp>,
}

impl Operation {
    /// Past its `expires_at`: gone to every reader from that instant on,
    /// whether or not the retention sweep has removed the record yet.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// A pause was asked of the worker holding (or taking) it and not
    /// answered yet: `desired_state` is `paused` while `state` is not.
    pub fn pause_requested(&self) -> bool {
        self.pause_requested_at.is_some() && matches!(self.state, State::Queued | State::Running)
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    pub completed_units: Option<f64>,
    pub total_units: Option<f64>,
    pub unit: Option<String>,
    pub phase: Option<String>,
    pub details: Option<Value>,
    pub updated_at: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OperationError {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CancelRequest {
    pub requested_at: Timestamp,
    /// The API key id (or `system`) that asked.
    pub requested_by: String,
    pub reason: Option<String>,
}

/// One entry of an operation's audit trail; `version` is unique per operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub operation_id: Id,
    pub version: i64,
    pub event_type: String,
    pub state: State,
    pub at: Timestamp,
    pub data: Value,
    /// The operation as it was at this version (its input left out).
    pub snapshot: Option<Operation>,
}

/// A committed change of an operation, as published to subscribers (and
/// what metrics are derived from).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub operation_id: Id,
    pub tenant: String,
    pub version: i64,
    /// The event type: `created`, `started`, `progress`, `succeeded`, …
    pub event_type: String,
    pub kind: String,
    pub state: State,
    pub attempt: i64,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub cancel_requested_at: Option<Timestamp>,
}

impl Change {
    /// The change `op` went through, as its event `event_type` records it.
    pub fn of(op: &Operation, event_type: &str) -> Self {
        Self {
            operation_id: op.id.clone(),
            tenant: op.tenant.clone(),
            version: op.version,
            event_type: event_type.to_owned(),
            kind: op.kind.clone(),
            state: op.state,
            attempt: op.attempt,
            created_at: op.created_at,
            started_at: op.started_at,
            completed_at: op.completed_at,
            cancel_requested_at: op.cancel.as_ref().map(|c| c.requested_at),
        }
    }

    const RESYNC: &'static str = "resync";

    /// Not a change but a warning that the feed may have missed some: a
    /// backend's notification connection was lost and is back. Subscribers
    /// re-read whatever they watch.
    pub fn resync() -> Self {
        Self {
            operation_id: Id::from_trusted(String::new()),
            tenant: String::new(),
            version: 0,
            event_type: Self::RESYNC.to_owned(),
            kind: String::new(),
            state: State::Queued,
            attempt: 0,
            created_at: Timestamp(0),
            started_at: None,
            completed_at: None,
            cancel_requested_at: None,
        }
    }

    pub fn is_resync(&self) -> bool {
        self.event_type == Self::RESYNC && self.operation_id.as_str().is_empty()
    }
}

/// What operators watch that no counter shows: ages and backlogs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backlog {
    /// (kind, state, created_at of the oldest) for queued and running work.
    pub oldest_active: Vec<(String, State, Timestamp)>,
    /// Records past their retention, not yet removed (results, operations, tombstones).
    pub retention_due: u64,
    /// Artifact objects waiting to be deleted.
    pub garbage_objects: u64,
    /// Webhook events due for an attempt.
    pub webhooks_due: u64,
    /// Webhook events still pending after at least one failed attempt.
    pub webhooks_failing: u64,
}

#[derive(Debug, Clone)]
pub struct AcceptParams {
    pub id: Id,
    pub tenant: String,
    pub kind: String,
    pub input: Value,
    pub callback_url: Option<String>,
    pub deadline_at: Option<Timestamp>,
    pub budget_max_cost: Option<f64>,
    pub labels: BTreeMap<String, String>,
    /// `None` only when the server's policy makes keys optional.
    pub idempotency: Option<(IdempotencyKey, Fingerprint)>,
    /// Uploads the input names: each lives at least as long as the operation.
    pub uploads: Vec<Id>,
    /// The operation this submission re-runs.
    pub rerun_of: Option<Id>,
    /// Start from `rerun_of`'s last checkpoint (copied in the same
    /// transaction), if it saved one.
    pub from_checkpoint: bool,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AcceptOutcome {
    Created(Operation),
    /// Same key, same canonical request: the original operation.
    Replayed(Operation),
    /// Same key, different request: nothing was created.
    KeyReused {
        operation_id: Id,
    },
}

#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// `None` lists every tenant's (the admin console only).
    pub tenant: Option<String>,
    pub state: Option<State>,
    pub kind: Option<String>,
    pub label: Option<(String, String)>,
    pub page_size: u32,
    /// Exclusive upper bound on the internal sequence number (newest first).
    pub before_seq: Option<i64>,
    /// Leave out operations past their `expires_at` at this instant (they
    /// answer `410` before the retention sweep removes them).
    pub visible_at: Option<Timestamp>,
    /// Created at or after this instant.
    pub created_from: Option<Timestamp>,
    /// Created before this instant.
    pub created_before: Option<Timestamp>,
}

#[derive(Debug, Clone)]
pub struct OperationPage {
    pub operations: Vec<Operation>,
    /// The cursor for the next page, if there may be one.
    pub next_before_seq: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct CancelParams {
    pub tenant: String,
    pub id: Id,
    pub requested_by: String,
    pub reason: Option<String>,
    pub if_match: Option<i64>,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// Was queued, is now `cancelled`.
    CancelledNow(Operation),
    /// Was running; the worker will be told.
    Requested(Operation),
    /// Running and already asked to cancel: unchanged.
    AlreadyRequested(Operation),
    /// Terminal: unchanged.
    AlreadyTerminal(Operation),
}

#[derive(Debug, Clone)]
pub struct ClaimParams {
    pub kinds: Vec<String>,
    pub max_tasks: u32,
    pub lease: Duration,
    pub worker_id: String,
    pub now: Timestamp,
}

/// A leased unit of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub operation_id: Id,
    pub tenant: String,
    pub kind: String,
    pub input: Value,
    pub attempt: i64,
    pub lease_token: String,
    pub lease_expires_at: Timestamp,
    pub deadline_at: Option<Timestamp>,
    pub budget_max_cost: Option<f64>,
    /// The last checkpoint a worker saved for this operation (in an earlier
    /// attempt, before a pause, or copied by a `from_checkpoint` re-run):
    /// where to resume.
    pub checkpoint: Option<Value>,
}

/// Largest checkpoint a worker may save, as JSON text.
pub const MAX_CHECKPOINT_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Default)]
pub struct ProgressUpdate {
    pub completed_units: Option<f64>,
    pub total_units: Option<f64>,
    pub unit: Option<String>,
    pub phase: Option<String>,
    pub details: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct HeartbeatParams {
    pub operation_id: Id,
    pub lease_token: String,
    pub progress: Option<ProgressUpdate>,
    /// Total cost so far (not an increment); never decreases.
    pub cost_units: Option<f64>,
    /// `Some(false)` marks the commit point.
    pub cancellable: Option<bool>,
    /// Where to resume from if this attempt ends early (a crash, a pause):
    /// replaces the stored one, without a new version.
    pub checkpoint: Option<Value>,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatAck {
    pub lease_expires_at: Timestamp,
    pub cancel_requested: bool,
    pub cancel_reason: Option<String>,
    /// A client asked to pause: save a checkpoint and report `paused`.
    pub pause_requested: bool,
    pub version: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        result: Option<Value>,
    },
    Failed {
        error: OperationError,
    },
    /// The worker acknowledged a cancellation.
    Cancelled,
    /// The worker stopped as a pause asked, leaving where to resume from
    /// (or keeping the last checkpoint it saved when `None`).
    Paused {
        checkpoint: Option<Value>,
    },
}

#[derive(Debug, Clone)]
pub struct FinishParams {
    pub operation_id: Id,
    pub lease_token: String,
    pub outcome: Outcome,
    /// The worker's last progress report, not yet stored (reports are
    /// coalesced): stored with the outcome, in the same transaction, without
    /// an event of its own.
    pub progress: Option<ProgressUpdate>,
    pub now: Timestamp,
}

#[derive(Debug, Clone)]
pub struct ReapParams {
    pub now: Timestamp,
    pub limit: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapCounts {
    pub requeued: u64,
    pub failed_outcome_unknown: u64,
    /// Cancellation had been requested and the worker vanished: ended as asked.
    pub ended_cancel_requested: u64,
    /// A pause had been requested and the worker vanished: paused as asked.
    pub paused: u64,
}

#[derive(Debug, Clone)]
pub struct ApiKeyCreateParams {
    pub id: Id,
    pub tenant: String,
    pub role: Role,
    pub secret_hash: [u8; 32],
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    pub id: Id,
    pub tenant: String,
    pub role: Role,
    pub secret_hash: Vec<u8>,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

/// A declared operation kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSpec {
    pub name: String,
    pub builtin: bool,
    pub rerun_safe: bool,
    pub max_attempts: i64,
    pub default_deadline_seconds: Option<i64>,
    pub max_deadline_seconds: Option<i64>,
    /// Running work may be paused (its workers save checkpoints and
    /// answer `pause_requested`).
    pub pausable: bool,
}

impl KindSpec {
    /// A kind as `longrun kinds set NAME` declares it without flags: not
    /// safe to re-run, three attempts, no deadlines, not pausable.
    pub fn declared(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            builtin: false,
            rerun_safe: false,
            max_attempts: 3,
            default_deadline_seconds: None,
            max_deadline_seconds: None,
            pausable: false,
        }
    }
}

/// Per-tenant limits (`longrun tenants set`). `None` means unlimited.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TenantLimits {
    pub name: String,
    /// Most operations not yet ended; more submissions get `quota_exceeded`.
    pub max_active: Option<i64>,
    /// Most operations running at once; claims skip the tenant beyond it.
    pub max_running: Option<i64>,
    /// Requests per second the API accepts from the tenant.
    pub rate: Option<f64>,
}

/// `PATCH /v1/operations/{id}`: change intent of a live operation.
#[derive(Debug, Clone)]
pub struct UpdateParams {
    pub tenant: String,
    pub id: Id,
    /// The version the client observed (required: `If-Match`).
    pub if_match: i64,
    /// `Some(None)` removes the deadline.
    pub deadline_at: Option<Option<Timestamp>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub now: Timestamp,
}

#[derive(Debug, Clone)]
pub struct EnforceParams {
    pub now: Timestamp,
    /// How long a worker has to acknowledge a cancellation the server asked
    /// for (deadline, budget) before the operation is ended without it.
    pub grace: Duration,
    pub limit: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnforceCounts {
    /// Queued (or waiting for a retry) past the deadline: failed, never started.
    pub expired_before_start: u64,
    /// Running past the deadline: cancellation requested from the worker.
    pub cancel_requested: u64,
    /// The worker did not acknowledge within the grace period: failed and fenced out.
    pub ended_without_ack: u64,
    /// Pauses of running work the worker did not honour within the grace
    /// period: withdrawn, recorded as `pause_not_honoured`.
    pub pause_not_honoured: u64,
}

/// A webhook event due for (another) delivery attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub event_id: Id,
    pub operation_id: Id,
    pub tenant: String,
    pub url: String,
    pub event_type: String,
    pub payload: String,
    /// Attempts made before this one.
    pub attempts: i64,
}

/// How one delivery attempt went.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    Delivered {
        status_code: u16,
    },
    /// Try again at `next_attempt_at`, or give up when it is `None`.
    Failed {
        status_code: Option<u16>,
        error: String,
        next_attempt_at: Option<Timestamp>,
    },
}

#[derive(Debug, Clone)]
pub struct AttemptParams {
    pub event_id: Id,
    /// 1-based number of this attempt.
    pub attempt: i64,
    pub outcome: AttemptOutcome,
    pub now: Timestamp,
    /// How long the attempt took, when it reached the network.
    pub latency_ms: Option<i64>,
}

/// One line of the delivery log.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub event_id: Id,
    pub event_type: String,
    pub attempt: i64,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub at: Timestamp,
    pub next_attempt_at: Option<Timestamp>,
    /// How long the attempt took.
    pub latency_ms: Option<i64>,
}

/// A published result artifact, as the operation shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRef {
    pub id: Id,
    pub content_type: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub expires_at: Timestamp,
}

/// What a client wants of an operation's run (`PATCH {"desired_state"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredState {
    Running,
    Paused,
}

/// Pauses or resumes an operation under `If-Match`.
#[derive(Debug, Clone)]
pub struct IntentParams {
    pub tenant: String,
    pub id: Id,
    pub desired: DesiredState,
    pub if_match: Option<i64>,
    pub now: Timestamp,
}

/// The name of an operation's default artifact (`result.artifact`).
pub const DEFAULT_ARTIFACT: &str = "default";

/// A stored result artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRecord {
    pub id: Id,
    pub operation_id: Id,
    pub tenant: String,
    /// [`DEFAULT_ARTIFACT`] or the name of a named artifact.
    pub name: String,
    pub storage_key: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// `uploaded`, `published` or `expired`.
    pub state: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
}

impl ResultRecord {
    /// Expired by the sweep, or past its `expires_at` and not swept yet.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.state == "expired" || self.expires_at.is_some_and(|at| at <= now)
    }
}

/// A worker's upload, recorded once the bytes are stored.
#[derive(Debug, Clone)]
pub struct ResultUploadParams {
    pub operation_id: Id,
    pub lease_token: String,
    /// [`DEFAULT_ARTIFACT`] or a name; an upload replaces the current
    /// attempt's earlier one of the same name and every earlier attempt's.
    pub name: String,
    pub result_id: Id,
    pub storage_key: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub sha256: String,
    /// The object was joined from the task's pieces of `name`
    /// ([`ArtifactPieceParams`]): they are done with (their objects become
    /// garbage unless this is one of them, or another operation shares it).
    pub joins_pieces: bool,
    pub now: Timestamp,
}

/// A stored piece of a resumable artifact `name` of a task (fenced by its
/// lease), starting at `offset`. The pieces before must end exactly at
/// `offset` (else `UploadOffsetMismatch` with where they end); pieces at or
/// past it are replaced: an attempt resuming from a checkpoint writes again
/// from there.
#[derive(Debug, Clone)]
pub struct ArtifactPieceParams {
    pub operation_id: Id,
    pub lease_token: String,
    pub name: String,
    pub offset: i64,
    pub piece: UploadChunk,
    pub now: Timestamp,
}

#[derive(Debug, Clone)]
pub struct RetentionParams {
    pub now: Timestamp,
    /// How long a removed operation answers `410 gone` (and keeps its key).
    pub tombstone_retention: Duration,
    /// How long finished webhook deliveries and their attempt log are kept.
    pub delivery_retention: Duration,
    /// Most rows of each kind handled per call.
    pub limit: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionCounts {
    pub results_expired: u64,
    pub operations_removed: u64,
    pub tombstones_removed: u64,
    pub deliveries_removed: u64,
    /// Uploads past their expiry that no operation names any more.
    pub uploads_removed: u64,
}

impl RetentionCounts {
    pub fn total(&self) -> u64 {
        self.results_expired
            + self.operations_removed
            + self.tombstones_removed
            + self.deliveries_removed
            + self.uploads_removed
    }
}

/// What `longrun tenants delete` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantDeleteCounts {
    pub operations: u64,
    pub results: u64,
    pub keys: u64,
    pub deliveries: u64,
    pub uploads: u64,
}

/// One stored piece of an upload, in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UploadChunk {
    pub storage_key: String,
    pub size_bytes: i64,
}

/// An upload: an input artifact a client streams (and may resume) before
/// naming it in a submission.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadRecord {
    pub id: Id,
    pub tenant: String,
    pub content_type: String,
    /// Bytes received so far; the size once complete.
    pub offset: i64,
    pub complete: bool,
    /// Lowercase hex SHA-256 of the whole upload, once complete.
    pub sha256: Option<String>,
    /// The digest the client declared for the whole upload, checked when it completes.
    pub expected_sha256: Option<String>,
    /// The stored pieces in order; exactly one once complete.
    pub chunks: Vec<UploadChunk>,
    pub created_at: Timestamp,
    /// When an upload no operation names is removed.
    pub expires_at: Timestamp,
    /// Named by an operation that still exists (it then lives as long as they do).
    pub referenced: bool,
}

impl UploadRecord {
    /// Complete, and either named by an operation or not yet expired.
    pub fn is_usable(&self, now: Timestamp) -> bool {
        self.complete && self.sha256.is_some() && (self.referenced || self.expires_at > now)
    }
}

#[derive(Debug, Clone)]
pub struct UploadCreateParams {
    pub id: Id,
    pub tenant: String,
    pub content_type: String,
    pub expected_sha256: Option<String>,
    pub now: Timestamp,
    pub expires_at: Timestamp,
}

/// Appends a stored piece at `offset`, which must be the upload's current
/// offset (else `UploadOffsetMismatch`, and nothing changes). `sha256` set
/// completes the upload: pass it only when `chunk` is the whole upload
/// (offset 0), else complete with [`UploadCompleteParams`].
#[derive(Debug, Clone)]
pub struct UploadAppendParams {
    pub tenant: String,
    pub id: Id,
    pub offset: i64,
    pub chunk: UploadChunk,
    pub sha256: Option<String>,
    /// A `Repr-Digest` sent with this request, if the upload had none yet.
    pub expected_sha256: Option<String>,
    pub now: Timestamp,
}

/// Completes an upload of `size_bytes` whose pieces were joined into
/// `object` (the old pieces become garbage). Refused with
/// `UploadOffsetMismatch` if the offset moved or it is already complete.
#[derive(Debug, Clone)]
pub struct UploadCompleteParams {
    pub tenant: String,
    pub id: Id,
    pub size_bytes: i64,
    pub object: UploadChunk,
    pub sha256: String,
    pub now: Timestamp,
}

/// A console session: the SHA-256 of the cookie's token (the token itself
/// is never stored) and the API key it was opened with.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    pub token_hash: Vec<u8>,
    pub key_id: Id,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

/// Queued and running work of one kind in one state: how much, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveGroup {
    pub kind: String,
    pub state: State,
    pub count: u64,
    pub oldest_created_at: Timestamp,
}

/// A live lease, as the console's workers page shows it.
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    pub operation_id: Id,
    pub tenant: String,
    pub kind: String,
    pub worker_id: Option<String>,
    pub attempt: i64,
    pub lease_expires_at: Timestamp,
    /// When the lease was last taken or extended (its expiry less its length).
    pub last_heartbeat_at: Option<Timestamp>,
    pub progress: Option<Progress>,
}

/// A tenant's limits and how much of them it uses now.
#[derive(Debug, Clone)]
pub struct TenantUsage {
    pub limits: TenantLimits,
    /// Operations queued or running.
    pub active: u64,
    /// Operations a worker holds.
    pub running: u64,
}

/// The idempotency record an operation was submitted under.
#[derive(Debug, Clone)]
pub struct IdempotencyRecord {
    pub key: String,
    pub kind: String,
    pub created_at: Timestamp,
    /// Submissions answered with this operation after the first.
    pub replays: i64,
}
