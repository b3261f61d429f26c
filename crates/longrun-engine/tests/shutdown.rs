//! The in-process dispatcher's shutdown against a real SQLite store: it
//! stops claiming, and what the tasks it started report within the grace is
//! stored, so no task it claimed is left running for the reaper.

use std::time::Duration;

use longrun_core::State;
use longrun_engine::in_process::dispatcher;
use longrun_engine::testing::{new_dispatcher, queue, sqlite_store, until_state};
use longrun_engine::{CancellationToken, Signals};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_drain_stores_every_outcome_of_what_it_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let registry = longrun_engine::kinds::builtin();
    let store = sqlite_store(dir.path(), &registry).await;
    let ids = queue(store.as_ref(), "sleep", json!({"duration_ms": 0, "steps": 1}), 400).await;
    let grace = Duration::from_secs(20);
    let config = dispatcher::Config {
        shutdown_grace: grace,
        ..dispatcher::Config::default()
    };
    let dispatcher = new_dispatcher(store.clone(), dir.path(), registry, Signals::default(), config);
    let stop = CancellationToken::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    // Stop mid-drain: once the first operation has ended, cycles are in
    // flight and outcomes are arriving.
    until_state(store.as_ref(), &ids[0], State::Succeeded).await;
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
