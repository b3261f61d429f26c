//! The export kind end to end with the release binary as its own process:
//! 1 M and 40 M rows — wall time, rows/s, the server's peak RSS — and the
//! download throughput of the 40 M-row artifact over loopback.
//!
//! `cargo bench -p longrun-cli --bench export_load` (LONGRUN_BENCH_ROWS="1000000,40000000").

mod own_server;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn main() {
    let rows: Vec<u64> = std::env::var("LONGRUN_BENCH_ROWS")
        .unwrap_or_else(|_| "1000000,40000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut server = own_server::OwnServer::start().await;
        let (pid, base, token) = (server.pid, server.base.clone(), server.token.clone());
        let http = reqwest::Client::new();
        println!("export kind, release server as its own process (pid {pid}), SQLite + file artifacts");
        for n in rows {
            let started = Instant::now();
            let input = json!({"kind": "export", "input": {"rows": n, "format": "csv"}});
            let op = server.submit(&http, &format!("export-{n}"), &input).await;
            let id = op["id"].as_str().unwrap().to_owned();
            let mut etag = String::from("\"1\"");
            let done = loop {
                let response = http
                    .get(format!("{base}/v1/operations/{id}"))
                    .bearer_auth(&token)
                    .header("Prefer", "wait=30")
                    .header("If-None-Match", &etag)
                    .send()
                    .await
                    .unwrap();
                if response.status() == 200 {
                    etag = response.headers()["etag"].to_str().unwrap().to_owned();
                    let op: Value = response.json().await.unwrap();
                    if op["terminal"] == true {
                        break op;
                    }
                }
            };
            let elapsed = started.elapsed();
            assert_eq!(done["state"], "succeeded", "{done}");
            let size = done["result"]["artifact"]["size_bytes"].as_f64().unwrap();
            println!(
                "export {n:>11} rows: {:>7.2} s  {:>10.0} rows/s  {:>8.1} MiB  server peak RSS {:.0} MiB",
                elapsed.as_secs_f64(),
                n as f64 / elapsed.as_secs_f64(),
                size / 1048576.0,
                server.peak_rss_mib()
            );
            let resource: Value = http
                .get(format!("{base}/v1/operations/{id}/result"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let url = format!("{base}{}", resource["download"]["url"].as_str().unwrap());
            let started = Instant::now();
            let mut response = http.get(&url).send().await.unwrap();
            let mut received = 0u64;
            while let Some(chunk) = response.chunk().await.unwrap() {
                received += chunk.len() as u64;
            }
            let elapsed = started.elapsed().max(Duration::from_millis(1));
            println!(
                "download {:>9.1} MiB: {:>7.2} s  {:>8.0} MiB/s  server peak RSS {:.0} MiB",
                received as f64 / 1048576.0,
                elapsed.as_secs_f64(),
                received as f64 / 1048576.0 / elapsed.as_secs_f64(),
                server.peak_rss_mib()
            );
        }
        let _ = server.child.kill().await;
    });
}
