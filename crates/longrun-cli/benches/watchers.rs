//! Held watchers: N long-polls (`GET /v1/operations/{id}` with `Prefer:
//! wait=60` and the current ETag) held at once by one release `longrun
//! serve` (SQLite) as a process of its own; its resident memory per held
//! request, and how soon after a change each one is answered.
//!
//! `cargo bench -p longrun-cli --bench watchers`
//! (`LONGRUN_BENCH_WATCHERS`, comma-separated, default `1000,10000`).
//!
//! For each N: 100 operations are submitted to a server running no
//! workers (so they stay queued) and their ETags read; N watchers, each a plain TCP
//! connection of this process, ask for one of them (round robin). Once the
//! server's `longrun_http_waiters` gauge says all N wait, its `VmRSS` is read
//! against the one before they connected. Then every operation is
//! cancelled, one request after the other, and each watcher's wake-up is
//! the time from its operation's cancel request being sent to the first
//! byte of its answer.
//!
//! The server's caps are raised to hold N (`--max-waiters-per-tenant`,
//! `--max-in-flight-per-tenant`, `--max-in-flight`, `--max-connections`);
//! both processes need N open files and more (`ulimit -n`).
//!
//! The peer, same sitting: a bare axum route on the hyper HTTP/1
//! connection Longrun's listener builds (same timer and header timeout,
//! same allocator), run as a process of its own (this binary again), whose
//! handler does nothing but wait for one shared signal. Its resident memory
//! per held request is the floor under Longrun's: what hyper, axum and a
//! tokio task keep for a connection whose request is in flight.

#[allow(dead_code)]
mod own_server;
#[allow(dead_code)]
mod processes;
mod record;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

const OPERATIONS: usize = 100;

/// The allocator `longrun serve` runs with, so that the peer's figure is
/// comparable.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Set to a port, this binary is the bare long-poll server instead.
const BARE_PORT: &str = "LONGRUN_WATCHERS_BARE_PORT";

fn main() {
    if let Ok(port) = std::env::var(BARE_PORT) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(serve_bare(port.parse().unwrap()));
        return;
    }
    let sizes: Vec<usize> = std::env::var("LONGRUN_BENCH_WATCHERS")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut record = record::Record::new("watchers");
        record.line(format!(
            "Held long-polls, a release server as its own process (SQLite), {OPERATIONS} operations watched.\n"
        ));
        record.line(
            "| watchers | server RSS held | per watcher | bare hyper + axum, per watcher | ratio | woken | wake-up p50 | wake-up p99 |",
        );
        record.line("|---|---|---|---|---|---|---|---|");
        for n in sizes {
            let (held, per_watcher, wakes) = measure(n).await;
            let floor = bare(n).await;
            record.line(format!(
                "| {n} | {:.1} MiB | {per_watcher:.1} KiB | {floor:.1} KiB | {:.2}× | {wakes} |",
                held / 1024.0,
                per_watcher / floor
            ));
        }
        record.write();
    });
}

/// For `n` watchers: the server's RSS held (KiB), per watcher (KiB), and
/// the rest of the row (woken, wake-up p50 and p99).
async fn measure(n: usize) -> (f64, f64, String) {
    let cap = (n + 200).to_string();
    let metrics_port = processes::free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let server = own_server::OwnServer::start_with(&[
        "--max-waiters-per-tenant",
        &cap,
        "--max-in-flight-per-tenant",
        &cap,
        "--max-in-flight",
        &cap,
        "--max-connections",
        &cap,
        "--metrics-listen",
        &metrics_addr,
        "--builtin-workers",
        "false",
    ])
    .await;
    let http = reqwest::Client::new();
    let mut watched = Vec::new();
    for i in 0..OPERATIONS {
        let op = server
            .submit(
                &http,
                &format!("watched-{i}"),
                &json!({"kind": "sleep", "input": {"duration_ms": 1}}),
            )
            .await;
        watched.push(op["id"].as_str().unwrap().to_owned());
    }
    // The ETag each watcher names: no worker runs here (the operations
    // stay queued), so nothing but the cancel below changes them.
    let mut etags = Vec::new();
    for id in &watched {
        let response = http
            .get(format!("{}/v1/operations/{id}", server.base))
            .bearer_auth(&server.token)
            .send()
            .await
            .unwrap();
        etags.push(response.headers()["etag"].to_str().unwrap().to_owned());
    }
    let before = server.rss_kib();

    let addr = server.base.trim_start_matches("http://").to_owned();
    let requests = (0..n).map(|i| {
        format!(
            "GET /v1/operations/{} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
             Prefer: wait=60\r\nIf-None-Match: {}\r\n\r\n",
            watched[i % OPERATIONS],
            server.token,
            etags[i % OPERATIONS]
        )
    });
    let mut watchers = hold(&addr, requests);
    held_by(&http, &metrics_addr, n).await;
    let held = server.rss_kib();

    let mut cancelled_at = Vec::new();
    for id in &watched {
        cancelled_at.push(Instant::now());
        let response = http
            .put(format!("{}/v1/operations/{id}/cancellation", server.base))
            .bearer_auth(&server.token)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "cancel: {}", response.status());
    }
    let mut wakes = Vec::new();
    while let Some(done) = watchers.join_next().await {
        let (i, answered, first) = done.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200", "a woken watcher reads the new version");
        let cancelled = cancelled_at[i % OPERATIONS];
        wakes.push(answered.saturating_duration_since(cancelled).as_secs_f64() * 1000.0);
    }
    wakes.sort_by(f64::total_cmp);
    let at = |q: f64| wakes[((wakes.len() as f64 * q) as usize).min(wakes.len() - 1)];
    (
        held,
        (held - before) / n as f64,
        format!("{} | {:.1} ms | {:.1} ms", wakes.len(), at(0.5), at(0.99)),
    )
}

/// The bare server's RSS per held request (KiB) with `n` requests held.
async fn bare(n: usize) -> f64 {
    let port = processes::free_port();
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command.env(BARE_PORT, port.to_string());
    let server = processes::listening(command, "bare listening").await;
    let rss = || own_server::status_kib(&server.id().unwrap().to_string(), "VmRSS");
    let http = reqwest::Client::new();
    let addr = format!("127.0.0.1:{port}");
    // One request first, as Longrun's figure starts after its setup's.
    held_by(&http, &addr, 0).await;
    let before = rss();
    let mut watchers = hold(
        &addr,
        (0..n).map(|_| format!("GET /wait HTTP/1.1\r\nHost: {addr}\r\n\r\n")),
    );
    held_by(&http, &addr, n).await;
    let held = rss();
    http.post(format!("http://{addr}/release")).send().await.unwrap();
    while let Some(done) = watchers.join_next().await {
        assert_eq!(&done.unwrap().2, b"HTTP/1.1 200", "a released watcher is answered");
    }
    (held - before) / n as f64
}

/// One watcher per request, each a plain TCP connection to `addr` that
/// sends its request and waits for the first bytes of the answer: (its
/// index, when they came, the status line's first 12 bytes).
fn hold(addr: &str, requests: impl Iterator<Item = String>) -> JoinSet<(usize, Instant, [u8; 12])> {
    let mut watchers = JoinSet::new();
    let connecting = connecting();
    for (i, request) in requests.enumerate() {
        let addr = addr.to_owned();
        let connecting = connecting.clone();
        watchers.spawn(async move {
            let permit = connecting.acquire_owned().await.unwrap();
            let mut stream = tokio::net::TcpStream::connect(&addr).await.expect("a watcher connects");
            stream.write_all(request.as_bytes()).await.unwrap();
            drop(permit);
            let mut first = [0u8; 12];
            stream.read_exact(&mut first).await.unwrap();
            (i, Instant::now(), first)
        });
    }
    watchers
}

/// Returns once the server whose metrics `metrics_addr` serves counts at
/// least `n` requests waiting (`longrun_http_waiters`); panics after 50 s.
async fn held_by(http: &reqwest::Client, metrics_addr: &str, n: usize) {
    let until = Instant::now() + Duration::from_secs(50);
    loop {
        let waiting = processes::metric(http, metrics_addr, "longrun_http_waiters").await;
        if waiting >= n as f64 {
            return;
        }
        assert!(Instant::now() < until, "only {waiting} of {n} watchers are held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many watchers connect at once. All 10,000 at once overflow the
/// listener's accept queue (1,024), and a connection the kernel drops is
/// retried only after its SYN back-off (seconds): the bare peer's round
/// after the 1,000 round twice ended short of 10,000 held at its deadline,
/// and has not since the connects were paced.
fn connecting() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(256))
}

/// The bare long-poll server: `GET /wait` answers once `POST /release`
/// is called; `GET /metrics` counts the held ones under the name of
/// Longrun's gauge, so one poll reads both. Each connection is served as
/// `longrun_server::listen` serves one.
async fn serve_bare(port: u16) {
    use axum::routing::{get, post};
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let (release, released) = tokio::sync::watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let count = held.clone();
    let app = axum::Router::new()
        .route(
            "/wait",
            get(move || {
                let mut released = released.clone();
                let held = held.clone();
                async move {
                    held.fetch_add(1, Ordering::Relaxed);
                    let _ = released.wait_for(|r| *r).await;
                    held.fetch_sub(1, Ordering::Relaxed);
                    axum::Json(json!({"id": "op_x", "state": "cancelled", "version": 2}))
                }
            }),
        )
        .route(
            "/metrics",
            get(move || async move { format!("longrun_http_waiters {}\n", count.load(Ordering::Relaxed)) }),
        )
        .route(
            "/release",
            post(move || async move {
                let _ = release.send(true);
            }),
        );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    println!("bare listening");
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(TokioIo::new(Box::pin(stream)), service);
        tokio::spawn(connection);
    }
}
