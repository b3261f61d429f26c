//! Records and params of the [`Store`](crate::Store) trait. Storage types, not
//! wire types: the HTTP edge maps them to the public representation.

use std::collections::BTreeMap;
use std::time::Duration;

use longrun_core::apikey::Role;
use longrun_core::fingerprint::Fingerprint;
use longrun_core::task::{OperationError, Outcome, ProgressUpdate};
use longrun_core::{Id, IdempotencyKey, State, Timestamp};
use serde_json::Value;

/// An operation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    /// `op_…`
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The operation kind.
    pub kind: String,
    /// The operation's state.
    pub state: State,
    /// Moves by one with every change; the ETag.
    pub version: i64,
    /// Attempts started so far (1 for the first).
    pub attempt: i64,
    /// Dropped (None) once the operation ends, unless inputs are kept.
    pub input: Option<Value>,
    /// Where its webhooks go.
    pub callback_url: Option<String>,
    /// When it fails with `deadline_exceeded` if not finished.
    pub deadline_at: Option<Timestamp>,
    /// The budget: most cost units the work may report.
    pub budget_max_cost: Option<f64>,
    /// Cost reported so far.
    pub cost_units: f64,
    /// Labels to filter lists by.
    pub labels: BTreeMap<String, String>,
    /// The latest stored progress.
    pub progress: Option<Progress>,
    /// The inline result (or the members beside its artifacts).
    pub result: Option<Value>,
    /// Why it failed.
    pub error: Option<OperationError>,
    /// The cancel request, once made.
    pub cancel: Option<CancelRequest>,
    /// Whether a cancel request can still stop the work (`false` past the commit point).
    pub cancellable: bool,
    /// When it was created.
    pub created_at: Timestamp,
    /// When the first attempt started.
    pub started_at: Option<Timestamp>,
    /// When it became terminal.
    pub completed_at: Option<Timestamp>,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// When the record itself will be removed; set when it becomes terminal.
    pub expires_at: Option<Timestamp>,
    /// The `Idempotency-Key` it was submitted with, if any; its record lives
    /// exactly as long as the operation's.
    pub idempotency_key: Option<String>,
    /// The published default artifact, when the result is one.
    pub artifact: Option<ArtifactRef>,
    /// Published artifacts with a name other than [`DEFAULT_ARTIFACT`](crate::DEFAULT_ARTIFACT).
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
    /// When it may start (`None`: as soon as a worker is free).
    pub not_before: Option<Timestamp>,
    /// Higher is claimed first within its tenant ([`PRIORITY_DEFAULT`] when not given).
    pub priority: i16,
}

/// When the task of work that may start at `not_before` becomes claimable,
/// queued at `now`: its start, or now if that has passed. The one rule for
/// acceptance, a moved start and a resume.
pub fn available_at(not_before: Option<Timestamp>, now: Timestamp) -> Timestamp {
    not_before.map_or(now, |at| at.max(now))
}

/// The lowest priority a submission may ask for.
pub const PRIORITY_MIN: i16 = 1;
/// The highest priority a submission may ask for.
pub const PRIORITY_MAX: i16 = 9;
/// The priority of a submission that names none: the middle of the range.
pub const PRIORITY_DEFAULT: i16 = 5;

impl Operation {
    /// The schedule this operation is a firing of (its idempotency key
    /// says so: `schedule:{id}:{fire_time}`, a key prefix clients may not use).
    pub fn schedule_id(&self) -> Option<&str> {
        self.idempotency_key
            .as_deref()
            .and_then(longrun_core::schedule::schedule_id_of_key)
    }

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

/// Progress as stored: the latest report, merged field by field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
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
    /// When it last changed.
    pub updated_at: Option<Timestamp>,
}

/// A cancel request: who asked, when, why.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelRequest {
    /// When it was asked for.
    pub requested_at: Timestamp,
    /// The API key id (or `system`) that asked.
    pub requested_by: String,
    /// The reason given.
    pub reason: Option<String>,
}

/// One entry of an operation's audit trail; `version` is unique per operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The operation.
    pub operation_id: Id,
    /// The version this event made.
    pub version: i64,
    /// The event's type (`created`, `started`, `progress`, `succeeded`, …).
    pub event_type: String,
    /// The operation's state after it.
    pub state: State,
    /// When.
    pub at: Timestamp,
    /// What changed.
    pub data: Value,
    /// The operation as it was at this version (its input left out).
    pub snapshot: Option<Operation>,
}

/// A committed change of an operation, as published to subscribers (and
/// what metrics are derived from).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The operation.
    pub operation_id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The version the change made.
    pub version: i64,
    /// The event type: `created`, `started`, `progress`, `succeeded`, …
    pub event_type: String,
    /// The operation kind.
    pub kind: String,
    /// The operation's state after it.
    pub state: State,
    /// Attempts started so far (1 for the first).
    pub attempt: i64,
    /// When it was created.
    pub created_at: Timestamp,
    /// When the first attempt started.
    pub started_at: Option<Timestamp>,
    /// When it became terminal.
    pub completed_at: Option<Timestamp>,
    /// When cancellation was requested.
    pub cancel_requested_at: Option<Timestamp>,
    /// The operation has a callback URL, so its transitions queue webhooks
    /// (what wakes the webhook deliverer; other changes do not).
    pub callback: bool,
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
            callback: op.callback_url.is_some(),
        }
    }

    /// The other operation whose representation the change `op` went
    /// through alters without a version of its own: a re-run's source,
    /// which lists its re-runs. (What read caches must forget with it.)
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn also_alters<'a>(op: &'a Operation, event_type: &str) -> Option<&'a Id> {
        op.rerun_of.as_ref().filter(|_| event_type == "created")
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
            callback: false,
        }
    }

    /// Whether this is [`Change::resync`], not a change.
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

/// A submission, checked and ready to store (`operation_accept`).
#[derive(Debug, Clone)]
pub struct AcceptParams {
    /// The new operation's id (made by the caller).
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The operation kind.
    pub kind: String,
    /// Its input (already checked by the kind).
    pub input: Value,
    /// Where its webhooks go.
    pub callback_url: Option<String>,
    /// When it fails with `deadline_exceeded` if not finished.
    pub deadline_at: Option<Timestamp>,
    /// The budget: most cost units the work may report.
    pub budget_max_cost: Option<f64>,
    /// Its labels (already checked).
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
    /// When it may start (`None`: at once).
    pub not_before: Option<Timestamp>,
    /// Its priority ([`PRIORITY_MIN`]..=[`PRIORITY_MAX`]).
    pub priority: i16,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

impl AcceptParams {
    /// Whether this submission may be leased as it is accepted
    /// (`Store::operation_accept_leased`): not one with a callback (its
    /// start would queue a webhook), uploads or a re-run source (a
    /// checkpoint to copy), which a claim handles.
    pub fn may_be_handed_off(&self) -> bool {
        self.callback_url.is_none()
            && self.rerun_of.is_none()
            && self.uploads.is_empty()
            && self.not_before.is_none_or(|at| at <= self.now)
    }

    /// When its task becomes claimable (see [`available_at`]).
    pub fn available_at(&self) -> Timestamp {
        available_at(self.not_before, self.now)
    }
}

/// What a submission came to.
#[derive(Debug, Clone, PartialEq)]
pub enum AcceptOutcome {
    /// A new operation.
    Created(Operation),
    /// Same key, same canonical request: the original operation.
    Replayed(Operation),
    /// Same key, different request: nothing was created.
    KeyReused {
        /// The operation the key made.
        operation_id: Id,
    },
}

/// A page of a list (`operation_list`).
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// `None` lists every tenant's (the admin console only).
    pub tenant: Option<String>,
    /// Only operations in this state.
    pub state: Option<State>,
    /// Only operations of this kind.
    pub kind: Option<String>,
    /// Only operations with this label (key, value).
    pub label: Option<(String, String)>,
    /// Most operations in the page.
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

/// A page of operations.
#[derive(Debug, Clone)]
pub struct OperationPage {
    /// The operations, newest first.
    pub operations: Vec<Operation>,
    /// The cursor for the next page, if there may be one.
    pub next_before_seq: Option<i64>,
}

/// A cancel request (`operation_cancel`).
#[derive(Debug, Clone)]
pub struct CancelParams {
    /// The owning tenant.
    pub tenant: String,
    /// The operation.
    pub id: Id,
    /// The API key id that asked.
    pub requested_by: String,
    /// The client's reason.
    pub reason: Option<String>,
    /// The version the client observed (`If-Match`): another one refuses the call.
    pub if_match: Option<i64>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// What a cancel request came to.
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

/// A claim (`task_claim`): lease up to `max_tasks` queued tasks of `kinds`.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// The kinds the worker runs.
    pub kinds: Vec<String>,
    /// At most this many tasks.
    pub max_tasks: u32,
    /// How long each lease lasts without a heartbeat.
    pub lease: Duration,
    /// Names the worker in leases and logs.
    pub worker_id: String,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A worker waiting in a claim, to which a new submission's task may be
/// leased as it is accepted (`Store::operation_accept_leased`).
#[derive(Debug, Clone)]
pub struct LeaseTo {
    /// Names the worker in the lease and the `started` event.
    pub worker_id: String,
    /// How long the lease lasts without a heartbeat.
    pub lease: Duration,
}

/// A leased unit of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The operation.
    pub operation_id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The operation kind.
    pub kind: String,
    /// The submission's input.
    pub input: Value,
    /// Attempts started so far (1 for the first).
    pub attempt: i64,
    /// The task's lease token: only the current lease's calls are applied.
    pub lease_token: String,
    /// When the lease ends without a heartbeat.
    pub lease_expires_at: Timestamp,
    /// When it fails with `deadline_exceeded` if not finished.
    pub deadline_at: Option<Timestamp>,
    /// The budget: most cost units the work may report.
    pub budget_max_cost: Option<f64>,
    /// The last checkpoint a worker saved for this operation (in an earlier
    /// attempt, before a pause, or copied by a `from_checkpoint` re-run):
    /// where to resume.
    pub checkpoint: Option<Value>,
}

/// A heartbeat (`task_heartbeat`): renews the lease.
#[derive(Debug, Clone)]
pub struct HeartbeatParams {
    /// The operation.
    pub operation_id: Id,
    /// The task's lease token: only the current lease's calls are applied.
    pub lease_token: String,
    /// Progress to store (coalesced by the caller).
    pub progress: Option<ProgressUpdate>,
    /// Total cost so far (not an increment); never decreases.
    pub cost_units: Option<f64>,
    /// `Some(false)` marks the commit point.
    pub cancellable: Option<bool>,
    /// Where to resume from if this attempt ends early (a crash, a pause):
    /// replaces the stored one, without a new version.
    pub checkpoint: Option<Value>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// An outcome (`task_finish`), fenced by the lease token.
#[derive(Debug, Clone)]
pub struct FinishParams {
    /// The operation.
    pub operation_id: Id,
    /// The task's lease token: only the current lease's calls are applied.
    pub lease_token: String,
    /// What the worker reports.
    pub outcome: Outcome,
    /// The worker's last progress report, not yet stored (reports are
    /// coalesced): stored with the outcome, in the same transaction, without
    /// an event of its own.
    pub progress: Option<ProgressUpdate>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A reaper round (`task_reap`).
#[derive(Debug, Clone)]
pub struct ReapParams {
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
    /// Most lapsed leases handled in this call.
    pub limit: u32,
}

/// What a reaper round did with lapsed leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapCounts {
    /// Kinds safe to re-run, with attempts left: queued again.
    pub requeued: u64,
    /// The others: failed with `outcome_unknown`.
    pub failed_outcome_unknown: u64,
    /// Cancellation had been requested and the worker vanished: ended as asked.
    pub ended_cancel_requested: u64,
    /// A pause had been requested and the worker vanished: paused as asked.
    pub paused: u64,
}

/// A new API key (`api_key_create`): only the secret's hash is stored.
#[derive(Debug, Clone)]
pub struct ApiKeyCreateParams {
    /// `key_…`
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// What the key may do.
    pub role: Role,
    /// SHA-256 of the key's secret.
    pub secret_hash: [u8; 32],
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// An API key as stored (the secret's hash, never the secret).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    /// `key_…`
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// What the key may do.
    pub role: Role,
    /// SHA-256 of the key's secret.
    pub secret_hash: Vec<u8>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was revoked.
    pub revoked_at: Option<Timestamp>,
}

/// A declared operation kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSpec {
    /// The kind's name.
    pub name: String,
    /// Declared by the server itself (`sleep`, `export`, `import`).
    pub builtin: bool,
    /// Running it twice is harmless: a lost worker's task is retried.
    pub rerun_safe: bool,
    /// Attempts in all, the first included.
    pub max_attempts: i64,
    /// The deadline of a submission that names none.
    pub default_deadline_seconds: Option<i64>,
    /// The longest deadline a submission may name.
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
    /// The tenant.
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
    /// The owning tenant.
    pub tenant: String,
    /// The operation.
    pub id: Id,
    /// The version the client observed (required: `If-Match`).
    pub if_match: i64,
    /// `Some(None)` removes the deadline.
    pub deadline_at: Option<Option<Timestamp>>,
    /// New labels, replacing the old ones whole.
    pub labels: Option<BTreeMap<String, String>>,
    /// A new start time, only while the operation is queued or paused;
    /// `Some(None)` lets it start at once.
    pub not_before: Option<Option<Timestamp>>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// An enforcer round (`operation_enforce`).
#[derive(Debug, Clone)]
pub struct EnforceParams {
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
    /// How long a worker has to acknowledge a cancellation the server asked
    /// for (deadline, budget) before the operation is ended without it.
    pub grace: Duration,
    /// Most operations handled in this call.
    pub limit: u32,
}

/// What an enforcer round did.
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
    /// The event's id (the `webhook-id`, the same on every attempt).
    pub event_id: Id,
    /// The operation it is about.
    pub operation_id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The receiver's URL.
    pub url: String,
    /// `operation.{state}` or `operation.resumed`.
    pub event_type: String,
    /// The body, signed as it is.
    pub payload: String,
    /// Attempts made before this one.
    pub attempts: i64,
}

/// How one delivery attempt went.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    /// The receiver answered 2xx.
    Delivered {
        /// What the receiver answered, if it answered.
        status_code: u16,
    },
    /// Try again at `next_attempt_at`, or give up when it is `None`.
    Failed {
        /// What the receiver answered, if it answered.
        status_code: Option<u16>,
        /// Why the attempt failed.
        error: String,
        /// When the next attempt is due; `None` once delivered or given up.
        next_attempt_at: Option<Timestamp>,
    },
}

/// A delivery attempt to record (`webhook_record_attempt`).
#[derive(Debug, Clone)]
pub struct AttemptParams {
    /// The event's id (the `webhook-id`, the same on every attempt).
    pub event_id: Id,
    /// 1-based number of this attempt.
    pub attempt: i64,
    /// How it went.
    pub outcome: AttemptOutcome,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
    /// How long the attempt took, when it reached the network.
    pub latency_ms: Option<i64>,
}

/// One line of the delivery log.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// The event's id (the `webhook-id`, the same on every attempt).
    pub event_id: Id,
    /// The event's type (`created`, `started`, `progress`, `succeeded`, …).
    pub event_type: String,
    /// 1 for the first attempt.
    pub attempt: i64,
    /// What the receiver answered.
    pub status_code: Option<u16>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// When it was made.
    pub at: Timestamp,
    /// When the next attempt is due; `None` once delivered or given up.
    pub next_attempt_at: Option<Timestamp>,
    /// How long the attempt took.
    pub latency_ms: Option<i64>,
}

/// A published result artifact, as the operation shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRef {
    /// `res_…`
    pub id: Id,
    /// Its content type.
    pub content_type: String,
    /// Its size in bytes.
    pub size_bytes: i64,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
    /// When it is removed.
    pub expires_at: Timestamp,
}

/// What a client wants of an operation's run (`PATCH {"desired_state"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredState {
    /// Run (or resume) the work.
    Running,
    /// Hold the work back.
    Paused,
}

/// Pauses or resumes an operation under `If-Match`.
#[derive(Debug, Clone)]
pub struct IntentParams {
    /// The owning tenant.
    pub tenant: String,
    /// Its id.
    pub id: Id,
    /// What the client wants: `running` or `paused`.
    pub desired: DesiredState,
    /// The version the client observed (`If-Match`): another one refuses the call.
    pub if_match: Option<i64>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A stored result artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRecord {
    /// `res_…`
    pub id: Id,
    /// The operation it is a result of.
    pub operation_id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// [`DEFAULT_ARTIFACT`](crate::DEFAULT_ARTIFACT) or the name of a named artifact.
    pub name: String,
    /// Where its bytes are in the artifact store.
    pub storage_key: String,
    /// Its content type.
    pub content_type: String,
    /// Its size in bytes.
    pub size_bytes: i64,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
    /// `uploaded`, `published` or `expired`.
    pub state: String,
    /// When it was stored.
    pub created_at: Timestamp,
    /// When it expires (`410 result_expired` after); set when published.
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
    /// The operation.
    pub operation_id: Id,
    /// The task's lease token: only the current lease's calls are applied.
    pub lease_token: String,
    /// [`DEFAULT_ARTIFACT`](crate::DEFAULT_ARTIFACT) or a name; an upload replaces the current
    /// attempt's earlier one of the same name and every earlier attempt's.
    pub name: String,
    /// The new result's id (`res_…`).
    pub result_id: Id,
    /// Where its bytes are in the artifact store.
    pub storage_key: String,
    /// Its content type.
    pub content_type: String,
    /// Its size in bytes.
    pub size_bytes: i64,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
    /// The object was joined from the task's pieces of `name`
    /// ([`ArtifactPieceParams`]): they are done with (their objects become
    /// garbage unless this is one of them, or another operation shares it).
    pub joins_pieces: bool,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A stored piece of a resumable artifact `name` of a task (fenced by its
/// lease), starting at `offset`. The pieces before must end exactly at
/// `offset` (else `UploadOffsetMismatch` with where they end); pieces at or
/// past it are replaced: an attempt resuming from a checkpoint writes again
/// from there.
#[derive(Debug, Clone)]
pub struct ArtifactPieceParams {
    /// The operation.
    pub operation_id: Id,
    /// The task's lease token: only the current lease's calls are applied.
    pub lease_token: String,
    /// The artifact's name.
    pub name: String,
    /// Where the piece starts in the artifact.
    pub offset: i64,
    /// The stored piece.
    pub piece: UploadChunk,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A retention pass (`retention_sweep`).
#[derive(Debug, Clone)]
pub struct RetentionParams {
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
    /// How long a removed operation answers `410 gone` (and keeps its key).
    pub tombstone_retention: Duration,
    /// How long finished webhook deliveries and their attempt log are kept.
    pub delivery_retention: Duration,
    /// Most rows of each kind handled per call.
    pub limit: u32,
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionCounts {
    /// Result artifacts past their lifetime, marked expired (their objects become garbage).
    pub results_expired: u64,
    /// Terminal operations past their retention, removed (a tombstone stays).
    pub operations_removed: u64,
    /// Tombstones past their retention, removed.
    pub tombstones_removed: u64,
    /// Finished webhook deliveries (and their attempts) removed.
    pub deliveries_removed: u64,
    /// Uploads past their expiry that no operation names any more.
    pub uploads_removed: u64,
}

impl RetentionCounts {
    /// Rows removed in all.
    pub fn total(&self) -> u64 {
        self.results_expired
            + self.operations_removed
            + self.tombstones_removed
            + self.deliveries_removed
            + self.uploads_removed
    }
}

impl std::ops::AddAssign for RetentionCounts {
    /// Sums two passes' counts, field by field.
    fn add_assign(&mut self, other: Self) {
        self.results_expired += other.results_expired;
        self.operations_removed += other.operations_removed;
        self.tombstones_removed += other.tombstones_removed;
        self.deliveries_removed += other.deliveries_removed;
        self.uploads_removed += other.uploads_removed;
    }
}

/// What one upkeep of the history's partitions did (PostgreSQL, schema 16;
/// a store that keeps its history in one table does nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryUpkeep {
    /// Partitions made ahead.
    pub partitions_created: u64,
    /// Partitions dropped, no operation of their range remaining.
    pub partitions_dropped: u64,
    /// Events of removed operations that had landed outside every
    /// partition, deleted.
    pub strays_removed: u64,
    /// Steps (making partitions ahead, dropping one) left for the next
    /// pass: their lock was not granted within 100 ms beside the load, or
    /// a statement ran past its second.
    pub steps_deferred: u64,
}

/// What one upkeep of the webhook deliveries' partitions did (PostgreSQL,
/// schema 19; a store that keeps deliveries in one table does nothing:
/// retention removed them row by row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveriesUpkeep {
    /// Partitions (a day of deliveries and their attempts) made ahead.
    pub partitions_created: u64,
    /// Partitions dropped: their day ended a delivery retention ago and
    /// none of their deliveries is pending.
    pub partitions_dropped: u64,
    /// Deliveries that went with the dropped partitions.
    pub deliveries_removed: u64,
    /// Steps left for the next pass, as in [`HistoryUpkeep::steps_deferred`].
    pub steps_deferred: u64,
}

/// What `longrun tenants delete` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantDeleteCounts {
    /// Operations removed.
    pub operations: u64,
    /// Result records removed (their objects become garbage).
    pub results: u64,
    /// API keys removed.
    pub keys: u64,
    /// Webhook deliveries removed.
    pub deliveries: u64,
    /// Uploads removed.
    pub uploads: u64,
}

/// One stored piece of an upload, in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UploadChunk {
    /// Where the piece's bytes are in the artifact store.
    pub storage_key: String,
    /// The piece's size.
    pub size_bytes: i64,
}

/// An upload: an input artifact a client streams (and may resume) before
/// naming it in a submission.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadRecord {
    /// `upl_…`
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// As the creation's `Content-Type` said.
    pub content_type: String,
    /// Bytes received so far; the size once complete.
    pub offset: i64,
    /// Whether every byte was received.
    pub complete: bool,
    /// Lowercase hex SHA-256 of the whole upload, once complete.
    pub sha256: Option<String>,
    /// The digest the client declared for the whole upload, checked when it completes.
    pub expected_sha256: Option<String>,
    /// The stored pieces in order; exactly one once complete.
    pub chunks: Vec<UploadChunk>,
    /// When it was created.
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

/// A new upload (`upload_create`).
#[derive(Debug, Clone)]
pub struct UploadCreateParams {
    /// The new upload's id (`upl_…`).
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// As the creation's `Content-Type` said.
    pub content_type: String,
    /// The digest the client declared, checked when it completes.
    pub expected_sha256: Option<String>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
    /// When it goes if no operation names it.
    pub expires_at: Timestamp,
}

/// Appends a stored piece at `offset`, which must be the upload's current
/// offset (else `UploadOffsetMismatch`, and nothing changes). `sha256` set
/// completes the upload: pass it only when `chunk` is the whole upload
/// (offset 0), else complete with [`UploadCompleteParams`].
#[derive(Debug, Clone)]
pub struct UploadAppendParams {
    /// The owning tenant.
    pub tenant: String,
    /// The upload.
    pub id: Id,
    /// Where the piece starts: must be the upload's current offset.
    pub offset: i64,
    /// The stored piece.
    pub chunk: UploadChunk,
    /// Set when the piece is the whole upload: completes it.
    pub sha256: Option<String>,
    /// A `Repr-Digest` sent with this request, if the upload had none yet.
    pub expected_sha256: Option<String>,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// Completes an upload of `size_bytes` whose pieces were joined into
/// `object` (the old pieces become garbage). Refused with
/// `UploadOffsetMismatch` if the offset moved or it is already complete.
#[derive(Debug, Clone)]
pub struct UploadCompleteParams {
    /// The owning tenant.
    pub tenant: String,
    /// The upload.
    pub id: Id,
    /// The whole upload's size; must be the current offset.
    pub size_bytes: i64,
    /// The joined object.
    pub object: UploadChunk,
    /// Lowercase hex SHA-256 of the whole upload.
    pub sha256: String,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// A request for the right to append to an upload (see
/// [`crate::Store::upload_append_lease`]).
#[derive(Debug, Clone)]
pub struct AppendLeaseParams {
    /// The owning tenant.
    pub tenant: String,
    /// The upload.
    pub id: Id,
    /// The request's own token (random): the same token renews.
    pub token: String,
    /// Until when it holds the right (renewed while the body streams).
    pub until: Timestamp,
    /// The instant of the call (callers pass time in; the store reads no clock).
    pub now: Timestamp,
}

/// What a request for the right to append got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendLease {
    /// The caller holds it now.
    Held,
    /// Another request holds it, until then at the latest.
    Busy {
        /// When the other request's right ends unless it renews it.
        until: Timestamp,
    },
}

/// A console session: the SHA-256 of the cookie's token (the token itself
/// is never stored) and the API key it was opened with.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    /// SHA-256 of the cookie's token.
    pub token_hash: Vec<u8>,
    /// The API key it was opened with.
    pub key_id: Id,
    /// When it was opened.
    pub created_at: Timestamp,
    /// When it stops working.
    pub expires_at: Timestamp,
}

/// Queued and running work of one kind in one state: how much, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveGroup {
    /// The kind.
    pub kind: String,
    /// `queued` or `running`.
    pub state: State,
    /// Operations in the group.
    pub count: u64,
    /// When the oldest of them was created.
    pub oldest_created_at: Timestamp,
}

/// A live lease, as the console's workers page shows it.
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    /// The operation.
    pub operation_id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// The operation kind.
    pub kind: String,
    /// The worker holding it.
    pub worker_id: Option<String>,
    /// Attempts started so far (1 for the first).
    pub attempt: i64,
    /// When the lease ends without a heartbeat.
    pub lease_expires_at: Timestamp,
    /// When the lease was last taken or extended (its expiry less its length).
    pub last_heartbeat_at: Option<Timestamp>,
    /// The operation's latest stored progress.
    pub progress: Option<Progress>,
}

/// A tenant's limits and how much of them it uses now.
#[derive(Debug, Clone)]
pub struct TenantUsage {
    /// The tenant's limits.
    pub limits: TenantLimits,
    /// Operations queued or running.
    pub active: u64,
    /// Operations a worker holds.
    pub running: u64,
}

/// The idempotency record an operation was submitted under.
#[derive(Debug, Clone)]
pub struct IdempotencyRecord {
    /// The `Idempotency-Key`.
    pub key: String,
    /// The kind of the operation it made.
    pub kind: String,
    /// When it was first used.
    pub created_at: Timestamp,
    /// Submissions answered with this operation after the first.
    pub replays: i64,
}

/// A schedule as stored: its definition as the API took it, and what the
/// firing needs to find it when due and to fence its changes.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// `sch_…`
    pub id: Id,
    /// The owning tenant.
    pub tenant: String,
    /// Moves by one with every change (a firing's too); the ETag.
    pub version: i64,
    /// A paused schedule does not fire.
    pub paused: bool,
    /// The definition (kind, input, cron, time zone, overlap, …), as JSON.
    pub spec: Value,
    /// The next firing time; `None` when there is none.
    pub next_fire_at: Option<Timestamp>,
    /// The operation of the latest firing that started one.
    pub last_operation_id: Option<String>,
    /// A firing held back by `buffer_one` until the running one ends.
    pub buffered_fire_at: Option<Timestamp>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// What one firing time of a schedule became.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleFire {
    /// The schedule.
    pub schedule_id: Id,
    /// Its tenant.
    pub tenant: String,
    /// The firing time (a trigger's: when it was asked).
    pub fire_time: Timestamp,
    /// The operation it started, if it started one.
    pub operation_id: Option<String>,
    /// What happened to it.
    pub decision: longrun_core::schedule::FireDecision,
    /// When this was recorded.
    pub recorded_at: Timestamp,
}
