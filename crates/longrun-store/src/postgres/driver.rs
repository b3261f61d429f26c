//! PostgreSQL as a driver of the plan layer: each primitive is one
//! statement (or a few) on the transaction's connection. Fetches of shared
//! work lock their rows `FOR UPDATE SKIP LOCKED`, so nodes running the same
//! pass at once split the work instead of waiting for each other.

use std::collections::{HashMap, VecDeque};

use super::*;
use crate::plan::claim::{Leased, ReadyTenant};
use crate::plan::{Driver, EndRow, Lock, Tombstone};

/// A transaction, with what it changed so far, as a [`Driver`].
pub(super) struct PgDriver<'c> {
    pub c: &'c mut PgConnection,
    pub ch: &'c mut Changes,
    pub policy: Policy,
}

impl Driver for PgDriver<'_> {
    const SERIAL: bool = false;
    const HISTORY_BY_PARTITION: bool = true;
    type Picked = Picked;

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

    async fn tenants_with_ready_work(&mut self, p: &ClaimParams) -> Result<Vec<ReadyTenant<Picked>>> {
        tenants_with_ready_work(self.c, p).await
    }

    async fn tasks_running(&mut self, tenant: &str) -> Result<i64> {
        tasks_running(self.c, tenant).await
    }

    async fn ready_heads(&mut self, p: &ClaimParams, tenant: &str, allowance: usize) -> Result<VecDeque<Picked>> {
        pick_ready(self.c, p, tenant, allowance).await
    }

    async fn lease(&mut self, p: &ClaimParams, picked: Vec<Picked>) -> Result<Leased> {
        lease(self.c, self.ch, p, picked).await
    }

    async fn tenants_served(&mut self, tenants: &[&str]) -> Result<()> {
        tenants_served(self.c, tenants).await
    }

    /// Only the default partitions' (schema 19): a finished delivery in a
    /// day's partition goes with its day (`deliveries.rs`).
    async fn deliveries_finished(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT event_id FROM webhook_deliveries_default WHERE status <> 'pending' AND created_at <= $1
              ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(cutoff.0)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.c)
        .await
        .map_err(db)
    }

    async fn operation(&mut self, id: &str) -> Result<Option<Operation>> {
        operation_by_id(self.c, id).await
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        match lock_operation(self.c, tenant, id).await {
            Ok(op) => Ok(Some(op)),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
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

    async fn results_publish(
        &mut self,
        ended: &[(&str, Timestamp)],
    ) -> Result<Vec<(String, Vec<(String, ArtifactRef)>)>> {
        results_publish(self.c, self.policy, ended).await
    }

    async fn results_discard(&mut self, ids: &[&str], now: Timestamp) -> Result<()> {
        results_discard(self.c, ids, now).await
    }

    async fn operation_update(&mut self, stmt: &Stmt) -> Result<Option<Operation>> {
        let sql = format!("{} RETURNING {OP_COLUMNS}", pg(stmt.sql));
        let query = stmt.args.iter().fold(sqlx::query(&sql), super::script::bind);
        update_returning(self.c, query).await
    }

    async fn operations_release(&mut self, ids: &[&str], now: Timestamp) -> Result<()> {
        operations_release(self.c, self.ch, ids, now).await
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
}

#[cfg(test)]
mod tests {
    use super::super::{explain, migrated_connection};
    use super::*;
    use crate::plan::fetches::{overdue_running, overdue_waiting, pauses_unanswered, stops_unacknowledged};
    use crate::shared::kind_typical_duration;

    /// Schema 18 keyed the partial indexes of live work by `rest_state`:
    /// the enforcer's searches (the plan's fetches, `plan/fetches.rs`,
    /// which this driver runs as written) and the kind's typical duration
    /// still read
    /// them (each names the predicate PostgreSQL must prove), never every
    /// stored operation. Seq scans are off so that the plans of these
    /// near-empty tables are the ones a full store gets.
    #[tokio::test]
    async fn the_searches_of_live_work_read_their_partial_indexes() {
        let Some(mut c) = migrated_connection().await else {
            return;
        };
        sqlx::query("SET enable_seqscan = off").execute(&mut c).await.unwrap();
        let now = Timestamp(1_800_000_000_000);
        let searches = [
            (overdue_waiting(now, 10).stmts, "operations_live_deadline"),
            (overdue_running(now, 10).stmts, "operations_live_deadline"),
            (stops_unacknowledged(now, 10).stmts, "operations_system_cancel"),
            (pauses_unanswered(now, 10).stmts, "operations_pause_asked"),
            (kind_typical_duration("k").stmts, "operations_succeeded_by_kind"),
        ];
        for (stmts, index) in searches {
            let plan = explain(&mut c, &stmts[0]).await;
            assert!(plan.contains(index), "{}\n{plan}", stmts[0].sql);
            assert!(!plan.contains("Seq Scan on operations"), "{}\n{plan}", stmts[0].sql);
        }
    }
}
