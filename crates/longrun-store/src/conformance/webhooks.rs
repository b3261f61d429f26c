//! Webhooks: one per state transition, deliveries leased, logged, retried
//! and given up, and secrets rotated with an overlap.

use super::*;

pub async fn each_state_transition_of_a_callback_operation_queues_one_webhook(store: &dyn Store) {
    declare(store, "hooked", true, 3).await;
    let mut changes = store.subscribe_changes();
    let mut p = accept_params("t1", "hooked", None, json!({}));
    p.callback_url = Some("https://client.example/hook".into());
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    let plain = create(store, "t1", "hooked").await; // no callback: no webhooks
    // The published changes say which operation has a callback (what
    // wakes the webhook deliverer).
    let published: Vec<(Id, bool)> = vec![changes.recv().await.unwrap(), changes.recv().await.unwrap()]
        .into_iter()
        .map(|c| (c.operation_id, c.callback))
        .collect();
    assert_eq!(published, vec![(op.id.clone(), true), (plain.id, false)]);
    let lease = Duration::from_secs(60);
    assert!(
        store.webhook_due(at(0), 10, lease).await.unwrap().is_empty(),
        "acceptance is not a transition"
    );

    let first = claim_one(store, "hooked", at(1)).await;
    let claimed_other = claim_one(store, "hooked", at(1)).await;
    let due = store.webhook_due(at(1), 10, lease).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(
        (due[0].operation_id.clone(), due[0].event_type.as_str()),
        (op.id.clone(), "operation.running")
    );
    assert_eq!(due[0].url, "https://client.example/hook");
    let payload: Value = serde_json::from_str(&due[0].payload).unwrap();
    assert_eq!(
        payload["data"],
        json!({"operation_id": op.id.as_str(), "version": 2, "state": "running", "kind": "hooked"})
    );
    assert!(due[0].event_id.as_str().starts_with("evt_"));

    // A retry is not a transition (still running); the end is.
    let expired_at = at(1).plus(LEASE).plus(Duration::from_secs(1));
    store
        .task_reap(ReapParams {
            now: expired_at,
            limit: 10,
        })
        .await
        .unwrap();
    let retry = claim_one(store, "hooked", expired_at.plus(Duration::from_secs(60))).await;
    assert_eq!(retry.operation_id, first.operation_id);
    store
        .task_finish(finish(
            &retry,
            Outcome::Succeeded { result: None },
            expired_at.plus(Duration::from_secs(61)),
        ))
        .await
        .unwrap();
    let _ = claimed_other;
    let later = store.webhook_due(at(10_000), 10, lease).await.unwrap();
    let types: Vec<&str> = later.iter().map(|d| d.event_type.as_str()).collect();
    assert_eq!(
        types,
        vec!["operation.running", "operation.succeeded"],
        "one per transition (the retry's start is none), the first due again once its lease ran out"
    );
}

pub async fn webhook_attempts_are_leased_logged_retried_and_given_up(store: &dyn Store) {
    let mut p = accept_params("t1", "hooked2", None, json!({}));
    p.callback_url = Some("https://client.example/hook".into());
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    store.operation_cancel(cancel("t1", &op.id, at(1))).await.unwrap();
    let lease = Duration::from_secs(60);
    let due = store.webhook_due(at(1), 10, lease).await.unwrap();
    assert_eq!(due.len(), 1);
    assert!(
        store.webhook_due(at(2), 10, lease).await.unwrap().is_empty(),
        "leased to the first caller"
    );
    let event = due[0].event_id.clone();

    let fail = |attempt, next: Option<Timestamp>, now| AttemptParams {
        event_id: event.clone(),
        attempt,
        outcome: AttemptOutcome::Failed {
            status_code: Some(503),
            error: "503 Service Unavailable".into(),
            next_attempt_at: next,
        },
        now,
        latency_ms: Some(attempt * 10),
    };
    store.webhook_attempt(fail(1, Some(at(10)), at(2))).await.unwrap();
    assert!(store.webhook_due(at(9), 10, lease).await.unwrap().is_empty());
    let again = store.webhook_due(at(10), 10, lease).await.unwrap();
    assert_eq!((again.len(), again[0].attempts), (1, 1));
    store.webhook_attempt(fail(2, None, at(11))).await.unwrap();
    assert!(
        store.webhook_due(at(100_000), 10, lease).await.unwrap().is_empty(),
        "given up"
    );
    assert!(matches!(
        store.webhook_attempt(fail(3, None, at(12))).await,
        Err(StoreError::NotFound)
    ));

    let log = store.webhook_log("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].attempt, log[0].status_code, log[0].next_attempt_at),
        (1, Some(503), Some(at(10)))
    );
    assert_eq!((log[1].attempt, log[1].next_attempt_at), (2, None));
    assert_eq!(
        (log[0].latency_ms, log[1].latency_ms),
        (Some(10), Some(20)),
        "each attempt's latency"
    );
    assert_eq!(log[1].event_type, "operation.cancelled");
    assert!(store.webhook_log("t2", &op.id).await.unwrap().is_none());
    assert_eq!(
        get(store, &op).await.state,
        State::Cancelled,
        "delivery never changes the operation"
    );

    // A crashed deliverer's lease runs out and the event is due again.
    let mut p = accept_params("t1", "hooked2", None, json!({}));
    p.callback_url = Some("https://client.example/hook".into());
    let AcceptOutcome::Created(second) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    store.operation_cancel(cancel("t1", &second.id, at(20))).await.unwrap();
    assert_eq!(store.webhook_due(at(20), 10, lease).await.unwrap().len(), 1);
    let retaken = store.webhook_due(at(81), 10, lease).await.unwrap();
    assert_eq!(retaken.len(), 1);
    store
        .webhook_attempt(AttemptParams {
            event_id: retaken[0].event_id.clone(),
            attempt: 1,
            outcome: AttemptOutcome::Delivered { status_code: 204 },
            now: at(82),
            latency_ms: None,
        })
        .await
        .unwrap();
    assert!(store.webhook_due(at(100_000), 10, lease).await.unwrap().is_empty());
}

/// Work of `t1` with a callback, cancelled at `now`: its operation and the
/// event of its one webhook, taken for delivery (leased for a second).
pub async fn hooked_delivery(store: &dyn Store, now: Timestamp) -> (Id, Id) {
    let mut p = accept_params("t1", "hooked3", None, json!({}));
    p.callback_url = Some("https://client.example/hook".into());
    let AcceptOutcome::Created(op) = store.operation_accept(p).await.unwrap() else {
        panic!()
    };
    store.operation_cancel(cancel("t1", &op.id, now)).await.unwrap();
    let due = store.webhook_due(now, 10, Duration::from_secs(1)).await.unwrap();
    assert_eq!(due.len(), 1);
    (op.id, due[0].event_id.clone())
}

/// Records attempt `attempt` of `event_id`: delivered, or failed with a
/// next attempt at `retry`.
pub async fn delivery_attempted(
    store: &dyn Store,
    event_id: &Id,
    attempt: i64,
    retry: Option<Timestamp>,
    now: Timestamp,
) {
    let outcome = match retry {
        None => AttemptOutcome::Delivered { status_code: 204 },
        Some(at) => AttemptOutcome::Failed {
            status_code: Some(500),
            error: "500 Internal Server Error".into(),
            next_attempt_at: Some(at),
        },
    };
    let params = AttemptParams {
        event_id: event_id.clone(),
        attempt,
        outcome,
        now,
        latency_ms: None,
    };
    store.webhook_attempt(params).await.unwrap();
}

/// Retention removes a finished delivery and its log once the delivery
/// retention has passed since it was made; a pending one stays, however
/// old, and so does a newer one. (On PostgreSQL these rows are in the
/// default partitions: no upkeep made a day for them.)
pub async fn finished_deliveries_go_with_their_log_after_the_delivery_retention(store: &dyn Store) {
    let (old, old_event) = hooked_delivery(store, at(1)).await;
    delivery_attempted(store, &old_event, 1, None, at(2)).await;
    let (pending, pending_event) = hooked_delivery(store, at(3)).await;
    delivery_attempted(store, &pending_event, 1, Some(at(5_000)), at(4)).await;
    let (newer, newer_event) = hooked_delivery(store, at(700)).await;
    delivery_attempted(store, &newer_event, 1, None, at(701)).await;
    let logged = async |id: &Id| store.webhook_log("t1", id).await.unwrap().unwrap().len();

    // The retention is 600 s: at 650 s the first is past it, nothing else.
    let counts = store.retention_sweep(sweep(at(650))).await.unwrap();
    assert_eq!(counts.deliveries_removed, 1);
    assert_eq!(
        (logged(&old).await, logged(&pending).await, logged(&newer).await),
        (0, 1, 1)
    );
    let due = store.webhook_due(at(5_000), 10, Duration::from_secs(1)).await.unwrap();
    let due: Vec<&Id> = due.iter().map(|d| &d.event_id).collect();
    assert_eq!(due, [&pending_event], "the pending one is still delivered");
    assert_eq!(
        store.retention_sweep(sweep(at(650))).await.unwrap().deliveries_removed,
        0
    );

    // An operation removed past its retention takes its deliveries with
    // it, pending or not, whatever the delivery retention.
    let expires_at = store
        .operation_get("t1", &pending)
        .await
        .unwrap()
        .and_then(|op| op.expires_at)
        .expect("ended work expires");
    let mut long = sweep(expires_at);
    long.delivery_retention = Duration::from_secs(10 * 365 * 86_400);
    assert!(store.retention_sweep(long).await.unwrap().operations_removed >= 1);
    let later = Timestamp(expires_at.0.max(at(5_000).0));
    assert!(
        store
            .webhook_due(later, 10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn webhook_secrets_rotate_with_an_overlap(store: &dyn Store) {
    let first = store.webhook_secrets("t1", "whsec_first".into(), at(0)).await.unwrap();
    assert_eq!(first, vec!["whsec_first".to_owned()]);
    let same = store
        .webhook_secrets("t1", "whsec_ignored".into(), at(1))
        .await
        .unwrap();
    assert_eq!(same, first, "a candidate is used only when there is none");
    store
        .webhook_secret_rotate("t1", "whsec_second".into(), at(10), Duration::from_secs(3600))
        .await
        .unwrap();
    let both = store.webhook_secrets("t1", "whsec_x".into(), at(11)).await.unwrap();
    assert_eq!(
        both,
        vec!["whsec_second".to_owned(), "whsec_first".to_owned()],
        "newest first, both sign"
    );
    let after = store
        .webhook_secrets("t1", "whsec_x".into(), at(10 + 3600))
        .await
        .unwrap();
    assert_eq!(after, vec!["whsec_second".to_owned()]);
    assert_eq!(
        store.webhook_secrets("t2", "whsec_other".into(), at(0)).await.unwrap(),
        vec!["whsec_other".to_owned()]
    );
}
