//! Rows in and out: decoding columns into records, and the small statements
//! every use case shares (read an operation by id, update and read it back,
//! record events and queue webhooks).

use super::*;

pub(super) fn conversion_error(idx: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e))
}

pub(super) fn json_column(r: &Row, idx: usize) -> rusqlite::Result<Option<Value>> {
    let text: Option<String> = r.get(idx)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| conversion_error(idx, e)))
        .transpose()
}

impl Columns for Row<'_> {
    type Error = rusqlite::Error;

    fn text(&self, i: usize) -> rusqlite::Result<Option<String>> {
        self.get(i)
    }

    fn int(&self, i: usize) -> rusqlite::Result<Option<i64>> {
        self.get(i)
    }

    fn small(&self, i: usize) -> rusqlite::Result<i16> {
        self.get(i)
    }

    fn real(&self, i: usize) -> rusqlite::Result<Option<f64>> {
        self.get(i)
    }

    fn flag(&self, i: usize) -> rusqlite::Result<Option<bool>> {
        self.get(i)
    }

    fn corrupt(&self, i: usize, why: String) -> rusqlite::Error {
        rusqlite::Error::FromSqlConversionFailure(i, Type::Text, why.into())
    }
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
    let Some(row) = event_row(op, event_type, data) else {
        super::changes::record(op, event_type);
        return Ok(());
    };
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
        row.snapshot,
        seq
    ])?;
    super::changes::record(op, event_type);
    Ok(())
}

pub(super) fn operation_by_id(c: &Connection, id: &str) -> Result<Option<Operation>> {
    let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id], |r| operation_of(r))
        .optional()?)
}

/// `tenant`'s operation `id` and its `seq`, as a history read needs them
/// ([`OPERATION_FOR_HISTORY`]).
pub(super) fn operation_for_history(c: &Connection, tenant: &str, id: &Id) -> Result<Option<(Operation, i64)>> {
    Ok(c.prepare_cached(&OPERATION_FOR_HISTORY)?
        .query_row(params![id.as_str(), tenant], |r| {
            Ok((operation_of(r)?, r.get(OP_COLUMN_COUNT)?))
        })
        .optional()?)
}
