//! Crash drills: clients submit and workers claim, heartbeat and complete
//! over real HTTP while a process is killed with SIGKILL, then the history
//! is checked. Shared by `benches/drills.rs` (≥ 100 drills per scenario)
//! and `tests/drills.rs` (a short run in the test suite).
//!
//! What a drill counts:
//! - acknowledged: submissions whose `202`/`200` the client received;
//! - lost: acknowledged, but no operation with that id (or key) afterwards;
//! - duplicated: two operations for one idempotency key;
//! - double completions: an operation with more than one terminal event,
//!   or two outcome reports for it both answered `200`;
//! - stuck: acknowledged operations not terminal within `stuck_bound` after
//!   the fault;
//! - unclear: answers that were neither a success nor a clear refusal to
//!   retry (`503` with `Retry-After`, `429`): a `500`, a `503` without the
//!   hint, a read refused while only writes should be;
//! - recovery: from the fault until the service answers again (what that
//!   means per scenario is in `docs/drills.md`);
//! - interrupted: requests the fault cut, proof it hit live traffic
//!   (submission attempts refused or unanswered and retried with their key;
//!   for the proxy, the connections it broke).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use crate::processes;

/// The load of one drill.
#[derive(Debug, Clone)]
pub struct Plan {
    pub clients: usize,
    pub submissions_per_client: usize,
    pub workers: usize,
    /// The fault comes at a random moment within this window of the load.
    pub fault_within: Duration,
    /// Operations must be terminal this long after the fault.
    pub stuck_bound: Duration,
}

/// What one drill saw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub acknowledged: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub double_completions: usize,
    pub stuck: usize,
    pub unclear: usize,
    pub recovery: Duration,
    pub interrupted: usize,
}

/// Drills of one scenario, summed.
#[derive(Debug, Default)]
pub struct Tally {
    pub drills: usize,
    pub acknowledged: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub double_completions: usize,
    pub stuck: usize,
    pub unclear: usize,
    pub interrupted: usize,
    recoveries: Vec<Duration>,
}

impl Tally {
    pub fn add(&mut self, report: &Report) {
        self.drills += 1;
        self.acknowledged += report.acknowledged;
        self.lost += report.lost;
        self.duplicated += report.duplicated;
        self.double_completions += report.double_completions;
        self.stuck += report.stuck;
        self.unclear += report.unclear;
        self.interrupted += report.interrupted;
        self.recoveries.push(report.recovery);
    }

    pub fn clean(&self) -> bool {
        self.lost + self.duplicated + self.double_completions + self.stuck + self.unclear == 0
    }

    pub const HEADER: &'static str = "| scenario | drills | acknowledged | lost | duplicated | double completions | stuck | unclear answers | recovery p50 / max | requests interrupted |\n|---|---|---|---|---|---|---|---|---|---|";

    /// One table row.
    pub fn row(&self, scenario: &str) -> String {
        let mut sorted = self.recoveries.clone();
        sorted.sort();
        let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        let max = sorted.last().copied().unwrap_or_default();
        format!(
            "| {scenario} | {} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} ms | {} |",
            self.drills,
            self.acknowledged,
            self.lost,
            self.duplicated,
            self.double_completions,
            self.stuck,
            self.unclear,
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            self.interrupted,
        )
    }
}

/// A small deterministic generator for fault timing (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn rng(seed: u64) -> Rng {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

/// The operation ids each acknowledged key was answered with.
type Acknowledged = Arc<Mutex<HashMap<String, HashSet<String>>>>;
/// `200` answers to outcome reports, per operation.
type Completions = Arc<Mutex<HashMap<String, usize>>>;

/// What the clients and workers of a drill count as they go.
#[derive(Default)]
struct Counters {
    /// Attempts the fault refused or cut, retried with their key.
    interrupted: AtomicUsize,
    /// Answers that were neither a success nor a clear refusal.
    unclear: AtomicUsize,
}

/// How the drill's clients submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitter {
    /// Plain HTTP, one attempt at a time, retried by the drill with the key.
    Http,
    /// The Rust SDK (`longrun_client::Client::submit`), which retries with
    /// the key itself.
    Sdk,
    /// `longrun submit --idempotency-key K`, one process per submission.
    Cli,
}

/// A client that opens a connection per request, so a fault hits one
/// request, not every request of a pooled connection.
fn drill_http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// What one submission attempt came to.
enum Attempt {
    Acknowledged(String),
    /// No answer, or a clear refusal: try again with the same key.
    Retry,
    /// An answer that is neither: counted, then tried again.
    Unclear,
}

/// Whether a refusal says clearly to come back later: `429`, or `503` with
/// `Retry-After` and the `temporarily_unavailable` problem.
async fn clear_refusal(response: reqwest::Response) -> bool {
    let status = response.status().as_u16();
    let hinted = response.headers().contains_key("retry-after");
    let code = response
        .json::<Value>()
        .await
        .ok()
        .and_then(|p| p["code"].as_str().map(str::to_owned));
    hinted
        && match status {
            429 => true,
            503 => code.as_deref() == Some("temporarily_unavailable"),
            _ => false,
        }
}

fn submission_body(key: &str, callback: Option<&str>) -> Value {
    let mut body = json!({"kind": "noop", "input": {}, "labels": {"drill_key": key}});
    if let Some(url) = callback {
        body["callback"] = json!({ "url": url });
    }
    body
}

async fn submit_over_http(
    http: &reqwest::Client,
    front: &str,
    token: &str,
    key: &str,
    callback: Option<&str>,
) -> Attempt {
    let sent = http
        .post(format!("{front}/v1/operations"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&submission_body(key, callback))
        .send()
        .await;
    match sent {
        Ok(response) if matches!(response.status().as_u16(), 200 | 202) => match response.json::<Value>().await {
            Ok(op) => Attempt::Acknowledged(op["id"].as_str().unwrap().to_owned()),
            // Cut mid-body: the key settles whether it was applied.
            Err(_) => Attempt::Retry,
        },
        Ok(response) if response.status().is_server_error() || response.status().as_u16() == 429 => {
            if clear_refusal(response).await {
                Attempt::Retry
            } else {
                Attempt::Unclear
            }
        }
        Ok(response) => panic!("submission {key} refused: {}", response.status()),
        Err(_) => Attempt::Retry,
    }
}

/// The SDK, retrying with the key on its own (quickly, for a drill).
async fn submit_with_sdk(front: &str, token: &str, key: &str, counters: &Counters) -> Attempt {
    let sdk = longrun_client::Client::with_http(drill_http(), front, token).with_retry(longrun_client::RetryPolicy {
        max_attempts: 50,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(100),
    });
    let submission = longrun_client::Submission {
        labels: Some([("drill_key".to_owned(), key.to_owned())].into()),
        idempotency_key: Some(key.to_owned()),
        ..longrun_client::Submission::new("noop", json!({}))
    };
    let answer = sdk.submit(&submission).await;
    // The SDK's own retries were attempts the fault cut.
    let retries = sdk.requests_sent().saturating_sub(1) as usize;
    counters.interrupted.fetch_add(retries, Ordering::Relaxed);
    match answer {
        Ok(submitted) => Attempt::Acknowledged(submitted.operation.id),
        Err(longrun_client::Error::Api { problem, .. }) if problem.status >= 500 && problem.status != 503 => {
            Attempt::Unclear
        }
        Err(_) => Attempt::Retry,
    }
}

/// `longrun submit` as a process (it uses the SDK, so it retries too).
async fn submit_with_cli(front: &str, token: &str, key: &str) -> Attempt {
    let out = tokio::process::Command::new(processes::BIN)
        .args([
            "submit",
            "noop",
            "--input",
            "{}",
            "--idempotency-key",
            key,
            "--output",
            "json",
        ])
        .args([
            "--label",
            &format!("drill_key={key}"),
            "--server",
            front,
            "--token",
            token,
        ])
        .env("LONGRUN_LOG", "error")
        .output()
        .await
        .expect("longrun submit runs");
    match out.status.code() {
        Some(0) => {
            let op: Value = serde_json::from_slice(&out.stdout).expect("submit --output json prints the operation");
            Attempt::Acknowledged(op["id"].as_str().unwrap().to_owned())
        }
        // 5: the server could not be reached; 4: refused (a 503 after every retry).
        Some(4 | 5) => Attempt::Retry,
        other => panic!(
            "longrun submit {key} exited {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Submits `keys` in order, each until acknowledged: a lost response, a
/// refused connection or a clear refusal is retried with the same key (on
/// the next of `fronts`, when there are several nodes).
async fn client(
    fronts: Vec<String>,
    token: String,
    keys: Vec<String>,
    submitter: Submitter,
    callback: Option<String>,
    acknowledged: Acknowledged,
    counters: Arc<Counters>,
) {
    let http = drill_http();
    let mut front = 0;
    for key in keys {
        loop {
            let at = &fronts[front % fronts.len()];
            let attempt = match submitter {
                Submitter::Http => submit_over_http(&http, at, &token, &key, callback.as_deref()).await,
                Submitter::Sdk => submit_with_sdk(at, &token, &key, &counters).await,
                Submitter::Cli => submit_with_cli(at, &token, &key).await,
            };
            match attempt {
                Attempt::Acknowledged(id) => {
                    acknowledged.lock().unwrap().entry(key.clone()).or_default().insert(id);
                    break;
                }
                Attempt::Retry => counters.interrupted.fetch_add(1, Ordering::Relaxed),
                Attempt::Unclear => counters.unclear.fetch_add(1, Ordering::Relaxed),
            };
            // The node is down, restarting or without its database: come
            // back shortly, to the next node.
            front += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Claims `noop` tasks, heartbeats each once and completes it, until `stop`;
/// moves to the next of `bases` when one does not answer.
async fn worker(bases: Vec<String>, token: String, name: String, completions: Completions, stop: CancellationToken) {
    let http = drill_http();
    let mut at = 0;
    while !stop.is_cancelled() {
        let base = &bases[at % bases.len()];
        let claimed = http
            .post(format!("{base}/v1/worker/claims"))
            .bearer_auth(&token)
            .json(&json!({"kinds": ["noop"], "max_tasks": 8, "lease_seconds": 5, "wait_seconds": 1, "worker_id": name}))
            .send()
            .await;
        let tasks = match claimed {
            Ok(response) if response.status().is_success() => match response.json::<Value>().await {
                Ok(body) => body["tasks"].as_array().cloned().unwrap_or_default(),
                Err(_) => continue,
            },
            _ => {
                at += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        for task in tasks {
            let id = task["operation_id"].as_str().unwrap().to_owned();
            let token_body = json!({"lease_token": task["lease_token"]});
            let _ = http
                .post(format!("{base}/v1/worker/tasks/{id}/heartbeat"))
                .bearer_auth(&token)
                .json(&token_body)
                .send()
                .await;
            let done = http
                .post(format!("{base}/v1/worker/tasks/{id}/complete"))
                .bearer_auth(&token)
                .json(&json!({"lease_token": task["lease_token"], "result": {"ok": true}}))
                .send()
                .await;
            if done.is_ok_and(|r| r.status().as_u16() == 200) {
                *completions.lock().unwrap().entry(id).or_default() += 1;
            }
        }
    }
}

async fn get_json(http: &reqwest::Client, url: &str, token: &str) -> Value {
    let response = http.get(url).bearer_auth(token).send().await.unwrap();
    response.json().await.unwrap()
}

/// Every operation of the tenant, by its `drill_key` label.
async fn operations_by_key(http: &reqwest::Client, base: &str, token: &str) -> HashMap<String, Vec<Value>> {
    let mut by_key: HashMap<String, Vec<Value>> = HashMap::new();
    let mut page_token: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/operations?page_size=100");
        if let Some(t) = &page_token {
            url.push_str(&format!("&page_token={t}"));
        }
        let page = get_json(http, &url, token).await;
        for op in page["operations"].as_array().unwrap() {
            let key = op["labels"]["drill_key"].as_str().unwrap_or_default().to_owned();
            by_key.entry(key).or_default().push(op.clone());
        }
        match page["next_page_token"].as_str() {
            Some(t) => page_token = Some(t.to_owned()),
            None => return by_key,
        }
    }
}

/// Waits until the service answers `/readyz`.
async fn until_ready(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "the service never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks the history once the load is over; also says when every
/// operation was terminal.
async fn check(
    base: &str,
    token: &str,
    acknowledged: &Acknowledged,
    completions: &Completions,
    terminal_by: Instant,
) -> (Report, Instant) {
    let http = reqwest::Client::new();
    let acknowledged = acknowledged.lock().unwrap().clone();
    let mut report = Report {
        acknowledged: acknowledged.len(),
        ..Report::default()
    };
    // Wait (bounded) until every acknowledged operation is terminal.
    let by_key = loop {
        let by_key = operations_by_key(&http, base, token).await;
        let open = by_key.values().flatten().filter(|op| op["terminal"] != true).count();
        if open == 0 || Instant::now() >= terminal_by {
            report.stuck = open;
            break by_key;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let settled_at = Instant::now();
    for (key, ids) in &acknowledged {
        let stored = by_key.get(key).cloned().unwrap_or_default();
        if stored.len() > 1 {
            report.duplicated += 1;
        }
        let stored_ids: HashSet<&str> = stored.iter().filter_map(|op| op["id"].as_str()).collect();
        // Every answer for one key named the one operation stored for it.
        if ids.len() > 1 {
            report.duplicated += 1;
        }
        if ids.iter().any(|id| !stored_ids.contains(id.as_str())) {
            report.lost += 1;
        }
    }
    for op in by_key.values().flatten() {
        let id = op["id"].as_str().unwrap();
        let history = get_json(&http, &format!("{base}/v1/operations/{id}/history"), token).await;
        // Entries into a terminal state (the schema makes a second one
        // impossible; the drill checks rather than trusts it).
        let terminal = |e: &Value| matches!(e["state"].as_str(), Some("succeeded" | "failed" | "cancelled"));
        let events = history["events"].as_array().unwrap();
        let terminal_events = events
            .iter()
            .enumerate()
            .filter(|(i, e)| terminal(e) && (*i == 0 || !terminal(&events[i - 1])))
            .count();
        let reported = completions.lock().unwrap().get(id).copied().unwrap_or(0);
        if terminal_events > 1 || reported > 1 {
            report.double_completions += 1;
        }
    }
    (report, settled_at)
}

/// Where a drill's server keeps its data, and how many nodes serve it.
pub struct Store {
    /// `--data-dir DIR` or `--database URL`.
    pub args: Vec<String>,
    pub nodes: usize,
}

impl Store {
    pub fn sqlite(data_dir: &Path) -> Self {
        Self {
            args: vec!["--data-dir".to_owned(), data_dir.display().to_string()],
            nodes: 1,
        }
    }

    pub fn postgres(url: String, nodes: usize) -> Self {
        Self {
            args: vec!["--database".to_owned(), url],
            nodes,
        }
    }
}

/// One `longrun serve` process and its port (kept across restarts).
struct Node {
    port: u16,
    child: Child,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// What clients send and through what.
#[derive(Default)]
struct Traffic {
    proxy: Option<Faults>,
    submitter: Option<Submitter>,
    callback: Option<String>,
    serve_args: Vec<String>,
}

/// Servers on a fresh store with clients submitting to them: what every
/// scenario starts from.
struct Stage {
    token: String,
    worker_token: String,
    nodes: Vec<Node>,
    /// Where clients (and workers, unless a scenario says otherwise) send
    /// requests: the nodes, or a faulty proxy in front of the first.
    fronts: Vec<String>,
    faults: Arc<AtomicUsize>,
    serve_args: Vec<String>,
    acknowledged: Acknowledged,
    counters: Arc<Counters>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Stage {
    async fn start(seed: u64, plan: &Plan, store: Store, prefix: &str, traffic: Traffic) -> Self {
        let (token, worker_token) = processes::prepare(&store.args);
        let mut serve_args = store.args;
        serve_args.push("--builtin-workers=false".into());
        serve_args.extend(traffic.serve_args);
        let mut nodes = Vec::new();
        for _ in 0..store.nodes {
            let port = processes::free_port();
            nodes.push(Node {
                port,
                child: processes::serve(port, &serve_args).await,
            });
        }
        let faults = Arc::new(AtomicUsize::new(0));
        let fronts = match traffic.proxy {
            Some(plan) => vec![faulty_proxy(nodes[0].port, seed, plan, faults.clone()).await],
            None => nodes.iter().map(Node::base).collect(),
        };
        let acknowledged: Acknowledged = Arc::default();
        let counters = Arc::new(Counters::default());
        let submitter = traffic.submitter.unwrap_or(Submitter::Http);
        let clients = (0..plan.clients)
            .map(|c| {
                let keys = (0..plan.submissions_per_client)
                    .map(|i| format!("{prefix}{seed}-c{c}-{i}"))
                    .collect();
                // Each client starts at its own node.
                let mut fronts = fronts.clone();
                let n = fronts.len();
                fronts.rotate_left(c % n);
                tokio::spawn(client(
                    fronts,
                    token.clone(),
                    keys,
                    submitter,
                    traffic.callback.clone(),
                    acknowledged.clone(),
                    counters.clone(),
                ))
            })
            .collect();
        Self {
            token,
            worker_token,
            nodes,
            fronts,
            faults,
            serve_args,
            acknowledged,
            counters,
            clients,
        }
    }

    /// The first node, which the history check reads from.
    fn base(&self) -> String {
        self.nodes[0].base()
    }

    fn bases(&self) -> Vec<String> {
        self.nodes.iter().map(Node::base).collect()
    }

    /// Drill workers (plain HTTP) against `bases`, until `stop`.
    fn http_workers(
        &self,
        plan: &Plan,
        bases: &[String],
        completions: &Completions,
        stop: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..plan.workers)
            .map(|w| {
                let mut bases = bases.to_vec();
                let n = bases.len();
                bases.rotate_left(w % n);
                tokio::spawn(worker(
                    bases,
                    self.worker_token.clone(),
                    format!("drill-worker-{w}"),
                    completions.clone(),
                    stop.clone(),
                ))
            })
            .collect()
    }

    async fn kill(&mut self, node: usize) {
        self.nodes[node].child.start_kill().unwrap();
        let _ = self.nodes[node].child.wait().await;
    }

    async fn restart(&mut self, node: usize) {
        self.nodes[node].child = processes::serve(self.nodes[node].port, &self.serve_args).await;
    }

    /// Waits for every client to be acknowledged, then checks the history.
    async fn finish(&mut self, completions: &Completions, terminal_by: Instant) -> (Report, Instant) {
        for c in self.clients.drain(..) {
            tokio::time::timeout(Duration::from_secs(120), c)
                .await
                .expect("every submission is acknowledged")
                .unwrap();
        }
        let (mut report, settled_at) =
            check(&self.base(), &self.token, &self.acknowledged, completions, terminal_by).await;
        report.interrupted = self.counters.interrupted.load(Ordering::Relaxed);
        report.unclear += self.counters.unclear.load(Ordering::Relaxed);
        (report, settled_at)
    }

    async fn stop(mut self) {
        for node in &mut self.nodes {
            let _ = node.child.start_kill();
            let _ = node.child.wait().await;
        }
    }
}

/// Waits the random moment of the fault within the plan's window.
async fn fault_moment(rng: &mut Rng, plan: &Plan) -> Instant {
    tokio::time::sleep(Duration::from_millis(rng.below(plan.fault_within.as_millis() as u64))).await;
    Instant::now()
}

async fn stop_workers(stop: CancellationToken, workers: Vec<tokio::task::JoinHandle<()>>) {
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
}

/// Scenario 1: `kill -9` of the single SQLite server at a random moment under
/// submit, claim, heartbeat and complete load, then a restart on the same
/// data directory and port.
pub async fn kill_the_sqlite_server(seed: u64, plan: &Plan, data_dir: &Path) -> Report {
    kill_a_node(seed, plan, Store::sqlite(data_dir)).await
}

/// Scenario 2a: `kill -9` of one of several `serve` nodes on one PostgreSQL
/// database, clients and workers spread over the nodes (moving to the next
/// node when theirs does not answer), then a restart of it.
pub async fn kill_a_postgres_node(seed: u64, plan: &Plan, database: String, nodes: usize) -> Report {
    kill_a_node(seed, plan, Store::postgres(database, nodes)).await
}

/// `kill -9` of one of `store`'s nodes at a random moment under load, then a
/// restart on the same port. Recovery: from the kill until the restarted
/// node is ready.
async fn kill_a_node(seed: u64, plan: &Plan, store: Store) -> Report {
    let nodes = store.nodes;
    let mut stage = Stage::start(seed, plan, store, "n", Traffic::default()).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers = stage.http_workers(plan, &stage.bases(), &completions, &stop);

    let mut rng = rng(seed);
    let killed_at = fault_moment(&mut rng, plan).await;
    let victim = rng.below(nodes as u64) as usize;
    stage.kill(victim).await;
    stage.restart(victim).await;
    until_ready(&reqwest::Client::new(), &stage.nodes[victim].base()).await;
    let recovery = killed_at.elapsed();

    let (mut report, _) = stage.finish(&completions, killed_at + plan.stuck_bound).await;
    report.recovery = recovery;
    stop_workers(stop, workers).await;
    stage.stop().await;
    report
}

/// Scenario 3: PostgreSQL itself stopped hard (`pg_ctl stop -m immediate`)
/// under load from clients and workers on two nodes, kept down for a
/// random while, then started again. While it is down every node must say
/// it is not ready and refuse a submission with `503
/// temporarily_unavailable` and `Retry-After` (anything else is unclear);
/// afterwards the nodes must serve again without a restart of their own.
/// Recovery: from the database's restart until every node is ready.
pub async fn stop_postgres(seed: u64, plan: &Plan, cluster: &longrun_store::pgtest::Cluster) -> Report {
    let database = cluster.database().await;
    let mut stage = Stage::start(seed, plan, Store::postgres(database, 2), "g", Traffic::default()).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers = stage.http_workers(plan, &stage.bases(), &completions, &stop);

    let mut rng = rng(seed);
    let stopped_at = fault_moment(&mut rng, plan).await;
    tokio::task::block_in_place(|| cluster.stop_immediately());
    let http = drill_http();
    let mut unclear = 0;
    for base in stage.bases() {
        let ready = http.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            unclear += 1;
        }
        let key = format!("probe-{seed}-{}", base.len());
        match submit_over_http(&http, &base, &stage.token, &key, None).await {
            Attempt::Retry => {}
            _ => unclear += 1,
        }
    }
    let down_for = Duration::from_millis(200 + rng.below(800));
    tokio::time::sleep_until((stopped_at + down_for).into()).await;
    tokio::task::block_in_place(|| cluster.start_again()).expect("PostgreSQL starts again");
    let restarted = Instant::now();
    for base in stage.bases() {
        until_ready(&http, &base).await;
    }
    let recovery = restarted.elapsed();

    let (mut report, _) = stage.finish(&completions, restarted + plan.stuck_bound).await;
    report.recovery = recovery;
    report.unclear += unclear;
    stop_workers(stop, workers).await;
    stage.stop().await;
    report
}

/// `longrun worker --kind noop --exec …` as a process, against `base`.
fn exec_worker(base: &str, token: &str) -> Child {
    tokio::process::Command::new(processes::BIN)
        .args([
            "worker",
            "--kind",
            "noop",
            "--concurrency",
            "4",
            "--lease",
            "5s",
            "--server",
            base,
            "--token",
            token,
        ])
        .args(["--exec", r#"sleep 0.01; echo '{"result": {"ok": true}}'"#])
        .env("LONGRUN_LOG", "error")
        .stdout(std::process::Stdio::null())
        // Its start-up line; errors still reach the drill through the history.
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("longrun worker starts")
}

/// The environment variable that makes a drill binary (the bench, or the
/// test's `drill_sdk_worker_process`) an SDK worker: `SERVER TOKEN`.
pub const SDK_WORKER: &str = "LONGRUN_DRILL_SDK_WORKER";

/// A `noop` kind written against the worker SDK, as a user would.
struct Noop;

#[async_trait::async_trait]
impl longrun_worker::task::Handler for Noop {
    fn info(&self) -> longrun_worker::task::KindInfo {
        longrun_worker::task::KindInfo {
            name: "noop".into(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: false,
        }
    }

    fn validate(&self, _input: &Value) -> Result<(), longrun_core::validate::Invalid> {
        Ok(())
    }

    async fn run(
        &self,
        ctx: longrun_worker::task::TaskContext,
    ) -> Result<Option<Value>, longrun_worker::task::TaskError> {
        // Long enough that a kill finds tasks in flight.
        tokio::time::sleep(Duration::from_millis(100)).await;
        ctx.add_cost(1.0).await?;
        Ok(Some(json!({"ok": true})))
    }
}

/// Runs as an SDK worker when [`SDK_WORKER`] says so (until killed) and
/// returns `true`; returns `false` at once otherwise.
pub async fn sdk_worker_process() -> bool {
    let Ok(spec) = std::env::var(SDK_WORKER) else {
        return false;
    };
    let (server, token) = spec.split_once(' ').expect("SERVER TOKEN");
    let mut registry = longrun_engine::Registry::default();
    registry.register(Arc::new(Noop));
    let mut config = longrun_worker::remote::RemoteConfig::new(server, token);
    config.concurrency = 4;
    config.lease = Duration::from_secs(5);
    config.claim_wait = Duration::from_secs(1);
    longrun_worker::remote::RemoteWorker::new(config, registry)
        .run(CancellationToken::new())
        .await;
    true
}

/// This binary again, as an SDK worker against `base`.
fn sdk_worker(base: &str, token: &str) -> Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["drill_sdk_worker_process", "--exact", "--nocapture"])
        .env(SDK_WORKER, format!("{base} {token}"))
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the SDK worker starts")
}

/// What kind of remote worker a drill kills.
#[derive(Debug, Clone, Copy)]
pub enum WorkerProcess {
    /// `longrun worker --exec`.
    Exec,
    /// A handler written against the worker SDK (`longrun_worker::remote`).
    Sdk,
}

/// Scenario 2b: `kill -9` of one of the remote worker processes at a random
/// moment while they drain the queue, then a restart of it. Its leases lapse
/// and the reaper hands the (re-run-safe) work on; the recovery is the time
/// from the kill until every operation has ended.
pub async fn kill_a_worker(seed: u64, plan: &Plan, data_dir: &Path, kind: WorkerProcess) -> Report {
    let mut stage = Stage::start(seed, plan, Store::sqlite(data_dir), "w", Traffic::default()).await;
    let spawn = |base: &str, token: &str| match kind {
        WorkerProcess::Exec => exec_worker(base, token),
        WorkerProcess::Sdk => sdk_worker(base, token),
    };
    let mut workers: Vec<Child> = (0..plan.workers)
        .map(|_| spawn(&stage.base(), &stage.worker_token))
        .collect();

    let mut rng = rng(seed);
    let killed_at = fault_moment(&mut rng, plan).await;
    let victim = rng.below(plan.workers as u64) as usize;
    workers[victim].start_kill().unwrap();
    let _ = workers[victim].wait().await;
    workers[victim] = spawn(&stage.base(), &stage.worker_token);

    // These workers' outcome answers are not seen here; the history is.
    let (mut report, settled_at) = stage
        .finish(&Completions::default(), killed_at + plan.stuck_bound)
        .await;
    report.recovery = settled_at.saturating_duration_since(killed_at);
    for mut w in workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    stage.stop().await;
    report
}

/// What a drill of [`kill_an_exec_worker_with_process_trees`] saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trees {
    /// Processes the killed worker's commands had started (shells and
    /// their children).
    pub processes: usize,
    /// Of those, how many were still alive 5 s after the kill.
    pub survivors: usize,
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Scenario 2c: `kill -9` of a `longrun worker --exec` whose four running
/// commands are process trees — a shell, and a grandchild that beats until
/// it is killed, never ending on its own. Counts the processes of those
/// trees still alive 5 s after the kill: the worker's supervisors
/// (`longrun supervise`) end each tree when the worker dies.
pub async fn kill_an_exec_worker_with_process_trees(seed: u64, data_dir: &Path) -> Trees {
    let store = vec!["--data-dir".to_owned(), data_dir.display().to_string()];
    let (token, worker_token) = processes::prepare(&store);
    let port = processes::free_port();
    let mut args = store.clone();
    args.push("--builtin-workers=false".into());
    let mut server = processes::serve(port, &args).await;
    let base = format!("http://127.0.0.1:{port}");
    let pids = data_dir.join("pids");
    let command = format!(
        "echo $$ >> {pids}; sh -c 'echo $$ >> {pids}; while true; do sleep 0.1; done' & wait",
        pids = pids.display()
    );
    let mut worker = tokio::process::Command::new(processes::BIN)
        .args([
            "worker",
            "--kind",
            "noop",
            "--concurrency",
            "4",
            "--lease",
            "5s",
            "--grace",
            "1s",
        ])
        .args(["--server", &base, "--token", &worker_token, "--exec", &command])
        .env("LONGRUN_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("longrun worker starts");
    let http = drill_http();
    for i in 0..4 {
        let key = format!("tree-{seed}-{i}");
        let response = http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(&token)
            .header("Idempotency-Key", &key)
            .json(&json!({"kind": "noop", "input": {}}))
            .send()
            .await
            .expect("a submission");
        assert!(response.status().is_success(), "{}", response.status());
    }
    // Every command and its grandchild have started.
    let started = Instant::now();
    let listed: Vec<u32> = loop {
        let listed: Vec<u32> = std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if listed.len() >= 8 {
            break listed;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the trees never started: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    worker.start_kill().unwrap();
    let _ = worker.wait().await;
    let killed = Instant::now();
    while listed.iter().any(|pid| alive(*pid)) && killed.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survivors: Vec<u32> = listed.iter().copied().filter(|pid| alive(*pid)).collect();
    // Leave nothing behind, whatever the drill found.
    for pid in &survivors {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    let _ = server.start_kill();
    let _ = server.wait().await;
    Trees {
        processes: listed.len(),
        survivors: survivors.len(),
    }
}

/// What a faulty proxy does to the connections through it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Percent of connections whose request reaches the server but whose
    /// response is dropped and the connection closed.
    pub lose_response: u64,
    /// Percent of connections that get half the response, then a reset.
    pub reset_mid_response: u64,
    /// Every connection waits a random time up to this before its request
    /// is passed on.
    pub latency: Duration,
}

/// A TCP proxy to the server on `port` that, connection by connection
/// (seeded), delays it, then passes it through, loses the response, or
/// resets it midway. Returns its URL; `faults` counts the connections it
/// harmed.
async fn faulty_proxy(port: u16, seed: u64, plan: Faults, faults: Arc<AtomicUsize>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let rng = Arc::new(Mutex::new(rng(seed ^ 0xFA17)));
    tokio::spawn(async move {
        while let Ok((mut downstream, _)) = listener.accept().await {
            let (roll, delay) = {
                let mut rng = rng.lock().unwrap();
                (rng.below(100), rng.below(plan.latency.as_millis() as u64))
            };
            let faults = faults.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let Ok(mut upstream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                if roll >= plan.lose_response + plan.reset_mid_response {
                    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
                    return;
                }
                // The request goes up whole; the response comes back broken.
                let (mut down_read, mut down_write) = downstream.split();
                let (mut up_read, mut up_write) = upstream.split();
                let request = tokio::io::copy(&mut down_read, &mut up_write);
                let mut response = vec![0u8; 64 * 1024];
                let answered = async {
                    let n = up_read.read(&mut response).await.unwrap_or(0);
                    if n > 0 && roll >= plan.lose_response {
                        let _ = down_write.write_all(&response[..n / 2]).await;
                    }
                    n
                };
                tokio::select! {
                    _ = request => {}
                    n = answered => {
                        if n > 0 {
                            faults.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                // Dropping both ends now: with linger 0 the client sees a reset.
                let _ = downstream.set_zero_linger();
            });
        }
    });
    url
}

/// Scenario 4: a faulty proxy between the clients and workers and the
/// server: responses lost after the server answered, connections reset
/// mid-response, added latency. The clients (plain HTTP, the SDK or the
/// CLI) retry with their keys; workers' lost claims and outcomes are settled
/// by lease expiry and fencing. Recovery: from the start of the load until
/// every operation has ended.
pub async fn through_a_faulty_proxy(
    seed: u64,
    plan: &Plan,
    data_dir: &Path,
    faults: Faults,
    submitter: Submitter,
) -> Report {
    let traffic = Traffic {
        proxy: Some(faults),
        submitter: Some(submitter),
        ..Traffic::default()
    };
    let mut stage = Stage::start(seed, plan, Store::sqlite(data_dir), "p", traffic).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers = stage.http_workers(plan, &stage.fronts.clone(), &completions, &stop);
    let started = Instant::now();
    let (mut report, settled_at) = stage.finish(&completions, started + plan.stuck_bound).await;
    report.recovery = settled_at.saturating_duration_since(started);
    report.interrupted = stage.faults.load(Ordering::Relaxed);
    stop_workers(stop, workers).await;
    stage.stop().await;
    report
}

/// A webhook receiver that dedupes by `webhook-id`: what it applied, per
/// operation and event type, and under which ids.
#[derive(Default)]
struct Receiver {
    seen: HashSet<String>,
    applied: HashMap<(String, String), HashSet<String>>,
}

async fn webhook_receiver(received: Arc<Mutex<Receiver>>) -> u16 {
    use axum::http::{HeaderMap, StatusCode};

    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let received = received.clone();
            async move {
                let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) else {
                    return StatusCode::BAD_REQUEST;
                };
                let Ok(event) = serde_json::from_slice::<Value>(&body) else {
                    return StatusCode::BAD_REQUEST;
                };
                let mut received = received.lock().unwrap();
                if received.seen.insert(id.to_owned()) {
                    let op = event["data"]["operation_id"].as_str().unwrap_or_default().to_owned();
                    let kind = event["type"].as_str().unwrap_or_default().to_owned();
                    received.applied.entry((op, kind)).or_default().insert(id.to_owned());
                }
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Scenario 4b: the faulty proxy between the server and the clients'
/// webhook receiver (which dedupes by `webhook-id`): deliveries whose
/// acknowledgement is lost or cut are sent again, and every operation's
/// `operation.succeeded` must be applied exactly once. Lost: an ended
/// operation whose event was never applied within the bound; double
/// completions: one transition delivered under two ids. Recovery: from the
/// start of the load until every event is applied.
pub async fn webhooks_through_a_faulty_proxy(seed: u64, plan: &Plan, data_dir: &Path, faults: Faults) -> Report {
    let received = Arc::new(Mutex::new(Receiver::default()));
    let receiver = webhook_receiver(received.clone()).await;
    let harmed = Arc::new(AtomicUsize::new(0));
    let proxy = faulty_proxy(receiver, seed, faults, harmed.clone()).await;
    let traffic = Traffic {
        callback: Some(format!("{proxy}/hook")),
        serve_args: [
            "--webhook-allow-http",
            "--webhook-allow-private",
            "--webhook-retry-schedule",
            "0s,100ms,200ms,300ms,500ms,500ms,1s,1s,1s,1s,1s,1s",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..Traffic::default()
    };
    let mut stage = Stage::start(seed, plan, Store::sqlite(data_dir), "h", traffic).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers = stage.http_workers(plan, &stage.bases(), &completions, &stop);
    let started = Instant::now();
    let terminal_by = started + plan.stuck_bound;
    let (mut report, _) = stage.finish(&completions, terminal_by).await;

    let ids: Vec<String> = stage.acknowledged.lock().unwrap().values().flatten().cloned().collect();
    let missing = |received: &Receiver| {
        ids.iter()
            .filter(|id| {
                !received
                    .applied
                    .contains_key(&((*id).clone(), "operation.succeeded".to_owned()))
            })
            .count()
    };
    loop {
        let open = missing(&received.lock().unwrap());
        if open == 0 || Instant::now() >= terminal_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.recovery = started.elapsed();
    {
        let received = received.lock().unwrap();
        report.lost += missing(&received);
        report.double_completions += received.applied.values().filter(|ids| ids.len() > 1).count();
    }
    report.interrupted = harmed.load(Ordering::Relaxed);
    stop_workers(stop, workers).await;
    stage.stop().await;
    report
}

/// A size-limited file system (tmpfs) mounted for one drill, unmounted when
/// dropped.
pub struct SmallFilesystem {
    pub path: std::path::PathBuf,
}

impl SmallFilesystem {
    /// Mounts `size` (e.g. `32m`) at a fresh directory under `parent`; says
    /// why when this machine does not allow it.
    pub fn mount(parent: &Path, size: &str) -> Result<Self, String> {
        let path = parent.join("fs");
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Self { path })
    }

    /// Fills what is left with a ballast file; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let ballast = self.path.join("ballast");
        let mut file = std::fs::File::create(&ballast).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        // Fill in ever smaller pieces until not one byte more fits.
        let mut piece = chunk.len();
        while piece > 0 {
            if file.write_all(&chunk[..piece]).is_err() {
                piece /= 2;
            }
        }
        let _ = file.flush();
        ballast
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Scenario 5: the SQLite server's file system fills up under load (a
/// ballast file takes every free byte of a small tmpfs) for a random while,
/// then the space comes back. While it is full, writes that need space are
/// refused with `503` and `Retry-After` and reads keep working (a failed
/// read is unclear); nothing acknowledged is lost or applied twice, and the
/// database passes `PRAGMA integrity_check` afterwards. Recovery: from the
/// space returning until a new submission is accepted.
pub async fn fill_the_disk(seed: u64, plan: &Plan, fs: &SmallFilesystem) -> Report {
    let data_dir = fs.path.join("data");
    let mut stage = Stage::start(seed, plan, Store::sqlite(&data_dir), "f", Traffic::default()).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers = stage.http_workers(plan, &stage.bases(), &completions, &stop);

    let mut rng = rng(seed);
    let filled_at = fault_moment(&mut rng, plan).await;
    let ballast = fs.fill();
    let http = drill_http();
    let mut unclear = 0;
    // SQLite goes on writing into space its files already hold (the WAL is
    // reused after a checkpoint): keep submitting until a write needs a new
    // byte and is refused, so every drill reaches the full disk.
    let mut refused = false;
    for i in 0.. {
        let key = format!("f{seed}-full-{i}");
        match submit_over_http(&http, &stage.base(), &stage.token, &key, None).await {
            Attempt::Acknowledged(id) => {
                stage.acknowledged.lock().unwrap().entry(key).or_default().insert(id);
            }
            Attempt::Retry => refused = true,
            Attempt::Unclear => unclear += 1,
        }
        if refused || filled_at.elapsed() > plan.stuck_bound {
            break;
        }
    }
    assert!(refused, "drill {seed}: the full disk never refused a write");
    stage.counters.interrupted.fetch_add(1, Ordering::Relaxed);
    let full_for = Duration::from_millis(200 + rng.below(800));
    let full_since = Instant::now();
    while full_since.elapsed() < full_for {
        let read = http
            .get(format!("{}/v1/operations?page_size=10", stage.base()))
            .bearer_auth(&stage.token)
            .send()
            .await;
        if !read.is_ok_and(|r| r.status().is_success()) {
            unclear += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_file(&ballast).unwrap();
    let freed = Instant::now();
    let key = format!("f{seed}-after");
    loop {
        match submit_over_http(&http, &stage.base(), &stage.token, &key, None).await {
            Attempt::Acknowledged(id) => {
                stage.acknowledged.lock().unwrap().entry(key).or_default().insert(id);
                break;
            }
            Attempt::Retry => {}
            Attempt::Unclear => unclear += 1,
        }
        assert!(freed.elapsed() < plan.stuck_bound, "writes never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let recovery = freed.elapsed();

    let (mut report, _) = stage.finish(&completions, freed + plan.stuck_bound).await;
    report.recovery = recovery;
    report.unclear += unclear;
    stop_workers(stop, workers).await;
    stage.stop().await;
    let db = rusqlite::Connection::open(data_dir.join("longrun.db")).unwrap();
    let integrity: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    if integrity != "ok" {
        println!("drill {seed}: integrity_check says {integrity}");
        report.lost += 1;
    }
    report
}

/// What the schedule drill found.
#[derive(Debug, Default)]
#[allow(dead_code)]
pub struct ScheduleDrill {
    pub schedules: usize,
    pub kills: u64,
    /// Firing times the schedules had moved past (each should have one operation).
    pub due: u64,
    /// Operations of firings, in all (those a node submitted before its
    /// compare-and-set was cut short included).
    pub operations: u64,
    /// Due firing times with no operation.
    pub lost: u64,
    /// Firing times with more than one operation.
    pub duplicated: u64,
    /// Operations whose firing time is not one of the cadence's.
    pub off_cadence: u64,
}

#[allow(dead_code)]
impl ScheduleDrill {
    pub fn clean(&self) -> bool {
        self.lost + self.duplicated + self.off_cadence == 0 && self.due > 0
    }
}

/// `schedules` schedules `@every 1s` on three PostgreSQL nodes for
/// `run_for`, a random node `kill -9`ed every 5–15 s and restarted 1–3 s
/// later. Then every node is killed and the database is read: every firing
/// time each schedule moved past has exactly one operation, named by its
/// key `schedule:{id}:{fire_time}`.
#[allow(dead_code)]
pub async fn schedules_through_kills(
    seed: u64,
    database: String,
    schedules: usize,
    run_for: Duration,
) -> ScheduleDrill {
    use sqlx::Connection as _;
    let store = vec!["--database".to_owned(), database.clone()];
    let (token, _) = processes::prepare(&store);
    let mut args = store.clone();
    args.push("--builtin-workers=false".into());
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let port = processes::free_port();
        nodes.push(Node {
            port,
            child: processes::serve(port, &args).await,
        });
    }
    let http = reqwest::Client::new();
    for i in 0..schedules {
        let response = http
            .post(format!("{}/v1/schedules", nodes[i % 3].base()))
            .bearer_auth(&token)
            .json(&json!({"kind": "noop", "cron": "@every 1s", "overlap": "allow", "catchup_window": 60}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    }
    let mut rng = rng(seed);
    let mut kills = 0;
    let started = Instant::now();
    while started.elapsed() < run_for {
        tokio::time::sleep(Duration::from_millis(5_000 + rng.below(10_000))).await;
        let victim = rng.below(3) as usize;
        let _ = nodes[victim].child.start_kill();
        let _ = nodes[victim].child.wait().await;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(2_000))).await;
        nodes[victim].child = processes::serve(nodes[victim].port, &args).await;
    }
    for node in &mut nodes {
        let _ = node.child.start_kill();
        let _ = node.child.wait().await;
    }

    let mut c = sqlx::PgConnection::connect(&database).await.unwrap();
    let rows: Vec<(String, i64, Option<i64>)> = sqlx::query_as("SELECT id, created_at, next_fire_at FROM schedules")
        .fetch_all(&mut c)
        .await
        .unwrap();
    let keys: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, COUNT(*) FROM operations WHERE idempotency_key LIKE 'schedule:%' GROUP BY 1",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    let mut drill = ScheduleDrill {
        schedules: rows.len(),
        kills,
        ..ScheduleDrill::default()
    };
    let mut fired: HashMap<String, HashSet<i64>> = HashMap::new();
    for (key, count) in keys {
        drill.operations += count as u64;
        if count > 1 {
            drill.duplicated += 1;
        }
        let mut parts = key.splitn(3, ':');
        let (_, id, time) = (
            parts.next(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        match longrun_core::Timestamp::parse_rfc3339(time) {
            Some(t) if t.0 % 1000 == 0 => {
                fired.entry(id.to_owned()).or_default().insert(t.0);
            }
            _ => drill.off_cadence += 1,
        }
    }
    for (id, created_at, next_fire_at) in rows {
        let Some(next) = next_fire_at else { continue };
        let times = fired.remove(&id).unwrap_or_default();
        // Every second after creation up to the one the schedule moved on to.
        let mut t = (created_at / 1000 + 1) * 1000;
        while t < next {
            drill.due += 1;
            if !times.contains(&t) {
                drill.lost += 1;
            }
            t += 1000;
        }
    }
    drill
}
