//! The in-process dispatcher against a real SQLite store: an idle one does
//! not claim in a loop, and new work starts on its wake-up, not on the poll.
//! Cycles are counted through `longrun_dispatcher_cycles_total`, with a
//! debugging recorder this test binary installs for itself (one test, so
//! nothing else counts into it).

use std::time::Duration;

use longrun_core::{State, SystemClock};
use longrun_engine::in_process::dispatcher;
use longrun_engine::testing::{new_dispatcher, queue, sqlite_store};
use longrun_engine::{CancellationToken, Signals};
use longrun_store::ClaimParams;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;

/// Cycles since the last call (the recorder hands counters out and resets them).
fn cycles(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "longrun_dispatcher_cycles_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("a counter, not {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_dispatcher_makes_one_cycle_a_poll_and_new_work_starts_on_its_wake_up() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");

    let dir = tempfile::tempdir().unwrap();
    let registry = longrun_engine::kinds::builtin();
    let store = sqlite_store(dir.path(), &registry).await;
    let signals = Signals::default();
    let config = dispatcher::Config {
        // Nothing in this test may wait for the poll.
        poll_interval: Duration::from_secs(3600),
        ..dispatcher::Config::default()
    };
    let dispatcher = new_dispatcher(store.clone(), dir.path(), registry, signals.clone(), config);
    let stop = CancellationToken::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    // Its first cycle is a claim that finds nothing.
    let mut seen = 0;
    tokio::time::timeout(Duration::from_secs(10), async {
        while seen == 0 {
            seen += cycles(&snapshotter);
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dispatcher looks for work once it starts");
    assert_eq!(seen, 1);

    // Then nothing, for as long as this test's own 200 empty claims take
    // through the same writer: a dispatcher that claimed in a loop would
    // have one in the writer's queue beside nearly each of them.
    for _ in 0..200 {
        let none = store
            .task_claim(ClaimParams {
                kinds: vec!["no-such-kind".into()],
                max_tasks: 1,
                lease: Duration::from_secs(30),
                worker_id: "test".into(),
                now: longrun_core::Clock::now(&SystemClock),
            })
            .await
            .unwrap();
        assert!(none.is_empty());
    }
    assert_eq!(cycles(&snapshotter), 0, "an idle dispatcher waits for work or the poll");

    // New work starts on the wake-up (the poll is an hour away).
    let id = queue(store.as_ref(), "sleep", json!({"duration_ms": 0, "steps": 1}), 1)
        .await
        .remove(0);
    signals.work_available();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let now = store.operation_get("t1", &id).await.unwrap().unwrap();
            if now.state == State::Succeeded {
                break;
            }
            assert!(!now.state.is_terminal(), "{now:?}");
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the task ran on its wake-up");
    // One cycle claimed it and one stored its outcome (perhaps with another
    // empty claim): a handful, not a loop.
    let after = cycles(&snapshotter);
    assert!((2..=4).contains(&after), "{after} cycles for one task");

    stop.cancel();
    running.await.unwrap();
}
