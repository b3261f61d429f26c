//! SQLite as a driver of the plan layer: each primitive runs its statements
//! at once on the writer thread's connection, inside the writer's group
//! commit, so a use case's future never waits and [`block`] drives it to
//! completion in one poll.

use std::collections::{HashMap, VecDeque};
use std::future::Future;

use futures_util::FutureExt as _;

use super::*;
use crate::plan::claim::{Leased, ReadyTenant};
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
    type Picked = String;

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

    async fn tenants_with_ready_work(&mut self, _p: &ClaimParams) -> Result<Vec<ReadyTenant<String>>> {
        tenants_with_ready_work(self.c)
    }

    async fn tasks_running(&mut self, tenant: &str) -> Result<i64> {
        tasks_running(self.c, tenant)
    }

    async fn ready_heads(&mut self, p: &ClaimParams, tenant: &str, allowance: usize) -> Result<VecDeque<String>> {
        ready_heads(self.c, p, tenant, allowance)
    }

    async fn lease(&mut self, p: &ClaimParams, picked: Vec<String>) -> Result<Leased> {
        // A lease writes operations' rows: none stays as `fenced` read it.
        self.read.clear();
        lease(self.c, p, picked)
    }

    async fn tenants_served(&mut self, tenants: &[&str]) -> Result<()> {
        tenants_served(self.c, tenants)
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

    async fn operation(&mut self, id: &str) -> Result<Option<Operation>> {
        operation_by_id(self.c, id)
    }

    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        operation_get(self.c, tenant, id)
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

    async fn results_publish(
        &mut self,
        ended: &[(&str, Timestamp)],
    ) -> Result<Vec<(String, Vec<(String, ArtifactRef)>)>> {
        let mut published = Vec::new();
        for (id, at) in ended {
            let artifacts = result_publish(self.c, self.policy, id, *at)?;
            if !artifacts.is_empty() {
                published.push(((*id).to_owned(), artifacts));
            }
        }
        Ok(published)
    }

    async fn results_discard(&mut self, ids: &[&str], now: Timestamp) -> Result<()> {
        for id in ids {
            result_discard(self.c, id, now)?;
        }
        Ok(())
    }

    /// Read back by id rather than with `RETURNING`: SQLite gathers
    /// returned rows in an ephemeral table, and opening and closing one (a
    /// pager and page cache of its own) cost more than the indexed read — a
    /// profile of the in-process drain put ~6 % of the writer there.
    async fn operation_update(&mut self, stmt: &Stmt) -> Result<Option<Operation>> {
        let Some(Val::Text(id)) = stmt.args.first() else {
            return Err(StoreError::Corrupt("an update of an operation names it first".into()));
        };
        self.forget(id);
        let mut update = self.c.prepare_cached(&sqlite_sql(stmt.sql))?;
        if update.execute(rusqlite::params_from_iter(stmt.args.iter()))? == 0 {
            return Ok(None);
        }
        operation_by_id(self.c, id)
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
}
