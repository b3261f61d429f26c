//! What an operator reads at the default level: a request that fails inside
//! the server is one ERROR line carrying its request id (the one its problem
//! body names), method, path, operation and what went wrong, while the
//! requests that succeed write nothing. (A test binary of its own: it
//! installs the process-wide subscriber.)

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longrun_server::ServeOptions;
use longrun_store::SqliteConfig;
use serde_json::{Value, json};

/// The log lines written, as the fmt layer formats them.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fails_inside_is_one_error_line_with_its_request_id() {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("longrun.db");
    let mut options = ServeOptions::new("127.0.0.1:0".parse().unwrap(), SqliteConfig::new(&database));
    options.builtin_workers = false;
    let server = longrun_server::start(options).await.unwrap();
    let token = server.bootstrap.clone().unwrap().client;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", server.addr);
    let op: Value = http
        .post(url("/v1/operations"))
        .bearer_auth(&token)
        .header("idempotency-key", "logged")
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = op["id"].as_str().unwrap().to_owned();

    // A row the store cannot read back: reading it is an internal error.
    let db = rusqlite::Connection::open(&database).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute("UPDATE operations SET labels = 'not json' WHERE id = ?1", [&id])
        .unwrap();
    let failed = http
        .get(url(&format!("/v1/operations/{id}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 500);
    let problem: Value = failed.json().await.unwrap();
    let request_id = problem["request_id"].as_str().unwrap().to_owned();
    server.shutdown().await.unwrap();

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one line for the failed request: {text}");
    let line = errors[0];
    for part in [
        "request failed",
        &format!("request_id=\"{request_id}\""),
        "method=GET",
        &format!("path=\"/v1/operations/{id}\""),
        &format!("op.id=\"{id}\""),
        "status=500",
        "error=",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    assert!(
        !text.contains("/v1/operations\""),
        "the submission that succeeded wrote no line: {text}"
    );
}
