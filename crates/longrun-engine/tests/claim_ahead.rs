//! The in-process dispatcher claims quick work ahead of its free slots (see
//! `Dispatcher::reserve`) against a real SQLite store: however far ahead it
//! claims, no more handlers run at once than its concurrency, and each task
//! runs once and succeeds.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::{Clock, Id, State, SystemClock};
use longrun_engine::artifacts::FileArtifacts;
use longrun_engine::dispatcher::{self, Dispatcher};
use longrun_engine::testing::Counting;
use longrun_engine::{CancellationToken, Registry, Signals};
use longrun_store::conformance::accept_params;
use longrun_store::{AcceptOutcome, SqliteConfig, SqliteStore, Store};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_work_claimed_ahead_runs_once_each_and_never_past_the_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).unwrap());
    let handler = Arc::new(Counting::new("counting"));
    let mut registry = Registry::default();
    registry.register(handler.clone());
    for spec in registry.specs() {
        store.kind_upsert(spec).await.unwrap();
    }
    let mut ids: Vec<Id> = Vec::new();
    for _ in 0..600 {
        let mut params = accept_params("t1", "counting", None, json!({}));
        params.now = SystemClock.now();
        let AcceptOutcome::Created(op) = store.operation_accept(params).await.unwrap() else {
            panic!("a new operation");
        };
        ids.push(op.id);
    }
    let concurrency = 3;
    let config = dispatcher::Config {
        concurrency,
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

    let last = ids.last().unwrap().clone();
    tokio::time::timeout(Duration::from_secs(60), async {
        while store.operation_get("t1", &last).await.unwrap().unwrap().state != State::Succeeded {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the queue drains");
    stop.cancel();
    running.await.unwrap();

    for id in &ids {
        let op = store.operation_get("t1", id).await.unwrap().unwrap();
        assert_eq!(op.state, State::Succeeded, "{id}");
        assert_eq!(
            op.attempt, 1,
            "{id} was claimed again: its lease lapsed while it waited"
        );
    }
    let runs = handler.runs();
    assert_eq!(runs.len(), ids.len());
    assert!(runs.values().all(|&n| n == 1), "a task ran twice");
    let most = handler.most_at_once();
    assert!(
        (1..=concurrency).contains(&most),
        "{most} handlers ran at once, with concurrency {concurrency}"
    );
}
