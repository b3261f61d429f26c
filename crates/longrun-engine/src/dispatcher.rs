//! Runs built-in kinds in this process: claims tasks through the same store
//! primitives remote workers use (claim with a lease, fenced heartbeats and
//! completion), with bounded concurrency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::{Clock, Id};
use longrun_store::{
    ClaimParams, FinishParams, HeartbeatAck, HeartbeatParams, Outcome, ProgressUpdate, Store, StoreError, Task,
};

use crate::artifacts::{ArtifactStore, ByteReader};
use crate::results::{TaskArtifact, join_artifact_pieces, store_artifact_piece, store_upload};
use crate::worker::UploadedArtifact;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::kinds::Registry;
use crate::signals::Signals;
use crate::worker::{TaskContext, TaskLink, Waited, run_handler, send_and_log, wait_for_slot};

/// How long a busy dispatcher lets freed slots gather before it claims.
const CLAIM_GATHER: Duration = Duration::from_millis(1);

/// A handler that ran for less than this is quick, and each quick one that
/// ended within the last such window lets a cycle claim one task beyond
/// the free slots (see [`QuickEnds`]).
const QUICK: Duration = Duration::from_millis(100);

/// Most tasks a cycle claims beyond the free slots, as a multiple of the
/// concurrency. No-op drains of 20 k jobs, 64 slots, same runs: claiming
/// ahead up to 1× took PostgreSQL from 3.3 k to 3.75 k jobs/s and SQLite
/// from 5.4–5.9 k to 6.9–8.9 k; 3× took PostgreSQL from 5.1 k to 6.3–6.5 k
/// and SQLite from 8.8–10.1 k to 12.4–12.6 k; 7× was within the noise.
const AHEAD_PER_SLOT: usize = 3;

/// Tasks the dispatcher holds at once, as a multiple of the concurrency:
/// those claimed (running or waiting for a slot) and as many again whose
/// outcomes are being stored.
const IN_FLIGHT_PER_SLOT: usize = 2 * (1 + AHEAD_PER_SLOT);

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
    /// Handlers running at once (`concurrency`), handed out in claim order.
    slots: Arc<Semaphore>,
    /// Tasks claimed whose handler has not returned: running, or claimed
    /// ahead and waiting for a slot.
    claimed: Arc<AtomicUsize>,
    /// How far ahead of its free slots a cycle may claim.
    quick_ends: Arc<QuickEnds>,
    /// Tasks between claim and stored outcome: a slot is free again when
    /// its handler returns, and up to this many outcomes may be committing.
    in_flight: Arc<Semaphore>,
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
        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        let in_flight = Arc::new(Semaphore::new(config.concurrency.max(1) * IN_FLIGHT_PER_SLOT));
        let (jobs, pending) = mpsc::channel::<OutcomeJob>(OUTCOME_BATCH * 4);
        Self {
            store,
            artifacts,
            registry,
            signals,
            clock,
            config,
            slots,
            claimed: Arc::new(AtomicUsize::new(0)),
            quick_ends: Arc::new(QuickEnds::default()),
            in_flight,
            tracker: TaskTracker::new(),
            outcomes: OutcomeSender { jobs },
            pending_outcomes: std::sync::Mutex::new(Some(pending)),
        }
    }

    /// Tasks running or reporting now.
    fn busy(&self) -> bool {
        self.in_flight.available_permits() < self.config.concurrency.max(1) * IN_FLIGHT_PER_SLOT
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

    /// Reserves what a claim may take now: the free slots, and as many
    /// tasks beyond them as quick handlers ended in the last [`QUICK`] (at
    /// most [`AHEAD_PER_SLOT`] × `concurrency` more). Quick work frees slots faster than a claim
    /// commits, so tasks claimed ahead wait for a slot less than a claim
    /// would take; slow work is never claimed ahead, so it stays in the
    /// queue for a worker with a free slot. Taken at once: a cycle running
    /// beside this one cannot claim them too.
    fn reserve(&self) -> Vec<Reserved> {
        let concurrency = self.config.concurrency.max(1);
        let limit = concurrency + self.quick_ends.recent().min(AHEAD_PER_SLOT * concurrency);
        let held = self
            .claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(limit))
            .unwrap_or(limit);
        // Each count gives itself back when dropped: those not claimed at
        // the end of the cycle, or once their handler returns.
        let counts: Vec<ClaimedCount> = (held..limit).map(|_| ClaimedCount(self.claimed.clone())).collect();
        let mut reserved = Vec::with_capacity(counts.len());
        for count in counts {
            let Ok(in_flight) = self.in_flight.clone().try_acquire_owned() else {
                break;
            };
            reserved.push(Reserved { count, in_flight });
        }
        reserved
    }

    /// Stores `outcomes` and, when `claiming`, claims as many tasks as
    /// [`Dispatcher::reserve`] allows and starts them — in one store call,
    /// so a busy dispatcher pays one commit per cycle, not one for its
    /// outcomes and another for its claim. Each outcome's task hears once
    /// it is stored. Returns how many tasks were started.
    async fn cycle(&self, outcomes: Vec<OutcomeJob>, claiming: bool) -> usize {
        let mut reserved = if claiming { self.reserve() } else { Vec::new() };
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
    /// ahead): its claimed count is held until its handler returns,
    /// `in_flight` until its outcome is stored.
    fn start(&self, task: Task, reserved: Reserved) {
        let Some(handler) = self.registry.get(&task.kind).cloned() else {
            tracing::error!(kind = %task.kind, "claimed a task of a kind with no handler");
            return;
        };
        let Reserved { count, in_flight } = reserved;
        let (slots, quick_ends) = (self.slots.clone(), self.quick_ends.clone());
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
            let running = match wait_for_slot(&slots, &ctx, heartbeat_every).await {
                Waited::Slot(running) => running,
                Waited::Stopped(report) => {
                    drop(count);
                    send_and_log(&task.operation_id, Ok(report)).await;
                    signals.untrack(&task.operation_id);
                    return;
                }
                Waited::LeaseLost => {
                    tracing::warn!("lease lost while waiting for a slot; the task is left to its new holder");
                    signals.untrack(&task.operation_id);
                    return;
                }
            };
            let began = tokio::time::Instant::now();
            let report = run_handler(handler, ctx, heartbeat_every).await;
            quick_ends.record(began.elapsed());
            // The handler is done: its slot can take the next task while
            // the outcome commits.
            drop(running);
            drop(count);
            signals.work_available();
            send_and_log(&task.operation_id, report).await;
            signals.untrack(&task.operation_id);
        };
        self.tracker.spawn(tracing::Instrument::instrument(run, span));
    }

    /// Claims and runs tasks until `shutdown`, storing their outcomes as
    /// they come; then stops claiming and, up to the grace period, waits for
    /// running tasks and stores what they report.
    ///
    /// Up to [`CYCLES_IN_FLIGHT`] cycles run at once, so the tasks one
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
        loop {
            let mut work = this.signals.watch_work();
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
            if wanted && this.busy() {
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

/// What a cycle holds for each task it may claim.
struct Reserved {
    count: ClaimedCount,
    in_flight: OwnedSemaphorePermit,
}

/// One of [`Dispatcher::claimed`], given back when dropped.
struct ClaimedCount(Arc<AtomicUsize>);

impl Drop for ClaimedCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Quick handlers (ran for less than [`QUICK`]) that ended in the current
/// window of [`QUICK`] and in the one before it.
#[derive(Default)]
struct QuickEnds(std::sync::Mutex<QuickWindow>);

struct QuickWindow {
    start: tokio::time::Instant,
    current: usize,
    previous: usize,
}

impl Default for QuickWindow {
    fn default() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            current: 0,
            previous: 0,
        }
    }
}

impl QuickWindow {
    fn roll(&mut self) {
        let since = self.start.elapsed();
        if since >= QUICK {
            self.previous = if since < 2 * QUICK { self.current } else { 0 };
            self.current = 0;
            self.start = tokio::time::Instant::now();
        }
    }
}

impl QuickEnds {
    /// A handler ended after running for `ran`.
    fn record(&self, ran: Duration) {
        if ran < QUICK {
            let mut window = self.0.lock().expect("the window's lock is never poisoned");
            window.roll();
            window.current += 1;
        }
    }

    /// Quick ends in the last window: the busier of the current and the one before.
    fn recent(&self) -> usize {
        let mut window = self.0.lock().expect("the window's lock is never poisoned");
        window.roll();
        window.current.max(window.previous)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatcher(dir: &std::path::Path, concurrency: usize) -> Dispatcher {
        let store = longrun_store::SqliteStore::open(longrun_store::SqliteConfig::new(dir.join("longrun.db"))).unwrap();
        Dispatcher::new(
            Arc::new(store),
            Arc::new(crate::artifacts::FileArtifacts::new(dir.join("artifacts"))),
            Registry::builtin(),
            Signals::default(),
            Arc::new(longrun_core::SystemClock),
            Config {
                concurrency,
                ..Config::default()
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_cycle_claims_ahead_of_its_free_slots_only_as_many_as_quick_handlers_just_ended() {
        let dir = tempfile::tempdir().unwrap();
        let d = dispatcher(dir.path(), 4);

        // No handler has ended: the free slots, and once they are claimed, nothing.
        let first = d.reserve();
        assert_eq!(first.len(), 4);
        assert!(d.reserve().is_empty());
        drop(first);
        let running = d.reserve();
        assert_eq!(running.len(), 4, "what a cycle did not claim goes back");

        // Slow handlers ending earn nothing ahead.
        for _ in 0..10 {
            d.quick_ends.record(QUICK);
        }
        assert!(d.reserve().is_empty());

        // Quick ones do, one task each, up to AHEAD_PER_SLOT × `concurrency` more.
        d.quick_ends.record(Duration::from_millis(1));
        let ahead = d.reserve();
        assert_eq!(ahead.len(), 1);
        for _ in 0..20 {
            d.quick_ends.record(Duration::from_millis(1));
        }
        let more = d.reserve();
        assert_eq!(
            more.len(),
            11,
            "at most AHEAD_PER_SLOT × `concurrency` beyond the slots"
        );
        assert!(d.reserve().is_empty());

        // Within the window after the ends, they still count; then not.
        drop((ahead, more));
        tokio::time::advance(QUICK).await;
        assert_eq!(d.reserve().len(), 12);
        tokio::time::advance(QUICK).await;
        assert!(d.reserve().is_empty(), "quick ends long past claim nothing ahead");
        drop(running);
        assert_eq!(d.claimed.load(Ordering::Acquire), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_ahead_never_take_more_than_the_tasks_in_flight_allow() {
        let dir = tempfile::tempdir().unwrap();
        let d = dispatcher(dir.path(), 1);
        for _ in 0..10 {
            d.quick_ends.record(Duration::ZERO);
        }
        // Outcomes still committing hold most of the in-flight permits.
        let committing = d
            .in_flight
            .clone()
            .try_acquire_many_owned(u32::try_from(IN_FLIGHT_PER_SLOT - 1).unwrap())
            .unwrap();
        let reserved = d.reserve();
        assert_eq!(reserved.len(), 1);
        assert_eq!(d.claimed.load(Ordering::Acquire), 1, "the count not reserved went back");
        drop((committing, reserved));
    }
}
