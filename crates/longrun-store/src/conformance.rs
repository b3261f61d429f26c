//! The conformance suite every [`Store`] backend must pass, unchanged.
//!
//! A backend's test file invokes [`store_conformance!`](crate::store_conformance)
//! with an async factory returning a fresh [`TestStore`]; the macro expands to
//! one `#[tokio::test]` per case below, so a failure names the case. Extend the
//! suite whenever the trait grows.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::fingerprint::Fingerprinter;
use longrun_core::{Id, IdKind, IdempotencyKey, State, Timestamp};
use serde_json::{Value, json};

use crate::*;

/// A store under test and whatever keeps it alive (a temp dir, a database).
pub struct TestStore {
    pub store: Arc<dyn Store>,
    pub guard: Box<dyn Any + Send + Sync>,
}

/// Expands to one test per conformance case for the backend made by `$factory`
/// (an `async fn() -> Option<TestStore>`).
#[macro_export]
macro_rules! store_conformance {
    ($factory:path) => {
        $crate::store_conformance!(@cases $factory;
            accept_creates_a_queued_operation_with_its_first_event,
            accept_replays_the_same_request_and_refuses_a_different_one,
            idempotency_scope_is_tenant_kind_and_key,
            concurrent_first_requests_converge_on_one_operation,
            operations_are_invisible_to_other_tenants,
            list_is_newest_first_filtered_and_paginated,
            claim_heartbeat_complete_walks_the_state_machine,
            stale_lease_tokens_are_fenced_out,
            an_operation_completes_at_most_once,
            concurrent_outcomes_each_apply_once_and_a_refused_one_harms_none,
            progress_never_goes_backwards_and_idle_heartbeats_keep_the_version,
            cancelling_queued_work_cancels_it_at_once,
            cancelling_running_work_asks_the_worker,
            worker_that_finishes_first_wins_the_cancel_race,
            cancel_after_the_commit_point_is_refused,
            cancel_honours_if_match,
            reaper_requeues_rerun_safe_kinds_and_fails_the_others,
            queued_work_past_its_deadline_is_never_started,
            failed_outcome_carries_the_error_and_keeps_the_input,
            api_keys_are_created_listed_and_revoked,
            kinds_are_declared_and_updated,
            server_secrets_are_created_once,
            retryable_failures_retry_until_attempts_run_out,
            over_budget_work_is_asked_to_stop_and_fails_with_budget_exhausted,
            the_enforcer_fails_late_queued_work_and_stops_late_running_work,
            a_worker_that_ignores_the_deadline_is_fenced_out_after_the_grace,
            max_active_refuses_new_work_but_replays_still_answer,
            max_running_is_honoured_by_claims,
            racing_claims_together_respect_max_running,
            racing_claimers_never_lease_one_task_twice,
            claims_are_fair_across_tenants,
            intent_changes_need_the_current_version_and_terminal_intent_wins,
            leases_of_a_worker_known_gone_are_reaped_at_once,
            every_event_keeps_the_representation_at_its_version,
            a_submission_leased_as_accepted_is_what_a_claim_would_have_leased,
            racing_submissions_with_one_key_make_one_operation_handed_or_not,
            committed_changes_are_published_and_rolled_back_ones_are_not,
            every_submission_of_a_batch_is_published_once,
            every_change_of_a_large_claim_and_outcome_batch_is_published_once_in_order,
            typical_durations_come_from_recent_successes,
            each_state_transition_of_a_callback_operation_queues_one_webhook,
            webhook_attempts_are_leased_logged_retried_and_given_up,
            webhook_secrets_rotate_with_an_overlap,
            an_uploaded_artifact_is_published_by_complete_and_discarded_otherwise,
            named_artifacts_are_published_together_and_an_earlier_attempts_are_replaced,
            uploads_append_at_their_offset_complete_once_and_live_while_named,
            reruns_link_both_ways_and_leave_the_original_unchanged,
            racing_intents_end_as_one_order_of_them_would,
            retention_expires_results_removes_operations_and_buries_tombstones,
            deleting_a_tenant_leaves_nothing_of_it,
            state_machine_matches_the_reference_model,
            a_batch_of_submissions_answers_each_alone,
            a_batch_past_a_quota_refuses_only_what_does_not_fit,
            a_batch_of_outcomes_applies_each_fenced_alone,
            outcomes_and_a_claim_in_one_call_both_apply,
            the_last_progress_is_stored_with_the_outcome,
            pausing_running_work_asks_its_worker_and_resumes_from_its_checkpoint,
            a_pause_of_running_work_meets_terminal_intent_and_completion,
            a_pause_the_worker_does_not_honour_is_withdrawn_after_the_grace,
            a_checkpoint_survives_a_lapsed_lease_and_is_copied_by_a_rerun,
            artifact_pieces_outlive_attempts_and_are_joined_once,
            console_sessions_expire_and_end,
            the_console_reads_are_bounded_by_live_work_and_keys,
            a_read_after_each_kind_of_write_sees_it,
            reads_racing_writes_never_go_back_a_version,
        );
    };
    (@cases $factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                // A factory returns `None` when its database cannot run here
                // (it says so loudly, or fails when peers are required).
                let Some(test_store): Option<$crate::conformance::TestStore> = $factory().await else { return };
                $crate::conformance::$case(test_store.store.as_ref()).await;
            }
        )*
    };
}

const T0: Timestamp = Timestamp(1_800_000_000_000);
const LEASE: Duration = Duration::from_secs(30);

fn fingerprinter() -> Fingerprinter {
    Fingerprinter::new(b"conformance")
}

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

pub fn accept_params(tenant: &str, kind: &str, key: Option<&str>, input: Value) -> AcceptParams {
    let idempotency = key.map(|k| {
        let request = json!({"kind": kind, "input": input});
        (
            IdempotencyKey::parse(k.as_bytes()).unwrap(),
            fingerprinter().fingerprint(&request),
        )
    });
    AcceptParams {
        id: Id::generate(IdKind::Operation),
        tenant: tenant.into(),
        kind: kind.into(),
        input,
        callback_url: None,
        deadline_at: None,
        budget_max_cost: None,
        labels: BTreeMap::new(),
        idempotency,
        uploads: Vec::new(),
        rerun_of: None,
        from_checkpoint: false,
        now: T0,
    }
}

/// Accepts a fresh operation of `kind` for `tenant` (for backend-specific tests).
/// Whether a backend's schema must let an operation's row go from `from`
/// to `to` with its version one up: `State::can_become`, and staying in a
/// state, which is no transition, unless the state is terminal. Each
/// backend's schema test checks its guard against this, pair by pair.
pub fn schema_allows(from: State, to: State) -> bool {
    if from == to {
        !from.is_terminal()
    } else {
        from.can_become(to)
    }
}

pub async fn create(store: &dyn Store, tenant: &str, kind: &str) -> Operation {
    match store
        .operation_accept(accept_params(tenant, kind, None, json!({"n": 1})))
        .await
        .unwrap()
    {
        AcceptOutcome::Created(op) => op,
        other => panic!("expected Created, got {other:?}"),
    }
}

async fn claim_one(store: &dyn Store, kind: &str, now: Timestamp) -> Task {
    let mut tasks = claim(store, kind, 1, now).await;
    assert_eq!(tasks.len(), 1, "expected one task of kind {kind}");
    tasks.remove(0)
}

async fn claim(store: &dyn Store, kind: &str, max_tasks: u32, now: Timestamp) -> Vec<Task> {
    store.task_claim(claim_params(kind, max_tasks, now)).await.unwrap()
}

fn claim_params(kind: &str, max_tasks: u32, now: Timestamp) -> ClaimParams {
    ClaimParams {
        kinds: vec![kind.into()],
        max_tasks,
        lease: LEASE,
        worker_id: "conformance".into(),
        now,
    }
}

fn finish(task: &Task, outcome: Outcome, now: Timestamp) -> FinishParams {
    FinishParams {
        operation_id: task.operation_id.clone(),
        lease_token: task.lease_token.clone(),
        outcome,
        progress: None,
        now,
    }
}

fn heartbeat(task: &Task, now: Timestamp) -> HeartbeatParams {
    HeartbeatParams {
        operation_id: task.operation_id.clone(),
        lease_token: task.lease_token.clone(),
        progress: None,
        cost_units: None,
        cancellable: None,
        checkpoint: None,
        now,
    }
}

fn cancel(tenant: &str, id: &Id, now: Timestamp) -> CancelParams {
    CancelParams {
        tenant: tenant.into(),
        id: id.clone(),
        requested_by: "key_test".into(),
        reason: Some("changed my mind".into()),
        if_match: None,
        now,
    }
}

/// The operation as stored, for comparing with what a write returned: its
/// re-runs (which only a read fills in) are checked to be none and cleared.
async fn get(store: &dyn Store, op: &Operation) -> Operation {
    let mut read = store
        .operation_get(&op.tenant, &op.id)
        .await
        .unwrap()
        .expect("operation exists");
    assert_eq!(read.reruns.take(), Some(Vec::new()), "a read lists re-runs");
    read
}

fn at(seconds: u64) -> Timestamp {
    T0.plus(Duration::from_secs(seconds))
}

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

/// The ids of `tenant`'s operations (every tenant's with `None`), read two
/// to a page by following each page's cursor to the end.
async fn every_page(store: &dyn Store, tenant: Option<&str>) -> Vec<Id> {
    let (mut seen, mut before) = (Vec::new(), None);
    loop {
        let page = store
            .operation_list(ListParams {
                tenant: tenant.map(str::to_owned),
                page_size: 2,
                before_seq: before,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.operations.len() <= 2);
        seen.extend(page.operations.into_iter().map(|o| o.id));
        match page.next_before_seq {
            Some(next) => before = Some(next),
            None => return seen,
        }
    }
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

pub async fn cancelling_queued_work_cancels_it_at_once(store: &dyn Store) {
    let op = create(store, "t1", "cq").await;
    let CancelOutcome::CancelledNow(cancelled) = store.operation_cancel(cancel("t1", &op.id, at(1))).await.unwrap()
    else {
        panic!("expected CancelledNow")
    };
    assert_eq!(
        (cancelled.state, cancelled.version, cancelled.completed_at),
        (State::Cancelled, 2, Some(at(1)))
    );
    let request = cancelled.cancel.clone().unwrap();
    assert_eq!(
        (request.requested_by.as_str(), request.requested_at),
        ("key_test", at(1))
    );
    assert!(
        claim(store, "cq", 1, at(2)).await.is_empty(),
        "cancelled work is never started"
    );
    let again = store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap();
    assert_eq!(again, CancelOutcome::AlreadyTerminal(cancelled));
}

pub async fn cancelling_running_work_asks_the_worker(store: &dyn Store) {
    let op = create(store, "t1", "cr").await;
    let task = claim_one(store, "cr", at(1)).await;
    let CancelOutcome::Requested(requested) = store.operation_cancel(cancel("t1", &op.id, at(2))).await.unwrap() else {
        panic!("expected Requested")
    };
    assert_eq!((requested.state, requested.version), (State::Running, 3));
    assert!(matches!(
        store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap(),
        CancelOutcome::AlreadyRequested(ref o) if o.version == 3
    ));
    let ack = store.task_heartbeat(heartbeat(&task, at(4))).await.unwrap();
    assert!(ack.cancel_requested);
    assert_eq!(ack.cancel_reason.as_deref(), Some("changed my mind"));
    let done = store
        .task_finish(finish(&task, Outcome::Cancelled, at(5)))
        .await
        .unwrap();
    assert_eq!((done.state, done.version, done.error), (State::Cancelled, 4, None));
}

pub async fn worker_that_finishes_first_wins_the_cancel_race(store: &dyn Store) {
    let op = create(store, "t1", "race").await;
    let task = claim_one(store, "race", at(1)).await;
    store.operation_cancel(cancel("t1", &op.id, at(2))).await.unwrap();
    let done = store
        .task_finish(finish(&task, Outcome::Succeeded { result: None }, at(3)))
        .await
        .unwrap();
    assert_eq!(done.state, State::Succeeded);
    assert!(done.cancel.is_some(), "the request stays on record");
}

pub async fn cancel_after_the_commit_point_is_refused(store: &dyn Store) {
    let op = create(store, "t1", "commit").await;
    let task = claim_one(store, "commit", at(1)).await;
    let mut hb = heartbeat(&task, at(2));
    hb.cancellable = Some(false);
    store.task_heartbeat(hb).await.unwrap();
    // Saying "cancellable" again does not undo the commit point.
    let mut hb = heartbeat(&task, at(3));
    hb.cancellable = Some(true);
    store.task_heartbeat(hb).await.unwrap();
    assert!(matches!(
        store.operation_cancel(cancel("t1", &op.id, at(4))).await,
        Err(StoreError::NotCancellable)
    ));
    assert!(get(store, &op).await.cancel.is_none());
}

pub async fn cancel_honours_if_match(store: &dyn Store) {
    let op = create(store, "t1", "ifm").await;
    let mut stale = cancel("t1", &op.id, at(1));
    stale.if_match = Some(7);
    assert!(matches!(
        store.operation_cancel(stale).await,
        Err(StoreError::PreconditionFailed { current_version: 1 })
    ));
    let mut fresh = cancel("t1", &op.id, at(1));
    fresh.if_match = Some(1);
    assert!(matches!(
        store.operation_cancel(fresh).await.unwrap(),
        CancelOutcome::CancelledNow(_)
    ));
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
}

async fn declare(store: &dyn Store, name: &str, rerun_safe: bool, max_attempts: i64) {
    store
        .kind_upsert(KindSpec {
            name: name.into(),
            builtin: false,
            rerun_safe,
            max_attempts,
            default_deadline_seconds: None,
            max_deadline_seconds: None,
            pausable: false,
        })
        .await
        .unwrap();
}

fn retryable(code: &str) -> Outcome {
    Outcome::Failed {
        error: OperationError {
            code: code.into(),
            message: "try again".into(),
            retryable: true,
        },
    }
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

fn enforce(now: Timestamp) -> EnforceParams {
    EnforceParams {
        now,
        grace: Duration::from_secs(30),
        limit: 100,
    }
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

pub async fn intent_changes_need_the_current_version_and_terminal_intent_wins(store: &dyn Store) {
    let op = create(store, "t1", "patch").await;
    let update =
        |if_match, deadline: Option<Option<Timestamp>>, labels: Option<BTreeMap<String, String>>| UpdateParams {
            tenant: "t1".into(),
            id: op.id.clone(),
            if_match,
            deadline_at: deadline,
            labels,
            now: at(5),
        };
    let stale = store.operation_update(update(9, Some(Some(at(100))), None)).await;
    assert!(matches!(
        stale,
        Err(StoreError::PreconditionFailed { current_version: 1 })
    ));
    let labels: BTreeMap<String, String> = [("team".to_owned(), "red".to_owned())].into();
    let updated = store
        .operation_update(update(1, Some(Some(at(100))), Some(labels.clone())))
        .await
        .unwrap();
    assert_eq!(
        (updated.version, updated.deadline_at, updated.labels.clone()),
        (2, Some(at(100)), labels)
    );
    let same = store
        .operation_update(update(2, Some(Some(at(100))), None))
        .await
        .unwrap();
    assert_eq!(same.version, 2, "a change to the same values is no change");
    store.operation_cancel(cancel("t1", &op.id, at(6))).await.unwrap();
    let late = store.operation_update(update(3, Some(None), None)).await;
    assert!(matches!(late, Err(StoreError::Terminal { .. })), "{late:?}");
    let foreign = UpdateParams {
        tenant: "t2".into(),
        ..update(3, None, None)
    };
    assert!(matches!(
        store.operation_update(foreign).await,
        Err(StoreError::NotFound)
    ));
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

fn upload(task: &Task, key: &str, now: Timestamp) -> ResultUploadParams {
    named_upload(task, DEFAULT_ARTIFACT, key, now)
}

fn named_upload(task: &Task, name: &str, key: &str, now: Timestamp) -> ResultUploadParams {
    ResultUploadParams {
        operation_id: task.operation_id.clone(),
        lease_token: task.lease_token.clone(),
        name: name.into(),
        result_id: Id::generate(IdKind::Result),
        storage_key: key.into(),
        content_type: "text/csv".into(),
        size_bytes: 42,
        sha256: "ab".repeat(32),
        joins_pieces: false,
        now,
    }
}

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
    let error = OperationError {
        code: "boom".into(),
        message: "".into(),
        retryable: false,
    };
    let ended = store
        .task_finish(finish(&task, Outcome::Failed { error }, at(7)))
        .await
        .unwrap();
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

pub async fn reruns_link_both_ways_and_leave_the_original_unchanged(store: &dyn Store) {
    let first = create(store, "t1", "chain").await;
    let task = claim_one(store, "chain", at(1)).await;
    let error = OperationError {
        code: "boom".into(),
        message: "".into(),
        retryable: false,
    };
    let failed = store
        .task_finish(finish(&task, Outcome::Failed { error }, at(2)))
        .await
        .unwrap();
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

fn intent(op: &Operation, desired: DesiredState, version: i64, now: Timestamp) -> IntentParams {
    IntentParams {
        tenant: op.tenant.clone(),
        id: op.id.clone(),
        desired,
        if_match: Some(version),
        now,
    }
}

/// Pause against cancel, resume against cancel, pause against a claim, each
/// raced many times: every pair ends as one order of the two would, and
/// terminal intent dominates whatever the order.
pub async fn racing_intents_end_as_one_order_of_them_would(store: &dyn Store) {
    for round in 0..12u64 {
        let now = at(round * 10);
        // Pause against cancel, and resume (of paused work) against cancel:
        // cancelled either way; the intent applied first or refused.
        for (desired, applied) in [
            (DesiredState::Paused, State::Paused),
            (DesiredState::Running, State::Queued),
        ] {
            let op = create(store, "t1", "race").await;
            let version = match desired {
                DesiredState::Paused => 1,
                DesiredState::Running => {
                    let paused = store.operation_intent(intent(&op, DesiredState::Paused, 1, now)).await;
                    paused.unwrap().version
                }
            };
            let (intended, cancelled) = tokio::join!(
                store.operation_intent(intent(&op, desired, version, now)),
                store.operation_cancel(cancel("t1", &op.id, now)),
            );
            assert!(
                matches!(&intended, Ok(o) if o.state == applied)
                    || matches!(intended, Err(StoreError::IntentConflict { .. })),
                "{desired:?}: {intended:?}"
            );
            assert!(matches!(cancelled, Ok(CancelOutcome::CancelledNow(_))), "{cancelled:?}");
            assert_eq!(get(store, &op).await.state, State::Cancelled);
        }

        // Pause against a claim: paused and unclaimed, or running and refused.
        let op = create(store, "t1", "race-claim").await;
        let (paused, claimed) = tokio::join!(
            store.operation_intent(intent(&op, DesiredState::Paused, 1, now)),
            claim(store, "race-claim", 1, now),
        );
        match (&paused, claimed.len()) {
            (Ok(p), 0) => assert_eq!(p.state, State::Paused),
            (Err(StoreError::NotPausable { .. }), 1) => {
                assert_eq!(get(store, &op).await.state, State::Running);
                store
                    .task_finish(finish(&claimed[0], Outcome::Succeeded { result: None }, now))
                    .await
                    .unwrap();
            }
            other => panic!("pause against claim: {other:?}"),
        }
        let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
        let versions: Vec<i64> = history.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=versions.len() as i64).collect::<Vec<_>>());

        // A pausable kind: paused before the claim, or asked of the worker
        // that took it (who hears it at its first heartbeat).
        declare_pausable(store, "race-pausable").await;
        let op = create(store, "t1", "race-pausable").await;
        let (paused, claimed) = tokio::join!(
            store.operation_intent(intent(&op, DesiredState::Paused, 1, now)),
            claim(store, "race-pausable", 1, now),
        );
        match (&paused, claimed.as_slice()) {
            (Ok(p), []) => assert_eq!(p.state, State::Paused),
            (Ok(p), [task]) => {
                assert!(p.pause_requested(), "{p:?}");
                let ack = store.task_heartbeat(heartbeat(task, now)).await.unwrap();
                assert!(ack.pause_requested);
                let done = store
                    .task_finish(finish(task, Outcome::Paused { checkpoint: None }, now))
                    .await
                    .unwrap();
                assert_eq!(done.state, State::Paused);
            }
            // The claim came first and moved the version the client named.
            (Err(StoreError::PreconditionFailed { current_version: 2 }), [task]) => {
                store
                    .task_finish(finish(task, Outcome::Succeeded { result: None }, now))
                    .await
                    .unwrap();
            }
            other => panic!("pause against a claim of a pausable kind: {other:?}"),
        }
    }
    // A paused operation keeps its place out of the queue until resumed.
    let op = create(store, "t1", "held").await;
    store
        .operation_intent(intent(&op, DesiredState::Paused, 1, at(500)))
        .await
        .unwrap();
    assert!(
        claim(store, "held", 1, at(501)).await.is_empty(),
        "paused work is not claimed"
    );
    let resumed = store
        .operation_intent(intent(&op, DesiredState::Running, 2, at(502)))
        .await
        .unwrap();
    assert_eq!((resumed.state, resumed.version), (State::Queued, 3));
    assert_eq!(
        claim(store, "held", 1, at(503)).await.len(),
        1,
        "resumed work is claimed"
    );
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    let types: Vec<&str> = history.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, vec!["created", "paused", "resumed", "started"]);
}

fn chunk(key: &str, size: i64) -> UploadChunk {
    UploadChunk {
        storage_key: key.into(),
        size_bytes: size,
    }
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

fn sweep(now: Timestamp) -> RetentionParams {
    RetentionParams {
        now,
        tombstone_retention: Duration::from_secs(3600),
        delivery_retention: Duration::from_secs(600),
        limit: 100,
    }
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

/// Commands of the state-machine property test.
#[derive(Debug, Clone)]
enum Command {
    Claim,
    Heartbeat {
        stale: bool,
        units: u8,
        commit_point: bool,
    },
    Complete {
        stale: bool,
    },
    Fail {
        stale: bool,
    },
    AckCancel {
        stale: bool,
    },
    Cancel,
    LapseAndReap,
    /// `PATCH {"desired_state"}` with the current version, or a stale one.
    Intent {
        pause: bool,
        stale: bool,
    },
}

fn command_strategy() -> impl proptest::strategy::Strategy<Value = Command> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(Command::Claim),
        3 => (any::<bool>(), any::<u8>(), proptest::bool::weighted(0.1))
            .prop_map(|(stale, units, commit_point)| Command::Heartbeat { stale, units, commit_point }),
        2 => any::<bool>().prop_map(|stale| Command::Complete { stale }),
        1 => any::<bool>().prop_map(|stale| Command::Fail { stale }),
        1 => any::<bool>().prop_map(|stale| Command::AckCancel { stale }),
        2 => Just(Command::Cancel),
        1 => Just(Command::LapseAndReap),
        3 => (any::<bool>(), proptest::bool::weighted(0.2)).prop_map(|(pause, stale)| Command::Intent { pause, stale }),
    ]
}

/// The reference model of one operation.
#[derive(Debug, Clone)]
struct Model {
    state: State,
    version: i64,
    attempt: i64,
    has_lease: bool,
    cancel_requested: bool,
    cancellable: bool,
    /// Completed units reported so far, if any report was made.
    units: Option<f64>,
}

pub async fn state_machine_matches_the_reference_model(store: &dyn Store) {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRunner};

    // The kind is re-run safe with 3 attempts, so reaping exercises both paths.
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(command_strategy(), 1..40);
    for case in 0..48u64 {
        let commands = strategy.new_tree(&mut runner).expect("strategy").current();
        let kind = format!("model-{case}");
        store
            .kind_upsert(KindSpec {
                name: kind.clone(),
                builtin: false,
                rerun_safe: true,
                max_attempts: 3,
                default_deadline_seconds: None,
                max_deadline_seconds: None,
                pausable: false,
            })
            .await
            .unwrap();
        // Cases share the store; each runs in its own stretch of time.
        let start = at(case * 1_000_000);
        run_model_case(store, &kind, &commands, start).await;
    }
}

async fn run_model_case(store: &dyn Store, kind: &str, commands: &[Command], start: Timestamp) {
    let op = create(store, "model", kind).await;
    let mut model = Model {
        state: State::Queued,
        version: 1,
        attempt: 0,
        has_lease: false,
        cancel_requested: false,
        cancellable: true,
        units: None,
    };
    let mut task: Option<Task> = None;
    let mut now = start;
    let mut last_version = 1;
    let mut terminal: Option<Operation> = None;

    for (step, command) in commands.iter().enumerate() {
        now = now.plus(Duration::from_secs(1));
        let context = format!("step {step} {command:?} model {model:?}");
        let token_for = |stale: bool| -> Option<Task> {
            let mut t = task.clone()?;
            if stale {
                t.lease_token = "stale".into();
            }
            Some(t)
        };
        match command {
            Command::Claim => {
                // Retries wait for their backoff: claim far enough in the future.
                now = now.plus(Duration::from_secs(600));
                let tasks = claim(store, kind, 1, now).await;
                let claimable = !model.has_lease && !model.state.is_terminal() && model.state != State::Paused;
                assert_eq!(tasks.len(), usize::from(claimable), "{context}");
                if let Some(t) = tasks.into_iter().next() {
                    model.state = State::Running;
                    model.attempt = model.attempt.max(1);
                    model.version += 1;
                    model.has_lease = true;
                    assert_eq!(t.attempt, model.attempt, "{context}");
                    task = Some(t);
                }
            }
            Command::Heartbeat {
                stale,
                units,
                commit_point,
            } => {
                let Some(t) = token_for(*stale) else { continue };
                let mut hb = heartbeat(&t, now);
                hb.progress = Some(ProgressUpdate {
                    completed_units: Some(f64::from(*units)),
                    ..Default::default()
                });
                hb.cancellable = commit_point.then_some(false);
                let result = store.task_heartbeat(hb).await;
                if *stale || !model.has_lease {
                    assert!(matches!(result, Err(StoreError::LeaseLost)), "{context}: {result:?}");
                } else {
                    let ack = result.unwrap();
                    let reported = f64::from(*units);
                    let new_units = Some(model.units.map_or(reported, |old| old.max(reported)));
                    let changed = new_units != model.units || (*commit_point && model.cancellable);
                    if changed {
                        model.version += 1;
                    }
                    model.units = new_units;
                    model.cancellable &= !*commit_point;
                    assert_eq!(ack.version, model.version, "{context}");
                    assert_eq!(ack.cancel_requested, model.cancel_requested, "{context}");
                }
            }
            Command::Complete { stale } | Command::Fail { stale } | Command::AckCancel { stale } => {
                let Some(t) = token_for(*stale) else { continue };
                let outcome = match command {
                    Command::Complete { .. } => Outcome::Succeeded {
                        result: Some(json!(step)),
                    },
                    Command::Fail { .. } => Outcome::Failed {
                        error: OperationError {
                            code: "boom".into(),
                            message: "m".into(),
                            retryable: false,
                        },
                    },
                    _ => Outcome::Cancelled,
                };
                let result = store.task_finish(finish(&t, outcome, now)).await;
                if *stale || !model.has_lease {
                    assert!(matches!(result, Err(StoreError::LeaseLost)), "{context}: {result:?}");
                } else {
                    let done = result.unwrap();
                    model.state = match command {
                        Command::Complete { .. } => State::Succeeded,
                        Command::Fail { .. } => State::Failed,
                        _ => State::Cancelled,
                    };
                    model.version += 1;
                    model.has_lease = false;
                    assert_eq!((done.state, done.version), (model.state, model.version), "{context}");
                }
            }
            Command::Cancel => {
                let result = store.operation_cancel(cancel("model", &op.id, now)).await;
                match (model.state, model.cancel_requested, model.cancellable) {
                    (s, _, _) if s.is_terminal() => {
                        assert!(
                            matches!(result, Ok(CancelOutcome::AlreadyTerminal(_))),
                            "{context}: {result:?}"
                        )
                    }
                    (State::Running, true, _) => {
                        assert!(
                            matches!(result, Ok(CancelOutcome::AlreadyRequested(_))),
                            "{context}: {result:?}"
                        )
                    }
                    (State::Running | State::Paused, false, false) => {
                        assert!(
                            matches!(result, Err(StoreError::NotCancellable)),
                            "{context}: {result:?}"
                        )
                    }
                    (State::Running, false, true) if model.has_lease => {
                        assert!(
                            matches!(result, Ok(CancelOutcome::Requested(_))),
                            "{context}: {result:?}"
                        );
                        model.cancel_requested = true;
                        model.version += 1;
                    }
                    _ => {
                        // Queued, or running but waiting for a retry with no
                        // worker holding it: cancelled at once.
                        assert!(
                            matches!(result, Ok(CancelOutcome::CancelledNow(_))),
                            "{context}: {result:?}"
                        );
                        model.state = State::Cancelled;
                        model.version += 1;
                    }
                }
            }
            Command::Intent { pause, stale } => {
                let result = store
                    .operation_intent(IntentParams {
                        tenant: "model".into(),
                        id: op.id.clone(),
                        desired: if *pause {
                            DesiredState::Paused
                        } else {
                            DesiredState::Running
                        },
                        if_match: Some(model.version + i64::from(*stale)),
                        now,
                    })
                    .await;
                let unchanged = if *pause {
                    model.state == State::Paused
                } else {
                    matches!(model.state, State::Queued | State::Running)
                };
                if model.state.is_terminal() || model.cancel_requested {
                    assert!(
                        matches!(result, Err(StoreError::IntentConflict { .. })),
                        "{context}: {result:?}"
                    );
                } else if *pause && !unchanged && model.has_lease {
                    assert!(
                        matches!(result, Err(StoreError::NotPausable { .. })),
                        "{context}: {result:?}"
                    );
                } else if *stale {
                    assert!(
                        matches!(result, Err(StoreError::PreconditionFailed { .. })),
                        "{context}: {result:?}"
                    );
                } else {
                    let changed = result.unwrap_or_else(|e| panic!("{context}: {e:?}"));
                    if !unchanged {
                        model.state = if *pause { State::Paused } else { State::Queued };
                        model.version += 1;
                    }
                    assert_eq!(
                        (changed.state, changed.version),
                        (model.state, model.version),
                        "{context}"
                    );
                }
            }
            Command::LapseAndReap => {
                now = now.plus(LEASE).plus(Duration::from_secs(1));
                let counts = store.task_reap(ReapParams { now, limit: 1000 }).await.unwrap();
                if model.has_lease {
                    model.has_lease = false;
                    model.version += 1;
                    if model.cancel_requested {
                        model.state = State::Cancelled;
                        assert_eq!(counts.ended_cancel_requested, 1, "{context}");
                    } else if model.attempt < 3 {
                        model.attempt += 1;
                        assert_eq!(counts.requeued, 1, "{context}");
                    } else {
                        model.state = State::Failed;
                        assert_eq!(counts.failed_outcome_unknown, 1, "{context}");
                    }
                } else {
                    assert_eq!(counts, ReapCounts::default(), "{context}");
                }
            }
        }

        let stored = get(store, &op).await;
        assert_eq!(
            (stored.state, stored.version, stored.attempt),
            (model.state, model.version, model.attempt),
            "{context}"
        );
        assert!(stored.version >= last_version, "{context}: versions never go down");
        last_version = stored.version;
        match &terminal {
            Some(frozen) => assert_eq!(&stored, frozen, "{context}: a terminal operation never changes"),
            None if stored.state.is_terminal() => terminal = Some(stored),
            None => {}
        }
    }
    let history = store.operation_history("model", &op.id).await.unwrap().unwrap();
    let versions: Vec<i64> = history.iter().map(|e| e.version).collect();
    assert_eq!(
        versions,
        (1..=model.version).collect::<Vec<_>>(),
        "one event per version, in order"
    );
    // Leave no live lease behind for the next case's reaper to find.
    if let (true, Some(t)) = (model.has_lease, task) {
        store
            .task_finish(finish(&t, Outcome::Succeeded { result: None }, now))
            .await
            .unwrap();
    }
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

async fn declare_pausable(store: &dyn Store, name: &str) {
    let spec = KindSpec {
        rerun_safe: true,
        pausable: true,
        ..KindSpec::declared(name)
    };
    store.kind_upsert(spec).await.unwrap();
}

fn with_checkpoint(task: &Task, checkpoint: Value, now: Timestamp) -> HeartbeatParams {
    HeartbeatParams {
        checkpoint: Some(checkpoint),
        ..heartbeat(task, now)
    }
}

fn event_types(history: &[Event]) -> Vec<&str> {
    history.iter().map(|e| e.event_type.as_str()).collect()
}

/// A pause of running work is asked of its worker (`pause_requested`,
/// `desired_state` paused while the state is still running); the worker's
/// `paused` report ends its lease and is not an attempt; a resume queues
/// the work, and the next claim gets the checkpoint. A kind not declared
/// pausable refuses; a `paused` report nobody asked for is refused.
pub async fn pausing_running_work_asks_its_worker_and_resumes_from_its_checkpoint(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    assert_eq!(task.checkpoint, None, "a fresh start");
    let ack = store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 10}), at(2)))
        .await
        .unwrap();
    assert_eq!(
        (ack.version, ack.pause_requested),
        (2, false),
        "a checkpoint is no new version"
    );
    // Nobody asked: the report is refused and the lease stays.
    let unasked = store
        .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(3)))
        .await;
    assert!(
        matches!(unasked, Err(StoreError::IntentConflict { current_version: 2 })),
        "{unasked:?}"
    );

    let asked = store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(4)))
        .await
        .unwrap();
    assert_eq!(
        (asked.state, asked.version, asked.pause_requested_at),
        (State::Running, 3, Some(at(4)))
    );
    let again = store
        .operation_intent(intent(&op, DesiredState::Paused, 3, at(5)))
        .await
        .unwrap();
    assert_eq!(again.version, 3, "asking again changes nothing");
    let ack = store.task_heartbeat(heartbeat(&task, at(6))).await.unwrap();
    assert!(ack.pause_requested && !ack.cancel_requested);

    let paused = store
        .task_finish(finish(
            &task,
            Outcome::Paused {
                checkpoint: Some(json!({"row": 20})),
            },
            at(7),
        ))
        .await
        .unwrap();
    assert_eq!(
        (paused.state, paused.attempt, paused.pause_requested_at),
        (State::Paused, 1, None)
    );
    assert!(matches!(
        store.task_heartbeat(heartbeat(&task, at(8))).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(
        claim(store, "pausable", 1, at(9)).await.is_empty(),
        "paused work is not claimed"
    );
    let resumed = store
        .operation_intent(intent(&op, DesiredState::Running, paused.version, at(10)))
        .await
        .unwrap();
    assert_eq!(resumed.state, State::Queued);
    let next = claim_one(store, "pausable", at(11)).await;
    assert_eq!(
        (next.attempt, next.checkpoint),
        (1, Some(json!({"row": 20}))),
        "a pause is not an attempt; the claim hands the checkpoint"
    );
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(
        event_types(&history),
        vec!["created", "started", "pause_requested", "paused", "resumed", "started"]
    );

    // Running work of a kind not declared pausable cannot be paused.
    let plain = create(store, "t1", "not-pausable").await;
    claim_one(store, "not-pausable", at(12)).await;
    assert!(matches!(
        store
            .operation_intent(intent(&plain, DesiredState::Paused, 2, at(13)))
            .await,
        Err(StoreError::NotPausable { current_version: 2 })
    ));
}

/// Terminal intent dominates a pause of running work: a cancel after the
/// request ends the work as the cancel says even when the worker reports
/// `paused`; after a cancel no pause is applied. A worker that finishes
/// first wins over the pause. A pause withdrawn before the worker answers
/// leaves it running.
pub async fn a_pause_of_running_work_meets_terminal_intent_and_completion(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    // Pause, then cancel, then the worker's paused report: cancelled.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(2)))
        .await
        .unwrap();
    let cancelled = store.operation_cancel(cancel("t1", &op.id, at(3))).await.unwrap();
    assert!(matches!(cancelled, CancelOutcome::Requested(_)), "{cancelled:?}");
    let ack = store.task_heartbeat(heartbeat(&task, at(4))).await.unwrap();
    assert!(
        ack.cancel_requested && !ack.pause_requested,
        "the cancel is what the worker hears"
    );
    let ended = store
        .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(5)))
        .await
        .unwrap();
    assert_eq!(ended.state, State::Cancelled);
    assert!(matches!(
        store
            .operation_intent(intent(&ended, DesiredState::Running, ended.version, at(6)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));

    // Cancel first: a pause is refused whatever the version.
    let op = create(store, "t1", "pausable").await;
    claim_one(store, "pausable", at(10)).await;
    store.operation_cancel(cancel("t1", &op.id, at(11))).await.unwrap();
    assert!(matches!(
        store
            .operation_intent(intent(&op, DesiredState::Paused, 1, at(12)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));

    // The worker completes before it hears of the pause: succeeded.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(20)).await;
    let (paused, done) = tokio::join!(
        store.operation_intent(intent(&op, DesiredState::Paused, 2, at(21))),
        store.task_finish(finish(&task, Outcome::Succeeded { result: None }, at(21))),
    );
    assert_eq!(done.unwrap().state, State::Succeeded, "a worker that finishes wins");
    assert!(
        matches!(&paused, Ok(o) if o.state == State::Running)
            || matches!(
                paused,
                Err(StoreError::IntentConflict { .. }) | Err(StoreError::PreconditionFailed { .. })
            ),
        "{paused:?}"
    );
    assert_eq!(get(store, &op).await.state, State::Succeeded);

    // Withdrawn before the worker answers: it runs on and hears nothing.
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(30)).await;
    let asked = store
        .operation_intent(intent(&op, DesiredState::Paused, 2, at(31)))
        .await
        .unwrap();
    let withdrawn = store
        .operation_intent(intent(&op, DesiredState::Running, asked.version, at(32)))
        .await
        .unwrap();
    assert_eq!((withdrawn.state, withdrawn.pause_requested_at), (State::Running, None));
    assert!(
        !store
            .task_heartbeat(heartbeat(&task, at(33)))
            .await
            .unwrap()
            .pause_requested
    );
    assert!(matches!(
        store
            .task_finish(finish(&task, Outcome::Paused { checkpoint: None }, at(34)))
            .await,
        Err(StoreError::IntentConflict { .. })
    ));
    let history = store.operation_history("t1", &op.id).await.unwrap().unwrap();
    assert_eq!(
        event_types(&history),
        vec!["created", "started", "pause_requested", "pause_withdrawn"]
    );
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

/// A crashed worker's last checkpoint goes to the next attempt; a lapse
/// while a pause was asked pauses the work; a `from_checkpoint` re-run
/// starts where the original stopped, a plain one from the beginning.
pub async fn a_checkpoint_survives_a_lapsed_lease_and_is_copied_by_a_rerun(store: &dyn Store) {
    declare_pausable(store, "pausable").await;
    let op = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", at(1)).await;
    store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 5}), at(2)))
        .await
        .unwrap();
    let lapsed = at(2).plus(LEASE).plus(Duration::from_secs(1));
    let reaped = store.task_reap(ReapParams { now: lapsed, limit: 10 }).await.unwrap();
    assert_eq!(reaped.requeued, 1);
    let retry = claim_one(store, "pausable", lapsed.plus(Duration::from_secs(60))).await;
    assert_eq!((retry.attempt, retry.checkpoint.clone()), (2, Some(json!({"row": 5}))));

    // Asked to pause, then gone: paused, the next attempt counted.
    let current = get(store, &op).await;
    store
        .operation_intent(intent(
            &op,
            DesiredState::Paused,
            current.version,
            lapsed.plus(Duration::from_secs(61)),
        ))
        .await
        .unwrap();
    let gone = lapsed.plus(Duration::from_secs(200));
    let reaped = store.task_reap(ReapParams { now: gone, limit: 10 }).await.unwrap();
    assert_eq!(reaped.paused, 1);
    let paused = get(store, &op).await;
    assert_eq!((paused.state, paused.attempt), (State::Paused, 3));

    // The original fails; re-runs with and without its checkpoint.
    let failing = create(store, "t1", "pausable").await;
    let task = claim_one(store, "pausable", gone).await;
    store
        .task_heartbeat(with_checkpoint(&task, json!({"row": 7}), gone))
        .await
        .unwrap();
    let error = OperationError {
        code: "boom".into(),
        message: String::new(),
        retryable: false,
    };
    store
        .task_finish(finish(&task, Outcome::Failed { error }, gone))
        .await
        .unwrap();
    for from_checkpoint in [true, false] {
        let mut params = accept_params("t1", "pausable", None, json!({"n": 1}));
        params.rerun_of = Some(failing.id.clone());
        params.from_checkpoint = from_checkpoint;
        store.operation_accept(params).await.unwrap();
        let next = claim_one(store, "pausable", gone).await;
        let expected = from_checkpoint.then(|| json!({"row": 7}));
        assert_eq!(next.checkpoint, expected, "from_checkpoint: {from_checkpoint}");
    }
}

fn piece(task: &Task, offset: i64, key: &str, size: i64, now: Timestamp) -> ArtifactPieceParams {
    ArtifactPieceParams {
        operation_id: task.operation_id.clone(),
        lease_token: task.lease_token.clone(),
        name: DEFAULT_ARTIFACT.into(),
        offset,
        piece: chunk(key, size),
        now,
    }
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
    let error = OperationError {
        code: "boom".into(),
        message: String::new(),
        retryable: false,
    };
    store
        .task_finish(finish(&retry, Outcome::Failed { error }, now))
        .await
        .unwrap();
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
