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

use crate::artifacts::{ArtifactStore, ByteReader};
use crate::results::{TaskArtifact, join_artifact_pieces, store_artifact_piece, store_upload};
use crate::worker::UploadedArtifact;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::kinds::Registry;
use crate::signals::Signals;
use crate::worker::{IN_FLIGHT_PER_SLOT, TaskContext, TaskLink, run_handler, send_and_log};

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
            progress_interval: crate::worker::DEFAULT_PROGRESS_INTERVAL,
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
    /// Handlers running at once (`concurrency`).
    slots: Arc<Semaphore>,
    /// Tasks between claim and stored outcome: a slot is free again when
    /// its handler returns, and up to this many outcomes may be committing.
    in_flight: Arc<Semaphore>,
    tracker: TaskTracker,
    /// Where the tasks' outcomes go, gathered into batches (started with the
    /// first task, inside the runtime).
    outcomes: std::sync::OnceLock<OutcomeBatcher>,
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
        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        let in_flight = Arc::new(Semaphore::new(config.concurrency.max(1) * IN_FLIGHT_PER_SLOT));
        Self {
            store,
            artifacts,
            registry,
            signals,
            clock,
            config,
            slots,
            in_flight,
            tracker: TaskTracker::new(),
            outcomes: std::sync::OnceLock::new(),
        }
    }

    /// Tasks running or reporting now.
    fn busy(&self) -> bool {
        self.in_flight.available_permits() < self.config.concurrency.max(1) * IN_FLIGHT_PER_SLOT
    }

    /// Claims as many tasks as there are free slots and starts them.
    /// Returns how many were started.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let free = self.slots.available_permits().min(self.in_flight.available_permits());
        if free == 0 {
            return Ok(0);
        }
        let tasks = self
            .store
            .task_claim(ClaimParams {
                kinds: self.registry.kinds(),
                max_tasks: u32::try_from(free).unwrap_or(u32::MAX),
                lease: self.config.lease,
                worker_id: self.config.worker_id.clone(),
                now: self.clock.now(),
            })
            .await?;
        let started = tasks.len();
        for task in tasks {
            self.start(task);
        }
        Ok(started)
    }

    fn start(&self, task: Task) {
        let Some(handler) = self.registry.get(&task.kind).cloned() else {
            tracing::error!(kind = %task.kind, "claimed a task of a kind with no handler");
            return;
        };
        let running = self
            .slots
            .clone()
            .try_acquire_owned()
            .expect("claimed no more tasks than free slots");
        let in_flight = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .expect("claimed no more tasks than free slots");
        let signals = self.signals.clone();
        let outcomes = self
            .outcomes
            .get_or_init(|| OutcomeBatcher::spawn(self.store.clone()))
            .clone();
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
        let span = tracing::info_span!(
            "task",
            op.id = %task.operation_id,
            kind = %task.kind,
            attempt = task.attempt,
            worker = "in-process",
        );
        let run = async move {
            let _in_flight = in_flight;
            let flag = signals.track(&task.operation_id);
            let ctx = TaskContext::new(task.operation_id.clone(), task.attempt, task.input, link, flag)
                .with_progress_interval(progress_interval)
                .with_checkpoint(task.checkpoint);
            let report = run_handler(handler, ctx, heartbeat_every).await;
            // The handler is done: its slot can take the next task while
            // the outcome commits.
            drop(running);
            signals.work_available();
            send_and_log(&task.operation_id, report).await;
            signals.untrack(&task.operation_id);
        };
        self.tracker.spawn(tracing::Instrument::instrument(run, span));
    }

    /// Claims and runs tasks until `shutdown`; then stops claiming and waits
    /// up to the grace period for running tasks.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let mut work = self.signals.watch_work();
            if let Err(e) = self.run_once().await {
                tracing::error!(error = %e, "claiming tasks failed");
            }
            // A claim takes what is free and ready; the next is worth making
            // once a slot frees or new work arrives.
            tokio::select! {
                () = work.changed() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
                () = shutdown.cancelled() => break,
            }
            // Handlers end and outcomes commit a batch at a time: while tasks
            // run, let the slots of one batch come free, so one claim fills
            // them all.
            if self.busy() {
                tokio::time::sleep(CLAIM_GATHER).await;
            }
        }
        self.tracker.close();
        if tokio::time::timeout(self.config.shutdown_grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.tracker.len(),
                "shutdown grace ended; running tasks are left to the reaper"
            );
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
    outcomes: OutcomeBatcher,
}

/// Most outcomes of in-process tasks stored in one `task_finish_many`.
const OUTCOME_BATCH: usize = 256;

type OutcomeJob = (FinishParams, tokio::sync::oneshot::Sender<Result<(), StoreError>>);

/// The in-process tasks' outcomes, stored a batch at a time through the
/// store's batched path (`task_finish_many`: one savepoint for the batch on
/// SQLite, set-based statements on PostgreSQL), as remote workers' go
/// through `POST /v1/worker/outcomes`. Nothing lingers: whatever arrived
/// while the previous batch was being stored is the next batch.
#[derive(Clone)]
struct OutcomeBatcher {
    jobs: tokio::sync::mpsc::Sender<OutcomeJob>,
}

impl OutcomeBatcher {
    fn spawn(store: Arc<dyn Store>) -> Self {
        let (jobs, mut rx) = tokio::sync::mpsc::channel::<OutcomeJob>(OUTCOME_BATCH * 4);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < OUTCOME_BATCH {
                    match rx.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let (params, replies): (Vec<FinishParams>, Vec<_>) = batch.into_iter().unzip();
                for (stored, reply) in store.task_finish_many(params).await.into_iter().zip(replies) {
                    let _ = reply.send(stored.map(|_| ()));
                }
            }
        });
        Self { jobs }
    }

    /// Stores `params` with the next batch; done once it is.
    async fn send(&self, params: FinishParams) -> Result<(), StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .send((params, reply))
            .await
            .map_err(|_| StoreError::Stopped("the in-process outcome batcher"))?;
        answer
            .await
            .map_err(|_| StoreError::Stopped("the in-process outcome batcher"))?
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
    ) -> Result<HeartbeatAck, StoreError> {
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
    }

    async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), StoreError> {
        self.outcomes
            .send(FinishParams {
                operation_id: self.operation_id.clone(),
                lease_token: self.lease_token.clone(),
                outcome,
                progress,
                now: self.clock.now(),
            })
            .await
    }

    async fn upload(&self, name: &str, content_type: &str, body: ByteReader) -> Result<UploadedArtifact, StoreError> {
        store_upload(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            self.target(name, content_type),
            body,
            self.max_artifact_bytes,
            self.clock.now(),
        )
        .await
    }

    async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, StoreError> {
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
    }

    async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, StoreError> {
        join_artifact_pieces(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            self.target(name, content_type),
            size_bytes,
            self.clock.now(),
        )
        .await
    }

    async fn open_upload(&self, upload_id: &Id) -> Result<ByteReader, StoreError> {
        crate::uploads::open_for_task(
            self.store.as_ref(),
            self.artifacts.as_ref(),
            &self.operation_id,
            &self.lease_token,
            upload_id,
        )
        .await
    }
}
