//! Webhooks (docs/api.md §5) delivered over real HTTP to receivers on loopback:
//! retries with the same `webhook-id`, giving up without touching the
//! operation, signatures checked by the `standardwebhooks` package from PyPI,
//! exactly-once application behind a proxy that drops acknowledgements, and
//! the address guard.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use longrun_core::webhook::WebhookSecret;
use longrun_core::{Clock, SystemClock};
use longrun_engine::services::webhooks::{Config, Deliverer, DeliveryPolicy, HostLookup};
use longrun_store::{AcceptOutcome, AcceptParams, CancelParams};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, Receiver, TestApp, peers_required, problem, sleep_body, spawn_app_with};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn app_with_schedule(schedule: Vec<Duration>) -> TestApp {
    spawn_app_with(Options {
        builtin_workers: false,
        webhooks_to_loopback: true,
        webhook_schedule: Some(schedule),
        ..Options::default()
    })
    .await
}

/// Submits an operation with a callback and cancels it: exactly one transition.
async fn one_event(app: &TestApp, key: &str, url: &str) -> String {
    let op = app
        .submit_ok(
            key,
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "callback": {"url": url}}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let cancelled = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    id
}

async fn deliveries(app: &TestApp, id: &str) -> Vec<Value> {
    let log: Value = app
        .request(Method::GET, &format!("/v1/operations/{id}/deliveries"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    log["deliveries"].as_array().unwrap().clone()
}

/// Waits (bounded) until the delivery log satisfies `done`.
async fn wait_for_log(app: &TestApp, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = deliveries(app, id).await;
        if done(&log) {
            return log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out; delivery log: {log:?}"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

#[tokio::test]
async fn a_receiver_that_fails_twice_gets_the_same_webhook_id_three_times() {
    let app = app_with_schedule(vec![ms(0), ms(20), ms(20), ms(20)]).await;
    let receiver = Receiver::start(vec![503, 500]).await;
    let id = one_event(&app, "flaky-receiver", &receiver.url).await;
    let log = wait_for_log(&app, &id, |log| log.iter().any(|d| d["status_code"] == 200)).await;

    let got = receiver.received();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|r| r.webhook_id == got[0].webhook_id),
        "one webhook-id for one transition"
    );
    assert!(got[0].webhook_id.starts_with("evt_"));
    let body: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(body["type"], "operation.cancelled");
    assert_eq!(
        body["data"],
        json!({"operation_id": id, "version": 2, "state": "cancelled", "kind": "sleep"})
    );
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));

    let attempts: Vec<(i64, Value)> = log
        .iter()
        .map(|d| (d["attempt"].as_i64().unwrap(), d["status_code"].clone()))
        .collect();
    assert_eq!(attempts, vec![(1, json!(503)), (2, json!(500)), (3, json!(200))]);
    assert!(log[0]["next_attempt_at"].is_string() && log[2]["next_attempt_at"].is_null());
    assert_eq!(log[0]["event_id"], got[0].webhook_id.as_str());
    app.shutdown().await;
}

#[tokio::test]
async fn a_receiver_down_for_the_whole_schedule_is_given_up_and_the_operation_is_untouched() {
    let app = app_with_schedule(vec![ms(0), ms(10), ms(10)]).await;
    // Nothing listens on this port.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let id = one_event(&app, "dead-receiver", &format!("http://{closed}/hook")).await;
    let before = app.get_operation(&id).await;
    let log = wait_for_log(&app, &id, |log| log.len() == 3).await;
    assert!(log.iter().all(|d| d["status_code"].is_null() && d["error"].is_string()));
    assert!(log[2]["next_attempt_at"].is_null(), "given up after the schedule");
    assert_eq!(
        app.get_operation(&id).await,
        before,
        "delivery never changes the operation"
    );

    let foreign = app
        .request(
            Method::GET,
            &format!("/v1/operations/{id}/deliveries"),
            &app.other_tenant_key,
        )
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    app.shutdown().await;
}

/// Runs the `standardwebhooks` package on each case; `None` if it is missing.
fn verify_with_python(cases: &[Value]) -> Option<Vec<bool>> {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import standardwebhooks"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            !peers_required(),
            "LONGRUN_REQUIRE_PEERS is set but python3 cannot import standardwebhooks"
        );
        eprintln!("SKIPPED: the standardwebhooks interop check (pip install standardwebhooks to run it)");
        return None;
    }
    let program = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
results = []
for case in json.load(sys.stdin):
    try:
        Webhook(case["secret"]).verify(case["body"], case["headers"])
        results.append(True)
    except Exception:
        results.append(False)
print(json.dumps(results))
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", program])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(cases).unwrap().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    Some(serde_json::from_slice(&output.stdout).unwrap())
}

fn case(secret: &str, r: &crate::helpers::Received, body: &str, timestamp: &str) -> Value {
    json!({
        "secret": secret,
        "body": body,
        "headers": {"webhook-id": r.webhook_id, "webhook-timestamp": timestamp, "webhook-signature": r.signature},
    })
}

#[tokio::test]
async fn signatures_verify_with_the_standardwebhooks_package_across_a_rotation() {
    let app = app_with_schedule(vec![ms(0)]).await;
    let receiver = Receiver::start(vec![]).await;
    let now = SystemClock.now();
    let first_secret = app
        .store
        .webhook_secrets("acme", WebhookSecret::generate().expose(), now)
        .await
        .unwrap()
        .remove(0);
    let before = one_event(&app, "sig-1", &receiver.url).await;
    wait_for_log(&app, &before, |log| !log.is_empty()).await;

    let second_secret = WebhookSecret::generate().expose();
    app.store
        .webhook_secret_rotate("acme", second_secret.clone(), now, Duration::from_secs(3600))
        .await
        .unwrap();
    let after = one_event(&app, "sig-2", &receiver.url).await;
    wait_for_log(&app, &after, |log| !log.is_empty()).await;

    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].signature.split_whitespace().count(), 1);
    assert_eq!(
        got[1].signature.split_whitespace().count(),
        2,
        "both secrets sign during the overlap"
    );
    let stale = (SystemClock.now().as_millis() / 1000 - 3600).to_string();
    let cases = vec![
        case(&first_secret, &got[0], &got[0].body, &got[0].timestamp),
        case(&first_secret, &got[1], &got[1].body, &got[1].timestamp),
        case(&second_secret, &got[1], &got[1].body, &got[1].timestamp),
        case(&second_secret, &got[0], &got[0].body, &got[0].timestamp),
        case(
            &first_secret,
            &got[0],
            &got[0].body.replace("cancelled", "succeeded"),
            &got[0].timestamp,
        ),
        case(&first_secret, &got[0], &got[0].body, &stale),
    ];
    let Some(results) = verify_with_python(&cases) else {
        return app.shutdown().await;
    };
    assert_eq!(
        results,
        vec![true, true, true, false, false, false],
        "old secret, old secret after rotation, new secret; the new secret did not sign before; tampered; stale"
    );
    app.shutdown().await;
}

/// A proxy that forwards each request to `upstream` and, for 3 of every 10
/// connections, cuts the answer instead of relaying it. Counts both.
async fn ack_dropping_proxy(upstream: std::net::SocketAddr) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (relayed, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, d) = (relayed.clone(), dropped.clone());
    tokio::spawn(async move {
        let mut seq = 0usize;
        while let Ok((client, _)) = listener.accept().await {
            let drop_this = seq % 10 < 3;
            seq += 1;
            let (r, d) = (r.clone(), d.clone());
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
                let mut answer = vec![0u8; 16 * 1024];
                let Ok(n) = server_read.read(&mut answer).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                if drop_this {
                    d.fetch_add(1, Ordering::SeqCst);
                    // Cut: the receiver applied it, the sender never hears so.
                    return;
                }
                if client_write.write_all(&answer[..n]).await.is_ok() {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
        }
    });
    (format!("http://{addr}/hook"), relayed, dropped)
}

#[tokio::test]
async fn with_30_percent_of_acks_dropped_every_event_is_applied_exactly_once() {
    let schedule: Vec<Duration> = std::iter::once(ms(0)).chain(std::iter::repeat_n(ms(10), 11)).collect();
    let app = spawn_app_with(Options {
        builtin_workers: false,
        webhooks_to_loopback: true,
        webhook_schedule: Some(schedule),
        // One request per connection, so the proxy decides per delivery.
        webhook_reuse_connections: false,
        ..Options::default()
    })
    .await;
    let receiver = Receiver::start(vec![]).await;
    let (proxy_url, relayed, dropped) = ack_dropping_proxy(receiver.addr).await;

    // 1,000 operations with the proxy as callback, each cancelled: one event each.
    let events = 1000;
    let mut tasks = Vec::new();
    for _ in 0..events {
        let (store, url) = (app.store.clone(), proxy_url.clone());
        tasks.push(tokio::spawn(async move {
            let now = SystemClock.now();
            let AcceptOutcome::Created(op) = store
                .operation_accept(AcceptParams {
                    callback_url: Some(url),
                    not_before: None,
                    priority: longrun_store::PRIORITY_DEFAULT,
                    now,
                    ..longrun_store::conformance::accept_params("acme", "sleep", None, json!({"duration_ms": 1}))
                })
                .await
                .unwrap()
            else {
                panic!()
            };
            store
                .operation_cancel(CancelParams {
                    tenant: "acme".into(),
                    id: op.id,
                    requested_by: "test".into(),
                    reason: None,
                    if_match: None,
                    now,
                })
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while relayed.load(Ordering::SeqCst) < events {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} acknowledged",
            relayed.load(Ordering::SeqCst)
        );
        tokio::time::sleep(ms(20)).await;
    }
    let received = receiver.received().len();
    let applied = receiver.applied.lock().unwrap().len();
    let (acked, cut) = (relayed.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst));
    println!("| events | deliveries received | acknowledgements cut | acknowledged | applied | mean attempts |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {events} | {received} | {cut} | {acked} | {applied} | {:.2} |",
        received as f64 / events as f64
    );
    assert_eq!(applied, events, "every event applied exactly once");
    assert_eq!(acked, events, "every event acknowledged once");
    assert!(received > events, "cut acknowledgements were retried");
    app.shutdown().await;
}

/// Resolves every name to one address, as a hostile DNS would.
struct FixedLookup(std::net::IpAddr);

impl HostLookup for FixedLookup {
    fn lookup(
        &self,
        _host: String,
    ) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Vec<std::net::IpAddr>>> + Send>> {
        let ip = self.0;
        Box::pin(async move { Ok(vec![ip]) })
    }
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_and_allowed_ones_are_pinned() {
    // The server checks the name at submission (it looks public); the
    // deliverer resolves it — here through a stub, since this machine's DNS
    // cannot be pointed anywhere — and refuses the loopback answer.
    // This test runs the deliverer itself, with a stub resolver.
    let app = spawn_app_with(Options {
        builtin_workers: false,
        webhooks_to_loopback: true,
        deliver_webhooks: false,
        ..Options::default()
    })
    .await;
    let receiver = Receiver::start(vec![]).await;
    let url = format!("http://hooks.evil.example:{}/hook", receiver.addr.port());
    let id = one_event(&app, "rebind", &url).await;

    let strict = Config {
        schedule: vec![ms(0)],
        policy: DeliveryPolicy {
            allow_http: true,
            allow_private: false,
        },
        ..Config::default()
    };
    let lookup = Arc::new(FixedLookup("127.0.0.1".parse().unwrap()));
    let deliverer = Arc::new(Deliverer::with_lookup(
        app.store.clone(),
        Arc::new(SystemClock),
        strict,
        lookup.clone(),
    ));
    let (counts, found) = deliverer.run_once().await.unwrap();
    assert_eq!((found, counts.given_up), (1, 1));
    let log = deliveries(&app, &id).await;
    let error = log[0]["error"].as_str().unwrap();
    assert!(
        error.contains("refused") && error.contains("hooks.evil.example"),
        "{error}"
    );
    assert!(receiver.received().is_empty(), "no connection was made");

    // With private addresses allowed (development), the same stub answer is
    // used for the connection itself: the request reaches the receiver at the
    // resolved address, not at whatever the name would resolve to later.
    let http_url = format!("http://pinned.example:{}/hook", receiver.addr.port());
    one_event(&app, "pinned", &http_url).await;
    let open = Config {
        schedule: vec![ms(0)],
        policy: DeliveryPolicy {
            allow_http: true,
            allow_private: true,
        },
        ..Config::default()
    };
    let deliverer = Arc::new(Deliverer::with_lookup(
        app.store.clone(),
        Arc::new(SystemClock),
        open,
        lookup,
    ));
    let (counts, _) = deliverer.run_once().await.unwrap();
    assert_eq!(counts.delivered, 1);
    assert_eq!(receiver.received().len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn the_callback_url_is_part_of_the_idempotency_fingerprint() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let body = |url: &str| json!({"kind": "sleep", "input": {"duration_ms": 1}, "callback": {"url": url}});
    app.submit_ok("cb", &body("https://a.example/hook")).await;
    let replay = app.submit("cb", &body("https://a.example/hook")).await;
    assert_eq!(replay.status(), StatusCode::ACCEPTED);
    let other = app.submit("cb", &body("https://b.example/hook")).await;
    problem(other, StatusCode::CONFLICT, "idempotency_key_reused").await;
    let none = app.submit("cb", &sleep_body(1)).await;
    problem(none, StatusCode::CONFLICT, "idempotency_key_reused").await;
    app.shutdown().await;
}
