//! Retention and tenant deletion: what expires, what a tombstone keeps, and
//! that a deleted tenant leaves nothing.

use super::*;

/// Ends the backends' migration tests of tombstones: a retention sweep at
/// 6 s buries the one tombstone the test left (expiring at 5 s), whose
/// idempotency record was `("t1", "k", "old-key")`, and that key then takes
/// a new submission.
pub async fn bury_and_reuse_old_key(store: &dyn Store) {
    let counts = store
        .retention_sweep(RetentionParams {
            now: Timestamp(6000),
            tombstone_retention: Duration::from_secs(3600),
            delivery_retention: Duration::from_secs(600),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(counts.tombstones_removed, 1);
    let fresh = store
        .operation_accept(accept_params("t1", "k", Some("old-key"), json!({})))
        .await
        .unwrap();
    assert!(
        matches!(fresh, AcceptOutcome::Created(_)),
        "the buried tombstone's key is free again: {fresh:?}"
    );
}

pub async fn retention_expires_results_removes_operations_and_buries_tombstones(store: &dyn Store) {
    let AcceptOutcome::Created(op) = store
        .operation_accept(accept_params("t1", "kept", Some("retained-key"), json!({})))
        .await
        .unwrap()
    else {
        panic!()
    };
    let task = claim_one(store, "kept", at(1)).await;
    store.result_upload(upload(&task, "k-kept", at(2))).await.unwrap();
    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(3)))
        .await
        .unwrap();
    let (result_expiry, op_expiry) = (done.artifact.unwrap().expires_at, done.expires_at.unwrap());
    assert!(
        result_expiry < op_expiry,
        "results are kept less long than their operation"
    );

    assert_eq!(
        store.retention_sweep(sweep(at(4))).await.unwrap(),
        RetentionCounts::default()
    );
    let unswept = store.result_for_operation("t1", &op.id).await.unwrap().remove(0);
    assert!(!unswept.is_expired(at(4)));
    assert!(unswept.is_expired(result_expiry), "expired at its expiry, swept or not");
    let counts = store.retention_sweep(sweep(result_expiry)).await.unwrap();
    assert_eq!(counts.results_expired, 1);
    assert_eq!(
        store.result_for_operation("t1", &op.id).await.unwrap().remove(0).state,
        "expired"
    );
    assert_eq!(
        get(store, &op).await.state,
        State::Succeeded,
        "the operation stays succeeded"
    );
    assert_eq!(store.artifact_garbage(10).await.unwrap(), vec!["k-kept".to_owned()]);
    assert_eq!(
        store.retention_sweep(sweep(result_expiry)).await.unwrap(),
        RetentionCounts::default(),
        "idempotent"
    );

    // Past its expiry the operation is hidden from lists at once, before the
    // sweep removes it (visibility is decided at read time).
    let listed_at = |now: Timestamp| ListParams {
        tenant: Some("t1".into()),
        page_size: 10,
        visible_at: Some(now),
        ..Default::default()
    };
    let before = store.operation_list(listed_at(at(5))).await.unwrap();
    assert_eq!(before.operations.len(), 1, "still listed before its expiry");
    let after = store.operation_list(listed_at(op_expiry)).await.unwrap();
    assert!(after.operations.is_empty(), "listed past its expiry");
    assert!(get(store, &op).await.is_expired(op_expiry));

    // A late sweep: the tombstone still dates from the expiry, so its window
    // does not depend on when the sweep ran.
    let late = op_expiry.plus(Duration::from_secs(600));
    let counts = store.retention_sweep(sweep(late)).await.unwrap();
    assert_eq!(counts.operations_removed, 1);
    assert!(store.operation_get("t1", &op.id).await.unwrap().is_none());
    assert!(store.operation_history("t1", &op.id).await.unwrap().is_none());
    assert_eq!(store.operation_tombstone("t1", &op.id).await.unwrap(), Some(op_expiry));
    assert_eq!(store.operation_tombstone("t2", &op.id).await.unwrap(), None);
    let replay = store
        .operation_accept(accept_params("t1", "kept", Some("retained-key"), json!({})))
        .await;
    assert!(
        matches!(replay, Err(StoreError::Gone)),
        "a replay does not silently start the work again: {replay:?}"
    );

    let buried_at = op_expiry.plus(Duration::from_secs(3600));
    let counts = store.retention_sweep(sweep(buried_at)).await.unwrap();
    assert_eq!(counts.tombstones_removed, 1);
    assert_eq!(store.operation_tombstone("t1", &op.id).await.unwrap(), None);
    let fresh = store
        .operation_accept(accept_params("t1", "kept", Some("retained-key"), json!({})))
        .await
        .unwrap();
    assert!(
        matches!(fresh, AcceptOutcome::Created(_)),
        "after the tombstone the key is free again"
    );
}

/// A sweep removes the operations due a batch at a time, at most its limit
/// of them, each with a tombstone dated from its own expiry and its result
/// object given to garbage collection; work not due stays.
pub async fn a_sweep_removes_what_is_due_a_batch_at_a_time(store: &dyn Store) {
    let mut ended = Vec::new();
    for (i, kind) in ["batch-a", "batch-b", "batch-c"].into_iter().enumerate() {
        let AcceptOutcome::Created(op) = store
            .operation_accept(accept_params("t1", kind, Some(kind), json!({})))
            .await
            .unwrap()
        else {
            panic!()
        };
        let task = claim_one(store, kind, at(1)).await;
        store
            .result_upload(upload(&task, &format!("k-{kind}"), at(2)))
            .await
            .unwrap();
        let done = store
            .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(3 + i as u64)))
            .await
            .unwrap();
        ended.push((op, done.expires_at.unwrap()));
    }
    let AcceptOutcome::Created(waiting) = store
        .operation_accept(accept_params("t1", "batch-waiting", None, json!({})))
        .await
        .unwrap()
    else {
        panic!()
    };
    let late = ended.iter().map(|(_, expiry)| *expiry).max().unwrap();
    let (mut removed, mut sweeps) = (0, 0);
    loop {
        let counts = store
            .retention_sweep(RetentionParams {
                limit: 2,
                ..sweep(late)
            })
            .await
            .unwrap();
        assert!(counts.operations_removed <= 2, "at most the limit a sweep: {counts:?}");
        if counts.total() == 0 {
            break;
        }
        removed += counts.operations_removed;
        sweeps += 1;
    }
    assert_eq!(removed, 3);
    assert!(sweeps >= 2, "three operations due, two a sweep");
    for (op, expiry) in &ended {
        assert!(store.operation_get("t1", &op.id).await.unwrap().is_none());
        assert!(store.operation_history("t1", &op.id).await.unwrap().is_none());
        assert_eq!(store.operation_tombstone("t1", &op.id).await.unwrap(), Some(*expiry));
        let replay = store
            .operation_accept(accept_params("t1", &op.kind, Some(&op.kind), json!({})))
            .await;
        assert!(matches!(replay, Err(StoreError::Gone)), "{replay:?}");
    }
    let mut garbage = store.artifact_garbage(10).await.unwrap();
    garbage.sort();
    assert_eq!(garbage, ["k-batch-a", "k-batch-b", "k-batch-c"]);
    assert_eq!(get(store, &waiting).await.state, State::Queued, "work not due stays");
}

/// A sweep removes up to its limit however the store steps through it
/// (SQLite a writer job per 100 rows a phase, PostgreSQL one transaction):
/// 250 due, a sweep of 150 removes 150 and one of 500 the other 100.
pub async fn a_sweep_larger_than_a_step_removes_up_to_its_limit(store: &dyn Store) {
    let params: Vec<AcceptParams> = (0..250)
        .map(|_| accept_params("t1", "stepped", None, json!({})))
        .collect();
    for accepted in store.operation_accept_many(params).await {
        assert!(matches!(accepted, Ok(AcceptOutcome::Created(_))), "{accepted:?}");
    }
    let tasks = claim(store, "stepped", 250, at(1)).await;
    assert_eq!(tasks.len(), 250);
    let outcomes = tasks
        .iter()
        .map(|task| finish(task, Outcome::Succeeded { result: None }, at(2)))
        .collect();
    let ended = store.task_finish_many(outcomes).await;
    let expiry = ended[0].as_ref().unwrap().expires_at.unwrap();
    let sweep_of = |limit| RetentionParams { limit, ..sweep(expiry) };
    let first = store.retention_sweep(sweep_of(150)).await.unwrap();
    assert_eq!((first.operations_removed, first.tombstones_removed), (150, 0));
    let second = store.retention_sweep(sweep_of(500)).await.unwrap();
    assert_eq!(second.operations_removed, 100, "the rest, though past one step");
    assert_eq!(
        store.retention_sweep(sweep_of(500)).await.unwrap(),
        RetentionCounts::default()
    );
    for task in &tasks {
        assert!(store.operation_get("t1", &task.operation_id).await.unwrap().is_none());
    }
}

pub async fn deleting_a_tenant_leaves_nothing_of_it(store: &dyn Store) {
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id.clone(),
            tenant: "doomed".into(),
            role: Role::Client,
            secret_hash: key.secret_hash,
            now: T0,
        })
        .await
        .unwrap();
    let mut p = accept_params("doomed", "gone-kind", Some("k"), json!({}));
    p.callback_url = Some("https://client.example/hook".into());
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    let task = claim_one(store, "gone-kind", at(1)).await;
    store.result_upload(upload(&task, "k-doomed", at(2))).await.unwrap();
    store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(3)))
        .await
        .unwrap();
    store
        .webhook_secrets("doomed", "whsec_doomed".into(), at(3))
        .await
        .unwrap();
    let survivor = create(store, "t1", "gone-kind").await;

    let counts = store.tenant_delete("doomed", at(4)).await.unwrap();
    assert_eq!(
        (counts.operations, counts.results, counts.keys, counts.deliveries),
        (1, 1, 1, 2)
    );
    assert!(store.operation_get("doomed", &op.id).await.unwrap().is_none());
    assert!(store.operation_tombstone("doomed", &op.id).await.unwrap().is_none());
    assert!(store.api_key_get(&key.id).await.unwrap().is_none());
    assert!(
        store
            .webhook_due(at(100), 10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.artifact_garbage(10).await.unwrap(), vec!["k-doomed".to_owned()]);
    let page = store
        .operation_list(ListParams {
            tenant: Some("doomed".into()),
            page_size: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(page.operations.is_empty());
    assert!(
        store.operation_get("t1", &survivor.id).await.unwrap().is_some(),
        "other tenants are untouched"
    );
    let again = store
        .operation_accept(accept_params("doomed", "gone-kind", Some("k"), json!({})))
        .await
        .unwrap();
    assert!(
        matches!(again, AcceptOutcome::Created(_)),
        "its idempotency records are gone too"
    );
}
