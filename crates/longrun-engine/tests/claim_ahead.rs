//! The in-process dispatcher claims quick work ahead of its free slots (see
//! `longrun_engine::slots`) against a real SQLite store: however far ahead it
//! claims, no more handlers run at once than its concurrency, and each task
//! runs once and succeeds; a task claimed ahead and cancelled while it waits
//! ends at once, without running.

use std::sync::Arc;

use longrun_core::validate::Invalid;
use longrun_core::{Clock, Id, State, SystemClock};
use longrun_engine::in_process::dispatcher;
use longrun_engine::testing::{Counting, kind, new_dispatcher, queue, sqlite_store, until_state};
use longrun_engine::{CancellationToken, Registry, Signals};
use longrun_store::{CancelOutcome, CancelParams};
use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};
use serde_json::{Value, json};

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

/// Holds its slot until the test opens the gate; says when each run starts.
struct Held {
    gate: Arc<tokio::sync::Semaphore>,
    started: tokio::sync::mpsc::UnboundedSender<Id>,
}

#[async_trait::async_trait]
impl Handler for Held {
    fn info(&self) -> KindInfo {
        kind("held")
    }

    fn validate(&self, _: &Value) -> Result<(), Invalid> {
        Ok(())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let _ = self.started.send(ctx.operation_id().clone());
        let _open = self.gate.acquire().await.expect("the gate stays open");
        Ok(None)
    }
}

/// One drain at concurrency 1: quick work, then `holder` (held at its gate)
/// and `waiter` behind it. Cancels `waiter` once `holder` runs; `Some` with
/// what followed if `waiter` had been claimed ahead (the cancel found it
/// running), `None` if it was still queued.
async fn cancel_behind_a_held_slot() -> Option<(State, State, Vec<Id>)> {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let mut registry = Registry::default();
    registry.register(Arc::new(Counting::new("counting")));
    registry.register(Arc::new(Held {
        gate: gate.clone(),
        started,
    }));
    let store = sqlite_store(dir.path(), &registry).await;
    queue(store.as_ref(), "counting", json!({}), 300).await;
    let first = queue(store.as_ref(), "held", json!({}), 1).await.remove(0);
    let second = queue(store.as_ref(), "held", json!({}), 1).await.remove(0);
    let signals = Signals::default();
    let config = dispatcher::Config {
        concurrency: 1,
        ..dispatcher::Config::default()
    };
    let dispatcher = new_dispatcher(store.clone(), dir.path(), registry, signals.clone(), config);
    let stop = CancellationToken::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    // Whichever of the two takes the one slot holds it; the other waits
    // behind it. (Tasks claimed ahead each wait for a slot in a task of
    // their own, and the runtime may poll the later one first: claims keep
    // their order, the start of work claimed ahead need not.)
    let started_first = starts.recv().await.expect("one of the two runs");
    assert!(
        started_first == first || started_first == second,
        "a held task runs first"
    );
    let (holder, waiter) = if started_first == first {
        (first, second)
    } else {
        (second, first)
    };
    // What the server does for `POST …/cancel`.
    let outcome = store
        .operation_cancel(CancelParams {
            tenant: "t1".into(),
            id: waiter.clone(),
            requested_by: "test".into(),
            reason: None,
            if_match: None,
            now: SystemClock.now(),
        })
        .await
        .unwrap();
    let claimed_ahead = matches!(outcome, CancelOutcome::Requested(_));
    if claimed_ahead {
        signals.cancel_requested(&waiter);
        until_state(store.as_ref(), &waiter, State::Cancelled).await;
    }
    let holder_then = store.operation_get("t1", &holder).await.unwrap().unwrap().state;
    gate.add_permits(1);
    until_state(store.as_ref(), &holder, State::Succeeded).await;
    stop.cancel();
    running.await.unwrap();
    let waiter_end = store.operation_get("t1", &waiter).await.unwrap().unwrap().state;
    let mut others = Vec::new();
    while let Ok(id) = starts.try_recv() {
        others.push(id);
    }
    claimed_ahead.then_some((holder_then, waiter_end, others))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_claimed_ahead_and_cancelled_ends_at_once_without_running_and_without_its_slot() {
    // Quick work just ended when the two are claimed, so the waiter is
    // claimed ahead nearly always; a machine that stalls past the window
    // leaves it queued, and the drain is tried again.
    for _ in 0..5 {
        if let Some((holder_then, waiter_end, others)) = cancel_behind_a_held_slot().await {
            assert_eq!(
                holder_then,
                State::Running,
                "the waiter ended while the holder still held the one slot"
            );
            assert_eq!(waiter_end, State::Cancelled);
            assert!(others.is_empty(), "the cancelled waiter's handler ran: {others:?}");
            return;
        }
    }
    panic!("in 5 drains the waiter was never claimed ahead");
}
