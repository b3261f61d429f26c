//! The job path: claims, heartbeats, outcomes (one and in batches), retries
//! and the reaper.

use super::*;

pub async fn claim_heartbeat_complete_walks_the_state_machine(store: &dyn Store) {
    let op = create(store, "t1", "walk").await;
    let task = claim_one(store, "walk", at(1)).await;
    assert_eq!(
        (task.operation_id.clone(), task.attempt, task.input.clone()),
        (op.id.clone(), 1, json!({"n": 1}))
    );
    assert_eq!(task.lease_expires_at, at(1).plus(LEASE));
    let running = get(store, &op).await;
    assert_eq!(
        (running.state, running.version, running.started_at),
        (State::Running, 2, Some(at(1)))
    );
    assert!(
        claim(store, "walk", 10, at(1)).await.is_empty(),
        "a leased task is not handed out twice"
    );

    let mut hb = heartbeat(&task, at(2));
    hb.progress = Some(ProgressUpdate {
        completed_units: Some(5.0),
        total_units: Some(10.0),
        unit: Some("rows".into()),
        phase: Some("WRITING".into()),
        details: Some(json!({"partial": [1]})),
    });
    hb.cost_units = Some(1.5);
    let ack = store.task_heartbeat(hb).await.unwrap();
    assert_eq!(
        (ack.version, ack.cancel_requested, ack.lease_expires_at),
        (3, false, at(2).plus(LEASE))
    );
    let progressed = get(store, &op).await;
    let progress = progressed.progress.clone().unwrap();
    assert_eq!(
        (progress.completed_units, progress.total_units, progress.updated_at),
        (Some(5.0), Some(10.0), Some(at(2)))
    );
    assert_eq!(progressed.cost_units, 1.5);

    let done = store
        .task_finish(finish(
            &task,
            Outcome::Succeeded {
                result: Some(json!({"rows": 10})),
            },
            at(3),
        ))
        .await
        .unwrap();
    assert_eq!(
        (done.state, done.version, done.completed_at),
        (State::Succeeded, 4, Some(at(3)))
    );
    assert_eq!(done.result, Some(json!({"rows": 10})));
    assert_eq!(done.input, None, "the input is dropped when the operation ends");
    assert!(done.expires_at.is_some_and(|e| e > at(3)));
    assert_eq!(get(store, &op).await, done);

    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    let trail: Vec<(i64, &str, State)> = history
        .iter()
        .map(|e| (e.version, e.event_type.as_str(), e.state))
        .collect();
    assert_eq!(
        trail,
        vec![
            (1, "created", State::Queued),
            (2, "started", State::Running),
            (3, "progress", State::Running),
            (4, "succeeded", State::Succeeded)
        ]
    );
}

pub async fn stale_lease_tokens_are_fenced_out(store: &dyn Store) {
    let op = create(store, "t1", "fence").await;
    let task = claim_one(store, "fence", at(1)).await;
    let mut forged = task.clone();
    forged.lease_token = "not-the-token".into();
    assert!(matches!(
        store.task_heartbeat(heartbeat(&forged, at(2))).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store
            .task_finish(finish(&forged, Outcome::Succeeded { result: None }, at(2)))
            .await,
        Err(StoreError::LeaseLost)
    ));
    let unchanged = get(store, &op).await;
    assert_eq!((unchanged.state, unchanged.version), (State::Running, 2));
}

/// Backends may commit concurrent outcomes together (group commit): each
/// must still apply exactly once, and one refused outcome in the crowd
/// (a stale token, a second answer) must leave the others applied.
pub async fn concurrent_outcomes_each_apply_once_and_a_refused_one_harms_none(store: &dyn Store) {
    for _ in 0..24 {
        create(store, "t1", "crowd").await;
    }
    let tasks = claim(store, "crowd", 24, at(1)).await;
    assert_eq!(tasks.len(), 24);
    let tokens: std::collections::HashSet<&str> = tasks.iter().map(|t| t.lease_token.as_str()).collect();
    assert_eq!(tokens.len(), 24, "each lease of one claim has a token of its own");
    // Forged from a real token: the next task's, leased by the same claim.
    let mut forged = tasks[5].clone();
    forged.lease_token = tasks[6].lease_token.clone();
    let mut outcomes: Vec<FinishParams> = tasks
        .iter()
        .enumerate()
        .map(|(i, task)| finish(task, Outcome::Succeeded { result: Some(json!(i)) }, at(2)))
        .collect();
    outcomes.insert(3, finish(&forged, Outcome::Cancelled, at(2)));
    outcomes.push(finish(&tasks[7], Outcome::Cancelled, at(2)));
    let answers = futures_util::future::join_all(outcomes.into_iter().map(|params| store.task_finish(params))).await;

    assert!(
        matches!(answers[3], Err(StoreError::LeaseLost)),
        "the forged token: {:?}",
        answers[3]
    );
    // Task 7 was answered twice (index 8 after the insert, and last): one wins.
    let second_wins = answers.last().unwrap().is_ok();
    assert_ne!(answers[8].is_ok(), second_wins, "exactly one answer for task 7 applies");
    let applied = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(applied, 24);
    for (i, task) in tasks.iter().enumerate() {
        let op = store.operation_get("t1", &task.operation_id).await.unwrap().unwrap();
        let expected = match i {
            7 if second_wins => (State::Cancelled, 3, None),
            _ => (State::Succeeded, 3, Some(json!(i))),
        };
        assert_eq!(
            (op.state, op.version, op.result),
            expected,
            "operation {i} took one outcome exactly once"
        );
    }
}

pub async fn an_operation_completes_at_most_once(store: &dyn Store) {
    let op = create(store, "t1", "once").await;
    let task = claim_one(store, "once", at(1)).await;
    store
        .task_finish(finish(&task, Outcome::Succeeded { result: Some(json!(1)) }, at(2)))
        .await
        .unwrap();
    for outcome in [
        Outcome::Succeeded { result: Some(json!(2)) },
        Outcome::Cancelled,
        Outcome::Failed {
            error: OperationError {
                code: "x".into(),
                message: "x".into(),
                retryable: false,
            },
        },
    ] {
        assert!(matches!(
            store.task_finish(finish(&task, outcome, at(3))).await,
            Err(StoreError::LeaseLost)
        ));
    }
    assert!(matches!(
        store.task_heartbeat(heartbeat(&task, at(3))).await,
        Err(StoreError::LeaseLost)
    ));
    let done = get(store, &op).await;
    assert_eq!(
        (done.state, done.version, done.result),
        (State::Succeeded, 3, Some(json!(1)))
    );
}

pub async fn progress_never_goes_backwards_and_idle_heartbeats_keep_the_version(store: &dyn Store) {
    let op = create(store, "t1", "prog").await;
    let task = claim_one(store, "prog", at(1)).await;
    let report = |units: f64, now| {
        let mut hb = heartbeat(&task, now);
        hb.progress = Some(ProgressUpdate {
            completed_units: Some(units),
            ..Default::default()
        });
        hb
    };
    assert_eq!(store.task_heartbeat(report(50.0, at(2))).await.unwrap().version, 3);
    // Lower progress is ignored: nothing changed, so the version stays.
    assert_eq!(store.task_heartbeat(report(10.0, at(3))).await.unwrap().version, 3);
    assert_eq!(store.task_heartbeat(heartbeat(&task, at(4))).await.unwrap().version, 3);
    let current = get(store, &op).await;
    assert_eq!(current.progress.unwrap().completed_units, Some(50.0));
    assert_eq!(current.version, 3);
}

pub async fn reaper_requeues_rerun_safe_kinds_and_fails_the_others(store: &dyn Store) {
    let kind = |name: &str, rerun_safe| KindSpec {
        name: name.into(),
        builtin: false,
        rerun_safe,
        max_attempts: 2,
        default_deadline_seconds: None,
        max_deadline_seconds: None,
        pausable: false,
    };
    store.kind_upsert(kind("safe", true)).await.unwrap();
    store.kind_upsert(kind("unsafe", false)).await.unwrap();
    let safe = create(store, "t1", "safe").await;
    let unsafe_op = create(store, "t1", "unsafe").await;
    let safe_task = claim_one(store, "safe", at(1)).await;
    claim_one(store, "unsafe", at(1)).await;

    let nothing = store
        .task_reap(ReapParams {
            now: at(10),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(nothing, ReapCounts::default(), "live leases are left alone");

    let lapsed = at(1).plus(LEASE).plus(Duration::from_secs(1));
    let counts = store
        .task_reap(ReapParams {
            now: lapsed,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!((counts.requeued, counts.failed_outcome_unknown), (1, 1));

    let failed = get(store, &unsafe_op).await;
    assert_eq!(failed.state, State::Failed);
    assert_eq!(failed.error.unwrap().code, "outcome_unknown");

    let retrying = get(store, &safe).await;
    assert_eq!(
        (retrying.state, retrying.attempt),
        (State::Running, 2),
        "retries keep the public state"
    );
    assert!(
        claim(store, "safe", 1, lapsed).await.is_empty(),
        "the retry waits for its backoff"
    );
    let retry = claim_one(store, "safe", lapsed.plus(Duration::from_secs(60))).await;
    assert_eq!(retry.attempt, 2);
    assert_ne!(retry.lease_token, safe_task.lease_token);
    assert!(matches!(
        store
            .task_finish(finish(
                &safe_task,
                Outcome::Succeeded {
                    result: Some(json!("zombie"))
                },
                lapsed
            ))
            .await,
        Err(StoreError::LeaseLost)
    ));
    let done = store
        .task_finish(finish(
            &retry,
            Outcome::Succeeded {
                result: Some(json!("second")),
            },
            lapsed.plus(LEASE),
        ))
        .await
        .unwrap();
    assert_eq!((done.state, done.result), (State::Succeeded, Some(json!("second"))));

    // Out of attempts: the next lapse fails it with the outcome unknown.
    let third = create(store, "t1", "safe").await;
    let mut now = at(1000);
    for _ in 0..2 {
        now = now.plus(Duration::from_secs(600));
        claim_one(store, "safe", now).await;
        now = now.plus(LEASE).plus(Duration::from_secs(1));
        store.task_reap(ReapParams { now, limit: 100 }).await.unwrap();
    }
    let exhausted = get(store, &third).await;
    assert_eq!((exhausted.state, exhausted.attempt), (State::Failed, 2));
    assert_eq!(exhausted.error.unwrap().code, "outcome_unknown");
}

pub async fn failed_outcome_carries_the_error_and_keeps_the_input(store: &dyn Store) {
    let op = create(store, "t1", "fail").await;
    let task = claim_one(store, "fail", at(1)).await;
    let error = OperationError {
        code: "boom".into(),
        message: "it broke".into(),
        retryable: false,
    };
    let done = store
        .task_finish(finish(&task, Outcome::Failed { error: error.clone() }, at(2)))
        .await
        .unwrap();
    // The input is kept (for re-runs) while the operation is; only a success drops it.
    assert_eq!(
        (done.state, done.error.clone(), done.result.clone(), done.input.clone()),
        (State::Failed, Some(error), None, Some(json!({"n": 1})))
    );
    assert_eq!(get(store, &op).await, done);
}

pub async fn retryable_failures_retry_until_attempts_run_out(store: &dyn Store) {
    declare(store, "flaky", false, 2).await;
    let op = create(store, "t1", "flaky").await;
    let first = claim_one(store, "flaky", at(1)).await;
    let after_first = store
        .task_finish(finish(&first, retryable("upstream_503"), at(2)))
        .await
        .unwrap();
    assert_eq!(
        (after_first.state, after_first.attempt),
        (State::Running, 2),
        "the public state stays running"
    );
    assert!(
        claim(store, "flaky", 1, at(2)).await.is_empty(),
        "the retry waits for its backoff"
    );
    let second = claim_one(store, "flaky", at(60)).await;
    assert_eq!(second.attempt, 2);
    let done = store
        .task_finish(finish(&second, retryable("upstream_503"), at(61)))
        .await
        .unwrap();
    assert_eq!(done.state, State::Failed, "out of attempts: the last error stands");
    assert_eq!(done.error.unwrap().code, "upstream_503");
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert!(history.iter().any(|e| e.event_type == "retry_scheduled"));
}

pub async fn max_running_is_honoured_by_claims(store: &dyn Store) {
    store
        .tenant_set(TenantLimits {
            name: "capped".into(),
            max_active: None,
            max_running: Some(2),
            rate: None,
        })
        .await
        .unwrap();
    for _ in 0..5 {
        create(store, "capped", "capped-kind").await;
    }
    assert_eq!(claim(store, "capped-kind", 10, at(1)).await.len(), 2);
    assert!(
        claim(store, "capped-kind", 10, at(2)).await.is_empty(),
        "at max_running, nothing more starts"
    );
}

/// Claimers racing (as nodes sharing one database do) still start no more
/// than `max_running` of a tenant's work between them.
pub async fn racing_claims_together_respect_max_running(store: &dyn Store) {
    store
        .tenant_set(TenantLimits {
            name: "capped".into(),
            max_active: None,
            max_running: Some(3),
            rate: None,
        })
        .await
        .unwrap();
    for _ in 0..20 {
        create(store, "capped", "raced").await;
    }
    let claims = futures_util::future::join_all((0..8).map(|_| claim(store, "raced", 2, at(1)))).await;
    let started: usize = claims.iter().map(Vec::len).sum();
    assert_eq!(
        started, 3,
        "eight racing claimers started {started} of a tenant capped at 3"
    );
}

/// Claimers racing over one queue each lease what no other took: every
/// task exactly once, each operation started once.
pub async fn racing_claimers_never_lease_one_task_twice(store: &dyn Store) {
    let mut created = Vec::new();
    for _ in 0..40 {
        created.push(create(store, "t1", "contended").await.id);
    }
    let claims = futures_util::future::join_all((0..8).map(|_| claim(store, "contended", 10, at(1)))).await;
    let mut leased: Vec<Id> = claims.into_iter().flatten().map(|t| t.operation_id).collect();
    leased.sort();
    created.sort();
    let before_dedup = leased.len();
    leased.dedup();
    assert_eq!(before_dedup, leased.len(), "a task was leased twice");
    assert_eq!(leased, created, "every queued task is leased once");
    for id in &created {
        let history = store.operation_history("t1", id).await.unwrap().unwrap();
        let started = history.iter().filter(|e| e.event_type == "started").count();
        assert_eq!(started, 1, "{id} started {started} times");
    }
}

pub async fn claims_are_fair_across_tenants(store: &dyn Store) {
    for _ in 0..300 {
        create(store, "big", "fair").await;
    }
    for _ in 0..5 {
        create(store, "small", "fair").await;
    }
    // One task per claim, as a single busy worker would take them.
    let mut claims_before_small = None;
    let mut small_done = 0;
    for n in 1..=20 {
        let task = claim_one(store, "fair", at(n)).await;
        if task.tenant == "small" {
            claims_before_small.get_or_insert(n);
            small_done += 1;
        }
    }
    assert_eq!(
        claims_before_small,
        Some(2),
        "the small tenant's first task is the second claim"
    );
    assert_eq!(
        small_done, 5,
        "the small tenant is served every other claim until it is done"
    );
    // A batch claim is shared too.
    for _ in 0..5 {
        create(store, "small", "fair").await;
    }
    let batch = claim(store, "fair", 6, at(100)).await;
    let small_in_batch = batch.iter().filter(|t| t.tenant == "small").count();
    assert_eq!(small_in_batch, 3, "half of a batch goes to each tenant with work");
}

pub async fn leases_of_a_worker_known_gone_are_reaped_at_once(store: &dyn Store) {
    declare(store, "restartable", true, 3).await;
    let op = create(store, "t1", "restartable").await;
    let other = create(store, "t1", "restartable").await;
    claim_one(store, "restartable", at(1)).await;
    let survivor = store
        .task_claim(ClaimParams {
            kinds: vec!["restartable".into()],
            max_tasks: 1,
            lease: LEASE,
            worker_id: "another-node".into(),
            now: at(1),
        })
        .await
        .unwrap();
    assert_eq!(survivor.len(), 1);
    assert_eq!(store.task_expire_worker("conformance", at(2)).await.unwrap(), 1);
    let counts = store.task_reap(ReapParams { now: at(2), limit: 10 }).await.unwrap();
    assert_eq!(
        counts.requeued, 1,
        "only the gone worker's lease, and without waiting for it to lapse"
    );
    assert_eq!(get(store, &op).await.attempt, 2);
    assert_eq!(get(store, &other).await.attempt, 1);
}

pub async fn a_batch_of_outcomes_applies_each_fenced_alone(store: &dyn Store) {
    for _ in 0..3 {
        create(store, "t1", "q").await;
    }
    declare(store, "flaky", false, 2).await;
    create(store, "t1", "flaky").await;
    let tasks = claim(store, "q", 3, at(1)).await;
    assert_eq!(tasks.len(), 3);
    let flaky = claim_one(store, "flaky", at(1)).await;
    let forged = FinishParams {
        lease_token: "forged".into(),
        ..finish(&tasks[2], Outcome::Succeeded { result: None }, at(2))
    };
    // Endings, a retry (which is not an ending), a forged lease and a
    // duplicate, mixed: each is answered in its own place.
    let answers = store
        .task_finish_many(vec![
            finish(&tasks[0], Outcome::Succeeded { result: Some(json!(1)) }, at(2)),
            forged,
            finish(&flaky, retryable("upstream_503"), at(2)),
            finish(&tasks[1], Outcome::Cancelled, at(2)),
            // The same outcome twice: the second finds no lease.
            finish(&tasks[0], Outcome::Succeeded { result: Some(json!(1)) }, at(2)),
        ])
        .await;
    assert_eq!(answers[0].as_ref().unwrap().state, State::Succeeded);
    assert!(matches!(answers[1], Err(StoreError::LeaseLost)), "{:?}", answers[1]);
    let retried = answers[2].as_ref().unwrap();
    assert_eq!(
        (&retried.id, retried.state, retried.attempt),
        (&flaky.operation_id, State::Running, 2)
    );
    assert_eq!(answers[3].as_ref().unwrap().state, State::Cancelled);
    assert!(matches!(answers[4], Err(StoreError::LeaseLost)), "{:?}", answers[4]);
    // The forged one harmed nothing: the real holder still completes.
    let op = store
        .task_finish(finish(&tasks[2], Outcome::Succeeded { result: None }, at(3)))
        .await
        .unwrap();
    assert_eq!(op.state, State::Succeeded);
    let history = store
        .operation_history("t1", &tasks[0].operation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history.iter().filter(|e| e.state == State::Succeeded).count(), 1);
}

pub async fn outcomes_and_a_claim_in_one_call_both_apply(store: &dyn Store) {
    for _ in 0..3 {
        create(store, "t1", "q").await;
    }
    let tasks = claim(store, "q", 2, at(1)).await;
    assert_eq!(tasks.len(), 2);
    let forged = FinishParams {
        lease_token: "forged".into(),
        ..finish(&tasks[1], Outcome::Cancelled, at(2))
    };
    let (finished, claimed) = store
        .task_finish_and_claim(
            vec![finish(&tasks[0], Outcome::Succeeded { result: None }, at(2)), forged],
            claim_params("q", 5, at(2)),
        )
        .await;
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[0].as_ref().unwrap().state, State::Succeeded);
    assert!(matches!(finished[1], Err(StoreError::LeaseLost)), "{:?}", finished[1]);
    // The claim took the one task left ready: not the ended one, nor the
    // one whose real holder still has it.
    let mut claimed = claimed.unwrap();
    assert_eq!(claimed.len(), 1);
    let third = claimed.remove(0);
    assert!(tasks.iter().all(|t| t.operation_id != third.operation_id));
    // With nothing to report, it is a claim; with nothing to claim, the
    // outcomes still apply.
    let (finished, claimed) = store
        .task_finish_and_claim(Vec::new(), claim_params("q", 5, at(2)))
        .await;
    assert!(finished.is_empty() && claimed.unwrap().is_empty());
    let (finished, claimed) = store
        .task_finish_and_claim(
            vec![
                finish(&tasks[1], Outcome::Succeeded { result: None }, at(3)),
                finish(&third, Outcome::Cancelled, at(3)),
            ],
            claim_params("q", 5, at(2)),
        )
        .await;
    assert!(finished.iter().all(Result::is_ok), "{finished:?}");
    assert!(claimed.unwrap().is_empty());
}

pub async fn the_last_progress_is_stored_with_the_outcome(store: &dyn Store) {
    create(store, "t1", "q").await;
    let task = claim_one(store, "q", at(1)).await;
    let progress = ProgressUpdate {
        completed_units: Some(10.0),
        total_units: Some(10.0),
        unit: Some("rows".into()),
        ..ProgressUpdate::default()
    };
    let done = store
        .task_finish(FinishParams {
            progress: Some(progress),
            ..finish(&task, Outcome::Succeeded { result: None }, at(2))
        })
        .await
        .unwrap();
    let stored = done.progress.expect("the final progress is stored");
    assert_eq!(stored.completed_units, Some(10.0));
    assert_eq!(stored.unit.as_deref(), Some("rows"));
    // One change, not two: created, started, succeeded.
    assert_eq!(done.version, 3);
    let history = store
        .operation_history("t1", &task.operation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history.len(), 3);
    let last = history.last().unwrap();
    assert_eq!(last.state, State::Succeeded);
    let events = store
        .operation_events_after("t1", &task.operation_id, 2, 10)
        .await
        .unwrap()
        .unwrap();
    let snapshot = events[0].snapshot.as_ref().expect("events keep snapshots");
    assert_eq!(snapshot.progress.as_ref().unwrap().completed_units, Some(10.0));
}
