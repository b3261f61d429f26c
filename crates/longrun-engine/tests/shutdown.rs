//! The in-process dispatcher's shutdown against a real SQLite store: it
//! stops claiming, and what the tasks it started report within the grace is
//! stored, so no task it claimed is left running for the reaper.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::{Clock, Id, State, SystemClock};
use longrun_engine::artifacts::FileArtifacts;
use longrun_engine::dispatcher::{self, Dispatcher};
use longrun_engine::{CancellationToken, Registry, Signals};
use longrun_store::conformance::accept_params;
use longrun_store::{AcceptOutcome, SqliteConfig, SqliteStore, Store};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_drain_stores_every_outcome_of_what_it_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).unwrap());
    let registry = Registry::builtin();
    for spec in registry.specs() {
        store.kind_upsert(spec).await.unwrap();
    }
    let mut ids: Vec<Id> = Vec::new();
    for _ in 0..400 {
        let mut params = accept_params("t1", "sleep", None, json!({"duration_ms": 0, "steps": 1}));
        params.now = SystemClock.now();
        let AcceptOutcome::Created(op) = store.operation_accept(params).await.unwrap() else {
            panic!("a new operation");
        };
        ids.push(op.id);
    }
    let grace = Duration::from_secs(20);
    let config = dispatcher::Config {
        shutdown_grace: grace,
        ..dispatcher::Config::default()
    };
    let dispatcher = Dispatcher::new(
        store.clone(),
        Arc::new(FileArtifacts::new(dir.path().join("artifacts"))),
        registry,
        Signals::default(),
        Arc::new(SystemClock),
        config,
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    // Stop mid-drain: once the first operation has ended, cycles are in
    // flight and outcomes are arriving.
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.operation_get("t1", &ids[0]).await.unwrap().unwrap().state != State::Succeeded {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the drain starts");
    stop.cancel();
    tokio::time::timeout(grace * 2, running)
        .await
        .expect("the dispatcher stops")
        .unwrap();

    let (mut queued, mut succeeded) = (0, 0);
    for id in &ids {
        match store.operation_get("t1", id).await.unwrap().unwrap().state {
            State::Queued => queued += 1,
            State::Succeeded => succeeded += 1,
            other => panic!("{id} is {other:?} after the shutdown: claimed, and its outcome not stored"),
        }
    }
    assert!(
        succeeded >= 1 && queued + succeeded == ids.len(),
        "{succeeded} ended, {queued} left queued"
    );
}
