//! Reads outside the read cache: lists (keyset pages), histories, and one
//! operation with its re-run count.

use super::*;

pub(super) async fn operation_list(c: &mut PgConnection, p: &ListParams) -> Result<OperationPage> {
    let page_size = i64::from(p.page_size.max(1));
    let sql = operation_list_sql(p, page_size + 1);
    let mut query = sqlx::query(&sql);
    if let Some(tenant) = &p.tenant {
        query = query.bind(tenant);
    }
    if let Some(kind) = &p.kind {
        query = query.bind(kind);
    }
    if let Some((key, value)) = &p.label {
        query = query.bind(key).bind(value);
    }
    if let Some(before) = p.before_seq {
        query = query.bind(before);
    }
    if let Some(at) = p.visible_at {
        query = query.bind(at.0);
    }
    if let Some(at) = p.created_from {
        query = query.bind(at.0);
    }
    if let Some(at) = p.created_before {
        query = query.bind(at.0);
    }
    let rows = query.fetch_all(&mut *c).await.map_err(db)?;
    let mut operations = Vec::with_capacity(rows.len());
    let mut seqs = Vec::with_capacity(rows.len());
    for row in &rows {
        operations.push(operation_of(row)?);
        seqs.push(row.try_get::<i64, _>(OP_COLUMN_COUNT).map_err(db)?);
    }
    Ok(crate::shared::page(operations, &seqs, page_size))
}

/// The statement of a list page of at most `limit` rows, its arguments
/// bound in [`operation_list`]'s order.
///
/// The text names only the filters given (as SQLite's does), never `$n IS
/// NULL OR …`; the state and the limit are in the text. A page of one
/// state reads:
///
/// - queued or running work from its tasks (`tasks_by_tenant`: tenant,
///   started, seq; a task is `started` once its operation is running, and
///   its `status` does not say that: a running operation waiting for its
///   next attempt has a `ready` task): a finish moves an operation out of
///   those states with an update that cannot be HOT, and an index of
///   operations by state would keep a dead entry for each (schema 17 says
///   what that cost). Each task's operation is looked up
///   by id, in a LATERAL with a LIMIT, which the planner never turns into
///   a join: as a join, statistics taken while nothing was queued made it
///   scan every stored operation for the queued ones (the 10 M bench's
///   first page timed out);
/// - paused and ended work from `operations_by_tenant_state`, keyed by
///   `rest_state`, the state of paused and ended work and NULL otherwise
///   (schema 18: no index reads `state`, so a claim is HOT).
///
/// A page of one kind reads `operations_by_tenant_kind`; a page with
/// neither merges the newest of each state (at most six probes of `limit`
/// rows, whatever is stored: no index orders a tenant's operations by
/// `seq` alone, which would cost every state change an index write).
pub(super) fn operation_list_sql(p: &ListParams, limit: i64) -> String {
    // The conditions on the tenant, the kind and `seq`, which a task's page
    // asks of the task (`@` stands for its table; a task has its
    // operation's), and the rest, of the operation.
    let (mut keyed, mut rest) = (String::new(), String::new());
    let mut n = 0;
    let mut arg = |sql: &mut String, clause: &str| {
        n += 1;
        sql.push_str(&clause.replace("$?", &format!("${n}")));
    };
    if p.tenant.is_some() {
        arg(&mut keyed, " AND @tenant = $?");
    }
    if p.kind.is_some() {
        arg(&mut keyed, " AND @kind = $?");
    }
    if p.label.is_some() {
        arg(&mut rest, " AND (labels::jsonb ->> $?)");
        arg(&mut rest, " = $?");
    }
    if p.before_seq.is_some() {
        arg(&mut keyed, " AND @seq < $?");
    }
    if p.visible_at.is_some() {
        arg(&mut rest, " AND (expires_at IS NULL OR expires_at > $?)");
    }
    if p.created_from.is_some() {
        arg(&mut rest, " AND created_at >= $?");
    }
    if p.created_before.is_some() {
        arg(&mut rest, " AND created_at < $?");
    }
    // One tenant's newest; `tenant` is the condition on the tenant that
    // `keyed` does not hold.
    let newest_of = |tenant: &str| {
        let keyed = format!("{tenant}{keyed}");
        let probe = |state: State| {
            let started = match state {
                State::Queued => "NOT t.started",
                State::Running => "t.started",
                _ => {
                    return format!(
                        "SELECT {OP_COLUMNS}, seq FROM operations
                          WHERE rest_state = '{state}'{keyed}{rest}
                          ORDER BY seq DESC LIMIT {limit}",
                        keyed = keyed.replace('@', "")
                    );
                }
            };
            format!(
                "SELECT x.* FROM tasks t CROSS JOIN LATERAL (
                     SELECT {OP_COLUMNS}, seq FROM operations
                      WHERE id = t.operation_id AND state = '{state}'{rest} LIMIT 1) x
                  WHERE {started}{keyed}
                  ORDER BY t.seq DESC LIMIT {limit}",
                keyed = keyed.replace('@', "t.")
            )
        };
        match (p.state, &p.kind) {
            (Some(state), _) => probe(state),
            (None, Some(_)) => format!(
                "SELECT {OP_COLUMNS}, seq FROM operations WHERE TRUE{keyed}{rest} ORDER BY seq DESC LIMIT {limit}",
                keyed = keyed.replace('@', "")
            ),
            (None, None) => {
                let probes: Vec<String> = State::ALL.map(|s| format!("({})", probe(s))).into();
                format!("{} ORDER BY seq DESC LIMIT {limit}", probes.join(" UNION ALL "))
            }
        }
    };
    if p.tenant.is_some() {
        newest_of("")
    } else {
        // Every tenant's (the admin console): each tenant's newest, merged,
        // the tenants found by skipping through the leading column of
        // `operations_by_tenant_kind` — a probe per tenant, never a read of
        // every operation (which took 330 ms at a million of them).
        format!(
            "WITH RECURSIVE tn(name) AS (
                 SELECT min(tenant) FROM operations
                 UNION ALL
                 SELECT (SELECT min(tenant) FROM operations WHERE tenant > tn.name) FROM tn WHERE tn.name IS NOT NULL)
             SELECT n.* FROM tn CROSS JOIN LATERAL ({}) n
              WHERE tn.name IS NOT NULL
             ORDER BY n.seq DESC LIMIT {limit}",
            newest_of(" AND @tenant = tn.name")
        )
    }
}

pub(super) async fn events_of(
    c: &mut PgConnection,
    tenant: &str,
    id: &Id,
    after: i64,
    limit: i64,
    snapshots: bool,
) -> Result<Option<Vec<Event>>> {
    // The row first: the events it cannot say are derived from it, and
    // nothing changes a row once it has ended (plan/history.rs).
    let Some((row, seq)) = operation_for_history(c, tenant, id).await? else {
        return Ok(None);
    };
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| pg(EVENTS_AFTER));
    let rows = sqlx::query(SQL.as_str())
        .bind(seq)
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let replay = snapshots.then_some(&row);
    let stored = rows.iter().map(|r| event_of(r, id, replay)).collect::<Result<_>>()?;
    Ok(Some(with_derived(stored, &row, after, limit, snapshots)))
}

/// The operation with its re-runs (from the partial index of `rerun_of`,
/// in the same statement) and the size of its stored JSON, for the read
/// cache.
pub(super) async fn operation_read(pool: &PgPool, tenant: &str, id: &Id) -> Result<Option<(Operation, usize)>> {
    let row = sqlx::query(&format!(
        "SELECT {OP_COLUMNS}, ARRAY(SELECT r.id FROM operations r WHERE r.rerun_of = operations.id ORDER BY r.seq),
                COALESCE(octet_length(input), 0) + COALESCE(octet_length(result), 0)
                  + COALESCE(octet_length(progress), 0) + COALESCE(octet_length(labels), 0)
           FROM operations WHERE id = $1 AND tenant = $2"
    ))
    .bind(id.as_str())
    .bind(tenant)
    .fetch_optional(pool)
    .await
    .map_err(db)?;
    let Some(row) = row else { return Ok(None) };
    let mut op = operation_of(&row)?;
    let reruns: Vec<String> = row.try_get(OP_COLUMN_COUNT).map_err(db)?;
    op.reruns = Some(reruns.into_iter().map(Id::from_trusted).collect());
    let json_bytes: i32 = row.try_get(OP_COLUMN_COUNT + 1).map_err(db)?;
    Ok(Some((op, usize::try_from(json_bytes).unwrap_or(usize::MAX))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of the page `tenant`'s (every tenant's with `None`) in
    /// `state` (any with `None`), before `before_seq` when given.
    async fn plan(c: &mut PgConnection, tenant: Option<&str>, state: Option<State>, before_seq: Option<i64>) -> String {
        let p = ListParams {
            tenant: tenant.map(str::to_owned),
            state,
            page_size: 50,
            before_seq,
            ..Default::default()
        };
        let sql = format!("EXPLAIN {}", operation_list_sql(&p, 51));
        let mut query = sqlx::query_scalar::<_, String>(&sql);
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        if let Some(before) = before_seq {
            query = query.bind(before);
        }
        query.fetch_all(&mut *c).await.unwrap().join("\n")
    }

    /// Statistics taken while nothing was queued (every stored operation
    /// ended) and a queue that has grown since cannot make a page of
    /// queued work read every stored operation: the 10 M bench's first
    /// page timed out when the planner, told no operation is queued,
    /// scanned `operations` for the queued ones and joined their tasks.
    #[tokio::test]
    async fn stale_statistics_never_make_a_page_of_queued_work_scan_the_operations() {
        let Some(mut c) = super::super::migrated_connection().await else {
            return;
        };
        sqlx::raw_sql(
            "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result, created_at,
                                     started_at, completed_at, updated_at)
             SELECT 'op_ended_' || g, 't1', 'k', 'succeeded', 3, 1, '{}', 'null', g, g, g, g
               FROM generate_series(1, 20000) g;
             ANALYZE operations;
             INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, created_at, updated_at)
             SELECT 'op_queued_' || g, 't1', 'k', 'queued', 1, 0, '{}', g, g FROM generate_series(1, 2000) g;
             INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
             SELECT id, seq, tenant, kind, 'ready', 1 FROM operations WHERE state = 'queued';
             ANALYZE tasks;",
        )
        .execute(&mut c)
        .await
        .unwrap();
        for state in [Some(State::Queued), None] {
            let plan = plan(&mut c, Some("t1"), state, None).await;
            assert!(!plan.contains("Seq Scan on operations"), "{state:?}: {plan}");
        }
    }

    /// A page of queued or running work reads the tasks, never the
    /// operations' index by state (whose dead entries it would walk); a
    /// page of paused or ended work reads that index, whose predicate the
    /// statement proves; a page with neither does both, for one tenant
    /// and for all. Seq scans are off so that the plans of these near-empty
    /// tables are the ones a full store gets.
    #[tokio::test]
    async fn live_work_is_paged_from_the_tasks_and_ended_work_from_its_index() {
        let Some(mut c) = super::super::migrated_connection().await else {
            return;
        };
        sqlx::query("SET enable_seqscan = off").execute(&mut c).await.unwrap();
        let before = Some(1_000);
        for live in [State::Queued, State::Running] {
            let plan = plan(&mut c, Some("t1"), Some(live), before).await;
            assert!(plan.contains("tasks_by_tenant"), "{live}: {plan}");
            assert!(!plan.contains("operations_by_tenant_state"), "{live}: {plan}");
        }
        for rests in [State::Paused, State::Succeeded, State::Failed, State::Cancelled] {
            let plan = plan(&mut c, Some("t1"), Some(rests), before).await;
            assert!(plan.contains("operations_by_tenant_state"), "{rests}: {plan}");
            assert!(!plan.contains("tasks"), "{rests}: {plan}");
        }
        for tenant in [Some("t1"), None] {
            let plan = plan(&mut c, tenant, None, before).await;
            assert_eq!(plan.matches("using tasks_by_tenant").count(), 2, "{tenant:?}: {plan}");
            assert_eq!(
                plan.matches("using operations_by_tenant_state").count(),
                4,
                "{tenant:?}: {plan}"
            );
        }
    }
}
