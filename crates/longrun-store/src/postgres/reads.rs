//! Reads outside the read cache: lists (keyset pages), histories, and one
//! operation with its re-run count.

use super::*;

pub(super) async fn operation_list(c: &mut PgConnection, p: &ListParams) -> Result<OperationPage> {
    let page_size = i64::from(p.page_size.max(1));
    // The text names only the filters given (as SQLite's does), never
    // `$n IS NULL OR …`, and the limit is in the text (at most 101 of them).
    let limit = page_size + 1;
    let mut sql = String::new();
    let mut n = 0;
    let mut arg = |sql: &mut String, clause: &str| {
        n += 1;
        sql.push_str(&clause.replace("$?", &format!("${n}")));
    };
    if p.tenant.is_some() {
        arg(&mut sql, " AND tenant = $?");
    }
    if p.state.is_some() {
        arg(&mut sql, " AND state = $?");
    }
    if p.kind.is_some() {
        arg(&mut sql, " AND kind = $?");
    }
    if p.label.is_some() {
        arg(&mut sql, " AND (labels::jsonb ->> $?)");
        arg(&mut sql, " = $?");
    }
    if p.before_seq.is_some() {
        arg(&mut sql, " AND seq < $?");
    }
    if p.visible_at.is_some() {
        arg(&mut sql, " AND (expires_at IS NULL OR expires_at > $?)");
    }
    if p.created_from.is_some() {
        arg(&mut sql, " AND created_at >= $?");
    }
    if p.created_before.is_some() {
        arg(&mut sql, " AND created_at < $?");
    }
    // One tenant's newest: by `operations_by_tenant_state` or
    // `operations_by_tenant_kind` when a state or a kind is given, else
    // merged from the newest of each state's range of the first (no index
    // orders a tenant's operations by `seq` alone: one would cost every
    // state change an index write). `tenant` is the condition on the
    // tenant that `sql` does not hold.
    let newest_of = |tenant: &str| {
        if p.state.is_some() || p.kind.is_some() {
            format!("SELECT {OP_COLUMNS}, seq FROM operations WHERE TRUE{tenant}{sql} ORDER BY seq DESC LIMIT {limit}")
        } else {
            let states = State::ALL.map(|s| format!("'{}'", s.as_str())).join(", ");
            format!(
                "SELECT o.* FROM unnest(ARRAY[{states}]) AS s(state) CROSS JOIN LATERAL (
                     SELECT {OP_COLUMNS}, seq FROM operations
                      WHERE state = s.state{tenant}{sql} ORDER BY seq DESC LIMIT {limit}) o
                  ORDER BY o.seq DESC LIMIT {limit}"
            )
        }
    };
    let sql = if p.tenant.is_some() {
        newest_of("")
    } else {
        // Every tenant's (the admin console): each tenant's newest, merged,
        // the tenants found by skipping through the index's leading column —
        // a probe per tenant, never a read of every operation (which took
        // 330 ms at a million of them).
        format!(
            "WITH RECURSIVE t(name) AS (
                 SELECT min(tenant) FROM operations
                 UNION ALL
                 SELECT (SELECT min(tenant) FROM operations WHERE tenant > t.name) FROM t WHERE t.name IS NOT NULL)
             SELECT n.* FROM t CROSS JOIN LATERAL ({}) n
              WHERE t.name IS NOT NULL
             ORDER BY n.seq DESC LIMIT {limit}",
            newest_of(" AND tenant = t.name")
        )
    };
    let mut query = sqlx::query(&sql);
    if let Some(tenant) = &p.tenant {
        query = query.bind(tenant);
    }
    if let Some(state) = p.state {
        query = query.bind(state.as_str());
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
        operations.push(operation_from_row(row)?);
        seqs.push(row.try_get::<i64, _>(OP_COLUMN_COUNT).map_err(db)?);
    }
    Ok(crate::shared::page(operations, &seqs, page_size))
}

pub(super) async fn events_of(
    c: &mut PgConnection,
    tenant: &str,
    id: &Id,
    after: i64,
    limit: i64,
    snapshots: bool,
) -> Result<Option<Vec<Event>>> {
    let row = if snapshots {
        match operation_for_replay(c, tenant, id).await? {
            Some(row) => Some(row),
            None => return Ok(None),
        }
    } else if owned(c, tenant, id.as_str()).await? {
        None
    } else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT version, type, state, at, data, snapshot FROM operation_events
          WHERE op_seq = (SELECT seq FROM operations WHERE id = $1) AND version > $2
          ORDER BY version LIMIT $3",
    )
    .bind(id.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        let version = r.try_get(0).map_err(db)?;
        let state = state_of(r.try_get(2).map_err(db)?)?;
        let at = Timestamp(r.try_get(3).map_err(db)?);
        let snapshot = match &row {
            Some(row) => snapshot_from_json(json_text(r.try_get(5).map_err(db)?)?.as_ref(), row, version, state, at),
            None => None,
        };
        events.push(Event {
            operation_id: id.clone(),
            version,
            event_type: r.try_get(1).map_err(db)?,
            state,
            at,
            data: json_text(r.try_get(4).map_err(db)?)?.unwrap_or(Value::Null),
            snapshot,
        });
    }
    Ok(Some(events))
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
    let mut op = operation_from_row(&row)?;
    let reruns: Vec<String> = row.try_get(OP_COLUMN_COUNT).map_err(db)?;
    op.reruns = Some(reruns.into_iter().map(Id::from_trusted).collect());
    let json_bytes: i32 = row.try_get(OP_COLUMN_COUNT + 1).map_err(db)?;
    Ok(Some((op, usize::try_from(json_bytes).unwrap_or(usize::MAX))))
}
