//! Events, the change feed and the read cache: every committed change is
//! recorded and published once, in order, and reads never go back a version.

use super::*;

pub async fn every_event_keeps_the_representation_at_its_version(store: &dyn Store) {
    let op = create(store, "t1", "snap").await;
    let task = claim_one(store, "snap", at(1)).await;
    let mut hb = heartbeat(&task, at(2));
    hb.progress = Some(ProgressUpdate {
        completed_units: Some(1.0),
        ..Default::default()
    });
    store.task_heartbeat(hb).await.unwrap();
    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: Some(json!(7)) }, at(3)))
        .await
        .unwrap();

    let events = store
        .operation_events_after("t1", &op.id, 0, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events.iter().map(|e| e.version).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    let snapshots: Vec<Operation> = events.iter().map(|e| e.snapshot.clone().expect("a snapshot")).collect();
    assert_eq!((snapshots[0].state, snapshots[0].version), (State::Queued, 1));
    assert_eq!(
        (snapshots[1].state, snapshots[1].started_at),
        (State::Running, Some(at(1)))
    );
    assert_eq!(snapshots[2].progress.as_ref().unwrap().completed_units, Some(1.0));
    let mut expected = done.clone();
    expected.input = None;
    assert_eq!(
        snapshots[3], expected,
        "the last snapshot is the stored operation, less its input"
    );

    let later = store
        .operation_events_after("t1", &op.id, 2, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(later.iter().map(|e| e.version).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(
        store
            .operation_events_after("t1", &op.id, 0, 1)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    assert!(
        store
            .operation_events_after("t2", &op.id, 0, 100)
            .await
            .unwrap()
            .is_none()
    );

    // A cancel asked of the ended operation moves no version; the replay of
    // its last version is what a read shows at that version (one ETag, one
    // representation).
    store.operation_cancel(cancel("t1", &op.id, at(4))).await.unwrap();
    let read = store.operation_get("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(read.version, 4);
    let replayed = store
        .operation_events_after("t1", &op.id, 3, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        replayed[0].snapshot.as_ref(),
        Some(&Operation {
            input: None,
            reruns: None,
            ..read
        })
    );
}

/// Work submitted with nothing but defaults keeps no row for its `created`
/// event, and no work keeps one for its ending: the operation's row says
/// both (plan/history.rs). Its history reads the same as that of work
/// whose created event is kept (labels): every version, type, state, time
/// and data, the failed ending carrying its error; a queued operation
/// cancelled has its two events too.
pub async fn a_history_reads_the_same_whether_its_events_were_kept_or_derived(store: &dyn Store) {
    let plain = create(store, "t1", "hist").await;
    let labelled = create_labelled(store, "t1", "hist").await;
    let error = OperationError {
        code: "boom".into(),
        message: "it broke".into(),
        retryable: false,
    };
    for _ in 0..2 {
        let task = claim_one(store, "hist", at(1)).await;
        let outcome = Outcome::Failed { error: error.clone() };
        store.task_finish(finish(&task, outcome, at(2))).await.unwrap();
    }
    let history = async |id: &Id| {
        let events = store.operation_history("t1", id).await.unwrap().unwrap();
        events
            .into_iter()
            .map(|e| (e.version, e.event_type, e.state, e.at, e.data))
            .collect::<Vec<_>>()
    };
    let (a, b) = (history(&plain.id).await, history(&labelled.id).await);
    let failed = json!({"error": {"code": "boom", "message": "it broke", "retryable": false}});
    for (events, created_at) in [(&a, plain.created_at), (&b, labelled.created_at)] {
        let seen: Vec<_> = events.iter().map(|e| (e.0, e.1.as_str(), e.2, e.3)).collect();
        assert_eq!(
            seen,
            [
                (1, "created", State::Queued, created_at),
                (2, "started", State::Running, at(1)),
                (3, "failed", State::Failed, at(2)),
            ]
        );
        assert_eq!((&events[0].4, &events[2].4), (&json!({}), &failed));
    }
    assert_eq!(a[1].4, b[1].4, "the start's data is kept alike");
    // An event stream resumed after each version it delivered (a
    // `Last-Event-ID`), a page of one at a time, gets every version once,
    // the derived ones in their places, and nothing after the last.
    for id in [&plain.id, &labelled.id] {
        let mut seen = Vec::new();
        let mut last = 0;
        while let Some(event) = store
            .operation_events_after("t1", id, last, 1)
            .await
            .unwrap()
            .unwrap()
            .pop()
        {
            assert!(event.version > last, "{event:?} after version {last}");
            assert_eq!(event.snapshot.as_ref().map(|s| s.version), Some(event.version));
            last = event.version;
            seen.push((event.version, event.event_type));
        }
        assert_eq!(
            seen,
            [(1, "created".into()), (2, "started".into()), (3, "failed".into())]
        );
    }

    let queued = create(store, "t1", "hist-cancel").await;
    store.operation_cancel(cancel("t1", &queued.id, at(3))).await.unwrap();
    let cancelled = store.operation_get("t1", &queued.id).await.unwrap().unwrap();
    let events = store.operation_history("t1", &queued.id).await.unwrap().unwrap();
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.version, e.event_type.as_str(), e.state))
        .collect();
    assert_eq!(
        seen,
        [(1, "created", State::Queued), (2, "cancelled", State::Cancelled)]
    );
    assert_eq!(events[1].at, cancelled.updated_at);
    assert_eq!(
        (cancelled.error, &events[1].data),
        (None, &json!({})),
        "a client's cancel carries no error"
    );
}

/// Three operations for a backend's own test to count the history rows of
/// (plan/history.rs): a one-step job submitted with defaults (one kept
/// row, its start), the same with labels (two: its created event too),
/// and default work cancelled while queued (none). Each history still
/// reads whole; returned with the number of rows each should keep.
pub async fn three_histories_and_their_kept_rows(store: &dyn Store) -> [(Id, i64); 3] {
    let plain = create(store, "t1", "rows").await;
    let labelled = create_labelled(store, "t1", "rows").await;
    for _ in 0..2 {
        let task = claim_one(store, "rows", at(1)).await;
        let outcome = Outcome::Succeeded { result: None };
        store.task_finish(finish(&task, outcome, at(2))).await.unwrap();
    }
    let queued = create(store, "t1", "rows-cancelled").await;
    store.operation_cancel(cancel("t1", &queued.id, at(3))).await.unwrap();
    for (id, events) in [(&plain.id, 3), (&labelled.id, 3), (&queued.id, 2)] {
        let history = store.operation_history("t1", id).await.unwrap().unwrap();
        assert_eq!(history.len(), events, "{id:?}: {history:?}");
    }
    [(plain.id, 1), (labelled.id, 2), (queued.id, 0)]
}

pub async fn committed_changes_are_published_and_rolled_back_ones_are_not(store: &dyn Store) {
    let mut changes = store.subscribe_changes();
    let op = create(store, "t1", "feed").await;
    let first = changes.recv().await.unwrap();
    assert_eq!((first.operation_id.clone(), first.version), (op.id.clone(), 1));
    // A refused write publishes nothing.
    let mut forged = claim_one(store, "feed", at(1)).await;
    assert_eq!(changes.recv().await.unwrap().version, 2);
    forged.lease_token = "forged".into();
    assert!(
        store
            .task_finish(finish(&forged, Outcome::Cancelled, at(2)))
            .await
            .is_err()
    );
    store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap();
    let next = changes.recv().await.unwrap();
    assert_eq!(
        (next.operation_id, next.version),
        (op.id, 3),
        "the refused write left no trace in the feed"
    );
}

/// More submissions than one notification holds (PostgreSQL sends 20 a
/// payload), with a replay among them: each created one is published once,
/// the replay not at all.
pub async fn every_submission_of_a_batch_is_published_once(store: &dyn Store) {
    let mut changes = store.subscribe_changes();
    let mut batch: Vec<AcceptParams> = (0..45)
        .map(|n| accept_params("t1", "feed", Some(&format!("k{n}")), json!({ "n": n })))
        .collect();
    batch.push(accept_params("t1", "feed", Some("k3"), json!({ "n": 3 })));
    let answers = store.operation_accept_many(batch).await;
    let mut created = std::collections::BTreeSet::new();
    for answer in &answers[..45] {
        let Ok(AcceptOutcome::Created(op)) = answer else {
            panic!("{answer:?}")
        };
        created.insert(op.id.clone());
    }
    assert!(
        matches!(answers[45], Ok(AcceptOutcome::Replayed(_))),
        "{:?}",
        answers[45]
    );
    let mut published = std::collections::BTreeSet::new();
    for _ in 0..45 {
        let change = changes.recv().await.unwrap();
        assert_eq!((change.version, change.event_type.as_str()), (1, "created"));
        assert!(published.insert(change.operation_id), "published twice");
    }
    assert_eq!(published, created);
    // Nothing more: the next change is a later write's.
    let later = create(store, "t1", "feed").await;
    assert_eq!(changes.recv().await.unwrap().operation_id, later.id);
}

/// A claim and a batch of outcomes of more tasks than one notification
/// carries (PostgreSQL sends 20 changes a payload) publish each change once,
/// each operation's in version order, and nothing else.
pub async fn every_change_of_a_large_claim_and_outcome_batch_is_published_once_in_order(store: &dyn Store) {
    const N: usize = 45;
    // Subscribed first: PostgreSQL delivers the `created` changes after
    // the accepts return, so they are counted rather than raced.
    let mut changes = store.subscribe_changes();
    for _ in 0..N {
        create(store, "t1", "feed").await;
    }
    let tasks = claim(store, "feed", N as u32, at(1)).await;
    assert_eq!(tasks.len(), N);
    let outcomes = tasks
        .iter()
        .map(|t| finish(t, Outcome::Succeeded { result: None }, at(2)))
        .collect();
    for answer in store.task_finish_many(outcomes).await {
        answer.unwrap();
    }
    let mut seen: BTreeMap<Id, Vec<(i64, String)>> = BTreeMap::new();
    for _ in 0..3 * N {
        let change = changes.recv().await.unwrap();
        seen.entry(change.operation_id)
            .or_default()
            .push((change.version, change.event_type));
    }
    assert_eq!(seen.len(), N);
    for (id, got) in &seen {
        let expected = [(1, "created"), (2, "started"), (3, "succeeded")].map(|(v, t)| (v, t.to_owned()));
        assert_eq!(got, &expected, "{id}");
    }
    // Nothing more: the next change is a later write's.
    let later = create(store, "t1", "feed").await;
    assert_eq!(changes.recv().await.unwrap().operation_id, later.id);
}

/// Each backend keeps what `operation_get` read: a read right after any
/// kind of write (claim, update, finish, re-run, retention, deletion) must
/// see it, though the operation was read just before.
pub async fn a_read_after_each_kind_of_write_sees_it(store: &dyn Store) {
    let read = |tenant: &'static str, id: &Id| {
        let id = id.clone();
        async move { store.operation_get(tenant, &id).await.unwrap() }
    };
    let op = create(store, "t1", "seen").await;
    assert_eq!(read("t1", &op.id).await.unwrap().state, State::Queued);
    assert!(read("t2", &op.id).await.is_none(), "kept, but for its own tenant only");
    let task = claim_one(store, "seen", at(1)).await;
    assert_eq!(read("t1", &op.id).await.unwrap().state, State::Running);
    let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
    let current = read("t1", &op.id).await.unwrap();
    store
        .operation_update(UpdateParams {
            tenant: "t1".into(),
            id: op.id.clone(),
            if_match: current.version,
            deadline_at: None,
            labels: Some(labels.clone()),
            not_before: None,
            now: at(2),
        })
        .await
        .unwrap();
    assert_eq!(read("t1", &op.id).await.unwrap().labels, labels);
    store
        .task_finish(finish(&task, Outcome::Succeeded { result: Some(json!(1)) }, at(3)))
        .await
        .unwrap();
    let done = read("t1", &op.id).await.unwrap();
    assert_eq!((done.state, done.result), (State::Succeeded, Some(json!(1))));
    // A re-run changes what its source lists, not its version.
    let mut params = accept_params("t1", "seen", None, json!({}));
    params.rerun_of = Some(op.id.clone());
    let AcceptOutcome::Created(rerun) = store.operation_accept(params).await.unwrap() else {
        panic!("created")
    };
    let source = read("t1", &op.id).await.unwrap();
    assert_eq!(
        (source.version, source.reruns),
        (done.version, Some(vec![rerun.id.clone()]))
    );
    // Removed by retention once expired: gone, though read just before.
    let expires = done.expires_at.expect("an ended operation expires");
    assert!(read("t1", &op.id).await.is_some());
    store.retention_sweep(sweep(expires)).await.unwrap();
    assert!(read("t1", &op.id).await.is_none(), "removed by retention");
    // Deleted with its tenant.
    let doomed = create(store, "doomed", "seen").await;
    assert!(read("doomed", &doomed.id).await.is_some());
    store.tenant_delete("doomed", at(4)).await.unwrap();
    assert!(read("doomed", &doomed.id).await.is_none(), "deleted with its tenant");
}

/// Reads racing writes of one operation: each reader sees its versions in
/// order, never an older one after a newer, and once the writes are done
/// every read is the last one's. (That a read overlapping a write is never
/// kept, which this race rarely hits, is checked deterministically by the
/// read cache's own tests.)
pub async fn reads_racing_writes_never_go_back_a_version(store: &dyn Store) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let op = create(store, "t1", "raced").await;
    let done = AtomicBool::new(false);
    let reader = || async {
        let mut seen = 0;
        let mut reads = 0;
        while !done.load(Ordering::Acquire) {
            let version = store.operation_get("t1", &op.id).await.unwrap().unwrap().version;
            assert!(version >= seen, "read version {version} after {seen}");
            seen = version;
            reads += 1;
            tokio::task::yield_now().await;
        }
        reads
    };
    let writer = async {
        let mut version = op.version;
        for n in 0..40 {
            let updated = store
                .operation_update(UpdateParams {
                    tenant: "t1".into(),
                    id: op.id.clone(),
                    if_match: version,
                    deadline_at: None,
                    labels: Some(BTreeMap::from([("n".to_owned(), n.to_string())])),
                    not_before: None,
                    now: at(1),
                })
                .await
                .unwrap();
            version = updated.version;
        }
        done.store(true, Ordering::Release);
        version
    };
    let (last, a, b, c) = tokio::join!(writer, reader(), reader(), reader());
    assert!(a + b + c > 40, "the readers raced the writes ({a}, {b}, {c} reads)");
    for _ in 0..3 {
        let read = store.operation_get("t1", &op.id).await.unwrap().unwrap();
        assert_eq!(
            (read.version, read.labels.get("n").map(String::as_str)),
            (last, Some("39"))
        );
    }
}
