//! Overload: `cargo bench -p longrun-cli --bench overload`.
//!
//! A release `longrun serve` (SQLite, no built-in workers) with
//! `--max-in-flight 256` takes keyed submissions from a closed loop of
//! clients: 32 (its normal load), then 10× and 30× as many, each phase
//! `LONGRUN_BENCH_SECONDS` (5) long. For each phase it prints the
//! submissions accepted per second and their p50/p99, how many were shed
//! (`503` with `Retry-After`) and how fast the refusal came (p99), and the
//! server's resident memory at the end of the phase. What it shows: past
//! its bound the server refuses at once instead of queueing, the latency of
//! what it accepts stays bounded, and memory does not grow with the load.
//!
//! Then clients that never read: `READERS` connections each pipeline
//! requests for `/openapi.json` and read nothing. It prints the server's
//! memory while they hold their connections and after `--send-stall-timeout`
//! (2 s here) has closed them: a client that stops reading pins at most one
//! response, and only for that long.

mod processes;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

const MAX_IN_FLIGHT: usize = 256;

struct Phase {
    accepted: Vec<Duration>,
    shed: Vec<Duration>,
    other: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// The server's resident set, from /proc, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn run_phase(base: &str, token: &str, clients: usize, seconds: u64, next_key: Arc<AtomicU64>) -> Phase {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, base, token, next_key) = (http.clone(), base.to_owned(), token.to_owned(), next_key.clone());
            tokio::spawn(async move {
                let mut phase = Phase {
                    accepted: Vec::new(),
                    shed: Vec::new(),
                    other: 0,
                };
                while Instant::now() < end {
                    let key = format!("o{}", next_key.fetch_add(1, Ordering::Relaxed));
                    let started = Instant::now();
                    let response = http
                        .post(format!("{base}/v1/operations"))
                        .bearer_auth(&token)
                        .header("Idempotency-Key", key)
                        .json(&json!({"kind": "noop", "input": {}}))
                        .send()
                        .await;
                    let elapsed = started.elapsed();
                    match response.map(|r| r.status().as_u16()) {
                        Ok(202) => phase.accepted.push(elapsed),
                        Ok(503) => {
                            phase.shed.push(elapsed);
                            // A client that honours Retry-After would wait a
                            // second; this one comes straight back, the worst case.
                        }
                        _ => phase.other += 1,
                    }
                }
                phase
            })
        })
        .collect();
    let mut all = Phase {
        accepted: Vec::new(),
        shed: Vec::new(),
        other: 0,
    };
    for task in tasks {
        let phase = task.await.unwrap();
        all.accepted.extend(phase.accepted);
        all.shed.extend(phase.shed);
        all.other += phase.other;
    }
    all.accepted.sort();
    all.shed.sort();
    all
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("LONGRUN_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let store = vec!["--data-dir".to_owned(), dir.path().display().to_string()];
    let (token, _) = processes::prepare(&store);
    let port = processes::free_port();
    let mut args = store.clone();
    args.extend([
        "--builtin-workers=false".to_owned(),
        "--max-in-flight".to_owned(),
        MAX_IN_FLIGHT.to_string(),
        "--send-stall-timeout".to_owned(),
        format!("{}s", SEND_STALL.as_secs()),
    ]);
    let server = processes::serve(port, &args).await;
    let pid = server.id().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let next_key = Arc::new(AtomicU64::new(0));
    println!(
        "keyed submissions, closed loop, {seconds} s per phase, --max-in-flight {MAX_IN_FLIGHT}, SQLite, fsync on; \
         server RSS at start {:.0} MiB",
        rss_mib(pid)
    );
    never_reading(port, pid).await;
    println!(
        "\n| clients | accepted/s | accepted p50 / p99 ms | shed (503) | shed p99 ms | other | server RSS MiB |\n|---|---|---|---|---|---|---|"
    );
    for clients in [32, 320, 960] {
        let phase = run_phase(&base, &token, clients, seconds, next_key.clone()).await;
        println!(
            "| {clients} | {:.0} | {:.1} / {:.1} | {} | {:.1} | {} | {:.0} |",
            phase.accepted.len() as f64 / seconds as f64,
            percentile(&phase.accepted, 0.5),
            percentile(&phase.accepted, 0.99),
            phase.shed.len(),
            percentile(&phase.shed, 0.99),
            phase.other,
            rss_mib(pid),
        );
    }
    drop(server);
}

const READERS: usize = 1000;
const SEND_STALL: Duration = Duration::from_secs(2);

/// `READERS` connections that send requests and never read an answer.
async fn never_reading(port: u16, pid: u32) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let before = rss_mib(pid);
    let pipelined = "GET /openapi.json HTTP/1.1\r\nHost: longrun\r\n\r\n".repeat(20);
    let mut connections = Vec::new();
    for _ in 0..READERS {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        stream.write_all(pipelined.as_bytes()).await.unwrap();
        connections.push(stream);
    }
    tokio::time::sleep(SEND_STALL / 2).await;
    let held = rss_mib(pid);
    tokio::time::sleep(SEND_STALL * 2).await;
    let after = rss_mib(pid);
    // Each connection was closed by the server: reading drains what was
    // buffered, then ends.
    let reads: Vec<_> = connections
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                // Past the server's header-read timeout too: a connection
                // whose answers all fit in the kernel's buffers is closed as
                // idle rather than as stalled.
                tokio::time::timeout(Duration::from_secs(15), async {
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                })
                .await
                .is_ok()
            })
        })
        .collect();
    let mut closed = 0;
    for read in reads {
        closed += usize::from(read.await.unwrap());
    }
    println!(
        "{READERS} clients that never read, 20 pipelined GET /openapi.json each, --send-stall-timeout {}s",
        SEND_STALL.as_secs()
    );
    println!("| server RSS before | while held | after the timeout | closed by the server |\n|---|---|---|---|");
    println!("| {before:.0} MiB | {held:.0} MiB | {after:.0} MiB | {closed} of {READERS} |");
}
