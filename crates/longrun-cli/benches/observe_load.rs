//! How many requests a client needs to learn that 100 operations of a fixed
//! duration (10 minutes) finished, for six ways of observing, against the
//! real server with time compressed 300× (its clock, the clients' waits and
//! the worker's run time are all scaled; `Prefer: wait` holds in real time,
//! which only makes long-polls wait longer). Then webhook deliveries/s to a
//! loopback receiver.
//!
//! `cargo bench -p longrun-cli --bench observe_load`

#[path = "common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::key;
use longrun_core::apikey::Role;
use longrun_core::{Clock, Id, IdKind, ScaledClock, State, SystemClock};
use longrun_server::ServeOptions;
use longrun_store::{AcceptOutcome, AcceptParams, CancelParams, KindSpec, ListParams, SqliteConfig};
use serde_json::{Value, json};

const SCALE: f64 = 100.0;
const OPS: usize = 100;
const JOB_SECONDS: f64 = 600.0;

fn real(server_seconds: f64) -> Duration {
    Duration::from_secs_f64(server_seconds / SCALE)
}

/// A worker that runs every task for JOB_SECONDS (scaled), heartbeating.
fn spawn_worker(http: reqwest::Client, base: String, token: String) {
    tokio::spawn(async move {
        loop {
            let claimed: Value = match http
                .post(format!("{base}/v1/worker/claims"))
                .bearer_auth(&token)
                .json(&json!({"kinds": ["fixed"], "max_tasks": 100, "lease_seconds": 600, "wait_seconds": 1}))
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => return,
            };
            for task in claimed["tasks"].as_array().cloned().unwrap_or_default() {
                let (http, base, token) = (http.clone(), base.clone(), token.clone());
                tokio::spawn(async move {
                    let url = |action: &str| {
                        format!(
                            "{base}/v1/worker/tasks/{}/{action}",
                            task["operation_id"].as_str().unwrap()
                        )
                    };
                    let body = json!({"lease_token": task["lease_token"]});
                    let started = Instant::now();
                    while started.elapsed() < real(JOB_SECONDS) {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let _ = http.post(url("heartbeat")).bearer_auth(&token).json(&body).send().await;
                    }
                    let _ = http.post(url("complete")).bearer_auth(&token).json(&body).send().await;
                });
            }
        }
    });
}

#[derive(Clone, Copy, Debug)]
enum Strategy {
    Fixed(f64),
    Backoff,
    RetryAfter,
    LongPoll,
}

/// Polls one operation until it is terminal; returns the requests made.
async fn observe(http: reqwest::Client, url: String, token: String, strategy: Strategy) -> usize {
    let mut requests = 0;
    let mut delay: f64 = 2.0;
    let mut etag: Option<String> = None;
    loop {
        let mut request = http.get(&url).bearer_auth(&token);
        if let Strategy::LongPoll = strategy {
            request = request.header("Prefer", "wait=60");
            if let Some(tag) = &etag {
                request = request.header("If-None-Match", tag);
            }
        }
        let response = request.send().await.unwrap();
        requests += 1;
        let retry_after: f64 = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.0);
        etag = response
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or(etag);
        if response.status() == 200 {
            let op: Value = response.json().await.unwrap();
            if op["terminal"] == true {
                return requests;
            }
        }
        let wait = match strategy {
            Strategy::Fixed(seconds) => seconds,
            Strategy::Backoff => {
                let d = delay;
                delay = (delay * 2.0).min(60.0);
                d
            }
            Strategy::RetryAfter => retry_after,
            Strategy::LongPoll => 0.0,
        };
        tokio::time::sleep(real(wait)).await;
    }
}

async fn submit_batch(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    tag: &str,
    callback: Option<&str>,
) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..OPS {
        let mut body = json!({"kind": "fixed"});
        if let Some(url) = callback {
            body["callback"] = json!({"url": url});
        }
        let op: Value = http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("{tag}-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(op["id"].as_str().unwrap().to_owned());
    }
    ids
}

/// A loopback receiver counting deliveries and which operations reached an end.
async fn receiver() -> (String, Arc<AtomicUsize>, Arc<Mutex<HashSet<String>>>) {
    let count = Arc::new(AtomicUsize::new(0));
    let ended: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (c, e) = (count.clone(), ended.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let (c, e) = (c.clone(), e.clone());
            async move {
                c.fetch_add(1, Ordering::Relaxed);
                let event: Value = serde_json::from_str(&body).unwrap_or_default();
                if ["succeeded", "failed", "cancelled"].contains(&event["data"]["state"].as_str().unwrap_or("")) {
                    e.lock()
                        .unwrap()
                        .insert(event["data"]["operation_id"].as_str().unwrap_or("").to_owned());
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook"), count, ended)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ServeOptions::new("127.0.0.1:0".parse().unwrap(), SqliteConfig::new(dir.path().join("longrun.db")));
        options.clock = Arc::new(ScaledClock::new(SystemClock.now(), SCALE));
        options.builtin_workers = false;
        options.http.callback_policy = longrun_server::CallbackPolicy { allow_http: true, allow_private: true };
        options.webhooks.interval = Duration::from_millis(20);
        let server = longrun_server::start(options).await.unwrap();
        let store = server.store.clone();
        store
            .kind_upsert(KindSpec {
                name: "fixed".into(),
                builtin: false,
                rerun_safe: true,
                max_attempts: 3,
                default_deadline_seconds: None,
                max_deadline_seconds: None,
            })
            .await
            .unwrap();
        let (client, worker) = (key(store.as_ref(), Role::Client).await, key(store.as_ref(), Role::Worker).await);
        let base = format!("http://{}", server.addr);
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
        spawn_worker(http.clone(), base.clone(), worker);

        // Warm-up, unobserved, so the kind has a typical duration (as a live service would).
        submit_batch(&http, &base, &client, "warmup", None).await;
        loop {
            let running = store
                .operation_list(ListParams { tenant: "bench".into(), state: Some(State::Running), page_size: 1, ..Default::default() })
                .await
                .unwrap();
            let queued = store
                .operation_list(ListParams { tenant: "bench".into(), state: Some(State::Queued), page_size: 1, ..Default::default() })
                .await
                .unwrap();
            if running.operations.is_empty() && queued.operations.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        println!("Requests to learn that {OPS} operations of 10 minutes finished (time compressed {SCALE}x, real server)");
        println!("| strategy | requests | per operation |");
        println!("|---|---|---|");
        let strategies = [
            ("fixed polling every 2 s", Strategy::Fixed(2.0)),
            ("fixed polling every 10 s", Strategy::Fixed(10.0)),
            ("client backoff 2 s → 60 s", Strategy::Backoff),
            ("following Retry-After", Strategy::RetryAfter),
            ("long-poll (Prefer: wait=60, If-None-Match)", Strategy::LongPoll),
        ];
        for (i, (name, strategy)) in strategies.into_iter().enumerate() {
            let ids = submit_batch(&http, &base, &client, &format!("s{i}"), None).await;
            let mut tasks = Vec::new();
            for id in ids {
                let (http, url, token) = (http.clone(), format!("{base}/v1/operations/{id}"), client.clone());
                tasks.push(tokio::spawn(observe(http, url, token, strategy)));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            println!("| {name} | {total} | {:.1} |", total as f64 / OPS as f64);
        }
        let (url, deliveries, ended) = receiver().await;
        let ids: HashSet<String> = submit_batch(&http, &base, &client, "hooks", Some(&url)).await.into_iter().collect();
        while !ids.iter().all(|id| ended.lock().unwrap().contains(id)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "| webhook (no polling; one delivery per state transition) | {} deliveries, 0 polls | {:.1} |",
            deliveries.load(Ordering::Relaxed),
            deliveries.load(Ordering::Relaxed) as f64 / OPS as f64
        );

        // Delivery throughput: events written straight to the store, delivered to loopback.
        let (url, deliveries, _) = receiver().await;
        let events = 5000;
        let now = SystemClock.now();
        let mut writes = Vec::new();
        for _ in 0..events {
            let (store, url) = (store.clone(), url.clone());
            writes.push(tokio::spawn(async move {
                let AcceptOutcome::Created(op) = store
                    .operation_accept(AcceptParams {
                        id: Id::generate(IdKind::Operation),
                        tenant: "bench".into(),
                        kind: "fixed".into(),
                        input: Value::Null,
                        callback_url: Some(url),
                        deadline_at: None,
                        budget_max_cost: None,
                        labels: Default::default(),
                        idempotency: None,
                        now,
                    })
                    .await
                    .unwrap()
                else {
                    unreachable!()
                };
                store
                    .operation_cancel(CancelParams {
                        tenant: "bench".into(),
                        id: op.id,
                        requested_by: "bench".into(),
                        reason: None,
                        if_match: None,
                        now,
                    })
                    .await
                    .unwrap();
            }));
        }
        let started = Instant::now();
        for w in writes {
            w.await.unwrap();
        }
        while deliveries.load(Ordering::Relaxed) < events {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        println!(
            "\nwebhook deliveries to a loopback receiver: {:.0}/s ({events} signed deliveries in {:.2} s, events written concurrently)",
            events as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64()
        );
        server.shutdown().await.unwrap();
    });
}
