//! The release `longrun serve` as a process of its own, on SQLite in a
//! throwaway data directory, for benches that measure its memory.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};

pub struct OwnServer {
    pub child: tokio::process::Child,
    pub pid: u32,
    /// `http://127.0.0.1:…`
    pub base: String,
    /// The bootstrap client key.
    pub token: String,
    _data: tempfile::TempDir,
}

impl OwnServer {
    /// Starts it and reads its address and first keys from its output.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts it with these flags besides the listener and the data
    /// directory.
    pub async fn start_with(flags: &[&str]) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_longrun"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .args(flags)
            .env("LONGRUN_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut base, mut token) = (String::new(), String::new());
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(key) = line.trim().strip_prefix("client key:") {
                token = key.trim().to_owned();
            }
            if let Some(url) = line.strip_prefix("longrun listening on ") {
                base = url.trim().to_owned();
                break;
            }
        }
        Self {
            child,
            pid,
            base,
            token,
            _data: data,
        }
    }

    /// Its resident memory now (`VmRSS`), in KiB.
    #[allow(dead_code)]
    pub fn rss_kib(&self) -> f64 {
        status_kib(&self.pid.to_string(), "VmRSS")
    }

    /// Submits `body` with `key` as the bootstrap client; the operation.
    #[allow(dead_code)]
    pub async fn submit(&self, http: &reqwest::Client, key: &str, body: &serde_json::Value) -> serde_json::Value {
        http.post(format!("{}/v1/operations", self.base))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Its peak resident memory so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(&self.pid.to_string())
    }
}

/// Peak resident memory (`VmHWM`) of process `pid` (`self` for this one), in MiB.
pub fn peak_rss_mib(pid: &str) -> f64 {
    status_kib(pid, "VmHWM") / 1024.0
}

/// A memory field of `/proc/{pid}/status`, in KiB (0 when unreadable).
pub fn status_kib(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}
