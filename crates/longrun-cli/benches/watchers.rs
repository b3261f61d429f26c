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

#[allow(dead_code)]
mod own_server;
#[allow(dead_code)]
mod processes;
mod record;

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OPERATIONS: usize = 100;

fn main() {
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
        record.line("| watchers | server RSS held | per watcher | woken | wake-up p50 | wake-up p99 |");
        record.line("|---|---|---|---|---|---|");
        for n in sizes {
            record.line(measure(n).await);
        }
        record.write();
    });
}

/// One row of the table for `n` watchers.
async fn measure(n: usize) -> String {
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
    let mut watchers = tokio::task::JoinSet::new();
    for i in 0..n {
        let request = format!(
            "GET /v1/operations/{} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
             Prefer: wait=60\r\nIf-None-Match: {}\r\n\r\n",
            watched[i % OPERATIONS],
            server.token,
            etags[i % OPERATIONS]
        );
        let addr = addr.clone();
        watchers.spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.expect("a watcher connects");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut first = [0u8; 12];
            stream.read_exact(&mut first).await.unwrap();
            let answered = Instant::now();
            (i % OPERATIONS, answered, first)
        });
    }
    // Held: the server counts them all as waiting.
    let until = Instant::now() + Duration::from_secs(50);
    loop {
        let waiting = processes::metric(&http, &metrics_addr, "longrun_http_waiters").await;
        if waiting >= n as f64 {
            break;
        }
        assert!(Instant::now() < until, "only {waiting} of {n} watchers are held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        let (op, answered, first) = done.unwrap();
        assert_eq!(&first[..12], b"HTTP/1.1 200", "a woken watcher reads the new version");
        wakes.push(answered.saturating_duration_since(cancelled_at[op]).as_secs_f64() * 1000.0);
    }
    wakes.sort_by(f64::total_cmp);
    let at = |q: f64| wakes[((wakes.len() as f64 * q) as usize).min(wakes.len() - 1)];
    format!(
        "| {n} | {:.1} MiB | {:.1} KiB | {} | {:.1} ms | {:.1} ms |",
        held / 1024.0,
        (held - before) / n as f64,
        wakes.len(),
        at(0.5),
        at(0.99)
    )
}
