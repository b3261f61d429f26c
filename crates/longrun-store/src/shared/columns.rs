//! An operation's columns and their one decoder. Each driver reads rows of
//! its own type (`sqlx`'s `PgRow`, `rusqlite`'s `Row`) through
//! [`Columns`]; [`operation_of`] turns the columns of [`OP_COLUMNS`] into an
//! [`Operation`] for both, with no per-row cost over a decoder of their
//! own (the trait is resolved at compile time).

use super::*;

/// The columns of an operation, in the order [`operation_of`] reads them.
pub(crate) const OP_COLUMNS: &str = "id, tenant, kind, state, version, attempt, input, callback_url, deadline_at, \
    budget_max_cost, cost_units, labels, progress, result, error_code, error_message, error_retryable, \
    cancel_requested_at, cancel_requested_by, cancel_reason, cancellable, idempotency_key, created_at, \
    started_at, completed_at, updated_at, expires_at, artifact, rerun_of, pause_requested_at, not_before, priority";

/// How many columns [`OP_COLUMNS`] names: what a query selects after them
/// starts here.
pub(crate) const OP_COLUMN_COUNT: usize = 32;

/// `?2`'s operation `?1` as a history read needs it (both stores run this
/// statement; PostgreSQL's spelling by `pg`): every column of
/// [`OP_COLUMNS`] but the input (no snapshot carries it, and it may be
/// large), then its `seq`, by which its events are found.
pub(crate) static OPERATION_FOR_HISTORY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let columns = OP_COLUMNS.replacen(", input,", ", CAST(NULL AS TEXT) AS input,", 1);
    format!("SELECT {columns}, seq FROM operations WHERE id = ?1 AND tenant = ?2")
});

/// A row a driver read, column by column; `NULL` is `None`.
pub(crate) trait Columns {
    /// What a driver's decoder answers when a column does not decode.
    type Error;
    fn text(&self, i: usize) -> std::result::Result<Option<String>, Self::Error>;
    fn int(&self, i: usize) -> std::result::Result<Option<i64>, Self::Error>;
    /// A `SMALLINT` on PostgreSQL (an operation's priority).
    fn small(&self, i: usize) -> std::result::Result<i16, Self::Error>;
    fn real(&self, i: usize) -> std::result::Result<Option<f64>, Self::Error>;
    fn flag(&self, i: usize) -> std::result::Result<Option<bool>, Self::Error>;
    /// Column `i` holds what no record can hold.
    fn corrupt(&self, i: usize, why: String) -> Self::Error;
}

/// Column `i`, which may not be `NULL`.
fn need<R: Columns + ?Sized, T>(
    r: &R,
    i: usize,
    v: std::result::Result<Option<T>, R::Error>,
) -> std::result::Result<T, R::Error> {
    v?.ok_or_else(|| r.corrupt(i, "NULL in a column that is never NULL".into()))
}

fn json<R: Columns + ?Sized>(r: &R, i: usize) -> std::result::Result<Option<Value>, R::Error> {
    r.text(i)?
        .map(|t| serde_json::from_str(&t).map_err(|e| r.corrupt(i, e.to_string())))
        .transpose()
}

/// The operation in the columns of [`OP_COLUMNS`], from the first.
pub(crate) fn operation_of<R: Columns + ?Sized>(r: &R) -> std::result::Result<Operation, R::Error> {
    let ts = |i: usize| -> std::result::Result<Option<Timestamp>, R::Error> { Ok(r.int(i)?.map(Timestamp)) };
    let labels: BTreeMap<String, String> = match json(r, 11)? {
        Some(v) => serde_json::from_value(v).map_err(|e| r.corrupt(11, e.to_string()))?,
        None => BTreeMap::new(),
    };
    let state = need(r, 3, r.text(3))?;
    let (artifact, artifacts) = artifacts_from_json(json(r, 27)?.as_ref());
    Ok(Operation {
        id: Id::from_trusted(need(r, 0, r.text(0))?),
        tenant: need(r, 1, r.text(1))?,
        kind: need(r, 2, r.text(2))?,
        state: state
            .parse()
            .map_err(|e: longrun_core::state::UnknownState| r.corrupt(3, e.to_string()))?,
        version: need(r, 4, r.int(4))?,
        attempt: need(r, 5, r.int(5))?,
        input: json(r, 6)?,
        callback_url: r.text(7)?,
        deadline_at: ts(8)?,
        budget_max_cost: r.real(9)?,
        cost_units: need(r, 10, r.real(10))?,
        labels,
        progress: json(r, 12)?.map(|v| progress_from_json(&v)),
        result: json(r, 13)?,
        error: match r.text(14)? {
            Some(code) => Some(OperationError {
                code,
                message: r.text(15)?.unwrap_or_default(),
                retryable: r.flag(16)?.unwrap_or(false),
            }),
            None => None,
        },
        cancel: match r.int(17)? {
            Some(at) => Some(CancelRequest {
                requested_at: Timestamp(at),
                requested_by: r.text(18)?.unwrap_or_default(),
                reason: r.text(19)?,
            }),
            None => None,
        },
        cancellable: need(r, 20, r.flag(20))?,
        idempotency_key: r.text(21)?,
        created_at: Timestamp(need(r, 22, r.int(22))?),
        started_at: ts(23)?,
        completed_at: ts(24)?,
        updated_at: Timestamp(need(r, 25, r.int(25))?),
        expires_at: ts(26)?,
        artifact,
        artifacts,
        rerun_of: r.text(28)?.map(Id::from_trusted),
        reruns: None,
        pause_requested_at: ts(29)?,
        not_before: ts(30)?,
        priority: r.small(31)?,
    })
}

/// The event of operation `id` in the columns `version, type, state, at,
/// data` (and `snapshot`, read only with `replay`: the operation as stored
/// now, from which [`snapshot_from_json`] makes the event's snapshot).
pub(crate) fn event_of<R: Columns + ?Sized>(
    r: &R,
    id: &Id,
    replay: Option<&Operation>,
) -> std::result::Result<Event, R::Error> {
    let version = need(r, 0, r.int(0))?;
    let state: State = need(r, 2, r.text(2))?
        .parse()
        .map_err(|e: longrun_core::state::UnknownState| r.corrupt(2, e.to_string()))?;
    let at = Timestamp(need(r, 3, r.int(3))?);
    let event_type = need(r, 1, r.text(1))?;
    let data = json(r, 4)?.unwrap_or(Value::Null);
    let snapshot = match replay {
        Some(row) => {
            let kept = json(r, 5)?.or_else(|| implied_snapshot(&event_type, &data, at));
            snapshot_from_json(kept.as_ref(), row, version, state, at)
        }
        None => None,
    };
    Ok(Event {
        operation_id: id.clone(),
        version,
        event_type,
        state,
        at,
        data,
        snapshot,
    })
}

/// The snapshot a stored event of type `event_type` with `data` at `at`
/// holds when its column is `NULL` and the plan's `event_row` left it out:
/// a `started` event's; none for any other (the row, at its version).
pub(crate) fn implied_snapshot(event_type: &str, data: &Value, at: Timestamp) -> Option<Value> {
    let attempt = data
        .get("attempt")
        .filter(|_| event_type == EventType::Started.as_str())?;
    Some(json!({"attempt": attempt, "started_at": at.0}))
}
