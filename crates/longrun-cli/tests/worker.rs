//! `longrun worker --exec` as real processes against an in-process server
//! whose clock the test moves: scripts that succeed, fail and get cancelled,
//! and workers SIGKILLed mid-task.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::{Clock, ManualClock, SystemClock};
use longrun_server::{RunningServer, ServeOptions};
use longrun_store::{ApiKeyCreateParams, KindSpec, SqliteConfig, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_longrun");

struct Harness {
    server: Option<RunningServer>,
    base: String,
    client_key: String,
    worker_key: String,
    clock: ManualClock,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

async fn key(store: &dyn Store, role: Role) -> String {
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id,
            tenant: "acme".into(),
            role,
            secret_hash: key.secret_hash,
            now: SystemClock.now(),
        })
        .await
        .unwrap();
    key.token
}

async fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let mut options = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        SqliteConfig::new(dir.path().join("longrun.db")),
    );
    options.clock = Arc::new(clock.clone());
    options.reaper.interval = Duration::from_millis(20);
    options.http.key_cache_ttl = Duration::ZERO;
    let server = longrun_server::start(options).await.unwrap();
    let client_key = key(server.store.as_ref(), Role::Client).await;
    let worker_key = key(server.store.as_ref(), Role::Worker).await;
    Harness {
        base: format!("http://{}", server.addr),
        server: Some(server),
        client_key,
        worker_key,
        clock,
        http: reqwest::Client::new(),
        dir,
    }
}

impl Harness {
    fn store(&self) -> Arc<dyn Store> {
        self.server.as_ref().unwrap().store.clone()
    }

    async fn declare(&self, kind: &str, rerun_safe: bool) {
        self.declare_as(kind, rerun_safe, false).await;
    }

    async fn declare_as(&self, kind: &str, rerun_safe: bool, pausable: bool) {
        let spec = KindSpec {
            rerun_safe,
            pausable,
            ..KindSpec::declared(kind)
        };
        self.store().kind_upsert(spec).await.unwrap();
    }

    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&path)
            .status()
            .unwrap();
        path
    }

    /// A `longrun worker` process. Its lease is the shortest allowed (5 s), so
    /// it heartbeats — and learns of cancellation — every ~1.7 s.
    fn worker(&self, kind: &str, script: &Path, env: &[(&str, &str)]) -> Child {
        self.worker_with(kind, script, env, &[])
    }

    /// [`Self::worker`] with `extra` arguments.
    fn worker_with(&self, kind: &str, script: &Path, env: &[(&str, &str)], extra: &[&str]) -> Child {
        let mut command = Command::new(BIN);
        command
            .args(["worker", "--kind", kind, "--exec"])
            .arg(script)
            .args(["--server", &self.base, "--grace", "5s", "--lease", "5s"])
            .args(extra)
            .env("LONGRUN_TOKEN", &self.worker_key)
            .env("LONGRUN_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        command.spawn().expect("the worker starts")
    }

    async fn submit(&self, key: &str, kind: &str, input: Value) -> String {
        let response = self
            .http
            .post(format!("{}/v1/operations", self.base))
            .bearer_auth(&self.client_key)
            .header("Idempotency-Key", key)
            .json(&json!({"kind": kind, "input": input}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        response.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn get(&self, id: &str) -> Value {
        self.http
            .get(format!("{}/v1/operations/{id}", self.base))
            .bearer_auth(&self.client_key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits (bounded) for a condition on the operation.
    async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let op = self.get(id).await;
            if done(&op) {
                return op;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {op}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_script_reports_progress_and_succeeds() {
    let h = harness().await;
    h.declare("shout", false).await;
    let script = h.script(
        "shout.sh",
        r#"input=$(cat)
echo '{"progress":{"completed_units":1,"total_units":2,"unit":"steps","phase":"WORKING"}}'
echo 'a line that is not JSON is ignored'
echo '{"progress":{"completed_units":2,"total_units":2,"unit":"steps","phase":"WORKING"}}'
printf '{"result":{"input":%s,"op":"%s","attempt":%s}}\n' "$input" "$LONGRUN_OPERATION_ID" "$LONGRUN_ATTEMPT""#,
    );
    let _worker = h.worker("shout", &script, &[]);
    let id = h.submit("e1", "shout", json!({"text": "hello"})).await;
    let op = h.wait_for(&id, "success", |op| op["state"] == "succeeded").await;
    assert_eq!(
        op["result"]["value"],
        json!({"input": {"text": "hello"}, "op": id, "attempt": 1})
    );
    assert_eq!(op["progress"]["completed_units"], 2.0);
    assert_eq!(op["progress"]["phase"], "WORKING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_script_that_exits_non_zero_fails_with_worker_error() {
    let h = harness().await;
    h.declare("fragile", false).await;
    let script = h.script("fail.sh", "echo 'disk full' >&2\nexit 3");
    let _worker = h.worker("fragile", &script, &[]);
    let id = h.submit("e2", "fragile", json!({})).await;
    let op = h.wait_for(&id, "failure", |op| op["state"] == "failed").await;
    assert_eq!(op["error"]["code"], "worker_error");
    let message = op["error"]["message"].as_str().unwrap();
    assert!(message.contains("disk full") && message.contains('3'), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_exec_script_gets_sigterm_and_the_operation_ends_cancelled() {
    let h = harness().await;
    h.declare("patient", false).await;
    let marker = h.dir.path().join("terminated");
    let script = h.script(
        "wait.sh",
        r#"trap 'echo terminated > "$MARKER"; exit 143' TERM
echo '{"progress":{"completed_units":0,"total_units":1,"phase":"WAITING"}}'
while true; do sleep 0.05; done"#,
    );
    let _worker = h.worker("patient", &script, &[("MARKER", marker.to_str().unwrap())]);
    let id = h.submit("e3", "patient", json!({})).await;
    h.wait_for(&id, "the script to start", |op| op["progress"]["phase"] == "WAITING")
        .await;
    let response = h
        .http
        .put(format!("{}/v1/operations/{id}/cancellation", h.base))
        .bearer_auth(&h.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    // The worker learns of it on its next heartbeat, then signals the script.
    let op = h.wait_for(&id, "cancellation", |op| op["state"] == "cancelled").await;
    assert_eq!(op["error"], Value::Null);
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        "terminated",
        "the script got SIGTERM"
    );
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// A worker killed with `kill -9` takes its command's whole process tree
/// with it: a shell, and a grandchild it started that writes a heartbeat
/// file every 100 ms, are gone within 5 s, and the file stops growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_command_and_its_grandchildren_end_with_it() {
    let h = harness().await;
    h.declare("tree", false).await;
    let pids = h.dir.path().join("pids");
    let beats = h.dir.path().join("beats");
    let script = h.script(
        "tree.sh",
        &format!(
            r#"echo $$ >> {pids}
sh -c 'echo $$ >> {pids}; while true; do echo beat >> {beats}; sleep 0.1; done' &
echo '{{"progress":{{"phase":"STARTED"}}}}'
wait"#,
            pids = pids.display(),
            beats = beats.display()
        ),
    );
    let mut worker = h.worker("tree", &script, &[]);
    let id = h.submit("tree-1", "tree", json!({})).await;
    h.wait_for(&id, "the command to start", |op| op["progress"]["phase"] == "STARTED")
        .await;
    let started = wait_for_pids(&pids, 2).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::metadata(&beats).is_ok_and(|m| m.len() > 0) {
        assert!(tokio::time::Instant::now() < deadline, "the grandchild never beat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.iter().all(|pid| alive(*pid)));

    worker.start_kill().unwrap(); // SIGKILL: no chance to clean up
    worker.wait().await.unwrap();
    all_gone_within(&started, Duration::from_secs(5), "5 s after the worker died").await;
    // Every process that wrote the file is gone, so it has stopped growing.
    let size = std::fs::metadata(&beats).unwrap().len();
    assert!(size > 0);
    assert!(started.iter().all(|pid| !alive(*pid)));
}

/// A worker that shuts down (SIGTERM) while a command runs past its
/// `--shutdown-grace` gives the task back and takes the command's whole
/// tree with it, grandchildren too: dropping a task ends its process group,
/// not only the group's leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_shuts_down_ends_the_command_trees_it_gives_back() {
    let h = harness().await;
    h.declare("tree", true).await;
    let pids = h.dir.path().join("pids");
    let script = h.script(
        "tree.sh",
        &format!(
            r#"echo $$ >> {pids}
sh -c 'trap "" TERM; echo $$ >> {pids}; while true; do sleep 0.1; done' &
echo '{{"progress":{{"phase":"STARTED"}}}}'
trap "" TERM
wait"#,
            pids = pids.display(),
        ),
    );
    let mut worker = h.worker_with("tree", &script, &[], &["--shutdown-grace", "1s"]);
    let id = h.submit("tree-down", "tree", json!({})).await;
    h.wait_for(&id, "the command to start", |op| op["progress"]["phase"] == "STARTED")
        .await;
    let started = wait_for_pids(&pids, 2).await;

    // SIGTERM: the worker stops claiming, waits 1 s, gives the task back
    // (the command ignores SIGTERM, so it is still running then) and exits.
    std::process::Command::new("kill")
        .args(["-TERM", &worker.id().unwrap().to_string()])
        .status()
        .unwrap();
    worker.wait().await.unwrap();
    all_gone_within(&started, Duration::from_secs(5), "after the worker shut down").await;
}

/// Waits (up to `bound`) until none of `pids` runs; fails naming the
/// survivors.
async fn all_gone_within(pids: &[u32], bound: Duration, when: &str) {
    let deadline = tokio::time::Instant::now() + bound;
    while pids.iter().any(|pid| alive(*pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still alive {when}: {:?}",
            pids.iter().filter(|pid| alive(**pid)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pids the tree scripts write, once `n` of them are there.
async fn wait_for_pids(path: &Path, n: usize) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed: Vec<u32> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if listed.len() >= n {
            return listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "the tree never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_worker_is_retried_when_safe_and_outcome_unknown_otherwise() {
    let h = harness().await;
    h.declare("rerunnable", true).await;
    h.declare("once-only", false).await;
    // Attempt 1 reports that it started and then works until its worker dies
    // (the worker runs it under `sh -c`: the worker is its grandparent).
    let script = h.script(
        "work.sh",
        r#"if [ "$LONGRUN_ATTEMPT" = 1 ]; then
  echo '{"progress":{"phase":"STARTED"}}'
  worker=$(cut -d' ' -f4 "/proc/$PPID/stat")
  while kill -0 "$worker" 2>/dev/null; do sleep 0.05; done
  exit 1
fi
echo "{\"result\":{\"attempt\":$LONGRUN_ATTEMPT}}""#,
    );
    let mut first_safe = h.worker("rerunnable", &script, &[]);
    let mut first_once = h.worker("once-only", &script, &[]);
    let safe = h.submit("k1", "rerunnable", json!({})).await;
    let once = h.submit("k2", "once-only", json!({})).await;
    for id in [&safe, &once] {
        h.wait_for(id, "attempt 1 to start", |op| op["progress"]["phase"] == "STARTED")
            .await;
    }
    for worker in [&mut first_safe, &mut first_once] {
        worker.start_kill().unwrap(); // SIGKILL
        worker.wait().await.unwrap();
    }

    // Nobody renews the leases: move the server's clock past them.
    h.clock.advance(Duration::from_secs(6));
    let lost = h.wait_for(&once, "outcome_unknown", |op| op["state"] == "failed").await;
    assert_eq!(lost["error"]["code"], "outcome_unknown");
    h.wait_for(&safe, "a retry", |op| op["attempt"] == 2).await;
    h.clock.advance(Duration::from_secs(2));

    let _second = h.worker("rerunnable", &script, &[]);
    let done = h
        .wait_for(&safe, "success on attempt 2", |op| op["state"] == "succeeded")
        .await;
    assert_eq!(
        (done["attempt"].as_i64(), done["result"]["value"].clone()),
        (Some(2), json!({"attempt": 2}))
    );
    assert_eq!(
        h.get(&once).await["state"],
        "failed",
        "the unsafe kind is never run again"
    );
}

/// A checkpoint the command printed survives its worker's SIGKILL: the
/// next attempt gets it in `$LONGRUN_CHECKPOINT` and its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_exec_worker_hands_its_checkpoint_to_the_next_attempt() {
    let h = harness().await;
    h.declare("resumable", true).await;
    let script = h.script(
        "resume.sh",
        r#"if [ -z "$LONGRUN_CHECKPOINT" ]; then
  test -e "$LONGRUN_CHECKPOINT_FILE" && exit 3
  echo '{"checkpoint":{"rows_done":3}}'
  echo '{"progress":{"phase":"STARTED"}}'
  worker=$(cut -d' ' -f4 "/proc/$PPID/stat")
  while kill -0 "$worker" 2>/dev/null; do sleep 0.05; done
  exit 1
fi
echo "{\"result\":{\"env\":$LONGRUN_CHECKPOINT,\"file\":$(cat "$LONGRUN_CHECKPOINT_FILE"),\"attempt\":$LONGRUN_ATTEMPT}}""#,
    );
    let mut first = h.worker("resumable", &script, &[]);
    let id = h.submit("c1", "resumable", json!({})).await;
    // The checkpoint line is saved before the progress line is read.
    h.wait_for(&id, "attempt 1 to checkpoint", |op| {
        op["progress"]["phase"] == "STARTED"
    })
    .await;
    first.start_kill().unwrap(); // SIGKILL
    first.wait().await.unwrap();
    h.clock.advance(Duration::from_secs(6));
    h.wait_for(&id, "a retry", |op| op["attempt"] == 2).await;
    h.clock.advance(Duration::from_secs(2));
    let _second = h.worker("resumable", &script, &[]);
    let done = h.wait_for(&id, "success", |op| op["state"] == "succeeded").await;
    assert_eq!(
        done["result"]["value"],
        json!({"env": {"rows_done": 3}, "file": {"rows_done": 3}, "attempt": 2})
    );
}

/// A pause of a kind declared `--pausable` reaches an exec command as
/// SIGTERM; the checkpoint it writes to its file is where a resume starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_exec_command_resumes_from_the_checkpoint_it_wrote() {
    let h = harness().await;
    h.declare_as("pausable-script", true, true).await;
    let script = h.script(
        "pausable.sh",
        r#"if [ -n "$LONGRUN_CHECKPOINT" ]; then
  echo "{\"result\":{\"resumed_from\":$LONGRUN_CHECKPOINT,\"attempt\":$LONGRUN_ATTEMPT}}"
  exit 0
fi
trap 'echo '"'"'{"stopped_at":7}'"'"' > "$LONGRUN_CHECKPOINT_FILE"; exit 143' TERM
echo '{"progress":{"phase":"WORKING"}}'
while true; do sleep 0.05; done"#,
    );
    let _worker = h.worker("pausable-script", &script, &[]);
    let id = h.submit("p1", "pausable-script", json!({})).await;
    let running = h
        .wait_for(&id, "the command to start", |op| op["progress"]["phase"] == "WORKING")
        .await;
    let patch = |version: i64, desired: &'static str| {
        h.http
            .patch(format!("{}/v1/operations/{id}", h.base))
            .bearer_auth(&h.client_key)
            .header("if-match", format!("\"{version}\""))
            .json(&json!({"desired_state": desired}))
            .send()
    };
    let asked = patch(running["version"].as_i64().unwrap(), "paused").await.unwrap();
    assert_eq!(
        asked.status(),
        StatusCode::ACCEPTED,
        "asked of the worker, not done yet"
    );
    let asked: Value = asked.json().await.unwrap();
    assert_eq!(
        (asked["state"].as_str(), asked["desired_state"].as_str()),
        (Some("running"), Some("paused"))
    );
    let paused = h.wait_for(&id, "the pause", |op| op["state"] == "paused").await;
    assert_eq!(paused["attempt"], 1);
    let resumed = patch(paused["version"].as_i64().unwrap(), "running").await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let done = h.wait_for(&id, "success", |op| op["state"] == "succeeded").await;
    assert_eq!(
        done["result"]["value"],
        json!({"resumed_from": {"stopped_at": 7}, "attempt": 1}),
        "a pause is not an attempt"
    );
}

/// The uploads an input names are files in `$LONGRUN_UPLOADS_DIR` for the
/// command, fetched over the worker protocol with its lease, and gone after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_script_reads_the_uploads_its_input_names() {
    let h = harness().await;
    h.declare("count-lines", false).await;
    let upload: Value = h
        .http
        .post(format!("{}/v1/uploads", h.base))
        .bearer_auth(&h.client_key)
        .header("content-type", "text/csv")
        .body("a\nb\nc\n")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let upload_id = upload["id"].as_str().unwrap().to_owned();
    let script = h.script(
        "count.sh",
        r#"file="$LONGRUN_UPLOADS_DIR/$(cat | sed 's/.*"\(upl_[a-z0-9]*\)".*/\1/')"
printf '{"result":{"lines":%s,"dir":"%s"}}\n' "$(wc -l < "$file")" "$LONGRUN_UPLOADS_DIR""#,
    );
    let _worker = h.worker("count-lines", &script, &[]);
    let id = h.submit("count-1", "count-lines", json!({"file": upload_id})).await;
    let done = h.wait_for(&id, "the count", |op| op["state"] == "succeeded").await;
    assert_eq!(done["result"]["value"]["lines"], 3, "{done}");
    let dir = done["result"]["value"]["dir"].as_str().unwrap();
    assert!(
        !std::path::Path::new(dir).exists(),
        "the uploads' directory is removed after the task"
    );
}
