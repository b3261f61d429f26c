//! The `export` kind resumes from its checkpoint: paused mid-file, or its
//! worker gone mid-piece (the task dropped, as a SIGKILL would), the next
//! attempt appends to the same artifact's pieces and the joined file is
//! byte-identical to an uninterrupted export, each row stored once.
//!
//! Real SQLite and a real file artifact store; the link is the in-process
//! one's parts (`store_artifact_piece`, `join_artifact_pieces`, the store's
//! fenced calls) with a counter around them, so the pause lands on a chosen
//! progress report instead of a race with the clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::{Clock, Id, ManualClock, State, Timestamp};
use longrun_engine::bytes::artifacts::{ArtifactStore, ByteReader, FileArtifacts};
use longrun_engine::bytes::results::{TaskArtifact, join_artifact_pieces, store_artifact_piece};
use longrun_engine::in_process::dispatcher::{bytes_error, worker_error};
use longrun_engine::kinds::export::{CSV_HEADER, Export, Format, render};
use longrun_store::{
    AcceptOutcome, ClaimParams, DEFAULT_ARTIFACT, DesiredState, FinishParams, HeartbeatAck, HeartbeatParams,
    IntentParams, KindSpec, Outcome, ProgressUpdate, ReapParams, SqliteConfig, SqliteStore, Store, Tables, Task,
};
use longrun_worker::WorkerError;
use longrun_worker::task::{StopFlags, TaskContext, TaskLink, UploadedArtifact, run_task};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

const LEASE: Duration = Duration::from_secs(30);
/// Three pieces: 200,000 + 200,000 + 50,000 rows.
const ROWS: u64 = 450_000;

struct Fixture {
    store: Arc<dyn Store>,
    artifacts: Arc<dyn ArtifactStore>,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).unwrap();
    let spec = KindSpec {
        builtin: true,
        rerun_safe: true,
        pausable: true,
        ..KindSpec::declared("export")
    };
    store.kind_upsert(spec).await.unwrap();
    Fixture {
        store: Arc::new(store),
        artifacts: Arc::new(FileArtifacts::new(dir.path().join("artifacts"))),
        clock: ManualClock::new(Timestamp(1_800_000_000_000)),
        _dir: dir,
    }
}

/// What happens at the n-th progress report of a run.
#[derive(Clone, Copy)]
enum At {
    Nothing,
    /// A client pauses the operation (through the store, as `PATCH` does).
    Pause(usize),
    /// The worker vanishes: the run is dropped.
    Vanish(usize),
}

struct Link {
    f: Arc<Fixture>,
    task: Task,
    at: At,
    reports: AtomicUsize,
    /// Bytes of pieces the store recorded.
    stored: Arc<AtomicU64>,
    vanish: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl TaskLink for Link {
    async fn heartbeat(
        &self,
        progress: Option<ProgressUpdate>,
        cost_units: Option<f64>,
        cancellable: Option<bool>,
        checkpoint: Option<Value>,
    ) -> Result<HeartbeatAck, WorkerError> {
        if progress.is_some() {
            let n = self.reports.fetch_add(1, Ordering::SeqCst) + 1;
            match self.at {
                At::Pause(k) if k == n => {
                    let op = self
                        .f
                        .store
                        .operation_get("t1", &self.task.operation_id)
                        .await
                        .map_err(worker_error)?
                        .unwrap();
                    self.f
                        .store
                        .operation_intent(IntentParams {
                            tenant: "t1".into(),
                            id: op.id.clone(),
                            desired: DesiredState::Paused,
                            if_match: Some(op.version),
                            now: self.f.clock.now(),
                        })
                        .await
                        .map_err(worker_error)?;
                }
                At::Vanish(k) if k == n => {
                    self.vanish.notify_one();
                    std::future::pending::<()>().await;
                }
                _ => {}
            }
        }
        self.f
            .store
            .task_heartbeat(HeartbeatParams {
                operation_id: self.task.operation_id.clone(),
                lease_token: self.task.lease_token.clone(),
                progress,
                cost_units,
                cancellable,
                checkpoint,
                now: self.f.clock.now(),
            })
            .await
            .map_err(worker_error)
    }

    async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError> {
        self.f
            .store
            .task_finish(FinishParams {
                operation_id: self.task.operation_id.clone(),
                lease_token: self.task.lease_token.clone(),
                outcome,
                progress,
                now: self.f.clock.now(),
            })
            .await
            .map(|_| ())
            .map_err(worker_error)
    }

    async fn upload(&self, _: &str, _: &str, _: ByteReader) -> Result<UploadedArtifact, WorkerError> {
        panic!("the export stores pieces")
    }

    async fn open_upload(&self, _: &Id) -> Result<ByteReader, WorkerError> {
        Err(WorkerError::NotFound)
    }

    async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, WorkerError> {
        let end = store_artifact_piece(
            self.f.store.as_ref(),
            self.f.artifacts.as_ref(),
            self.target(name, ""),
            offset,
            body,
            u64::MAX,
            self.f.clock.now(),
        )
        .await
        .map_err(bytes_error)?;
        self.stored.fetch_add(end - offset, Ordering::SeqCst);
        Ok(end)
    }

    async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, WorkerError> {
        join_artifact_pieces(
            self.f.store.as_ref(),
            self.f.artifacts.as_ref(),
            self.target(name, content_type),
            size_bytes,
            self.f.clock.now(),
        )
        .await
        .map_err(bytes_error)
    }
}

impl Link {
    fn target<'a>(&'a self, name: &'a str, content_type: &'a str) -> TaskArtifact<'a> {
        TaskArtifact {
            operation_id: &self.task.operation_id,
            lease_token: &self.task.lease_token,
            name,
            content_type,
        }
    }
}

async fn claim(f: &Fixture) -> Task {
    let mut tasks = f
        .store
        .task_claim(ClaimParams {
            kinds: vec!["export".into()],
            max_tasks: 1,
            lease: LEASE,
            worker_id: "w1".into(),
            now: f.clock.now(),
        })
        .await
        .unwrap();
    assert_eq!(tasks.len(), 1);
    tasks.remove(0)
}

/// Runs the export for `task` until it reports, or vanishes where `at` says.
async fn run(f: &Arc<Fixture>, task: Task, at: At, stored: &Arc<AtomicU64>) {
    let vanish = Arc::new(tokio::sync::Notify::new());
    let link = Arc::new(Link {
        f: f.clone(),
        task: task.clone(),
        at,
        reports: AtomicUsize::new(0),
        stored: stored.clone(),
        vanish: vanish.clone(),
    });
    let ctx = TaskContext::new(
        task.operation_id.clone(),
        task.attempt,
        task.input.clone(),
        link,
        Arc::new(StopFlags::default()),
    )
    .with_progress_interval(Duration::ZERO)
    .with_checkpoint(task.checkpoint.clone());
    tokio::select! {
        result = run_task(Arc::new(Export), ctx, Duration::from_secs(3600)) => result.unwrap(),
        () = vanish.notified() => {}
    }
}

async fn submit(f: &Fixture) -> Id {
    let mut params = longrun_store::conformance::accept_params("t1", "export", None, json!({"rows": ROWS}));
    params.now = f.clock.now();
    match f.store.operation_accept(params).await.unwrap() {
        AcceptOutcome::Created(op) => op.id,
        other => panic!("{other:?}"),
    }
}

/// The SHA-256 and size of an uninterrupted export.
fn uninterrupted() -> (String, u64) {
    let mut hasher = Sha256::new();
    hasher.update(CSV_HEADER.as_bytes());
    let mut size = CSV_HEADER.len() as u64;
    for from in (0..ROWS).step_by(50_000) {
        let rows = render(Format::Csv, from, (from + 50_000).min(ROWS));
        size += rows.len() as u64;
        hasher.update(rows.as_bytes());
    }
    (data_encoding::HEXLOWER.encode(&hasher.finalize()), size)
}

/// The published artifact's SHA-256, computed from its stored bytes.
async fn published(f: &Fixture, id: &Id) -> (String, u64, String) {
    let op = f.store.operation_get("t1", id).await.unwrap().unwrap();
    assert_eq!(op.state, State::Succeeded, "{op:?}");
    let record = f
        .store
        .result_for_operation("t1", id)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == DEFAULT_ARTIFACT)
        .expect("a published artifact");
    let mut reader = f
        .artifacts
        .open(&record.storage_key, 0, record.size_bytes as u64)
        .await
        .unwrap();
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = reader.read(&mut buffer).await.unwrap();
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buffer[..n]);
    }
    (data_encoding::HEXLOWER.encode(&hasher.finalize()), size, record.sha256)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_paused_mid_file_resumes_to_the_same_bytes() {
    let f = Arc::new(fixture().await);
    let id = submit(&f).await;
    let stored = Arc::new(AtomicU64::new(0));
    // Paused at its fifth report: 250,000 rows, inside the second piece.
    run(&f, claim(&f).await, At::Pause(5), &stored).await;
    let paused = f.store.operation_get("t1", &id).await.unwrap().unwrap();
    assert_eq!((paused.state, paused.attempt), (State::Paused, 1));
    assert_eq!(paused.progress.unwrap().completed_units, Some(250_000.0));

    let resumed = f
        .store
        .operation_intent(IntentParams {
            tenant: "t1".into(),
            id: id.clone(),
            desired: DesiredState::Running,
            if_match: Some(paused.version),
            now: f.clock.now(),
        })
        .await
        .unwrap();
    assert_eq!(resumed.state, State::Queued);
    let task = claim(&f).await;
    assert_eq!(task.attempt, 1, "a pause is not an attempt");
    assert_eq!(task.checkpoint.as_ref().unwrap()["rows_done"], 250_000);
    run(&f, task, At::Nothing, &stored).await;

    let (sha256, size, recorded) = published(&f, &id).await;
    let (expected, expected_size) = uninterrupted();
    assert_eq!(
        (sha256.as_str(), size),
        (expected.as_str(), expected_size),
        "byte-identical"
    );
    assert_eq!(recorded, expected, "the recorded digest is the file's");
    assert_eq!(stored.load(Ordering::SeqCst), expected_size, "each row stored once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_whose_worker_vanished_resumes_at_its_last_checkpoint() {
    let f = Arc::new(fixture().await);
    let id = submit(&f).await;
    let stored = Arc::new(AtomicU64::new(0));
    // Gone at its sixth report: the first piece and its checkpoint are
    // stored, the second (300,000 rows in) was never recorded.
    run(&f, claim(&f).await, At::Vanish(6), &stored).await;
    f.clock.advance(LEASE + Duration::from_secs(1));
    let reaped = f
        .store
        .task_reap(ReapParams {
            now: f.clock.now(),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(reaped.requeued, 1);
    f.clock.advance(Duration::from_secs(60));
    let task = claim(&f).await;
    assert_eq!(task.attempt, 2);
    assert_eq!(task.checkpoint.as_ref().unwrap()["rows_done"], 200_000);
    run(&f, task, At::Nothing, &stored).await;

    let (sha256, size, _) = published(&f, &id).await;
    let (expected, expected_size) = uninterrupted();
    assert_eq!(
        (sha256.as_str(), size),
        (expected.as_str(), expected_size),
        "byte-identical"
    );
    assert_eq!(
        stored.load(Ordering::SeqCst),
        expected_size,
        "rows after the checkpoint were never recorded, so none is stored twice"
    );
}
