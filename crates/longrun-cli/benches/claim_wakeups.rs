//! Idle claimers: what one submission costs a server while W remote workers
//! wait in long-poll claims for its kind.
//!
//! `cargo bench -p longrun-cli --bench claim_wakeups`
//! (`LONGRUN_BENCH_CLAIMERS`, comma-separated, default `1,64`;
//! `LONGRUN_BENCH_SUBMISSIONS`, default 300).
//!
//! A release `longrun serve` runs as a process of its own with no built-in
//! workers, on SQLite and on PostgreSQL (fsync on). W claimers of this
//! process each hold a claim (`POST /v1/worker/claims`, one task,
//! `wait_seconds` 20) and complete what they get at once. Submissions come
//! one at a time, each once the one before was completed, so every
//! submission finds all W claimers waiting (10 ms after the one before was
//! picked up). Read from the server: its claims woken that found nothing
//! (`longrun_claim_rounds_total{found="none",after="wake"}`) and its CPU
//! time (`/proc/PID/stat`; on PostgreSQL also its processes'), a
//! submission, less what the same claimers cost idle over 2 s before (each
//! waiting claim looks again every 500 ms); measured here: the time from
//! sending a submission to its claim's answer.
//!
//! The comparison, same sitting: the same submissions with one claimer
//! waiting. A wake-up that goes to every waiting claim makes a
//! submission's cost grow with W; one that goes to a claim per unit of work
//! keeps it flat.

#[allow(dead_code)]
mod processes;
mod record;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;

/// How long the idle claimers' own looks are counted.
const IDLE: Duration = Duration::from_secs(2);
/// The pause after each pickup.
const GAP: Duration = Duration::from_millis(10);

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn main() {
    let claimers = env_list("LONGRUN_BENCH_CLAIMERS", "1,64");
    let submissions = env_list("LONGRUN_BENCH_SUBMISSIONS", "300")[0];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let cluster = longrun_store::pgtest::start_durable();
        if let Err(why) = &cluster {
            println!("PostgreSQL is not available here ({why}); SQLite only");
        }
        let mut record = record::Record::new("claim-wakeups");
        record.line(format!(
            "{submissions} submissions one at a time, each once the one before was completed; \
             W remote claimers waiting (one task a claim, `wait_seconds` 20).\n"
        ));
        record.line(
            "| store | claimers waiting (W) | fallback polls, a second idle | claims woken that found nothing, a submission | server + database CPU a submission | pickup p50 | pickup p99 |",
        );
        record.line("|---|---|---|---|---|---|---|");
        let mut ratios = Vec::new();
        for store in ["SQLite", "PostgreSQL"] {
            let mut cpu_by_w = Vec::new();
            for &w in &claimers {
                let dir = tempfile::tempdir().unwrap();
                let args = match (store, &cluster) {
                    ("SQLite", _) => vec!["--data-dir".to_owned(), dir.path().display().to_string()],
                    (_, Ok(cluster)) => vec!["--database".to_owned(), cluster.database().await],
                    _ => continue,
                };
                let m = measure(&args, w, submissions).await;
                record.line(format!(
                    "| {store} | {w} | {:.0} | {:.2} | {:.0} + {:.0} µs | {:.2} ms | {:.2} ms |",
                    m.idle_polls, m.empty_claims, m.cpu_us, m.db_us, m.p50_ms, m.p99_ms
                ));
                cpu_by_w.push((w, m.cpu_us + m.db_us));
            }
            if let (Some((w1, one)), Some((wn, many))) = (cpu_by_w.first(), cpu_by_w.last())
                && wn > w1
            {
                ratios.push(format!(
                    "| {store}: server + database CPU a submission, {wn} claimers waiting / {w1} | {:.2}× |",
                    many / one
                ));
            }
        }
        record.line("\n| ratio (same run) | value |\n|---|---|");
        for ratio in ratios {
            record.line(ratio);
        }
        record.write();
    });
}

struct Measured {
    /// Claims a second the waiting claims' fallback polls made while no
    /// work came.
    idle_polls: f64,
    empty_claims: f64,
    cpu_us: f64,
    /// PostgreSQL's processes' CPU (0 on SQLite, whose work is the server's).
    db_us: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn measure(store: &[String], claimers: usize, submissions: usize) -> Measured {
    let (client_key, worker_key) = processes::prepare(store);
    let (port, metrics_port) = (processes::free_port(), processes::free_port());
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut args = store.to_vec();
    args.extend(
        [
            "--builtin-workers",
            "false",
            "--metrics-listen",
            &metrics_addr,
            "--max-waiters-per-tenant",
            "10000",
        ]
        .map(String::from),
    );
    let server = processes::serve(port, &args).await;
    let pid = server.id().unwrap();
    let base = Arc::new(format!("http://127.0.0.1:{port}"));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(claimers + 4)
        .build()
        .unwrap();

    // Each claimer completes what it gets and says when it got it.
    let (got, mut answered) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..claimers {
        let (http, base, key, got) = (http.clone(), base.clone(), worker_key.clone(), got.clone());
        workers.spawn(async move {
            loop {
                let Ok(response) = http
                    .post(format!("{base}/v1/worker/claims"))
                    .bearer_auth(&key)
                    .json(&json!({"kinds": ["noop"], "max_tasks": 1, "wait_seconds": 20,
                                  "worker_id": format!("w{i}")}))
                    .send()
                    .await
                else {
                    return;
                };
                let Ok(body) = response.json::<Value>().await else {
                    return;
                };
                for task in body["tasks"].as_array().into_iter().flatten() {
                    let at = Instant::now();
                    let id = task["operation_id"].as_str().unwrap().to_owned();
                    let done = http
                        .post(format!("{base}/v1/worker/tasks/{id}/complete"))
                        .bearer_auth(&key)
                        .json(&json!({"lease_token": task["lease_token"], "result": {}}))
                        .send()
                        .await
                        .unwrap();
                    assert!(done.status().is_success(), "complete: {}", done.status());
                    let _ = got.send((id, at));
                }
            }
        });
    }
    // Every claimer waits before the first submission.
    let rounds = async |labels: &[(&str, &str)]| {
        processes::metric_with(&http, &metrics_addr, "longrun_claim_rounds_total", labels).await
    };
    while rounds(&[("after", "start")]).await < claimers as f64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Idle, each waiting claim still looks every 500 ms (the fallback that
    // catches work whose start arrives): measured, and taken off the CPU
    // below.
    let idle_polls = rounds(&[("after", "poll")]).await;
    let (idle_cpu, idle_db, idle_from) = (cpu_ticks(pid), database_ticks(), Instant::now());
    tokio::time::sleep(IDLE).await;
    let idle_seconds = idle_from.elapsed().as_secs_f64();
    let idle_polls = (rounds(&[("after", "poll")]).await - idle_polls) / idle_seconds;
    let idle_cpu = (cpu_ticks(pid) - idle_cpu) / idle_seconds;
    let idle_db = (database_ticks() - idle_db) / idle_seconds;

    let woken_for_nothing = [("found", "none"), ("after", "wake")];
    let (empty_before, cpu_before, db_before, from) = (
        rounds(&woken_for_nothing).await,
        cpu_ticks(pid),
        database_ticks(),
        Instant::now(),
    );
    let mut pickups = Vec::with_capacity(submissions);
    for n in 0..submissions {
        let sent = Instant::now();
        let op: Value = http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(&client_key)
            .header("Idempotency-Key", format!("wake-{n}"))
            .json(&json!({"kind": "noop", "input": {}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = op["id"].as_str().expect("accepted").to_owned();
        let (got_id, at) = answered.recv().await.unwrap();
        assert_eq!(got_id, id, "one submission at a time");
        pickups.push(at - sent);
        // Claimers woken for nothing look and wait again meanwhile.
        tokio::time::sleep(GAP).await;
    }
    let seconds = from.elapsed().as_secs_f64();
    let cpu = cpu_ticks(pid) - cpu_before - idle_cpu * seconds;
    let db = database_ticks() - db_before - idle_db * seconds;
    let empty = rounds(&woken_for_nothing).await - empty_before;
    workers.abort_all();
    drop(server);
    pickups.sort();
    let at = |q: f64| pickups[((pickups.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    let ticks_per_second = 100.0;
    Measured {
        idle_polls,
        empty_claims: empty / submissions as f64,
        cpu_us: cpu / ticks_per_second / submissions as f64 * 1e6,
        db_us: db / ticks_per_second / submissions as f64 * 1e6,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    }
}

/// The process's user and system CPU time so far, in clock ticks.
fn cpu_ticks(pid: u32) -> f64 {
    stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// The CPU time of every `postgres` process now running, in clock ticks.
fn database_ticks() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| stat.contains("(postgres)"))
        .map(|stat| stat_ticks(&stat))
        .sum()
}

/// User and system CPU time of a `/proc/PID/stat` line, in clock ticks.
fn stat_ticks(stat: &str) -> f64 {
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    field(11) + field(12)
}
