//! How long the console's pages take to render, with few and with a
//! million stored operations, on both stores.
//!
//! `cargo bench -p longrun-cli --bench console_pages`
//!
//! Each store gets 1,000 operations made through the store (some running,
//! some ended, with history), and each page is read `LONGRUN_BENCH_READS`
//! times (default 40) over HTTP with a signed-in session: median and p99.
//! Then `LONGRUN_CONSOLE_SEED` (default 1,000,000) ended operations are
//! written straight into the database with one SQL statement (the store's
//! own paths would take many minutes to make that many), and the pages are
//! read again. The last column is the ratio: a page whose cost grows with
//! history shows it there. PostgreSQL runs in a throwaway cluster when its
//! binaries are on the machine.

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use longrun_core::apikey::Role;
use longrun_core::{Clock, Id, IdKind, SystemClock};
use longrun_server::ServeOptions;
use longrun_store::{AcceptParams, ClaimParams, SqliteConfig, Store};
use serde_json::json;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Signs in and returns the session cookie.
async fn session(http: &reqwest::Client, base: &str, key: &str) -> String {
    let response = http
        .post(format!("{base}/ui/sign-in"))
        .form(&[("key", key), ("next", "/ui/")])
        .send()
        .await
        .unwrap();
    let cookie = response.headers()["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

/// Median and p99 of `reads` sequential GETs of `path`, in milliseconds.
async fn time_page(http: &reqwest::Client, base: &str, cookie: &str, path: &str, reads: usize) -> (f64, f64) {
    let mut samples = Vec::with_capacity(reads);
    for _ in 0..reads {
        let started = Instant::now();
        let response = http
            .get(format!("{base}{path}"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{path}: {}", response.status());
        response.bytes().await.unwrap();
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let p99 = samples[((samples.len() as f64 * 0.99).ceil() as usize).min(samples.len()) - 1];
    (samples[samples.len() / 2], p99)
}

/// 1,000 operations through the store: 900 ended, 100 running or queued.
async fn made_through_the_store(store: &dyn Store) -> Id {
    common::rerun_safe_kind(store, "bench").await;
    let now = SystemClock.now();
    let mut batch = Vec::new();
    for i in 0..1000 {
        batch.push(AcceptParams {
            id: Id::generate(IdKind::Operation),
            tenant: if i % 2 == 0 { "acme".into() } else { "globex".into() },
            kind: "bench".into(),
            input: json!({"n": i}),
            callback_url: None,
            deadline_at: None,
            budget_max_cost: None,
            labels: [("team".to_owned(), format!("t{}", i % 7))].into(),
            idempotency: None,
            uploads: Vec::new(),
            rerun_of: None,
            from_checkpoint: false,
            not_before: None,
            priority: longrun_store::PRIORITY_DEFAULT,
            now,
        });
    }
    let ids: Vec<Id> = batch.iter().map(|p| p.id.clone()).collect();
    for outcome in store.operation_accept_many(batch).await {
        outcome.unwrap();
    }
    let tasks = store
        .task_claim(ClaimParams {
            kinds: vec!["bench".into()],
            max_tasks: 950,
            lease: Duration::from_secs(3600),
            worker_id: "bench".into(),
            now,
        })
        .await
        .unwrap();
    let finishes = tasks
        .iter()
        .take(900)
        .map(|t| longrun_store::FinishParams {
            operation_id: t.operation_id.clone(),
            lease_token: t.lease_token.clone(),
            outcome: longrun_store::Outcome::Succeeded {
                result: Some(json!({"ok": true})),
            },
            progress: None,
            now,
        })
        .collect();
    for outcome in store.task_finish_many(finishes).await {
        outcome.unwrap();
    }
    ids[0].clone()
}

/// The statement that writes `n` ended operations of tenant `acme`.
fn seed_sql(n: usize, postgres: bool) -> String {
    let now = SystemClock.now().0;
    let rows = if postgres {
        format!("FROM generate_series(1, {n}) AS s(i)")
    } else {
        format!("FROM (WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) SELECT i FROM s)")
    };
    let id = if postgres {
        "'op_seed' || lpad(i::text, 19, '0')"
    } else {
        "'op_seed' || printf('%019d', i)"
    };
    let state = "CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END";
    format!(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, created_at, started_at, completed_at,
                                 updated_at, expires_at, result, error_code, error_message, error_retryable)
         SELECT {id}, 'acme', 'bench', {state}, 3, 1, '{{\"team\":\"seed\"}}', {now} - 86400000 + i, {now} - 86400000 + i,
                {now} - 86400000 + i, {now} - 86400000 + i, {now} + 86400000,
                CASE WHEN i % 10 = 0 THEN NULL ELSE '{{\"ok\":true}}' END,
                CASE WHEN i % 10 = 0 THEN 'boom' ELSE NULL END,
                CASE WHEN i % 10 = 0 THEN 'it failed' ELSE NULL END,
                CASE WHEN i % 10 = 0 THEN FALSE ELSE NULL END
         {rows}"
    )
}

struct Pages {
    names: Vec<(&'static str, String)>,
}

fn pages(op: &Id) -> Pages {
    Pages {
        names: vec![
            ("overview (admin)", "/ui/".into()),
            ("operations, every tenant (admin)", "/ui/operations".into()),
            ("operations of acme", "/ui/operations?tenant=acme".into()),
            (
                "operations of acme, failed",
                "/ui/operations?tenant=acme&state=failed".into(),
            ),
            ("operations, kind bench", "/ui/operations?kind=bench".into()),
            ("one operation", format!("/ui/operations/{op}")),
            ("workers", "/ui/workers".into()),
            ("tenants", "/ui/tenants".into()),
        ],
    }
}

async fn measure(base: &str, cookie: &str, op: &Id, reads: usize) -> Vec<(f64, f64)> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for (_, path) in pages(op).names {
        // One read first: caches and prepared statements, as a person's second click.
        time_page(&http, base, cookie, &path, 1).await;
        out.push(time_page(&http, base, cookie, &path, reads).await);
    }
    out
}

fn main() {
    let reads = env_number("LONGRUN_BENCH_READS", 40);
    let seed = env_number("LONGRUN_CONSOLE_SEED", 1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let cluster = longrun_store::pgtest::start_durable();
        if let Err(why) = &cluster {
            println!("PostgreSQL is not available here ({why}); SQLite only");
        }
        let dir = tempfile::tempdir().unwrap();
        let mut stores = vec!["SQLite"];
        if cluster.is_ok() {
            stores.push("PostgreSQL");
        }
        for name in stores {
            let db_path = dir.path().join("console.db");
            let mut options = ServeOptions::new("127.0.0.1:0".parse().unwrap(), SqliteConfig::new(db_path.clone()));
            options.builtin_workers = false;
            options.artifacts_dir = dir.path().join(format!("artifacts-{name}"));
            let mut url = None;
            if let Ok(cluster) = &cluster
                && name == "PostgreSQL"
            {
                let database = cluster.database().await;
                options.postgres = Some(longrun_store::postgres::PostgresConfig::new(database.clone()));
                url = Some(database);
            }
            let server = longrun_server::start(options).await.unwrap();
            let store = server.store.clone();
            let base = format!("http://{}", server.addr);
            let admin = common::key_of(store.as_ref(), "ops", Role::Admin).await;
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap();
            let cookie = session(&http, &base, &admin).await;
            let op = made_through_the_store(store.as_ref()).await;

            let few = measure(&base, &cookie, &op, reads).await;
            let started = Instant::now();
            let sql = seed_sql(seed, url.is_some());
            match &url {
                Some(url) => {
                    use sqlx::Connection;
                    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                    sqlx::query(&sql).execute(&mut c).await.unwrap();
                    sqlx::query("ANALYZE operations").execute(&mut c).await.unwrap();
                }
                None => {
                    let c = rusqlite::Connection::open(&db_path).unwrap();
                    c.busy_timeout(Duration::from_secs(60)).unwrap();
                    c.execute_batch(&sql).unwrap();
                    c.execute_batch("ANALYZE").unwrap();
                }
            }
            println!(
                "{name}: wrote {seed} ended operations in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            let many = measure(&base, &cookie, &op, reads).await;

            println!("\n{name}: console pages, {reads} reads each, ms (median / p99)");
            println!(
                "{:<36} {:>18} {:>22} {:>8}",
                "page",
                "1,000 operations",
                format!("{} more", seed),
                "ratio"
            );
            for (((page, _), (m1, p1)), (m2, p2)) in pages(&op).names.iter().zip(&few).zip(&many) {
                println!(
                    "{page:<36} {m1:>8.2} / {p1:>7.2} {m2:>10.2} / {p2:>9.2} {:>8.2}",
                    m2 / m1
                );
            }
            println!();
            server.shutdown().await.unwrap();
        }
    });
}
