//! The `longrun` binary as a process: first start, key and kind commands,
//! SIGKILL after a burst of submissions, and graceful SIGTERM.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_longrun");

struct ServerProcess {
    child: Child,
    base: String,
    /// The client key printed on first start, if this was the first start.
    bootstrap_client_key: Option<String>,
}

/// Starts `longrun serve` on a free port and waits for it to say where it listens.
async fn start_server(data_dir: &Path, extra: &[&str]) -> ServerProcess {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("LONGRUN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("longrun starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut client_key = None;
    let base = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(key) = line.trim().strip_prefix("client key:") {
                client_key = Some(key.trim().to_owned());
            }
            if let Some(url) = line.strip_prefix("longrun listening on ") {
                return url.trim().to_owned();
            }
        }
        panic!("longrun exited before listening");
    })
    .await
    .expect("longrun listens within 30 s");
    // Keep draining stdout so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    ServerProcess {
        child,
        base,
        bootstrap_client_key: client_key,
    }
}

fn run_cli(data_dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("longrun runs")
}

async fn submit(http: &reqwest::Client, base: &str, token: &str, key: &str) -> reqwest::Result<reqwest::Response> {
    http.post(format!("{base}/v1/operations"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 60_000}}))
        .send()
        .await
}

/// Fires `total` submissions, 32 at a time; calls `on_progress(done)` as
/// responses arrive. Returns key → operation id for every 202.
async fn burst(
    base: &str,
    token: &str,
    total: usize,
    after: usize,
    on_after: impl FnOnce() + Send + 'static,
) -> HashMap<String, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let permits = Arc::new(tokio::sync::Semaphore::new(32));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..total {
        let (http, base, token, tx, permits) = (
            http.clone(),
            base.to_owned(),
            token.to_owned(),
            tx.clone(),
            permits.clone(),
        );
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.unwrap();
            let key = format!("burst-{i}");
            let outcome = match submit(&http, &base, &token, &key).await {
                Ok(r) if r.status() == StatusCode::ACCEPTED => {
                    let op: Value = r.json().await.unwrap_or(Value::Null);
                    op["id"].as_str().map(str::to_owned)
                }
                _ => None,
            };
            let _ = tx.send((key, outcome));
        });
    }
    drop(tx);
    let mut accepted = HashMap::new();
    let mut on_after = Some(on_after);
    let mut done = 0;
    while let Some((key, outcome)) = rx.recv().await {
        done += 1;
        if let Some(id) = outcome {
            accepted.insert(key, id);
        }
        if done == after {
            (on_after.take().unwrap())();
        }
    }
    accepted
}

/// After a restart: every accepted operation is there, and a replay of its
/// key returns it.
async fn assert_all_present(base: &str, token: &str, accepted: &HashMap<String, String>) {
    let http = reqwest::Client::new();
    for (key, id) in accepted {
        let got = http
            .get(format!("{base}/v1/operations/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), StatusCode::OK, "{id} was accepted, so it must survive");
        let replay = submit(&http, base, token, key).await.unwrap();
        assert_eq!(replay.status(), StatusCode::ACCEPTED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let op: Value = replay.json().await.unwrap();
        assert_eq!(op["id"].as_str(), Some(id.as_str()));
    }
}

async fn count_operations(base: &str, token: &str) -> usize {
    let http = reqwest::Client::new();
    let mut count = 0;
    let mut token_param = String::new();
    loop {
        let page: Value = http
            .get(format!("{base}/v1/operations?page_size=100{token_param}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        count += page["operations"].as_array().unwrap().len();
        match page["next_page_token"].as_str() {
            Some(t) => token_param = format!("&page_token={t}"),
            None => return count,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_burst_loses_no_accepted_operation() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(dir.path(), &["--builtin-workers=false"]).await;
    let token = server
        .bootstrap_client_key
        .clone()
        .expect("first start prints a client key");
    let pid = server.child.id().unwrap();

    // SIGKILL as soon as 150 of 400 responses are back: the rest are in flight.
    let accepted = burst(&server.base, &token, 400, 150, move || {
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
    })
    .await;
    let status = server.child.wait().await.unwrap();
    assert!(!status.success(), "the server was killed");
    assert!(
        accepted.len() >= 150,
        "at least the responses before the kill were accepted: {}",
        accepted.len()
    );

    let restarted = start_server(dir.path(), &["--builtin-workers=false"]).await;
    assert!(restarted.bootstrap_client_key.is_none(), "keys are bootstrapped once");
    assert_all_present(&restarted.base, &token, &accepted).await;

    // Requests whose response was lost to the kill may or may not have
    // committed; replaying every key must never create a second operation.
    let http = reqwest::Client::new();
    let mut ids = HashSet::new();
    for i in 0..400 {
        let response = submit(&http, &restarted.base, &token, &format!("burst-{i}"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let op: Value = response.json().await.unwrap();
        ids.insert(op["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 400);
    assert_eq!(
        count_operations(&restarted.base, &token).await,
        400,
        "one operation per key, none twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(dir.path(), &["--builtin-workers=false"]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let pid = server.child.id().unwrap();

    let accepted = burst(&server.base, &token, 300, 100, move || {
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
    })
    .await;
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert!(status.success(), "graceful shutdown exits 0: {status:?}");
    assert!(accepted.len() >= 100);

    let restarted = start_server(dir.path(), &["--builtin-workers=false"]).await;
    assert_all_present(&restarted.base, &token, &accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_kinds_commands_work_beside_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let migrated = run_cli(dir.path(), &["migrate"]);
    assert!(migrated.status.success(), "{migrated:?}");
    let server = start_server(dir.path(), &[]).await;

    let created = run_cli(dir.path(), &["keys", "create", "--tenant", "acme", "--role", "client"]);
    assert!(created.status.success(), "{created:?}");
    let token = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    assert!(token.starts_with("lr_"), "the key is printed once on stdout: {token}");

    let http = reqwest::Client::new();
    let ok = http
        .get(format!("{}/v1/operations", server.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);

    let listed = String::from_utf8(run_cli(dir.path(), &["keys", "list"]).stdout).unwrap();
    assert!(listed.contains("acme") && listed.contains("client") && listed.contains("default"));
    assert!(!listed.contains(&token), "secrets are never listed");

    let key_id = longrun_core::apikey::PresentedKey::parse(&token)
        .unwrap()
        .id
        .to_string();
    let revoked = run_cli(dir.path(), &["keys", "revoke", &key_id]);
    assert!(revoked.status.success(), "{revoked:?}");
    assert!(
        !run_cli(dir.path(), &["keys", "revoke", &key_id]).status.success(),
        "revoking twice fails"
    );
    assert!(
        !run_cli(dir.path(), &["keys", "create", "--tenant", "acme", "--role", "root"])
            .status
            .success()
    );

    let declared = run_cli(
        dir.path(),
        &["kinds", "set", "thumbnail", "--rerun-safe", "--max-attempts", "5"],
    );
    assert!(declared.status.success(), "{declared:?}");
    assert!(
        !run_cli(dir.path(), &["kinds", "set", "sleep"]).status.success(),
        "built-in kinds are not redeclared"
    );
    assert!(
        run_cli(dir.path(), &["admin", "pause-accepting", "--kind", "thumbnail"])
            .status
            .success()
    );
    assert!(
        run_cli(dir.path(), &["admin", "resume-accepting", "--kind", "thumbnail"])
            .status
            .success()
    );
    assert!(run_cli(dir.path(), &["admin", "rotate-link-key"]).status.success());
    let kinds = String::from_utf8(run_cli(dir.path(), &["kinds", "list"]).stdout).unwrap();
    assert!(kinds.contains("thumbnail") && kinds.contains("sleep"), "{kinds}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_every_in_flight_operation_still_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(dir.path(), &[]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..20 {
        let response = http
            .post(format!("{}/v1/operations", server.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("inflight-{i}"))
            .json(&json!({"kind": "sleep", "input": {"duration_ms": 3000, "steps": 30}}))
            .send()
            .await
            .unwrap();
        let op: Value = response.json().await.unwrap();
        ids.push(op["id"].as_str().unwrap().to_owned());
    }
    // Wait until they run, then kill the server mid-work.
    wait_until(&server.base, &token, &ids, |op| op["state"] == "running").await;
    server.child.start_kill().unwrap();
    server.child.wait().await.unwrap();

    let restarted = start_server(dir.path(), &[]).await;
    let ops = wait_until(&restarted.base, &token, &ids, |op| op["terminal"] == true).await;
    for op in ops {
        assert_eq!(op["state"], "succeeded", "sleep is safe to re-run: {op}");
        assert!(
            op["attempt"].as_i64().unwrap() >= 2,
            "it was retried after the crash: {op}"
        );
    }
}

/// Waits (bounded) until every operation satisfies `done`; returns them.
/// Files below `dir`, at any depth.
fn files_below(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let path = e.path();
            if path.is_dir() { files_below(&path) } else { vec![path] }
        })
        .collect()
}

#[tokio::test]
async fn tenants_delete_removes_a_tenants_rows_and_files_and_asks_first() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]).await;
    let created = run_cli(
        dir.path(),
        &["keys", "create", "--tenant", "doomed", "--role", "client"],
    );
    assert!(created.status.success(), "{created:?}");
    let token = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    let http = reqwest::Client::new();
    let op: Value = http
        .post(format!("{}/v1/operations", server.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", "doomed-export")
        .json(&json!({"kind": "export", "input": {"rows": 100}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = op["id"].as_str().unwrap().to_owned();
    wait_until(&server.base, &token, &[id], |op| op["state"] == "succeeded").await;
    let artifacts = dir.path().join("artifacts");
    assert_eq!(files_below(&artifacts).len(), 1, "the export's artifact is stored");

    let unasked = run_cli(dir.path(), &["tenants", "delete", "doomed"]);
    assert!(!unasked.status.success(), "deleting a tenant needs --yes");
    assert_eq!(files_below(&artifacts).len(), 1, "and without it nothing goes");

    let deleted = run_cli(dir.path(), &["tenants", "delete", "doomed", "--yes"]);
    assert!(deleted.status.success(), "{deleted:?}");
    let said = String::from_utf8(deleted.stdout).unwrap();
    assert!(
        said.contains("deleted tenant doomed: 1 operations, 1 results"),
        "{said}"
    );
    let warned = String::from_utf8(deleted.stderr).unwrap();
    assert!(!warned.contains("could not be deleted"), "every object went: {warned}");
    assert_eq!(files_below(&artifacts), Vec::<std::path::PathBuf>::new());
    // Its keys went too (a running server trusts a verified key for up to
    // its key-cache TTL, so ask the store, not the server).
    let keys = String::from_utf8(run_cli(dir.path(), &["keys", "list"]).stdout).unwrap();
    assert!(!keys.contains("doomed"), "{keys}");
    drop(server);
}

async fn wait_until(base: &str, token: &str, ids: &[String], done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut ops = Vec::new();
        for id in ids {
            let op: Value = http
                .get(format!("{base}/v1/operations/{id}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            ops.push(op);
        }
        if ops.iter().all(&done) {
            return ops;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out; operations: {ops:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a client command against `base`; returns (exit code, stdout).
async fn client(base: &str, token: &str, args: &[&str]) -> (i32, String) {
    let output = Command::new(BIN)
        .args(args)
        .args(["--server", base, "--token", token])
        .env("LONGRUN_LOG", "warn")
        .output()
        .await
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_commands_submit_wait_download_and_cancel_with_distinct_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();

    let (code, out) = client(
        &base,
        &token,
        &[
            "submit",
            "sleep",
            "--input",
            r#"{"duration_ms": 50}"#,
            "--wait",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let op: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(op["state"], "succeeded");

    let (code, _) = client(
        &base,
        &token,
        &[
            "submit",
            "sleep",
            "--input",
            r#"{"duration_ms": 1, "steps": 1, "fail_with": "boom"}"#,
            "--wait",
        ],
    )
    .await;
    assert_eq!(code, 1, "a failed operation exits 1");

    let input = dir.path().join("export.json");
    std::fs::write(&input, r#"{"rows": 1000, "format": "csv"}"#).unwrap();
    let at_file = format!("@{}", input.display());
    let (code, out) = client(
        &base,
        &token,
        &["submit", "export", "--input", &at_file, "--wait", "--output", "json"],
    )
    .await;
    assert_eq!(code, 0);
    let export: Value = serde_json::from_str(out.trim()).unwrap();
    let file = dir.path().join("export.csv");
    let (code, out) = client(
        &base,
        &token,
        &[
            "result",
            export["id"].as_str().unwrap(),
            "--output-file",
            file.to_str().unwrap(),
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["sha256"], export["result"]["artifact"]["sha256"]);
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1001);

    let (code, out) = client(
        &base,
        &token,
        &["submit", "sleep", "--input", r#"{"duration_ms": 60000, "steps": 600}"#],
    )
    .await;
    assert_eq!(code, 0);
    let id = out.trim().to_owned();
    assert!(id.starts_with("op_"), "text output prints the id: {out}");
    let (code, _) = client(&base, &token, &["cancel", &id, "--reason", "testing"]).await;
    assert_eq!(code, 0);
    let (code, _) = client(&base, &token, &["wait", &id]).await;
    assert_eq!(code, 3, "a cancelled operation exits 3");

    let (code, out) = client(&base, &token, &["list", "--output", "json", "--all"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(out.trim())
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let (code, out) = client(&base, &token, &["list", "--state", "cancelled"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.starts_with("ID"), "{out}");

    let (code, _) = client(&base, &token, &["submit", "sleep", "--input", "not json"]).await;
    assert_eq!(code, 2, "usage errors exit 2");
    let (code, out) = client(
        &base,
        &token,
        &["get", "op_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--output", "json"],
    )
    .await;
    assert_eq!(code, 4, "refusals exit 4");
    assert_eq!(serde_json::from_str::<Value>(out.trim()).unwrap()["code"], "not_found");
    let (code, _) = client("http://127.0.0.1:1", &token, &["get", &id]).await;
    assert_eq!(code, 5, "an unreachable server exits 5");
}

/// `longrun submit --batch FILE`: every line is checked before anything is
/// sent (a bad line sends nothing and exits 2); the file sent twice makes
/// each operation once; a refused line exits 4 and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_batch_sends_a_file_of_json_lines_and_a_resend_creates_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--builtin-workers=false"]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();
    let file = dir.path().join("batch.jsonl");

    std::fs::write(
        &file,
        "{\"kind\": \"sleep\", \"input\": {\"duration_ms\": 1}, \"idempotency_key\": \"a\"}\n\
         {\"kind\": \"sleep\", \"deadline_seconds\": \"soon\"}\n",
    )
    .unwrap();
    let batch = format!("{}", file.display());
    let (code, out) = client(&base, &token, &["submit", "--batch", &batch]).await;
    assert_eq!(
        (code, out.as_str()),
        (2, ""),
        "a bad line is a usage error and sends nothing"
    );
    assert_eq!(count_operations(&base, &token).await, 0);

    let lines: Vec<String> = (0..3)
        .map(|i| format!("{{\"kind\": \"sleep\", \"input\": {{\"duration_ms\": {i}}}, \"idempotency_key\": \"k{i}\"}}"))
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n\n").unwrap();
    let (code, first) = client(&base, &token, &["submit", "--batch", &batch]).await;
    assert_eq!(code, 0);
    let ids: Vec<&str> = first.lines().collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.starts_with("op_")), "{first}");
    let (code, again) = client(&base, &token, &["submit", "--batch", &batch]).await;
    assert_eq!((code, again.as_str()), (0, first.as_str()), "the same keys replay");
    assert_eq!(count_operations(&base, &token).await, 3);

    std::fs::write(&file, "{\"kind\": \"no-such-kind\"}\n").unwrap();
    let (code, out) = client(&base, &token, &["submit", "--batch", &batch]).await;
    assert_eq!(code, 4, "refusals exit 4");
    assert!(out.contains("unsupported_kind"), "{out}");
}

/// `longrun upload FILE` prints the upload id; an import naming it runs,
/// and `longrun result ID --artifact errors` downloads its row errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_then_import_then_download_the_errors_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();
    let file = dir.path().join("people.csv");
    std::fs::write(&file, "name,age\nAda,36\nAlan,forty\nGrace,85\n").unwrap();
    let (code, out) = client(&base, &token, &["upload", &file.display().to_string()]).await;
    assert_eq!(code, 0, "{out}");
    let upload = out.trim().to_owned();
    assert!(upload.starts_with("upl_"), "{out}");
    let input = serde_json::json!({
        "upload": upload, "format": "csv",
        "schema": {"fields": {"name": {"type": "string", "required": true}, "age": {"type": "integer", "min": 0}}},
    })
    .to_string();
    let (code, out) = client(
        &base,
        &token,
        &["submit", "import", "--input", &input, "--wait", "--output", "json"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let op: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(op["result"]["summary"]["rows_rejected"], 1, "{op}");
    let id = op["id"].as_str().unwrap();
    let (code, errors) = client(
        &base,
        &token,
        &["result", id, "--artifact", "errors", "--output-file", "-"],
    )
    .await;
    assert_eq!(code, 0);
    let error: Value = serde_json::from_str(errors.trim()).unwrap();
    assert_eq!(
        (error["line"].as_u64(), error["code"].as_str()),
        (Some(3), Some("invalid_type"))
    );
    let (code, _) = client(
        &base,
        &token,
        &["result", id, "--artifact", "nope", "--output-file", "-"],
    )
    .await;
    assert_ne!(code, 0, "an artifact the result does not have is an error");
}

/// `longrun rerun ID`: a linked new operation; an input no longer kept is
/// refused (exit 4) with its code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_makes_a_linked_operation_and_refusals_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();
    let failing = r#"{"duration_ms": 1, "fail_with": "flaky"}"#;
    let (code, out) = client(
        &base,
        &token,
        &["submit", "sleep", "--input", failing, "--wait", "--output", "json"],
    )
    .await;
    assert_eq!(code, 1, "a failed operation exits 1: {out}");
    let original: Value = serde_json::from_str(out.trim()).unwrap();
    let id = original["id"].as_str().unwrap();
    let (code, out) = client(&base, &token, &["rerun", id, "--wait", "--output", "json"]).await;
    assert_eq!(code, 1, "{out}");
    let rerun: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(rerun["rerun_of"], id);
    let (code, out) = client(&base, &token, &["get", id, "--output", "json"]).await;
    assert_eq!(code, 0);
    let read: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(read["reruns"], serde_json::json!([rerun["id"]]));

    let (_, out) = client(
        &base,
        &token,
        &[
            "submit",
            "sleep",
            "--input",
            r#"{"duration_ms": 1}"#,
            "--wait",
            "--output",
            "json",
        ],
    )
    .await;
    let succeeded: Value = serde_json::from_str(out.trim()).unwrap();
    let (code, out) = client(
        &base,
        &token,
        &["rerun", succeeded["id"].as_str().unwrap(), "--output", "json"],
    )
    .await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("input_not_kept"), "{out}");
}

/// `longrun pause` and `longrun resume`; after a cancel, pausing is refused
/// (exit 4) with `intent_conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_a_queued_operation() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--builtin-workers=false"]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();
    let (code, out) = client(&base, &token, &["submit", "sleep", "--input", r#"{"duration_ms": 1}"#]).await;
    assert_eq!(code, 0, "{out}");
    let id = out.trim().to_owned();
    for (command, state) in [("pause", "paused"), ("resume", "queued")] {
        let (code, out) = client(&base, &token, &[command, &id, "--output", "json"]).await;
        assert_eq!(code, 0, "{out}");
        let op: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(op["state"], state, "{out}");
    }
    let (code, _) = client(&base, &token, &["cancel", &id]).await;
    assert_eq!(code, 0);
    let (code, out) = client(&base, &token, &["pause", &id, "--output", "json"]).await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("intent_conflict"), "{out}");
}

/// Sends `batch` as one `POST /v1/operations/batch`; key → id for every
/// item answered 202, or nothing if the request got no answer.
async fn submit_batch_raw(http: &reqwest::Client, base: &str, token: &str, keys: &[String]) -> HashMap<String, String> {
    let items: Vec<Value> = keys
        .iter()
        .map(|k| json!({"idempotency_key": k, "kind": "sleep", "input": {"duration_ms": 60_000}}))
        .collect();
    let Ok(response) = http
        .post(format!("{base}/v1/operations/batch"))
        .bearer_auth(token)
        .json(&json!({"operations": items}))
        .send()
        .await
    else {
        return HashMap::new();
    };
    let Ok(answer) = response.json::<Value>().await else {
        return HashMap::new();
    };
    let results = answer["results"].as_array().cloned().unwrap_or_default();
    keys.iter()
        .zip(results)
        .filter(|(_, r)| r["status"] == 202)
        .map(|(k, r)| (k.clone(), r["operation"]["id"].as_str().unwrap().to_owned()))
        .collect()
}

/// The batch endpoint answers only after its items are durable: a SIGKILL
/// while batches are in flight loses no item of an answered batch, and
/// resending every batch after the restart creates each operation once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_batches_loses_no_accepted_item() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(dir.path(), &["--builtin-workers=false"]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let pid = server.child.id().unwrap();
    let batches: Vec<Vec<String>> = (0..40)
        .map(|b| (0..25).map(|i| format!("batch-{b}-{i}")).collect())
        .collect();

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let permits = Arc::new(tokio::sync::Semaphore::new(4));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut sends = Vec::new();
    for keys in batches.clone() {
        let (http, base, token, permits, answered) = (
            http.clone(),
            server.base.clone(),
            token.clone(),
            permits.clone(),
            answered.clone(),
        );
        sends.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.unwrap();
            let accepted = submit_batch_raw(&http, &base, &token, &keys).await;
            // SIGKILL once 10 batches are answered: others are in flight.
            if answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 10 {
                std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status()
                    .unwrap();
            }
            accepted
        }));
    }
    let mut accepted = HashMap::new();
    for send in sends {
        accepted.extend(send.await.unwrap());
    }
    assert!(!server.child.wait().await.unwrap().success(), "the server was killed");
    assert!(
        accepted.len() >= 9 * 25,
        "the batches answered before the kill: {}",
        accepted.len()
    );

    let restarted = start_server(dir.path(), &["--builtin-workers=false"]).await;
    assert_all_present(&restarted.base, &token, &accepted).await;
    let http = reqwest::Client::new();
    for keys in &batches {
        let again = submit_batch_raw(&http, &restarted.base, &token, keys).await;
        assert_eq!(again.len(), keys.len(), "every item is accepted or replayed");
        for (key, id) in again {
            if let Some(before) = accepted.get(&key) {
                assert_eq!(&id, before, "{key} replays its operation");
            }
        }
    }
    assert_eq!(
        count_operations(&restarted.base, &token).await,
        1000,
        "one operation per key"
    );
}

/// A failed command says so in one line with its cause and code — never a
/// backtrace, whatever RUST_BACKTRACE says — and exits 1; `serve --help`
/// shows server flags only, the client commands their own.
#[test]
fn failures_are_one_line_and_each_command_shows_its_own_flags() {
    let dir = tempfile::tempdir().unwrap();
    // A database that cannot be reached (port 1 refuses at once).
    let output = std::process::Command::new(BIN)
        .args(["migrate", "--database", "postgres://nobody@127.0.0.1:1/none"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_BACKTRACE", "full")
        .env("LONGRUN_LOG", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("error: the database is unavailable")
            && stderr.trim_end().ends_with("[temporarily_unavailable]"),
        "{stderr}"
    );
    assert!(!stderr.contains("backtrace") && !stderr.contains("at src/"), "{stderr}");

    let help = |command: &str| {
        let output = std::process::Command::new(BIN)
            .args([command, "--help"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let serve = help("serve");
    for client_flag in ["--token", "--output", "--server "] {
        assert!(!serve.contains(client_flag), "serve --help shows {client_flag}");
    }
    assert!(serve.contains("--listen") && serve.contains("--max-upload-bytes"));
    let submit = help("submit");
    assert!(submit.contains("--token") && submit.contains("--output") && !submit.contains("--listen"));
    assert!(help("worker").contains("--token"));
}

/// `--trusted-proxies` takes addresses and CIDR networks; anything else is
/// refused before the server starts, naming the value (a typo must not
/// leave the server trusting nobody, or everybody, silently).
#[test]
fn serve_refuses_a_trusted_proxy_that_is_no_address_or_network() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--trusted-proxies",
            "10.0.0.0/8,proxy.internal",
        ])
        .args(["--data-dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("proxy.internal"), "{stderr}");
    assert!(!dir.path().join("longrun.db").exists(), "nothing was started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_created_fired_paused_triggered_and_deleted_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]).await;
    let token = server.bootstrap_client_key.clone().unwrap();
    let base = server.base.clone();
    let (code, out) = client(
        &base,
        &token,
        &[
            "schedules",
            "create",
            "sleep",
            "--cron",
            "@every 1s",
            "--overlap",
            "allow",
            "--input",
            r#"{"duration_ms": 1}"#,
            "--label",
            "from=cli",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let id = out.trim().to_owned();
    assert!(id.starts_with("sch_"), "{out}");
    let (code, out) = client(&base, &token, &["schedules", "list"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.contains("@every 1s"), "{out}");

    // The server fires it on its own, on the wall clock: wait (bounded) for
    // a firing whose operation ran.
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let op = loop {
        let fires: Value = http
            .get(format!("{base}/v1/schedules/{id}/fires"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(op) = fires["fires"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f["operation_id"].as_str())
        {
            break op.to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "no firing: {fires}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ended = wait_until(&base, &token, &[op], |op| op["state"] == "succeeded").await;
    assert_eq!(ended[0]["schedule_id"], json!(id));
    assert_eq!(ended[0]["labels"], json!({"from": "cli"}));

    let (code, out) = client(&base, &token, &["schedules", "pause", &id, "--output", "json"]).await;
    assert_eq!(code, 0, "{out}");
    let paused: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (paused["paused"].clone(), paused["next_fire_times"].clone()),
        (json!(true), json!([]))
    );
    let (code, out) = client(&base, &token, &["schedules", "trigger", &id]).await;
    assert_eq!(code, 0, "{out}");
    let triggered = out.trim().to_owned();
    assert!(triggered.starts_with("op_"), "{out}");
    let (code, out) = client(&base, &token, &["schedules", "get", &id]).await;
    assert_eq!(code, 0);
    assert!(out.contains("triggered") && out.contains(&triggered), "{out}");
    let (code, out) = client(&base, &token, &["schedules", "resume", &id, "--output", "json"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).unwrap()["paused"],
        json!(false)
    );

    let (code, _) = client(&base, &token, &["schedules", "delete", &id]).await;
    assert_eq!(code, 0);
    let (code, out) = client(&base, &token, &["schedules", "get", &id, "--output", "json"]).await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("not_found"), "{out}");
    let (code, _) = client(
        &base,
        &token,
        &[
            "schedules",
            "create",
            "sleep",
            "--cron",
            "@every 1s",
            "--overlap",
            "often",
        ],
    )
    .await;
    assert_eq!(code, 2, "a bad flag is a usage error");
}
