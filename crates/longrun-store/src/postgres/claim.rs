//! Claims: tenants with ready work in fair order, their ready heads under
//! `max_running`, and the lease of what was picked, `FOR UPDATE SKIP LOCKED`.

use std::collections::VecDeque;

use super::*;
use crate::plan::claim::{Leased, ReadyTenant, too_late_to_start};

/// Up to `$3` of one tenant's (`TENANT`'s) ready tasks of the claimed kinds
/// (`$1`) available at `$2`, highest priority first, then earliest
/// available, locked. Each kind and priority is read from the head of its
/// own index range up to `$2` (a claim reads about as many rows as it
/// takes, however many are queued, and never the tasks waiting for a later
/// start), then the first across them are taken. The nine priorities are
/// nine index probes per kind; a priority with no ready task costs one. Rows other claimers hold are skipped, not waited for; the few
/// extra rows locked are released at commit. The row's `ctid` is what
/// `lease_tasks` updates it by: stable while the row is locked, and a plan
/// that cannot turn into a scan of the table (keyed by `operation_id =
/// ANY(…)`, the planner read every queued task to lease 64). The picked
/// rows' operations are looked up one by one (a LATERAL with a LIMIT is
/// never turned into a join): the generic plan, the LIMIT unknown, had
/// hash-joined every stored operation.
macro_rules! pick_ready_sql {
    ($tenant:literal) => {
        concat!(
            "SELECT p.operation_id, p.ctid::TEXT AS ctid, o.deadline_at, o.state = 'queued' AS was_queued,
                    p.priority, p.available_at, p.seq
               FROM (SELECT t.operation_id, t.seq, t.ctid, t.priority, t.available_at
                       FROM unnest($1::TEXT[]) AS k(kind)
                      CROSS JOIN generate_series(9, 1, -1) AS l(priority)
                      CROSS JOIN LATERAL (
                            SELECT operation_id, seq, ctid, priority, available_at FROM tasks
                             WHERE status = 'ready' AND tenant = ",
            $tenant,
            " AND kind = k.kind AND priority = l.priority AND available_at <= $2
                             ORDER BY available_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED) t
                      ORDER BY t.priority DESC, t.available_at, t.seq LIMIT $3) p
              CROSS JOIN LATERAL (SELECT deadline_at, state FROM operations WHERE id = p.operation_id LIMIT 1) o"
        )
    };
}

/// The tenants with ready work, least recently served first, each with
/// up to `max_tasks` of its ready tasks picked and locked (`pick_ready_sql`)
/// unless it is capped: one round trip for what had taken one for the
/// tenants and one per tenant.
pub(super) async fn tenants_with_ready_work(c: &mut PgConnection, p: &ClaimParams) -> Result<Vec<ReadyTenant<Picked>>> {
    // A capped tenant's rows are not read here (the one-time filter on
    // `max_running`): they are picked after its cap was checked.
    let rows = sqlx::query(concat!(
        "WITH RECURSIVE ready(tenant) AS (
             SELECT MIN(tenant) FROM tasks WHERE status = 'ready'
             UNION ALL
             SELECT (SELECT MIN(tenant) FROM tasks WHERE status = 'ready' AND tenant > ready.tenant)
               FROM ready WHERE ready.tenant IS NOT NULL
         ), served AS (
             SELECT ready.tenant, t.max_running, COALESCE(d.last_claimed, 0) AS last_claimed
               FROM ready
               LEFT JOIN tenants t ON t.name = ready.tenant
               LEFT JOIN tenant_dispatch d ON d.tenant = ready.tenant
              WHERE ready.tenant IS NOT NULL
         )
         SELECT s.tenant, s.max_running, picked.operation_id, picked.ctid, picked.deadline_at, picked.was_queued
           FROM served s
           LEFT JOIN LATERAL (",
        pick_ready_sql!("s.tenant"),
        ") picked ON s.max_running IS NULL
          ORDER BY s.last_claimed, s.tenant, picked.priority DESC, picked.available_at, picked.seq"
    ))
    .bind(&p.kinds)
    .bind(p.now.0)
    .bind(i64::from(p.max_tasks))
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut tenants: Vec<ReadyTenant<Picked>> = Vec::new();
    for r in &rows {
        let tenant: String = r.try_get(0).map_err(db)?;
        if tenants.last().is_none_or(|last| last.tenant != tenant) {
            let max_running: Option<i64> = r.try_get(1).map_err(db)?;
            tenants.push(ReadyTenant {
                tenant,
                max_running,
                picked: max_running.is_none().then(VecDeque::new),
            });
        }
        if r.try_get::<Option<String>, _>(2).map_err(db)?.is_none() {
            continue;
        }
        let last = tenants.last_mut().expect("pushed above");
        last.picked.get_or_insert_default().push_back(picked_from_row(r, 2)?);
    }
    Ok(tenants)
}

/// Picks up to `allowance` of `tenant`'s ready tasks (`pick_ready_sql`).
pub(super) async fn pick_ready(
    c: &mut PgConnection,
    p: &ClaimParams,
    tenant: &str,
    allowance: usize,
) -> Result<VecDeque<Picked>> {
    let rows = sqlx::query(concat!(
        "SELECT operation_id, ctid, deadline_at, was_queued FROM (",
        pick_ready_sql!("$4"),
        ") picked ORDER BY priority DESC, available_at, seq"
    ))
    .bind(&p.kinds)
    .bind(p.now.0)
    .bind(i64::try_from(allowance).unwrap_or(i64::MAX))
    .bind(tenant)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter().map(|r| picked_from_row(r, 0)).collect()
}

/// A ready task picked for a claim, with what leasing it needs to know.
pub(super) struct Picked {
    pub(super) operation_id: String,
    /// The locked row's place in `tasks`.
    pub(super) ctid: String,
    pub(super) deadline_at: Option<i64>,
    pub(super) was_queued: bool,
}

/// The `Picked` in the columns `from..from + 4` of `r` (operation id,
/// ctid, deadline, whether it was queued).
pub(super) fn picked_from_row(r: &PgRow, from: usize) -> Result<Picked> {
    Ok(Picked {
        operation_id: r.try_get(from).map_err(db)?,
        ctid: r.try_get(from + 1).map_err(db)?,
        deadline_at: r.try_get(from + 2).map_err(db)?,
        was_queued: r.try_get(from + 3).map_err(db)?,
    })
}

/// The tenant's leased tasks, counted under its row's lock: nodes claiming
/// for the same capped tenant take turns, so together they never exceed
/// `max_running`.
pub(super) async fn tasks_running(c: &mut PgConnection, tenant: &str) -> Result<i64> {
    sqlx::query("SELECT 1 FROM tenants WHERE name = $1 FOR UPDATE")
        .bind(tenant)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE tenant = $1 AND status = 'leased'")
        .bind(tenant)
        .fetch_one(&mut *c)
        .await
        .map_err(db)
}

/// Records the order the tenants were served in, one statement for all.
pub(super) async fn tenants_served(c: &mut PgConnection, tenants: &[&str]) -> Result<()> {
    sqlx::query(
        "INSERT INTO tenant_dispatch (tenant, last_claimed)
         SELECT tenant, nextval('tenant_dispatch_order') FROM unnest($1::TEXT[]) WITH ORDINALITY AS s(tenant, n)
          ORDER BY n
         ON CONFLICT (tenant) DO UPDATE SET last_claimed = excluded.last_claimed",
    )
    .bind(tenants)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

/// Leases the picked tasks (`lease_tasks`) but those whose deadline passed,
/// which it hands back for the claim to end.
pub(super) async fn lease(
    c: &mut PgConnection,
    ch: &mut Changes,
    p: &ClaimParams,
    picked: Vec<Picked>,
) -> Result<Leased> {
    let (expired, live): (Vec<Picked>, Vec<Picked>) = picked
        .into_iter()
        .partition(|task| too_late_to_start(task.deadline_at.map(Timestamp), p.now));
    let tasks = if live.is_empty() {
        Vec::new()
    } else {
        lease_tasks(c, ch, p, &live).await?
    };
    let expired = expired.into_iter().map(|task| (task.operation_id, None)).collect();
    Ok(Leased { tasks, expired })
}

/// Leases the picked tasks and starts their operations in one statement,
/// then records their `started` events in one more: a claim's cost does not
/// grow by a round trip per task.
pub(super) async fn lease_tasks(
    c: &mut PgConnection,
    ch: &mut Changes,
    p: &ClaimParams,
    picked: &[Picked],
) -> Result<Vec<Task>> {
    let lease_expires_at = p.now.plus(p.lease);
    let ctids: Vec<&str> = picked.iter().map(|t| t.ctid.as_str()).collect();
    let ids: Vec<&str> = picked.iter().map(|t| t.operation_id.as_str()).collect();
    // By the rows' places alone (a TID scan): the picked rows are locked
    // (FOR UPDATE SKIP LOCKED in the pick) and so still ready and where they were.
    // Keyed by `operation_id = ANY(…)` the planner, its statistics taken
    // while the queue was short, chose a scan of the whole table (with
    // `status = 'ready'`, of the partial index): auto_explain showed 20,000
    // rows read to lease 64, 13 ms a claim, growing with the queue.
    // Each lease's token is drawn here (`gen_random_uuid`, 122 random bits
    // from the server's strong random source): matching tokens sent along
    // to rows by `array_position($1::TID[], ctid)` cast the whole array
    // again for every row on the generic plan (perf: `tidin`, `array_map`
    // and `strtoull` under the lease), 2.5–7 ms of a claim of 200–400.
    // The operations are found by id and their liveness asked of the pair,
    // as in `operations_end_guarded` (the same statistics made the planner
    // read every live operation for each claim).
    let rows = sqlx::query(&format!(
        "WITH t AS (UPDATE tasks SET status = 'leased', lease_expires_at = $2, worker_id = $3, lease_ms = $4,
                                     lease_token = replace(gen_random_uuid()::TEXT, '-', ''), started = TRUE
                      WHERE ctid = ANY($1::TID[])
                 RETURNING operation_id AS op_id, lease_token AS token)
         UPDATE operations
            SET state = 'running', attempt = GREATEST(attempt, 1), started_at = COALESCE(started_at, $5),
                version = version + 1, updated_at = $5
           FROM t
          WHERE operations.id = ANY($6::TEXT[]) AND operations.id = t.op_id
            AND (t.token IS NULL OR operations.state IN ('queued', 'running'))
      RETURNING {OP_COLUMNS}, t.token, operations.checkpoint"
    ))
    .bind(&ctids)
    .bind(lease_expires_at.0)
    .bind(&p.worker_id)
    .bind(lease_ms(p.lease))
    .bind(p.now.0)
    .bind(&ids)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut started: std::collections::HashMap<String, (Operation, String, Option<Value>)> =
        std::collections::HashMap::new();
    for row in &rows {
        let op = operation_of(row)?;
        let token: String = row.try_get(OP_COLUMN_COUNT).map_err(db)?;
        let checkpoint = json_text(row.try_get(OP_COLUMN_COUNT + 1).map_err(db)?)?;
        started.insert(op.id.as_str().to_owned(), (op, token, checkpoint));
    }
    // In pick order (fair across tenants), as the claimer gets them.
    let mut leased = Vec::with_capacity(started.len());
    for pick in picked {
        if let Some((op, token, checkpoint)) = started.remove(&pick.operation_id) {
            if let Some(queued) = start_delivery_queued(&op, pick.was_queued) {
                super::script::run(c, &queued).await?;
            }
            leased.push((op, token, pick.deadline_at, checkpoint));
        }
    }
    let events: Vec<(&Operation, EventType, Value)> = leased
        .iter()
        .map(|(op, ..)| (op, EventType::Started, started_data(op, &p.worker_id)))
        .collect();
    events_insert(c, ch, &events).await?;
    let tasks = leased
        .into_iter()
        .map(|(op, lease_token, deadline_at, checkpoint)| Task {
            operation_id: op.id,
            tenant: op.tenant,
            kind: op.kind,
            input: op.input.unwrap_or(Value::Null),
            attempt: op.attempt,
            lease_token,
            lease_expires_at,
            deadline_at: ts(deadline_at),
            budget_max_cost: op.budget_max_cost,
            checkpoint,
        })
        .collect();
    Ok(tasks)
}

/// How a claim's transaction begins: its statements on generic plans. The
/// pick chose a custom plan every time (its generic estimate, the LIMIT a
/// parameter, looked dearer): pg_stat_statements counted 117 plannings for
/// 108 picks, 0.42 ms each, on the path of every idle pickup. On generic
/// plans a woken claim answered 0.5 ms sooner (python probe, 200 pickups
/// each, three alternating pairs: submit-to-claim p50 3.34–3.84 → 2.45–3.02
/// ms) and the drain did not move (scripts/drain, three pairs). Their shape
/// does not hang on statistics: the pick walks its index from the head,
/// the lease finds rows by place and by id.
pub(super) const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";
