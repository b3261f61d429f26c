//! Deadlines, budgets and the enforcer: work past its time is failed, asked
//! to stop, or fenced out; a pause its worker does not honour is withdrawn.

use super::*;

pub async fn queued_work_past_its_deadline_is_never_started(store: &dyn Store) {
    let mut p = accept_params("t1", "dl", None, json!({}));
    p.deadline_at = Some(at(5));
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    assert!(claim(store, "dl", 1, at(6)).await.is_empty());
    let failed = get(store, &op).await;
    assert_eq!((failed.state, failed.started_at), (State::Failed, None));
    assert_eq!(failed.error.unwrap().code, "deadline_exceeded");
}

/// A claim that picks late work beside live work leases the live one and
/// fails the late one in the same call; work due exactly now is late.
pub async fn a_claim_fails_late_work_and_leases_the_rest_in_one_call(store: &dyn Store) {
    let mut late = accept_params("t1", "dl2", None, json!({}));
    late.deadline_at = Some(at(6));
    let AcceptOutcome::Created(late) = store.operation_accept(late).await.unwrap() else {
        panic!()
    };
    let AcceptOutcome::Created(live) = store
        .operation_accept(accept_params("t1", "dl2", None, json!({})))
        .await
        .unwrap()
    else {
        panic!()
    };
    let tasks = claim(store, "dl2", 2, at(6)).await;
    assert_eq!(tasks.iter().map(|t| &t.operation_id).collect::<Vec<_>>(), [&live.id]);
    let failed = get(store, &late).await;
    assert_eq!((failed.state, failed.started_at), (State::Failed, None));
    assert_eq!(failed.error.unwrap().code, "deadline_exceeded");
    assert_eq!(get(store, &live).await.state, State::Running);
    assert!(
        claim(store, "dl2", 2, at(7)).await.is_empty(),
        "the late task was left queued"
    );
}

pub async fn over_budget_work_is_asked_to_stop_and_fails_with_budget_exhausted(store: &dyn Store) {
    let mut p = accept_params("t1", "metered", None, json!({}));
    p.budget_max_cost = Some(10.0);
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    let task = claim_one(store, "metered", at(1)).await;
    let mut hb = heartbeat(&task, at(2));
    hb.cost_units = Some(4.0);
    assert!(!store.task_heartbeat(hb).await.unwrap().cancel_requested);
    let mut hb = heartbeat(&task, at(3));
    hb.cost_units = Some(12.5);
    let ack = store.task_heartbeat(hb).await.unwrap();
    assert_eq!(
        (ack.cancel_requested, ack.cancel_reason.as_deref()),
        (true, Some("budget_exhausted"))
    );
    let asked = get(store, &op).await;
    assert_eq!(asked.cancel.unwrap().requested_by, "system");
    let done = store
        .task_finish(finish(&task, Outcome::Cancelled, at(4)))
        .await
        .unwrap();
    assert_eq!(done.state, State::Failed);
    assert_eq!(done.error.unwrap().code, "budget_exhausted");
    assert_eq!(done.cost_units, 12.5);
}

pub async fn the_enforcer_fails_late_queued_work_and_stops_late_running_work(store: &dyn Store) {
    let mut p = accept_params("t1", "late", None, json!({}));
    p.deadline_at = Some(at(10));
    let AcceptOutcome::Created(queued) = store.operation_accept(p.clone()).await.unwrap() else {
        panic!()
    };
    p.id = Id::generate(IdKind::Operation);
    p.kind = "late-running".into();
    let AcceptOutcome::Created(running) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    let task = claim_one(store, "late-running", at(1)).await;

    assert_eq!(
        store.deadline_enforce(enforce(at(9))).await.unwrap(),
        EnforceCounts::default()
    );
    let counts = store.deadline_enforce(enforce(at(11))).await.unwrap();
    assert_eq!((counts.expired_before_start, counts.cancel_requested), (1, 1));
    let failed = get(store, &queued).await;
    assert_eq!(
        (failed.state, failed.error.unwrap().code.as_str()),
        (State::Failed, "deadline_exceeded")
    );

    let ack = store.task_heartbeat(heartbeat(&task, at(12))).await.unwrap();
    assert_eq!(
        (ack.cancel_requested, ack.cancel_reason.as_deref()),
        (true, Some("deadline_exceeded"))
    );
    let done = store
        .task_finish(finish(&task, Outcome::Cancelled, at(13)))
        .await
        .unwrap();
    assert_eq!(
        (done.state, done.error.unwrap().code.as_str()),
        (State::Failed, "deadline_exceeded")
    );
    assert_eq!(get(store, &running).await.state, State::Failed);
    assert_eq!(
        store.deadline_enforce(enforce(at(100))).await.unwrap(),
        EnforceCounts::default(),
        "idempotent"
    );
}

pub async fn a_worker_that_ignores_the_deadline_is_fenced_out_after_the_grace(store: &dyn Store) {
    let mut p = accept_params("t1", "stubborn", None, json!({}));
    p.deadline_at = Some(at(10));
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    let task = claim_one(store, "stubborn", at(1)).await;
    store.deadline_enforce(enforce(at(11))).await.unwrap();
    // The worker keeps heartbeating but never acknowledges.
    store.task_heartbeat(heartbeat(&task, at(20))).await.unwrap();
    assert_eq!(
        store.deadline_enforce(enforce(at(30))).await.unwrap(),
        EnforceCounts::default(),
        "still in grace"
    );
    let counts = store.deadline_enforce(enforce(at(42))).await.unwrap();
    assert_eq!(counts.ended_without_ack, 1);
    let done = get(store, &op).await;
    assert_eq!(
        (done.state, done.error.unwrap().code.as_str()),
        (State::Failed, "deadline_exceeded")
    );
    assert!(matches!(
        store
            .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(43)))
            .await,
        Err(StoreError::LeaseLost)
    ));
}

/// A worker that does not pause within the grace period keeps running;
/// the request is withdrawn and recorded as not honoured.
pub async fn a_pause_the_worker_does_not_honour_is_withdrawn_after_the_grace(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(2)))
        .await
        .unwrap();
    let grace = enforce(at(3)).grace;
    let early = store.deadline_enforce(enforce(at(3))).await.unwrap();
    assert_eq!(early.pause_not_honoured, 0);
    let late = at(2).plus(grace);
    let counts = store.deadline_enforce(enforce(late)).await.unwrap();
    assert_eq!(counts.pause_not_honoured, 1);
    let current = get(store, &op).await;
    assert_eq!((current.state, current.pause_requested_at), (State::Running, None));
    assert!(
        !store
            .task_heartbeat(heartbeat(&task, late))
            .await
            .unwrap()
            .pause_requested
    );
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.event_type, "pause_not_honoured");
    assert!(last.data["requested_at"].is_string(), "{}", last.data);
    store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, late))
        .await
        .unwrap();
}
