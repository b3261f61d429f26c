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
//! - recovery: from the kill until the service answers again;
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
        self.interrupted += report.interrupted;
        self.recoveries.push(report.recovery);
    }

    pub fn clean(&self) -> bool {
        self.lost + self.duplicated + self.double_completions + self.stuck == 0
    }

    pub const HEADER: &'static str = "| scenario | drills | acknowledged | lost | duplicated | double completions | stuck | recovery p50 / max | requests interrupted |\n|---|---|---|---|---|---|---|---|---|";

    /// One table row.
    pub fn row(&self, scenario: &str) -> String {
        let mut sorted = self.recoveries.clone();
        sorted.sort();
        let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        let max = sorted.last().copied().unwrap_or_default();
        format!(
            "| {scenario} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} ms | {} |",
            self.drills,
            self.acknowledged,
            self.lost,
            self.duplicated,
            self.double_completions,
            self.stuck,
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

/// A client that opens a connection per request, so a fault hits one
/// request, not every request of a pooled connection.
fn drill_http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Submits `keys` in order, each until acknowledged (a lost response or a
/// refused connection is retried with the same key, as the SDK does).
async fn client(
    base: String,
    token: String,
    keys: Vec<String>,
    acknowledged: Acknowledged,
    interrupted: Arc<AtomicUsize>,
) {
    let http = drill_http();
    for key in keys {
        loop {
            let sent = http
                .post(format!("{base}/v1/operations"))
                .bearer_auth(&token)
                .header("Idempotency-Key", &key)
                .json(&json!({"kind": "noop", "input": {}, "labels": {"drill_key": key}}))
                .send()
                .await;
            let answer = match sent {
                Ok(response) if matches!(response.status().as_u16(), 200 | 202) => response.json::<Value>().await.ok(),
                Ok(response) if response.status().is_server_error() || response.status().as_u16() == 429 => None,
                Ok(response) => panic!("submission {key} refused: {}", response.status()),
                Err(_) => None,
            };
            if let Some(op) = answer {
                let id = op["id"].as_str().unwrap().to_owned();
                acknowledged.lock().unwrap().entry(key.clone()).or_default().insert(id);
                break;
            }
            // The server is down or restarting: come back shortly.
            interrupted.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Claims `noop` tasks, heartbeats each once and completes it, until `stop`.
async fn worker(base: String, token: String, name: String, completions: Completions, stop: CancellationToken) {
    let http = drill_http();
    while !stop.is_cancelled() {
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

/// A server on a fresh data directory with clients submitting to it: what
/// both scenarios start from.
struct Stage {
    token: String,
    worker_token: String,
    port: u16,
    /// The server itself.
    base: String,
    /// Where clients and workers send requests: the server, or a faulty
    /// proxy in front of it.
    front: String,
    faults: Arc<AtomicUsize>,
    serve_args: Vec<String>,
    server: Child,
    acknowledged: Acknowledged,
    interrupted: Arc<AtomicUsize>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Stage {
    async fn start(seed: u64, plan: &Plan, data_dir: &Path, prefix: &str, proxy: Option<Faults>) -> Self {
        let store = vec!["--data-dir".to_owned(), data_dir.display().to_string()];
        let (token, worker_token) = processes::prepare(&store);
        let port = processes::free_port();
        let base = format!("http://127.0.0.1:{port}");
        let mut serve_args = store;
        serve_args.push("--builtin-workers=false".into());
        let server = processes::serve(port, &serve_args).await;
        let faults = Arc::new(AtomicUsize::new(0));
        let front = match proxy {
            Some(plan) => faulty_proxy(port, seed, plan, faults.clone()).await,
            None => base.clone(),
        };
        let acknowledged: Acknowledged = Arc::default();
        let interrupted = Arc::new(AtomicUsize::new(0));
        let clients = (0..plan.clients)
            .map(|c| {
                let keys = (0..plan.submissions_per_client)
                    .map(|i| format!("{prefix}{seed}-c{c}-{i}"))
                    .collect();
                tokio::spawn(client(
                    front.clone(),
                    token.clone(),
                    keys,
                    acknowledged.clone(),
                    interrupted.clone(),
                ))
            })
            .collect();
        Self {
            token,
            worker_token,
            port,
            base,
            front,
            faults,
            serve_args,
            server,
            acknowledged,
            interrupted,
            clients,
        }
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
            check(&self.base, &self.token, &self.acknowledged, completions, terminal_by).await;
        report.interrupted = self.interrupted.load(Ordering::Relaxed);
        (report, settled_at)
    }

    async fn stop(mut self) {
        let _ = self.server.start_kill();
        let _ = self.server.wait().await;
    }
}

/// Waits the random moment of the fault within the plan's window.
async fn fault_moment(rng: &mut Rng, plan: &Plan) -> Instant {
    tokio::time::sleep(Duration::from_millis(rng.below(plan.fault_within.as_millis() as u64))).await;
    Instant::now()
}

/// Scenario 1: `kill -9` of the single SQLite server at a random moment under
/// submit, claim, heartbeat and complete load, then a restart on the same
/// data directory and port.
pub async fn kill_the_sqlite_server(seed: u64, plan: &Plan, data_dir: &Path) -> Report {
    let mut stage = Stage::start(seed, plan, data_dir, "d", None).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers: Vec<_> = (0..plan.workers)
        .map(|w| {
            tokio::spawn(worker(
                stage.base.clone(),
                stage.worker_token.clone(),
                format!("drill-worker-{w}"),
                completions.clone(),
                stop.clone(),
            ))
        })
        .collect();

    let killed_at = fault_moment(&mut rng(seed), plan).await;
    stage.server.start_kill().unwrap();
    let _ = stage.server.wait().await;
    stage.server = processes::serve(stage.port, &stage.serve_args).await;
    until_ready(&reqwest::Client::new(), &stage.base).await;
    let recovery = killed_at.elapsed();

    let (mut report, _) = stage.finish(&completions, killed_at + plan.stuck_bound).await;
    report.recovery = recovery;
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
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

/// Scenario 2: `kill -9` of one of the remote workers (`longrun worker
/// --exec`) at a random moment while they drain the queue, then a restart of
/// it. Its leases lapse and the reaper hands the (re-run-safe) work on; the
/// recovery is the time from the kill until every operation has ended.
pub async fn kill_an_exec_worker(seed: u64, plan: &Plan, data_dir: &Path) -> Report {
    let mut stage = Stage::start(seed, plan, data_dir, "w", None).await;
    let mut workers: Vec<Child> = (0..plan.workers)
        .map(|_| exec_worker(&stage.base, &stage.worker_token))
        .collect();

    let mut rng = rng(seed);
    let killed_at = fault_moment(&mut rng, plan).await;
    let victim = rng.below(plan.workers as u64) as usize;
    workers[victim].start_kill().unwrap();
    let _ = workers[victim].wait().await;
    workers[victim] = exec_worker(&stage.base, &stage.worker_token);

    // Exec workers' outcome answers are not seen here; the history is.
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

/// What a faulty proxy does to the connections through it, in percent.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// The request reaches the server; its response is dropped and the
    /// connection closed.
    pub lose_response: u64,
    /// Half the response reaches the client, then the connection is reset.
    pub reset_mid_response: u64,
}

/// A TCP proxy to the server on `port` that, connection by connection
/// (seeded), passes it through, loses the response, or resets it midway.
/// Returns its URL; `faults` counts the connections it harmed.
async fn faulty_proxy(port: u16, seed: u64, plan: Faults, faults: Arc<AtomicUsize>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let rng = Arc::new(Mutex::new(rng(seed ^ 0xFA17)));
    tokio::spawn(async move {
        while let Ok((mut downstream, _)) = listener.accept().await {
            let roll = rng.lock().unwrap().below(100);
            let faults = faults.clone();
            tokio::spawn(async move {
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

/// Scenario 3: a faulty proxy between the clients and workers and the
/// server: responses lost after the server answered, and connections reset
/// mid-response. Clients retry with their keys; workers' lost claims and
/// outcomes are settled by lease expiry and fencing. Recovery: from the end
/// of the submissions until every operation has ended.
pub async fn through_a_faulty_proxy(seed: u64, plan: &Plan, data_dir: &Path, faults: Faults) -> Report {
    let mut stage = Stage::start(seed, plan, data_dir, "p", Some(faults)).await;
    let completions: Completions = Arc::default();
    let stop = CancellationToken::new();
    let workers: Vec<_> = (0..plan.workers)
        .map(|w| {
            tokio::spawn(worker(
                stage.front.clone(),
                stage.worker_token.clone(),
                format!("drill-worker-{w}"),
                completions.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let started = Instant::now();
    let (mut report, settled_at) = stage.finish(&completions, started + plan.stuck_bound).await;
    report.recovery = settled_at.saturating_duration_since(started);
    report.interrupted = stage.faults.load(Ordering::Relaxed);
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
    stage.stop().await;
    report
}
