//! A 10 M-row export paused mid-file and resumed, against the same export
//! uninterrupted, on the release server as its own process: wall times, the
//! row the pause stopped at, and whether the two files are byte-identical
//! (the server's SHA-256 of each, and the paused one downloaded and hashed
//! here).
//!
//! `cargo bench -p longrun-cli --bench export_resume` (LONGRUN_BENCH_ROWS=10000000).

mod own_server;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    async fn submit(&self, key: &str, rows: u64) -> String {
        let op: Value = self
            .http
            .post(format!("{}/v1/operations", self.base))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .json(&json!({"kind": "export", "input": {"rows": rows, "format": "csv"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        op["id"].as_str().unwrap().to_owned()
    }

    async fn get(&self, id: &str) -> Value {
        self.http
            .get(format!("{}/v1/operations/{id}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Polls (every 20 ms) until `done` holds.
    async fn until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        loop {
            let op = self.get(id).await;
            if done(&op) {
                return op;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn desire(&self, id: &str, version: i64, state: &str) -> u16 {
        self.http
            .patch(format!("{}/v1/operations/{id}", self.base))
            .bearer_auth(&self.token)
            .header("If-Match", format!("\"{version}\""))
            .json(&json!({"desired_state": state}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// The published artifact, downloaded and hashed here: (SHA-256, bytes).
    async fn download_sha256(&self, id: &str) -> (String, u64) {
        let resource: Value = self
            .http
            .get(format!("{}/v1/operations/{id}/result", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let url = format!("{}{}", self.base, resource["download"]["url"].as_str().unwrap());
        let mut response = self.http.get(url).send().await.unwrap();
        let (mut hasher, mut size) = (Sha256::new(), 0u64);
        while let Some(chunk) = response.chunk().await.unwrap() {
            size += chunk.len() as u64;
            hasher.update(&chunk);
        }
        (data_encoding::HEXLOWER.encode(&hasher.finalize()), size)
    }
}

fn main() {
    let rows: u64 = std::env::var("LONGRUN_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut server = own_server::OwnServer::start().await;
        let api = Api {
            http: reqwest::Client::new(),
            base: server.base.clone(),
            token: server.token.clone(),
        };
        println!("export of {rows} rows, release server as its own process, SQLite + file artifacts");

        let started = Instant::now();
        let plain = api.submit("plain", rows).await;
        let plain = api.until(&plain, |op| op["terminal"] == true).await;
        let plain_time = started.elapsed().as_secs_f64();
        assert_eq!(plain["state"], "succeeded", "{plain}");
        println!("uninterrupted:       {plain_time:>7.2} s");

        let started = Instant::now();
        let id = api.submit("paused", rows).await;
        let running = api
            .until(&id, |op| {
                op["progress"]["completed_units"].as_f64().unwrap_or(0.0) >= rows as f64 * 0.4
            })
            .await;
        let asked = api.desire(&id, running["version"].as_i64().unwrap(), "paused").await;
        assert_eq!(asked, 202, "the pause is asked of the worker");
        let paused = api.until(&id, |op| op["state"] == "paused").await;
        let stopped_at = paused["progress"]["completed_units"].as_f64().unwrap_or(0.0);
        let before_pause = started.elapsed().as_secs_f64();
        let resumed_at = Instant::now();
        assert_eq!(api.desire(&id, paused["version"].as_i64().unwrap(), "running").await, 200);
        let done = api.until(&id, |op| op["terminal"] == true).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let after_resume = resumed_at.elapsed().as_secs_f64();
        println!(
            "paused at row {stopped_at:>10.0} after {before_pause:.2} s, resumed, done {after_resume:.2} s later \
             ({:.2} s of work in all, attempt {})",
            before_pause + after_resume,
            done["attempt"]
        );

        let (plain_sha, resumed_sha) = (
            plain["result"]["artifact"]["sha256"].as_str().unwrap(),
            done["result"]["artifact"]["sha256"].as_str().unwrap(),
        );
        let (downloaded_sha, size) = api.download_sha256(&id).await;
        println!(
            "uninterrupted sha256 {plain_sha}\nresumed       sha256 {resumed_sha} (downloaded: {downloaded_sha}, {size} bytes)"
        );
        let identical = plain_sha == resumed_sha && resumed_sha == downloaded_sha;
        println!("byte-identical: {}", if identical { "yes" } else { "NO" });
        assert!(identical);
        println!("server peak RSS {:.0} MiB", server.peak_rss_mib());
        let _ = server.child.kill().await;
    });
}
