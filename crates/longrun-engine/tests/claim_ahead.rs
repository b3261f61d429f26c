//! The in-process dispatcher claims quick work ahead of its free slots (see
//! `longrun_engine::slots`) against a real SQLite store: however far ahead it
//! claims, no more handlers run at once than its concurrency, and each task
//! runs once and succeeds.

use std::sync::Arc;

use longrun_core::State;
use longrun_engine::dispatcher;
use longrun_engine::testing::{Counting, new_dispatcher, queue, sqlite_store, until_state};
use longrun_engine::{CancellationToken, Registry, Signals};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_work_claimed_ahead_runs_once_each_and_never_past_the_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(Counting::new("counting"));
    let mut registry = Registry::default();
    registry.register(handler.clone());
    let store = sqlite_store(dir.path(), &registry).await;
    let ids = queue(store.as_ref(), "counting", json!({}), 600).await;
    let concurrency = 3;
    let config = dispatcher::Config {
        concurrency,
        ..dispatcher::Config::default()
    };
    let dispatcher = new_dispatcher(store.clone(), dir.path(), registry, Signals::default(), config);
    let stop = CancellationToken::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    until_state(store.as_ref(), ids.last().unwrap(), State::Succeeded).await;
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
