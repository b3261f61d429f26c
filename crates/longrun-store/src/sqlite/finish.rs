//! Fenced reads of leased tasks (the plan layer's heartbeats, outcomes and
//! reaper start from them).

use super::*;

/// The fenced row in full, for an outcome that changes it: `None` from the
/// lease subquery unless the caller holds the lease.
pub(super) fn fenced_operation(c: &Connection, operation_id: &str, lease_token: &str) -> Result<(Fenced, Operation)> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(fenced_operation_sql);
    c.prepare_cached(&SQL)?
        .query_row(params![operation_id, lease_token], |r| {
            let Some(lease_ms) = r.get::<_, Option<i64>>(OP_COLUMN_COUNT + 1)? else {
                return Ok(None);
            };
            let op = operation_of(r)?;
            Ok(Some((Fenced::of(&op, r.get(OP_COLUMN_COUNT)?, lease_ms), op)))
        })
        .optional()?
        .flatten()
        .ok_or(StoreError::LeaseLost)
}

/// One table and scalar subqueries, not a join: SQLite marks a join on a
/// bound parameter as plan-dependent on its value, and rusqlite clears the
/// bindings of a cached statement when it is returned, so such a statement
/// is re-prepared on every use.
pub(super) fn fenced_operation_sql() -> String {
    format!(
        "SELECT {OP_COLUMNS}, COALESCE((SELECT k.max_attempts FROM kinds k WHERE k.name = o.kind), 1),
                (SELECT COALESCE(t.lease_ms, 30000) FROM tasks t
                  WHERE t.operation_id = ?1 AND t.status = 'leased' AND t.lease_token = ?2)
           FROM operations o
          WHERE o.id = ?1 AND o.state = 'running'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcceptParams, ClaimParams, FinishParams, Outcome};
    use longrun_core::IdKind;
    use rusqlite::StatementStatus;

    /// The statements of the job path stay prepared: none is re-prepared
    /// from one task to the next (a profile once found the writer re-parsing
    /// `FENCED` for every outcome).
    #[test]
    #[allow(unsafe_code)]
    fn the_job_path_never_re_prepares_its_statements() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        crate::sqlite::migrate(&path).unwrap();
        let c = Connection::open(&path).unwrap();
        let policy = WritePolicy {
            operation_retention: Duration::from_secs(3600),
            result_retention: Duration::from_secs(3600),
            keep_inputs: false,
        };
        for i in 0..5 {
            let now = Timestamp(1_800_000_000_000 + i);
            operation_accept(
                &c,
                policy,
                &AcceptParams {
                    id: Id::generate(IdKind::Operation),
                    tenant: "t".into(),
                    kind: "k".into(),
                    input: serde_json::json!({}),
                    callback_url: None,
                    deadline_at: None,
                    budget_max_cost: None,
                    labels: Default::default(),
                    idempotency: None,
                    uploads: Vec::new(),
                    rerun_of: None,
                    from_checkpoint: false,
                    not_before: None,
                    priority: crate::PRIORITY_DEFAULT,
                    now,
                },
            )
            .unwrap();
            let claimed = task_claim(
                &c,
                policy,
                &ClaimParams {
                    kinds: vec!["k".into()],
                    max_tasks: 4,
                    lease: Duration::from_secs(30),
                    worker_id: "w".into(),
                    now,
                },
            )
            .unwrap();
            for task in claimed {
                task_finish(
                    &c,
                    policy,
                    &FinishParams {
                        operation_id: task.operation_id,
                        lease_token: task.lease_token,
                        outcome: Outcome::Succeeded { result: None },
                        progress: None,
                        now,
                    },
                )
                .unwrap();
            }
        }
        let fenced = c.prepare_cached(&fenced_operation_sql()).unwrap();
        assert_eq!(fenced.get_status(StatementStatus::Run), 5);
        drop(fenced);
        // Every statement the connection holds, with how often it was re-prepared.
        let mut reprepared = Vec::new();
        // SAFETY: the handle is this live connection's; sqlite3_next_stmt
        // walks its statements, which stay alive while nothing prepares or
        // finalizes, and neither happens in this loop.
        unsafe {
            let db = c.handle();
            let mut stmt = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                let n = rusqlite::ffi::sqlite3_stmt_status(stmt, rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
                if n > 0 {
                    let sql = std::ffi::CStr::from_ptr(rusqlite::ffi::sqlite3_sql(stmt));
                    reprepared.push(sql.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" "));
                }
                stmt = rusqlite::ffi::sqlite3_next_stmt(db, stmt);
            }
        }
        // Only READY_HEADS, once per claim (its ORDER BY on a column held
        // equal to a parameter makes SQLite plan for the value).
        let ready_heads = READY_HEADS.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(reprepared, vec![ready_heads]);
    }
}
