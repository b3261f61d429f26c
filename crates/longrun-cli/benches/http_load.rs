//! Load over loopback HTTP against an in-process server on a fresh SQLite
//! file: durable submits/s with 32 concurrent clients (and their latency),
//! GET/s on one operation, a bare axum POST handler for comparison, and
//! in-process claim → complete throughput of no-op `sleep` operations.
//!
//! `cargo bench -p longrun-cli --bench http_load` (LONGRUN_BENCH_SECONDS, default 5).
//! Client and server share this machine's cores, as they would with wrk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::{Clock, SystemClock};
use longrun_server::ServeOptions;
use longrun_store::{ApiKeyCreateParams, SqliteConfig};
use serde_json::json;

const CLIENTS: usize = 32;

struct Report {
    requests: usize,
    errors: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Report {
    fn print(&self, name: &str) {
        let mut l = self.latencies.clone();
        l.sort();
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        println!(
            "{name:<34} {:>9.0} req/s   p50 {:>7.2} ms   p99 {:>7.2} ms   ({} requests, {} errors, {:.1} s)",
            self.requests as f64 / self.elapsed.as_secs_f64(),
            pct(0.50).as_secs_f64() * 1000.0,
            pct(0.99).as_secs_f64() * 1000.0,
            self.requests,
            self.errors,
            self.elapsed.as_secs_f64()
        );
    }
}

/// Runs `CLIENTS` loops of `request(i)` for `duration`.
async fn load<F, Fut>(duration: Duration, request: F) -> Report
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let request = Arc::new(request);
    let counter = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..CLIENTS {
        let (request, counter) = (request.clone(), counter.clone());
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            while started.elapsed() < duration {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                if !request(i).await {
                    errors += 1;
                }
                latencies.push(t.elapsed());
            }
            (latencies, errors)
        }));
    }
    let mut report = Report {
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for h in handles {
        let (latencies, errors) = h.await.unwrap();
        report.requests += latencies.len();
        report.errors += errors;
        report.latencies.extend(latencies);
    }
    report.elapsed = started.elapsed();
    report
}

async fn bare_axum() -> SocketAddr {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/operations",
        post(|body: axum::body::Bytes| async move {
            let _: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            (
                axum::http::StatusCode::ACCEPTED,
                axum::Json(json!({"id": "op_x", "state": "queued"})),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn main() {
    let seconds: u64 = std::env::var("LONGRUN_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let duration = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ServeOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            SqliteConfig::new(dir.path().join("longrun.db")),
        );
        options.builtin_workers = false;
        let server = longrun_server::start(options).await.unwrap();
        let token = server.bootstrap.clone().unwrap().client;
        let base = format!("http://{}", server.addr);
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(CLIENTS)
            .build()
            .unwrap();
        println!("Longrun HTTP load, {CLIENTS} concurrent clients over loopback, {seconds} s per run");

        let bare = bare_axum().await;
        let (h, url) = (http.clone(), format!("http://{bare}/v1/operations"));
        let report = load(duration, move |i| {
            let (h, url) = (h.clone(), url.clone());
            async move {
                let body = json!({"kind": "sleep", "input": {"duration_ms": i}});
                h.post(&url).json(&body).send().await.is_ok_and(|r| r.status() == 202)
            }
        })
        .await;
        report.print("bare axum POST (baseline)");

        let (h, b, t) = (http.clone(), base.clone(), token.clone());
        let report = load(duration, move |i| {
            let (h, b, t) = (h.clone(), b.clone(), t.clone());
            async move {
                let body = json!({"kind": "sleep", "input": {"duration_ms": 1000}});
                h.post(format!("{b}/v1/operations"))
                    .bearer_auth(&t)
                    .header("Idempotency-Key", format!("bench-{i}"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 202)
            }
        })
        .await;
        report.print("durable submit (POST, new key)");

        let first: serde_json::Value = http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(&token)
            .header("Idempotency-Key", "bench-get")
            .json(&json!({"kind": "sleep", "input": {"duration_ms": 1}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let url = format!("{base}/v1/operations/{}", first["id"].as_str().unwrap());
        let (h, t) = (http.clone(), token.clone());
        let report = load(duration, move |_| {
            let (h, t, url) = (h.clone(), t.clone(), url.clone());
            async move {
                h.get(&url)
                    .bearer_auth(&t)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        report.print("GET one operation");
        let stored = server.store.clone();
        server.shutdown().await.unwrap();
        drop(stored);

        // In-process claim → complete of no-op operations.
        let dir = tempfile::tempdir().unwrap();
        let options = ServeOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            SqliteConfig::new(dir.path().join("longrun.db")),
        );
        let server = longrun_server::start(options).await.unwrap();
        let key = NewApiKey::generate();
        server
            .store
            .api_key_create(ApiKeyCreateParams {
                id: key.id.clone(),
                tenant: "bench".into(),
                role: Role::Client,
                secret_hash: key.secret_hash,
                now: SystemClock.now(),
            })
            .await
            .unwrap();
        let n = 5_000;
        let base = format!("http://{}", server.addr);
        let started = Instant::now();
        let submitted = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for c in 0..CLIENTS {
            let (h, b, t) = (http.clone(), base.clone(), key.token.clone());
            handles.push(tokio::spawn(async move {
                for i in (c..n).step_by(CLIENTS) {
                    h.post(format!("{b}/v1/operations"))
                        .bearer_auth(&t)
                        .header("Idempotency-Key", format!("noop-{i}"))
                        .json(&json!({"kind": "sleep", "input": {"duration_ms": 0, "steps": 1}}))
                        .send()
                        .await
                        .unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        submitted.store(n, Ordering::Relaxed);
        let accepted_in = started.elapsed();
        loop {
            let page = server
                .store
                .operation_list(longrun_store::ListParams {
                    tenant: Some("bench".into()),
                    state: Some(longrun_core::State::Succeeded),
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .unwrap();
            let pending = server
                .store
                .operation_list(longrun_store::ListParams {
                    tenant: Some("bench".into()),
                    state: Some(longrun_core::State::Queued),
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .unwrap();
            let running = server
                .store
                .operation_list(longrun_store::ListParams {
                    tenant: Some("bench".into()),
                    state: Some(longrun_core::State::Running),
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .unwrap();
            if !page.operations.is_empty() && pending.operations.is_empty() && running.operations.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let elapsed = started.elapsed();
        println!(
            "{:<34} {:>9.0} ops/s   ({n} submitted in {:.2} s, all succeeded after {:.2} s)",
            "submit + in-process run to success",
            n as f64 / elapsed.as_secs_f64(),
            accepted_in.as_secs_f64(),
            elapsed.as_secs_f64()
        );
        server.shutdown().await.unwrap();
    });
}
