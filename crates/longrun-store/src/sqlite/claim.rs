//! Claims: tenants with ready work in fair order, their ready heads under
//! `max_running`, and the lease of each task picked.

use super::*;

/// Tenants with ready work, least recently served first. The recursive
/// query walks the `tasks_ready_by_tenant` index one tenant at a time (a
/// loose index scan), so its cost follows the number of tenants, not tasks.
pub(super) fn tenants_with_ready_work(c: &Connection) -> Result<Vec<(String, Option<i64>, i64)>> {
    let mut stmt = c.prepare_cached(
        "WITH RECURSIVE ready(tenant) AS (
             SELECT MIN(tenant) FROM tasks WHERE status = 'ready'
             UNION ALL
             SELECT (SELECT MIN(tenant) FROM tasks WHERE status = 'ready' AND tenant > ready.tenant)
               FROM ready WHERE ready.tenant IS NOT NULL
         )
         SELECT ready.tenant, t.max_running, COALESCE(d.last_claimed, 0)
           FROM ready
           LEFT JOIN tenants t ON t.name = ready.tenant
           LEFT JOIN tenant_dispatch d ON d.tenant = ready.tenant
          WHERE ready.tenant IS NOT NULL
          ORDER BY COALESCE(d.last_claimed, 0), ready.tenant",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Claims up to `max_tasks` tasks, fairly across tenants: tenants are served
/// round-robin, least recently served first, one task at a time, and a tenant
/// at its `max_running` is skipped. Within a tenant, oldest first.
pub(super) fn task_claim(c: &Connection, policy: WritePolicy, p: &ClaimParams) -> Result<Vec<Task>> {
    if p.kinds.is_empty() || p.max_tasks == 0 {
        return Ok(Vec::new());
    }
    let want = p.max_tasks as usize;
    // Each tenant's oldest claimable tasks of the wanted kinds, up to what it may run.
    let mut queues: Vec<std::collections::VecDeque<(String, String)>> = Vec::new();
    let tenants = tenants_with_ready_work(c)?;
    let record_order = records_served_order(tenants.len());
    for (tenant, max_running, _) in tenants {
        let running: i64 = match max_running {
            None => 0,
            Some(_) => c
                .prepare_cached("SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'leased'")?
                .query_row(params![tenant], |r| r.get(0))?,
        };
        let allowance = claim_allowance(want, max_running, running);
        if allowance == 0 {
            continue;
        }
        // Highest priority first, then earliest available, across kinds:
        // one priority at a time, from the highest, until the allowance is
        // met (work at the default priority costs a seek per empty level
        // above it and one range read).
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
        if !heads.is_empty() {
            queues.push(heads.into_iter().map(|(.., id)| (tenant.clone(), id)).collect());
        }
    }
    let picked = round_robin(queues, want);

    let lease_expires_at = p.now.plus(p.lease);
    let mut tasks = Vec::with_capacity(picked.len());
    let mut served: Vec<String> = Vec::new();
    for (tenant, id) in picked {
        if let Some(task) = lease_task(c, policy, p, &id, lease_expires_at)? {
            tasks.push(task);
            if record_order && !served.contains(&tenant) {
                served.push(tenant);
            }
        }
    }
    for tenant in served {
        c.prepare_cached(
            "INSERT INTO tenant_dispatch (tenant, last_claimed)
             VALUES (?1, (SELECT COALESCE(MAX(last_claimed), 0) + 1 FROM tenant_dispatch))
             ON CONFLICT (tenant) DO UPDATE SET last_claimed = excluded.last_claimed",
        )?
        .execute(params![tenant])?;
    }
    Ok(tasks)
}

/// Leases one ready task; `None` if its deadline passed (it is failed instead).
pub(super) fn lease_task(
    c: &Connection,
    policy: WritePolicy,
    p: &ClaimParams,
    id: &str,
    lease_expires_at: Timestamp,
) -> Result<Option<Task>> {
    let sql = format!("SELECT {OP_COLUMNS}, checkpoint FROM operations WHERE id = ?1");
    let (current, checkpoint): (Operation, Option<String>) = c
        .prepare_cached(&sql)?
        .query_row(params![id], |r| Ok((operation_of(r)?, r.get(OP_COLUMN_COUNT)?)))?;
    if !matches!(current.state, State::Queued | State::Running) {
        return Err(StoreError::NotFound);
    }
    let deadline_at = current.deadline_at;
    if deadline_at.is_some_and(|d| d <= p.now) {
        // A queued operation whose deadline passed is never started.
        let expired = Effect::End(EndRow {
            id: id.to_owned(),
            ending: Ending::failed(deadline_error_before_start()),
            now: p.now,
            guard: Some(current.version),
        });
        block(plan::apply(&mut SqliteDriver::new(c, policy), &[expired], p.now))?;
        return Ok(None);
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
    Ok(Some(Task {
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
