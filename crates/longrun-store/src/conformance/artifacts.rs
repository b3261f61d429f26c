//! Uploaded results, named artifacts, resumable uploads and the pieces of
//! resumable artifacts.

use super::*;

pub async fn an_uploaded_artifact_is_published_by_complete_and_discarded_otherwise(store: &dyn Store) {
    let op = create(store, "t1", "artifacts").await;
    let task = claim_one(store, "artifacts", at(1)).await;
    let mut forged = task.clone();
    forged.lease_token = "forged".into();
    assert!(matches!(
        store.result_upload(upload(&forged, "k-forged", at(2))).await,
        Err(StoreError::LeaseLost)
    ));
    store.result_upload(upload(&task, "k-first", at(2))).await.unwrap();
    let second = upload(&task, "k-second", at(3));
    let result_id = second.result_id.clone();
    store.result_upload(second).await.unwrap();
    assert!(
        store.result_for_operation("t1", &op.id).await.unwrap().is_empty(),
        "not published before complete"
    );
    assert_eq!(
        store.artifact_garbage(10).await.unwrap(),
        vec!["k-first".to_owned()],
        "a replaced upload is garbage"
    );

    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(4)))
        .await
        .unwrap();
    let artifact = done.artifact.clone().expect("the artifact is the result");
    assert_eq!(
        (artifact.id.clone(), artifact.size_bytes, artifact.content_type.as_str()),
        (result_id.clone(), 42, "text/csv")
    );
    assert!(artifact.expires_at > at(4));
    assert_eq!(get(store, &op).await.artifact, Some(artifact));
    let record = store.result_for_operation("t1", &op.id).await.unwrap().remove(0);
    assert_eq!(
        (record.state.as_str(), record.storage_key.as_str(), record.name.as_str()),
        ("published", "k-second", DEFAULT_ARTIFACT)
    );
    assert_eq!(store.result_get(&result_id).await.unwrap(), Some(record));
    assert!(store.result_for_operation("t2", &op.id).await.unwrap().is_empty());

    // A failure the worker reports keeps what it uploaded (error reports,
    // partial outputs).
    let failed = create(store, "t1", "artifacts").await;
    let task = claim_one(store, "artifacts", at(5)).await;
    store.result_upload(upload(&task, "k-failed", at(6))).await.unwrap();
    let ended = store.task_finish(finish(&task, failure("boom"), at(7))).await.unwrap();
    assert!(ended.artifact.is_some(), "a worker's failure publishes its uploads");
    assert_eq!(store.result_for_operation("t1", &failed.id).await.unwrap().len(), 1);

    // Any other end (here a cancellation) discards them.
    let cancelled = create(store, "t1", "artifacts").await;
    let task = claim_one(store, "artifacts", at(8)).await;
    store.result_upload(upload(&task, "k-cancelled", at(8))).await.unwrap();
    let ended = store
        .task_finish(finish(&task, Outcome::Cancelled, at(9)))
        .await
        .unwrap();
    assert_eq!((ended.state, ended.artifact), (State::Cancelled, None));
    assert!(
        store
            .result_for_operation("t1", &cancelled.id)
            .await
            .unwrap()
            .is_empty()
    );
    let garbage = store.artifact_garbage(10).await.unwrap();
    assert!(garbage.contains(&"k-cancelled".to_owned()));
    store.artifact_garbage_done(garbage).await.unwrap();
    assert!(store.artifact_garbage(10).await.unwrap().is_empty());
}

pub async fn named_artifacts_are_published_together_and_an_earlier_attempts_are_replaced(store: &dyn Store) {
    declare(store, "named", true, 3).await;
    let op = create(store, "t1", "named").await;
    let first = claim_one(store, "named", at(1)).await;
    store
        .result_upload(named_upload(&first, "accepted", "k-old-accepted", at(2)))
        .await
        .unwrap();
    // The attempt fails and is retried; the next attempt's first upload
    // replaces what the earlier one left, whatever its name.
    store
        .task_finish(finish(&first, retryable("flaky"), at(3)))
        .await
        .unwrap();
    let task = claim_one(store, "named", at(3600)).await;
    store
        .result_upload(named_upload(&task, "errors", "k-errors", at(41)))
        .await
        .unwrap();
    store
        .result_upload(named_upload(&task, "accepted", "k-accepted", at(41)))
        .await
        .unwrap();
    store.result_upload(upload(&task, "k-default", at(41))).await.unwrap();
    assert!(
        store
            .artifact_garbage(10)
            .await
            .unwrap()
            .contains(&"k-old-accepted".to_owned())
    );
    let done = store
        .task_finish(finish(
            &task,
            Outcome::Succeeded {
                result: Some(json!({"summary": {"rows_total": 3}})),
            },
            at(42),
        ))
        .await
        .unwrap();
    assert!(done.artifact.is_some());
    assert_eq!(done.artifacts.keys().collect::<Vec<_>>(), vec!["accepted", "errors"]);
    assert_eq!(get(store, &op).await.artifacts, done.artifacts, "stored as published");
    let records = store.result_for_operation("t1", &op.id).await.unwrap();
    let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["accepted", DEFAULT_ARTIFACT, "errors"]);
    assert_eq!(records[0].storage_key, "k-accepted");
}

pub async fn uploads_append_at_their_offset_complete_once_and_live_while_named(store: &dyn Store) {
    let id = Id::generate(IdKind::Upload);
    let created = store
        .upload_create(UploadCreateParams {
            id: id.clone(),
            tenant: "t1".into(),
            content_type: "text/csv".into(),
            expected_sha256: None,
            now: at(0),
            expires_at: at(100),
        })
        .await
        .unwrap();
    assert_eq!(
        (created.offset, created.complete, created.referenced),
        (0, false, false)
    );
    assert_eq!(
        store.upload_get("t2", &id).await.unwrap(),
        None,
        "other tenants do not see it"
    );
    let append = |offset: i64, key: &str, size: i64| UploadAppendParams {
        tenant: "t1".into(),
        id: id.clone(),
        offset,
        chunk: chunk(key, size),
        sha256: None,
        expected_sha256: None,
        now: at(1),
    };
    assert_eq!(store.upload_append(append(0, "u/a", 10)).await.unwrap().offset, 10);
    assert!(matches!(
        store.upload_append(append(5, "u/stale", 5)).await,
        Err(StoreError::UploadOffsetMismatch {
            offset: 10,
            complete: false
        })
    ));
    let mut other_tenant = append(10, "u/x", 1);
    other_tenant.tenant = "t2".into();
    assert!(matches!(
        store.upload_append(other_tenant).await,
        Err(StoreError::NotFound)
    ));
    let appended = store.upload_append(append(10, "u/b", 5)).await.unwrap();
    assert_eq!((appended.offset, appended.chunks.len()), (15, 2));
    let complete = |size: i64| UploadCompleteParams {
        tenant: "t1".into(),
        id: id.clone(),
        size_bytes: size,
        object: chunk("u/whole", size),
        sha256: "cd".repeat(32),
        now: at(2),
    };
    assert!(matches!(
        store.upload_complete(complete(10)).await,
        Err(StoreError::UploadOffsetMismatch { offset: 15, .. })
    ));
    let done = store.upload_complete(complete(15)).await.unwrap();
    assert_eq!(
        (done.complete, done.chunks.clone(), done.sha256.as_deref()),
        (true, vec![chunk("u/whole", 15)], Some("cd".repeat(32).as_str()))
    );
    assert!(done.is_usable(at(2)) && !done.is_usable(at(100)));
    let mut garbage = store.artifact_garbage(10).await.unwrap();
    garbage.sort();
    assert_eq!(garbage, vec!["u/a".to_owned(), "u/b".to_owned()]);
    store.artifact_garbage_done(garbage).await.unwrap();
    assert!(matches!(
        store.upload_append(append(15, "u/late", 1)).await,
        Err(StoreError::UploadOffsetMismatch { complete: true, .. })
    ));

    // A submission names it: it then lives as long as the operation.
    declare(store, "import", true, 3).await;
    let mut params = accept_params("t1", "import", None, json!({"upload": id.as_str()}));
    params.uploads = vec![id.clone()];
    let AcceptOutcome::Created(op) = store.operation_accept(params).await.unwrap() else {
        panic!("created")
    };
    assert!(store.upload_get("t1", &id).await.unwrap().unwrap().referenced);
    assert!(
        !store.upload_remove("t1", &id, at(3)).await.unwrap(),
        "a named upload is not removed"
    );
    let task = claim_one(store, "import", at(3)).await;
    assert_eq!(
        store
            .upload_for_task(&op.id, &task.lease_token, &id)
            .await
            .unwrap()
            .map(|u| u.offset),
        Some(15)
    );
    assert!(matches!(
        store.upload_for_task(&op.id, "forged", &id).await,
        Err(StoreError::LeaseLost)
    ));
    let unnamed = Id::generate(IdKind::Upload);
    assert_eq!(
        store
            .upload_for_task(&op.id, &task.lease_token, &unnamed)
            .await
            .unwrap(),
        None
    );
    // A holder whose lease lapsed reads nothing once the work is held
    // again; the new holder reads it.
    let lapsed = at(3).plus(LEASE).plus(Duration::from_secs(1));
    store.task_reap(ReapParams { now: lapsed, limit: 10 }).await.unwrap();
    let again = claim_one(store, "import", lapsed.plus(Duration::from_secs(60))).await;
    assert!(matches!(
        store.upload_for_task(&op.id, &task.lease_token, &id).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(
        store
            .upload_for_task(&op.id, &again.lease_token, &id)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        store.retention_sweep(sweep(at(200))).await.unwrap().uploads_removed,
        0,
        "still named"
    );

    // An upload nobody names goes at its expiry, its pieces with it.
    let loose = Id::generate(IdKind::Upload);
    store
        .upload_create(UploadCreateParams {
            id: loose.clone(),
            tenant: "t1".into(),
            content_type: "text/csv".into(),
            expected_sha256: None,
            now: at(0),
            expires_at: at(100),
        })
        .await
        .unwrap();
    store
        .upload_append(UploadAppendParams {
            id: loose.clone(),
            ..append(0, "u/loose", 3)
        })
        .await
        .unwrap();
    assert_eq!(store.retention_sweep(sweep(at(99))).await.unwrap().uploads_removed, 0);
    assert_eq!(store.retention_sweep(sweep(at(100))).await.unwrap().uploads_removed, 1);
    assert_eq!(store.upload_get("t1", &loose).await.unwrap(), None);
    assert_eq!(store.artifact_garbage(10).await.unwrap(), vec!["u/loose".to_owned()]);

    // Deleting the tenant removes the named one too.
    let counts = store.tenant_delete("t1", at(300)).await.unwrap();
    assert_eq!(counts.uploads, 1);
    assert_eq!(store.upload_get("t1", &id).await.unwrap(), None);
    assert!(
        store
            .artifact_garbage(10)
            .await
            .unwrap()
            .contains(&"u/whole".to_owned())
    );
}

/// Pieces of a resumable artifact: fenced, placed on a boundary, kept
/// across a pause and a lapsed lease, replaced from where an attempt
/// resumes, shared with a `from_checkpoint` re-run, and garbage only once
/// joined (the joined object kept) or the last operation naming them goes.
pub async fn artifact_pieces_outlive_attempts_and_are_joined_once(store: &dyn Store) {
    declare_pausable(store, "pieces").await;
    let op = create(store, "t1", "pieces").await;
    let task = claim_one(store, "pieces", at(1)).await;
    let mut forged = task.clone();
    forged.lease_token = "forged".into();
    assert!(matches!(
        store.artifact_piece_add(piece(&forged, 0, "p-forged", 10, at(2))).await,
        Err(StoreError::LeaseLost)
    ));
    store
        .artifact_piece_add(piece(&task, 0, "p0", 10, at(2)))
        .await
        .unwrap();
    let held = store
        .artifact_piece_add(piece(&task, 10, "p1", 5, at(2)))
        .await
        .unwrap();
    assert_eq!(held, vec![chunk("p0", 10), chunk("p1", 5)]);
    assert!(matches!(
        store.artifact_piece_add(piece(&task, 12, "p-bad", 5, at(2))).await,
        Err(StoreError::UploadOffsetMismatch { offset: 15, .. })
    ));
    // The lease lapses; the next attempt resumes at 10 and replaces p1.
    let lapsed = at(2).plus(LEASE).plus(Duration::from_secs(1));
    store.task_reap(ReapParams { now: lapsed, limit: 10 }).await.unwrap();
    let retry = claim_one(store, "pieces", lapsed.plus(Duration::from_secs(60))).await;
    assert_eq!(
        store
            .artifact_pieces(&retry.operation_id, &retry.lease_token, DEFAULT_ARTIFACT)
            .await
            .unwrap(),
        vec![chunk("p0", 10), chunk("p1", 5)],
        "kept across attempts"
    );
    assert!(matches!(
        store
            .artifact_pieces(&task.operation_id, &task.lease_token, DEFAULT_ARTIFACT)
            .await,
        Err(StoreError::LeaseLost)
    ));
    let now = lapsed.plus(Duration::from_secs(61));
    let held = store
        .artifact_piece_add(piece(&retry, 10, "p1b", 7, now))
        .await
        .unwrap();
    assert_eq!(held, vec![chunk("p0", 10), chunk("p1b", 7)]);
    let garbage = store.artifact_garbage(100).await.unwrap();
    assert!(
        garbage.contains(&"p1".to_owned()),
        "the replaced piece is garbage: {garbage:?}"
    );

    // The attempt fails; a from_checkpoint re-run shares the pieces.
    store.task_finish(finish(&retry, failure("boom"), now)).await.unwrap();
    let mut params = accept_params("t1", "pieces", None, json!({"n": 1}));
    params.rerun_of = Some(op.id.clone());
    params.from_checkpoint = true;
    store.operation_accept(params).await.unwrap();
    let rerun = claim_one(store, "pieces", now).await;
    assert_eq!(
        store
            .artifact_pieces(&rerun.operation_id, &rerun.lease_token, DEFAULT_ARTIFACT)
            .await
            .unwrap(),
        vec![chunk("p0", 10), chunk("p1b", 7)]
    );
    // Joined into a new object: the re-run's rows go, the shared objects stay
    // (the original still names them).
    let mut joined = upload(&rerun, "joined", now);
    joined.joins_pieces = true;
    store.result_upload(joined).await.unwrap();
    assert!(
        store
            .artifact_pieces(&rerun.operation_id, &rerun.lease_token, DEFAULT_ARTIFACT)
            .await
            .unwrap()
            .is_empty()
    );
    let garbage = store.artifact_garbage(100).await.unwrap();
    assert!(
        !garbage.contains(&"p0".to_owned()) && !garbage.contains(&"p1b".to_owned()),
        "{garbage:?}"
    );
    store
        .task_finish(finish(&rerun, Outcome::Succeeded { result: None }, now))
        .await
        .unwrap();
    // Once the original goes too, its pieces are garbage.
    store.tenant_delete("t1", now).await.unwrap();
    let garbage = store.artifact_garbage(100).await.unwrap();
    for key in ["p0", "p1b"] {
        assert!(garbage.contains(&key.to_owned()), "{key}: {garbage:?}");
    }
    assert!(!garbage.contains(&"p-forged".to_owned()) && !garbage.contains(&"p-bad".to_owned()));
}

/// Pieces a live `from_checkpoint` re-run still names outlive the
/// retention of the operation that wrote them: the sweep that removes the
/// original (a batch the re-run is not in) leaves them, and they are
/// garbage once the re-run goes too.
pub async fn shared_pieces_outlive_a_sweep_that_removes_only_their_writer(store: &dyn Store) {
    declare_pausable(store, "shared-pieces").await;
    let op = create(store, "t1", "shared-pieces").await;
    let task = claim_one(store, "shared-pieces", at(1)).await;
    for (offset, key, size) in [(0, "s0", 10), (10, "s1", 5)] {
        store
            .artifact_piece_add(piece(&task, offset, key, size, at(2)))
            .await
            .unwrap();
    }
    let failed = store.task_finish(finish(&task, failure("boom"), at(3))).await.unwrap();
    let mut params = accept_params("t1", "shared-pieces", None, json!({"n": 1}));
    params.rerun_of = Some(op.id.clone());
    params.from_checkpoint = true;
    let AcceptOutcome::Created(rerun_op) = store.operation_accept(params).await.unwrap() else {
        panic!("the re-run is created");
    };
    let rerun = claim_one(store, "shared-pieces", at(4)).await;

    let counts = store.retention_sweep(sweep(failed.expires_at.unwrap())).await.unwrap();
    assert_eq!(counts.operations_removed, 1, "the original, not the running re-run");
    assert!(store.operation_get("t1", &op.id).await.unwrap().is_none());
    let garbage = store.artifact_garbage(100).await.unwrap();
    assert!(
        !garbage.contains(&"s0".to_owned()) && !garbage.contains(&"s1".to_owned()),
        "the re-run still names them: {garbage:?}"
    );
    assert_eq!(
        store
            .artifact_pieces(&rerun.operation_id, &rerun.lease_token, DEFAULT_ARTIFACT)
            .await
            .unwrap(),
        vec![chunk("s0", 10), chunk("s1", 5)]
    );

    let done = store
        .task_finish(finish(&rerun, Outcome::Succeeded { result: None }, at(5)))
        .await
        .unwrap();
    store.retention_sweep(sweep(done.expires_at.unwrap())).await.unwrap();
    assert!(store.operation_get("t1", &rerun_op.id).await.unwrap().is_none());
    let garbage = store.artifact_garbage(100).await.unwrap();
    for key in ["s0", "s1"] {
        assert!(garbage.contains(&key.to_owned()), "{key}: {garbage:?}");
    }
}

/// An object is named while a row names it — a result, a piece of a
/// resumable artifact, an upload's piece or its joined object — and is an
/// orphan otherwise (what a crash between storing and recording leaves).
pub async fn objects_are_named_while_a_row_names_them(store: &dyn Store) {
    declare(store, "named", true, 1).await;
    create(store, "t1", "named").await;
    let task = claim_one(store, "named", at(1)).await;
    store
        .result_upload(named_upload(&task, "report", "results/res_named", at(2)))
        .await
        .unwrap();
    store
        .artifact_piece_add(piece(&task, 0, "pieces/op/default/0-a", 4, at(2)))
        .await
        .unwrap();
    let id = Id::generate(IdKind::Upload);
    new_upload(store, &id).await;
    let upload_key = |name: &str| format!("uploads/{id}/{name}");
    for (offset, name) in [(0, "0-a"), (3, "3-b")] {
        store
            .upload_append(UploadAppendParams {
                tenant: "t1".into(),
                id: id.clone(),
                offset,
                chunk: chunk(&upload_key(name), 3),
                sha256: None,
                expected_sha256: None,
                now: at(1),
            })
            .await
            .unwrap();
    }
    let asked = vec![
        "results/res_named".to_owned(),
        "pieces/op/default/0-a".to_owned(),
        upload_key("0-a"),
        upload_key("3-b"),
        "results/res_orphan".to_owned(),
        upload_key("9-orphan"),
        format!("uploads/{}/0-a", Id::generate(IdKind::Upload)),
        ".tmp/half-written".to_owned(),
    ];
    let mut named = store.artifact_keys_named(asked.clone()).await.unwrap();
    named.sort();
    let mut expected = asked[..4].to_vec();
    expected.sort();
    assert_eq!(named, expected, "the recorded objects, and only them");

    // Joined, the upload names its whole object and no longer its pieces.
    store
        .upload_complete(UploadCompleteParams {
            tenant: "t1".into(),
            id: id.clone(),
            size_bytes: 6,
            object: chunk(&upload_key("whole"), 6),
            sha256: "cd".repeat(32),
            now: at(2),
        })
        .await
        .unwrap();
    let named = store
        .artifact_keys_named(vec![upload_key("0-a"), upload_key("whole")])
        .await
        .unwrap();
    assert_eq!(named, vec![upload_key("whole")]);
    assert!(store.artifact_keys_named(Vec::new()).await.unwrap().is_empty());
}

/// One request appends to an upload at a time, on whatever node: the right
/// is taken, renewed by its token, refused to another while it lives, given
/// back by its holder only, and lapses at its end.
pub async fn one_request_at_a_time_holds_the_right_to_append(store: &dyn Store) {
    let id = Id::generate(IdKind::Upload);
    new_upload(store, &id).await;
    let lease = |token: &str, until: u64, now: u64| AppendLeaseParams {
        tenant: "t1".into(),
        id: id.clone(),
        token: token.into(),
        until: at(until),
        now: at(now),
    };
    assert_eq!(store.upload_appending("t1", &id, at(1)).await.unwrap(), None);
    assert_eq!(
        store.upload_append_lease(lease("a", 10, 1)).await.unwrap(),
        AppendLease::Held
    );
    assert_eq!(
        store.upload_append_lease(lease("b", 12, 2)).await.unwrap(),
        AppendLease::Busy { until: at(10) }
    );
    assert_eq!(store.upload_appending("t1", &id, at(2)).await.unwrap(), Some(at(10)));
    // Its holder renews it.
    assert_eq!(
        store.upload_append_lease(lease("a", 20, 3)).await.unwrap(),
        AppendLease::Held
    );
    assert_eq!(store.upload_appending("t1", &id, at(3)).await.unwrap(), Some(at(20)));
    // Another tenant's id is unknown; so is an unknown id.
    let foreign = AppendLeaseParams {
        tenant: "t2".into(),
        ..lease("c", 30, 3)
    };
    assert!(matches!(
        store.upload_append_lease(foreign).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(store.upload_appending("t2", &id, at(3)).await.unwrap(), None);
    // Only its holder gives it back.
    store.upload_append_release(&id, "b").await.unwrap();
    assert_eq!(store.upload_appending("t1", &id, at(4)).await.unwrap(), Some(at(20)));
    store.upload_append_release(&id, "a").await.unwrap();
    assert_eq!(store.upload_appending("t1", &id, at(4)).await.unwrap(), None);
    assert_eq!(
        store.upload_append_lease(lease("b", 12, 5)).await.unwrap(),
        AppendLease::Held
    );
    // A holder that stops renewing (its node died) loses it at its end.
    assert_eq!(store.upload_appending("t1", &id, at(12)).await.unwrap(), None);
    assert_eq!(
        store.upload_append_lease(lease("c", 40, 12)).await.unwrap(),
        AppendLease::Held
    );
}

/// A new upload `id` of tenant `t1`, living until 100 s.
async fn new_upload(store: &dyn Store, id: &Id) {
    store
        .upload_create(UploadCreateParams {
            id: id.clone(),
            tenant: "t1".into(),
            content_type: "text/csv".into(),
            expected_sha256: None,
            now: at(0),
            expires_at: at(100),
        })
        .await
        .unwrap();
}
