//! SQLite as a driver of the plan layer: each primitive runs its statements
//! at once on the writer thread's connection, inside the writer's group
//! commit, so a use case's future never waits and [`block`] drives it to
//! completion in one poll.

use std::future::Future;

use futures_util::FutureExt as _;
use longrun_core::Timestamp;
use rusqlite::{Connection, params};
use serde_json::Value;

use super::*;
use crate::plan::{Driver, EventType};
use crate::plan::{OverdueWaiting, PauseRequested, StopRequested};
use crate::shared::{Ending, UpdateChange};
use crate::{Id, Operation, Result, StoreError};

/// The writer thread's connection, as a [`Driver`].
pub(super) struct SqliteDriver<'c> {
    pub c: &'c Connection,
    pub policy: WritePolicy,
}

/// Runs a use case on the writer thread: every statement of the SQLite
/// driver completes before its future returns, so one poll finishes it.
pub(super) fn block<T>(use_case: impl Future<Output = Result<T>>) -> Result<T> {
    use_case
        .now_or_never()
        .expect("the SQLite driver runs every statement at once, never waiting")
}

impl Driver for SqliteDriver<'_> {
    async fn overdue_waiting(&mut self, now: Timestamp, limit: u32) -> Result<Vec<OverdueWaiting>> {
        let rows = self
            .c
            .prepare_cached(
                "SELECT o.id, o.state FROM operations o JOIN tasks t ON t.operation_id = o.id
                  WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1 AND o.state IN ('queued', 'running')
                    AND t.status = 'ready'
                  ORDER BY o.deadline_at LIMIT ?2",
            )?
            .query_map(params![now.0, limit], |r| {
                Ok(OverdueWaiting {
                    id: r.get(0)?,
                    state: state_column(r, 1)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    async fn overdue_running(&mut self, now: Timestamp, limit: u32) -> Result<Vec<String>> {
        let ids = self
            .c
            .prepare_cached(
                "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
                  WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1 AND o.state IN ('queued', 'running')
                    AND t.status = 'leased' AND o.cancel_requested_at IS NULL AND o.cancellable = 1
                  ORDER BY o.deadline_at LIMIT ?2",
            )?
            .query_map(params![now.0, limit], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    }

    async fn stops_unacknowledged(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<StopRequested>> {
        let rows = self
            .c
            .prepare_cached(
                "SELECT id, cancel_reason FROM operations
                  WHERE state = 'running' AND cancel_requested_by = 'system' AND cancel_requested_at <= ?1
                  ORDER BY cancel_requested_at LIMIT ?2",
            )?
            .query_map(params![cutoff.0, limit], |r| {
                Ok(StopRequested {
                    id: r.get(0)?,
                    reason: r.get(1)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    async fn pauses_unanswered(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<PauseRequested>> {
        let rows = self
            .c
            .prepare_cached(
                "SELECT id, pause_requested_at FROM operations
                  WHERE state = 'running' AND pause_requested_at <= ?1
                  ORDER BY pause_requested_at LIMIT ?2",
            )?
            .query_map(params![cutoff.0, limit], |r| {
                Ok(PauseRequested {
                    id: r.get(0)?,
                    requested_at: Timestamp(r.get(1)?),
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        // The writer thread is the only writer: a row read in its job stays
        // as read until the job ends.
        operation_get(self.c, tenant, id)
    }

    async fn operations_end(&mut self, ends: &[(&str, &Ending)], now: Timestamp) -> Result<()> {
        for (id, ending) in ends {
            operation_end(self.c, self.policy, id, ending, now)?;
        }
        Ok(())
    }

    async fn cancel_request(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<()> {
        cancel_request(self.c, id, by, reason, now).map(|_| ())
    }

    async fn pause_request_clear(&mut self, id: &str, now: Timestamp) -> Result<Operation> {
        update_and_read(
            self.c,
            id,
            "UPDATE OR FAIL operations SET pause_requested_at = NULL, version = version + 1, updated_at = ?2
              WHERE id = ?1 AND state = 'running'",
            params![now.0],
        )?
        .ok_or(StoreError::NotFound)
    }

    async fn deadline_and_labels_set(&mut self, id: &str, change: &UpdateChange, now: Timestamp) -> Result<Operation> {
        let labels = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        update_and_read(
            self.c,
            id,
            "UPDATE OR FAIL operations SET deadline_at = ?2, labels = ?3, version = version + 1, updated_at = ?4
              WHERE id = ?1 AND state IN ('queued', 'running')",
            params![change.deadline_at.map(|t| t.0), labels, now.0],
        )?
        .ok_or(StoreError::NotFound)
    }

    async fn event_insert(&mut self, op: &Operation, event_type: EventType, data: &Value) -> Result<()> {
        event_insert(self.c, op, event_type, data)
    }
}
