//! Rows in and out: decoding columns into records, and the small statements
//! every use case shares (read an operation, lock it, update and return it,
//! record events and queue webhooks).

use super::*;

pub(super) fn db(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(d) = &e
        && d.code().as_deref() == Some(crate::error::POSTGRES_GUARD)
    {
        return StoreError::IllegalTransition(d.message().to_owned());
    }
    if is_unavailable(&e) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Postgres(std::sync::Arc::new(e))
    }
}

/// The database is unreachable, shutting down, out of space or read-only:
/// the statement was not applied and may succeed later.
pub(super) fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|code| {
            // 08: connection exceptions; 57P01-57P03: shutting down or not
            // yet accepting; 53: insufficient resources (disk full, out of
            // memory, too many connections); 25006: read-only transaction.
            code.starts_with("08") || code.starts_with("53") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25006")
        }),
        _ => false,
    }
}

pub(super) fn json_text(text: Option<String>) -> Result<Option<Value>> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

pub(super) fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp)
}

pub(super) fn state_of(text: &str) -> Result<State> {
    text.parse()
        .map_err(|e: longrun_core::state::UnknownState| StoreError::Corrupt(e.to_string()))
}

pub(super) fn operation_from_row(r: &PgRow) -> Result<Operation> {
    let get = |e: sqlx::Error| db(e);
    let labels: BTreeMap<String, String> = match json_text(r.try_get(11).map_err(get)?)? {
        Some(v) => serde_json::from_value(v).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        None => BTreeMap::new(),
    };
    let error_code: Option<String> = r.try_get(14).map_err(get)?;
    let cancel_requested_at: Option<i64> = r.try_get(17).map_err(get)?;
    Ok(Operation {
        id: Id::from_trusted(r.try_get(0).map_err(get)?),
        tenant: r.try_get(1).map_err(get)?,
        kind: r.try_get(2).map_err(get)?,
        state: state_of(r.try_get(3).map_err(get)?)?,
        version: r.try_get(4).map_err(get)?,
        attempt: r.try_get(5).map_err(get)?,
        input: json_text(r.try_get(6).map_err(get)?)?,
        callback_url: r.try_get(7).map_err(get)?,
        deadline_at: ts(r.try_get(8).map_err(get)?),
        budget_max_cost: r.try_get(9).map_err(get)?,
        cost_units: r.try_get(10).map_err(get)?,
        labels,
        progress: json_text(r.try_get(12).map_err(get)?)?.map(|v| progress_from_json(&v)),
        result: json_text(r.try_get(13).map_err(get)?)?,
        error: match error_code {
            Some(code) => Some(OperationError {
                code,
                message: r.try_get::<Option<String>, _>(15).map_err(get)?.unwrap_or_default(),
                retryable: r.try_get::<Option<bool>, _>(16).map_err(get)?.unwrap_or(false),
            }),
            None => None,
        },
        cancel: match cancel_requested_at {
            Some(at) => Some(CancelRequest {
                requested_at: Timestamp(at),
                requested_by: r.try_get::<Option<String>, _>(18).map_err(get)?.unwrap_or_default(),
                reason: r.try_get(19).map_err(get)?,
            }),
            None => None,
        },
        cancellable: r.try_get(20).map_err(get)?,
        idempotency_key: r.try_get(21).map_err(get)?,
        created_at: Timestamp(r.try_get(22).map_err(get)?),
        started_at: ts(r.try_get(23).map_err(get)?),
        completed_at: ts(r.try_get(24).map_err(get)?),
        updated_at: Timestamp(r.try_get(25).map_err(get)?),
        expires_at: ts(r.try_get(26).map_err(get)?),
        artifact: None,
        artifacts: std::collections::BTreeMap::new(),
        rerun_of: r.try_get::<Option<String>, _>(28).map_err(get)?.map(Id::from_trusted),
        reruns: None,
        pause_requested_at: ts(r.try_get(29).map_err(get)?),
        not_before: ts(r.try_get(30).map_err(get)?),
        priority: r.try_get(31).map_err(get)?,
    })
    .and_then(|mut op| {
        (op.artifact, op.artifacts) = artifacts_from_json(json_text(r.try_get(27).map_err(get)?)?.as_ref());
        Ok(op)
    })
}

pub(super) async fn operation_by_id(c: &mut PgConnection, id: &str) -> Result<Option<Operation>> {
    let row = sqlx::query(&format!("SELECT {OP_COLUMNS} FROM operations WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    row.as_ref().map(operation_from_row).transpose()
}

/// `tenant`'s operation `id` as an event replay needs it: every column
/// but the input (no snapshot carries it, and it may be large), scoped by
/// tenant in the query.
pub(super) async fn operation_for_replay(c: &mut PgConnection, tenant: &str, id: &Id) -> Result<Option<Operation>> {
    // Made once (an event stream reads a page per change it is woken for).
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let columns = OP_COLUMNS.replacen(", input,", ", NULL::TEXT AS input,", 1);
        format!("SELECT {columns} FROM operations WHERE id = $1 AND tenant = $2")
    });
    let row = sqlx::query(SQL.as_str())
        .bind(id.as_str())
        .bind(tenant)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    row.as_ref().map(operation_from_row).transpose()
}

pub(super) async fn owned(c: &mut PgConnection, tenant: &str, id: &str) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM operations WHERE id = $1 AND tenant = $2")
        .bind(id)
        .bind(tenant)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?
        .is_some())
}

/// `UPDATE … RETURNING` every column; `None` when no row matched.
pub(super) async fn update_returning(
    c: &mut PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<Option<Operation>> {
    let row = query.fetch_optional(&mut *c).await.map_err(db)?;
    row.as_ref().map(operation_from_row).transpose()
}

/// The tenant's operation, locked for the rest of the transaction.
pub(super) async fn lock_operation(c: &mut PgConnection, tenant: &str, id: &Id) -> Result<Operation> {
    let row = sqlx::query(&format!(
        "SELECT {OP_COLUMNS} FROM operations WHERE id = $1 AND tenant = $2 FOR UPDATE"
    ))
    .bind(id.as_str())
    .bind(tenant)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    row.as_ref()
        .map(operation_from_row)
        .transpose()?
        .ok_or(StoreError::NotFound)
}

/// Records events, each with the representation at its version, and notes
/// them as changes to announce; many in one statement.
pub(super) async fn events_insert(
    c: &mut PgConnection,
    ch: &mut Changes,
    events: &[(&Operation, EventType, Value)],
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(events.len());
    let (mut versions, mut types, mut states, mut ats) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut data, mut snapshots) = (Vec::new(), Vec::new());
    for (op, event_type, d) in events {
        ids.push(op.id.as_str());
        versions.push(op.version);
        types.push(event_type.as_str());
        states.push(op.state.as_str());
        ats.push(op.updated_at.0);
        data.push(d.to_string());
        snapshots.push(event_snapshot(op));
    }
    for (op, event_type, _) in events {
        ch.record(op, *event_type);
    }
    // Each event's `seq` is a lookup by primary key per item (a scalar
    // subquery, never a join the planner could turn into a scan of
    // `operations`; see ARCHITECTURE.md, "hot paths do not grow").
    // What the transaction changed so far is announced by the same
    // statement: most transactions record their last change here, and then
    // the commit sends no NOTIFY statement of its own (a round trip less).
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
             SELECT (SELECT o.seq FROM operations o WHERE o.id = e.id), e.version, e.type, e.state, e.at, e.data,
                    e.snapshot
               FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[], $6::TEXT[], $7::TEXT[])
                    AS e(id, version, type, state, at, data, snapshot))
         SELECT pg_notify($8, payload) FROM unnest($9::TEXT[]) AS p(payload)",
    )
    .bind(&ids)
    .bind(&versions)
    .bind(&types)
    .bind(&states)
    .bind(&ats)
    .bind(&data)
    .bind(&snapshots)
    .bind(CHANNEL)
    .bind(ch.unannounced_payloads())
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}
