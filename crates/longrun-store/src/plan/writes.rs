//! The writes of one operation (and of its task) that [`apply`](super::apply)
//! makes for the effects other than an ending, as shared statements: a
//! backend writes none of them. An update of `operations` names its row
//! first (`id = ?1`) and is run by
//! [`Driver::operation_update`](super::Driver::operation_update), which
//! reads the row back (by `RETURNING` on PostgreSQL, by id on SQLite); the
//! rest run as [`Script`]s. SQLite updates `operations` with `OR FAIL`, so
//! that it opens no statement journal (see `sqlite.rs`).

use longrun_core::Timestamp;
use serde_json::Value;

use crate::Progress;
use crate::shared::{Script, Stmt, UpdateChange, Val, nothing, progress_text};

fn stmt(sql: &'static str, args: Vec<Val>) -> Stmt {
    Stmt { sql, args }
}

fn progress(p: Option<&Progress>) -> Val {
    p.map(progress_text).into()
}

/// A stop asked of running work, one version on.
pub(super) fn cancel_request(id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4,
                version = version + 1, updated_at = ?2
          WHERE id = ?1 AND state = 'running'",
        vec![id.into(), now.into(), by.into(), reason.into()],
    )
}

/// Who cancelled work that ends at once (the same version: the ending that
/// follows moves it).
pub(super) fn cancel_record(id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4
          WHERE id = ?1",
        vec![id.into(), now.into(), by.into(), reason.into()],
    )
}

/// A running operation's task back in the queue until `available_at`.
pub(super) fn task_requeue(id: &str, available_at: Timestamp) -> Script<()> {
    Script::one(
        "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL,
                available_at = ?2
          WHERE operation_id = ?1",
        vec![id.into(), available_at.into()],
        nothing,
    )
}

/// A running operation waiting for attempt `next_attempt`, one version on.
pub(super) fn retry_schedule(id: &str, next_attempt: i64, progress_now: Option<&Progress>, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET attempt = ?2, version = version + 1, updated_at = ?3, progress = COALESCE(?4, progress)
          WHERE id = ?1 AND state = 'running'",
        vec![id.into(), next_attempt.into(), now.into(), progress(progress_now)],
    )
}

/// A live operation paused, one version on (its task goes: [`task_drop`]).
pub(super) fn pause(
    id: &str,
    attempt: Option<i64>,
    progress_now: Option<&Progress>,
    checkpoint: Option<&Value>,
    now: Timestamp,
) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET state = 'paused', version = version + 1, updated_at = ?2,
                attempt = COALESCE(?3, attempt), progress = COALESCE(?4, progress),
                checkpoint = COALESCE(?5, checkpoint), pause_requested_at = NULL
          WHERE id = ?1 AND state IN ('queued', 'running')",
        vec![
            id.into(),
            now.into(),
            attempt.into(),
            progress(progress_now),
            checkpoint.map(Value::to_string).into(),
        ],
    )
}

/// An operation's task out of the queue.
pub(super) fn task_drop(id: &str) -> Script<()> {
    Script::one("DELETE FROM tasks WHERE operation_id = ?1", vec![id.into()], nothing)
}

/// A paused operation queued again, one version on (its task comes back:
/// [`task_restore`]).
pub(super) fn resume(id: &str, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations SET state = 'queued', version = version + 1, updated_at = ?2
          WHERE id = ?1 AND state = 'paused'",
        vec![id.into(), now.into()],
    )
}

/// A task for a resumed operation, ready at `available_at`.
pub(super) fn task_restore(id: &str, available_at: Timestamp) -> Script<()> {
    Script::one(
        "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
         SELECT id, seq, tenant, kind, 'ready', ?2, priority FROM operations WHERE id = ?1",
        vec![id.into(), available_at.into()],
        nothing,
    )
}

/// A pause asked of live work (or taken back, with `None`), one version on.
pub(super) fn pause_request_set(id: &str, at: Option<Timestamp>, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations SET pause_requested_at = ?2, version = version + 1, updated_at = ?3
          WHERE id = ?1 AND state IN ('queued', 'running')",
        vec![id.into(), at.into(), now.into()],
    )
}

/// A live operation's deadline, labels and start, one version on (a ready
/// task's start moves with it: [`task_available_at`]).
pub(super) fn deadline_and_labels_set(id: &str, change: &UpdateChange, labels: String, now: Timestamp) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET deadline_at = ?2, labels = ?3, not_before = ?5, version = version + 1, updated_at = ?4
          WHERE id = ?1 AND state IN ('queued', 'running')",
        vec![
            id.into(),
            change.deadline_at.into(),
            labels.into(),
            now.into(),
            change.not_before.into(),
        ],
    )
}

/// When a ready task may be claimed.
pub(super) fn task_available_at(id: &str, at: Timestamp) -> Script<()> {
    Script::one(
        "UPDATE tasks SET available_at = ?2 WHERE operation_id = ?1 AND status = 'ready'",
        vec![id.into(), at.into()],
        nothing,
    )
}

/// A held lease, longer.
pub(super) fn lease_renew(id: &str, until: Timestamp) -> Script<()> {
    Script::one(
        "UPDATE tasks SET lease_expires_at = ?2 WHERE operation_id = ?1",
        vec![id.into(), until.into()],
        nothing,
    )
}

/// A running operation's checkpoint (not part of its representation: no
/// new version).
pub(super) fn checkpoint_save(id: &str, checkpoint: &Value) -> Script<()> {
    Script::one(
        "UPDATE {sqlite: OR FAIL} operations SET checkpoint = ?2 WHERE id = ?1",
        vec![id.into(), checkpoint.to_string().into()],
        nothing,
    )
}

/// A running operation's progress and cost, one version on.
pub(super) fn progress_set(
    id: &str,
    progress_now: Option<&Progress>,
    cost_units: f64,
    cancellable: bool,
    now: Timestamp,
) -> Stmt {
    stmt(
        "UPDATE {sqlite: OR FAIL} operations
            SET progress = ?2, cost_units = ?3, cancellable = ?4, version = version + 1, updated_at = ?5
          WHERE id = ?1 AND state = 'running'",
        vec![
            id.into(),
            progress(progress_now),
            cost_units.into(),
            cancellable.into(),
            now.into(),
        ],
    )
}
