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

impl Columns for PgRow {
    type Error = StoreError;

    fn text(&self, i: usize) -> Result<Option<String>> {
        self.try_get(i).map_err(db)
    }

    fn int(&self, i: usize) -> Result<Option<i64>> {
        self.try_get(i).map_err(db)
    }

    fn small(&self, i: usize) -> Result<i16> {
        self.try_get(i).map_err(db)
    }

    fn real(&self, i: usize) -> Result<Option<f64>> {
        self.try_get(i).map_err(db)
    }

    fn flag(&self, i: usize) -> Result<Option<bool>> {
        self.try_get(i).map_err(db)
    }

    fn corrupt(&self, i: usize, why: String) -> StoreError {
        StoreError::Corrupt(format!("column {i}: {why}"))
    }
}

pub(super) async fn operation_by_id(c: &mut PgConnection, id: &str) -> Result<Option<Operation>> {
    let row = sqlx::query(&format!("SELECT {OP_COLUMNS} FROM operations WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    row.as_ref().map(operation_of).transpose()
}

/// `tenant`'s operation `id` and its `seq`, as a history read needs them
/// ([`OPERATION_FOR_HISTORY`]).
pub(super) async fn operation_for_history(
    c: &mut PgConnection,
    tenant: &str,
    id: &Id,
) -> Result<Option<(Operation, i64)>> {
    // Made once (an event stream reads a page per change it is woken for).
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| pg(&OPERATION_FOR_HISTORY));
    let row = sqlx::query(SQL.as_str())
        .bind(id.as_str())
        .bind(tenant)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some((operation_of(&row)?, row.try_get(OP_COLUMN_COUNT).map_err(db)?)))
}

/// `UPDATE … RETURNING` every column; `None` when no row matched.
pub(super) async fn update_returning(
    c: &mut PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<Option<Operation>> {
    let row = query.fetch_optional(&mut *c).await.map_err(db)?;
    row.as_ref().map(operation_of).transpose()
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
    row.as_ref().map(operation_of).transpose()?.ok_or(StoreError::NotFound)
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
        let Some(EventRow { snapshot }) = event_row(op, *event_type, d) else {
            continue;
        };
        ids.push(op.id.as_str());
        versions.push(op.version);
        types.push(event_type.as_str());
        states.push(op.state.as_str());
        ats.push(op.updated_at.0);
        data.push(d.to_string());
        snapshots.push(snapshot);
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
