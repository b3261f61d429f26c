//! Runs a shared [`Script`] on a PostgreSQL connection.

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Column, Postgres, TypeInfo};

use super::*;

pub(super) fn bind<'q>(q: Query<'q, Postgres, PgArguments>, v: &'q Val) -> Query<'q, Postgres, PgArguments> {
    match v {
        Val::Null(Kind::Int) => q.bind(None::<i64>),
        Val::Null(Kind::Real) => q.bind(None::<f64>),
        Val::Null(Kind::Text) => q.bind(None::<&str>),
        Val::Null(Kind::Bytes) => q.bind(None::<&[u8]>),
        Val::Null(Kind::Bool) => q.bind(None::<bool>),
        Val::Int(v) => q.bind(*v),
        Val::Real(v) => q.bind(*v),
        Val::Text(v) => q.bind(v.as_str()),
        Val::Bytes(v) => q.bind(v.as_slice()),
        Val::Bool(v) => q.bind(*v),
    }
}

fn row(r: &PgRow) -> Result<crate::shared::Row> {
    let get = |i: usize| -> Result<Val> {
        let type_name = r.column(i).type_info().name().to_owned();
        let or_null = |kind, v: Option<Val>| v.unwrap_or(Val::Null(kind));
        Ok(match type_name.as_str() {
            "INT8" => or_null(Kind::Int, r.try_get::<Option<i64>, _>(i).map_err(db)?.map(Val::Int)),
            "INT4" => or_null(
                Kind::Int,
                r.try_get::<Option<i32>, _>(i).map_err(db)?.map(|v| Val::Int(v.into())),
            ),
            "INT2" => or_null(
                Kind::Int,
                r.try_get::<Option<i16>, _>(i).map_err(db)?.map(|v| Val::Int(v.into())),
            ),
            "FLOAT8" => or_null(Kind::Real, r.try_get::<Option<f64>, _>(i).map_err(db)?.map(Val::Real)),
            "BOOL" => or_null(Kind::Bool, r.try_get::<Option<bool>, _>(i).map_err(db)?.map(Val::Bool)),
            "BYTEA" => or_null(
                Kind::Bytes,
                r.try_get::<Option<Vec<u8>>, _>(i).map_err(db)?.map(Val::Bytes),
            ),
            "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => or_null(
                Kind::Text,
                r.try_get::<Option<String>, _>(i).map_err(db)?.map(Val::Text),
            ),
            other => {
                return Err(StoreError::Corrupt(format!(
                    "a shared statement read a column of type {other}"
                )));
            }
        })
    };
    Ok(crate::shared::Row((0..r.len()).map(get).collect::<Result<_>>()?))
}

/// Runs `script`'s statements in order on `c` and decodes the last one's
/// answer (the caller holds the transaction when there are several).
pub(super) async fn run<T>(c: &mut PgConnection, script: &Script<T>) -> Result<T> {
    let mut last = Done::default();
    for (i, stmt) in script.stmts.iter().enumerate() {
        let sql = pg(stmt.sql);
        let q = stmt.args.iter().fold(sqlx::query(&sql), bind);
        let reads = stmt.sql.trim_start().starts_with("SELECT") || stmt.sql.contains("RETURNING");
        let (rows, changed) = if reads {
            let rows = q.fetch_all(&mut *c).await.map_err(db)?;
            let changed = rows.len() as u64;
            (rows.iter().map(row).collect::<Result<_>>()?, changed)
        } else {
            (Vec::new(), q.execute(&mut *c).await.map_err(db)?.rows_affected())
        };
        if i > 0 {
            last.before.push(std::mem::take(&mut last.rows));
        }
        last.rows = rows;
        last.changed = changed;
    }
    (script.decode)(last)
}

/// The plan PostgreSQL makes for `stmt`, its arguments bound (for the
/// tests of which index a statement reads).
#[cfg(test)]
pub(crate) async fn explain(c: &mut PgConnection, stmt: &Stmt) -> String {
    let sql = format!("EXPLAIN {}", pg(stmt.sql));
    let rows = stmt
        .args
        .iter()
        .fold(sqlx::query(&sql), bind)
        .fetch_all(c)
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

impl PostgresStore {
    /// Runs a shared script: a single statement on a connection of the
    /// pool, several in one transaction.
    pub(super) async fn script<T: Send + 'static>(&self, script: Script<T>) -> Result<T> {
        if script.stmts.len() > 1 {
            return self
                .tx(move |c, _changes| Box::pin(async move { run(c, &script).await }))
                .await;
        }
        let mut c = self.pool.acquire().await.map_err(db)?;
        run(&mut c, &script).await
    }
}
