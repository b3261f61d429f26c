//! Work that starts later (`not_before`) and work that matters more
//! (`priority`): when and in what order claims take them.

use super::*;

/// Accepts an operation of `kind` for `tenant` that may start at
/// `not_before`, with `priority`.
async fn create_scheduled(
    store: &dyn Store,
    tenant: &str,
    kind: &str,
    not_before: Option<Timestamp>,
    priority: i16,
) -> Operation {
    let mut params = accept_params(tenant, kind, None, json!({"n": 1}));
    params.not_before = not_before;
    params.priority = priority;
    match store.operation_accept(params).await.unwrap() {
        AcceptOutcome::Created(op) => op,
        other => panic!("expected Created, got {other:?}"),
    }
}

fn update_start(op: &Operation, version: i64, not_before: Option<Timestamp>, now: Timestamp) -> UpdateParams {
    UpdateParams {
        tenant: op.tenant.clone(),
        id: op.id.clone(),
        if_match: version,
        deadline_at: None,
        labels: None,
        not_before: Some(not_before),
        now,
    }
}

pub async fn work_that_starts_later_is_claimed_from_its_start_on(store: &dyn Store) {
    let later = create_scheduled(store, "t1", "later", Some(at(100)), PRIORITY_DEFAULT).await;
    assert_eq!((later.state, later.not_before), (State::Queued, Some(at(100))));
    let now = create(store, "t1", "later").await;
    let early = claim(store, "later", 10, at(1)).await;
    assert_eq!(
        early.iter().map(|t| &t.operation_id).collect::<Vec<_>>(),
        vec![&now.id],
        "only the work that may start now is claimed"
    );
    assert!(claim(store, "later", 10, at(99)).await.is_empty());
    let read = store.operation_get("t1", &later.id).await.unwrap().unwrap();
    assert_eq!((read.state, read.not_before), (State::Queued, Some(at(100))));
    assert_eq!(claim_one(store, "later", at(100)).await.operation_id, later.id);

    // Its start moves under If-Match while it is queued: earlier, later, or to now.
    let moved = create_scheduled(store, "t1", "moved", Some(at(500)), PRIORITY_DEFAULT).await;
    let stale = store
        .operation_update(update_start(&moved, moved.version + 1, Some(at(200)), at(2)))
        .await;
    assert!(matches!(stale, Err(StoreError::PreconditionFailed { .. })), "{stale:?}");
    let earlier = store
        .operation_update(update_start(&moved, moved.version, Some(at(200)), at(2)))
        .await
        .unwrap();
    assert_eq!(
        (earlier.not_before, earlier.version),
        (Some(at(200)), moved.version + 1)
    );
    assert!(claim(store, "moved", 1, at(199)).await.is_empty());
    let at_once = store
        .operation_update(update_start(&moved, earlier.version, None, at(3)))
        .await
        .unwrap();
    assert_eq!(at_once.not_before, None);
    let task = claim_one(store, "moved", at(4)).await;
    assert_eq!(task.operation_id, moved.id);
    // Started work keeps its start.
    let running = store.operation_get("t1", &moved.id).await.unwrap().unwrap();
    let refused = store
        .operation_update(update_start(&moved, running.version, Some(at(900)), at(5)))
        .await;
    assert!(matches!(refused, Err(StoreError::Started { .. })), "{refused:?}");

    // A paused start-later operation keeps its start when it is resumed.
    let held = create_scheduled(store, "t1", "held", Some(at(300)), PRIORITY_DEFAULT).await;
    let intent = |desired, now| IntentParams {
        tenant: "t1".into(),
        id: held.id.clone(),
        desired,
        if_match: None,
        now,
    };
    store
        .operation_intent(intent(DesiredState::Paused, at(6)))
        .await
        .unwrap();
    store
        .operation_intent(intent(DesiredState::Running, at(7)))
        .await
        .unwrap();
    assert!(claim(store, "held", 1, at(8)).await.is_empty());
    assert_eq!(claim_one(store, "held", at(300)).await.operation_id, held.id);
}

pub async fn higher_priority_goes_first_within_a_tenant_but_not_past_other_tenants(store: &dyn Store) {
    // Within a tenant: higher first, then oldest; a later high-priority
    // submission overtakes a backlog of low-priority ones at once.
    let mut low = Vec::new();
    for _ in 0..50 {
        low.push(create_scheduled(store, "t1", "prio", None, 2).await);
    }
    let middle = create(store, "t1", "prio").await;
    let urgent = create_scheduled(store, "t1", "prio", None, PRIORITY_MAX).await;
    let first = claim(store, "prio", 3, at(1)).await;
    assert_eq!(
        first.iter().map(|t| t.operation_id.clone()).collect::<Vec<_>>(),
        vec![urgent.id.clone(), middle.id.clone(), low[0].id.clone()],
        "priority 9, then 5, then the oldest of priority 2"
    );
    let rest = claim(store, "prio", 100, at(2)).await;
    assert_eq!(
        rest.iter().map(|t| t.operation_id.clone()).collect::<Vec<_>>(),
        low[1..].iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
        "the same priority, oldest first"
    );
    // A higher priority that starts later does not go before work that may start now.
    let waiting = create_scheduled(store, "t1", "prio", Some(at(50)), PRIORITY_MAX).await;
    let plain = create(store, "t1", "prio").await;
    assert_eq!(claim_one(store, "prio", at(3)).await.operation_id, plain.id);
    assert_eq!(claim_one(store, "prio", at(50)).await.operation_id, waiting.id);

    // Across tenants the fair order stands: one tenant's priorities never
    // starve another's work.
    for _ in 0..20 {
        create_scheduled(store, "bulk", "shared", None, PRIORITY_MAX).await;
    }
    let small = create_scheduled(store, "small", "shared", None, PRIORITY_MIN).await;
    let taken: Vec<Task> = {
        let mut taken = Vec::new();
        for n in 0..4 {
            taken.push(claim_one(store, "shared", at(10 + n)).await);
        }
        taken
    };
    assert!(
        taken.iter().any(|t| t.operation_id == small.id),
        "the other tenant's lowest priority is served within its turn: {:?}",
        taken.iter().map(|t| &t.tenant).collect::<Vec<_>>()
    );
}
