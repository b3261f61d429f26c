//! Accepting submissions: idempotency, tenancy, lists, quotas, batches,
//! hand-offs and re-runs.

use super::*;

pub async fn accept_creates_a_queued_operation_with_its_first_event(store: &dyn Store) {
    let op = create(store, "t1", "sleep").await;
    assert_eq!((op.state, op.version, op.attempt), (State::Queued, 1, 0));
    assert_eq!(op.created_at, T0);
    assert_eq!(get(store, &op).await, op, "what accept returns is what is stored");
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].version, history[0].event_type.as_str(), history[0].state),
        (1, "created", State::Queued)
    );
}

pub async fn accept_replays_the_same_request_and_refuses_a_different_one(store: &dyn Store) {
    let first = store
        .operation_accept(accept_params("t1", "sleep", Some("k1"), json!({"a": 1})))
        .await
        .unwrap();
    let AcceptOutcome::Created(original) = first else {
        panic!("expected Created")
    };

    let replay = store
        .operation_accept(accept_params("t1", "sleep", Some("k1"), json!({"a": 1})))
        .await
        .unwrap();
    assert_eq!(replay, AcceptOutcome::Replayed(original.clone()));

    let reused = store
        .operation_accept(accept_params("t1", "sleep", Some("k1"), json!({"a": 2})))
        .await
        .unwrap();
    assert_eq!(
        reused,
        AcceptOutcome::KeyReused {
            operation_id: original.id.clone()
        }
    );

    let page = store
        .operation_list(ListParams {
            tenant: Some("t1".into()),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.operations.len(),
        1,
        "a refused or replayed request creates nothing"
    );
}

pub async fn idempotency_scope_is_tenant_kind_and_key(store: &dyn Store) {
    let mut ids = Vec::new();
    for (tenant, kind) in [("t1", "sleep"), ("t2", "sleep"), ("t1", "export")] {
        let outcome = store
            .operation_accept(accept_params(tenant, kind, Some("same"), json!({})))
            .await
            .unwrap();
        let AcceptOutcome::Created(op) = outcome else {
            panic!("{tenant}/{kind} should be a new scope")
        };
        ids.push(op.id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 3);
}

pub async fn concurrent_first_requests_converge_on_one_operation(store: &dyn Store) {
    let outcomes = futures_util::future::join_all(
        (0..32).map(|_| store.operation_accept(accept_params("t1", "sleep", Some("race"), json!({"x": [1, 2, 3]})))),
    )
    .await;
    let mut created = 0;
    let mut ids = std::collections::HashSet::new();
    for outcome in outcomes {
        match outcome.unwrap() {
            AcceptOutcome::Created(op) => {
                created += 1;
                ids.insert(op.id);
            }
            AcceptOutcome::Replayed(op) => {
                ids.insert(op.id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(ids.len(), 1, "every response names the same operation");
}

pub async fn operations_are_invisible_to_other_tenants(store: &dyn Store) {
    let op = create(store, "t1", "sleep").await;
    assert!(store.operation_get("t2", &op.id).await.unwrap().is_none());
    assert!(store.operation_history("t2", &op.id).await.unwrap().is_none());
    assert!(matches!(
        store.operation_cancel(cancel("t2", &op.id, T0)).await,
        Err(StoreError::NotFound)
    ));
    let page = store
        .operation_list(ListParams {
            tenant: Some("t2".into()),
            page_size: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(page.operations.is_empty());
    assert_eq!(
        get(store, &op).await.state,
        State::Queued,
        "another tenant's cancel changed nothing"
    );
}

pub async fn list_is_newest_first_filtered_and_paginated(store: &dyn Store) {
    let mut created = Vec::new();
    for i in 0..5 {
        let mut p = accept_params("t1", if i % 2 == 0 { "even" } else { "odd" }, None, json!({"i": i}));
        p.labels
            .insert("team".into(), if i < 3 { "a".into() } else { "b".into() });
        let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
            panic!()
        };
        created.push(op.id);
    }
    let newest_first: Vec<Id> = created.iter().rev().cloned().collect();
    assert_eq!(every_page(store, Some("t1")).await, newest_first);

    // Spread over states (running, succeeded, queued) and over two tenants,
    // the pages still run newest first: for one tenant and for all of them.
    let claimed = claim(store, "even", 2, at(1)).await;
    assert_eq!(claimed.len(), 2);
    store
        .task_finish(finish(&claimed[0], Outcome::Succeeded { result: None }, at(2)))
        .await
        .unwrap();
    let other = create(store, "t2", "odd").await;
    assert_eq!(every_page(store, Some("t1")).await, newest_first);
    let everyone: Vec<Id> = std::iter::once(other.id).chain(newest_first.iter().cloned()).collect();
    assert_eq!(every_page(store, None).await, everyone);

    let list = |kind: Option<&str>, label: Option<(&str, &str)>, state: Option<State>| ListParams {
        tenant: Some("t1".into()),
        kind: kind.map(str::to_owned),
        label: label.map(|(k, v)| (k.to_owned(), v.to_owned())),
        state,
        page_size: 100,
        before_seq: None,
        visible_at: None,
        ..Default::default()
    };
    let evens = store.operation_list(list(Some("even"), None, None)).await.unwrap();
    assert_eq!(evens.operations.len(), 3);
    assert!(evens.next_before_seq.is_none());
    let team_b = store
        .operation_list(list(None, Some(("team", "b")), None))
        .await
        .unwrap();
    assert_eq!(
        team_b.operations.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
        vec![created[4].clone(), created[3].clone()]
    );
    let running = store
        .operation_list(list(None, None, Some(State::Running)))
        .await
        .unwrap();
    assert_eq!(
        running.operations.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
        vec![claimed[1].operation_id.clone()]
    );
}

/// A page of one state holds exactly the operations in that state, newest
/// first across pages, alone or with a kind, for one tenant or all: the
/// stores read live and ended work from different places (PostgreSQL pages
/// queued and running work from its tasks).
pub async fn every_state_lists_exactly_its_operations(store: &dyn Store) {
    let created = work_in_every_state(store).await;
    every_state_lists(store, &created).await;
}

/// Fourteen operations of kinds `a` and `b` over tenants `t1` and `t2`, left
/// in every state; one of the running ones waits for its next attempt (its
/// task is back in the queue).
pub async fn work_in_every_state(store: &dyn Store) -> Vec<Operation> {
    declare(store, "a", false, 3).await;
    let mut created = Vec::new();
    for i in 0..14 {
        let tenant = if i % 5 == 4 { "t2" } else { "t1" };
        created.push(create(store, tenant, if i % 2 == 0 { "a" } else { "b" }).await);
    }
    let running = claim(store, "a", 4, at(1)).await;
    assert_eq!(running.len(), 4);
    store
        .task_finish(finish(&running[0], Outcome::Succeeded { result: None }, at(2)))
        .await
        .unwrap();
    let error = OperationError {
        code: "broken".into(),
        message: "no".into(),
        retryable: false,
    };
    store
        .task_finish(finish(&running[1], Outcome::Failed { error }, at(2)))
        .await
        .unwrap();
    let retrying = store
        .task_finish(finish(&running[2], retryable("flaky"), at(2)))
        .await
        .unwrap();
    assert_eq!((retrying.state, retrying.attempt), (State::Running, 2), "{retrying:?}");
    let queued_b: Vec<&Operation> = created.iter().filter(|o| o.kind == "b").collect();
    store
        .operation_cancel(cancel(&queued_b[0].tenant, &queued_b[0].id, at(3)))
        .await
        .unwrap();
    let paused = store
        .operation_intent(intent(queued_b[1], DesiredState::Paused, 1, at(3)))
        .await
        .unwrap();
    assert_eq!(paused.state, State::Paused);
    created
}

/// Every page of every state, kind and tenant (and of all tenants) holds
/// exactly those of `created` that match it, newest first.
pub async fn every_state_lists(store: &dyn Store, created: &[Operation]) {
    let mut now = Vec::new();
    for op in created {
        now.push(get(store, op).await);
    }
    for state in State::ALL.map(Some).into_iter().chain([None]) {
        for kind in [None, Some("a"), Some("b")] {
            for tenant in [Some("t1"), Some("t2"), None] {
                let expected: Vec<Id> = now
                    .iter()
                    .rev()
                    .filter(|o| state.is_none_or(|s| o.state == s))
                    .filter(|o| kind.is_none_or(|k| o.kind == k))
                    .filter(|o| tenant.is_none_or(|t| o.tenant == t))
                    .map(|o| o.id.clone())
                    .collect();
                let list = ListParams {
                    tenant: tenant.map(str::to_owned),
                    state,
                    kind: kind.map(str::to_owned),
                    ..Default::default()
                };
                let listed = every_page_of(store, list).await;
                assert_eq!(listed, expected, "state {state:?}, kind {kind:?}, tenant {tenant:?}");
            }
        }
    }
    assert!(
        State::ALL.iter().all(|s| now.iter().any(|o| o.state == *s)),
        "every state is listed"
    );
}

pub async fn max_active_refuses_new_work_but_replays_still_answer(store: &dyn Store) {
    store
        .tenant_set(TenantLimits {
            name: "small".into(),
            max_active: Some(2),
            max_running: None,
            rate: None,
        })
        .await
        .unwrap();
    assert_eq!(store.tenant_get("small").await.unwrap().unwrap().max_active, Some(2));
    let first = store
        .operation_accept(accept_params("small", "q", Some("k1"), json!({})))
        .await
        .unwrap();
    store
        .operation_accept(accept_params("small", "q", Some("k2"), json!({})))
        .await
        .unwrap();
    let refused = store
        .operation_accept(accept_params("small", "q", Some("k3"), json!({})))
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::QuotaExceeded {
                active: 2,
                max_active: 2
            })
        ),
        "{refused:?}"
    );
    let AcceptOutcome::Created(first) = first else { panic!() };
    let replay = store
        .operation_accept(accept_params("small", "q", Some("k1"), json!({})))
        .await
        .unwrap();
    assert_eq!(replay, AcceptOutcome::Replayed(first.clone()));
    // The refused key was not consumed: once there is room it is accepted.
    store.operation_cancel(cancel("small", &first.id, at(1))).await.unwrap();
    let later = store
        .operation_accept(accept_params("small", "q", Some("k3"), json!({})))
        .await
        .unwrap();
    assert!(matches!(later, AcceptOutcome::Created(_)));
}

/// A hand-off (`operation_accept_leased`) writes what an acceptance and a
/// claim would have: both versions with their events and changes, a lease
/// whose token fences like any other; and nothing at all when the
/// submission must queue (a key already taken, a capped tenant). A backend
/// that does not hand off writes nothing.
pub async fn a_submission_leased_as_accepted_is_what_a_claim_would_have_leased(store: &dyn Store) {
    let to = LeaseTo {
        worker_id: "handed".into(),
        lease: LEASE,
    };
    let mut params = accept_params("t1", "hand", Some("k1"), json!({"n": 1}));
    params.deadline_at = Some(at(600));
    params.budget_max_cost = Some(5.0);
    params.labels.insert("team".into(), "a".into());
    let mut changes = store.subscribe_changes();
    let handed = store.operation_accept_leased(&params, &to).await.unwrap();
    if !store.hands_off() {
        assert!(handed.is_none(), "a backend that does not hand off says so");
        assert!(store.operation_get("t1", &params.id).await.unwrap().is_none());
        return;
    }
    let (created, task) = handed.expect("handed off");
    assert_eq!(
        (created.id.clone(), created.state, created.version),
        (params.id.clone(), State::Queued, 1)
    );
    assert_eq!(
        (
            task.operation_id.clone(),
            task.kind.as_str(),
            task.attempt,
            task.lease_expires_at
        ),
        (created.id.clone(), "hand", 1, T0.plus(LEASE))
    );
    assert_eq!(
        (
            task.input.clone(),
            task.deadline_at,
            task.budget_max_cost,
            task.checkpoint.clone()
        ),
        (json!({"n": 1}), Some(at(600)), Some(5.0), None)
    );
    let stored = get(store, &created).await;
    assert_eq!(
        (
            stored.state,
            stored.version,
            stored.attempt,
            stored.started_at,
            stored.updated_at
        ),
        (State::Running, 2, 1, Some(T0), T0)
    );
    let history = store
        .operation_events_after("t1", &created.id, 0, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event_types(&history), ["created", "started"]);
    assert_eq!(history[1].data, json!({"attempt": 1, "worker_id": "handed"}));
    // Each event keeps the operation at its version (inputs are not kept
    // in snapshots): the created one is what the submitter got, the
    // started one what is stored.
    for (event, at_version) in history.iter().zip([&created, &stored]) {
        let mut expected = at_version.clone();
        expected.input = None;
        assert_eq!(
            event.snapshot.as_ref(),
            Some(&expected),
            "{} snapshot",
            event.event_type
        );
    }
    for version in [1, 2] {
        let change = changes.recv().await.unwrap();
        assert_eq!(
            (change.operation_id.clone(), change.version),
            (created.id.clone(), version)
        );
    }
    assert!(
        claim(store, "hand", 10, at(1)).await.is_empty(),
        "no claim leases it again"
    );

    // Its lease fences as a claimed one does.
    let mut forged = task.clone();
    forged.lease_token = "forged".into();
    assert!(matches!(
        store.task_heartbeat(heartbeat(&forged, at(2))).await,
        Err(StoreError::LeaseLost)
    ));
    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: Some(json!(1)) }, at(3)))
        .await
        .unwrap();
    assert_eq!((done.state, done.version), (State::Succeeded, 3));

    // A key already taken writes nothing: the usual acceptance replays it.
    let mut again = params.clone();
    again.id = Id::generate(IdKind::Operation);
    assert!(store.operation_accept_leased(&again, &to).await.unwrap().is_none());
    assert!(store.operation_get("t1", &again.id).await.unwrap().is_none());
    match store.operation_accept(again).await.unwrap() {
        AcceptOutcome::Replayed(op) => assert_eq!(op.id, created.id),
        other => panic!("expected a replay, got {other:?}"),
    }

    // A submission whose start a claim must handle (here: a webhook to
    // queue) is not handed off.
    let mut called = accept_params("t1", "hand", None, json!({"n": 3}));
    called.callback_url = Some("https://example.com/hook".into());
    assert!(!called.may_be_handed_off());
    assert!(store.operation_accept_leased(&called, &to).await.unwrap().is_none());
    assert!(store.operation_get("t1", &called.id).await.unwrap().is_none());

    // A tenant with a cap on running work queues as usual.
    store
        .tenant_set(TenantLimits {
            name: "capped".into(),
            max_active: None,
            max_running: Some(1),
            rate: None,
        })
        .await
        .unwrap();
    let capped = accept_params("capped", "hand", Some("k1"), json!({"n": 2}));
    assert!(store.operation_accept_leased(&capped, &to).await.unwrap().is_none());
    assert!(store.operation_get("capped", &capped.id).await.unwrap().is_none());
    assert!(matches!(
        store.operation_accept(capped).await.unwrap(),
        AcceptOutcome::Created(_)
    ));
}

/// An idempotency key names one operation even when its submissions race
/// through a hand-off: of two hand-offs with one key, or a hand-off and a
/// queued acceptance, exactly one writes, and the other, accepted as usual
/// afterwards (as the server does with a hand-off that wrote nothing), is
/// its replay.
pub async fn racing_submissions_with_one_key_make_one_operation_handed_or_not(store: &dyn Store) {
    let to = LeaseTo {
        worker_id: "racer".into(),
        lease: LEASE,
    };
    for round in 0..8 {
        let key = format!("race-{round}");
        let (a, b) = (
            accept_params("t1", "race", Some(&key), json!({"round": round})),
            accept_params("t1", "race", Some(&key), json!({"round": round})),
        );
        // Even rounds race two hand-offs; odd ones a hand-off and a queued
        // acceptance.
        let written: Vec<Id> = if round % 2 == 0 {
            let (x, y) = tokio::join!(
                store.operation_accept_leased(&a, &to),
                store.operation_accept_leased(&b, &to)
            );
            [x, y]
                .into_iter()
                .filter_map(|h| h.unwrap().map(|(op, _)| op.id))
                .collect()
        } else {
            let (x, y) = tokio::join!(
                store.operation_accept_leased(&a, &to),
                store.operation_accept(b.clone())
            );
            let mut written: Vec<Id> = x.unwrap().map(|(op, _)| op.id).into_iter().collect();
            match y.unwrap() {
                AcceptOutcome::Created(op) => written.push(op.id),
                AcceptOutcome::Replayed(op) => assert_eq!(Some(&op.id), written.first(), "round {round}"),
                other => panic!("round {round}: {other:?}"),
            }
            written
        };
        // A backend that does not hand off writes only the queued one.
        let expected = if store.hands_off() { 1 } else { round % 2 };
        assert_eq!(written.len(), expected, "round {round}: exactly one writes");
        if written.is_empty() {
            continue;
        }
        let winner = &written[0];
        let loser = if winner == &a.id { b } else { a };
        assert!(store.operation_get("t1", &loser.id).await.unwrap().is_none());
        match store.operation_accept(loser).await.unwrap() {
            AcceptOutcome::Replayed(op) => assert_eq!(&op.id, winner, "round {round}"),
            other => panic!("round {round}: expected a replay, got {other:?}"),
        }
    }
}

pub async fn reruns_link_both_ways_and_leave_the_original_unchanged(store: &dyn Store) {
    let first = create(store, "t1", "chain").await;
    let task = claim_one(store, "chain", at(1)).await;
    let failed = store.task_finish(finish(&task, failure("boom"), at(2))).await.unwrap();
    assert_eq!(
        failed.input,
        Some(json!({"n": 1})),
        "a failed operation keeps its input"
    );
    let mut chain = vec![first.clone()];
    for _ in 0..2 {
        let mut params = accept_params("t1", "chain", None, json!({"n": 1}));
        params.rerun_of = Some(chain.last().unwrap().id.clone());
        let AcceptOutcome::Created(op) = store.operation_accept(params).await.unwrap() else {
            panic!("created")
        };
        assert_eq!(op.rerun_of.as_ref(), Some(&chain.last().unwrap().id));
        chain.push(op);
    }
    let read = |id: &Id| {
        let id = id.clone();
        async move { store.operation_get("t1", &id).await.unwrap().unwrap() }
    };
    let original = read(&chain[0].id).await;
    assert_eq!(original.reruns, Some(vec![chain[1].id.clone()]));
    assert_eq!(
        (original.version, original.state),
        (failed.version, State::Failed),
        "unchanged"
    );
    let middle = read(&chain[1].id).await;
    assert_eq!(middle.rerun_of.as_ref(), Some(&chain[0].id));
    assert_eq!(middle.reruns, Some(vec![chain[2].id.clone()]));
    let last = read(&chain[2].id).await;
    assert_eq!(
        (last.rerun_of.as_ref(), last.reruns),
        (Some(&chain[1].id), Some(Vec::new()))
    );
    assert!(store.operation_get("t2", &chain[1].id).await.unwrap().is_none());
    // A cancelled operation keeps its input too.
    let cancelled = store.operation_cancel(cancel("t1", &chain[2].id, at(3))).await.unwrap();
    assert!(matches!(cancelled, CancelOutcome::CancelledNow(op) if op.input == Some(json!({"n": 1}))));
}

pub async fn a_batch_of_submissions_answers_each_alone(store: &dyn Store) {
    let earlier = store
        .operation_accept(accept_params("t1", "q", Some("old"), json!({"n": 0})))
        .await
        .unwrap();
    let AcceptOutcome::Created(earlier) = earlier else {
        panic!()
    };
    let batch = vec![
        accept_params("t1", "q", Some("a"), json!({"n": 1})),
        // The same key twice in one batch: one operation, then its replay.
        accept_params("t1", "q", Some("b"), json!({"n": 2})),
        accept_params("t1", "q", Some("b"), json!({"n": 2})),
        // A key used before: replayed, or refused when the request differs.
        accept_params("t1", "q", Some("old"), json!({"n": 0})),
        accept_params("t1", "q", Some("old"), json!({"n": 99})),
        accept_params("t1", "q", None, json!({"n": 3})),
    ];
    let ids: Vec<Id> = batch.iter().map(|p| p.id.clone()).collect();
    let answers = store.operation_accept_many(batch).await;
    assert_eq!(answers.len(), 6);
    let created = |i: usize| match &answers[i] {
        Ok(AcceptOutcome::Created(op)) => op.clone(),
        other => panic!("item {i}: expected Created, got {other:?}"),
    };
    assert_eq!(created(0).id, ids[0]);
    // The same key twice in one batch converges on one operation; which of
    // the two items created it is not promised (items commit concurrently).
    let b = match (&answers[1], &answers[2]) {
        (Ok(AcceptOutcome::Created(b)), Ok(AcceptOutcome::Replayed(r)))
        | (Ok(AcceptOutcome::Replayed(r)), Ok(AcceptOutcome::Created(b))) => {
            assert_eq!(b, r);
            b.clone()
        }
        other => panic!("expected one Created and one Replayed, got {other:?}"),
    };
    assert_eq!(answers[3].as_ref().unwrap(), &AcceptOutcome::Replayed(earlier.clone()));
    assert!(
        matches!(&answers[4], Ok(AcceptOutcome::KeyReused { operation_id }) if *operation_id == earlier.id),
        "{:?}",
        answers[4]
    );
    assert_eq!(created(5).id, ids[5]);
    // Each created item is a whole operation: readable, with its first event, claimable.
    for op in [created(0), b, created(5)] {
        assert_eq!(get(store, &op).await, op);
        let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
        assert_eq!(history.len(), 1);
    }
    assert_eq!(claim(store, "q", 10, at(1)).await.len(), 4);
}

pub async fn a_batch_past_a_quota_refuses_only_what_does_not_fit(store: &dyn Store) {
    store
        .tenant_set(TenantLimits {
            name: "small".into(),
            max_active: Some(2),
            max_running: None,
            rate: None,
        })
        .await
        .unwrap();
    let batch: Vec<AcceptParams> = (0..4)
        .map(|i| accept_params("small", "q", Some(&format!("k{i}")), json!({"n": i})))
        .chain([accept_params("other", "q", Some("k0"), json!({}))])
        .collect();
    let answers = store.operation_accept_many(batch).await;
    let created = answers
        .iter()
        .filter(|a| matches!(a, Ok(AcceptOutcome::Created(_))))
        .count();
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(StoreError::QuotaExceeded { max_active: 2, .. })))
        .count();
    assert_eq!((created, refused), (3, 2), "{answers:?}");
    assert!(
        matches!(answers[4], Ok(AcceptOutcome::Created(_))),
        "another tenant is not limited"
    );
    // A refused key was not consumed.
    let page = store
        .operation_list(ListParams {
            tenant: Some("small".into()),
            state: None,
            kind: None,
            label: None,
            page_size: 10,
            before_seq: None,
            visible_at: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.operations.len(), 2);
    // Nor were the refused items' keys: with room again, they create.
    store
        .tenant_set(TenantLimits {
            name: "small".into(),
            max_active: None,
            max_running: None,
            rate: None,
        })
        .await
        .unwrap();
    for (i, answer) in answers.iter().enumerate().take(4) {
        if answer.is_err() {
            let again = store
                .operation_accept(accept_params("small", "q", Some(&format!("k{i}")), json!({"n": i})))
                .await;
            assert!(matches!(again, Ok(AcceptOutcome::Created(_))), "k{i}: {again:?}");
        }
    }
}
