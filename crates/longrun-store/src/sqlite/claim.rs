//! Claims: tenants with ready work in fair order, their ready heads under
//! `max_running`, and the lease of each task picked.

use std::collections::VecDeque;

use super::*;
use crate::plan::claim::{Leased, ReadyTenant, too_late_to_start};

/// A claim (`plan::claim`) on the writer thread (`plan::claim`).
pub(super) fn task_claim(c: &Connection, policy: WritePolicy, p: &ClaimParams) -> Result<Vec<Task>> {
    block(plan::claim::task_claim(&mut SqliteDriver::new(c, policy), p))
}

/// Tenants with ready work, least recently served first. The recursive
/// query walks the `tasks_ready_by_tenant` index one tenant at a time (a
/// loose index scan), so its cost follows the number of tenants, not tasks.
/// Their heads are read after (`ready_heads`), under their caps.
pub(super) fn tenants_with_ready_work(c: &Connection) -> Result<Vec<ReadyTenant<String>>> {
    let mut stmt = c.prepare_cached(
        "WITH RECURSIVE ready(tenant) AS (
             SELECT MIN(tenant) FROM tasks WHERE status = 'ready'
             UNION ALL
             SELECT (SELECT MIN(tenant) FROM tasks WHERE status = 'ready' AND tenant > ready.tenant)
               FROM ready WHERE ready.tenant IS NOT NULL
         )
         SELECT ready.tenant, t.max_running
           FROM ready
           LEFT JOIN tenants t ON t.name = ready.tenant
           LEFT JOIN tenant_dispatch d ON d.tenant = ready.tenant
          WHERE ready.tenant IS NOT NULL
          ORDER BY COALESCE(d.last_claimed, 0), ready.tenant",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(ReadyTenant {
            tenant: r.get(0)?,
            max_running: r.get(1)?,
            picked: None,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The tenant's leased tasks (the writer is the only one to lease).
pub(super) fn tasks_running(c: &Connection, tenant: &str) -> Result<i64> {
    Ok(
        c.prepare_cached("SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'leased'")?
            .query_row(params![tenant], |r| r.get(0))?,
    )
}

/// Up to `allowance` of the tenant's ready tasks (their operations' ids),
/// highest priority first, then earliest available, across kinds: one
/// priority at a time, from the highest, until the allowance is met (work
/// at the default priority costs a seek per empty level above it and one
/// range read).
pub(super) fn ready_heads(c: &Connection, p: &ClaimParams, tenant: &str, allowance: usize) -> Result<VecDeque<String>> {
    let mut heads: Vec<(std::cmp::Reverse<i16>, i64, i64, String)> = Vec::new();
    let mut stmt = c.prepare_cached(READY_HEADS)?;
    for priority in (PRIORITY_MIN..=PRIORITY_MAX).rev() {
        let wanted = allowance - heads.len();
        for kind in &p.kinds {
            let rows = stmt.query_map(params![tenant, kind, p.now.0, priority, wanted as i64], |r| {
                Ok((std::cmp::Reverse(priority), r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
            for row in rows {
                heads.push(row?);
            }
        }
        if heads.len() >= allowance {
            break;
        }
    }
    heads.sort();
    heads.truncate(allowance);
    Ok(heads.into_iter().map(|(.., id)| id).collect())
}

/// Leases the picked tasks one by one, but those whose deadline passed
/// (read with their operations), which it hands back for the claim to end.
pub(super) fn lease(c: &Connection, p: &ClaimParams, picked: Vec<String>) -> Result<Leased> {
    let lease_expires_at = p.now.plus(p.lease);
    let mut leased = Leased {
        tasks: Vec::with_capacity(picked.len()),
        expired: Vec::new(),
    };
    for id in picked {
        match lease_task(c, p, &id, lease_expires_at)? {
            Ok(task) => leased.tasks.push(task),
            Err(version) => leased.expired.push((id, Some(version))),
        }
    }
    Ok(leased)
}

/// Records the order the tenants were served in.
pub(super) fn tenants_served(c: &Connection, tenants: &[&str]) -> Result<()> {
    let mut stmt = c.prepare_cached(
        "INSERT INTO tenant_dispatch (tenant, last_claimed)
         VALUES (?1, (SELECT COALESCE(MAX(last_claimed), 0) + 1 FROM tenant_dispatch))
         ON CONFLICT (tenant) DO UPDATE SET last_claimed = excluded.last_claimed",
    )?;
    for tenant in tenants {
        stmt.execute(params![tenant])?;
    }
    Ok(())
}

/// Leases one ready task, or, if its operation's deadline passed, leaves
/// it and answers the version it read (the claim fails it instead).
fn lease_task(
    c: &Connection,
    p: &ClaimParams,
    id: &str,
    lease_expires_at: Timestamp,
) -> Result<std::result::Result<Task, i64>> {
    let sql = format!("SELECT {OP_COLUMNS}, checkpoint FROM operations WHERE id = ?1");
    let (current, checkpoint): (Operation, Option<String>) = c
        .prepare_cached(&sql)?
        .query_row(params![id], |r| Ok((operation_of(r)?, r.get(OP_COLUMN_COUNT)?)))?;
    if !matches!(current.state, State::Queued | State::Running) {
        return Err(StoreError::NotFound);
    }
    let deadline_at = current.deadline_at;
    if too_late_to_start(deadline_at, p.now) {
        return Ok(Err(current.version));
    }
    let was_queued = current.state == State::Queued;
    let token = random_base32::<16>();
    c.prepare_cached(
        "UPDATE tasks SET status = 'leased', lease_token = ?2, lease_expires_at = ?3, worker_id = ?4, lease_ms = ?5
          WHERE operation_id = ?1 AND status = 'ready'",
    )?
    .execute(params![id, token, lease_expires_at.0, p.worker_id, lease_ms(p.lease)])?;
    // The started row is `started`'s, written as is (at the version read),
    // so it is not read back.
    let read_at = current.version;
    let started = crate::shared::started(current, p.now);
    let changed = c
        .prepare_cached(
            "UPDATE OR FAIL operations SET state = 'running', attempt = ?2, started_at = ?3, version = ?4, updated_at = ?5
              WHERE id = ?1 AND version = ?6",
        )?
        .execute(params![
            id,
            started.attempt,
            started.started_at.map(|t| t.0),
            started.version,
            p.now.0,
            read_at
        ])?;
    if changed == 0 {
        return Err(StoreError::NotFound);
    }
    let data = started_data(&started, &p.worker_id);
    event_insert(c, &started, EventType::Started, &data)?;
    if let Some(queued) = start_delivery_queued(&started, was_queued) {
        super::script::run(c, &queued)?;
    }
    Ok(Ok(Task {
        operation_id: started.id,
        tenant: started.tenant,
        kind: started.kind,
        input: started.input.unwrap_or(Value::Null),
        attempt: started.attempt,
        lease_token: token,
        lease_expires_at,
        deadline_at,
        budget_max_cost: started.budget_max_cost,
        checkpoint: checkpoint.and_then(|text| serde_json::from_str(&text).ok()),
    }))
}

/// Up to `?5` of a tenant's ready tasks of one kind (`?2`) at one priority
/// (`?4`) available at `?3`, earliest available first: one range of
/// `tasks_ready_by_tenant` read from its head up to `?3`, so tasks waiting
/// for a later start are never read, however many; a priority with no
/// ready task costs one seek. SQLite re-prepares it when a bound value
/// changes (an ORDER BY next to columns held equal to parameters is planned
/// for their values; the per-task statements are not), which costs little
/// for a statement this small; nine priorities in one UNION ALL cost 12 %
/// of the SQLite drain.
pub(super) const READY_HEADS: &str = "SELECT available_at, seq, operation_id FROM tasks
  WHERE status = 'ready' AND tenant = ?1 AND kind = ?2 AND priority = ?4 AND available_at <= ?3
  ORDER BY available_at, seq LIMIT ?5";
