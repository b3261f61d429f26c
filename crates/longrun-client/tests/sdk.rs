//! The SDK against a real server over loopback, through proxies that lose
//! answers: safe retries, paced waiting, resumable verified downloads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use longrun_client::{Client, ListFilter, RetryPolicy, Submission};
use longrun_server::{RunningServer, ServeOptions};
use longrun_store::{ListParams, SqliteConfig};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn server(require_key: bool, builtin_workers: bool) -> (RunningServer, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        SqliteConfig::new(dir.path().join("longrun.db")),
    );
    options.builtin_workers = builtin_workers;
    options.http.require_idempotency_key = require_key;
    options.dispatcher.shutdown_grace = Duration::from_millis(100);
    let server = longrun_server::start(options).await.unwrap();
    let token = server.bootstrap.clone().unwrap().client;
    (server, token, dir)
}

async fn count(server: &RunningServer) -> usize {
    let mut n = 0;
    let mut before = None;
    loop {
        let page = server
            .store
            .operation_list(ListParams {
                tenant: Some("default".into()),
                page_size: 100,
                before_seq: before,
                ..Default::default()
            })
            .await
            .unwrap();
        n += page.operations.len();
        match page.next_before_seq {
            Some(b) => before = Some(b),
            None => return n,
        }
    }
}

/// A proxy giving each connection to `upstream`; `cut(seq, relayed)` decides,
/// as the answer flows back, whether to cut the connection now.
async fn proxy(
    upstream: SocketAddr,
    cut: Arc<dyn Fn(usize, usize) -> bool + Send + Sync>,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cuts = Arc::new(AtomicUsize::new(0));
    let c = cuts.clone();
    tokio::spawn(async move {
        let mut seq = 0;
        while let Ok((client, _)) = listener.accept().await {
            let (cut, cuts, this) = (cut.clone(), c.clone(), seq);
            seq += 1;
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
                let mut buffer = vec![0u8; 64 * 1024];
                let mut relayed = 0;
                loop {
                    let Ok(n) = server_read.read(&mut buffer).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    if cut(this, relayed + n) {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        return; // drop both halves: the client sees the connection die
                    }
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                    relayed += n;
                }
            });
        }
    });
    (format!("http://{addr}"), cuts)
}

/// One request per connection, so the proxy decides per request.
fn unpooled() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_5_percent_of_answers_lost_the_sdk_creates_each_operation_once_and_raw_http_does_not() {
    let submissions = 1000;
    let drop_one_in_20: Arc<dyn Fn(usize, usize) -> bool + Send + Sync> = Arc::new(|seq, _| seq % 20 == 7);

    // The SDK: one key per logical submission, reused on retry.
    let (sdk_server, token, _dir) = server(true, false).await;
    let (url, sdk_cuts) = proxy(sdk_server.addr, drop_one_in_20.clone()).await;
    let client = Client::with_http(unpooled(), url, token).with_retry(RetryPolicy {
        base_delay: Duration::from_millis(5),
        ..RetryPolicy::default()
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for i in 0..submissions {
        let (client, permits) = (client.clone(), permits.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            client
                .submit(&Submission::new("sleep", json!({"duration_ms": i})))
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sdk_created = count(&sdk_server).await;

    // Raw HTTP without a key, retrying once when the answer is lost.
    let (raw_server, token, _dir2) = server(false, false).await;
    let (url, raw_cuts) = proxy(raw_server.addr, drop_one_in_20).await;
    let http = unpooled();
    let mut tasks = Vec::new();
    for i in 0..submissions {
        let (http, url, token, permits) = (http.clone(), url.clone(), token.clone(), permits.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let send = || {
                http.post(format!("{url}/v1/operations"))
                    .bearer_auth(&token)
                    .json(&json!({"kind": "sleep", "input": {"duration_ms": i}}))
                    .send()
            };
            // A naive client: send again until an answer arrives.
            while send().await.is_err() {}
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let raw_created = count(&raw_server).await;
    println!(
        "{submissions} logical submissions with answers lost on 1 in 20 connections: SDK created {sdk_created} operations \
         ({} answers lost); raw HTTP without a key created {raw_created} ({} answers lost)",
        sdk_cuts.load(Ordering::SeqCst),
        raw_cuts.load(Ordering::SeqCst)
    );
    assert!(sdk_cuts.load(Ordering::SeqCst) >= 40, "the proxy did lose answers");
    assert_eq!(sdk_created, submissions, "the SDK creates each operation exactly once");
    assert!(raw_created > submissions, "without a key, retries create duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_takes_far_fewer_requests_than_fixed_polling() {
    let (server, token, _dir) = server(true, true).await;
    let base = format!("http://{}", server.addr);
    let body = json!({"duration_ms": 1500, "steps": 1});
    let waiter = Client::new(base.clone(), token.clone());
    let poller = Client::new(base, token);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (waiter, poller, body) = (waiter.clone(), poller.clone(), body.clone());
        // The same operations observed both ways, side by side.
        let waiting = {
            let (waiter, body) = (waiter.clone(), body.clone());
            tokio::spawn(async move {
                let id = waiter
                    .submit(&Submission::new("sleep", body))
                    .await
                    .unwrap()
                    .operation
                    .id;
                assert_eq!(waiter.wait(&id, |_| {}).await.unwrap().state, "succeeded");
            })
        };
        let polling = tokio::spawn(async move {
            let id = poller
                .submit(&Submission::new("sleep", body))
                .await
                .unwrap()
                .operation
                .id;
            while !poller.get(&id).await.unwrap().terminal {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        tasks.push(waiting);
        tasks.push(polling);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (waited, polled) = (waiter.requests_sent(), poller.requests_sent());
    println!(
        "10 operations of 1.5 s: wait() sent {waited} requests, polling every 100 ms sent {polled} (both with 10 submits)"
    );
    assert!(waited * 3 < polled, "wait {waited} vs polling {polled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_broken_midway_resumes_with_range_and_is_verified() {
    let (server, token, _dir) = server(true, true).await;
    // Cut the first large answer after 1 MiB.
    let cut_once = Arc::new(AtomicBool::new(false));
    let cutter = cut_once.clone();
    let (url, cuts) = proxy(
        server.addr,
        Arc::new(move |_, relayed| relayed > 1024 * 1024 && !cutter.swap(true, Ordering::SeqCst)),
    )
    .await;
    let client = Client::with_http(unpooled(), url, token);
    let submitted = client
        .submit(&Submission::new("export", json!({"rows": 100_000})))
        .await
        .unwrap();
    let done = client.wait(&submitted.operation.id, |_| {}).await.unwrap();
    assert_eq!(done.state, "succeeded");
    let mut bytes = Vec::new();
    let downloaded = client.download_result(&done.id, &mut bytes, |_, _| {}).await.unwrap();
    assert_eq!(cuts.load(Ordering::SeqCst), 1);
    assert!(downloaded.resumed >= 1, "the broken download was resumed");
    assert_eq!(downloaded.bytes as usize, bytes.len());
    assert_eq!(
        Some(downloaded.sha256.as_str()),
        done.result.as_ref().and_then(|r| r["artifact"]["sha256"].as_str())
    );
    assert_eq!(String::from_utf8_lossy(&bytes).matches("\r\n").count(), 100_001);

    let all = client
        .list(ListFilter {
            page_size: Some(1),
            ..ListFilter::default()
        })
        .collect_all()
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    let refused = client.get("op_aaaaaaaaaaaaaaaaaaaaaaaaaa").await.unwrap_err();
    assert_eq!(refused.code(), Some("not_found"), "errors are typed by code");
}

/// A batch whose answer is lost is sent again with the same keys: the
/// retry replays what the first attempt accepted and creates nothing twice;
/// an item the server refuses is an error of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_submitted_twice_creates_each_operation_once() {
    let (server, token, _dir) = server(true, false).await;
    let client = Client::new(format!("http://{}", server.addr), token);
    let mut submissions: Vec<Submission> = (0..20)
        .map(|i| Submission::new("sleep", json!({"duration_ms": i})))
        .collect();
    submissions.push(Submission::new("no-such-kind", json!({})));
    let first = client.submit_batch(&submissions).await.unwrap();
    assert_eq!(first.len(), 21);
    assert_eq!(first[20].as_ref().unwrap_err().code(), Some("unsupported_kind"));
    // Retry as a client would after losing the answer: the same keys.
    for (s, answer) in submissions.iter_mut().zip(&first) {
        if let Ok(done) = answer {
            s.idempotency_key = Some(done.idempotency_key.clone());
        }
    }
    let again = client.submit_batch(&submissions).await.unwrap();
    for (a, b) in first.iter().zip(&again).take(20) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert!(!a.replayed && b.replayed);
        assert_eq!(a.operation.id, b.operation.id);
    }
    assert_eq!(count(&server).await, 20);
}

/// A proxy that, once, cuts the first connection whose request bytes pass
/// `cut_after` (an upload's body broken midway); answers flow unchanged.
async fn request_cutting_proxy(upstream: SocketAddr, cut_after: usize) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cuts = Arc::new(AtomicUsize::new(0));
    let c = cuts.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let cuts = c.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let answers = tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
                let mut buffer = vec![0u8; 64 * 1024];
                let mut relayed = 0;
                while let Ok(n) = client_read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    if relayed + n > cut_after
                        && cuts.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                    {
                        // Half of this read goes through, then both ways die.
                        let _ = server_write.write_all(&buffer[..n / 2]).await;
                        answers.abort();
                        return;
                    }
                    if server_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                    relayed += n;
                }
                let _ = answers.await;
            });
        }
    });
    (format!("http://{addr}"), cuts)
}

/// `upload_file` resumes a body cut midway from the offset the server kept,
/// and the import it feeds reads the whole file: its errors artifact, read
/// with `download_artifact`, points at the right rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_midway_resumes_and_feeds_an_import() {
    let (server, token, dir) = server(true, true).await;
    let mut csv = String::from("id,email\n");
    for i in 1..=300_000 {
        if i % 50_000 == 0 {
            csv.push_str(&format!("{i},broken\n"));
        } else {
            csv.push_str(&format!("{i},user{i}@example.com\n"));
        }
    }
    let path = dir.path().join("customers.csv");
    std::fs::write(&path, &csv).unwrap();
    let (url, cuts) = request_cutting_proxy(server.addr, 2 * 1024 * 1024).await;
    let client = Client::with_http(unpooled(), url, token);
    let progress = Arc::new(AtomicUsize::new(0));
    let seen = progress.clone();
    let uploaded = client
        .upload_file(&path, "text/csv", move |sent, _| {
            seen.store(sent as usize, Ordering::SeqCst)
        })
        .await
        .unwrap();
    assert_eq!(cuts.load(Ordering::SeqCst), 1, "the upload was cut once");
    assert!(uploaded.resumed >= 1, "and resumed");
    assert!(uploaded.upload.complete);
    assert_eq!(uploaded.upload.size_bytes as usize, csv.len());
    assert_eq!(progress.load(Ordering::SeqCst), csv.len(), "progress reached the end");
    use sha2::Digest;
    assert_eq!(
        uploaded.upload.sha256.as_deref(),
        Some(
            data_encoding::HEXLOWER
                .encode(&sha2::Sha256::digest(csv.as_bytes()))
                .as_str()
        )
    );

    let input = json!({
        "upload": uploaded.upload.id,
        "format": "csv",
        "schema": {"fields": {
            "id": {"type": "integer", "required": true},
            "email": {"type": "string", "required": true, "pattern": "@"},
        }},
        "max_error_rate": 0.01,
    });
    let submitted = client.submit(&Submission::new("import", input)).await.unwrap();
    let done = client.wait(&submitted.operation.id, |_| {}).await.unwrap();
    assert_eq!(done.state, "succeeded", "{done:?}");
    let summary = &done.result.as_ref().unwrap()["summary"];
    assert_eq!(summary["rows_accepted"], 299_994);
    let mut errors = Vec::new();
    client
        .download_artifact(&done.id, Some("errors"), &mut errors, |_, _| {})
        .await
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(errors)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rows: Vec<u64> = lines.iter().map(|l| l["line"].as_u64().unwrap()).collect();
    assert_eq!(rows, vec![50_001, 100_001, 150_001, 200_001, 250_001, 300_001]);
    let missing = client
        .download_artifact(&done.id, Some("nope"), &mut Vec::new(), |_, _| {})
        .await;
    assert!(missing.is_err());
}
