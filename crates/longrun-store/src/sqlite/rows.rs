//! Rows in and out: decoding columns into records, and the small statements
//! every use case shares (read an operation by id, update and read it back,
//! record events and queue webhooks).

use super::*;

pub(super) const OP_COLUMNS: &str = "id, tenant, kind, state, version, attempt, input, callback_url, deadline_at, \
    budget_max_cost, cost_units, labels, progress, result, error_code, error_message, error_retryable, \
    cancel_requested_at, cancel_requested_by, cancel_reason, cancellable, idempotency_key, created_at, \
    started_at, completed_at, updated_at, expires_at, artifact, rerun_of, pause_requested_at, not_before, priority";

pub(super) const OP_COLUMN_COUNT: usize = 32;

pub(super) fn conversion_error(idx: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e))
}

pub(super) fn json_column(r: &Row, idx: usize) -> rusqlite::Result<Option<Value>> {
    let text: Option<String> = r.get(idx)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| conversion_error(idx, e)))
        .transpose()
}

pub(super) fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp)
}

pub(super) fn state_column(r: &Row, idx: usize) -> rusqlite::Result<State> {
    let s: String = r.get(idx)?;
    s.parse().map_err(|e| conversion_error(idx, e))
}

pub(super) fn operation_from_row(r: &Row) -> rusqlite::Result<Operation> {
    let labels: BTreeMap<String, String> = match json_column(r, 11)? {
        Some(v) => serde_json::from_value(v).map_err(|e| conversion_error(11, e))?,
        None => BTreeMap::new(),
    };
    let error_code: Option<String> = r.get(14)?;
    let cancel_requested_at: Option<i64> = r.get(17)?;
    Ok(Operation {
        id: Id::from_trusted(r.get(0)?),
        tenant: r.get(1)?,
        kind: r.get(2)?,
        state: state_column(r, 3)?,
        version: r.get(4)?,
        attempt: r.get(5)?,
        input: json_column(r, 6)?,
        callback_url: r.get(7)?,
        deadline_at: ts(r.get(8)?),
        budget_max_cost: r.get(9)?,
        cost_units: r.get(10)?,
        labels,
        progress: json_column(r, 12)?.map(|v| progress_from_json(&v)),
        result: json_column(r, 13)?,
        error: match error_code {
            Some(code) => Some(OperationError {
                code,
                message: r.get::<_, Option<String>>(15)?.unwrap_or_default(),
                retryable: r.get::<_, Option<bool>>(16)?.unwrap_or(false),
            }),
            None => None,
        },
        cancel: match cancel_requested_at {
            Some(at) => Some(CancelRequest {
                requested_at: Timestamp(at),
                requested_by: r.get::<_, Option<String>>(18)?.unwrap_or_default(),
                reason: r.get(19)?,
            }),
            None => None,
        },
        cancellable: r.get(20)?,
        idempotency_key: r.get(21)?,
        created_at: Timestamp(r.get(22)?),
        started_at: ts(r.get(23)?),
        completed_at: ts(r.get(24)?),
        updated_at: Timestamp(r.get(25)?),
        expires_at: ts(r.get(26)?),
        artifact: None,
        artifacts: BTreeMap::new(),
        rerun_of: r.get::<_, Option<String>>(28)?.map(Id::from_trusted),
        reruns: None,
        pause_requested_at: ts(r.get(29)?),
        not_before: ts(r.get(30)?),
        priority: r.get(31)?,
    })
    .and_then(|mut op| {
        (op.artifact, op.artifacts) = artifacts_from_json(json_column(r, 27)?.as_ref());
        Ok(op)
    })
}

/// Records one change of `op` (its new row, after the update): the event with
/// its version and a snapshot of the representation at that version (without
/// the input), and notes the change for subscribers once the batch commits.
pub(super) fn event_insert(c: &Connection, op: &Operation, event_type: EventType, data: &Value) -> Result<()> {
    event_insert_at(c, None, op, event_type, data)
}

/// [`event_insert`], given the operation's `seq` when the caller has it (it
/// just inserted the row): one index lookup fewer per submission.
pub(super) fn event_insert_at(
    c: &Connection,
    seq: Option<i64>,
    op: &Operation,
    event_type: EventType,
    data: &Value,
) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         VALUES (coalesce(?8, (SELECT seq FROM operations WHERE id = ?1)), ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        op.id.as_str(),
        op.version,
        event_type.as_str(),
        op.state.as_str(),
        op.updated_at.0,
        data.to_string(),
        event_snapshot(op),
        seq
    ])?;
    super::changes::record(op, event_type);
    Ok(())
}

pub(super) fn operation_by_id(c: &Connection, id: &str) -> Result<Option<Operation>> {
    let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id], operation_from_row)
        .optional()?)
}

/// `tenant`'s operation `id` as an event replay needs it: every column
/// but the input (no snapshot carries it, and it may be large), scoped by
/// tenant in the query.
pub(super) fn operation_for_replay(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Operation>> {
    // Made once (an event stream reads a page per change it is woken for).
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let columns = OP_COLUMNS.replacen(", input,", ", NULL AS input,", 1);
        format!("SELECT {columns} FROM operations WHERE id = ?1 AND tenant = ?2")
    });
    Ok(c.prepare_cached(SQL.as_str())?
        .query_row(params![id.as_str(), tenant], operation_from_row)
        .optional()?)
}

/// Whether `id` is an operation of `tenant` (another tenant's id is unknown).
pub(super) fn owns(c: &Connection, tenant: &str, id: &Id) -> Result<bool> {
    Ok(
        c.prepare_cached("SELECT 1 FROM operations WHERE id = ?1 AND tenant = ?2")?
            .query_row(params![id.as_str(), tenant], |r| r.get::<_, i64>(0))
            .optional()?
            .is_some(),
    )
}
