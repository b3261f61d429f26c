//! Helpers for the benches that run the release `longrun` binary as
//! processes (`cluster_load`, `peers`).

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_longrun");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `longrun ARGS STORE` to the end and returns its trimmed stdout.
pub fn cli(store: &[String], args: &[&str]) -> String {
    let out = std::process::Command::new(BIN).args(args).args(store).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Migrates the store, declares the rerun-safe `noop` kind, and returns a
/// client key and a worker key of tenant `bench`.
pub fn prepare(store: &[String]) -> (String, String) {
    cli(store, &["migrate"]);
    let client = cli(store, &["keys", "create", "--tenant", "bench", "--role", "client"]);
    let worker = cli(store, &["keys", "create", "--tenant", "bench", "--role", "worker"]);
    cli(store, &["kinds", "set", "noop", "--rerun-safe"]);
    (client, worker)
}

/// `longrun serve --listen 127.0.0.1:PORT ARGS`, once it listens; killed
/// when dropped.
pub async fn serve(port: u16, args: &[String]) -> Child {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env("LONGRUN_LOG", "error");
    listening(command, "longrun listening on").await
}

/// Starts `command` and returns it once a line of its stdout begins with
/// `ready` (the rest of its output is read and dropped); killed when
/// dropped. Panics if it exits first.
pub async fn listening(mut command: Command, ready: &str) -> Child {
    let mut child = command.stdout(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next_line().await.unwrap() {
            Some(line) if line.starts_with(ready) => break,
            Some(_) => {}
            None => panic!("{command:?} exited before it printed {ready:?}"),
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// The value of an unlabelled metric on a server's `/metrics` (served
/// without a key at `metrics_addr`, `--metrics-listen`), 0 if absent.
#[allow(dead_code)] // not every bench reads metrics
pub async fn metric(http: &reqwest::Client, metrics_addr: &str, name: &str) -> f64 {
    metric_with(http, metrics_addr, name, &[]).await
}

/// The sum of a metric's series on a server's `/metrics` that carry all of
/// `labels` (every series with none), 0 if absent.
#[allow(dead_code)] // not every bench reads metrics
pub async fn metric_with(http: &reqwest::Client, metrics_addr: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = http
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}
