//! Runs a shared [`Script`] on a SQLite connection: in the writer's
//! transaction for writes, on a reader for reads.

use rusqlite::ToSql;
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::*;

impl ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Val::Null(_) => ValueRef::Null,
            Val::Int(v) => ValueRef::Integer(*v),
            Val::Real(v) => ValueRef::Real(*v),
            Val::Text(v) => ValueRef::Text(v.as_bytes()),
            Val::Bytes(v) => ValueRef::Blob(v),
            Val::Bool(v) => ValueRef::Integer(i64::from(*v)),
        }))
    }
}

fn val(v: ValueRef<'_>) -> Result<Val> {
    Ok(match v {
        ValueRef::Null => Val::Null(Kind::Text),
        ValueRef::Integer(v) => Val::Int(v),
        ValueRef::Real(v) => Val::Real(v),
        ValueRef::Text(v) => Val::Text(
            std::str::from_utf8(v)
                .map_err(|e| StoreError::Corrupt(format!("text that is not UTF-8: {e}")))?
                .to_owned(),
        ),
        ValueRef::Blob(v) => Val::Bytes(v.to_vec()),
    })
}

/// Runs `script`'s statements in order and decodes the last one's answer.
pub(super) fn run<T>(c: &Connection, script: &Script<T>) -> Result<T> {
    let mut last = Done::default();
    for (i, stmt) in script.stmts.iter().enumerate() {
        let mut st = c.prepare_cached(&sqlite_sql(stmt.sql))?;
        let mut rows = st.query(rusqlite::params_from_iter(stmt.args.iter()))?;
        let mut read = Vec::new();
        while let Some(r) = rows.next()? {
            let n = r.as_ref().column_count();
            read.push(crate::shared::Row(
                (0..n).map(|i| val(r.get_ref(i)?)).collect::<Result<_>>()?,
            ));
        }
        drop(rows);
        if i > 0 {
            last.before.push(std::mem::take(&mut last.rows));
        }
        last.rows = read;
        last.changed = c.changes();
    }
    (script.decode)(last)
}
