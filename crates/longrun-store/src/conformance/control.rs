//! What clients ask of live work: cancel, pause, resume, and checkpoints
//! across pauses and lapsed leases.

use super::*;

pub async fn cancelling_queued_work_cancels_it_at_once(store: &dyn Store) {
    let op = create(store, "t1", "cq").await;
    let CancelOutcome::CancelledNow(cancelled) = store.operation_cancel(cancel("t1", &op.id, at(1))).await.unwrap()
    else {
        panic!("expected CancelledNow")
    };
    assert_eq!(
        (cancelled.state, cancelled.version, cancelled.completed_at),
        (State::Cancelled, 2, Some(at(1)))
    );
    let request = cancelled.cancel.clone().unwrap();
    assert_eq!(
        (request.requested_by.as_str(), request.requested_at),
        ("key_test", at(1))
    );
    assert!(
        claim(store, "cq", 1, at(2)).await.is_empty(),
        "cancelled work is never started"
    );
    let again = store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap();
    assert_eq!(again, CancelOutcome::AlreadyTerminal(cancelled));
}

pub async fn cancelling_running_work_asks_the_worker(store: &dyn Store) {
    let op = create(store, "t1", "cr").await;
    let task = claim_one(store, "cr", at(1)).await;
    let CancelOutcome::Requested(requested) = store.operation_cancel(cancel("t1", &op.id, at(2))).await.unwrap() else {
        panic!("expected Requested")
    };
    assert_eq!((requested.state, requested.version), (State::Running, 3));
    assert!(matches!(
        store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap(),
        CancelOutcome::AlreadyRequested(ref o) if o.version == 3
    ));
    let ack = store.task_heartbeat(heartbeat(&task, at(4))).await.unwrap();
    assert!(ack.cancel_requested);
    assert_eq!(ack.cancel_reason.as_deref(), Some("changed my mind"));
    let done = store
        .task_finish(finish(&task, Outcome::Cancelled, at(5)))
        .await
        .unwrap();
    assert_eq!((done.state, done.version, done.error), (State::Cancelled, 4, None));
}

pub async fn worker_that_finishes_first_wins_the_cancel_race(store: &dyn Store) {
    let op = create(store, "t1", "race").await;
    let task = claim_one(store, "race", at(1)).await;
    store.operation_cancel(cancel("t1", &op.id, at(2))).await.unwrap();
    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(3)))
        .await
        .unwrap();
    assert_eq!(done.state, State::Succeeded);
    assert!(done.cancel.is_some(), "the request stays on record");
}

pub async fn cancel_after_the_commit_point_is_refused(store: &dyn Store) {
    let op = create(store, "t1", "commit").await;
    let task = claim_one(store, "commit", at(1)).await;
    let mut hb = heartbeat(&task, at(2));
    hb.cancellable = Some(false);
    store.task_heartbeat(hb).await.unwrap();
    // Saying "cancellable" again does not undo the commit point.
    let mut hb = heartbeat(&task, at(3));
    hb.cancellable = Some(true);
    store.task_heartbeat(hb).await.unwrap();
    assert!(matches!(
        store.operation_cancel(cancel("t1", &op.id, at(4))).await,
        Err(StoreError::NotCancellable)
    ));
    assert!(get(store, &op).await.cancel.is_none());
}

pub async fn cancel_honours_if_match(store: &dyn Store) {
    let op = create(store, "t1", "ifm").await;
    let mut stale = cancel("t1", &op.id, at(1));
    stale.if_match = Some(7);
    assert!(matches!(
        store.operation_cancel(stale).await,
        Err(StoreError::PreconditionFailed { current_version: 1 })
    ));
    let mut fresh = cancel("t1", &op.id, at(1));
    fresh.if_match = Some(1);
    assert!(matches!(
        store.operation_cancel(fresh).await.unwrap(),
        CancelOutcome::CancelledNow(_)
    ));
}

pub async fn intent_changes_need_the_current_version_and_terminal_intent_wins(store: &dyn Store) {
    let op = create(store, "t1", "patch").await;
    let update =
        |if_match, deadline: Option<Option<Timestamp>>, labels: Option<BTreeMap<String, String>>| UpdateParams {
            tenant: "t1".into(),
            id: op.id.clone(),
            if_match,
            deadline_at: deadline,
            labels,
            not_before: None,
            now: at(5),
        };
    let stale = store.operation_update(update(9, Some(Some(at(100))), None)).await;
    assert!(matches!(
        stale,
        Err(StoreError::PreconditionFailed { current_version: 1 })
    ));
    let labels: BTreeMap<String, String> = [("team".to_owned(), "red".to_owned())].into();
    let updated = store
        .operation_update(update(1, Some(Some(at(100))), Some(labels.clone())))
        .await
        .unwrap();
    assert_eq!(
        (updated.version, updated.deadline_at, updated.labels.clone()),
        (2, Some(at(100)), labels)
    );
    let same = store
        .operation_update(update(2, Some(Some(at(100))), None))
        .await
        .unwrap();
    assert_eq!(same.version, 2, "a change to the same values is no change");
    store.operation_cancel(cancel("t1", &op.id, at(6))).await.unwrap();
    let late = store.operation_update(update(3, Some(None), None)).await;
    assert!(matches!(late, Err(StoreError::Terminal { .. })), "{late:?}");
    let foreign = UpdateParams {
        tenant: "t2".into(),
        ..update(3, None, None)
    };
    assert!(matches!(
        store.operation_update(foreign).await,
        Err(StoreError::NotFound)
    ));
}

/// Pause against cancel, resume against cancel, pause against a claim, each
/// raced many times: every pair ends as one order of the two would, and
/// terminal intent dominates whatever the order.
pub async fn racing_intents_end_as_one_order_of_them_would(store: &dyn Store) {
    for round in 0..12u64 {
        let now = at(round * 10);
        // Pause against cancel, and resume (of paused work) against cancel:
        // cancelled either way; the intent applied first or refused.
        for (desired, applied) in [
            (DesiredState::Paused, State::Paused),
            (DesiredState::Running, State::Queued),
        ] {
            let op = create(store, "t1", "race").await;
            let version = match desired {
                DesiredState::Paused => 1,
                DesiredState::Running => {
                    let paused = store.operation_intent(intent(&op, DesiredState::Paused, 1, now)).await;
                    paused.unwrap().version
                }
            };
            let (intended, cancelled) = tokio::join!(
                store.operation_intent(intent(&op, desired, version, now)),
                store.operation_cancel(cancel("t1", &op.id, now)),
            );
            assert!(
                matches!(&intended, Ok(o) if o.state == applied)
                    || matches!(intended, Err(StoreError::IntentConflict { .. })),
                "{desired:?}: {intended:?}"
            );
            assert!(matches!(cancelled, Ok(CancelOutcome::CancelledNow(_))), "{cancelled:?}");
            assert_eq!(get(store, &op).await.state, State::Cancelled);
        }

        // Pause against a claim: paused and unclaimed, or running and refused.
        let op = create(store, "t1", "race-claim").await;
        let (paused, claimed) = tokio::join!(
            store.operation_intent(intent(&op, DesiredState::Paused, 1, now)),
            claim(store, "race-claim", 1, now),
        );
        match (&paused, claimed.len()) {
            (Ok(p), 0) => assert_eq!(p.state, State::Paused),
            (Err(StoreError::NotPausable { .. }), 1) => {
                assert_eq!(get(store, &op).await.state, State::Running);
                store
                    .task_finish(finish(&claimed[0], Outcome::Succeeded { result: None }, now))
                    .await
                    .unwrap();
            }
            other => panic!("pause against claim: {other:?}"),
        }
        let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
        let versions: Vec<i64> = history.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=versions.len() as i64).collect::<Vec<_>>());

        // A pausable kind: paused before the claim, or asked of the worker
        // that took it (who hears it at its first heartbeat).
        declare_pausable(store, "race-pausable").await;
        let op = create(store, "t1", "race-pausable").await;
        let (paused, claimed) = tokio::join!(
            store.operation_intent(intent(&op, DesiredState::Paused, 1, now)),
            claim(store, "race-pausable", 1, now),
        );
        match (&paused, claimed.as_slice()) {
            (Ok(p), []) => assert_eq!(p.state, State::Paused),
            (Ok(p), [task]) => {
                assert!(p.pause_requested(), "{p:?}");
                let ack = store.task_heartbeat(heartbeat(task, now)).await.unwrap();
                assert!(ack.pause_requested);
                let done = store
                    .task_finish(finish(task, Outcome::Paused { checkpoint: None }, now))
                    .await
                    .unwrap();
                assert_eq!(done.state, State::Paused);
            }
            // The claim came first and moved the version the client named.
            (Err(StoreError::PreconditionFailed { current_version: 2 }), [task]) => {
                store
                    .task_finish(finish(task, Outcome::Succeeded { result: None }, now))
                    .await
                    .unwrap();
            }
            other => panic!("pause against a claim of a pausable kind: {other:?}"),
        }
    }
    // A paused operation keeps its place out of the queue until resumed.
    let op = create(store, "t1", "held").await;
    store
        .operation_intent(intent(&op, DesiredState::Paused, 1, at(500)))
        .await
        .unwrap();
    assert!(
        claim(store, "held", 1, at(501)).await.is_empty(),
        "paused work is not claimed"
    );
    let resumed = store
        .operation_intent(intent(&op, DesiredState::Running, 2, at(502)))
        .await
        .unwrap();
    assert_eq!((resumed.state, resumed.version), (State::Queued, 3));
    assert_eq!(
        claim(store, "held", 1, at(503)).await.len(),
        1,
        "resumed work is claimed"
    );
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    let types: Vec<&str> = history.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, vec!["created", "paused", "resumed", "started"]);
}

/// A pause of running work is asked of its worker (`pause_requested`,
/// `desired_state` paused while the state is still running); the worker's
/// `paused` report ends its lease and is not an attempt; a resume queues
/// the work, and the next claim gets the checkpoint. A kind not declared
/// pausable refuses; a `paused` report nobody asked for is refused.
pub async fn pausing_running_work_asks_its_worker_and_resumes_from_its_checkpoint(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    assert_eq!(task.checkpoint, None, "a fresh start");
    let ack = store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 10}), at(2)))
        .await
        .unwrap();
    assert_eq!(
        (ack.version, ack.pause_requested),
        (2, false),
        "a checkpoint is no new version"
    );
    // Nobody asked: the report is refused and the lease stays.
    let unasked = store
        .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(3)))
        .await;
    assert!(
        matches!(unasked, Err(StoreError::IntentConflict { current_version: 2 })),
        "{unasked:?}"
    );

    let asked = store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(4)))
        .await
        .unwrap();
    assert_eq!(
        (asked.state, asked.version, asked.pause_requested_at),
        (State::Running, 3, Some(at(4)))
    );
    let again = store
        .operation_intent(intent(&op, DesiredState::Paused, 3, at(5)))
        .await
        .unwrap();
    assert_eq!(again.version, 3, "asking again changes nothing");
    let ack = store.task_heartbeat(heartbeat(&task, at(6))).await.unwrap();
    assert!(ack.pause_requested && !ack.cancel_requested);

    let paused = store
        .task_finish(finish(
            &task,
            Outcome::Paused {
                checkpoint: Some(json!({"row": 20})),
            },
            at(7),
        ))
        .await
        .unwrap();
    assert_eq!(
        (paused.state, paused.attempt, paused.pause_requested_at),
        (State::Paused, 1, None)
    );
    assert!(matches!(
        store.task_heartbeat(heartbeat(&task, at(8))).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(
        claim(store, "pausable", 1, at(9)).await.is_empty(),
        "paused work is not claimed"
    );
    let resumed = store
        .operation_intent(intent(&op, DesiredState::Running, paused.version, at(10)))
        .await
        .unwrap();
    assert_eq!(resumed.state, State::Queued);
    let next = claim_one(store, "pausable", at(11)).await;
    assert_eq!(
        (next.attempt, next.checkpoint),
        (1, Some(json!({"row": 20}))),
        "a pause is not an attempt; the claim hands the checkpoint"
    );
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(
        event_types(&history),
        vec!["created", "started", "pause_requested", "paused", "resumed", "started"]
    );

    // Running work of a kind not declared pausable cannot be paused.
    let plain = create(store, "t1", "not-pausable").await;
    claim_one(store, "not-pausable", at(12)).await;
    assert!(matches!(
        store
            .operation_intent(intent(&plain, DesiredState::Paused, 2, at(13)))
            .await,
        Err(StoreError::NotPausable { current_version: 2 })
    ));
}

/// Terminal intent dominates a pause of running work: a cancel after the
/// request ends the work as the cancel says even when the worker reports
/// `paused`; after a cancel no pause is applied. A worker that finishes
/// first wins over the pause. A pause withdrawn before the worker answers
/// leaves it running.
pub async fn a_pause_of_running_work_meets_terminal_intent_and_completion(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    // Pause, then cancel, then the worker's paused report: cancelled.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(2)))
        .await
        .unwrap();
    let cancelled = store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap();
    assert!(matches!(cancelled, CancelOutcome::Requested(_)), "{cancelled:?}");
    let ack = store.task_heartbeat(heartbeat(&task, at(4))).await.unwrap();
    assert!(
        ack.cancel_requested && !ack.pause_requested,
        "the cancel is what the worker hears"
    );
    let ended = store
        .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(5)))
        .await
        .unwrap();
    assert_eq!(ended.state, State::Cancelled);
    assert!(matches!(
        store
            .operation_intent(intent(&ended, DesiredState::Running, ended.version, at(6)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));

    // Cancel first: a pause is refused whatever the version.
    let op = create(store, "t1", "pausable").await;
    claim_one(store, "pausable", at(10)).await;
    store.operation_cancel(cancel("t1", &op.id, at(11))).await.unwrap();
    assert!(matches!(
        store
            .operation_intent(intent(&op, DesiredState::Paused, 1, at(12)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));

    // The worker completes before it hears of the pause: succeeded.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(20)).await;
    let (paused, done) = tokio::join!(
        store.operation_intent(intent(&op, DesiredState::Paused, 2, at(21))),
        store.task_finish(finish(&task, Outcome::Succeeded { result: None }, at(21))),
    );
    assert_eq!(done.unwrap().state, State::Succeeded, "a worker that finishes wins");
    assert!(
        matches!(&paused, Ok(o) if o.state == State::Running)
            || matches!(
                paused,
                Err(StoreError::IntentConflict { .. }) | Err(StoreError::PreconditionFailed { .. })
            ),
        "{paused:?}"
    );
    assert_eq!(get(store, &op).await.state, State::Succeeded);

    // Withdrawn before the worker answers: it runs on and hears nothing.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(30)).await;
    let asked = store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(31)))
        .await
        .unwrap();
    let withdrawn = store
        .operation_intent(intent(&op, DesiredState::Running, asked.version, at(32)))
        .await
        .unwrap();
    assert_eq!((withdrawn.state, withdrawn.pause_requested_at), (State::Running, None));
    assert!(
        !store
            .task_heartbeat(heartbeat(&task, at(33)))
            .await
            .unwrap()
            .pause_requested
    );
    assert!(matches!(
        store
            .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(34)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(
        event_types(&history),
        vec!["created", "started", "pause_requested", "pause_withdrawn"]
    );
}

/// A crashed worker's last checkpoint goes to the next attempt; a lapse
/// while a pause was asked pauses the work; a `from_checkpoint` re-run
/// starts where the original stopped, a plain one from the beginning.
pub async fn a_checkpoint_survives_a_lapsed_lease_and_is_copied_by_a_rerun(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 5}), at(2)))
        .await
        .unwrap();
    let lapsed = at(2).plus(LEASE).plus(Duration::from_secs(1));
    let reaped = store.task_reap(ReapParams { now: lapsed, limit: 10 }).await.unwrap();
    assert_eq!(reaped.requeued, 1);
    let retry = claim_one(store, "pausable", lapsed.plus(Duration::from_secs(60))).await;
    assert_eq!((retry.attempt, retry.checkpoint.clone()), (2, Some(json!({"row": 5}))));

    // Asked to pause, then gone: paused, the next attempt counted.
    let current = get(store, &op).await;
    store
        .operation_intent(intent(
            &op,
            DesiredState::Paused,
            current.version,
            lapsed.plus(Duration::from_secs(61)),
        ))
        .await
        .unwrap();
    let gone = lapsed.plus(Duration::from_secs(200));
    let reaped = store.task_reap(ReapParams { now: gone, limit: 10 }).await.unwrap();
    assert_eq!(reaped.paused, 1);
    let paused = get(store, &op).await;
    assert_eq!((paused.state, paused.attempt), (State::Paused, 3));

    // The original fails; re-runs with and without its checkpoint.
    let failing = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", gone).await;
    store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 7}), gone))
        .await
        .unwrap();
    store.task_finish(finish(&task, failure("boom"), gone)).await.unwrap();
    for from_checkpoint in [true, false] {
        let mut params = accept_params("t1", "pausable", None, json!({"n": 1}));
        params.rerun_of = Some(failing.id.clone());
        params.from_checkpoint = from_checkpoint;
        store.operation_accept(params).await.unwrap();
        let next = claim_one(store, "pausable", gone).await;
        let expected = from_checkpoint.then(|| json!({"row": 7}));
        assert_eq!(next.checkpoint, expected, "from_checkpoint: {from_checkpoint}");
    }
}
