//! Fenced reads of leased tasks, one or many in one statement (the plan
//! layer's heartbeats, outcomes and reaper start from them).

use super::*;

/// The fenced rows of many leases in one statement, keyed by operation id
/// and lease token: only the current holders' tasks are found; with
/// `Lock::ForUpdate` they are locked (in id order, so concurrent batches
/// cannot deadlock) until the transaction ends. Each lease is looked up by
/// its task's primary key (a LATERAL with a LIMIT, never a join the planner
/// could turn into a scan of every leased task; its other conditions are
/// outside it, or the planner, its statistics taken before anything was
/// leased, read every leased task through the partial index instead).
pub(super) async fn fenced_many(
    c: &mut PgConnection,
    leases: &[(&str, &str)],
    lock: Lock,
) -> Result<std::collections::HashMap<(String, String), Fenced>> {
    // Sorted by id: the locking variant locks in this order.
    let mut leases = leases.to_vec();
    leases.sort_unstable();
    let (ids, tokens): (Vec<&str>, Vec<&str>) = leases.into_iter().unzip();
    macro_rules! fenced_sql {
        ($lock:literal) => {
            concat!(
                "SELECT o.version, o.progress, o.cost_units, o.cancellable, o.cancel_requested_at IS NOT NULL,
                        o.cancel_reason, o.cancel_requested_by, o.attempt, COALESCE(k.max_attempts, 1),
                        o.budget_max_cost, COALESCE(t.lease_ms, 30000), t.operation_id, t.lease_token,
                        o.pause_requested_at IS NOT NULL
                   FROM unnest($1::TEXT[], $2::TEXT[]) WITH ORDINALITY AS f(op_id, token, n)
                  CROSS JOIN LATERAL (
                        SELECT operation_id, lease_token, lease_ms, status FROM tasks
                         WHERE operation_id = f.op_id LIMIT 1 ",
                $lock,
                ") t
                  CROSS JOIN LATERAL (
                        SELECT version, progress, cost_units, cancellable, cancel_requested_at, cancel_reason,
                               cancel_requested_by, attempt, budget_max_cost, pause_requested_at, kind, state
                          FROM operations WHERE id = f.op_id LIMIT 1 ",
                $lock,
                ") o
                   LEFT JOIN kinds k ON k.name = o.kind
                  WHERE t.lease_token = f.token AND t.status = 'leased' AND o.state = 'running'
                  ORDER BY f.n"
            )
        };
    }
    let rows = sqlx::query(match lock {
        Lock::ForUpdate => fenced_sql!("FOR UPDATE"),
        Lock::None => fenced_sql!(""),
    })
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let fenced = Fenced {
                version: row.try_get(0).map_err(db)?,
                progress: json_text(row.try_get(1).map_err(db)?)?.map(|v| progress_from_json(&v)),
                cost_units: row.try_get(2).map_err(db)?,
                cancellable: row.try_get(3).map_err(db)?,
                cancel_requested: row.try_get(4).map_err(db)?,
                cancel_reason: row.try_get(5).map_err(db)?,
                cancel_requested_by: row.try_get(6).map_err(db)?,
                attempt: row.try_get(7).map_err(db)?,
                max_attempts: row.try_get(8).map_err(db)?,
                budget_max_cost: row.try_get(9).map_err(db)?,
                lease_ms: row.try_get(10).map_err(db)?,
                pause_requested: row.try_get(13).map_err(db)?,
            };
            Ok(((row.try_get(11).map_err(db)?, row.try_get(12).map_err(db)?), fenced))
        })
        .collect()
}
