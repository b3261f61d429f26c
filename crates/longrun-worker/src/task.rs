//! One [`Handler`] trait and the [`TaskContext`] it runs with.
//!
//! The context reports progress and cost, exposes cancellation (a future that
//! resolves when cancel is requested, and a cheap check), marks the commit
//! point, and carries the operation id: a stable idempotency token a handler
//! can pass to external systems so that a re-run does not repeat an effect.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::Id;
use longrun_core::task::{DEFAULT_ARTIFACT, HeartbeatAck, OperationError, Outcome, ProgressUpdate};
use longrun_core::validate::Invalid;
use serde_json::Value;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, watch};

use crate::error::WorkerError;

/// A stream of bytes: an artifact's body, an upload's content.
pub type ByteReader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// How a handler's run ended, other than with a result.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Worth another attempt (if the kind has attempts left).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Final: the operation fails with this code.
    #[error("{code}: {message}")]
    Fatal {
        /// The operation's `error.code`.
        code: String,
        /// Its `error.message`.
        message: String,
    },
    /// The handler stopped because cancellation was requested.
    #[error("cancelled")]
    Cancelled,
    /// The handler stopped because a pause was requested, after saving a
    /// checkpoint ([`TaskContext::save_checkpoint`]) to resume from.
    #[error("paused")]
    Paused,
}

impl TaskError {
    /// A final failure with `code` and `message`.
    pub fn fatal(code: impl Into<String>, message: impl Into<String>) -> Self {
        TaskError::Fatal {
            code: code.into(),
            message: message.into(),
        }
    }

    fn into_outcome(self, checkpoint: Option<Value>) -> Outcome {
        match self {
            TaskError::Cancelled => Outcome::Cancelled,
            TaskError::Paused => Outcome::Paused { checkpoint },
            TaskError::Retryable(message) => Outcome::Failed {
                error: OperationError {
                    code: "worker_error".into(),
                    message,
                    retryable: true,
                },
            },
            TaskError::Fatal { code, message } => Outcome::Failed {
                error: OperationError {
                    code,
                    message,
                    retryable: false,
                },
            },
        }
    }
}

/// What a kind declares about itself.
#[derive(Debug, Clone)]
pub struct KindInfo {
    /// The kind's name.
    pub name: String,
    /// Running it twice is harmless, so a lost worker's task is retried.
    pub rerun_safe: bool,
    /// Attempts in all, the first included.
    pub max_attempts: i64,
    /// Its handler saves checkpoints and honours pause requests (and
    /// resumes from [`TaskContext::checkpoint`]).
    pub pausable: bool,
}

/// One operation kind's code.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// What the kind declares.
    fn info(&self) -> KindInfo;

    /// Cheap, deterministic checks of `input`, run at submission.
    fn validate(&self, input: &Value) -> Result<(), Invalid>;

    /// Runs one attempt: the result, or why it stopped.
    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError>;
}

/// How a task context talks to the server: directly to the store in process,
/// over HTTP for remote workers.
#[async_trait]
pub trait TaskLink: Send + Sync + 'static {
    /// Renews the lease, with progress, cost, the commit point and a checkpoint.
    async fn heartbeat(
        &self,
        progress: Option<ProgressUpdate>,
        cost_units: Option<f64>,
        cancellable: Option<bool>,
        checkpoint: Option<Value>,
    ) -> Result<HeartbeatAck, WorkerError>;

    /// Reports the outcome, with the last progress report not yet sent
    /// (stored with the outcome, in the same transaction).
    async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError>;

    /// Streams the task's result artifact `name` (`default` for
    /// `result.artifact`); `complete` (or the worker's own `fail`) publishes it.
    async fn upload(&self, name: &str, content_type: &str, body: ByteReader) -> Result<UploadedArtifact, WorkerError>;

    /// Streams an upload the operation's input names (fenced by the lease);
    /// `NotFound` when the input does not name it.
    async fn open_upload(&self, upload_id: &Id) -> Result<ByteReader, WorkerError>;

    /// Stores `body` as the piece of the resumable artifact `name` that
    /// starts at `offset` (pieces kept across attempts and pauses; those at
    /// or past `offset` are replaced); returns where the pieces now end.
    async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, WorkerError>;

    /// Joins the pieces of `name` (exactly `size_bytes` of them) into the
    /// artifact `name`, as [`TaskLink::upload`] would have stored it whole.
    async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, WorkerError>;
}

/// An artifact uploaded for the current task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedArtifact {
    /// `res_…`
    pub id: String,
    /// Its size.
    pub size_bytes: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
}

/// The default `--progress-interval`: at most one stored progress change
/// per operation per second.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Progress reports coalesced between two sends: the newest of each field.
struct Coalesced {
    /// When a report last went out (at first: when the task started).
    last_sent: tokio::time::Instant,
    pending: Option<ProgressUpdate>,
}

/// Folds `newer` into `older`: every field the newer report sets wins.
fn fold_progress(older: Option<ProgressUpdate>, newer: ProgressUpdate) -> ProgressUpdate {
    let Some(older) = older else { return newer };
    ProgressUpdate {
        completed_units: newer.completed_units.or(older.completed_units),
        total_units: newer.total_units.or(older.total_units),
        unit: newer.unit.or(older.unit),
        phase: newer.phase.or(older.phase),
        details: newer.details.or(older.details),
    }
}

/// What a running task is asked to do besides its work: each flag turns
/// `true` once (set by a heartbeat's answer, or sooner by an in-process
/// signal).
#[derive(Debug)]
pub struct StopFlags {
    /// Turns `true` on a cancel request.
    pub cancel: watch::Sender<bool>,
    /// Turns `true` on a pause request.
    pub pause: watch::Sender<bool>,
}

impl Default for StopFlags {
    fn default() -> Self {
        Self {
            cancel: watch::channel(false).0,
            pause: watch::channel(false).0,
        }
    }
}

/// Everything a handler gets for one task.
#[derive(Clone)]
pub struct TaskContext {
    operation_id: Id,
    attempt: i64,
    input: Value,
    link: Arc<dyn TaskLink>,
    flags: Arc<StopFlags>,
    cost: Arc<Mutex<f64>>,
    progress_interval: Duration,
    coalesced: Arc<std::sync::Mutex<Coalesced>>,
    /// The checkpoint to resume from, then the last one saved or noted.
    checkpoint: Arc<std::sync::Mutex<Option<Value>>>,
    /// A noted checkpoint not sent yet: it goes with the next heartbeat.
    unsent_checkpoint: Arc<std::sync::Mutex<Option<Value>>>,
}

impl TaskContext {
    /// `flags` turn `true` when cancellation or a pause is requested; the
    /// context also sets them itself when a heartbeat reports a request.
    pub fn new(operation_id: Id, attempt: i64, input: Value, link: Arc<dyn TaskLink>, flags: Arc<StopFlags>) -> Self {
        Self {
            operation_id,
            attempt,
            input,
            link,
            flags,
            checkpoint: Arc::new(std::sync::Mutex::new(None)),
            unsent_checkpoint: Arc::new(std::sync::Mutex::new(None)),
            cost: Arc::new(Mutex::new(0.0)),
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            // The interval counts from the start: work that ends within it
            // stores its progress only with its outcome.
            coalesced: Arc::new(std::sync::Mutex::new(Coalesced {
                last_sent: tokio::time::Instant::now(),
                pending: None,
            })),
        }
    }

    /// Sends at most one progress report per `interval`, counted from the
    /// start; the ones between are coalesced into the next send, the next
    /// keep-alive, or the outcome. Zero sends every report.
    pub fn with_progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval;
        self
    }

    /// Starts from `checkpoint`: the last one saved for the operation (by an
    /// earlier attempt, before a pause, or copied by a re-run).
    pub fn with_checkpoint(self, checkpoint: Option<Value>) -> Self {
        *self.checkpoint.lock().expect("checkpoint lock") = checkpoint;
        self
    }

    /// Where to resume from: the checkpoint this attempt was handed (or the
    /// last it saved); `None` for a fresh start.
    pub fn checkpoint(&self) -> Option<Value> {
        self.checkpoint.lock().expect("checkpoint lock").clone()
    }

    /// Saves where to resume from if this attempt ends early (a crash, a
    /// pause): stored with the operation before this returns, with any
    /// progress not sent yet. At most 64 KiB of JSON.
    pub async fn save_checkpoint(&self, checkpoint: Value) -> Result<(), TaskError> {
        check_checkpoint(&checkpoint)?;
        *self.checkpoint.lock().expect("checkpoint lock") = Some(checkpoint.clone());
        self.unsent_checkpoint.lock().expect("checkpoint lock").take();
        let progress = self.take_pending();
        match self.link.heartbeat(progress, None, None, Some(checkpoint)).await {
            Ok(ack) => {
                self.learn(&ack);
                Ok(())
            }
            Err(WorkerError::LeaseLost) => Err(TaskError::fatal("lease_lost", "the lease was lost")),
            // Unlike a progress report, a checkpoint that was not stored
            // must not be taken for one: the caller decides.
            Err(e) => Err(TaskError::Retryable(format!("the checkpoint was not saved: {e}"))),
        }
    }

    /// Notes where to resume from, without IO: it goes with the next
    /// heartbeat (at most one per progress interval) and with a `paused`
    /// report, so a crash costs at most an interval of work. Work that ends
    /// sooner never sends it.
    pub fn note_checkpoint(&self, checkpoint: Value) -> Result<(), TaskError> {
        check_checkpoint(&checkpoint)?;
        *self.checkpoint.lock().expect("checkpoint lock") = Some(checkpoint.clone());
        *self.unsent_checkpoint.lock().expect("checkpoint lock") = Some(checkpoint);
        Ok(())
    }

    fn take_unsent_checkpoint(&self) -> Option<Value> {
        self.unsent_checkpoint.lock().expect("checkpoint lock").take()
    }

    /// Cheap check, no IO: a client asked to pause; save a checkpoint and
    /// return [`TaskError::Paused`].
    pub fn is_pause_requested(&self) -> bool {
        *self.flags.pause.borrow()
    }

    /// Resolves when a pause is requested.
    pub async fn pause_requested(&self) {
        let mut rx = self.flags.pause.subscribe();
        let _ = rx.wait_for(|p| *p).await;
    }

    fn learn(&self, ack: &HeartbeatAck) {
        if ack.cancel_requested {
            self.flags.cancel.send_replace(true);
        }
        if ack.pause_requested {
            self.flags.pause.send_replace(true);
        }
    }

    /// Stable across attempts: pass it to external systems as an idempotency key.
    pub fn operation_id(&self) -> &Id {
        &self.operation_id
    }

    /// 1 for the first attempt.
    pub fn attempt(&self) -> i64 {
        self.attempt
    }

    /// The submission's input.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// Reports progress. Reports are coalesced: at most one is sent per
    /// progress interval, always the newest, and the last one is stored
    /// with the outcome, so a task that ends within the interval stores no
    /// progress change of its own. A report that is sent also renews the
    /// lease and learns of cancellation. A report that breaks a limit
    /// ([`crate::reports`]) is refused with `invalid_progress`, as the
    /// server would refuse it.
    pub async fn progress(&self, update: ProgressUpdate) -> Result<(), TaskError> {
        let update =
            crate::reports::check_progress(update).map_err(|e| TaskError::fatal("invalid_progress", e.to_string()))?;
        let due = {
            let mut state = self.coalesced.lock().expect("progress lock");
            let update = fold_progress(state.pending.take(), update);
            let now = tokio::time::Instant::now();
            let due = now.duration_since(state.last_sent) >= self.progress_interval;
            if due {
                state.last_sent = now;
                Some(update)
            } else {
                state.pending = Some(update);
                None
            }
        };
        match due {
            Some(update) => self.send(Some(update), None, None).await,
            None => Ok(()),
        }
    }

    /// The coalesced report not yet sent, if any; taking it marks a send.
    fn take_pending(&self) -> Option<ProgressUpdate> {
        let mut state = self.coalesced.lock().expect("progress lock");
        let pending = state.pending.take();
        if pending.is_some() {
            state.last_sent = tokio::time::Instant::now();
        }
        pending
    }

    fn has_pending(&self) -> bool {
        self.coalesced.lock().expect("progress lock").pending.is_some()
            || self.unsent_checkpoint.lock().expect("checkpoint lock").is_some()
    }

    /// Adds to the cost reported to the server. `units` must be a finite
    /// number, not below zero (else `invalid_cost`, and nothing is added).
    pub async fn add_cost(&self, units: f64) -> Result<(), TaskError> {
        crate::reports::check_cost(Some(units)).map_err(|e| TaskError::fatal("invalid_cost", e.to_string()))?;
        let total = {
            let mut cost = self.cost.lock().await;
            *cost += units;
            *cost
        };
        self.send(None, Some(total), None).await
    }

    /// Marks the commit point: from now on cancel requests are refused.
    pub async fn commit_point(&self) -> Result<(), TaskError> {
        self.send(None, None, Some(false)).await
    }

    /// Streams the result artifact from `body` (a file, a pipe, a duplex the
    /// handler writes into); `complete` publishes it. Dropping the returned
    /// future mid-way leaves nothing behind.
    pub async fn upload(&self, content_type: &str, body: ByteReader) -> Result<UploadedArtifact, TaskError> {
        self.upload_named(DEFAULT_ARTIFACT, content_type, body).await
    }

    /// Streams the named artifact `name` (`result.artifacts.{name}`) from
    /// `body`, as [`TaskContext::upload`] does the default one. A failure the
    /// handler returns publishes its artifacts too (error reports, partial
    /// outputs); a cancellation discards them.
    pub async fn upload_named(
        &self,
        name: &str,
        content_type: &str,
        body: ByteReader,
    ) -> Result<UploadedArtifact, TaskError> {
        self.link.upload(name, content_type, body).await.map_err(|e| match e {
            WorkerError::LeaseLost => TaskError::fatal("lease_lost", "the lease was lost"),
            other => {
                too_large(other).unwrap_or_else(|other| TaskError::Retryable(format!("the upload failed: {other}")))
            }
        })
    }

    /// Stores `body` as the piece of the resumable artifact `name` starting
    /// at `offset`, and returns where its pieces now end. Pieces outlive the
    /// attempt: one that resumes from a checkpoint writes again from the
    /// offset the checkpoint names (what was past it is replaced), and
    /// [`TaskContext::join_pieces`] makes them the artifact. Refused with
    /// `artifact_offset_mismatch` (retryable: the checkpoint and the pieces
    /// disagree) when the pieces do not end at `offset`.
    pub async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, TaskError> {
        self.link
            .upload_piece(name, offset, body)
            .await
            .map_err(|e| piece_error(e, "storing a piece"))
    }

    /// Joins the pieces of `name` — exactly `size_bytes` of them — into the
    /// artifact `name` (`default` for `result.artifact`), which `complete`
    /// publishes.
    pub async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, TaskError> {
        self.link
            .join_pieces(name, content_type, size_bytes)
            .await
            .map_err(|e| piece_error(e, "joining the pieces"))
    }

    /// Streams the upload `upload_id` that the operation's input names.
    pub async fn open_upload(&self, upload_id: &Id) -> Result<ByteReader, TaskError> {
        self.link.open_upload(upload_id).await.map_err(|e| match e {
            WorkerError::LeaseLost => TaskError::fatal("lease_lost", "the lease was lost"),
            WorkerError::NotFound => TaskError::fatal(
                "upload_not_found",
                format!("the upload {upload_id} is not one this operation's input names, or it was removed"),
            ),
            other => TaskError::Retryable(format!("reading the upload failed: {other}")),
        })
    }

    /// Cheap check, no IO.
    pub fn is_cancelled(&self) -> bool {
        *self.flags.cancel.borrow()
    }

    /// Resolves when cancellation is requested.
    pub async fn cancelled(&self) {
        let mut rx = self.flags.cancel.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    async fn send(
        &self,
        progress: Option<ProgressUpdate>,
        cost: Option<f64>,
        cancellable: Option<bool>,
    ) -> Result<(), TaskError> {
        let checkpoint = self.take_unsent_checkpoint();
        match self.link.heartbeat(progress, cost, cancellable, checkpoint).await {
            Ok(ack) => {
                self.learn(&ack);
                Ok(())
            }
            // The lease is gone: nothing this task does will count any more.
            Err(WorkerError::LeaseLost) => Err(TaskError::fatal("lease_lost", "the lease was lost")),
            // A failed report is not fatal: the next one may go through.
            Err(e) => {
                tracing::warn!(op.id = %self.operation_id, error = %e, "progress report failed");
                Ok(())
            }
        }
    }
}

fn piece_error(e: WorkerError, doing: &str) -> TaskError {
    match e {
        WorkerError::LeaseLost => TaskError::fatal("lease_lost", "the lease was lost"),
        WorkerError::OffsetMismatch { offset } => TaskError::Retryable(format!(
            "{doing}: the stored pieces end at byte {offset}, not where the task expected"
        )),
        other => too_large(other).unwrap_or_else(|other| TaskError::Retryable(format!("{doing} failed: {other}"))),
    }
}

/// An artifact over the server's limit, as the store says it in process
/// (`TooLarge`) and the server over HTTP (`413 payload_too_large`): fatal,
/// since the same bytes will not fit next time either.
fn too_large(e: WorkerError) -> Result<TaskError, WorkerError> {
    match e {
        WorkerError::TooLarge { max_bytes } => Ok(TaskError::fatal(
            "artifact_too_large",
            format!("artifacts are limited to {max_bytes} bytes"),
        )),
        WorkerError::Refused { code, message } if code == "payload_too_large" => {
            Ok(TaskError::fatal("artifact_too_large", message))
        }
        other => Err(other),
    }
}

fn check_checkpoint(checkpoint: &Value) -> Result<(), TaskError> {
    crate::reports::check_checkpoint(checkpoint).map_err(|e| TaskError::fatal("checkpoint_too_large", e.to_string()))
}

/// The outcome to report: `outcome` if it keeps the limits every worker
/// keeps, else a failure that says which it broke (over HTTP the server
/// would refuse it, and the task would only end when its lease lapsed).
fn within_limits(operation_id: &Id, outcome: Outcome) -> Outcome {
    match crate::reports::check_outcome(operation_id, &outcome) {
        Ok(()) => outcome,
        Err(e) => Outcome::Failed {
            error: OperationError {
                code: "invalid_outcome".into(),
                message: format!("the worker's outcome broke a limit: {e}"),
                retryable: false,
            },
        },
    }
}

/// How a task's wait for a slot ended.
pub(crate) enum Waited {
    /// Its turn: its handler runs in this slot.
    Slot(OwnedSemaphorePermit),
    /// A cancel or pause was requested before it started: this is its
    /// report, without running it (as its handler would have stopped at once).
    Stopped(Report),
    /// Its lease is gone: the task is someone else's.
    LeaseLost,
}

/// Waits, in the order tasks came, for one of `slots`, keeping the task's
/// lease as a running task does ([`keep_lease`], which also learns of
/// cancel and pause requests; in-process ones arrive on its flags directly).
pub(crate) async fn wait_for_slot(slots: &Arc<Semaphore>, ctx: &TaskContext, heartbeat_every: Duration) -> Waited {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Waited::Slot(slot);
    }
    let stopped = |error: TaskError| Report {
        link: ctx.link.clone(),
        outcome: error.into_outcome(ctx.checkpoint()),
        progress: ctx.take_pending(),
    };
    tokio::select! {
        slot = slots.clone().acquire_owned() => Waited::Slot(slot.expect("a worker's slots are never closed")),
        () = ctx.cancelled() => Waited::Stopped(stopped(TaskError::Cancelled)),
        () = ctx.pause_requested() => Waited::Stopped(stopped(TaskError::Paused)),
        () = keep_lease(ctx, heartbeat_every) => Waited::LeaseLost,
    }
}

/// The span a task runs in, the same for every worker (docs/ARCHITECTURE.md:
/// one operation, one trace): its operation, kind, attempt and worker.
pub fn task_span(operation_id: &Id, kind: &str, attempt: i64, worker: &str) -> tracing::Span {
    tracing::info_span!("task", op.id = %operation_id, kind = %kind, attempt, worker = %worker)
}

/// Runs `handler` for one task and reports its outcome (see [`run_handler`]).
pub async fn run_task(
    handler: Arc<dyn Handler>,
    ctx: TaskContext,
    heartbeat_every: Duration,
) -> Result<(), WorkerError> {
    run_handler(handler, ctx, heartbeat_every).await?.send().await
}

/// A handler's finished run, not yet reported: its outcome and the last
/// progress not yet sent.
#[must_use = "an outcome must be sent"]
pub struct Report {
    link: Arc<dyn TaskLink>,
    outcome: Outcome,
    progress: Option<ProgressUpdate>,
}

impl Report {
    /// Reports the outcome through the task's link; done once it is stored.
    pub async fn send(self) -> Result<(), WorkerError> {
        self.link.finish(self.outcome, self.progress).await
    }
}

/// Sends a handler's report, if its run came to one, and logs how it
/// ended: what every worker does once a task's slot is free.
pub async fn send_and_log(id: &Id, report: Result<Report, WorkerError>) {
    match async { report?.send().await }.await {
        Ok(()) => tracing::debug!(op.id = %id, "task finished"),
        Err(WorkerError::LeaseLost) => tracing::warn!(op.id = %id, "lease lost; the outcome was discarded"),
        Err(e) => tracing::error!(op.id = %id, error = %e, "could not report the outcome"),
    }
}

/// Renews `ctx`'s lease every `heartbeat_every`, sending its coalesced
/// progress once its interval has passed (each answer also brings cancel
/// and pause requests to its flags); returns once the lease is lost.
async fn keep_lease(ctx: &TaskContext, heartbeat_every: Duration) {
    let tick_every = if ctx.progress_interval.is_zero() {
        heartbeat_every
    } else {
        heartbeat_every.min(ctx.progress_interval)
    };
    let mut tick = tokio::time::interval(tick_every);
    tick.tick().await;
    let mut last_beat = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        if !ctx.has_pending() && last_beat.elapsed() < heartbeat_every {
            continue;
        }
        last_beat = tokio::time::Instant::now();
        if ctx.send(ctx.take_pending(), None, None).await.is_err() {
            return;
        }
    }
}

/// Runs `handler` for one task, renewing the lease in the background (which
/// also learns of cancellation and sends coalesced progress once its
/// interval has passed), and returns what to report. Workers free the
/// task's concurrency slot here, before the report is stored: the slot
/// bounds work running at once, and waiting for a commit is not work.
pub async fn run_handler(
    handler: Arc<dyn Handler>,
    ctx: TaskContext,
    heartbeat_every: Duration,
) -> Result<Report, WorkerError> {
    let link = ctx.link.clone();
    let outcome = tokio::select! {
        result = handler.run(ctx.clone()) => result,
        () = keep_lease(&ctx, heartbeat_every) => Err(TaskError::fatal("lease_lost", "the lease was lost")),
    };
    let outcome = match outcome {
        Ok(result) => Outcome::Succeeded { result },
        Err(TaskError::Fatal { code, .. }) if code == "lease_lost" => {
            return Err(WorkerError::LeaseLost);
        }
        Err(e) => e.into_outcome(ctx.checkpoint()),
    };
    let outcome = within_limits(&ctx.operation_id, outcome);
    Ok(Report {
        link,
        outcome,
        progress: ctx.take_pending(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what a task sends, standing in for the store or HTTP link
    /// (what is tested here is when the context sends, not where to).
    #[derive(Default)]
    struct Recorder {
        heartbeats: std::sync::Mutex<Vec<Option<f64>>>,
        finished: std::sync::Mutex<Option<Option<f64>>>,
        outcome: std::sync::Mutex<Option<Outcome>>,
        /// Heartbeats answer that a cancel was requested.
        cancel: std::sync::atomic::AtomicBool,
        /// Heartbeats answer that the lease is gone.
        lease_lost: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl TaskLink for Recorder {
        async fn heartbeat(
            &self,
            progress: Option<ProgressUpdate>,
            _cost_units: Option<f64>,
            _cancellable: Option<bool>,
            _checkpoint: Option<Value>,
        ) -> Result<HeartbeatAck, WorkerError> {
            if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(WorkerError::LeaseLost);
            }
            self.heartbeats
                .lock()
                .unwrap()
                .push(progress.and_then(|p| p.completed_units));
            Ok(HeartbeatAck {
                lease_expires_at: longrun_core::Timestamp(0),
                cancel_requested: self.cancel.load(std::sync::atomic::Ordering::SeqCst),
                cancel_reason: None,
                pause_requested: false,
                version: 0,
            })
        }

        async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError> {
            *self.outcome.lock().unwrap() = Some(outcome);
            *self.finished.lock().unwrap() = Some(progress.and_then(|p| p.completed_units));
            Ok(())
        }

        async fn upload(&self, _: &str, _: &str, _: ByteReader) -> Result<UploadedArtifact, WorkerError> {
            Err(WorkerError::LeaseLost)
        }

        async fn open_upload(&self, _: &Id) -> Result<ByteReader, WorkerError> {
            Err(WorkerError::NotFound)
        }

        async fn upload_piece(&self, _: &str, _: u64, _: ByteReader) -> Result<u64, WorkerError> {
            Err(WorkerError::LeaseLost)
        }

        async fn join_pieces(&self, _: &str, _: &str, _: u64) -> Result<UploadedArtifact, WorkerError> {
            Err(WorkerError::LeaseLost)
        }
    }

    /// A kind of one attempt, safe to re-run.
    fn test_kind(name: &str) -> KindInfo {
        KindInfo {
            name: name.into(),
            rerun_safe: true,
            max_attempts: 1,
            pausable: false,
        }
    }

    /// Reports `steps` progress updates, `every` apart.
    struct Steps {
        steps: u32,
        every: Duration,
    }

    #[async_trait]
    impl Handler for Steps {
        fn info(&self) -> KindInfo {
            test_kind("steps")
        }

        fn validate(&self, _: &Value) -> Result<(), Invalid> {
            Ok(())
        }

        async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
            for step in 1..=self.steps {
                tokio::time::sleep(self.every).await;
                ctx.progress(units(f64::from(step))).await?;
            }
            Ok(None)
        }
    }

    async fn run_steps(steps: u32, every: Duration) -> Arc<Recorder> {
        let link = Arc::new(Recorder::default());
        let ctx = TaskContext::new(
            Id::generate(longrun_core::IdKind::Operation),
            1,
            Value::Null,
            link.clone(),
            Arc::new(StopFlags::default()),
        )
        .with_progress_interval(Duration::from_secs(1));
        run_task(Arc::new(Steps { steps, every }), ctx, Duration::from_secs(10))
            .await
            .unwrap();
        link
    }

    /// A task waiting for one of `slots`, renewing its lease every 10 s.
    fn spawn_wait(slots: &Arc<Semaphore>, ctx: TaskContext) -> tokio::task::JoinHandle<Waited> {
        let slots = slots.clone();
        tokio::spawn(async move { wait_for_slot(&slots, &ctx, Duration::from_secs(10)).await })
    }

    /// A context over `link`, and its flags.
    fn context(link: Arc<Recorder>) -> (TaskContext, Arc<StopFlags>) {
        let flags = Arc::new(StopFlags::default());
        let ctx = TaskContext::new(
            Id::generate(longrun_core::IdKind::Operation),
            1,
            Value::Null,
            link,
            flags.clone(),
        );
        (ctx, flags)
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_waiting_for_a_slot_renews_its_lease_and_gets_the_slot_freed_first() {
        let link = Arc::new(Recorder::default());
        let (ctx, flags) = context(link.clone());
        let slots = Arc::new(Semaphore::new(1));
        let busy = slots.clone().try_acquire_owned().unwrap();
        let waiting = spawn_wait(&slots, ctx);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(
            link.heartbeats.lock().unwrap().len(),
            2,
            "one renewal per 10 s of waiting"
        );
        assert!(!*flags.cancel.borrow());

        // The freed slot goes to the task that waited, not to a newcomer.
        drop(busy);
        assert!(slots.clone().try_acquire_owned().is_err());
        assert!(matches!(waiting.await.unwrap(), Waited::Slot(_)));
        assert_eq!(link.heartbeats.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_cancelled_while_it_waits_reports_cancelled_without_waiting_on() {
        let link = Arc::new(Recorder::default());
        let (ctx, flags) = context(link.clone());
        let slots = Arc::new(Semaphore::new(1));
        let _busy = slots.clone().try_acquire_owned().unwrap();
        let waiting = spawn_wait(&slots, ctx);
        // A cancel a renewal learns of ends the wait at once.
        link.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert!(*flags.cancel.borrow(), "the renewal's answer reaches the task's flags");
        let Waited::Stopped(report) = waiting.await.unwrap() else {
            panic!("a report, with the slot still taken");
        };
        assert!(matches!(report.outcome, Outcome::Cancelled));
        report.send().await.unwrap();
        assert!(matches!(*link.outcome.lock().unwrap(), Some(Outcome::Cancelled)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_paused_while_it_waits_reports_paused_with_the_checkpoint_it_was_given() {
        let link = Arc::new(Recorder::default());
        let (ctx, flags) = context(link.clone());
        let ctx = ctx.with_checkpoint(Some(serde_json::json!({"row": 7})));
        let slots = Arc::new(Semaphore::new(0));
        let waiting = spawn_wait(&slots, ctx);
        tokio::task::yield_now().await;
        // An in-process pause request arrives on the flags, with no renewal.
        flags.pause.send_replace(true);
        let Waited::Stopped(report) = waiting.await.unwrap() else {
            panic!("a report");
        };
        assert!(
            matches!(&report.outcome, Outcome::Paused { checkpoint: Some(c) } if c["row"] == 7),
            "{:?}",
            report.outcome
        );
        assert!(link.heartbeats.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_whose_lease_is_lost_while_it_waits_gives_up_its_place() {
        let link = Arc::new(Recorder::default());
        let (ctx, _) = context(link.clone());
        let slots = Arc::new(Semaphore::new(1));
        let busy = slots.clone().try_acquire_owned().unwrap();
        link.lease_lost.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(
            wait_for_slot(&slots, &ctx, Duration::from_secs(10)).await,
            Waited::LeaseLost
        ));
        drop(busy);
        assert_eq!(slots.available_permits(), 1, "it left the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_slot_is_taken_at_once_without_a_renewal() {
        let link = Arc::new(Recorder::default());
        let (ctx, _) = context(link.clone());
        let slots = Arc::new(Semaphore::new(1));
        let slot = wait_for_slot(&slots, &ctx, Duration::from_secs(10)).await;
        assert!(matches!(slot, Waited::Slot(_)));
        assert!(link.heartbeats.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_ends_within_the_interval_sends_its_progress_only_with_the_outcome() {
        let link = run_steps(10, Duration::ZERO).await;
        assert!(link.heartbeats.lock().unwrap().is_empty());
        assert_eq!(*link.finished.lock().unwrap(), Some(Some(10.0)));
    }

    #[tokio::test(start_paused = true)]
    async fn long_work_sends_at_most_one_report_per_interval_always_the_newest() {
        // 50 reports 100 ms apart: about one send per second, never a stale one.
        let link = run_steps(50, Duration::from_millis(100)).await;
        let sent = link.heartbeats.lock().unwrap().clone();
        assert!((4..=6).contains(&sent.len()), "{sent:?}");
        let values: Vec<f64> = sent.iter().map(|v| v.expect("each send carries progress")).collect();
        assert!(values.windows(2).all(|w| w[1] - w[0] >= 9.0), "{values:?}");
        // The outcome carries what was not sent yet, if anything.
        let finished = link.finished.lock().unwrap().unwrap();
        assert!(finished == Some(50.0) || values.last() == Some(&50.0));
    }

    /// Returns what it is given, after reporting the progress it is given.
    struct Reports {
        progress: ProgressUpdate,
        result: Value,
    }

    #[async_trait]
    impl Handler for Reports {
        fn info(&self) -> KindInfo {
            test_kind("reports")
        }

        fn validate(&self, _: &Value) -> Result<(), Invalid> {
            Ok(())
        }

        async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
            ctx.progress(self.progress.clone()).await?;
            Ok(Some(self.result.clone()))
        }
    }

    async fn run_reports(progress: ProgressUpdate, result: Value) -> Outcome {
        let link = Arc::new(Recorder::default());
        let ctx = TaskContext::new(
            Id::generate(longrun_core::IdKind::Operation),
            1,
            Value::Null,
            link.clone(),
            Arc::new(StopFlags::default()),
        );
        run_task(Arc::new(Reports { progress, result }), ctx, Duration::from_secs(10))
            .await
            .unwrap();
        link.outcome.lock().unwrap().take().expect("an outcome was sent")
    }

    #[tokio::test(start_paused = true)]
    async fn reports_past_a_limit_end_the_task_as_the_server_would_refuse_them() {
        let failed_with = |outcome: Outcome| match outcome {
            Outcome::Failed { error } => error.code,
            other => panic!("expected a failure, got {other:?}"),
        };
        // An inline result past 64 KiB: a failure saying so, not a store write.
        let big = Value::String("x".repeat(crate::reports::MAX_INLINE_RESULT_BYTES));
        assert_eq!(failed_with(run_reports(units(1.0), big).await), "invalid_outcome");
        // Progress details past 4 KiB: refused to the handler, which gives up.
        let details = ProgressUpdate {
            details: Some(Value::String("d".repeat(crate::reports::MAX_PROGRESS_DETAILS_BYTES))),
            ..units(1.0)
        };
        assert_eq!(failed_with(run_reports(details, Value::Null).await), "invalid_progress");
        // Within the limits, the outcome is what the handler returned.
        let ok = run_reports(units(1.0), json_value()).await;
        assert_eq!(
            ok,
            Outcome::Succeeded {
                result: Some(json_value())
            }
        );
    }

    fn json_value() -> Value {
        serde_json::json!({"rows": 3})
    }

    fn units(n: f64) -> ProgressUpdate {
        ProgressUpdate {
            completed_units: Some(n),
            ..ProgressUpdate::default()
        }
    }

    #[test]
    fn folding_keeps_the_newest_of_each_field() {
        let older = ProgressUpdate {
            completed_units: Some(1.0),
            total_units: Some(10.0),
            phase: Some("READING".into()),
            ..ProgressUpdate::default()
        };
        let folded = fold_progress(Some(older), units(5.0));
        assert_eq!(folded.completed_units, Some(5.0));
        assert_eq!(folded.total_units, Some(10.0));
        assert_eq!(folded.phase.as_deref(), Some("READING"));
    }
}
