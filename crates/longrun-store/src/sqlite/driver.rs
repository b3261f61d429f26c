//! SQLite as a driver of the plan layer: each primitive runs its statements
//! at once on the writer thread's connection, inside the writer's group
//! commit, so a use case's future never waits and [`block`] drives it to
//! completion in one poll.

use std::collections::HashMap;
use std::future::Future;

use futures_util::FutureExt as _;

use super::*;
use crate::plan::{Driver, EndRow, Lock};

/// The writer thread's connection, as a [`Driver`].
pub(super) struct SqliteDriver<'c> {
    c: &'c Connection,
    policy: WritePolicy,
    /// Operations as `fenced` read them in full, so that ending one writes
    /// the row it read instead of reading it again (a use case ends what it
    /// fenced; any other write forgets the row). Usually one: the writer
    /// runs each outcome as a batch of its own.
    read: Vec<Operation>,
}

impl<'c> SqliteDriver<'c> {
    pub(super) fn new(c: &'c Connection, policy: WritePolicy) -> Self {
        Self {
            c,
            policy,
            read: Vec::new(),
        }
    }

    /// An operation's row, the one `fenced` read if no write came since.
    fn current(&mut self, id: &str) -> Result<Option<Operation>> {
        match self.read.iter().position(|op| op.id.as_str() == id) {
            Some(at) => Ok(Some(self.read.swap_remove(at))),
            None => operation_by_id(self.c, id),
        }
    }

    /// Forgets the row `fenced` read of `id`: a write changed it.
    fn forget(&mut self, id: &str) {
        self.read.retain(|op| op.id.as_str() != id);
    }

    /// `UPDATE … WHERE id = ?1` of one operation, read back.
    fn update(&mut self, id: &str, sql: &str, rest: &[&dyn rusqlite::ToSql]) -> Result<Operation> {
        self.forget(id);
        update_and_read(self.c, id, sql, rest)?.ok_or(StoreError::NotFound)
    }
}

/// Runs a use case on the writer thread: every statement of the SQLite
/// driver completes before its future returns, so one poll finishes it.
pub(super) fn block<T>(use_case: impl Future<Output = Result<T>>) -> Result<T> {
    use_case
        .now_or_never()
        .expect("the SQLite driver runs every statement at once, never waiting")
}

impl Driver for SqliteDriver<'_> {
    // The writer thread is the only writer: a row read in its job stays as
    // read until the job ends.
    const SERIAL: bool = true;
    const HISTORY_BY_PARTITION: bool = false;

    async fn script<T>(&mut self, script: &Script<T>) -> Result<T> {
        super::script::run(self.c, script)
    }

    async fn pieces_drop(
        &mut self,
        operation_id: &str,
        only: Option<(&str, i64)>,
        keep: Option<&str>,
        now: Timestamp,
    ) -> Result<()> {
        pieces_drop(self.c, operation_id, only, keep, now)
    }

    async fn fenced(&mut self, leases: &[(&str, &str)], _lock: Lock) -> Result<Vec<Option<Fenced>>> {
        let mut found = Vec::with_capacity(leases.len());
        for (id, token) in leases {
            match fenced_operation(self.c, id, token) {
                Ok((fenced, op)) => {
                    self.read.push(op);
                    found.push(Some(fenced));
                }
                Err(StoreError::LeaseLost) => found.push(None),
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        operation_get(self.c, tenant, id)
    }

    async fn task_leased(&mut self, id: &str) -> Result<Option<bool>> {
        Ok(self
            .c
            .prepare_cached("SELECT status = 'leased' FROM tasks WHERE operation_id = ?1")?
            .query_row(params![id], |r| r.get(0))
            .optional()?)
    }

    async fn intent_holder(&mut self, op: &Operation) -> Result<Holder> {
        Ok(self
            .c
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE operation_id = ?1 AND status = 'leased'),
                        COALESCE((SELECT pausable FROM kinds WHERE name = ?2), 0)",
            )?
            .query_row(params![op.id.as_str(), op.kind], |r| {
                Ok(Holder {
                    leased: r.get(0)?,
                    pausable: r.get(1)?,
                })
            })?)
    }

    async fn operations_end(&mut self, ends: &[&EndRow]) -> Result<HashMap<String, Operation>> {
        let mut ended = HashMap::with_capacity(ends.len());
        for row in ends {
            let Some(current) = self.current(&row.id)? else {
                continue;
            };
            if row.guard.is_some_and(|version| version != current.version) {
                continue;
            }
            if let Some(op) = end_operation(self.c, self.policy, current, &row.ending, row.now)? {
                ended.insert(row.id.clone(), op);
            }
        }
        Ok(ended)
    }

    async fn cancel_request(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<Operation> {
        self.update(
            id,
            "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4,
                    version = version + 1, updated_at = ?2
              WHERE id = ?1 AND state = 'running'",
            params![now.0, by, reason],
        )
    }

    async fn cancel_record(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<()> {
        self.forget(id);
        self.c
            .prepare_cached(
                "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4
                  WHERE id = ?1",
            )?
            .execute(params![id, now.0, by, reason])?;
        Ok(())
    }

    async fn retry_schedule(
        &mut self,
        id: &str,
        next_attempt: i64,
        available_at: Timestamp,
        progress: Option<&Progress>,
        now: Timestamp,
    ) -> Result<Operation> {
        self.c
            .prepare_cached(
                "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL,
                        available_at = ?2
                  WHERE operation_id = ?1",
            )?
            .execute(params![id, available_at.0])?;
        self.update(
            id,
            "UPDATE OR FAIL operations SET attempt = ?2, version = version + 1, updated_at = ?3,
                    progress = COALESCE(?4, progress)
              WHERE id = ?1 AND state = 'running'",
            params![next_attempt, now.0, progress.map(progress_text)],
        )
    }

    async fn pause(
        &mut self,
        id: &str,
        attempt: Option<i64>,
        progress: Option<&Progress>,
        checkpoint: Option<&Value>,
        now: Timestamp,
    ) -> Result<Operation> {
        let paused = self.update(
            id,
            "UPDATE OR FAIL operations SET state = 'paused', version = version + 1, updated_at = ?2,
                    attempt = COALESCE(?3, attempt), progress = COALESCE(?4, progress),
                    checkpoint = COALESCE(?5, checkpoint), pause_requested_at = NULL
              WHERE id = ?1 AND state IN ('queued', 'running')",
            params![
                now.0,
                attempt,
                progress.map(progress_text),
                checkpoint.map(Value::to_string)
            ],
        )?;
        self.c
            .prepare_cached("DELETE FROM tasks WHERE operation_id = ?1")?
            .execute(params![id])?;
        Ok(paused)
    }

    async fn resume(&mut self, id: &str, available_at: Timestamp, now: Timestamp) -> Result<Operation> {
        let resumed = self.update(
            id,
            "UPDATE OR FAIL operations SET state = 'queued', version = version + 1, updated_at = ?2
              WHERE id = ?1 AND state = 'paused'",
            params![now.0],
        )?;
        self.c
            .prepare_cached(
                "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
                 SELECT id, seq, tenant, kind, 'ready', ?2, priority FROM operations WHERE id = ?1",
            )?
            .execute(params![id, available_at.0])?;
        Ok(resumed)
    }

    async fn pause_request_set(&mut self, id: &str, at: Option<Timestamp>, now: Timestamp) -> Result<Operation> {
        self.update(
            id,
            "UPDATE OR FAIL operations SET pause_requested_at = ?2, version = version + 1, updated_at = ?3
              WHERE id = ?1 AND state IN ('queued', 'running')",
            params![at.map(|t| t.0), now.0],
        )
    }

    async fn deadline_and_labels_set(&mut self, id: &str, change: &UpdateChange, now: Timestamp) -> Result<Operation> {
        let labels = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.update(
            id,
            "UPDATE OR FAIL operations SET deadline_at = ?2, labels = ?3, not_before = ?5, version = version + 1,
                                           updated_at = ?4
              WHERE id = ?1 AND state IN ('queued', 'running')",
            params![
                change.deadline_at.map(|t| t.0),
                labels,
                now.0,
                change.not_before.map(|t| t.0)
            ],
        )
        .and_then(|updated| {
            if let Some(at) = change.available_at {
                self.c
                    .prepare_cached("UPDATE tasks SET available_at = ?2 WHERE operation_id = ?1 AND status = 'ready'")?
                    .execute(params![id, at.0])?;
            }
            Ok(updated)
        })
    }

    async fn lease_renew(&mut self, id: &str, until: Timestamp) -> Result<()> {
        self.c
            .prepare_cached("UPDATE tasks SET lease_expires_at = ?2 WHERE operation_id = ?1")?
            .execute(params![id, until.0])?;
        Ok(())
    }

    async fn checkpoint_save(&mut self, id: &str, checkpoint: &Value) -> Result<()> {
        self.c
            .prepare_cached("UPDATE OR FAIL operations SET checkpoint = ?2 WHERE id = ?1")?
            .execute(params![id, checkpoint.to_string()])?;
        Ok(())
    }

    async fn progress_set(
        &mut self,
        id: &str,
        progress: Option<&Progress>,
        cost_units: f64,
        cancellable: bool,
        now: Timestamp,
    ) -> Result<Operation> {
        self.forget(id);
        update_and_read(
            self.c,
            id,
            "UPDATE OR FAIL operations SET progress = ?2, cost_units = ?3, cancellable = ?4, version = version + 1,
                    updated_at = ?5
              WHERE id = ?1 AND state = 'running'",
            params![progress.map(progress_text), cost_units, cancellable, now.0],
        )?
        .ok_or(StoreError::LeaseLost)
    }

    /// The history goes with the operation whatever the reason: SQLite
    /// has no partitions to drop it later.
    /// Row by row: the statements run in-process.
    async fn operations_release(&mut self, ids: &[&str], now: Timestamp) -> Result<()> {
        for id in ids {
            self.forget(id);
            operation_release(self.c, id, now)?;
        }
        Ok(())
    }

    async fn events_remove(&mut self, ids: &[&str]) -> Result<()> {
        let mut delete = self
            .c
            .prepare_cached("DELETE FROM operation_events WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1)")?;
        for id in ids {
            delete.execute(params![id])?;
        }
        Ok(())
    }

    /// Row by row: the statements run in-process, and two set statements
    /// would have to agree on ties at the limit.
    async fn tombstones_bury(&mut self, now: Timestamp, limit: u32) -> Result<u64> {
        type Buried = (String, String, Option<String>, Option<String>);
        let due: Vec<Buried> = self
            .c
            .prepare_cached(
                "SELECT operation_id, tenant, kind, idempotency_key FROM tombstones WHERE expires_at <= ?1
                  ORDER BY expires_at LIMIT ?2",
            )?
            .query_map(params![now.0, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (id, tenant, kind, key) in &due {
            self.c
                .prepare_cached(
                    "DELETE FROM idempotency_keys WHERE tenant = ?2 AND kind = ?3 AND key = ?4 AND operation_id = ?1",
                )?
                .execute(params![id, tenant, kind, key])?;
            self.c
                .prepare_cached("DELETE FROM tombstones WHERE operation_id = ?1")?
                .execute(params![id])?;
        }
        Ok(due.len() as u64)
    }

    async fn upload_drop(&mut self, id: &str, now: Timestamp) -> Result<()> {
        upload_drop(self.c, id, now)
    }

    async fn rows_delete(&mut self, table: &str, column: &str, and: &str, values: &[&str]) -> Result<u64> {
        let mut delete = self
            .c
            .prepare_cached(&format!("DELETE FROM {table} WHERE {column} = ?1{and}"))?;
        let mut deleted = 0;
        for value in values {
            deleted += delete.execute(params![value])? as u64;
        }
        Ok(deleted)
    }

    async fn events_insert(&mut self, events: &[(&Operation, EventType, Value)]) -> Result<()> {
        for (op, event_type, data) in events {
            event_insert(self.c, op, *event_type, data)?;
        }
        Ok(())
    }

    async fn webhook_queue(&mut self, op: &Operation, webhook: WebhookType) -> Result<()> {
        match crate::shared::delivery_queued(op, webhook) {
            Some(queued) => super::script::run(self.c, &queued),
            None => Ok(()),
        }
    }
}
