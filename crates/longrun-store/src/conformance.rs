//! The conformance suite every [`Store`] backend must pass, unchanged.
//!
//! A backend's test file invokes [`store_conformance!`](crate::store_conformance)
//! with an async factory returning a fresh [`TestStore`]; the macro expands to
//! one `#[tokio::test]` per case, so a failure names the case. Extend the
//! suite whenever the trait grows. The cases live one file a topic
//! (`accept`, `jobs`, `control`, `deadlines`, `changes`, `webhooks`,
//! `artifacts`, `retention`, `admin`, `model`, `scheduling`, `schedules`); the helpers they share are
//! here.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::fingerprint::Fingerprinter;
use longrun_core::{Id, IdKind, IdempotencyKey, State, Timestamp};
use serde_json::{Value, json};

use crate::*;

// The cases, one file a topic; the macro names each as `conformance::case`.
mod accept;
mod admin;
mod artifacts;
mod changes;
mod control;
mod deadlines;
mod jobs;
mod model;
mod retention;
mod schedules;
mod scheduling;
mod webhooks;

pub use accept::*;
pub use admin::*;
pub use artifacts::*;
pub use changes::*;
pub use control::*;
pub use deadlines::*;
pub use jobs::*;
pub use model::*;
pub use retention::*;
pub use schedules::*;
pub use scheduling::*;
pub use webhooks::*;

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
            every_state_lists_exactly_its_operations,
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
            a_claim_fails_late_work_and_leases_the_rest_in_one_call,
            failed_outcome_carries_the_error_and_keeps_the_input,
            api_keys_are_created_listed_and_revoked,
            kinds_are_declared_and_updated,
            server_secrets_are_created_once,
            acceptance_pauses_are_set_per_kind_or_for_all,
            the_backlog_counts_live_work_and_what_maintenance_has_waiting,
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
            a_history_reads_the_same_whether_its_events_were_kept_or_derived,
            a_submission_leased_as_accepted_is_what_a_claim_would_have_leased,
            racing_submissions_with_one_key_make_one_operation_handed_or_not,
            committed_changes_are_published_and_rolled_back_ones_are_not,
            every_submission_of_a_batch_is_published_once,
            every_change_of_a_large_claim_and_outcome_batch_is_published_once_in_order,
            typical_durations_come_from_recent_successes,
            each_state_transition_of_a_callback_operation_queues_one_webhook,
            webhook_attempts_are_leased_logged_retried_and_given_up,
            finished_deliveries_go_with_their_log_after_the_delivery_retention,
            webhook_secrets_rotate_with_an_overlap,
            an_uploaded_artifact_is_published_by_complete_and_discarded_otherwise,
            named_artifacts_are_published_together_and_an_earlier_attempts_are_replaced,
            uploads_append_at_their_offset_complete_once_and_live_while_named,
            objects_are_named_while_a_row_names_them,
            one_request_at_a_time_holds_the_right_to_append,
            reruns_link_both_ways_and_leave_the_original_unchanged,
            racing_intents_end_as_one_order_of_them_would,
            retention_expires_results_removes_operations_and_buries_tombstones,
            a_sweep_removes_what_is_due_a_batch_at_a_time,
            a_sweep_larger_than_a_step_removes_up_to_its_limit,
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
            shared_pieces_outlive_a_sweep_that_removes_only_their_writer,
            console_sessions_expire_and_end,
            the_console_reads_are_bounded_by_live_work_and_keys,
            a_read_after_each_kind_of_write_sees_it,
            reads_racing_writes_never_go_back_a_version,
            work_that_starts_later_is_claimed_from_its_start_on,
            higher_priority_goes_first_within_a_tenant_but_not_past_other_tenants,
            schedules_are_kept_per_tenant_and_changed_by_version,
            due_schedules_are_the_unpaused_ones_whose_time_came,
            firing_records_take_the_newest_word_and_forget_the_old,
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
        not_before: None,
        priority: crate::PRIORITY_DEFAULT,
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

/// [`create`] with a label: its `created` event says more than its row,
/// so it is kept as a row (plan/history.rs).
pub async fn create_labelled(store: &dyn Store, tenant: &str, kind: &str) -> Operation {
    let mut params = accept_params(tenant, kind, None, json!({"n": 1}));
    params.labels.insert("team".into(), "a".into());
    match store.operation_accept(params).await.unwrap() {
        AcceptOutcome::Created(op) => op,
        other => panic!("expected Created, got {other:?}"),
    }
}

async fn claim_one(store: &dyn Store, kind: &str, now: Timestamp) -> Task {
    let mut tasks = claim(store, kind, 1, now).await;
    assert_eq!(tasks.len(), 1, "expected one task of kind {kind}");
    tasks.remove(0)
}

/// Up to `max_tasks` of `kind`'s tasks, claimed at `now` by the suite's worker.
pub async fn claim(store: &dyn Store, kind: &str, max_tasks: u32, now: Timestamp) -> Vec<Task> {
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

/// The ids of `tenant`'s operations (every tenant's with `None`), read two
/// to a page by following each page's cursor to the end.
async fn every_page(store: &dyn Store, tenant: Option<&str>) -> Vec<Id> {
    let list = ListParams {
        tenant: tenant.map(str::to_owned),
        ..Default::default()
    };
    every_page_of(store, list).await
}

/// The ids `list` finds, read two to a page by following each page's
/// cursor to the end.
async fn every_page_of(store: &dyn Store, list: ListParams) -> Vec<Id> {
    let (mut seen, mut before) = (Vec::new(), None);
    loop {
        let page = store
            .operation_list(ListParams {
                page_size: 2,
                before_seq: before,
                ..list.clone()
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

/// A failure the worker reports as final, with `code` and no message.
fn failure(code: &str) -> Outcome {
    Outcome::Failed {
        error: OperationError {
            code: code.into(),
            message: String::new(),
            retryable: false,
        },
    }
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

fn enforce(now: Timestamp) -> EnforceParams {
    EnforceParams {
        now,
        grace: Duration::from_secs(30),
        limit: 100,
    }
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

fn intent(op: &Operation, desired: DesiredState, version: i64, now: Timestamp) -> IntentParams {
    IntentParams {
        tenant: op.tenant.clone(),
        id: op.id.clone(),
        desired,
        if_match: Some(version),
        now,
    }
}

fn chunk(key: &str, size: i64) -> UploadChunk {
    UploadChunk {
        storage_key: key.into(),
        size_bytes: size,
    }
}

fn sweep(now: Timestamp) -> RetentionParams {
    RetentionParams {
        now,
        tombstone_retention: Duration::from_secs(3600),
        delivery_retention: Duration::from_secs(600),
        limit: 100,
    }
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
