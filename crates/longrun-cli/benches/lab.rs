//! The lab: the synchronous-versus-operation experiment, run for real.
//!
//! `cargo bench -p longrun-cli --bench lab` (`LONGRUN_LAB_SEEDS`, default 3;
//! `LONGRUN_LAB_SEED` picks the first).
//!
//! The argument for Longrun was a simulated table (1,000 agent runs of 3
//! minutes on average, exponentially distributed, behind a proxy that cuts
//! requests at 2 minutes). Here every part is real and every request crosses
//! loopback HTTP: a TCP reverse proxy with a request timeout and injected
//! faults, a synchronous endpoint that runs the same work inline, Longrun's
//! server (the code `longrun serve` runs, in this process so that its clock
//! can be compressed) with HTTP workers, webhook receivers that lose
//! acknowledgements, the SDK and the `longrun` CLI. Time is compressed: one
//! simulated minute is `SIM_MINUTE` of real time, for the server's clock as
//! for every wait here. Randomness is seeded; several seeds give a range.

#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
mod processes;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::key;
use longrun_core::apikey::Role;
use longrun_core::{Clock, ScaledClock, SystemClock};
use longrun_server::ServeOptions;
use longrun_store::SqliteConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One simulated minute, in real time.
const SIM_MINUTE: Duration = Duration::from_millis(600);
/// How much faster than real time the server's clock runs.
const SCALE: f64 = 60.0 / 0.6;
const RUNS: usize = 1000;
const MEAN_RUN_MINUTES: f64 = 3.0;
const PROXY_TIMEOUT_MINUTES: f64 = 2.0;
const OBSERVED: usize = 100;
const OBSERVED_MINUTES: f64 = 10.0;
/// The webhook schedule of the lab: six attempts (server time).
const WEBHOOK_SCHEDULE: &str = "0s,5s,30s,2m,5m,10m";

fn sim(minutes: f64) -> Duration {
    SIM_MINUTE.mul_f64(minutes)
}

/// A small seeded generator (xorshift).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    fn percent(&mut self) -> u64 {
        self.next() % 100
    }
}

/// A shared seeded draw of run times.
#[derive(Clone)]
struct Draw(Arc<Mutex<Rng>>);

impl Draw {
    fn new(seed: u64) -> Self {
        Self(Arc::new(Mutex::new(Rng::new(seed))))
    }

    fn run_minutes(&self) -> f64 {
        self.0.lock().unwrap().exponential(MEAN_RUN_MINUTES)
    }
}

/// Concurrent connections (or requests) held, and the most at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    fn enter(self: &Arc<Self>) -> GaugeGuard {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        GaugeGuard(self.clone())
    }

    fn take_max(&self) -> usize {
        self.max.swap(self.now.load(Ordering::SeqCst), Ordering::SeqCst)
    }
}

struct GaugeGuard(Arc<Gauge>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the lab's reverse proxy does to each connection through it.
#[derive(Clone, Copy)]
struct ProxyPlan {
    /// Answer `504` and close both sides when the upstream has not started
    /// answering within this long.
    timeout: Option<Duration>,
    /// Percent of connections whose request reaches the upstream but whose
    /// answer is dropped (the connection closes with no response).
    lose_response: u64,
    /// Percent of connections that get half of the answer, then a reset.
    reset_mid_response: u64,
}

/// A TCP reverse proxy in front of `upstream`; returns its URL and a gauge of
/// the upstream connections it holds.
async fn proxy(upstream: SocketAddr, plan: ProxyPlan, seed: u64) -> (String, Arc<Gauge>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = Arc::new(Gauge::default());
    let rng = Arc::new(Mutex::new(Rng::new(seed ^ 0x9A0C)));
    let gauge = held.clone();
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            let roll = rng.lock().unwrap().percent();
            let lose = roll < plan.lose_response;
            let reset = !lose && roll < plan.lose_response + plan.reset_mid_response;
            let gauge = gauge.clone();
            tokio::spawn(async move {
                let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _held = gauge.enter();
                let (mut down_read, mut down_write) = down.split();
                let (mut up_read, mut up_write) = up.split();
                let request = tokio::io::copy(&mut down_read, &mut up_write);
                let response = async {
                    let mut first = vec![0u8; 64 * 1024];
                    let n = match plan.timeout {
                        Some(limit) => match tokio::time::timeout(limit, up_read.read(&mut first)).await {
                            Ok(read) => read.unwrap_or(0),
                            Err(_) => {
                                let _ = down_write
                                    .write_all(
                                        b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                                    )
                                    .await;
                                return;
                            }
                        },
                        None => up_read.read(&mut first).await.unwrap_or(0),
                    };
                    if n == 0 || lose {
                        return;
                    }
                    if reset {
                        let _ = down_write.write_all(&first[..n / 2]).await;
                        return;
                    }
                    if down_write.write_all(&first[..n]).await.is_ok() {
                        let _ = tokio::io::copy(&mut up_read, &mut down_write).await;
                    }
                };
                tokio::select! {
                    _ = request => {}
                    () = response => {}
                }
                // Both sides close here (a reset one with linger 0): a cut
                // request is gone upstream too.
                if reset {
                    let _ = down.set_zero_linger();
                }
            });
        }
    });
    (url, held)
}

/// A connection per request, so the proxy's faults hit one request each.
fn lab_http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// The baseline: a synchronous endpoint that runs the work inline.

/// What the synchronous endpoint spent.
#[derive(Default)]
struct SyncBill {
    runs: AtomicUsize,
    finished: AtomicUsize,
    /// Simulated minutes of work, in thousandths.
    milli_minutes: AtomicU64,
    /// Work that ended after its request was gone (cut by the proxy).
    abandoned: AtomicUsize,
    abandoned_milli_minutes: AtomicU64,
    held: Arc<Gauge>,
}

/// Sets its flag when dropped before `done`: the request went away while
/// its work ran.
struct Gone {
    flag: Arc<std::sync::atomic::AtomicBool>,
    done: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if !self.done {
            self.flag.store(true, Ordering::SeqCst);
        }
    }
}

/// `POST /run`: draws a run time, runs it and answers when it is done. The
/// work goes on when the client goes away, as a paid model call does.
async fn sync_endpoint(draw: Draw, bill: Arc<SyncBill>) -> SocketAddr {
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let (draw, bill) = (draw.clone(), bill.clone());
            async move {
                let _held = bill.held.enter();
                let minutes = draw.run_minutes();
                bill.runs.fetch_add(1, Ordering::Relaxed);
                let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let work = {
                    let (bill, flag) = (bill.clone(), flag.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(sim(minutes)).await;
                        let milli = (minutes * 1000.0) as u64;
                        bill.milli_minutes.fetch_add(milli, Ordering::Relaxed);
                        if flag.load(Ordering::SeqCst) {
                            bill.abandoned.fetch_add(1, Ordering::Relaxed);
                            bill.abandoned_milli_minutes.fetch_add(milli, Ordering::Relaxed);
                        }
                        bill.finished.fetch_add(1, Ordering::Relaxed);
                    })
                };
                let mut gone = Gone { flag, done: false };
                let _ = work.await;
                gone.done = true;
                axum::Json(json!({ "minutes": minutes }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct SyncResult {
    answered: usize,
    runs: usize,
    billed_minutes: f64,
    abandoned_runs: usize,
    abandoned_minutes: f64,
    held: usize,
}

/// `RUNS` clients call the synchronous endpoint through the proxy (arrivals
/// spread over one simulated minute); on a `504` a client tries again, up
/// to `retries` times.
async fn synchronous(seed: u64, retries: usize) -> SyncResult {
    let bill = Arc::new(SyncBill::default());
    let endpoint = sync_endpoint(Draw::new(seed), bill.clone()).await;
    let plan = ProxyPlan {
        timeout: Some(sim(PROXY_TIMEOUT_MINUTES)),
        lose_response: 0,
        reset_mid_response: 0,
    };
    let (front, _) = proxy(endpoint, plan, seed).await;
    let http = lab_http();
    let mut arrivals = Rng::new(seed ^ 0xA11);
    let clients: Vec<_> = (0..RUNS)
        .map(|_| {
            let (http, front) = (http.clone(), front.clone());
            let arrive = sim(arrivals.unit());
            tokio::spawn(async move {
                tokio::time::sleep(arrive).await;
                for _ in 0..=retries {
                    if let Ok(r) = http.post(format!("{front}/run")).send().await
                        && r.status().is_success()
                    {
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    let mut answered = 0;
    for c in clients {
        answered += usize::from(c.await.unwrap());
    }
    // Orphaned work goes on after its client gave up: wait for all of it.
    while bill.finished.load(Ordering::Relaxed) < bill.runs.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    SyncResult {
        answered,
        runs: bill.runs.load(Ordering::Relaxed),
        billed_minutes: bill.milli_minutes.load(Ordering::Relaxed) as f64 / 1000.0,
        abandoned_runs: bill.abandoned.load(Ordering::Relaxed),
        abandoned_minutes: bill.abandoned_milli_minutes.load(Ordering::Relaxed) as f64 / 1000.0,
        held: bill.held.take_max(),
    }
}

// ---------------------------------------------------------------------------
// Longrun: the same work as operations.

/// A Longrun server (in process, its clock compressed like every wait here)
/// with the `agent` and `ping` kinds, and its keys.
struct Longrun {
    server: longrun_server::RunningServer,
    client: String,
    worker: String,
}

impl Longrun {
    async fn start(dir: &std::path::Path) -> Self {
        let mut options = ServeOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            SqliteConfig::new(dir.join("longrun.db")),
        );
        options.clock = Arc::new(ScaledClock::new(SystemClock.now(), SCALE));
        options.builtin_workers = false;
        options.http.callback_policy = longrun_server::CallbackPolicy {
            allow_http: true,
            allow_private: true,
        };
        options.webhooks.schedule = longrun_core::webhook::parse_schedule(WEBHOOK_SCHEDULE).unwrap();
        options.webhooks.interval = Duration::from_millis(20);
        // A connection per attempt, so the proxy's faults hit attempts.
        options.webhooks.reuse_connections = false;
        let server = longrun_server::start(options).await.unwrap();
        for name in ["agent", "ping", "fixed"] {
            common::rerun_safe_kind(server.store.as_ref(), name).await;
        }
        let client = key(server.store.as_ref(), Role::Client).await;
        let worker = key(server.store.as_ref(), Role::Worker).await;
        Self { server, client, worker }
    }

    fn base(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// `GET path` with the client key, as JSON.
    async fn get(&self, http: &reqwest::Client, path: &str) -> Value {
        let response = http
            .get(format!("{}{path}", self.base()))
            .bearer_auth(&self.client)
            .send();
        response.await.unwrap().json().await.unwrap()
    }
}

/// What the workers ran.
#[derive(Default)]
struct WorkerBill {
    runs: AtomicUsize,
    milli_minutes: AtomicU64,
}

/// HTTP workers (as many slots as needed) for `agent` (a drawn run time, its
/// minutes reported as the operation's cost), `ping` (at once) and `fixed`
/// (`OBSERVED_MINUTES`). They stop with the server.
fn spawn_workers(longrun: &Longrun, draw: Draw, bill: Arc<WorkerBill>) {
    let (base, token) = (longrun.base(), longrun.worker.clone());
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    for _ in 0..4 {
        let (http, base, token, draw, bill) = (http.clone(), base.clone(), token.clone(), draw.clone(), bill.clone());
        tokio::spawn(async move {
            loop {
                let claimed: Value = match http
                    .post(format!("{base}/v1/worker/claims"))
                    .bearer_auth(&token)
                    .json(&json!({"kinds": ["agent", "ping", "fixed"], "max_tasks": 100,
                                  "lease_seconds": 600, "wait_seconds": 1}))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => r.json().await.unwrap_or(Value::Null),
                    Ok(r) => panic!("the lab's workers cannot claim: {}", r.text().await.unwrap_or_default()),
                    Err(_) => return,
                };
                for task in claimed["tasks"].as_array().cloned().unwrap_or_default() {
                    let (http, base, token, draw, bill) =
                        (http.clone(), base.clone(), token.clone(), draw.clone(), bill.clone());
                    tokio::spawn(async move {
                        let id = task["operation_id"].as_str().unwrap().to_owned();
                        let minutes = match task["kind"].as_str() {
                            Some("agent") => draw.run_minutes(),
                            Some("fixed") => OBSERVED_MINUTES,
                            _ => 0.0,
                        };
                        let url = |action: &str| format!("{base}/v1/worker/tasks/{id}/{action}");
                        // A heartbeat every simulated minute keeps the lease
                        // (10 simulated minutes) alive through long runs.
                        let started = Instant::now();
                        let beat = json!({"lease_token": task["lease_token"]});
                        while started.elapsed() + sim(1.0) < sim(minutes) {
                            tokio::time::sleep(sim(1.0)).await;
                            let _ = http.post(url("heartbeat")).bearer_auth(&token).json(&beat).send().await;
                        }
                        tokio::time::sleep(sim(minutes).saturating_sub(started.elapsed())).await;
                        bill.runs.fetch_add(1, Ordering::Relaxed);
                        bill.milli_minutes
                            .fetch_add((minutes * 1000.0) as u64, Ordering::Relaxed);
                        let lease = json!({"lease_token": task["lease_token"], "cost_units": minutes});
                        let _ = http
                            .post(url("heartbeat"))
                            .bearer_auth(&token)
                            .json(&lease)
                            .send()
                            .await;
                        let done = json!({"lease_token": task["lease_token"], "result": {"minutes": minutes}});
                        let _ = http.post(url("complete")).bearer_auth(&token).json(&done).send().await;
                    });
                }
            }
        });
    }
}

/// How a Longrun client submits through the lossy proxy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Submitter {
    /// Plain HTTP, a new key on every attempt: what no key amounts to.
    NoKey,
    /// Plain HTTP, the same key on every attempt.
    Key,
    /// The Rust SDK (retries with its key on its own).
    Sdk,
    /// `longrun submit --idempotency-key` (the SDK inside a process).
    Cli,
}

/// Every operation of the tenant with label `lab=tag`.
async fn operations_tagged(http: &reqwest::Client, longrun: &Longrun, tag: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut page: Option<String> = None;
    loop {
        let mut url = format!("/v1/operations?page_size=100&label=lab:{tag}");
        if let Some(p) = &page {
            url.push_str(&format!("&page_token={p}"));
        }
        let body = longrun.get(http, &url).await;
        all.extend(body["operations"].as_array().cloned().unwrap_or_default());
        match body["next_page_token"].as_str() {
            Some(p) => page = Some(p.to_owned()),
            None => return all,
        }
    }
}

struct SubmitResult {
    logical: usize,
    operations: usize,
    billed_minutes: f64,
    held: usize,
}

/// `RUNS` logical submissions of `agent` work through a proxy that loses 5 %
/// of responses; every lost answer is retried (how depends on `submitter`).
/// Then every operation runs; the bill is the sum of their costs.
async fn submissions(longrun: &Longrun, seed: u64, submitter: Submitter, reset_mid_response: u64) -> SubmitResult {
    let plan = ProxyPlan {
        timeout: Some(sim(PROXY_TIMEOUT_MINUTES)),
        lose_response: 5,
        reset_mid_response,
    };
    let (front, held) = proxy(longrun.server.addr, plan, seed).await;
    let tag = format!("{submitter:?}-{seed}-{reset_mid_response}").to_lowercase();
    let http = lab_http();
    let token = longrun.client.clone();
    // A few at a time, as a producer would; the CLI's processes fewer.
    let parallel = if submitter == Submitter::Cli { 8 } else { 32 };
    let next = Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..parallel)
        .map(|_| {
            let (http, front, token, tag, next) =
                (http.clone(), front.clone(), token.clone(), tag.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= RUNS {
                        return;
                    }
                    submit_until_answered(&http, &front, &token, &tag, i, submitter).await;
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    let held = held.take_max();
    // Every operation created runs, duplicates included: wait for them all.
    let check = reqwest::Client::new();
    let operations = loop {
        let operations = operations_tagged(&check, longrun, &tag).await;
        if operations.iter().all(|op| op["terminal"] == true) {
            break operations;
        }
        tokio::time::sleep(sim(1.0)).await;
    };
    SubmitResult {
        logical: RUNS,
        operations: operations.len(),
        billed_minutes: operations.iter().filter_map(|op| op["cost"]["units"].as_f64()).sum(),
        held,
    }
}

/// One logical submission, retried until it has an answer.
async fn submit_until_answered(
    http: &reqwest::Client,
    front: &str,
    token: &str,
    tag: &str,
    i: usize,
    submitter: Submitter,
) {
    let body = json!({"kind": "agent", "input": {"run": i}, "labels": {"lab": tag}});
    let mut attempt = 0;
    loop {
        let key = match submitter {
            Submitter::NoKey => format!("{tag}-{i}-attempt-{attempt}"),
            _ => format!("{tag}-{i}"),
        };
        attempt += 1;
        let answered = match submitter {
            // An answer counts once its body is read: a cut one is retried.
            Submitter::NoKey | Submitter::Key => match http
                .post(format!("{front}/v1/operations"))
                .bearer_auth(token)
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => r.json::<Value>().await.is_ok(),
                _ => false,
            },
            Submitter::Sdk => {
                let sdk = longrun_client::Client::with_http(lab_http(), front, token);
                let submission = longrun_client::Submission {
                    labels: Some([("lab".to_owned(), tag.to_owned())].into()),
                    idempotency_key: Some(key),
                    ..longrun_client::Submission::new("agent", json!({"run": i}))
                };
                sdk.submit(&submission).await.is_ok()
            }
            Submitter::Cli => tokio::process::Command::new(processes::BIN)
                .args(["submit", "agent", "--input", &json!({"run": i}).to_string()])
                .args(["--idempotency-key", &key, "--label", &format!("lab={tag}")])
                .args(["--server", front, "--token", token])
                .env("LONGRUN_LOG", "error")
                .output()
                .await
                .is_ok_and(|out| out.status.success()),
        };
        if answered {
            return;
        }
    }
}

/// How a client learns that an operation ended.
#[derive(Clone, Copy, Debug)]
enum Observe {
    Every(f64),
    /// 2 s doubling to 60 s.
    Backoff,
    RetryAfter,
    LongPoll,
    EventStream,
}

/// Requests one client makes to learn that `id` ended (times in simulated
/// seconds; `Retry-After` is in the server's compressed seconds too).
async fn observe(http: reqwest::Client, base: String, token: String, id: String, how: Observe) -> usize {
    let url = format!("{base}/v1/operations/{id}");
    if let Observe::EventStream = how {
        let mut response = http
            .get(format!("{url}/events"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        let mut text = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("\"terminal\":true") {
                break;
            }
        }
        return 1;
    }
    let mut requests = 0;
    let mut backoff: f64 = 2.0;
    let mut etag: Option<String> = None;
    loop {
        let mut request = http.get(&url).bearer_auth(&token);
        if let Observe::LongPoll = how {
            request = request.header("Prefer", "wait=60");
            if let Some(tag) = &etag {
                request = request.header("If-None-Match", tag);
            }
        }
        let response = request.send().await.unwrap();
        requests += 1;
        let hint: f64 = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.0);
        if let Some(tag) = response.headers().get("etag").and_then(|v| v.to_str().ok()) {
            etag = Some(tag.to_owned());
        }
        if response.status() == 200 {
            let op: Value = response.json().await.unwrap();
            if op["terminal"] == true {
                return requests;
            }
        }
        let seconds = match how {
            Observe::Every(seconds) => seconds,
            Observe::Backoff => {
                let wait = backoff;
                backoff = (backoff * 2.0).min(60.0);
                wait
            }
            Observe::RetryAfter => hint,
            Observe::LongPoll | Observe::EventStream => 0.0,
        };
        tokio::time::sleep(sim(seconds / 60.0)).await;
    }
}

/// A webhook receiver that dedupes by `webhook-id`; counts what it received
/// and which operations it saw end.
#[derive(Default)]
struct Receiver {
    received: usize,
    seen: HashSet<String>,
    /// Terminal events applied (after dedupe), per operation.
    applied: HashMap<String, usize>,
}

async fn receiver(state: Arc<Mutex<Receiver>>) -> SocketAddr {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let state = state.clone();
            async move {
                let event: Value = serde_json::from_str(&body).unwrap_or_default();
                let id = headers
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let mut state = state.lock().unwrap();
                state.received += 1;
                let terminal =
                    ["succeeded", "failed", "cancelled"].contains(&event["data"]["state"].as_str().unwrap_or(""));
                if state.seen.insert(id) && terminal {
                    let op = event["data"]["operation_id"].as_str().unwrap_or("").to_owned();
                    *state.applied.entry(op).or_default() += 1;
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn submit_plain(
    http: &reqwest::Client,
    longrun: &Longrun,
    kind: &str,
    key: &str,
    callback: Option<&str>,
) -> String {
    let mut body = json!({"kind": kind, "labels": {"lab": "observe"}});
    if let Some(url) = callback {
        body["callback"] = json!({ "url": url });
    }
    let op: Value = http
        .post(format!("{}/v1/operations", longrun.base()))
        .bearer_auth(&longrun.client)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    op["id"].as_str().unwrap().to_owned()
}

/// Requests (or deliveries) to learn that `OBSERVED` ten-minute operations
/// ended, per way of observing; all ways run at once.
async fn learning(longrun: &Longrun, seed: u64) -> Vec<(String, usize)> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(512).build().unwrap();
    let ways = [
        ("poll every 2 s", Some(Observe::Every(2.0))),
        ("poll every 10 s", Some(Observe::Every(10.0))),
        ("backoff 2 s doubling to 60 s", Some(Observe::Backoff)),
        ("follow `Retry-After`", Some(Observe::RetryAfter)),
        ("long-poll (`Prefer: wait=60`)", Some(Observe::LongPoll)),
        ("event stream (SSE)", Some(Observe::EventStream)),
        ("webhook", None),
    ];
    // Unobserved first, so the kind has a typical duration, as on a live
    // service (the `Retry-After` hint starts from it).
    let mut warm_up = Vec::new();
    for i in 0..20 {
        let id = submit_plain(&http, longrun, "fixed", &format!("warm-up-{seed}-{i}"), None).await;
        let (http, base, token) = (http.clone(), longrun.base(), longrun.client.clone());
        warm_up.push(tokio::spawn(observe(http, base, token, id, Observe::LongPoll)));
    }
    for w in warm_up {
        w.await.unwrap();
    }
    // The server remembers a kind's typical duration for 5 s (real time),
    // "unknown" included: let the answer it read before the warm-up ended go.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let hooks = Arc::new(Mutex::new(Receiver::default()));
    let hook_url = format!("http://{}/hook", receiver(hooks.clone()).await);
    let mut tasks = Vec::new();
    let mut webhook_ids = Vec::new();
    for (w, (_, how)) in ways.iter().enumerate() {
        for i in 0..OBSERVED {
            let key = format!("observe-{seed}-{w}-{i}");
            match how {
                Some(how) => {
                    let id = submit_plain(&http, longrun, "fixed", &key, None).await;
                    let (http, base, token, how) = (http.clone(), longrun.base(), longrun.client.clone(), *how);
                    tasks.push((w, tokio::spawn(observe(http, base, token, id, how))));
                }
                None => webhook_ids.push(submit_plain(&http, longrun, "fixed", &key, Some(&hook_url)).await),
            }
        }
    }
    let mut requests = vec![0; ways.len()];
    for (w, task) in tasks {
        requests[w] += task.await.unwrap();
    }
    while !webhook_ids
        .iter()
        .all(|id| hooks.lock().unwrap().applied.contains_key(id))
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    requests[ways.len() - 1] = hooks.lock().unwrap().received;
    ways.iter().map(|(name, _)| name.to_string()).zip(requests).collect()
}

struct WebhookResult {
    events: usize,
    acknowledged: usize,
    mean_attempts: f64,
    applied_once: usize,
    received: usize,
}

/// `RUNS` operations with a callback behind a proxy that loses 30 % of the
/// receiver's acknowledgements; the server tries each event up to six times
/// (`WEBHOOK_SCHEDULE`). What the server recorded and what the deduping
/// receiver applied.
async fn lossy_webhooks(longrun: &Longrun, seed: u64) -> WebhookResult {
    let hooks = Arc::new(Mutex::new(Receiver::default()));
    let receiver = receiver(hooks.clone()).await;
    let plan = ProxyPlan {
        timeout: None,
        lose_response: 30,
        reset_mid_response: 0,
    };
    let (front, _) = proxy(receiver, plan, seed ^ 0x400C).await;
    let hook_url = format!("{front}/hook");
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let mut ids = Vec::new();
    for i in 0..RUNS {
        ids.push(submit_plain(&http, longrun, "ping", &format!("hooks-{seed}-{i}"), Some(&hook_url)).await);
    }
    // Until every terminal event was acknowledged or given up.
    let mut acknowledged = 0;
    let mut attempts = 0;
    for id in &ids {
        loop {
            let log = longrun.get(&http, &format!("/v1/operations/{id}/deliveries")).await;
            let terminal: Vec<&Value> = log["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["type"] == "operation.succeeded")
                .collect();
            let ok = terminal
                .iter()
                .any(|d| d["status_code"].as_u64().is_some_and(|s| s < 300));
            // Given up: the last attempt failed and none is scheduled.
            let last = terminal.iter().max_by_key(|d| d["attempt"].as_u64());
            let given_up = last.is_some_and(|d| d["next_attempt_at"].is_null());
            if ok || given_up {
                acknowledged += usize::from(ok);
                attempts += terminal.len();
                break;
            }
            tokio::time::sleep(sim(1.0)).await;
        }
    }
    let hooks = hooks.lock().unwrap();
    WebhookResult {
        events: ids.len(),
        acknowledged,
        mean_attempts: attempts as f64 / ids.len() as f64,
        applied_once: ids.iter().filter(|id| hooks.applied.get(*id) == Some(&1)).count(),
        received: hooks.received,
    }
}

// ---------------------------------------------------------------------------

/// One figure over the seeds: the median and the range.
fn figure(values: &[f64], decimals: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let (low, high) = (sorted[0], sorted[sorted.len() - 1]);
    if (high - low).abs() < f64::EPSILON {
        format!("{median:.decimals$}")
    } else {
        format!("{median:.decimals$} ({low:.decimals$}–{high:.decimals$})")
    }
}

#[derive(Default)]
struct Rows(Vec<(String, String, Vec<Vec<f64>>)>);

impl Rows {
    /// The table: `title` heads the scenario column, `columns` the figures;
    /// `decimals` says how many each column shows.
    fn print(&self, title: &str, columns: &[&str], decimals: impl Fn(usize) -> usize) {
        println!("\n| {title} | simulated | {} |", columns.join(" | "));
        println!("|---|---|{}", "---|".repeat(columns.len()));
        for (name, simulated, values) in &self.0 {
            let figures: Vec<String> = values.iter().enumerate().map(|(i, v)| figure(v, decimals(i))).collect();
            println!("| {name} | {simulated} | {} |", figures.join(" | "));
        }
    }

    /// Adds the measurements of one seed to row `name`.
    fn add(&mut self, name: &str, simulated: &str, values: &[f64]) {
        if let Some(row) = self.0.iter_mut().find(|r| r.0 == name) {
            for (column, v) in row.2.iter_mut().zip(values) {
                column.push(*v);
            }
        } else {
            self.0.push((
                name.to_owned(),
                simulated.to_owned(),
                values.iter().map(|v| vec![*v]).collect(),
            ));
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(lab());
}

async fn lab() {
    let seeds: u64 = std::env::var("LONGRUN_LAB_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let first: u64 = std::env::var("LONGRUN_LAB_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    println!(
        "The lab: {RUNS} agent runs of {MEAN_RUN_MINUTES} min on average (exponential), a proxy that cuts requests at \
         {PROXY_TIMEOUT_MINUTES} min; 1 simulated minute = {} ms of real time (server clock {SCALE}x); seeds {first}..{}",
        SIM_MINUTE.as_millis(),
        first + seeds - 1
    );
    let mut sync_rows = Rows::default();
    let mut submit_rows = Rows::default();
    let mut learn_rows = Rows::default();
    let mut hook_rows = Rows::default();
    for seed in first..first + seeds {
        let started = Instant::now();
        for (name, simulated, retries) in [
            ("synchronous endpoint, no retry", "459 answered", 0),
            (
                "synchronous, the client retries once on timeout",
                "715 answered, 1,541 runs",
                1,
            ),
        ] {
            let r = synchronous(seed, retries).await;
            sync_rows.add(
                name,
                simulated,
                &[
                    r.answered as f64,
                    r.runs as f64,
                    (r.runs - RUNS.min(r.runs)) as f64,
                    r.billed_minutes,
                    r.abandoned_runs as f64,
                    r.abandoned_minutes,
                    r.held as f64,
                ],
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let longrun = Longrun::start(dir.path()).await;
        let bill = Arc::new(WorkerBill::default());
        spawn_workers(&longrun, Draw::new(seed ^ 0x10B), bill.clone());
        for (name, simulated, submitter, resets) in [
            (
                "Longrun, 5 % of responses lost, no key (a new key per attempt)",
                "47 duplicate jobs",
                Submitter::NoKey,
                0,
            ),
            (
                "Longrun, same, with an `Idempotency-Key`",
                "0 duplicates",
                Submitter::Key,
                0,
            ),
            ("Longrun, same, through the SDK", "–", Submitter::Sdk, 0),
            ("Longrun, same, through `longrun submit`", "–", Submitter::Cli, 0),
            (
                "Longrun, 5 % lost and 5 % reset mid-answer, no key",
                "–",
                Submitter::NoKey,
                5,
            ),
            (
                "Longrun, 5 % lost and 5 % reset mid-answer, through the SDK",
                "–",
                Submitter::Sdk,
                5,
            ),
        ] {
            let r = submissions(&longrun, seed, submitter, resets).await;
            submit_rows.add(
                name,
                simulated,
                &[
                    r.logical as f64,
                    r.operations as f64,
                    (r.operations - r.logical.min(r.operations)) as f64,
                    r.billed_minutes,
                    r.held as f64,
                ],
            );
        }
        let simulated = ["30,000", "6,000", "1,400", "–", "–", "–", "100"];
        for ((name, requests), simulated) in learning(&longrun, seed).await.into_iter().zip(simulated) {
            learn_rows.add(&name, simulated, &[requests as f64]);
        }
        let r = lossy_webhooks(&longrun, seed).await;
        hook_rows.add(
            "webhooks, 30 % of acknowledgements lost, up to 6 attempts",
            "999 of 1,000 acknowledged, mean 1.43 attempts, 1,000 applied once",
            &[
                r.events as f64,
                r.acknowledged as f64,
                r.mean_attempts,
                r.applied_once as f64,
                r.received as f64,
            ],
        );
        longrun.server.shutdown().await.unwrap();
        eprintln!(
            "seed {seed} done in {:.0} s (workers ran {} operations)",
            started.elapsed().as_secs_f64(),
            bill.runs.load(Ordering::Relaxed)
        );
    }

    let whole = |_| 0;
    sync_rows.print(
        "synchronous",
        &[
            &format!("answered of {RUNS}"),
            "runs",
            "duplicate runs",
            "work billed (min)",
            "runs finished after their client gave up",
            "their minutes",
            "connections held at once",
        ],
        whole,
    );
    submit_rows.print(
        "operations",
        &[
            "logical submissions",
            "operations created",
            "duplicates",
            "work billed (sum of costs, min)",
            "connections held at once",
        ],
        whole,
    );
    learn_rows.print(
        &format!("learning that {OBSERVED} ten-minute operations ended"),
        &["requests (deliveries for the webhook)"],
        whole,
    );
    hook_rows.print(
        "webhooks",
        &[
            "events",
            "acknowledged",
            "mean attempts",
            "applied once by the deduping receiver",
            "deliveries received",
        ],
        |i| if i == 2 { 2 } else { 0 },
    );
}
