//! PostgreSQL as a driver of the plan layer: each primitive is one
//! statement (or a few) on the transaction's connection. Fetches of shared
//! work lock their rows `FOR UPDATE SKIP LOCKED`, so nodes running the same
//! pass at once split the work instead of waiting for each other.

use std::collections::HashMap;

use super::*;
use crate::plan::{Driver, EndRow, Lock, Tombstone};

/// A transaction, with what it changed so far, as a [`Driver`].
pub(super) struct PgDriver<'c> {
    pub c: &'c mut PgConnection,
    pub ch: &'c mut Changes,
    pub policy: Policy,
}

impl PgDriver<'_> {
    /// `UPDATE … RETURNING` every column of the one operation it matches.
    async fn update(
        &mut self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Operation> {
        update_returning(self.c, query).await?.ok_or(StoreError::NotFound)
    }
}

impl Driver for PgDriver<'_> {
    const SERIAL: bool = false;
    const HISTORY_BY_PARTITION: bool = true;

    async fn script<T>(&mut self, script: &Script<T>) -> Result<T> {
        super::script::run(self.c, script).await
    }

    async fn pieces_drop(
        &mut self,
        operation_id: &str,
        only: Option<(&str, i64)>,
        keep: Option<&str>,
        now: Timestamp,
    ) -> Result<()> {
        pieces_drop(self.c, &[operation_id], only, keep, now).await
    }

    async fn fenced(&mut self, leases: &[(&str, &str)], lock: Lock) -> Result<Vec<Option<Fenced>>> {
        let mut found = fenced_many(self.c, leases, lock).await?;
        Ok(leases
            .iter()
            .map(|(id, token)| found.remove(&((*id).to_owned(), (*token).to_owned())))
            .collect())
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        match lock_operation(self.c, tenant, id).await {
            Ok(op) => Ok(Some(op)),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn task_leased(&mut self, id: &str) -> Result<Option<bool>> {
        sqlx::query_scalar("SELECT status = 'leased' FROM tasks WHERE operation_id = $1")
            .bind(id)
            .fetch_optional(&mut *self.c)
            .await
            .map_err(db)
    }

    /// The operation's row is locked first (`operation_locked`), as a cancel
    /// locks it, so the two take turns. A claim locks the task row first
    /// and the operation's after: its task is taken with `NOWAIT`, and a
    /// claim in progress means the work is being started — held by a
    /// worker — instead of a deadlock.
    async fn intent_holder(&mut self, op: &Operation) -> Result<Holder> {
        let pausable: bool = sqlx::query_scalar("SELECT COALESCE((SELECT pausable FROM kinds WHERE name = $1), FALSE)")
            .bind(&op.kind)
            .fetch_one(&mut *self.c)
            .await
            .map_err(db)?;
        // A lock not granted aborts the transaction, up to this savepoint.
        sqlx::query("SAVEPOINT task_lock")
            .execute(&mut *self.c)
            .await
            .map_err(db)?;
        let status: Option<String> =
            match sqlx::query_scalar("SELECT status FROM tasks WHERE operation_id = $1 FOR UPDATE NOWAIT")
                .bind(op.id.as_str())
                .fetch_optional(&mut *self.c)
                .await
            {
                Ok(status) => status,
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    sqlx::query("ROLLBACK TO SAVEPOINT task_lock")
                        .execute(&mut *self.c)
                        .await
                        .map_err(db)?;
                    Some("leased".into())
                }
                Err(e) => return Err(db(e)),
            };
        Ok(Holder {
            leased: status.as_deref() == Some("leased"),
            pausable,
        })
    }

    async fn operations_end(&mut self, ends: &[&EndRow]) -> Result<HashMap<String, Operation>> {
        operations_end(self.c, self.policy, ends).await
    }

    async fn cancel_request(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<Operation> {
        let sql = format!(
            "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4,
                    version = version + 1, updated_at = $2
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        self.update(sqlx::query(&sql).bind(id).bind(now.0).bind(by).bind(reason))
            .await
    }

    async fn cancel_record(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<()> {
        sqlx::query(
            "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(now.0)
        .bind(by)
        .bind(reason)
        .execute(&mut *self.c)
        .await
        .map_err(db)?;
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
        sqlx::query(
            "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL,
                    available_at = $2
              WHERE operation_id = $1",
        )
        .bind(id)
        .bind(available_at.0)
        .execute(&mut *self.c)
        .await
        .map_err(db)?;
        let sql = format!(
            "UPDATE operations SET attempt = $2, version = version + 1, updated_at = $3,
                    progress = COALESCE($4, progress)
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        let progress = progress.map(progress_text);
        self.update(sqlx::query(&sql).bind(id).bind(next_attempt).bind(now.0).bind(progress))
            .await
    }

    async fn pause(
        &mut self,
        id: &str,
        attempt: Option<i64>,
        progress: Option<&Progress>,
        checkpoint: Option<&Value>,
        now: Timestamp,
    ) -> Result<Operation> {
        let sql = format!(
            "UPDATE operations SET state = 'paused', version = version + 1, updated_at = $2,
                    attempt = COALESCE($3, attempt), progress = COALESCE($4, progress),
                    checkpoint = COALESCE($5, checkpoint), pause_requested_at = NULL
              WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
        );
        let query = sqlx::query(&sql)
            .bind(id)
            .bind(now.0)
            .bind(attempt)
            .bind(progress.map(progress_text))
            .bind(checkpoint.map(Value::to_string));
        let paused = self.update(query).await?;
        sqlx::query("DELETE FROM tasks WHERE operation_id = $1")
            .bind(id)
            .execute(&mut *self.c)
            .await
            .map_err(db)?;
        Ok(paused)
    }

    async fn resume(&mut self, id: &str, available_at: Timestamp, now: Timestamp) -> Result<Operation> {
        let sql = format!(
            "UPDATE operations SET state = 'queued', version = version + 1, updated_at = $2
              WHERE id = $1 AND state = 'paused' RETURNING {OP_COLUMNS}"
        );
        let resumed = self.update(sqlx::query(&sql).bind(id).bind(now.0)).await?;
        sqlx::query(
            "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
             SELECT id, seq, tenant, kind, 'ready', $2, priority FROM operations WHERE id = $1",
        )
        .bind(id)
        .bind(available_at.0)
        .execute(&mut *self.c)
        .await
        .map_err(db)?;
        Ok(resumed)
    }

    async fn pause_request_set(&mut self, id: &str, at: Option<Timestamp>, now: Timestamp) -> Result<Operation> {
        let sql = format!(
            "UPDATE operations SET pause_requested_at = $2, version = version + 1, updated_at = $3
              WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
        );
        self.update(sqlx::query(&sql).bind(id).bind(at.map(|t| t.0)).bind(now.0))
            .await
    }

    async fn deadline_and_labels_set(&mut self, id: &str, change: &UpdateChange, now: Timestamp) -> Result<Operation> {
        let labels = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let sql = format!(
            "UPDATE operations SET deadline_at = $2, labels = $3, not_before = $5, version = version + 1, updated_at = $4
              WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
        );
        let query = sqlx::query(&sql)
            .bind(id)
            .bind(change.deadline_at.map(|t| t.0))
            .bind(labels)
            .bind(now.0)
            .bind(change.not_before.map(|t| t.0));
        let updated = self.update(query).await?;
        if let Some(at) = change.available_at {
            sqlx::query("UPDATE tasks SET available_at = $2 WHERE operation_id = $1 AND status = 'ready'")
                .bind(id)
                .bind(at.0)
                .execute(&mut *self.c)
                .await
                .map_err(db)?;
        }
        Ok(updated)
    }

    async fn lease_renew(&mut self, id: &str, until: Timestamp) -> Result<()> {
        sqlx::query("UPDATE tasks SET lease_expires_at = $2 WHERE operation_id = $1")
            .bind(id)
            .bind(until.0)
            .execute(&mut *self.c)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn checkpoint_save(&mut self, id: &str, checkpoint: &Value) -> Result<()> {
        sqlx::query("UPDATE operations SET checkpoint = $2 WHERE id = $1")
            .bind(id)
            .bind(checkpoint.to_string())
            .execute(&mut *self.c)
            .await
            .map_err(db)?;
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
        let sql = format!(
            "UPDATE operations SET progress = $2, cost_units = $3, cancellable = $4, version = version + 1,
                    updated_at = $5
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        let query = sqlx::query(&sql)
            .bind(id)
            .bind(progress.map(progress_text))
            .bind(cost_units)
            .bind(cancellable)
            .bind(now.0);
        update_returning(self.c, query).await?.ok_or(StoreError::LeaseLost)
    }

    async fn operations_release(&mut self, ids: &[&str], now: Timestamp) -> Result<()> {
        operations_release(self.c, self.ch, ids, now).await
    }

    async fn events_remove(&mut self, ids: &[&str]) -> Result<()> {
        events_remove(self.c, ids).await
    }

    async fn tombstones_set(&mut self, tombstones: &[Tombstone]) -> Result<()> {
        tombstones_set(self.c, tombstones).await
    }

    /// One statement: the due tombstones (locked, skipping what another
    /// node buries), then the idempotency records they kept.
    async fn tombstones_bury(&mut self, now: Timestamp, limit: u32) -> Result<u64> {
        let buried: i64 = sqlx::query_scalar(
            "WITH buried AS (
                 DELETE FROM tombstones WHERE operation_id IN (
                     SELECT operation_id FROM tombstones WHERE expires_at <= $1
                      ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
                 RETURNING operation_id, tenant, kind, idempotency_key),
             freed AS (
                 DELETE FROM idempotency_keys k USING buried b
                  WHERE k.tenant = b.tenant AND k.kind = b.kind AND k.key = b.idempotency_key
                    AND k.operation_id = b.operation_id)
             SELECT count(*) FROM buried",
        )
        .bind(now.0)
        .bind(i64::from(limit))
        .fetch_one(&mut *self.c)
        .await
        .map_err(db)?;
        Ok(u64::try_from(buried).unwrap_or(0))
    }

    async fn upload_drop(&mut self, id: &str, now: Timestamp) -> Result<()> {
        upload_drop(self.c, id, now).await
    }

    async fn rows_delete(&mut self, table: &str, column: &str, and: &str, values: &[&str]) -> Result<u64> {
        let sql = format!("DELETE FROM {table} WHERE {column} = ANY($1){and}");
        Ok(sqlx::query(&sql)
            .bind(values)
            .execute(&mut *self.c)
            .await
            .map_err(db)?
            .rows_affected())
    }

    async fn events_insert(&mut self, events: &[(&Operation, EventType, Value)]) -> Result<()> {
        events_insert(self.c, self.ch, events).await
    }

    async fn webhook_queue(&mut self, op: &Operation, webhook: WebhookType) -> Result<()> {
        match crate::shared::delivery_queued(op, webhook) {
            Some(queued) => super::script::run(self.c, &queued).await,
            None => Ok(()),
        }
    }
}
