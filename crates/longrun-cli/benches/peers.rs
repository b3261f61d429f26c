//! Longrun beside graphile-worker on the same machine, in the same run.
//!
//! `cargo bench -p longrun-cli --bench peers` starts a throwaway PostgreSQL
//! with fsync on, installs graphile-worker (pinned, from the npm registry,
//! cached under `target/peers/`) and alternates, for `LONGRUN_PEER_ROUNDS`
//! rounds (3), draining `LONGRUN_PEER_JOBS` (20,000) queued no-op jobs:
//!
//! - graphile-worker plain and batched (local queue of 500, batched
//!   completions), 2 processes × 10 concurrent jobs each;
//! - Longrun in process (`sleep` 0 ms, 1 step, built-in workers) on
//!   PostgreSQL and SQLite: a release `longrun serve` restarted on a full queue;
//! - Longrun remote (a `noop` kind, 2 `RemoteWorker`s × 64 slots over HTTP,
//!   batch claims and batched outcomes) on PostgreSQL and SQLite;
//! - the Python SDK's worker (2 processes × 64 slots, `sdk/python/benches/
//!   noop_worker.py`) on the same queue, beside the Rust remote drain;
//! - batch submissions (100 per request, 4 clients; each client's first
//!   request opens the connections and is not timed) and single submissions
//!   (p99) beside pgbench's single-row INSERT (32 clients) and a bare axum
//!   POST (in a process of its own, as `longrun serve` is) as the ceilings;
//! - `GET /v1/operations/{id}`, plain (200) and revalidated with its ETag
//!   (304), and `/healthz`, beside a bare axum GET (one operation that does
//!   not change: the store's read cache answers after the first read).
//!   Every HTTP load figure (single submits, GETs, the bare axum ceilings)
//!   is `wrk -t2 -c32` in a process of its own (Debian's `wrk`, installed
//!   with apt-get when missing and root; without it those rows are skipped
//!   and say so): a load generator inside the bench shared the server's two
//!   cores and was the ceiling of both sides;
//! - pickup latency: an idle remote worker waiting in a claim, one
//!   submission at a time, from the request's send to the handler's start.
//!
//! - once, after the rounds: the p99 of single submits, GETs, idle
//!   pickup, the tenant's list (first page, a page halfway down, the first
//!   page of one state) and the console (overview, one operation's page)
//!   on a nearly empty store and on one to which
//!   `LONGRUN_PEER_HISTORY` (1,000,000) ended operations with their keys
//!   and events were added (written straight into the tables, then
//!   vacuumed and analyzed on PostgreSQL and checkpointed on SQLite; needs
//!   `sqlite3` for SQLite), alternating between the two stores.
//!   Each size is measured `LONGRUN_PEER_HISTORY_SAMPLES` (5) times, in
//!   pairs (medians shown; the ratio is the median of the pairs' ratios);
//!   idle pickup takes 300 samples there, 100 in the rounds. The same
//!   again with `LONGRUN_PEER_HISTORY` queued operations of the measured
//!   tenant and kind that start a day later (`*-scheduled`): a claim must
//!   not read them.
//!
//! Before each measurement the databases of the earlier ones are dropped,
//! PostgreSQL checkpoints and the file systems are synced (`settle`; in the
//! history, whose stores stay, only the checkpoint and the sync), so that
//! no figure pays for the background work of the one before it.
//!
//! It prints the medians and the ratios. Longrun keeps every operation and
//! its history; graphile-worker deletes finished jobs.
//!
//! `LONGRUN_PEER_CONCURRENCY` (64) sets the servers' `--worker-concurrency`
//! (the in-process drains' slots).
//!
//! `LONGRUN_PEER_ONLY` (comma-separated groups: `graphile`, `pgbench`,
//! `axum`, `pg`, `sqlite`, or one of `pg-in-process`, `pg-remote`,
//! `pg-python`, `pg-submits`, `pg-reads`, `pg-pickup`, `pg-history`, `pg-scheduled` and the same for `sqlite`) runs
//! only those, for a quick look while working.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use longrun_core::validate::Invalid;
use longrun_worker::Registry;
use longrun_worker::remote::{RemoteConfig, RemoteWorker};
use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

mod batches;
mod processes;
mod record;

use processes::{free_port, listening, prepare, serve};

const GRAPHILE_WORKER: &str = "0.17.3";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether `group` (e.g. `pg-remote`) is measured in this run: every group
/// unless `LONGRUN_PEER_ONLY` names it or its prefix (`pg`).
fn wanted(group: &str) -> bool {
    let asked = std::env::var("LONGRUN_PEER_ONLY").map_or(true, |only| {
        only.split(',')
            .map(str::trim)
            .any(|g| group == g || group.strip_prefix(g).is_some_and(|rest| rest.starts_with('-')))
    });
    asked && (!measured_over_http(group) || wrk_here())
}

/// The groups whose figures are HTTP load, which only `wrk` measures.
fn measured_over_http(group: &str) -> bool {
    group == "axum"
        || ["-submits", "-reads", "-history", "-scheduled"]
            .iter()
            .any(|s| group.ends_with(s))
}

/// Whether `wrk` is here (see `wrk_installed`), asked once; says loudly
/// what is skipped without it.
fn wrk_here() -> bool {
    static HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HERE.get_or_init(|| {
        let here = wrk_installed();
        if !here {
            println!("wrk is not installed (Debian's wrk package): the HTTP load rows are SKIPPED");
        }
        here
    })
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// graphile-worker installed under `target/peers`, or why not.
fn install_graphile() -> Result<PathBuf, String> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/peers/graphile-worker-{GRAPHILE_WORKER}"));
    let bin = dir.join("node_modules/.bin/graphile-worker");
    if !bin.exists() {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(format!("graphile-worker@{GRAPHILE_WORKER}"))
            .output()
            .map_err(|e| format!("npm: {e}"))?;
        if !out.status.success() {
            return Err(format!("npm install failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    std::fs::create_dir_all(dir.join("tasks")).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("tasks/noop.js"), "module.exports = async () => {};\n").map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Before each measurement: the databases of the ones before it are
/// dropped and the file systems synced, so that neither PostgreSQL
/// (autovacuum, the checkpointer) nor the kernel (write-back of the last
/// drain's pages) is still working through an earlier figure's data while
/// the next one is measured. Every figure, the peers' and the ceilings'
/// included, starts from the same quiet machine.
async fn settle(cluster: &longrun_store::pgtest::Cluster) {
    let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port);
    let pool = sqlx::PgPool::connect(&admin).await.unwrap();
    let earlier: Vec<String> = sqlx::query_scalar("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
        .bind(format!("t{}_", std::process::id()))
        .fetch_all(&pool)
        .await
        .unwrap();
    for name in earlier {
        sqlx::raw_sql(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    checkpointed(cluster).await;
}

/// A checkpoint of the cluster, then the file systems synced: what the
/// measurements before wrote is on disk, not still being written back
/// under the next one.
async fn checkpointed(cluster: &longrun_store::pgtest::Cluster) {
    let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port);
    sql(&admin, "CHECKPOINT").await;
    synced().await;
}

/// The file systems synced: nothing written before is still being written back.
async fn synced() {
    let synced = tokio::process::Command::new("sync").status().await;
    assert!(synced.is_ok_and(|s| s.success()), "sync runs");
}

async fn sql(url: &str, statement: &str) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(statement).execute(&pool).await.unwrap();
    pool.close().await;
}

/// Drains `jobs` queued no-op jobs with 2 graphile-worker processes; jobs/s.
async fn graphile(dir: &Path, url: &str, jobs: usize, batched: bool) -> f64 {
    let bin = dir.join("node_modules/.bin/graphile-worker");
    let config = if batched {
        "module.exports = { worker: { concurrentJobs: 10, pollInterval: 2000, localQueue: { size: 500 }, \
         completeJobBatchDelay: 0, failJobBatchDelay: 0 } };\n"
    } else {
        "module.exports = { worker: { concurrentJobs: 10, pollInterval: 2000 } };\n"
    };
    std::fs::write(dir.join("graphile.config.js"), config).unwrap();
    let status = Command::new(&bin)
        .args(["-c", url, "--schema-only"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success(), "graphile-worker --schema-only");
    sql(
        url,
        &format!("SELECT graphile_worker.add_job('noop') FROM generate_series(1, {jobs})"),
    )
    .await;
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let started = Instant::now();
    let mut workers: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(&bin)
                .args(["-c", url])
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM graphile_worker._private_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    for w in &mut workers {
        let _ = w.kill().await;
    }
    pool.close().await;
    rate
}

/// Kills a server and waits until it is gone, so the next one may open
/// the same SQLite database.
async fn stopped(mut server: Child) {
    let _ = server.kill().await;
    let _ = server.wait().await;
}

/// `longrun serve` on `store`, with or without its built-in workers.
async fn serve_store(store: &[String], port: u16, builtin: bool) -> Child {
    let mut args = vec![
        format!("--builtin-workers={builtin}"),
        "--worker-concurrency".into(),
        env_number("LONGRUN_PEER_CONCURRENCY", 64).to_string(),
    ];
    args.extend(store.iter().cloned());
    serve(port, &args).await
}

struct Longrun {
    store: Vec<String>,
    client: String,
    worker: String,
    http: reqwest::Client,
}

impl Longrun {
    fn new(store: Vec<String>) -> Self {
        let (client, worker) = prepare(&store);
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
        Self {
            store,
            client,
            worker,
            http,
        }
    }

    /// Queues `jobs` operations of `body` through the batch endpoint (100 per
    /// request, 4 clients); submissions/s. The first request of each client
    /// is not timed (pgbench's tps leaves out connection set-up too): it
    /// opens the client's connection and the server's to its database.
    async fn enqueue(&self, base: &str, body: Value, jobs: usize) -> f64 {
        let warm = (4 * 100).min(jobs / 2);
        self.batches(base, &body, warm).await;
        let started = Instant::now();
        self.batches(base, &body, jobs - warm).await;
        (jobs - warm) as f64 / started.elapsed().as_secs_f64()
    }

    /// Submits `jobs` operations of `body` through the batch endpoint.
    async fn batches(&self, base: &str, body: &Value, jobs: usize) {
        batches::submit(&self.http, base, &self.client, body, jobs).await;
    }

    /// Until nothing that may run now is queued or running.
    async fn drained(&self, base: &str) {
        batches::drained(&self.http, base, &self.client).await;
    }

    /// Built-in workers on a full queue: (batch submissions/s, jobs/s).
    async fn in_process(&self, jobs: usize) -> (f64, f64) {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let mut server = serve_store(&self.store, port, false).await;
        let submits = self
            .enqueue(
                &base,
                json!({"kind": "sleep", "input": {"duration_ms": 0, "steps": 1}}),
                jobs,
            )
            .await;
        let _ = server.kill().await;
        let _ = server.wait().await;
        let started = Instant::now();
        let _server = serve_store(&self.store, port, true).await;
        self.drained(&base).await;
        (submits, jobs as f64 / started.elapsed().as_secs_f64())
    }

    /// Two remote workers over HTTP on a full queue: jobs/s.
    async fn remote(&self, jobs: usize) -> f64 {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let _server = serve_store(&self.store, port, false).await;
        self.enqueue(&base, json!({"kind": "noop"}), jobs).await;
        let started = Instant::now();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for w in 0..2 {
            let mut config = RemoteConfig::new(base.clone(), self.worker.clone());
            config.concurrency = 64;
            config.worker_id = format!("bench-{w}");
            config.claim_wait = Duration::from_secs(1);
            let mut registry = Registry::default();
            registry.register(Arc::new(Noop::default()));
            workers.push(tokio::spawn(RemoteWorker::new(config, registry).run(stop.clone())));
        }
        self.drained(&base).await;
        let rate = jobs as f64 / started.elapsed().as_secs_f64();
        stop.cancel();
        for w in workers {
            let _ = w.await;
        }
        rate
    }

    /// Two Python SDK worker processes (`sdk/python/benches/noop_worker.py`,
    /// 64 slots each, as the Rust remote drain) on a full queue: jobs/s from
    /// the moment both are imported and ready (interpreter start left out).
    async fn python_remote(&self, python: &Path, jobs: usize) -> f64 {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let _server = serve_store(&self.store, port, false).await;
        self.enqueue(&base, json!({"kind": "noop"}), jobs).await;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python/benches/noop_worker.py");
        let mut workers = Vec::new();
        for _ in 0..2 {
            let mut child = tokio::process::Command::new(python)
                .arg(&script)
                .args([&base, &self.worker, "64"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ready"));
            workers.push(child);
        }
        let started = Instant::now();
        for w in &mut workers {
            w.stdin.as_mut().unwrap().write_all(b"go\n").await.unwrap();
        }
        self.drained(&base).await;
        let rate = jobs as f64 / started.elapsed().as_secs_f64();
        for w in &mut workers {
            let _ = w.kill().await;
        }
        rate
    }

    /// 32 clients submitting one at a time for `seconds`: (submissions/s, p99 ms).
    async fn single_submits(&self, seconds: u64) -> (f64, f64) {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = serve_store(&self.store, port, false).await;
        let load = Load::post(json!({"kind": "noop"}))
            .header("Authorization", format!("Bearer {}", self.client))
            .unique_keys();
        let measured = wrk(&format!("{base}/v1/operations"), load, seconds).await;
        stopped(server).await;
        measured
    }

    /// 32 connections reading one operation for `seconds`, plainly (200)
    /// and revalidating its ETag (304), then `/healthz` (no store, no key):
    /// (reads/s, p99 ms) of each.
    async fn gets(&self, seconds: u64) -> ((f64, f64), (f64, f64), (f64, f64)) {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = serve_store(&self.store, port, false).await;
        let created = self
            .http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(&self.client)
            .header("Idempotency-Key", longrun_core::id::random_base32::<8>())
            .json(&json!({"kind": "noop"}))
            .send()
            .await
            .unwrap();
        let etag = created.headers()["etag"].to_str().unwrap().to_owned();
        let id = created.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let url = format!("{base}/v1/operations/{id}");
        let bearer = format!("Bearer {}", self.client);
        let plain = wrk(&url, Load::get().header("Authorization", bearer.clone()), seconds).await;
        let revalidate = Load::get()
            .header("Authorization", bearer)
            .header("If-None-Match", etag);
        let revalidated = wrk(&url, revalidate, seconds).await;
        let health = wrk(&format!("{base}/healthz"), Load::get(), seconds).await;
        stopped(server).await;
        (plain, revalidated, health)
    }

    /// An idle remote worker waiting in a claim; one submission at a time:
    /// (p50 ms, p99 ms) from the submission's send to its handler's start.
    async fn pickup(&self, samples: usize) -> (f64, f64) {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = serve_store(&self.store, port, false).await;
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let mut config = RemoteConfig::new(base.clone(), self.worker.clone());
        config.worker_id = "pickup".into();
        config.claim_wait = Duration::from_secs(10);
        let mut registry = Registry::default();
        registry.register(Arc::new(Noop { started: Some(started) }));
        let worker = tokio::spawn(RemoteWorker::new(config, registry).run(stop.clone()));
        // Work an earlier measurement left queued on this store goes first.
        self.drained(&base).await;
        while starts.try_recv().is_ok() {}
        let prefix = longrun_core::id::random_base32::<8>();
        let mut latencies = Vec::with_capacity(samples);
        for i in 0..=samples {
            // Let the worker settle back into its waiting claim.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let sent = Instant::now();
            let answer = self
                .http
                .post(format!("{base}/v1/operations"))
                .bearer_auth(&self.client)
                .header("Idempotency-Key", format!("{prefix}-{i}"))
                .json(&json!({"kind": "noop"}))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 202);
            let at: Instant = starts.recv().await.unwrap();
            // The first sample pays for connections being opened.
            if i > 0 {
                latencies.push(at.duration_since(sent).as_secs_f64() * 1000.0);
            }
        }
        stop.cancel();
        let _ = worker.await;
        stopped(server).await;
        (percentile(&mut latencies, 50), percentile(&mut latencies, 99))
    }
}

/// Adds one round's value of the figure `name`.
fn note(figures: &mut BTreeMap<String, Vec<f64>>, name: impl Into<String>, value: f64) {
    figures.entry(name.into()).or_default().push(value);
}

fn percentile(values: &mut [f64], p: usize) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[(values.len() * p / 100).min(values.len() - 1)]
}

/// What one `wrk` run sends: a method, headers, a body, and whether each
/// request carries an `Idempotency-Key` of its own.
struct Load<'a> {
    method: &'a str,
    headers: Vec<(&'a str, String)>,
    body: Option<String>,
    unique_keys: bool,
}

impl<'a> Load<'a> {
    fn get() -> Self {
        Self {
            method: "GET",
            headers: Vec::new(),
            body: None,
            unique_keys: false,
        }
    }

    fn post(body: Value) -> Self {
        Self {
            method: "POST",
            headers: vec![("Content-Type", "application/json".into())],
            body: Some(body.to_string()),
            unique_keys: false,
        }
    }

    fn header(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn unique_keys(mut self) -> Self {
        self.unique_keys = true;
        self
    }

    /// The Lua script `wrk -s` runs: the request, and a fresh key per
    /// request (thread number and count, after a prefix of this run) when
    /// asked.
    fn script(&self) -> String {
        let quote = |s: &str| format!("{s:?}");
        let mut lua = format!("wrk.method = {}\n", quote(self.method));
        for (name, value) in &self.headers {
            lua.push_str(&format!("wrk.headers[{}] = {}\n", quote(name), quote(value)));
        }
        if let Some(body) = &self.body {
            lua.push_str(&format!("wrk.body = {}\n", quote(body)));
        }
        if self.unique_keys {
            let prefix = longrun_core::id::random_base32::<8>();
            lua.push_str(&format!(
                "local threads = 0\n\
                 function setup(thread) threads = threads + 1; thread:set(\"tid\", threads) end\n\
                 local n = 0\n\
                 function request()\n\
                   n = n + 1\n\
                   wrk.headers[\"Idempotency-Key\"] = \"{prefix}-\" .. tid .. \"-\" .. n\n\
                   return wrk.format()\n\
                 end\n"
            ));
        }
        lua
    }
}

/// `wrk -t2 -c32` for `seconds` against `url`, in a process of its own (a
/// load generator inside the bench shares its cores with the server's and
/// was the ceiling of both sides): (requests/s, p99 ms). Panics if any
/// answer was not 2xx or 3xx.
async fn wrk(url: &str, load: Load<'_>, seconds: u64) -> (f64, f64) {
    let script = std::env::temp_dir().join(format!(
        "longrun-wrk-{}-{}.lua",
        std::process::id(),
        longrun_core::id::random_base32::<6>()
    ));
    std::fs::write(&script, load.script()).unwrap();
    let out = tokio::process::Command::new("wrk")
        .args(["-t2", "-c32", "--latency", "-d"])
        .arg(format!("{seconds}s"))
        .arg("-s")
        .arg(&script)
        .arg(url)
        .output()
        .await
        .expect("wrk (Debian's wrk package; see wrk_installed)");
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wrk failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("Non-2xx or 3xx responses"),
        "{url}: answers other than 2xx/3xx:\n{text}"
    );
    let rate = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk's output:\n{text}"));
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .map(|v| wrk_ms(v.trim()))
        .unwrap_or_else(|| panic!("no 99% latency in wrk's output:\n{text}"));
    (rate, p99)
}

/// A wrk latency (`812.00us`, `5.12ms`, `1.02s`) in milliseconds.
fn wrk_ms(text: &str) -> f64 {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len()));
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

/// Whether `wrk` is here; installed with apt-get when missing and this
/// machine may (root), as `scripts/test` installs Chromium.
fn wrk_installed() -> bool {
    let here = || std::process::Command::new("wrk").arg("--version").output().is_ok();
    if here() {
        return true;
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let _ = std::process::Command::new("apt-get")
            .args(["install", "-y", "-q", "wrk"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output();
    }
    here()
}

/// Set to a port, the bench binary is the bare axum server of
/// [`bare_axum`] instead (see [`main`]).
const BARE_AXUM_PORT: &str = "LONGRUN_PEER_BARE_AXUM_PORT";

/// The bare axum server: a small JSON POST (202) and GET (200), no store
/// behind it, until killed.
async fn serve_bare_axum(port: u16) {
    use axum::routing::{get, post};
    let accept = |axum::Json(body): axum::Json<Value>| async move {
        (
            axum::http::StatusCode::ACCEPTED,
            axum::Json(json!({"id": "op_x", "echo": body})),
        )
    };
    let read = || async { axum::Json(json!({"id": "op_x", "state": "queued", "version": 1})) };
    let app = axum::Router::new()
        .route("/post", post(accept))
        .route("/get", get(read));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    println!("bare axum listening");
    axum::serve(listener, app).await.unwrap();
}

/// The ceiling for the HTTP figures: the bare axum server in a process of
/// its own (this binary again), as `longrun serve` is, so that neither
/// shares its runtime with the load (an in-process one had, and came out
/// slower than Longrun's own GET).
async fn bare_axum(seconds: u64) -> ((f64, f64), (f64, f64)) {
    let port = free_port();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(BARE_AXUM_PORT, port.to_string());
    let mut server = listening(command, "bare axum listening").await;
    let base = format!("http://127.0.0.1:{port}");
    let posts = wrk(&format!("{base}/post"), Load::post(json!({"kind": "noop"})), seconds).await;
    let gets = wrk(&format!("{base}/get"), Load::get(), seconds).await;
    let _ = server.kill().await;
    (posts, gets)
}

/// The Python interpreter of the SDK's environment (`LONGRUN_PYTHON`, else
/// the one `sdk/python/scripts/test` makes), if it imports `longrun`.
fn python_sdk() -> Result<PathBuf, String> {
    let python = std::env::var_os("LONGRUN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/python-sdk-venv/bin/python"));
    let imports = std::process::Command::new(&python)
        .args(["-c", "import longrun"])
        .output()
        .map_err(|e| format!("{}: {e}; run sdk/python/scripts/test once", python.display()))?;
    if !imports.status.success() {
        return Err(format!(
            "{} cannot import longrun; run sdk/python/scripts/test once",
            python.display()
        ));
    }
    Ok(python)
}

/// The no-op kind; tells `started` (if any) when each run begins.
#[derive(Default)]
struct Noop {
    started: Option<tokio::sync::mpsc::UnboundedSender<Instant>>,
}

#[async_trait]
impl Handler for Noop {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: "noop".into(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: false,
        }
    }

    fn validate(&self, _input: &Value) -> Result<(), Invalid> {
        Ok(())
    }

    async fn run(&self, _ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        if let Some(started) = &self.started {
            let _ = started.send(Instant::now());
        }
        Ok(None)
    }
}

/// The stored history the `history` groups add: `rows` ended operations of
/// the bench tenant, each with its idempotency record and 3 events, written
/// straight into the store's tables (through the API it would take longer
/// than the rest of the bench), created over the last `rows` seconds. Their
/// ids are well-formed (the digits of `i` spelled `a`–`j`), so the API and
/// the console open them as they open any other.
fn history_sql(rows: usize, now_ms: i64, postgres: bool) -> String {
    let (series, id, fingerprint) = if postgres {
        (
            format!("SELECT i FROM generate_series(1::BIGINT, {rows}) AS g(i)"),
            "'op_h' || translate(lpad(i::text, 25, '0'), '0123456789', 'abcdefghij')",
            "decode(md5(i::text) || md5(i::text), 'hex')",
        )
    } else {
        (
            format!("WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {rows}) SELECT i FROM g"),
            "'op_h' || replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(
                 printf('%025d', i), '0', 'a'), '1', 'b'), '2', 'c'), '3', 'd'), '4', 'e'),
                 '5', 'f'), '6', 'g'), '7', 'h'), '8', 'i'), '9', 'j')",
            "randomblob(32)",
        )
    };
    // Both stores key an operation's events by its `seq`. PostgreSQL's are
    // partitioned by it: the range filled gets its partition, as the
    // store's upkeep would have made them while it grew (without one, the
    // events would land in the default partition, which the upkeep looks
    // through a batch a pass).
    let event_value = format!("(SELECT seq FROM operations WHERE id = {id})");
    let partition = if postgres {
        batches::history_partitions_sql(
            "(SELECT last_value FROM operations_seq_seq) + 100000",
            "top - lo",
            now_ms,
        )
    } else {
        String::new()
    };
    let at = format!("({now_ms} - ({rows} - i) * 1000)");
    format!(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result, idempotency_key,
                                 created_at, started_at, completed_at, updated_at, expires_at)
         SELECT {id}, 'bench', 'noop', 'succeeded', 3, 1, '{{}}', 'null', 'h-' || i,
                {at}, {at} + 1, {at} + 2, {at} + 2, 4102444800000 FROM ({series}) s;
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT 'bench', 'noop', 'h-' || i, {fingerprint}, {id}, {at} FROM ({series}) s;
         {partition}
         INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         SELECT {event_value}, v.n, v.type, v.state, {at} + v.n, '{{}}', '{{}}' FROM ({series}) s,
                (SELECT 1 AS n, 'created' AS type, 'queued' AS state UNION ALL SELECT 2, 'started', 'running'
                 UNION ALL SELECT 3, 'succeeded', 'succeeded') v;
         ANALYZE;"
    )
}

/// What the history groups add to a store: ended operations (`history`)
/// or queued ones of the measured kind and tenant that start a day later
/// (`scheduled`: claims must not read them).
#[derive(Clone, Copy, PartialEq)]
enum Fill {
    Ended,
    Scheduled,
}

impl Fill {
    fn group(self) -> &'static str {
        match self {
            Fill::Ended => "history",
            Fill::Scheduled => "scheduled",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Fill::Ended => "ended",
            Fill::Scheduled => "future-scheduled",
        }
    }

    fn sql(self, rows: usize, now_ms: i64, postgres: bool) -> String {
        match self {
            Fill::Ended => history_sql(rows, now_ms, postgres),
            Fill::Scheduled => scheduled_sql(rows, now_ms, postgres),
        }
    }
}

/// `rows` queued `noop` operations of the bench tenant that may start a
/// day from now, each with its ready task (available then) and idempotency
/// record, written straight into the tables as `history_sql` does.
fn scheduled_sql(rows: usize, now_ms: i64, postgres: bool) -> String {
    let (series, id, fingerprint) = if postgres {
        (
            format!("SELECT i FROM generate_series(1::BIGINT, {rows}) AS g(i)"),
            "'op_s' || lpad(i::text, 25, '0')",
            "decode(md5(i::text) || md5(i::text), 'hex')",
        )
    } else {
        (
            format!("WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {rows}) SELECT i FROM g"),
            "'op_s' || printf('%025d', i)",
            "randomblob(32)",
        )
    };
    let at = format!("({now_ms} - ({rows} - i))");
    let start = now_ms + 86_400_000;
    format!(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, idempotency_key,
                                 created_at, updated_at, not_before, priority)
         SELECT {id}, 'bench', 'noop', 'queued', 1, 0, '{{}}', 's-' || i, {at}, {at}, {start}, 5 FROM ({series}) s;
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT 'bench', 'noop', 's-' || i, {fingerprint}, {id}, {at} FROM ({series}) s;
         INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
         SELECT id, seq, tenant, kind, 'ready', {start}, 5 FROM operations WHERE id LIKE 'op_s%';
         ANALYZE;"
    )
}

impl Longrun {
    /// Adds `rows` operations to the store as `fill` says.
    async fn add_history(&self, rows: usize, fill: Fill) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        match self.store[0].as_str() {
            // Settled as a store that grew over time would be: vacuumed and
            // analyzed (autovacuum would have done it), the WAL checkpointed
            // (the server's checkpointer would have). Measured right after a
            // bulk load instead, the p99s were those of autovacuum and of a
            // checkpoint of the whole load running beside them.
            "--database" => {
                sql(&self.store[1], &fill.sql(rows, now_ms, true)).await;
                sql(&self.store[1], "VACUUM ANALYZE").await;
                sql(&self.store[1], "CHECKPOINT").await;
            }
            _ => {
                let db = Path::new(&self.store[1]).join("longrun.db");
                let mut sqlite = std::process::Command::new("sqlite3")
                    .arg(&db)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("the sqlite3 command (Debian's sqlite3 package)");
                use std::io::Write;
                let script = format!(
                    "BEGIN;\n{}\nCOMMIT;\nPRAGMA wal_checkpoint(TRUNCATE);\n",
                    fill.sql(rows, now_ms, false)
                );
                sqlite.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
                assert!(sqlite.wait().unwrap().success(), "sqlite3 failed on {}", db.display());
            }
        }
    }

    /// The p99 (ms) of single submits, plain GETs and idle pickup.
    async fn hot_p99s(&self, seconds: u64) -> Vec<(&'static str, f64)> {
        let accept = self.single_submits(seconds).await.1;
        let get = self.gets(seconds).await.0.1;
        // 300 pickups: a p99 of 100 is nearly their maximum, one stalled flush.
        let pickup = self.pickup(300).await.1;
        let mut p99s = vec![("accept", accept), ("GET", get), ("pickup", pickup)];
        p99s.extend(self.pages(seconds).await);
        p99s
    }

    /// The pages people and integrations read, each under 32 connections
    /// for `seconds`: p99 ms of the tenant's list (first page of 50, a page
    /// halfway down it, the first page of one state) and of the console's
    /// overview and its page of one operation.
    async fn pages(&self, seconds: u64) -> [(&'static str, f64); 5] {
        use longrun_server::app::reads::{decode_page_token, encode_page_token};
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = serve_store(&self.store, port, false).await;
        let page = async |query: &str| -> Value {
            let url = format!("{base}/v1/operations?{query}");
            let answer = self.http.get(url).bearer_auth(&self.client).send().await.unwrap();
            answer.json().await.unwrap()
        };
        let first = page("page_size=50").await;
        // A page halfway down: the token the server hands out there (a
        // token names the position it continues before).
        let top = first["next_page_token"]
            .as_str()
            .map_or(0, |token| decode_page_token(token).unwrap());
        let halfway = encode_page_token(top / 2);
        // The console shows an operation from there (with its history),
        // else the newest.
        let there = page(&format!("page_size=1&page_token={halfway}")).await;
        let id = [&there, &first]
            .iter()
            .find_map(|page| page["operations"][0]["id"].as_str())
            .unwrap()
            .to_owned();
        // The console's session, as its sign-in form makes one.
        let signed_in = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{base}/ui/sign-in"))
            .form(&[("key", self.client.as_str()), ("next", "/ui/")])
            .send()
            .await
            .unwrap();
        let cookie = signed_in.headers()["set-cookie"].to_str().unwrap();
        let cookie = cookie.split(';').next().unwrap().to_owned();
        let bearer = format!("Bearer {}", self.client);
        let api = || Load::get().header("Authorization", bearer.clone());
        let console = || Load::get().header("Cookie", cookie.clone());
        let list = wrk(&format!("{base}/v1/operations?page_size=50"), api(), seconds).await;
        let deep = wrk(
            &format!("{base}/v1/operations?page_size=50&page_token={halfway}"),
            api(),
            seconds,
        )
        .await;
        let by_state = wrk(
            &format!("{base}/v1/operations?page_size=50&state=succeeded"),
            api(),
            seconds,
        )
        .await;
        let overview = wrk(&format!("{base}/ui/"), console(), seconds).await;
        let operation = wrk(&format!("{base}/ui/operations/{id}"), console(), seconds).await;
        stopped(server).await;
        [
            ("list", list.1),
            ("list halfway", deep.1),
            ("list by state", by_state.1),
            ("console overview", overview.1),
            ("console operation", operation.1),
        ]
    }
}

/// pgbench, 32 clients, a single-row INSERT per transaction: tps.
fn pgbench_insert(url: &str, seconds: u64) -> Option<f64> {
    let script = std::env::temp_dir().join(format!("longrun-pgbench-{}.sql", std::process::id()));
    std::fs::write(&script, "INSERT INTO ceiling (v) VALUES (1);\n").ok()?;
    let out = std::process::Command::new("pgbench")
        .args(["-n", "-c", "32", "-j", "2", "-T", &seconds.to_string(), "-f"])
        .arg(&script)
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next()?.parse().ok())
}

fn main() {
    if let Some(port) = std::env::var(BARE_AXUM_PORT).ok().and_then(|p| p.parse().ok()) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        return runtime.block_on(serve_bare_axum(port));
    }
    let jobs = env_number("LONGRUN_PEER_JOBS", 20_000);
    let rounds = env_number("LONGRUN_PEER_ROUNDS", 3);
    let seconds = env_number("LONGRUN_BENCH_SECONDS", 5) as u64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let cluster = match longrun_store::pgtest::start_durable() {
            Ok(c) => c,
            Err(why) => {
                println!("PostgreSQL is not available here ({why}); nothing to compare");
                return;
            }
        };
        let graphile_dir = match install_graphile() {
            Ok(dir) => Some(dir),
            Err(why) => {
                println!("graphile-worker {GRAPHILE_WORKER} is not available ({why}); its rows are skipped");
                None
            }
        };
        let mut figures: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut history_ratios: Vec<(String, String)> = Vec::new();
        println!("{jobs} queued no-op jobs per drain, {rounds} alternating rounds, PostgreSQL with fsync on");
        for round in 1..=rounds {
            if let Some(dir) = graphile_dir.as_ref().filter(|_| wanted("graphile")) {
                for batched in [false, true] {
                    settle(&cluster).await;
                    let url = cluster.database().await;
                    let rate = graphile(dir, &url, jobs, batched).await;
                    let name = if batched { "graphile batched" } else { "graphile plain" };
                    note(&mut figures, name, rate);
                }
            }
            let dir = tempfile::tempdir().unwrap();
            for (store, group) in [("PG", "pg"), ("SQLite", "sqlite")] {
                let fresh = async |name: &str| match store {
                    "PG" => Longrun::new(vec!["--database".into(), cluster.database().await]),
                    _ => Longrun::new(vec!["--data-dir".into(), dir.path().join(name).display().to_string()]),
                };
                if wanted(&format!("{group}-in-process")) {
                    settle(&cluster).await;
                    let (submits, drain) = fresh("in-process").await.in_process(jobs).await;
                    note(&mut figures, format!("longrun in-process {store}"), drain);
                    note(&mut figures, format!("longrun batch submits {store}"), submits);
                }
                if wanted(&format!("{group}-remote")) {
                    settle(&cluster).await;
                    let rate = fresh("remote").await.remote(jobs).await;
                    note(&mut figures, format!("longrun remote {store}"), rate);
                }
                if wanted(&format!("{group}-python")) {
                    match python_sdk() {
                        Ok(python) => {
                            settle(&cluster).await;
                            let rate = fresh("python").await.python_remote(&python, jobs).await;
                            note(&mut figures, format!("python remote {store}"), rate);
                        }
                        Err(why) => println!("the Python SDK is not available ({why}); its rows are skipped"),
                    }
                }
                if wanted(&format!("{group}-submits")) {
                    settle(&cluster).await;
                    let (rate, p99) = fresh("submits").await.single_submits(seconds).await;
                    note(&mut figures, format!("longrun single submits {store}"), rate);
                    note(&mut figures, format!("longrun single submit p99 ms {store}"), p99);
                }
                if wanted(&format!("{group}-reads")) {
                    settle(&cluster).await;
                    let ((rate, p99), (rate304, p99_304), (health, health_p99)) =
                        fresh("reads").await.gets(seconds).await;
                    note(&mut figures, format!("longrun /healthz {store}"), health);
                    note(&mut figures, format!("longrun /healthz p99 ms {store}"), health_p99);
                    note(&mut figures, format!("longrun GET 200 {store}"), rate);
                    note(&mut figures, format!("longrun GET 200 p99 ms {store}"), p99);
                    note(&mut figures, format!("longrun GET 304 {store}"), rate304);
                    note(&mut figures, format!("longrun GET 304 p99 ms {store}"), p99_304);
                }
                if wanted(&format!("{group}-pickup")) {
                    settle(&cluster).await;
                    let (p50, p99) = fresh("pickup").await.pickup(100).await;
                    note(&mut figures, format!("longrun pickup p50 ms {store}"), p50);
                    note(&mut figures, format!("longrun pickup p99 ms {store}"), p99);
                }
            }

            if wanted("axum") {
                settle(&cluster).await;
                let ((posts, _), (gets, _)) = bare_axum(seconds).await;
                note(&mut figures, "bare axum POST ceiling", posts);
                note(&mut figures, "bare axum GET ceiling", gets);
            }
            if wanted("pgbench") {
                settle(&cluster).await;
                let url = cluster.database().await;
                sql(&url, "CREATE TABLE ceiling (id BIGSERIAL PRIMARY KEY, v INT)").await;
                if let Some(tps) = pgbench_insert(&url, seconds) {
                    note(&mut figures, "pgbench INSERT ceiling", tps);
                }
            }
            eprintln!("round {round} done");
        }
        // Once, after the rounds: the hot paths' tails on a store holding a
        // long history, against a nearly empty one, alternating between the
        // two so that the machine's drift falls on both alike.
        let history = env_number("LONGRUN_PEER_HISTORY", 1_000_000);
        let samples = env_number("LONGRUN_PEER_HISTORY_SAMPLES", 5);
        let dir = tempfile::tempdir().unwrap();
        let stores_and_fills = [("PG", "pg"), ("SQLite", "sqlite")]
            .into_iter()
            .flat_map(|(store, group)| [(store, group, Fill::Ended), (store, group, Fill::Scheduled)]);
        for (store, group, fill) in stores_and_fills {
            if !wanted(&format!("{group}-{}", fill.group())) {
                continue;
            }
            settle(&cluster).await;
            let open = async |name: &str| match store {
                "PG" => Longrun::new(vec!["--database".into(), cluster.database().await]),
                _ => Longrun::new(vec!["--data-dir".into(), dir.path().join(name).display().to_string()]),
            };
            let (empty, full) = (open("empty").await, open(fill.group()).await);
            let started = Instant::now();
            full.add_history(history, fill).await;
            synced().await;
            eprintln!(
                "{history} {} operations added to {store} in {:.0?}",
                fill.what(),
                started.elapsed()
            );
            // `samples` of each size: the table shows their median. A p99
            // of one sample on two busy cores spreads by a third from one
            // sample to the next, so this takes more than the rounds' 3.
            let stored = format!("{history} {} stored", fill.what());
            // Each sample starts checkpointed and synced, as every other
            // figure does (`settle`): without it the write-back of the
            // samples before builds up under the next ones (SQLite's accept
            // p99 went 3.9 -> 9.4 ms over 5 samples of an empty store).
            for _ in 0..samples {
                for (longrun, size) in [(&empty, "empty"), (&full, stored.as_str())] {
                    checkpointed(&cluster).await;
                    for (path, p99) in longrun.hot_p99s(seconds).await {
                        note(&mut figures, format!("longrun {path} p99 ms {store}, {size}"), p99);
                    }
                }
            }
            for path in [
                "accept",
                "GET",
                "pickup",
                "list",
                "list halfway",
                "list by state",
                "console overview",
                "console operation",
            ] {
                history_ratios.push((
                    format!("longrun {path} p99 ms {store}, {stored}"),
                    format!("longrun {path} p99 ms {store}, empty"),
                ));
            }
        }
        let mut record = record::Record::new("peers");
        record.line("| figure | median | rounds |");
        record.line("|---|---|---|");
        for (name, values) in &figures {
            // Latencies in milliseconds get a decimal; rates do not need one.
            let show = |v: f64| {
                if name.contains(" ms ") {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                }
            };
            let all: Vec<String> = values.iter().map(|v| show(*v)).collect();
            record.line(format!("| {name} | {} | {} |", show(median(values)), all.join(", ")));
        }
        let m = |name: &str| figures.get(name).map(|v| median(v));
        // A ceiling is what the machine gives a trivial server under the
        // same load generator: a figure above it means the generator, not
        // the server, was the limit, and the ratio says nothing.
        let ratio = |a: &str, b: &str| match (m(a), m(b)) {
            (Some(x), Some(y)) if b.contains("ceiling") && x > y => {
                "ceiling not reached: load generator bound".to_owned()
            }
            (Some(x), Some(y)) => format!("{:.2}×", x / y),
            _ => "n/a".into(),
        };
        record.line("");
        record.line("| ratio (same run) | value |");
        record.line("|---|---|");
        for (a, b) in [
            ("longrun in-process PG", "graphile batched"),
            ("longrun in-process SQLite", "graphile batched"),
            ("longrun remote PG", "graphile batched"),
            ("longrun remote PG", "graphile plain"),
            ("python remote PG", "longrun remote PG"),
            ("python remote SQLite", "longrun remote SQLite"),
            ("longrun single submits PG", "pgbench INSERT ceiling"),
            ("longrun single submits SQLite", "bare axum POST ceiling"),
            ("longrun GET 200 PG", "bare axum GET ceiling"),
            ("longrun GET 304 PG", "bare axum GET ceiling"),
            ("longrun GET 200 SQLite", "bare axum GET ceiling"),
            ("longrun GET 304 SQLite", "bare axum GET ceiling"),
            ("longrun /healthz PG", "bare axum GET ceiling"),
            ("longrun /healthz SQLite", "bare axum GET ceiling"),
        ] {
            record.line(format!("| {a} / {b} | {} |", ratio(a, b)));
        }
        // The history's samples are taken in pairs, each size right after
        // the other: the ratio is the median of the pairs' ratios, so that
        // a drift over the samples (both sizes' p99s rising together) is
        // not read as a difference between the sizes.
        let paired = |a: &str, b: &str| match (figures.get(a), figures.get(b)) {
            (Some(a), Some(b)) if a.len() == b.len() => {
                let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
                format!("{:.2}×", median(&ratios))
            }
            _ => "n/a".into(),
        };
        for (a, b) in &history_ratios {
            record.line(format!("| {a} / {b}, paired samples | {} |", paired(a, b)));
        }
        record.line("");
        record.line("Longrun keeps every operation, its idempotency record and its history (3 events each,");
        record.line("one of them a row: the created and terminal events are read from the operation's row);");
        record.line("graphile-worker deletes finished jobs.");
        record.line("The GET rows poll one operation that does not change: after the first read the store's");
        record.line("read cache answers them (as it answers any poll of an unchanged operation).");
        record.write();
    });
}
