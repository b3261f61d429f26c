//! The multi-node drill: three `longrun serve` processes on one PostgreSQL
//! database (a throwaway cluster from the machine's initdb/pg_ctl), clients
//! and remote workers spread over all of them, one node SIGKILLed mid-run and
//! restarted. Every accepted operation ends exactly once; none is lost; the
//! same key sent to different nodes at once creates one operation.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use longrun_store::Tables as _;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_longrun");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn serve(url: &str, port: u16, node: &str) -> Child {
    serve_with(url, port, node, &[]).await
}

async fn serve_with(url: &str, port: u16, node: &str, extra: &[&str]) -> Child {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--builtin-workers=false",
            "--node-id",
            node,
        ])
        .args(["--database", url])
        .args(extra)
        .env("LONGRUN_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("longrun listening on") {
                return;
            }
        }
        panic!("node {node} exited before listening");
    })
    .await
    .expect("the node listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

fn cli(url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .args(args)
        .args(["--database", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `N` nodes on `url` (named `{prefix}0`…), with `extra` arguments:
/// their ports, base URLs and processes.
async fn nodes<const N: usize>(url: &str, prefix: &str, extra: &[&str]) -> ([u16; N], Vec<String>, Vec<Child>) {
    let ports: [u16; N] = std::array::from_fn(|_| free_port());
    let nodes = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut servers = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        servers.push(serve_with(url, *port, &format!("{prefix}{i}"), extra).await);
    }
    (ports, nodes, servers)
}

/// Submits with one key, trying the nodes in turn until one answers.
async fn submit(http: &reqwest::Client, nodes: &[String], first: usize, token: &str, key: &str) -> String {
    for attempt in 0..60 {
        let base = &nodes[(first + attempt) % nodes.len()];
        let sent = http
            .post(format!("{base}/v1/operations"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&json!({"kind": "drill", "input": {"key": key}}))
            .send()
            .await;
        if let Ok(response) = sent
            && response.status().is_success()
        {
            return response.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no node accepted {key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_one_killed_every_operation_ends_exactly_once() {
    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    cli(&url, &["migrate"]);
    let client = cli(&url, &["keys", "create", "--tenant", "drill", "--role", "client"]);
    let worker = cli(&url, &["keys", "create", "--tenant", "drill", "--role", "worker"]);
    cli(&url, &["kinds", "set", "drill", "--rerun-safe", "--max-attempts", "5"]);

    let (ports, nodes, mut servers) = nodes::<3>(&url, "n", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("work.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\nsleep 0.2\necho '{\"result\": \"done\"}'\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let mut workers = Vec::new();
    for node in &nodes {
        workers.push(
            Command::new(BIN)
                .args(["worker", "--kind", "drill", "--exec"])
                .arg(&script)
                .args([
                    "--server",
                    node,
                    "--token",
                    &worker,
                    "--concurrency",
                    "4",
                    "--lease",
                    "5s",
                ])
                .env("LONGRUN_LOG", "error")
                .kill_on_drop(true)
                .spawn()
                .unwrap(),
        );
    }

    let http = http_client();
    // The same key sent to all three nodes at once: one operation.
    let mut same = Vec::new();
    for k in 0..20 {
        let mut racers = Vec::new();
        for n in 0..3 {
            let (http, nodes, client) = (http.clone(), nodes.clone(), client.clone());
            racers.push(tokio::spawn(async move {
                submit(&http, &nodes, n, &client, &format!("race-{k}")).await
            }));
        }
        let mut ids = HashSet::new();
        for r in racers {
            ids.insert(r.await.unwrap());
        }
        assert_eq!(ids.len(), 1, "race-{k} created {ids:?}");
        same.push(ids.into_iter().next().unwrap());
    }

    // 150 submissions spread over the nodes; node 1 is killed after 50 and restarted after 100.
    let mut ids: Vec<String> = same.clone();
    for i in 0..150 {
        if i == 50 {
            servers[1].start_kill().unwrap();
            servers[1].wait().await.unwrap();
        }
        if i == 100 {
            servers[1] = serve(&url, ports[1], "n1").await;
        }
        ids.push(submit(&http, &nodes, i % 3, &client, &format!("op-{i}")).await);
    }
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), 170, "one operation per key");

    // Every operation ends, whichever node is asked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    for (i, id) in ids.iter().enumerate() {
        loop {
            let op: Value = http
                .get(format!("{}/v1/operations/{id}", nodes[i % 3]))
                .bearer_auth(&client)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if op["terminal"] == true {
                assert_eq!(op["state"], "succeeded", "{op}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "not finished: {op}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let history: Value = http
            .get(format!("{}/v1/operations/{id}/history", nodes[(i + 1) % 3]))
            .bearer_auth(&client)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ends = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "succeeded")
            .count();
        assert_eq!(ends, 1, "{id} ended exactly once: {history}");
    }
    let listed: Value = http
        .get(format!("{}/v1/operations?page_size=100&state=succeeded", nodes[0]))
        .bearer_auth(&client)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["operations"].as_array().unwrap().len(), 100);
    let health = http.get(format!("{}/readyz", nodes[1])).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK, "the restarted node is ready");
    drop(workers);
}

/// The value of the unlabelled series `name` in `/metrics` text (0 if absent).
async fn metric(http: &reqwest::Client, node: &str, admin: &str, name: &str) -> f64 {
    metric_with(http, node, admin, name, &[]).await
}

/// The sum of metric `name`'s series on `node` whose labels include `labels`.
async fn metric_with(http: &reqwest::Client, node: &str, admin: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = http
        .get(format!("{node}/metrics"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A client, a worker and an admin key of `tenant` on `url`.
fn keys(url: &str, tenant: &str) -> [String; 3] {
    ["client", "worker", "admin"].map(|role| cli(url, &["keys", "create", "--tenant", tenant, "--role", role]))
}

/// An idle worker waiting in a claim is handed a submission in the
/// submission's own commit: the claim answers with it, the submitter is
/// told it was accepted (version 1), and the operation's history is what a
/// claim would have written. A replay is not handed off, and a claim
/// waiting then still gets the next new work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_is_handed_a_new_submission_in_its_commit() {
    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    cli(&url, &["migrate"]);
    let [client, worker, admin] = keys(&url, "hand");
    cli(&url, &["kinds", "set", "quick", "--rerun-safe"]);
    let port = free_port();
    let node = format!("http://127.0.0.1:{port}");
    let _server = serve(&url, port, "h0").await;
    let http = http_client();
    let waiting_claim = || {
        let (http, node, worker) = (http.clone(), node.clone(), worker.clone());
        tokio::spawn(async move {
            http.post(format!("{node}/v1/worker/claims"))
                .bearer_auth(&worker)
                .json(&json!({"kinds": ["quick"], "max_tasks": 2, "wait_seconds": 30, "worker_id": "idle"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    // Waits (bounded) until `n` claims wait on the node.
    let claims_waiting = async |n: f64| {
        for _ in 0..500 {
            if metric(&http, &node, &admin, "longrun_claims_waiting").await == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} claims never waited");
    };
    let submit = async |key: &str| {
        http.post(format!("{node}/v1/operations"))
            .bearer_auth(&client)
            .header("Idempotency-Key", key)
            .json(&json!({"kind": "quick", "input": {"n": 1}}))
            .send()
            .await
            .unwrap()
    };

    let claim = waiting_claim();
    claims_waiting(1.0).await;
    let accepted = submit("k1").await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let accepted: Value = accepted.json().await.unwrap();
    assert_eq!(
        (accepted["state"].as_str(), accepted["version"].as_i64()),
        (Some("queued"), Some(1))
    );
    let id = accepted["id"].as_str().unwrap().to_owned();
    let answered = claim.await.unwrap();
    let tasks = answered["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{answered}");
    let task = &tasks[0];
    assert_eq!(
        (task["operation_id"].as_str(), task["attempt"].as_i64()),
        (Some(id.as_str()), Some(1))
    );
    assert_eq!(task["input"], json!({"n": 1}));
    assert_eq!(metric(&http, &node, &admin, "longrun_claims_handed_total").await, 1.0);
    let get = async |path: &str| -> Value {
        let response = http.get(format!("{node}{path}")).bearer_auth(&client).send().await;
        response.unwrap().json().await.unwrap()
    };
    let history = get(&format!("/v1/operations/{id}/history")).await;
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["created", "started"], "{history}");

    // Its lease fences as a claimed one's: the completion applies.
    let done = http
        .post(format!("{node}/v1/worker/tasks/{id}/complete"))
        .bearer_auth(&worker)
        .json(&json!({"lease_token": task["lease_token"], "result": {"ok": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);

    // A replay writes nothing and hands nothing over; the claim waiting
    // then still gets the next new work (a submitter that took it and
    // wrote nothing lets it look again, so this one may come handed or
    // claimed, whichever meets it first).
    let claim = waiting_claim();
    claims_waiting(1.0).await;
    let replayed = submit("k1").await;
    assert!(replayed.status().is_success());
    assert_eq!(replayed.json::<Value>().await.unwrap()["id"], id.as_str());
    let second: Value = submit("k2").await.json().await.unwrap();
    let answered = claim.await.unwrap();
    assert_eq!(answered["tasks"][0]["operation_id"], second["id"]);
    assert_eq!(get(&format!("/v1/operations/{id}")).await["state"], "succeeded");
}

/// A tenant at its `max_running`: its running task, completed through node
/// A, frees the place a claim waiting on node B waits for, and B hears it
/// from the change feed (A's commit's NOTIFY). B's claims look again
/// unwoken once an hour here: the claim is answered with the tenant's next
/// task by a look after a wake-up (a last look as its wait ends would find
/// it too, so that is what is asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_tenants_place_freed_through_one_node_wakes_a_claim_on_another() {
    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    cli(&url, &["migrate"]);
    let [client, worker, admin] = keys(&url, "capped");
    cli(&url, &["kinds", "set", "quick", "--rerun-safe"]);
    cli(&url, &["tenants", "set", "capped", "--max-running", "1"]);
    let (_ports, nodes, _servers) = nodes::<2>(&url, "cap", &["--claim-poll", "1h"]).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let http = http_client();
    let mut ids = Vec::new();
    for key in ["c1", "c2"] {
        let accepted = http
            .post(format!("{a}/v1/operations"))
            .bearer_auth(&client)
            .header("Idempotency-Key", key)
            .json(&json!({"kind": "quick", "input": {"n": key}}))
            .send()
            .await
            .unwrap();
        assert_eq!(accepted.status(), StatusCode::ACCEPTED);
        ids.push(
            accepted.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let claim = |node: &str, wait: u64| {
        let (http, node, worker) = (http.clone(), node.to_owned(), worker.clone());
        tokio::spawn(async move {
            http.post(format!("{node}/v1/worker/claims"))
                .bearer_auth(&worker)
                .json(&json!({"kinds": ["quick"], "max_tasks": 5, "wait_seconds": wait}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let running = claim(a, 0).await.unwrap();
    assert_eq!(running["tasks"].as_array().unwrap().len(), 1, "{running}");
    assert_eq!(running["tasks"][0]["operation_id"], ids[0].as_str());

    let waiting = claim(b, 30);
    for _ in 0..500 {
        if metric(&http, b, &admin, "longrun_claims_waiting").await == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metric(&http, b, &admin, "longrun_claims_waiting").await,
        1.0,
        "B's claim never waited"
    );
    let done = http
        .post(format!("{a}/v1/worker/tasks/{}/complete", ids[0]))
        .bearer_auth(&worker)
        .json(&json!({"lease_token": running["tasks"][0]["lease_token"], "result": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let answered = waiting.await.unwrap();
    let tasks = answered["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{answered}");
    assert_eq!(tasks[0]["operation_id"], ids[1].as_str());
    let found_after_wake = metric_with(
        &http,
        b,
        &admin,
        "longrun_claim_rounds_total",
        &[("after", "wake"), ("found", "tasks")],
    )
    .await;
    assert_eq!(found_after_wake, 1.0);
}

/// A resumable upload appended through node A, its connection cut mid-body,
/// resumed through node B (as behind a balancer): B's `HEAD` waits for A's
/// append in flight — A holds the right to append in the database — and
/// answers the offset that includes the bytes A kept; B's `PATCH` from
/// there completes the upload with the whole file's SHA-256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_on_one_node_resumes_through_another() {
    use sha2::Digest;
    use tokio::io::AsyncWriteExt;

    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    cli(&url, &["migrate"]);
    let client = cli(&url, &["keys", "create", "--tenant", "up", "--role", "client"]);
    let shared = tempfile::tempdir().unwrap();
    let data_dir = shared.path().display().to_string();
    let (ports, nodes, servers) = nodes::<3>(&url, "u", &["--data-dir", &data_dir]).await;
    let http = http_client();
    let created = http
        .post(format!("{}/v1/uploads", nodes[0]))
        .bearer_auth(&client)
        .header("Upload-Complete", "?0")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Node A: a PATCH whose body stops half-way, its connection held open.
    let file: Vec<u8> = (0..64 * 1024u32).flat_map(|i| i.to_le_bytes()).collect();
    let half = file.len() / 2;
    let mut a = tokio::net::TcpStream::connect(("127.0.0.1", ports[0])).await.unwrap();
    let head = format!(
        "PATCH /v1/uploads/{id} HTTP/1.1\r\nHost: longrun\r\nAuthorization: Bearer {client}\r\n\
         Upload-Offset: 0\r\nUpload-Complete: ?1\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\n\r\n",
        file.len()
    );
    a.write_all(head.as_bytes()).await.unwrap();
    a.write_all(&file[..half]).await.unwrap();
    a.flush().await.unwrap();
    // Node A holds the right to append (seen in the database itself).
    let store = longrun_store::postgres::PostgresStore::open(longrun_store::postgres::PostgresConfig::new(url.clone()))
        .await
        .unwrap();
    let upload_id = longrun_core::Id::parse(longrun_core::IdKind::Upload, &id).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store
        .upload_appending("up", &upload_id, longrun_core::Clock::now(&longrun_core::SystemClock))
        .await
        .unwrap()
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "node A never began its append");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Node B's HEAD, sent while A appends, then A's connection cut.
    let head_b = {
        let (http, url, client) = (http.clone(), format!("{}/v1/uploads/{id}", nodes[1]), client.clone());
        tokio::spawn(async move { http.head(url).bearer_auth(client).send().await.unwrap() })
    };
    drop(a);
    let offset = head_b.await.unwrap();
    assert_eq!(offset.status(), StatusCode::NO_CONTENT);
    let kept: usize = offset.headers()["upload-offset"].to_str().unwrap().parse().unwrap();
    assert!(kept > 0, "the offset includes what node A kept");
    assert_eq!(offset.headers()["upload-complete"], "?0");

    // The rest through node B completes it, byte for byte.
    let done = http
        .patch(format!("{}/v1/uploads/{id}", nodes[1]))
        .bearer_auth(&client)
        .header("Upload-Offset", kept.to_string())
        .header("Upload-Complete", "?1")
        .body(file[kept..].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK, "{}", done.text().await.unwrap());
    let body: Value = done.json().await.unwrap();
    let expected = data_encoding::HEXLOWER.encode(&sha2::Sha256::digest(&file));
    assert_eq!(
        (body["complete"].as_bool(), body["sha256"].as_str()),
        (Some(true), Some(expected.as_str()))
    );
    // Node C answers the same.
    let seen: Value = http
        .get(format!("{}/v1/uploads/{id}", nodes[2]))
        .bearer_auth(&client)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["size_bytes"].as_u64(), Some(file.len() as u64));
    drop(servers);
}

/// The tests' HTTP client: pooled connections kept as long as Longrun's
/// own clients keep them (less than the server keeps an idle one open),
/// and no request longer than a claim's longest wait and then some.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_idle_timeout(longrun_api::CLIENT_POOL_IDLE)
        .build()
        .unwrap()
}

/// `GET url` with `token`: the JSON body.
async fn get_json(http: &reqwest::Client, url: &str, token: &str) -> Value {
    http.get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Reads a schedule's firing records and the operations it made (by label).
async fn firings(http: &reqwest::Client, node: &str, token: &str, id: &str) -> (Vec<Value>, HashSet<String>) {
    let fires = get_json(http, &format!("{node}/v1/schedules/{id}/fires?limit=100"), token).await;
    let listed = get_json(
        http,
        &format!("{node}/v1/operations?label=from:{id}&page_size=100"),
        token,
    )
    .await;
    let ops = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["id"].as_str().unwrap().to_owned())
        .collect();
    (fires["fires"].as_array().unwrap().clone(), ops)
}

/// Three nodes fire one `@every 1s` schedule on the wall clock; one node is
/// SIGKILLed mid-run and restarted. Every firing time from the first to the
/// last has exactly one record and one operation: none lost, none twice,
/// with no leader among the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_fire_each_second_once_through_a_kill() {
    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    cli(&url, &["migrate"]);
    let client = cli(&url, &["keys", "create", "--tenant", "drill", "--role", "client"]);
    cli(&url, &["kinds", "set", "drill", "--rerun-safe", "--max-attempts", "5"]);
    let (ports, nodes, mut servers) = nodes::<3>(&url, "s", &[]).await;
    let http = http_client();
    let created: Value = http
        .post(format!("{}/v1/schedules", nodes[0]))
        .bearer_auth(&client)
        .json(&json!({"kind": "drill", "cron": "@every 1s", "overlap": "allow", "catchup_window": 60}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    // Label the firings so that they can be listed: a PATCH like any other.
    let labelled = http
        .patch(format!("{}/v1/schedules/{id}", nodes[1]))
        .bearer_auth(&client)
        .header("If-Match", format!("\"{}\"", created["version"]))
        .json(&json!({"labels": {"from": id}}))
        .send()
        .await
        .unwrap();
    assert_eq!(labelled.status(), StatusCode::OK);

    // Wait (bounded) for firings, kill node 1 after 3, restart it after 6,
    // and stop once 10 have been recorded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut killed = false;
    let mut restarted = false;
    loop {
        let (fires, _) = firings(&http, &nodes[2], &client, &id).await;
        if fires.len() >= 3 && !killed {
            servers[1].start_kill().unwrap();
            servers[1].wait().await.unwrap();
            killed = true;
        }
        if fires.len() >= 6 && !restarted {
            servers[1] = serve(&url, ports[1], "s1").await;
            restarted = true;
        }
        if fires.len() >= 10 && restarted {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "too few firings: {fires:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let current = get_json(&http, &format!("{}/v1/schedules/{id}", nodes[0]), &client).await;
    // Pause it (retrying if a firing moves the version first).
    let mut version = current["version"].as_i64().unwrap();
    loop {
        let paused = http
            .patch(format!("{}/v1/schedules/{id}", nodes[0]))
            .bearer_auth(&client)
            .header("If-Match", format!("\"{version}\""))
            .json(&json!({"paused": true}))
            .send()
            .await
            .unwrap();
        if paused.status() == StatusCode::OK {
            break;
        }
        assert_eq!(paused.status(), StatusCode::PRECONDITION_FAILED);
        let again = get_json(&http, &format!("{}/v1/schedules/{id}", nodes[0]), &client).await;
        version = again["version"].as_i64().unwrap();
    }
    // Rounds that began before the pause settle: wait until records and
    // operations agree, then check them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (fires, ops) = loop {
        let (fires, ops) = firings(&http, &nodes[0], &client, &id).await;
        let named: HashSet<String> = fires
            .iter()
            .filter_map(|f| f["operation_id"].as_str().map(str::to_owned))
            .collect();
        if named == ops {
            break (fires, ops);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "records {named:?} and operations {ops:?} disagree"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut times: Vec<i64> = fires
        .iter()
        .map(|f| {
            assert_eq!(f["decision"], "started", "{f}");
            longrun_core::Timestamp::parse_rfc3339(f["fire_time"].as_str().unwrap())
                .unwrap()
                .as_millis()
                / 1000
        })
        .collect();
    times.sort_unstable();
    assert_eq!(ops.len(), times.len(), "one operation per firing time");
    let expected: Vec<i64> = (times[0]..=*times.last().unwrap()).collect();
    assert_eq!(times, expected, "every second from the first to the last, once");
    assert!(times.len() >= 10);
}
