//! Bytes per stored operation, and where they go, on both stores.
//!
//! `cargo bench -p longrun-cli --bench footprint` (`LONGRUN_FOOTPRINT_OPS`,
//! default 100,000; `LONGRUN_FOOTPRINT_FILLS`, default 2, the PostgreSQL
//! fills).
//!
//! The case of the scaling issue: `sleep` operations with no result and one
//! progress step, submitted through the batch endpoint (100 per request,
//! each with an idempotency key) to a release `longrun serve` whose built-in
//! workers run them all to `succeeded`. The server is then stopped and every
//! table and index is measured: on SQLite with the `dbstat` table (pages in
//! use, and the file's free pages), on PostgreSQL with `pg_relation_size`
//! (its TOAST and free-space map counted with the table) after a
//! `CHECKPOINT`, as found and after a plain `VACUUM`, then after each
//! further fill of as many on top and a `VACUUM` (the space earlier fills'
//! dead row versions left, reused), with what that fill added. Bytes per
//! operation are the whole database's bytes over the operations stored.

#[allow(dead_code)]
mod batches;
mod processes;
mod record;

use std::collections::BTreeMap;
use std::time::Instant;

use processes::{free_port, prepare, serve};
use record::Record;
use serde_json::json;
use sqlx::{Connection, Row};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Submits `n` one-step `sleep` operations and waits until every one ended.
async fn fill(store: &[String], n: usize) -> f64 {
    let (client, _worker) = prepare(store);
    let port = free_port();
    let mut args = vec!["--builtin-workers=true".to_owned()];
    args.extend(store.iter().cloned());
    let mut server = serve(port, &args).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    let body = json!({"kind": "sleep", "input": {"duration_ms": 0, "steps": 1}});
    batches::submit(&http, &base, &client, &body, n).await;
    println!("submitted in {:.1} s", started.elapsed().as_secs_f64());
    batches::drained(&http, &base, &client).await;
    let seconds = started.elapsed().as_secs_f64();
    let _ = server.kill().await;
    let _ = server.wait().await;
    seconds
}

/// Bytes of each table and index, by name.
type Sizes = BTreeMap<String, i64>;

fn sqlite_sizes(path: &std::path::Path) -> (Sizes, i64) {
    let db = rusqlite::Connection::open(path).unwrap();
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    let mut sizes = Sizes::new();
    let mut by_name = db
        .prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
        .unwrap();
    for row in by_name
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (name, bytes) = row.unwrap();
        sizes.insert(name, bytes);
    }
    let page_size: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let free: i64 = db.query_row("PRAGMA freelist_count", [], |r| r.get(0)).unwrap();
    sizes.insert("(free pages)".into(), free * page_size);
    (sizes, std::fs::metadata(path).unwrap().len() as i64)
}

async fn postgres_sizes(url: &str, vacuum: bool) -> (Sizes, i64) {
    let mut db = sqlx::PgConnection::connect(url).await.unwrap();
    if vacuum {
        sqlx::query("VACUUM").execute(&mut db).await.unwrap();
    }
    sqlx::query("CHECKPOINT").execute(&mut db).await.unwrap();
    let mut sizes = Sizes::new();
    for row in sqlx::query(
        "SELECT c.relname::text,
                CASE WHEN c.relkind = 'r' THEN pg_table_size(c.oid) ELSE pg_relation_size(c.oid) END
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'S')",
    )
    .fetch_all(&mut db)
    .await
    .unwrap()
    {
        sizes.insert(row.get(0), row.get(1));
    }
    let total: i64 = sizes.values().sum();
    db.close().await.unwrap();
    (sizes, total)
}

/// The bytes the live rows of the history's tables hold (`pg_column_size`
/// of each row, without page and tuple headers): what a table would shrink
/// to with no free space and no dead versions.
async fn postgres_live_rows(url: &str) -> Sizes {
    let mut db = sqlx::PgConnection::connect(url).await.unwrap();
    let mut sizes = Sizes::new();
    for table in ["operations", "operation_events", "idempotency_keys", "tasks"] {
        let bytes: i64 = sqlx::query_scalar(&format!(
            "SELECT COALESCE(SUM(pg_column_size(t.*)), 0)::BIGINT FROM {table} t"
        ))
        .fetch_one(&mut db)
        .await
        .unwrap();
        sizes.insert(table.to_owned(), bytes);
    }
    db.close().await.unwrap();
    sizes
}

fn print_sizes(record: &mut Record, title: &str, sizes: &Sizes, total: i64, n: usize) {
    record.line(format!(
        "\n{title}: {total} bytes, {:.0} bytes per operation\n",
        total as f64 / n as f64
    ));
    record.line("| table or index | bytes per operation |");
    record.line("|---|---|");
    let mut rows: Vec<_> = sizes.iter().filter(|(_, b)| **b as f64 / n as f64 >= 0.5).collect();
    rows.sort_by_key(|(_, b)| -**b);
    for (name, bytes) in rows {
        record.line(format!("| {name} | {:.0} |", *bytes as f64 / n as f64));
    }
}

fn main() {
    let n = env_number("LONGRUN_FOOTPRINT_OPS", 100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut record = Record::new("footprint");
        record.line(format!(
            "{n} `sleep` operations (one progress step, no result), batch-submitted with idempotency keys, all succeeded"
        ));
        let dir = tempfile::tempdir().unwrap();
        let store = vec!["--data-dir".to_owned(), dir.path().display().to_string()];
        let seconds = fill(&store, n).await;
        record.line(format!("SQLite filled in {seconds:.1} s"));
        let (sizes, file) = sqlite_sizes(&dir.path().join("longrun.db"));
        print_sizes(&mut record, "SQLite file", &sizes, file, n);
        match longrun_store::pgtest::start_durable() {
            Ok(cluster) => {
                let url = cluster.database().await;
                let seconds = fill(&["--database".to_owned(), url.clone()], n).await;
                record.line(format!("\nPostgreSQL filled in {seconds:.1} s"));
                let (sizes, total) = postgres_sizes(&url, false).await;
                print_sizes(&mut record, "PostgreSQL, as found", &sizes, total, n);
                let (sizes, vacuumed) = postgres_sizes(&url, true).await;
                print_sizes(&mut record, "PostgreSQL, after VACUUM", &sizes, vacuumed, n);
                let live = postgres_live_rows(&url).await;
                let total = live.values().sum();
                print_sizes(&mut record, "PostgreSQL, the live rows' own bytes (no headers, free space or indexes)", &live, total, n);
                // A store that keeps running reuses what VACUUM freed: the
                // same fill again, on top, shows what a steady flow costs;
                // what each further fill adds to the database, per
                // operation, is what one more stored operation costs.
                let fills = env_number("LONGRUN_FOOTPRINT_FILLS", 2).max(2);
                let mut before = vacuumed;
                for k in 2..=fills {
                    let seconds = fill(&["--database".to_owned(), url.clone()], n).await;
                    record.line(format!("\nPostgreSQL filled again ({n} more) in {seconds:.1} s"));
                    let (sizes, total) = postgres_sizes(&url, true).await;
                    let title = format!("PostgreSQL, {k} fills after VACUUM (per operation of {})", k * n);
                    print_sizes(&mut record, &title, &sizes, total, k * n);
                    record.line(format!(
                        "\nwhat fill {k} added after VACUUM: {} bytes per operation",
                        (total - before) / n as i64
                    ));
                    before = total;
                }
            }
            Err(why) => record.line(format!("PostgreSQL is not available here ({why}); its rows are skipped")),
        }
        if let Some(path) = record.write() {
            println!("\nrecorded in {}", path.display());
        }
    });
}
