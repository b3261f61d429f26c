//! Each maintenance service on its own: one `run_once` at a time against a
//! real SQLite store, with time moved by a `ManualClock` (no sleeps, no
//! server). The HTTP tests see the same services through the API; these pin
//! what each decides and when.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::{Clock, Id, IdKind, ManualClock, State, Timestamp};
use longrun_engine::Signals;
use longrun_engine::bytes::artifacts::{ArtifactStore, FileArtifacts};
use longrun_engine::services::enforcer::{self, Enforcer};
use longrun_engine::services::reaper::{self, Reaper};
use longrun_engine::services::retention::{self, Retention};
use longrun_engine::services::webhooks::{self, Deliverer, DeliveryCounts, DeliveryPolicy};
use longrun_store::conformance::accept_params;
use longrun_store::{
    AcceptOutcome, ClaimParams, FinishParams, KindSpec, Operation, Outcome, ResultUploadParams, SqliteConfig,
    SqliteStore, Store, Task,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE: Duration = Duration::from_secs(30);

struct Fixture {
    store: Arc<dyn Store>,
    clock: ManualClock,
    dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).unwrap();
    Fixture {
        store: Arc::new(store),
        clock: ManualClock::new(Timestamp(1_800_000_000_000)),
        dir,
    }
}

impl Fixture {
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(self.clock.clone())
    }

    async fn declare(&self, kind: &str, rerun_safe: bool) {
        self.store
            .kind_upsert(KindSpec {
                name: kind.into(),
                builtin: false,
                rerun_safe,
                max_attempts: 3,
                default_deadline_seconds: None,
                max_deadline_seconds: None,
                pausable: false,
            })
            .await
            .unwrap();
    }

    async fn submit(&self, kind: &str, change: impl FnOnce(&mut longrun_store::AcceptParams)) -> Operation {
        let mut params = accept_params("t1", kind, None, json!({}));
        params.now = self.clock.now();
        change(&mut params);
        match self.store.operation_accept(params).await.unwrap() {
            AcceptOutcome::Created(op) => op,
            other => panic!("{other:?}"),
        }
    }

    async fn claim(&self, kind: &str) -> Task {
        let mut tasks = self
            .store
            .task_claim(ClaimParams {
                kinds: vec![kind.into()],
                max_tasks: 1,
                lease: LEASE,
                worker_id: "w1".into(),
                now: self.clock.now(),
            })
            .await
            .unwrap();
        assert_eq!(tasks.len(), 1, "one task of {kind} to claim");
        tasks.remove(0)
    }

    async fn get(&self, op: &Operation) -> Operation {
        self.store.operation_get("t1", &op.id).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn the_reaper_requeues_lapsed_rerun_safe_work_and_fails_the_rest_only_once_the_lease_lapses() {
    let f = fixture();
    f.declare("safe", true).await;
    f.declare("unsafe", false).await;
    let safe = f.submit("safe", |_| {}).await;
    let unsafe_ = f.submit("unsafe", |_| {}).await;
    f.claim("safe").await;
    f.claim("unsafe").await;
    let signals = Signals::default();
    let mut woken = signals.watch_work();
    let reaper = Reaper::new(f.store.clone(), signals, f.clock(), reaper::Config::default());

    f.clock.advance(LEASE);
    assert_eq!(
        reaper.run_once().await.unwrap(),
        Default::default(),
        "a lease lapses after, not at, its expiry"
    );
    f.clock.advance(Duration::from_millis(1));
    let counts = reaper.run_once().await.unwrap();
    assert_eq!((counts.requeued, counts.failed_outcome_unknown), (1, 1));
    tokio::time::timeout(Duration::from_secs(5), woken.changed())
        .await
        .expect("requeued work wakes the claimers");
    assert_eq!(
        f.get(&safe).await.state,
        State::Running,
        "a retry keeps the public state"
    );
    let failed = f.get(&unsafe_).await;
    assert_eq!(failed.state, State::Failed);
    assert_eq!(failed.error.unwrap().code, "outcome_unknown");
    assert_eq!(
        reaper.run_once().await.unwrap(),
        Default::default(),
        "nothing is reaped twice"
    );
}

#[tokio::test]
async fn the_enforcer_fails_late_queued_work_asks_late_running_work_to_stop_then_ends_it() {
    let f = fixture();
    f.declare("k", true).await;
    let deadline = f.clock.now().plus(Duration::from_secs(10));
    let running = f.submit("k", |p| p.deadline_at = Some(deadline)).await;
    let leased = f.claim("k").await;
    assert_eq!(leased.operation_id, running.id);
    let queued = f.submit("k", |p| p.deadline_at = Some(deadline)).await;
    let config = enforcer::Config {
        grace: Duration::from_secs(30),
        ..enforcer::Config::default()
    };
    let enforcer = Enforcer::new(f.store.clone(), f.clock(), config);

    assert_eq!(
        enforcer.run_once().await.unwrap(),
        Default::default(),
        "nothing is late yet"
    );
    f.clock.advance(Duration::from_secs(11));
    let counts = enforcer.run_once().await.unwrap();
    assert_eq!((counts.expired_before_start, counts.cancel_requested), (1, 1));
    let never_started = f.get(&queued).await;
    assert_eq!(never_started.state, State::Failed);
    assert_eq!(never_started.error.unwrap().code, "deadline_exceeded");
    assert!(f.get(&running).await.cancel.is_some(), "running work is asked to stop");

    // The worker ignores the stop: after the grace it is ended and fenced.
    f.clock.advance(Duration::from_secs(31));
    assert_eq!(enforcer.run_once().await.unwrap().ended_without_ack, 1);
    assert_eq!(f.get(&running).await.state, State::Failed);
    let late = f
        .store
        .task_finish(FinishParams {
            operation_id: leased.operation_id.clone(),
            lease_token: leased.lease_token.clone(),
            outcome: Outcome::Succeeded { result: None },
            progress: None,
            now: f.clock.now(),
        })
        .await;
    assert!(late.is_err(), "the worker that ignored the stop is fenced out");
}

#[tokio::test]
async fn retention_expires_results_removes_operations_and_deletes_their_objects_when_due() {
    let f = fixture();
    f.declare("k", true).await;
    let artifacts = Arc::new(FileArtifacts::new(f.dir.path().join("artifacts")));
    let op = f.submit("k", |_| {}).await;
    let task = f.claim("k").await;
    let bytes: &'static [u8] = b"a,b\n1,2\n";
    artifacts.put("results/one", Box::pin(bytes), 1 << 20).await.unwrap();
    f.store
        .result_upload(ResultUploadParams {
            operation_id: task.operation_id.clone(),
            lease_token: task.lease_token.clone(),
            name: longrun_store::DEFAULT_ARTIFACT.into(),
            result_id: Id::generate(IdKind::Result),
            storage_key: "results/one".into(),
            content_type: "text/csv".into(),
            size_bytes: bytes.len() as i64,
            sha256: "ab".repeat(32),
            joins_pieces: false,
            now: f.clock.now(),
        })
        .await
        .unwrap();
    let done = f
        .store
        .task_finish(FinishParams {
            operation_id: task.operation_id,
            lease_token: task.lease_token,
            outcome: Outcome::Succeeded { result: None },
            progress: None,
            now: f.clock.now(),
        })
        .await
        .unwrap();
    let retention = Retention::new(
        f.store.clone(),
        artifacts.clone(),
        f.clock(),
        retention::Config::default(),
    );

    assert_eq!(
        retention.run_once().await.unwrap(),
        Default::default(),
        "nothing is due yet"
    );
    f.clock.set(done.artifact.unwrap().expires_at);
    let report = retention.run_once().await.unwrap();
    assert_eq!((report.records.results_expired, report.objects_deleted), (1, 1));
    assert!(artifacts.list().await.unwrap().is_empty(), "the object is deleted");
    assert_eq!(f.get(&op).await.state, State::Succeeded);

    f.clock.set(done.expires_at.unwrap());
    let report = retention.run_once().await.unwrap();
    assert_eq!(report.records.operations_removed, 1);
    assert!(f.store.operation_get("t1", &op.id).await.unwrap().is_none());
    assert_eq!(
        retention.run_once().await.unwrap(),
        Default::default(),
        "a pass is idempotent"
    );
}

/// Makes every object of `artifacts` (under `root`) look `age` old to the
/// file system, whose clock the orphan sweep reads.
fn age_every_object(root: &std::path::Path, age: Duration) {
    fn walk(dir: &std::path::Path, at: std::time::SystemTime) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, at);
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_modified(at)
                    .unwrap();
            }
        }
    }
    walk(root, std::time::SystemTime::now() - age);
}

/// The crash windows of issue 46: an object stored and never recorded — a
/// result, an upload piece, a half-written temporary file — is deleted by
/// the first retention pass that finds it older than the grace period;
/// every object a row names stays.
#[tokio::test]
async fn retention_deletes_orphaned_objects_past_their_grace_and_nothing_named() {
    let f = fixture();
    f.declare("k", true).await;
    let root = f.dir.path().join("artifacts");
    let artifacts = Arc::new(FileArtifacts::new(&root));
    f.submit("k", |_| {}).await;
    let task = f.claim("k").await;
    let body = |bytes: &'static [u8]| -> longrun_engine::bytes::artifacts::ByteReader { Box::pin(bytes) };

    // Named: a result stored and recorded, and an upload piece appended.
    let target = longrun_engine::bytes::results::TaskArtifact {
        operation_id: &task.operation_id,
        lease_token: &task.lease_token,
        name: longrun_store::DEFAULT_ARTIFACT,
        content_type: "text/csv",
    };
    let result = longrun_engine::bytes::results::store_upload(
        f.store.as_ref(),
        artifacts.as_ref(),
        target,
        body(b"a,b\n"),
        1 << 20,
        f.clock.now(),
    )
    .await
    .unwrap();
    let upload = Id::generate(IdKind::Upload);
    f.store
        .upload_create(longrun_store::UploadCreateParams {
            id: upload.clone(),
            tenant: "t1".into(),
            content_type: "text/csv".into(),
            expected_sha256: None,
            now: f.clock.now(),
            expires_at: f.clock.now().plus(Duration::from_secs(86_400)),
        })
        .await
        .unwrap();
    let kept = longrun_engine::bytes::uploads::store_piece(artifacts.as_ref(), &upload, 0, body(b"1,2\n"), 1 << 20)
        .await
        .unwrap();
    f.store
        .upload_append(longrun_store::UploadAppendParams {
            tenant: "t1".into(),
            id: upload.clone(),
            offset: 0,
            chunk: kept.chunk.clone(),
            sha256: None,
            expected_sha256: None,
            now: f.clock.now(),
        })
        .await
        .unwrap();

    // The injected crash: stored, then the process died before recording.
    artifacts
        .put(
            &format!("results/{}", Id::generate(IdKind::Result)),
            body(b"lost"),
            1 << 20,
        )
        .await
        .unwrap();
    longrun_engine::bytes::uploads::store_piece(artifacts.as_ref(), &upload, 4, body(b"lost"), 1 << 20)
        .await
        .unwrap();
    std::fs::create_dir_all(root.join(".tmp")).unwrap();
    std::fs::write(root.join(".tmp/half-written"), b"lo").unwrap();
    assert_eq!(artifacts.list().await.unwrap().len(), 5);

    let retention = Retention::new(
        f.store.clone(),
        artifacts.clone(),
        f.clock(),
        retention::Config::default(),
    );
    // Young objects are never orphans: their rows may be a moment away.
    assert_eq!(retention.run_once().await.unwrap().orphans_deleted, 0);
    assert_eq!(artifacts.list().await.unwrap().len(), 5);

    // An hour and more later, at the next sweep.
    age_every_object(&root, Duration::from_secs(2 * 3600));
    assert_eq!(
        retention.run_once().await.unwrap().orphans_deleted,
        0,
        "the sweep runs once per orphan_interval"
    );
    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(retention.run_once().await.unwrap().orphans_deleted, 3);
    let mut named = vec![format!("results/{}", result.id), kept.chunk.storage_key.clone()];
    named.sort();
    assert_eq!(artifacts.list().await.unwrap(), named, "what rows name stays");
    assert!(
        f.store.upload_get("t1", &upload).await.unwrap().is_some(),
        "the upload is untouched"
    );
}

/// A receiver on loopback that answers each request with the next status.
async fn receiver(statuses: Vec<u16>) -> (String, tokio::task::JoinHandle<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let handle = tokio::spawn(async move {
        for status in &statuses {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the head and a body of Content-Length bytes.
            loop {
                let n = stream.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let response = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            stream.write_all(response.as_bytes()).await.unwrap();
        }
        statuses.len()
    });
    (url, handle)
}

#[tokio::test]
async fn the_deliverer_retries_on_its_schedule_and_stops_once_delivered() {
    let f = fixture();
    f.declare("k", true).await;
    let (url, received) = receiver(vec![500, 204]).await;
    f.submit("k", |p| p.callback_url = Some(url)).await;
    f.claim("k").await;
    let config = webhooks::Config {
        schedule: vec![Duration::ZERO, Duration::from_secs(60)],
        policy: DeliveryPolicy {
            allow_http: true,
            allow_private: true,
        },
        reuse_connections: false,
        ..webhooks::Config::default()
    };
    let deliverer = Arc::new(Deliverer::new(f.store.clone(), f.clock(), config));

    let (counts, found) = deliverer.run_once().await.unwrap();
    assert_eq!(found, 1, "the start (operation.running) is due at once");
    assert_eq!(
        counts,
        DeliveryCounts {
            retrying: 1,
            ..Default::default()
        }
    );
    f.clock.advance(Duration::from_secs(59));
    assert_eq!(deliverer.run_once().await.unwrap().1, 0, "not before its retry time");
    // The schedule's 60 s, plus up to 10 % jitter.
    f.clock.advance(Duration::from_secs(7));
    let (counts, found) = deliverer.run_once().await.unwrap();
    assert_eq!(found, 1, "due at its retry time");
    assert_eq!(
        counts,
        DeliveryCounts {
            delivered: 1,
            ..Default::default()
        }
    );
    assert_eq!(received.await.unwrap(), 2);
    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(
        deliverer.run_once().await.unwrap().1,
        0,
        "a delivered event is never sent again"
    );
}
