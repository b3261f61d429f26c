//! Statements both stores run as written. A [`Script`] is the text of its
//! statements in SQLite's `?N` form (PostgreSQL runs them through
//! [`pg`](super::pg)), the [`Val`]s they bind, and the one function that
//! turns the last statement's rows into the answer. Each driver has one
//! runner (`sqlite/script.rs`, `postgres/script.rs`); what a use case of the
//! small tables reads and writes is written once, here and in
//! [`admin`](super::admin).
//!
//! Not for the job path: a `Val` costs an allocation per text, and the hot
//! statements are tuned per dialect on purpose (docs/ARCHITECTURE.md, "One
//! plan, two drivers").

use super::*;

/// The type of a value, which PostgreSQL needs even for a `NULL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Int,
    Real,
    Text,
    Bytes,
    Bool,
}

/// A value bound to or read from a statement of either store. SQLite has no
/// boolean: it binds `Bool` as an integer and reads one back as `Int`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null(Kind),
    Int(i64),
    Real(f64),
    Text(String),
    Bytes(Vec<u8>),
    Bool(bool),
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}

impl From<f64> for Val {
    fn from(v: f64) -> Self {
        Val::Real(v)
    }
}

impl From<bool> for Val {
    fn from(v: bool) -> Self {
        Val::Bool(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_owned())
    }
}

impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}

impl From<&[u8]> for Val {
    fn from(v: &[u8]) -> Self {
        Val::Bytes(v.to_vec())
    }
}

impl From<Timestamp> for Val {
    fn from(v: Timestamp) -> Self {
        Val::Int(v.0)
    }
}

/// A type with a [`Kind`], so that its `None` binds as a typed `NULL`.
pub(crate) trait Typed: Into<Val> {
    const KIND: Kind;
}

impl Typed for i64 {
    const KIND: Kind = Kind::Int;
}
impl Typed for f64 {
    const KIND: Kind = Kind::Real;
}
impl Typed for String {
    const KIND: Kind = Kind::Text;
}
impl Typed for &str {
    const KIND: Kind = Kind::Text;
}
impl Typed for Timestamp {
    const KIND: Kind = Kind::Int;
}

impl<T: Typed> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null(T::KIND), Into::into)
    }
}

/// One statement and what it binds (`?1` is `args[0]`).
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub sql: &'static str,
    pub args: Vec<Val>,
}

/// What the last statement of a script answered, and the rows of those
/// before it.
#[derive(Default)]
pub(crate) struct Done {
    /// Its rows, each column a [`Val`].
    pub rows: Vec<Row>,
    /// The rows it changed.
    pub changed: u64,
    /// The rows each earlier statement read, in order.
    pub before: Vec<Vec<Row>>,
}

/// Statements run in order, in one transaction when there are several,
/// and how the last one's answer becomes `T`.
pub(crate) struct Script<T> {
    pub stmts: Vec<Stmt>,
    pub decode: fn(Done) -> Result<T>,
}

impl<T> Script<T> {
    /// One statement.
    pub(crate) fn one(sql: &'static str, args: Vec<Val>, decode: fn(Done) -> Result<T>) -> Self {
        Self {
            stmts: vec![Stmt { sql, args }],
            decode,
        }
    }
}

/// Where a statement writes the store's clock: the milliseconds since the
/// epoch, as each dialect reads them.
pub(crate) const NOW_MS: &str = "{now_ms}";

/// Where a read locks the rows it returns for the rest of the transaction
/// (`FOR UPDATE` on PostgreSQL; SQLite's one writer needs no lock).
pub(crate) const FOR_UPDATE: &str = "{for_update}";

/// Where a read of shared work locks the rows it returns and skips those
/// another transaction holds (`FOR UPDATE SKIP LOCKED` on PostgreSQL;
/// SQLite's one writer needs neither).
pub(crate) const SKIP_LOCKED: &str = "{skip_locked}";

/// Text only one dialect runs: `{pg: …}` and `{sqlite: …}` (no nested
/// braces). What the other dialect would need there is written in its own
/// section, or nothing (a lock SQLite's one writer does not need).
fn sections(sql: &str, keep: &str, drop: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let section = &rest[at..];
        let end = section.find('}').map_or(section.len(), |e| e + 1);
        let inner = &section[1..end.saturating_sub(1).max(1)];
        if let Some(text) = inner.strip_prefix(keep) {
            out.push_str(text.trim_start());
        } else if !inner.starts_with(drop) {
            out.push_str(&section[..end]);
        }
        rest = &section[end..];
    }
    out.push_str(rest);
    out
}

/// A shared statement in PostgreSQL's spelling: `$N` for `?N` (no shared
/// statement holds a literal `?`), its clock, its row locks and its
/// `{pg: …}` sections.
pub(crate) fn pg(sql: &str) -> String {
    let sql = sql
        .replace(NOW_MS, "(extract(epoch from clock_timestamp()) * 1000)::BIGINT")
        .replace(FOR_UPDATE, "FOR UPDATE")
        .replace(SKIP_LOCKED, "FOR UPDATE SKIP LOCKED");
    sections(&sql, "pg:", "sqlite:").replace('?', "$")
}

/// A shared statement in SQLite's spelling: as written, but its clock, its
/// (absent) row locks and its `{sqlite: …}` sections.
pub(crate) fn sqlite_sql(sql: &str) -> std::borrow::Cow<'_, str> {
    if !sql.contains('{') {
        return sql.into();
    }
    let sql = sql
        .replace(NOW_MS, "CAST(unixepoch('subsec') * 1000 AS INTEGER)")
        .replace(FOR_UPDATE, "")
        .replace(SKIP_LOCKED, "");
    sections(&sql, "sqlite:", "pg:").into()
}

/// A row read back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row(pub Vec<Val>);

impl Row {
    fn at(&self, i: usize) -> Result<&Val> {
        self.0
            .get(i)
            .ok_or_else(|| StoreError::Corrupt(format!("a row of {} columns has no column {i}", self.0.len())))
    }

    fn wrong(&self, i: usize, want: &str) -> StoreError {
        StoreError::Corrupt(format!("column {i} is {:?}, not {want}", self.0.get(i)))
    }

    pub(crate) fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| self.wrong(i, "an integer"))
    }

    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.at(i)? {
            Val::Int(v) => Ok(Some(*v)),
            Val::Null(_) => Ok(None),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    pub(crate) fn opt_real(&self, i: usize) -> Result<Option<f64>> {
        match self.at(i)? {
            Val::Real(v) => Ok(Some(*v)),
            // SQLite keeps a whole REAL it was given as an integer.
            #[allow(clippy::cast_precision_loss)]
            Val::Int(v) => Ok(Some(*v as f64)),
            Val::Null(_) => Ok(None),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    pub(crate) fn text(&self, i: usize) -> Result<String> {
        self.opt_text(i)?.ok_or_else(|| self.wrong(i, "text"))
    }

    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.at(i)? {
            Val::Text(v) => Ok(Some(v.clone())),
            Val::Null(_) => Ok(None),
            _ => Err(self.wrong(i, "text")),
        }
    }

    pub(crate) fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        match self.at(i)? {
            Val::Bytes(v) => Ok(v.clone()),
            _ => Err(self.wrong(i, "bytes")),
        }
    }

    pub(crate) fn bool(&self, i: usize) -> Result<bool> {
        match self.at(i)? {
            Val::Bool(v) => Ok(*v),
            Val::Int(v) => Ok(*v != 0),
            _ => Err(self.wrong(i, "a boolean")),
        }
    }

    pub(crate) fn ts(&self, i: usize) -> Result<Timestamp> {
        self.int(i).map(Timestamp)
    }

    pub(crate) fn opt_ts(&self, i: usize) -> Result<Option<Timestamp>> {
        Ok(self.opt_int(i)?.map(Timestamp))
    }

    pub(crate) fn state(&self, i: usize) -> Result<State> {
        self.text(i)?
            .parse()
            .map_err(|e: longrun_core::state::UnknownState| StoreError::Corrupt(e.to_string()))
    }

    /// A JSON column kept as text.
    pub(crate) fn json(&self, i: usize) -> Result<Option<Value>> {
        self.opt_text(i)?
            .map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(format!("column {i}: {e}"))))
            .transpose()
    }

    /// A `COUNT(*)`.
    pub(crate) fn count(&self, i: usize) -> Result<u64> {
        Ok(u64::try_from(self.int(i)?).unwrap_or(0))
    }
}

/// Answers nothing.
pub(crate) fn nothing(_: Done) -> Result<()> {
    Ok(())
}

/// Whether the last statement changed a row.
pub(crate) fn changed_one(d: Done) -> Result<bool> {
    Ok(d.changed == 1)
}

/// The one row, if any, decoded by `f`.
pub(crate) fn optional<T>(d: Done, f: impl Fn(&Row) -> Result<T>) -> Result<Option<T>> {
    d.rows.first().map(f).transpose()
}

/// Every row, decoded by `f`.
pub(crate) fn all<T>(d: Done, f: impl Fn(&Row) -> Result<T>) -> Result<Vec<T>> {
    d.rows.iter().map(f).collect()
}

/// The one row, which must be there.
pub(crate) fn one<T>(d: Done, f: impl Fn(&Row) -> Result<T>) -> Result<T> {
    let row = d
        .rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("a statement that reads one row read none".into()))?;
    f(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_spells_the_markers_its_own_way() {
        let sql = "SELECT a FROM t WHERE id = ?1 AND at < {now_ms} AND b = ?12 {for_update}";
        assert_eq!(
            pg(sql),
            "SELECT a FROM t WHERE id = $1 AND at < (extract(epoch from clock_timestamp()) * 1000)::BIGINT \
             AND b = $12 FOR UPDATE"
        );
        assert_eq!(
            sqlite_sql(sql),
            "SELECT a FROM t WHERE id = ?1 AND at < CAST(unixepoch('subsec') * 1000 AS INTEGER) AND b = ?12 "
        );
        assert_eq!(
            pg("SELECT a FROM t LIMIT ?1 {skip_locked}"),
            "SELECT a FROM t LIMIT $1 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            sqlite_sql("SELECT a FROM t LIMIT ?1 {skip_locked}"),
            "SELECT a FROM t LIMIT ?1 "
        );
        assert!(matches!(sqlite_sql("SELECT 1"), std::borrow::Cow::Borrowed(_)));
        let sql =
            "SELECT a FROM t JOIN u ON u.id = t.id WHERE t.b{sqlite: = 1} LIMIT ?2 {pg: FOR UPDATE OF t SKIP LOCKED}";
        assert_eq!(
            pg(sql),
            "SELECT a FROM t JOIN u ON u.id = t.id WHERE t.b LIMIT $2 FOR UPDATE OF t SKIP LOCKED"
        );
        assert_eq!(
            sqlite_sql(sql),
            "SELECT a FROM t JOIN u ON u.id = t.id WHERE t.b= 1 LIMIT ?2 "
        );
    }

    #[test]
    fn a_none_is_a_null_of_its_type_and_rows_read_either_dialects_forms() {
        assert_eq!(Val::from(None::<i64>), Val::Null(Kind::Int));
        assert_eq!(Val::from(None::<&str>), Val::Null(Kind::Text));
        assert_eq!(Val::from(Some(Timestamp(5))), Val::Int(5));
        let row = Row(vec![Val::Int(1), Val::Bool(false), Val::Int(3), Val::Null(Kind::Real)]);
        assert!(row.bool(0).unwrap(), "SQLite's integer boolean");
        assert!(!row.bool(1).unwrap(), "PostgreSQL's boolean");
        assert_eq!(
            row.opt_real(2).unwrap(),
            Some(3.0),
            "SQLite keeps a whole REAL as an integer"
        );
        assert_eq!(row.opt_real(3).unwrap(), None);
        assert!(
            row.text(0).is_err() && row.int(9).is_err(),
            "a wrong type or column is corrupt data"
        );
    }
}
