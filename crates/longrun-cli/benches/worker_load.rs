//! Claim → complete throughput with a no-op handler — in-process workers, and
//! remote workers over loopback HTTP with `max_tasks` 1 and 32 — and pickup
//! latency (submit sent → the worker's claim returns it) at low load.
//!
//! `cargo bench -p longrun-cli --bench worker_load` (LONGRUN_BENCH_JOBS, default 20000).

#[path = "common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::key;
use longrun_core::apikey::Role;
use longrun_core::{Clock, Id, IdKind, State, SystemClock};
use longrun_server::{RunningServer, ServeOptions};
use longrun_store::{AcceptParams, ListParams, SqliteConfig, Store};
use serde_json::{Value, json};

async fn server(builtin_workers: bool) -> (RunningServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        SqliteConfig::new(dir.path().join("longrun.db")),
    );
    options.builtin_workers = builtin_workers;
    options.dispatcher.poll_interval = Duration::from_millis(10);
    let server = longrun_server::start(options).await.unwrap();
    common::rerun_safe_kind(server.store.as_ref(), "noop").await;
    (server, dir)
}

/// Queues `n` operations of `kind` straight through the store.
async fn enqueue(store: &Arc<dyn Store>, kind: &str, input: Value, n: usize) {
    let mut handles = Vec::new();
    for chunk in 0..32 {
        let (store, kind, input) = (store.clone(), kind.to_owned(), input.clone());
        handles.push(tokio::spawn(async move {
            for _ in (chunk..n).step_by(32) {
                store
                    .operation_accept(AcceptParams {
                        id: Id::generate(IdKind::Operation),
                        tenant: "bench".into(),
                        kind: kind.clone(),
                        input: input.clone(),
                        callback_url: None,
                        deadline_at: None,
                        budget_max_cost: None,
                        labels: Default::default(),
                        idempotency: None,
                        uploads: Vec::new(),
                        rerun_of: None,
                        from_checkpoint: false,
                        not_before: None,
                        priority: longrun_store::PRIORITY_DEFAULT,
                        now: SystemClock.now(),
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

async fn count(store: &Arc<dyn Store>, state: State) -> bool {
    let page = store
        .operation_list(ListParams {
            tenant: Some("bench".into()),
            state: Some(state),
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    !page.operations.is_empty()
}

/// `loops` remote workers, each claiming `max_tasks` and completing them, until the queue is empty.
async fn remote_run(base: &str, token: &str, loops: usize, max_tasks: u32) -> usize {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let mut handles = Vec::new();
    for _ in 0..loops {
        let (http, base, token) = (http.clone(), base.to_owned(), token.to_owned());
        handles.push(tokio::spawn(async move {
            let mut done = 0;
            loop {
                let claimed: Value = http
                    .post(format!("{base}/v1/worker/claims"))
                    .bearer_auth(&token)
                    .json(&json!({"kinds": ["noop"], "max_tasks": max_tasks}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let tasks = claimed["tasks"].as_array().unwrap().clone();
                if tasks.is_empty() {
                    return done;
                }
                let completions = tasks.iter().map(|task| {
                    let url = format!(
                        "{base}/v1/worker/tasks/{}/complete",
                        task["operation_id"].as_str().unwrap()
                    );
                    http.post(url)
                        .bearer_auth(&token)
                        .json(&json!({"lease_token": task["lease_token"]}))
                        .send()
                });
                for response in futures_util::future::join_all(completions).await {
                    assert!(response.unwrap().status().is_success());
                    done += 1;
                }
            }
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

fn main() {
    let jobs: usize = std::env::var("LONGRUN_BENCH_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        println!("Longrun worker load: {jobs} queued no-op operations per run, loopback HTTP, SQLite");

        // In-process: the built-in sleep kind with 0 ms and one step (claim, one progress write, complete).
        let (srv, _dir) = server(true).await;
        let store = srv.store.clone();
        let started = Instant::now();
        enqueue(&store, "sleep", json!({"duration_ms": 0, "steps": 1}), jobs).await;
        let queued_in = started.elapsed();
        while count(&store, State::Queued).await || count(&store, State::Running).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        println!(
            "{:<44} {:>8.0} jobs/s  ({jobs} in {:.2} s; queueing took {:.2} s of it, concurrently)",
            "in-process workers (64 slots)",
            jobs as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64(),
            queued_in.as_secs_f64()
        );
        srv.shutdown().await.unwrap();

        for (loops, max_tasks) in [(8, 1), (4, 32)] {
            let (srv, _dir) = server(false).await;
            let store = srv.store.clone();
            let token = key(store.as_ref(), Role::Worker).await;
            enqueue(&store, "noop", json!({}), jobs).await;
            let base = format!("http://{}", srv.addr);
            let started = Instant::now();
            let done = remote_run(&base, &token, loops, max_tasks).await;
            let elapsed = started.elapsed();
            assert_eq!(done, jobs);
            println!(
                "{:<44} {:>8.0} jobs/s  ({jobs} in {:.2} s)",
                format!("remote over HTTP, {loops} workers, max_tasks {max_tasks}"),
                jobs as f64 / elapsed.as_secs_f64(),
                elapsed.as_secs_f64()
            );
            srv.shutdown().await.unwrap();
        }

        // Pickup latency at low load: one long-polling worker, one submission every 20 ms.
        let (srv, _dir) = server(false).await;
        let store = srv.store.clone();
        let worker = key(store.as_ref(), Role::Worker).await;
        let client = key(store.as_ref(), Role::Client).await;
        let base = format!("http://{}", srv.addr);
        let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let picked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let samples = 200;
        let http = reqwest::Client::new();
        let poller = {
            let (http, base, picked) = (http.clone(), base.clone(), picked.clone());
            tokio::spawn(async move {
                let mut seen = 0;
                while seen < samples {
                    let claimed: Value = http
                        .post(format!("{base}/v1/worker/claims"))
                        .bearer_auth(&worker)
                        .json(&json!({"kinds": ["noop"], "max_tasks": 10, "wait_seconds": 20}))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    let now = Instant::now();
                    for task in claimed["tasks"].as_array().unwrap() {
                        picked
                            .lock()
                            .unwrap()
                            .push((task["operation_id"].as_str().unwrap().to_owned(), now));
                        seen += 1;
                    }
                }
            })
        };
        for i in 0..samples {
            let t = Instant::now();
            let op: Value = http
                .post(format!("{base}/v1/operations"))
                .bearer_auth(&client)
                .header("Idempotency-Key", format!("latency-{i}"))
                .json(&json!({"kind": "noop"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            sent.lock().unwrap().insert(op["id"].as_str().unwrap().to_owned(), t);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        poller.await.unwrap();
        let mut latencies: Vec<Duration> = {
            let sent = sent.lock().unwrap();
            let picked = picked.lock().unwrap();
            picked
                .iter()
                .map(|(id, at)| at.saturating_duration_since(sent[id]))
                .collect()
        };
        latencies.sort();
        println!(
            "{:<44} p50 {:.2} ms  p99 {:.2} ms  ({} samples, long-polling claim)",
            "pickup latency (submit sent -> claim returns)",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            latencies.len()
        );
        srv.shutdown().await.unwrap();
    });
}
