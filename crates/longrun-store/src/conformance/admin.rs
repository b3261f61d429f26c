//! Keys, kinds, server secrets, console sessions and the console's reads.

use super::*;

pub async fn api_keys_are_created_listed_and_revoked(store: &dyn Store) {
    assert_eq!(store.api_key_count().await.unwrap(), 0);
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id.clone(),
            tenant: "t1".into(),
            role: Role::Worker,
            secret_hash: key.secret_hash,
            now: T0,
        })
        .await
        .unwrap();
    let stored = store.api_key_get(&key.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.tenant.as_str(), stored.role, stored.revoked_at),
        ("t1", Role::Worker, None)
    );
    assert_eq!(stored.secret_hash, key.secret_hash.to_vec());
    assert_eq!(store.api_key_list().await.unwrap(), vec![stored]);
    assert!(store.api_key_revoke(&key.id, at(1)).await.unwrap());
    assert!(
        !store.api_key_revoke(&key.id, at(2)).await.unwrap(),
        "revoking twice is a no-op"
    );
    assert_eq!(
        store.api_key_get(&key.id).await.unwrap().unwrap().revoked_at,
        Some(at(1))
    );
    assert_eq!(store.api_key_count().await.unwrap(), 1);
    assert!(
        store
            .api_key_get(&Id::generate(IdKind::ApiKey))
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn kinds_are_declared_and_updated(store: &dyn Store) {
    let mut spec = KindSpec {
        name: "thumbnail".into(),
        builtin: false,
        rerun_safe: false,
        max_attempts: 1,
        default_deadline_seconds: Some(60),
        max_deadline_seconds: None,
        pausable: false,
    };
    store.kind_upsert(spec.clone()).await.unwrap();
    assert_eq!(store.kind_get("thumbnail").await.unwrap(), Some(spec.clone()));
    spec.rerun_safe = true;
    spec.max_attempts = 5;
    spec.pausable = true;
    store.kind_upsert(spec.clone()).await.unwrap();
    assert_eq!(store.kind_list().await.unwrap(), vec![spec]);
    assert_eq!(store.kind_get("nope").await.unwrap(), None);
}

pub async fn server_secrets_are_created_once(store: &dyn Store) {
    let first = store.server_secret("fingerprint", vec![1; 32], T0).await.unwrap();
    assert_eq!(first, vec![1; 32]);
    let second = store.server_secret("fingerprint", vec![2; 32], at(1)).await.unwrap();
    assert_eq!(second, first, "a later candidate never replaces the stored secret");
    // Listed by prefix, oldest first; a name that only contains the prefix is not listed.
    store.server_secret("link-key:b", vec![3; 32], at(3)).await.unwrap();
    store.server_secret("link-key:a", vec![4; 32], at(4)).await.unwrap();
    store.server_secret("old-link-key:c", vec![5; 32], at(5)).await.unwrap();
    assert_eq!(
        store.server_secret_list("link-key:").await.unwrap(),
        vec![
            ("link-key:b".to_owned(), vec![3; 32]),
            ("link-key:a".to_owned(), vec![4; 32])
        ]
    );
    assert!(store.server_secret_list("none:").await.unwrap().is_empty());
}

pub async fn acceptance_pauses_are_set_per_kind_or_for_all(store: &dyn Store) {
    assert!(store.accepting_pauses().await.unwrap().is_empty());
    store.accepting_pause(Some("export".into()), true).await.unwrap();
    store.accepting_pause(None, true).await.unwrap();
    store.accepting_pause(None, true).await.unwrap();
    assert_eq!(
        store.accepting_pauses().await.unwrap(),
        vec![None, Some("export".to_owned())],
        "every kind's pause is None, and pausing twice is one pause"
    );
    store.accepting_pause(None, false).await.unwrap();
    assert_eq!(store.accepting_pauses().await.unwrap(), vec![Some("export".to_owned())]);
    store.accepting_pause(Some("export".into()), false).await.unwrap();
    assert!(store.accepting_pauses().await.unwrap().is_empty());
}

pub async fn typical_durations_come_from_recent_successes(store: &dyn Store) {
    assert_eq!(store.kind_typical_duration("timed").await.unwrap(), None);
    for seconds in [10, 20, 30] {
        create(store, "t1", "timed").await;
        let task = claim_one(store, "timed", at(0)).await;
        store
            .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(seconds)))
            .await
            .unwrap();
    }
    // created at T0, finished 10/20/30 s later: the median is 20 s.
    assert_eq!(
        store.kind_typical_duration("timed").await.unwrap(),
        Some(Duration::from_secs(20))
    );
}

pub async fn console_sessions_expire_and_end(store: &dyn Store) {
    let key = Id::generate(IdKind::ApiKey);
    let session = |hash: u8, expires: Timestamp| ConsoleSession {
        token_hash: vec![hash; 32],
        key_id: key.clone(),
        created_at: T0,
        expires_at: expires,
    };
    store.console_session_start(session(1, at(60))).await.unwrap();
    store.console_session_start(session(2, at(60))).await.unwrap();
    assert_eq!(
        store.console_session_key(&[1; 32], at(59)).await.unwrap(),
        Some(key.clone())
    );
    assert_eq!(
        store.console_session_key(&[1; 32], at(60)).await.unwrap(),
        None,
        "expired"
    );
    assert_eq!(store.console_session_key(&[3; 32], T0).await.unwrap(), None, "unknown");
    store.console_session_end(&[1; 32]).await.unwrap();
    store.console_session_end(&[1; 32]).await.unwrap();
    assert_eq!(
        store.console_session_key(&[1; 32], T0).await.unwrap(),
        None,
        "signed out"
    );
    assert_eq!(
        store.console_session_key(&[2; 32], T0).await.unwrap(),
        Some(key),
        "the other lives on"
    );
}

pub async fn the_console_reads_are_bounded_by_live_work_and_keys(store: &dyn Store) {
    store
        .tenant_set(TenantLimits {
            name: "t1".into(),
            max_active: Some(10),
            max_running: None,
            rate: None,
        })
        .await
        .unwrap();
    store
        .tenant_set(TenantLimits {
            name: "t2".into(),
            max_active: None,
            max_running: None,
            rate: None,
        })
        .await
        .unwrap();
    let keyed = match store
        .operation_accept(accept_params("t1", "k", Some("key-1"), json!({"n": 1})))
        .await
        .unwrap()
    {
        AcceptOutcome::Created(op) => op,
        other => panic!("expected Created, got {other:?}"),
    };
    let _queued = create(store, "t1", "k").await;
    let other = create(store, "t2", "k").await;
    let task = claim_one(store, "k", T0).await;
    assert_eq!(task.operation_id, keyed.id, "oldest first");

    assert_eq!(store.operation_tenant(&other.id).await.unwrap().as_deref(), Some("t2"));
    assert_eq!(
        store.operation_tenant(&Id::generate(IdKind::Operation)).await.unwrap(),
        None
    );
    let kinds = vec!["x".to_string(), "k".to_string()];
    assert_eq!(
        store.operation_by_key("t1", kinds.clone(), "key-1").await.unwrap(),
        Some(keyed.id.clone())
    );
    assert_eq!(
        store.operation_by_key("t2", kinds.clone(), "key-1").await.unwrap(),
        None,
        "another tenant's key"
    );
    assert_eq!(
        store.operation_by_key("t1", vec!["x".into()], "key-1").await.unwrap(),
        None,
        "another kind"
    );
    let record = store.idempotency_record("t1", &keyed.id).await.unwrap().unwrap();
    assert_eq!(
        (
            record.key.as_str(),
            record.kind.as_str(),
            record.created_at,
            record.replays
        ),
        ("key-1", "k", T0, 0)
    );
    for _ in 0..2 {
        let again = store
            .operation_accept(accept_params("t1", "k", Some("key-1"), json!({"n": 1})))
            .await
            .unwrap();
        assert!(matches!(again, AcceptOutcome::Replayed(_)));
    }
    let record = store.idempotency_record("t1", &keyed.id).await.unwrap().unwrap();
    assert_eq!(record.replays, 2, "each replay is counted");
    assert!(store.idempotency_record("t2", &keyed.id).await.unwrap().is_none());

    let summary = store.active_summary(Some("t1".into())).await.unwrap();
    let counts: Vec<(State, u64)> = summary.iter().map(|g| (g.state, g.count)).collect();
    assert_eq!(counts, vec![(State::Queued, 1), (State::Running, 1)]);
    let all: u64 = store.active_summary(None).await.unwrap().iter().map(|g| g.count).sum();
    assert_eq!(all, 3);

    let leases = store.lease_list(None, 10).await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(
        (leases[0].operation_id.clone(), leases[0].tenant.as_str()),
        (keyed.id.clone(), "t1")
    );
    assert_eq!(leases[0].lease_expires_at, T0.plus(LEASE));
    assert_eq!(leases[0].last_heartbeat_at, Some(T0));
    assert!(store.lease_list(Some("t2".into()), 10).await.unwrap().is_empty());

    let usage = store.tenant_usage().await.unwrap();
    let t1 = usage.iter().find(|u| u.limits.name == "t1").unwrap();
    assert_eq!((t1.limits.max_active, t1.active, t1.running), (Some(10), 2, 1));
    let t2 = usage.iter().find(|u| u.limits.name == "t2").unwrap();
    assert_eq!((t2.active, t2.running), (1, 0));

    // Every tenant's list, newest first, and a created range.
    let page = store
        .operation_list(ListParams {
            tenant: None,
            page_size: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.operations.len(), 3);
    assert_eq!(page.operations[0].id, other.id);
    let page = store
        .operation_list(ListParams {
            tenant: None,
            page_size: 10,
            created_from: Some(at(1)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(page.operations.is_empty(), "all were created at T0");
    let page = store
        .operation_list(ListParams {
            tenant: Some("t1".into()),
            page_size: 10,
            created_from: Some(T0),
            created_before: Some(at(1)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.operations.len(), 2);
}

pub async fn the_backlog_counts_live_work_and_what_maintenance_has_waiting(store: &dyn Store) {
    let empty = store.backlog(T0).await.unwrap();
    assert_eq!(
        (
            empty.oldest_active.len(),
            empty.retention_due,
            empty.garbage_objects,
            empty.webhooks_due,
            empty.webhooks_failing
        ),
        (0, 0, 0, 0, 0)
    );
    let first = create(store, "t1", "backlogged").await;
    create(store, "t2", "backlogged").await;
    let running = create(store, "t1", "started").await;
    claim_one(store, "started", at(1)).await;
    let backlog = store.backlog(at(2)).await.unwrap();
    let mut groups = backlog.oldest_active.clone();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        groups,
        vec![
            ("backlogged".to_owned(), State::Queued, first.created_at),
            ("started".to_owned(), State::Running, running.created_at),
        ],
        "live work by kind and state, each with its oldest"
    );
    assert_eq!(
        (backlog.retention_due, backlog.garbage_objects, backlog.webhooks_failing),
        (0, 0, 0)
    );
}
