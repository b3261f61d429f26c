//! Schedules: stored per tenant, changed by compare-and-set, found when
//! due, and their firing records.

use longrun_core::schedule::FireDecision;

use super::*;

fn schedule(tenant: &str, next_fire_at: Option<Timestamp>) -> ScheduleRecord {
    ScheduleRecord {
        id: Id::generate(IdKind::Schedule),
        tenant: tenant.into(),
        version: 1,
        paused: false,
        spec: json!({"kind": "report", "cron": "0 2 * * *", "input": {"n": 1}}),
        next_fire_at,
        last_operation_id: None,
        buffered_fire_at: None,
        created_at: at(0),
        updated_at: at(0),
    }
}

fn fire(s: &ScheduleRecord, fire_time: Timestamp, decision: FireDecision, operation_id: Option<&str>) -> ScheduleFire {
    ScheduleFire {
        schedule_id: s.id.clone(),
        tenant: s.tenant.clone(),
        fire_time,
        operation_id: operation_id.map(str::to_owned),
        decision,
        recorded_at: fire_time,
    }
}

pub async fn schedules_are_kept_per_tenant_and_changed_by_version(store: &dyn Store) {
    let mut mine = Vec::new();
    for _ in 0..3 {
        let s = schedule("t1", Some(at(100)));
        store.schedule_insert(s.clone()).await.unwrap();
        mine.push(s);
    }
    let theirs = schedule("t2", Some(at(100)));
    store.schedule_insert(theirs.clone()).await.unwrap();

    assert_eq!(
        store.schedule_get("t1", &mine[0].id).await.unwrap().as_ref(),
        Some(&mine[0])
    );
    assert_eq!(
        store.schedule_get("t2", &mine[0].id).await.unwrap(),
        None,
        "another tenant's"
    );
    // Keyset pages in id order (creation order to the millisecond; ids of
    // one millisecond are in random order).
    mine.sort_by(|a, b| a.id.cmp(&b.id));
    let first = store.schedule_list("t1", None, 2).await.unwrap();
    assert_eq!(
        first.iter().map(|s| &s.id).collect::<Vec<_>>(),
        [&mine[0].id, &mine[1].id]
    );
    let rest = store.schedule_list("t1", Some(first[1].id.clone()), 2).await.unwrap();
    assert_eq!(rest.iter().map(|s| &s.id).collect::<Vec<_>>(), [&mine[2].id]);

    let mut changed = mine[0].clone();
    changed.version = 2;
    changed.paused = true;
    changed.spec["cron"] = json!("@every 1m");
    changed.next_fire_at = None;
    changed.last_operation_id = Some("op_x".into());
    changed.buffered_fire_at = Some(at(50));
    changed.updated_at = at(7);
    assert!(store.schedule_update(changed.clone(), 1).await.unwrap());
    assert_eq!(
        store.schedule_get("t1", &changed.id).await.unwrap(),
        Some(changed.clone())
    );
    // A writer that read version 1 loses: nothing changes.
    let mut stale = mine[0].clone();
    stale.version = 2;
    assert!(!store.schedule_update(stale, 1).await.unwrap());
    assert_eq!(
        store.schedule_get("t1", &changed.id).await.unwrap(),
        Some(changed.clone())
    );
    // Nor can another tenant change or delete it.
    let mut foreign = changed.clone();
    foreign.tenant = "t2".into();
    foreign.version = 3;
    assert!(!store.schedule_update(foreign, 2).await.unwrap());
    assert!(!store.schedule_delete("t2", &changed.id).await.unwrap());

    // A round's page in one call: each compare-and-set on its own.
    let mut second = mine[1].clone();
    second.version = 2;
    let mut stale_third = mine[2].clone();
    stale_third.version = 5;
    let applied = store
        .schedule_update_many(vec![(second.clone(), 1), (stale_third, 4)])
        .await
        .unwrap();
    assert_eq!(applied, [true, false]);
    assert_eq!(store.schedule_get("t1", &second.id).await.unwrap().unwrap().version, 2);
    assert_eq!(store.schedule_get("t1", &mine[2].id).await.unwrap().unwrap().version, 1);

    assert!(store.schedule_delete("t1", &changed.id).await.unwrap());
    assert_eq!(store.schedule_get("t1", &changed.id).await.unwrap(), None);
    assert!(!store.schedule_delete("t1", &changed.id).await.unwrap());
}

pub async fn due_schedules_are_the_unpaused_ones_whose_time_came(store: &dyn Store) {
    let soon = schedule("t1", Some(at(10)));
    let sooner = schedule("t2", Some(at(5)));
    let later = schedule("t1", Some(at(1_000)));
    let mut paused = schedule("t1", Some(at(1)));
    paused.paused = true;
    let mut holding = schedule("t1", Some(at(2_000)));
    holding.buffered_fire_at = Some(at(3));
    let ended = schedule("t1", None);
    for s in [&soon, &sooner, &later, &paused, &holding, &ended] {
        store.schedule_insert(s.clone()).await.unwrap();
    }
    let due = store.schedule_due(at(10), 10).await.unwrap();
    let ids: Vec<&Id> = due.iter().map(|s| &s.id).collect();
    assert_eq!(
        ids,
        [&sooner.id, &soon.id, &holding.id],
        "soonest first; a held-back firing is due"
    );
    assert_eq!(store.schedule_due(at(10), 1).await.unwrap().len(), 1, "bounded");
    assert_eq!(
        store.schedule_due(at(4), 10).await.unwrap().len(),
        1,
        "only the held-back one"
    );
}

pub async fn firing_records_take_the_newest_word_and_forget_the_old(store: &dyn Store) {
    let s = schedule("t1", Some(at(100)));
    store.schedule_insert(s.clone()).await.unwrap();
    store
        .schedule_fires_record(
            vec![
                fire(&s, at(10), FireDecision::Missed, None),
                fire(&s, at(20), FireDecision::Started, Some("op_a")),
                fire(&s, at(30), FireDecision::Buffered, None),
            ],
            at(0),
        )
        .await
        .unwrap();
    // Two nodes record the same firing: one record.
    store
        .schedule_fires_record(vec![fire(&s, at(20), FireDecision::Started, Some("op_a"))], at(0))
        .await
        .unwrap();
    // A node that decided otherwise (it saw the previous firing still
    // live) never hides an operation that was started.
    store
        .schedule_fires_record(vec![fire(&s, at(20), FireDecision::Skipped, None)], at(0))
        .await
        .unwrap();
    // The buffered firing starts later: its record says so.
    store
        .schedule_fires_record(vec![fire(&s, at(30), FireDecision::Started, Some("op_b"))], at(0))
        .await
        .unwrap();
    let fires = store.schedule_fires(&s.id, 10).await.unwrap();
    let seen: Vec<(i64, FireDecision, Option<&str>)> = fires
        .iter()
        .map(|f| (f.fire_time.0, f.decision, f.operation_id.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (at(30).0, FireDecision::Started, Some("op_b")),
            (at(20).0, FireDecision::Started, Some("op_a")),
            (at(10).0, FireDecision::Missed, None),
        ]
    );
    // Records from before `keep_after` go.
    store
        .schedule_fires_record(vec![fire(&s, at(40), FireDecision::Skipped, None)], at(25))
        .await
        .unwrap();
    assert_eq!(store.schedule_fires(&s.id, 10).await.unwrap().len(), 2);
    assert_eq!(store.schedule_fires(&s.id, 1).await.unwrap()[0].fire_time, at(40));

    // Deleting the tenant removes its schedules and their records.
    store.tenant_delete("t1", at(50)).await.unwrap();
    assert_eq!(store.schedule_get("t1", &s.id).await.unwrap(), None);
    assert!(store.schedule_fires(&s.id, 10).await.unwrap().is_empty());
}
