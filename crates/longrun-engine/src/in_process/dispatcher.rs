//! Runs built-in kinds in this process: claims tasks through the same store
//! primitives remote workers use (claim with a lease, fenced heartbeats and
//! completion), with bounded concurrency.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::{Clock, Id};
use longrun_store::{
    ClaimParams, FinishParams, HeartbeatAck, HeartbeatParams, Outcome, ProgressUpdate, Store, StoreError, Task,
};

use crate::bytes::BytesError;
use crate::bytes::artifacts::{ArtifactError, ArtifactStore, ByteReader};
use crate::bytes::results::{TaskArtifact, join_artifact_pieces, store_artifact_piece, store_upload};
use longrun_worker::slots::{Reserved, Slots};
use longrun_worker::task::{send_and_log, task_span};
use longrun_worker::{TaskContext, TaskLink, UploadedArtifact, WorkerError};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::in_process::signals::Signals;
use longrun_worker::Registry;

/// How long a busy dispatcher lets freed slots gather before it claims.
const CLAIM_GATHER: Duration = Duration::from_millis(1);

/// How the in-process dispatcher runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Tasks running at once in this process.
    pub concurrency: usize,
    /// How long each claimed task's lease lasts without a heartbeat.
    pub lease: Duration,
    /// How often to look for work when no wake-up arrives.
    pub poll_interval: Duration,
    /// How long shutdown waits for running tasks before leaving them to the
    /// reaper (built-in kinds are safe to re-run).
    pub shutdown_grace: Duration,
    /// Names this process in leases and logs.
    pub worker_id: String,
    /// Largest result artifact a task may upload.
    pub max_artifact_bytes: u64,
    /// At most one stored progress change per operation per interval
    /// (`--progress-interval`); the last one goes with the outcome.
    pub progress_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            concurrency: 64,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            worker_id: "in-process".into(),
            max_artifact_bytes: 64 * 1024 * 1024 * 1024,
            progress_interval: longrun_worker::task::DEFAULT_PROGRESS_INTERVAL,
        }
    }
}

/// Claims the built-in kinds in batches up to its free slots and runs them in process.
pub struct Dispatcher {
    store: Arc<dyn Store>,
    artifacts: Arc<dyn ArtifactStore>,
    registry: Registry,
    signals: Signals,
    clock: Arc<dyn Clock>,
    config: Config,
    /// How many tasks it claims, holds and runs at once.
    slots: Slots,
    tracker: TaskTracker,
    /// Where the tasks' outcomes go: the run loop stores them a batch at a
    /// time, with its next claim.
    outcomes: OutcomeSender,
    /// The loop's end of `outcomes`, taken by [`Dispatcher::run`].
    pending_outcomes: std::sync::Mutex<Option<mpsc::Receiver<OutcomeJob>>>,
}

impl Dispatcher {
    /// A dispatcher of `registry`'s kinds over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        artifacts: Arc<dyn ArtifactStore>,
        registry: Registry,
        signals: Signals,
        clock: Arc<dyn Clock>,
        config: Config,
    ) -> Self {
        let slots = Slots::new(config.concurrency);
        let (jobs, pending) = mpsc::channel::<OutcomeJob>(OUTCOME_BATCH * 4);
        Self {
            store,
            artifacts,
            registry,
            signals,
            clock,
            config,
            slots,
            tracker: TaskTracker::new(),
            outcomes: OutcomeSender { jobs },
            pending_outcomes: std::sync::Mutex::new(Some(pending)),
        }
    }

    /// What a claim of up to `free` tasks asks for now.
    fn claim_params(&self, free: usize) -> ClaimParams {
        ClaimParams {
            kinds: self.registry.kinds(),
            max_tasks: u32::try_from(free).unwrap_or(u32::MAX),
            lease: self.config.lease,
            worker_id: self.config.worker_id.clone(),
            now: self.clock.now(),
        }
    }

    /// Stores `outcomes` and, when `claiming`, claims as many tasks as
    /// its [`Slots`] allow and starts them — in one store call,
    /// so a busy dispatcher pays one commit per cycle, not one for its
    /// outcomes and another for its claim. Each outcome's task hears once
    /// it is stored. Returns how many tasks were started.
    async fn cycle(&self, outcomes: Vec<OutcomeJob>, claiming: bool) -> usize {
        let mut reserved = if claiming {
            self.slots.reserve(usize::MAX)
        } else {
            Vec::new()
        };
        let free = reserved.len();
        let (params, replies): (Vec<FinishParams>, Vec<_>) = outcomes.into_iter().unzip();
        if params.is_empty() && free == 0 {
            return 0;
        }
        // One per store call: jobs per cycle is how much a cycle batches,
        // and an idle dispatcher makes one a poll interval.
        metrics::counter!("longrun_dispatcher_cycles_total").increment(1);
        let (finished, claimed) = match (params.is_empty(), free) {
            (false, 0) => (self.store.task_finish_many(params).await, Ok(Vec::new())),
            (true, _) => (Vec::new(), self.store.task_claim(self.claim_params(free)).await),
            (false, _) => self.store.task_finish_and_claim(params, self.claim_params(free)).await,
        };
        for (stored, reply) in finished.into_iter().zip(replies) {
            let _ = reply.send(stored.map(|_| ()));
        }
        match claimed {
            Ok(tasks) => {
                let started = tasks.len();
                // A claim takes no more than it was asked for; what it did
                // not fill goes back with the rest of `reserved`.
                for (task, permits) in tasks.into_iter().zip(reserved.drain(..)) {
                    self.start(task, permits);
                }
                started
            }
            Err(e) => {
                tracing::error!(error = %e, "claiming tasks failed");
                0
            }
        }
    }

    /// Runs `task` once a slot is free (at once, unless it was claimed
    /// ahead), holding what `reserved` holds until its outcome is stored.
    fn start(&self, task: Task, mut reserved: Reserved) {
        let Some(handler) = self.registry.get(&task.kind).cloned() else {
            tracing::error!(kind = %task.kind, "claimed a task of a kind with no handler");
            return;
        };
        let signals = self.signals.clone();
        let outcomes = self.outcomes.clone();
        let link = Arc::new(StoreLink {
            store: self.store.clone(),
            artifacts: self.artifacts.clone(),
            max_artifact_bytes: self.config.max_artifact_bytes,
            clock: self.clock.clone(),
            operation_id: task.operation_id.clone(),
            lease_token: task.lease_token.clone(),
            outcomes,
        });
        let heartbeat_every = self.config.lease / 3;
        let progress_interval = self.config.progress_interval;
        let span = task_span(&task.operation_id, &task.kind, task.attempt, "in-process");
        let run = async move {
            let flag = signals.track(&task.operation_id);
            let ctx = TaskContext::new(task.operation_id.clone(), task.attempt, task.input, link, flag)
                .with_progress_interval(progress_interval)
                .with_checkpoint(task.checkpoint);
            let report = reserved.run(handler, ctx, heartbeat_every).await;
            // The handler is done (its slot already takes the next task)
            // while the outcome commits: the outcome's arrival wakes the
            // dispatcher to claim for the slot. A signal of new work would
            // wake a claimer of the kind waiting elsewhere for nothing.
            send_and_log(&task.operation_id, report).await;
            signals.untrack(&task.operation_id);
            drop(reserved);
        };
        self.tracker.spawn(tracing::Instrument::instrument(run, span));
    }

    /// Claims and runs tasks until `shutdown`, storing their outcomes as
    /// they come; then stops claiming and, up to the grace period, waits for
    /// running tasks and stores what they report.
    ///
    /// Up to `CYCLES_IN_FLIGHT` cycles run at once, so the tasks one
    /// cycle started run, and their outcomes gather, while the store commits
    /// the next: the store's work and the tasks' overlap instead of taking
    /// turns.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut pending = self
            .pending_outcomes
            .lock()
            .expect("the outcome queue's lock is never poisoned")
            .take()
            .expect("a dispatcher runs once");
        let this = Arc::new(self);
        let mut cycles = tokio::task::JoinSet::new();
        let mut outcomes: Vec<OutcomeJob> = Vec::new();
        // Whether a cycle is worth starting: at first, then once an outcome
        // arrives, a slot frees, new work does or the poll interval passes —
        // never merely because a cycle ended (an idle dispatcher would claim
        // in a loop).
        let mut wanted = true;
        let kinds: Arc<[String]> = this.registry.kinds().into();
        loop {
            let mut work = this.signals.watch_work_of(kinds.clone());
            if wanted && cycles.len() < CYCLES_IN_FLIGHT {
                gather(&mut pending, &mut outcomes);
                let (this, outcomes) = (this.clone(), std::mem::take(&mut outcomes));
                cycles.spawn(async move { this.cycle(outcomes, true).await });
                wanted = false;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(job) = pending.recv() => {
                    outcomes.push(job);
                    wanted = true;
                }
                () = work.changed() => wanted = true,
                // A cycle ending makes room for one that is wanted (outcomes
                // that arrived while all were in flight left `wanted` set).
                Some(_) = cycles.join_next(), if !cycles.is_empty() => {}
                () = tokio::time::sleep(this.config.poll_interval) => wanted = true,
            }
            while cycles.try_join_next().is_some() {}
            // Handlers end and outcomes arrive a batch at a time: while tasks
            // run, let the outcomes and slots of one batch come, so one cycle
            // stores them all and one claim fills the slots.
            if wanted && this.slots.busy() {
                tokio::time::sleep(CLAIM_GATHER).await;
            }
        }
        while cycles.join_next().await.is_some() {}
        this.tracker.close();
        // Outcomes gathered while every cycle was in flight are stored
        // first: their tasks wait for them, so the tracker would not end
        // before the grace did.
        let finishing = async {
            loop {
                gather(&mut pending, &mut outcomes);
                if !outcomes.is_empty() {
                    this.cycle(std::mem::take(&mut outcomes), false).await;
                }
                tokio::select! {
                    () = this.tracker.wait() => break,
                    Some(job) = pending.recv() => outcomes.push(job),
                }
            }
        };
        if tokio::time::timeout(this.config.shutdown_grace, finishing)
            .await
            .is_err()
        {
            tracing::warn!(
                running = this.tracker.len(),
                "shutdown grace ended; running tasks are left to the reaper"
            );
        }
    }
}

/// Cycles of [`Dispatcher::run`] at once: while some commit, the tasks the
/// others started run and their outcomes gather. Two took the SQLite drain
/// from 4.0–7.7 k to 9.0–9.7 k jobs/s; four gave another 2–10 % on
/// PostgreSQL, whose commits run side by side, and 6 % on SQLite.
const CYCLES_IN_FLIGHT: usize = 4;

/// Adds the outcomes already waiting in `pending` to `outcomes`, up to a batch.
fn gather(pending: &mut mpsc::Receiver<OutcomeJob>, outcomes: &mut Vec<OutcomeJob>) {
    while outcomes.len() < OUTCOME_BATCH {
        match pending.try_recv() {
            Ok(job) => outcomes.push(job),
            Err(_) => break,
        }
    }
}

/// The in-process [`TaskLink`]: straight to the store.
struct StoreLink {
    store: Arc<dyn Store>,
    artifacts: Arc<dyn ArtifactStore>,
    max_artifact_bytes: u64,
    clock: Arc<dyn Clock>,
    operation_id: Id,
    lease_token: String,
    outcomes: OutcomeSender,
}

/// Most outcomes of in-process tasks stored in one cycle.
const OUTCOME_BATCH: usize = 256;

type OutcomeJob = (FinishParams, oneshot::Sender<Result<(), StoreError>>);

/// A task's way to its outcome's storage: the dispatcher's run loop stores
/// what has arrived a batch at a time through the store's batched path
/// (with its next claim: `task_finish_and_claim`), as remote workers'
/// outcomes go through `POST /v1/worker/outcomes`. Nothing lingers: what
/// arrives while one cycle is stored is the next cycle's.
#[derive(Clone)]
struct OutcomeSender {
    jobs: mpsc::Sender<OutcomeJob>,
}

impl OutcomeSender {
    /// Stores `params` with the next cycle; done once it is.
    async fn send(&self, params: FinishParams) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send((params, reply))
            .await
            .map_err(|_| StoreError::Stopped("the in-process dispatcher"))?;
        answer
            .await
            .map_err(|_| StoreError::Stopped("the in-process dispatcher"))?
    }
}

impl StoreLink {
    fn target<'a>(&'a self, name: &'a str, content_type: &'a str) -> TaskArtifact<'a> {
        TaskArtifact {
            operation_id: &self.operation_id,
            lease_token: &self.lease_token,
            name,
            content_type,
        }
    }
}

#[async_trait]
impl TaskLink for StoreLink {
    async fn heartbeat(
        &self,
        progress: Option<ProgressUpdate>,
        cost_units: Option<f64>,
        cancellable: Option<bool>,
        checkpoint: Option<serde_json::Value>,
    ) -> Result<HeartbeatAck, WorkerError> {
        self.store
            .task_heartbeat(HeartbeatParams {
                operation_id: self.operation_id.clone(),
                lease_token: self.lease_token.clone(),
                progress,
                cost_units,
                cancellable,
                checkpoint,
                now: self.clock.now(),
            })
            .await
            .map_err(worker_error)
    }

    async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError> {
        self.outcomes
            .send(FinishParams {
                operation_id: self.operation_id.clone(),
                lease_token: self.lease_token.clone(),
                outcome,
                progress,
                now: self.clock.now(),
            })
            .await
            .map_err(worker_error)
    }

    async fn upload(&self, name: &str, content_type: &str, body: ByteReader) -> Result<UploadedArtifact, WorkerError> {
        store_upload(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            self.target(name, content_type),
            body,
            self.max_artifact_bytes,
            self.clock.now(),
        )
        .await
        .map_err(bytes_error)
    }

    async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, WorkerError> {
        store_artifact_piece(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            self.target(name, ""),
            offset,
            body,
            self.max_artifact_bytes,
            self.clock.now(),
        )
        .await
        .map_err(bytes_error)
    }

    async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, WorkerError> {
        join_artifact_pieces(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            self.target(name, content_type),
            size_bytes,
            self.clock.now(),
        )
        .await
        .map_err(bytes_error)
    }

    async fn open_upload(&self, upload_id: &Id) -> Result<ByteReader, WorkerError> {
        crate::bytes::uploads::open_for_task(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            &self.operation_id,
            &self.lease_token,
            upload_id,
        )
        .await
        .map_err(bytes_error)
    }
}

/// What a store's answer means to a task in process: the [`WorkerError`] a
/// remote worker hears for the same answer over HTTP.
pub fn worker_error(e: StoreError) -> WorkerError {
    match e {
        StoreError::LeaseLost => WorkerError::LeaseLost,
        StoreError::NotFound => WorkerError::NotFound,
        StoreError::TooLarge { max_bytes } => WorkerError::TooLarge { max_bytes },
        StoreError::UploadOffsetMismatch { offset, .. } => WorkerError::OffsetMismatch {
            offset: u64::try_from(offset).unwrap_or(0),
        },
        StoreError::Unavailable(message) => WorkerError::Unavailable {
            retry_after: None,
            message,
        },
        StoreError::Stopped(what) => WorkerError::Unavailable {
            retry_after: None,
            message: format!("{what} stopped"),
        },
        other => WorkerError::Refused {
            code: "internal".into(),
            message: other.to_string(),
        },
    }
}

/// [`worker_error`], for calls that also store or read bytes.
pub fn bytes_error(e: BytesError) -> WorkerError {
    match e {
        BytesError::Store(e) => worker_error(e),
        BytesError::Objects(ArtifactError::TooLarge { max_bytes }) => WorkerError::TooLarge { max_bytes },
        BytesError::Objects(ArtifactError::NotFound) => WorkerError::NotFound,
        BytesError::Objects(e @ ArtifactError::Io(_)) => WorkerError::Unavailable {
            retry_after: None,
            message: e.to_string(),
        },
    }
}
