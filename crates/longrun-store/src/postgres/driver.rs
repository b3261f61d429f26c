//! PostgreSQL as a driver of the plan layer: each primitive is one
//! statement (or a few) on the transaction's connection. Fetches of shared
//! work lock their rows `FOR UPDATE SKIP LOCKED`, so nodes running the same
//! pass at once split the work instead of waiting for each other.

use longrun_core::Timestamp;
use serde_json::Value;
use sqlx::{PgConnection, Row};

use super::{Changes, OP_COLUMNS, db, event_insert, operations_end, rows_of, state_of, update_returning};
use crate::plan::{Driver, EventType, OverdueWaiting, PauseRequested, Policy, StopRequested};
use crate::shared::{Ending, UpdateChange};
use crate::{Id, Operation, Result, StoreError};

/// A transaction, with what it changed so far, as a [`Driver`].
pub(super) struct PgDriver<'c> {
    pub c: &'c mut PgConnection,
    pub ch: &'c mut Changes,
    pub policy: Policy,
}

impl Driver for PgDriver<'_> {
    async fn overdue_waiting(&mut self, now: Timestamp, limit: u32) -> Result<Vec<OverdueWaiting>> {
        let rows = rows_of(
            self.c,
            "SELECT o.id, o.state FROM operations o JOIN tasks t ON t.operation_id = o.id
              WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= $1 AND o.state IN ('queued', 'running')
                AND t.status = 'ready'
              ORDER BY o.deadline_at LIMIT $2 FOR UPDATE OF o, t SKIP LOCKED",
            now.0,
            i64::from(limit),
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OverdueWaiting {
                    id: r.try_get(0).map_err(db)?,
                    state: state_of(&r.try_get::<String, _>(1).map_err(db)?)?,
                })
            })
            .collect()
    }

    async fn overdue_running(&mut self, now: Timestamp, limit: u32) -> Result<Vec<String>> {
        let rows = rows_of(
            self.c,
            "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
              WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= $1 AND o.state IN ('queued', 'running')
                AND t.status = 'leased' AND o.cancel_requested_at IS NULL AND o.cancellable
              ORDER BY o.deadline_at LIMIT $2 FOR UPDATE OF o, t SKIP LOCKED",
            now.0,
            i64::from(limit),
        )
        .await?;
        rows.iter().map(|r| r.try_get(0).map_err(db)).collect()
    }

    async fn stops_unacknowledged(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<StopRequested>> {
        let rows = rows_of(
            self.c,
            "SELECT id, cancel_reason FROM operations
              WHERE state = 'running' AND cancel_requested_by = 'system' AND cancel_requested_at <= $1
              ORDER BY cancel_requested_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            cutoff.0,
            i64::from(limit),
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StopRequested {
                    id: r.try_get(0).map_err(db)?,
                    reason: r.try_get(1).map_err(db)?,
                })
            })
            .collect()
    }

    async fn pauses_unanswered(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<PauseRequested>> {
        let rows = rows_of(
            self.c,
            "SELECT id, pause_requested_at FROM operations
              WHERE state = 'running' AND pause_requested_at <= $1
              ORDER BY pause_requested_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            cutoff.0,
            i64::from(limit),
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(PauseRequested {
                    id: r.try_get(0).map_err(db)?,
                    requested_at: Timestamp(r.try_get(1).map_err(db)?),
                })
            })
            .collect()
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        match super::lock_operation(self.c, tenant, id).await {
            Ok(op) => Ok(Some(op)),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn operations_end(&mut self, ends: &[(&str, &Ending)], now: Timestamp) -> Result<()> {
        let batch: Vec<(&str, &Ending, Timestamp)> = ends.iter().map(|(id, e)| (*id, *e, now)).collect();
        let ended = operations_end(self.c, self.ch, self.policy, &batch).await?;
        if ended.len() < ends.len() {
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }

    async fn cancel_request(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<()> {
        super::cancel_request(self.c, self.ch, id, by, reason, now)
            .await
            .map(|_| ())
    }

    async fn pause_request_clear(&mut self, id: &str, now: Timestamp) -> Result<Operation> {
        let sql = format!(
            "UPDATE operations SET pause_requested_at = NULL, version = version + 1, updated_at = $2
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        update_returning(self.c, sqlx::query(&sql).bind(id).bind(now.0))
            .await?
            .ok_or(StoreError::NotFound)
    }

    async fn deadline_and_labels_set(&mut self, id: &str, change: &UpdateChange, now: Timestamp) -> Result<Operation> {
        let labels = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let sql = format!(
            "UPDATE operations SET deadline_at = $2, labels = $3, version = version + 1, updated_at = $4
              WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
        );
        let query = sqlx::query(&sql)
            .bind(id)
            .bind(change.deadline_at.map(|t| t.0))
            .bind(labels)
            .bind(now.0);
        update_returning(self.c, query).await?.ok_or(StoreError::NotFound)
    }

    async fn event_insert(&mut self, op: &Operation, event_type: EventType, data: &Value) -> Result<()> {
        event_insert(self.c, self.ch, op, event_type, data).await
    }
}
