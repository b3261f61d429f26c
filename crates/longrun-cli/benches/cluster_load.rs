//! Durable submits/s and claim → complete jobs/s on SQLite and PostgreSQL,
//! with 1 and 3 `longrun serve` processes (release binary), on this machine.
//! PostgreSQL is a throwaway cluster with fsync on (pgtest::start_durable).
//!
//! `cargo bench -p longrun-cli --bench cluster_load` (LONGRUN_BENCH_SECONDS, default 5).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod processes;

use processes::{free_port, prepare, serve};

const CLIENTS: usize = 32;

fn store_args(data_dir: &std::path::Path, database: Option<&str>) -> Vec<String> {
    match database {
        Some(url) => vec!["--database".into(), url.into()],
        None => vec!["--data-dir".into(), data_dir.display().to_string()],
    }
}

async fn run(name: &str, store: Vec<String>, nodes: usize, seconds: u64) {
    let (client, worker) = prepare(&store);
    let mut servers = Vec::new();
    let mut bases = Vec::new();
    for n in 0..nodes {
        let port = free_port();
        let mut args = vec!["--builtin-workers=false".into(), "--node-id".into(), format!("n{n}")];
        args.extend(store.iter().cloned());
        servers.push(serve(port, &args).await);
        bases.push(format!("http://127.0.0.1:{port}"));
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();

    let counter = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (http, base, token, counter) = (http.clone(), bases[c % nodes].clone(), client.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while started.elapsed() < Duration::from_secs(seconds) {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let ok = http
                    .post(format!("{base}/v1/operations"))
                    .bearer_auth(&token)
                    .header("Idempotency-Key", format!("k{i}"))
                    .json(&json!({"kind": "noop"}))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 202);
                done += usize::from(ok);
            }
            done
        }));
    }
    let mut submitted = 0;
    for t in tasks {
        submitted += t.await.unwrap();
    }
    let submit_rate = submitted as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut loops = Vec::new();
    for w in 0..(4 * nodes) {
        let (http, base, token) = (http.clone(), bases[w % nodes].clone(), worker.clone());
        loops.push(tokio::spawn(async move {
            let mut done = 0;
            loop {
                let claimed: Value = http
                    .post(format!("{base}/v1/worker/claims"))
                    .bearer_auth(&token)
                    .json(&json!({"kinds": ["noop"], "max_tasks": 32}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let tasks = claimed["tasks"].as_array().cloned().unwrap_or_default();
                if tasks.is_empty() {
                    return done;
                }
                for task in tasks {
                    let url = format!(
                        "{base}/v1/worker/tasks/{}/complete",
                        task["operation_id"].as_str().unwrap()
                    );
                    let r = http
                        .post(url)
                        .bearer_auth(&token)
                        .json(&json!({"lease_token": task["lease_token"]}))
                        .send()
                        .await
                        .unwrap();
                    done += usize::from(r.status().is_success());
                }
            }
        }));
    }
    let mut completed = 0;
    for l in loops {
        completed += l.await.unwrap();
    }
    let complete_rate = completed as f64 / started.elapsed().as_secs_f64();
    println!(
        "| {name} | {nodes} | {submit_rate:.0} | {complete_rate:.0} | {submitted} submitted, {completed} completed |"
    );
    for mut s in servers {
        let _ = s.kill().await;
    }
}

fn main() {
    let seconds: u64 = std::env::var("LONGRUN_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        println!(
            "{CLIENTS} clients spread over the nodes, {seconds} s of submits, then 4 workers per node (max_tasks 32)"
        );
        println!("| store | nodes | durable submits/s | claim→complete jobs/s | |");
        println!("|---|---|---|---|---|");
        let dir = tempfile::tempdir().unwrap();
        run("SQLite (synchronous=FULL)", store_args(dir.path(), None), 1, seconds).await;
        match longrun_store::pgtest::start_durable() {
            Ok(cluster) => {
                for nodes in [1, 3] {
                    let url = cluster.database().await;
                    let dir = tempfile::tempdir().unwrap();
                    let _ = dir;
                    run("PostgreSQL (fsync on)", vec!["--database".into(), url], nodes, seconds).await;
                }
            }
            Err(why) => println!("PostgreSQL skipped: {why}"),
        }
    });
}
