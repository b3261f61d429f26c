//! Hostile and careless clients: slow-loris heads and bodies, more
//! connections than the server allows, overload, and floods of bad keys.
//! Raw TCP where the client must misbehave in ways reqwest never would.

use std::time::Duration;

use longrun_core::apikey::{NewApiKey, Role};
use longrun_server::Limits;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::helpers::{Options, TestApp, create_key, problem, sleep_body, spawn_app_with};

/// How long a test waits for the server to act on its own timeouts.
const BOUND: Duration = Duration::from_secs(10);

fn limits(change: impl FnOnce(&mut Limits)) -> Options {
    let mut limits = Limits::default();
    change(&mut limits);
    Options {
        builtin_workers: false,
        limits,
        ..Options::default()
    }
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Everything the server sends until it closes, within [`BOUND`].
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(BOUND, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server never closed the connection");
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn a_client_that_never_finishes_its_head_is_disconnected() {
    let app = spawn_app_with(limits(|l| l.header_read_timeout = Duration::from_millis(200))).await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: longrun\r\nX-Slow: ")
        .await
        .unwrap();
    let started = Instant::now();
    read_until_closed(&mut stream).await;
    println!("a half-sent head was cut after {:?}", started.elapsed());

    // An idle keep-alive connection is closed the same way.
    let mut idle = connect(&app).await;
    read_until_closed(&mut idle).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_stalled_body_ends_with_a_problem_and_creates_nothing() {
    let app = spawn_app_with(limits(|l| l.body_stall_timeout = Duration::from_millis(200))).await;
    let mut stream = connect(&app).await;
    let head = format!(
        "POST /v1/operations HTTP/1.1\r\nHost: longrun\r\nAuthorization: Bearer {}\r\nIdempotency-Key: stalled\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"kind\":",
        app.client_key
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_until_closed(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(response.contains("\"code\":\"invalid_request\""), "{response}");
    assert_eq!(app.operation_count("acme").await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_its_responses_is_disconnected() {
    let app = spawn_app_with(limits(|l| l.send_stall_timeout = Duration::from_millis(200))).await;
    let admin = create_key(app.store.as_ref(), "acme", Role::Admin).await;
    // A small receive window, and far more pipelined responses than any
    // buffer holds: the server's writes stop making progress.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket
        .connect(app.base.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap();
    const REQUESTS: usize = 2000;
    let pipelined = "GET /openapi.json HTTP/1.1\r\nHost: longrun\r\n\r\n".repeat(REQUESTS);
    stream.write_all(pipelined.as_bytes()).await.unwrap();

    // The server gives up on the connection on its own (it counts it)…
    let deadline = Instant::now() + BOUND;
    loop {
        let metrics = app
            .request(Method::GET, "/metrics", &admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("longrun_http_send_stalls_total") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server kept writing to a client that never reads"
        );
        tokio::task::yield_now().await;
    }
    // …so what the client finds when it finally reads ends early.
    let answered = read_until_closed(&mut stream).await.matches("HTTP/1.1 200").count();
    println!("{answered} of {REQUESTS} responses were sent before the server gave up");
    assert!(
        answered < REQUESTS,
        "every response was delivered: the writes never stalled"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_with_503_and_the_rest_are_served() {
    let app = spawn_app_with(limits(|l| l.max_connections = 2)).await;
    let held = [connect(&app).await, connect(&app).await];
    let mut extra = connect(&app).await;
    let refused = read_until_closed(&mut extra).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.to_ascii_lowercase().contains("retry-after: 1"), "{refused}");
    assert!(refused.contains("\"code\":\"temporarily_unavailable\""), "{refused}");
    assert!(refused.to_ascii_lowercase().contains("x-request-id: req_"), "{refused}");
    assert!(refused.contains("\"request_id\":\"req_"), "{refused}");

    // Once a held connection goes, its slot serves again.
    drop(held);
    let deadline = Instant::now() + BOUND;
    loop {
        let response = app.http.get(app.url("/healthz")).send().await;
        if response.is_ok_and(|r| r.status() == StatusCode::OK) {
            break;
        }
        assert!(Instant::now() < deadline, "the freed slots never served");
        tokio::task::yield_now().await;
    }
    app.shutdown().await;
}

#[tokio::test]
async fn past_the_in_flight_limits_requests_are_shed_at_once_overall_and_per_tenant() {
    let app = spawn_app_with(limits(|l| {
        l.max_in_flight = 3;
        l.max_in_flight_per_tenant = 2;
    }))
    .await;
    let op = app.submit_ok("held", &sleep_body(1)).await;
    let path = format!("/v1/operations/{}", op["id"].as_str().unwrap());
    let foreign: Value = app
        .request(Method::POST, "/v1/operations", &app.other_tenant_key)
        .header("Idempotency-Key", "held")
        .json(&sleep_body(1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let foreign_path = format!("/v1/operations/{}", foreign["id"].as_str().unwrap());
    let hold = |path: &str, key: &str| {
        let request = app
            .request(Method::GET, path, key)
            .header("Prefer", "wait=30")
            .header("If-None-Match", "\"1\"");
        tokio::spawn(async move { request.send().await })
    };
    let wait_for_waiters = |tenant: &'static str, n: usize| {
        let app = &app;
        async move {
            let deadline = Instant::now() + BOUND;
            while app.state.waiters(tenant) < n {
                assert!(Instant::now() < deadline, "the long-polls never started waiting");
                tokio::task::yield_now().await;
            }
        }
    };
    let mut held = vec![hold(&path, &app.client_key), hold(&path, &app.client_key)];
    wait_for_waiters("acme", 2).await;

    // acme has both of its places: its next request is 429, at once.
    let response = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
    assert!(response.headers().contains_key("retry-after"));
    problem(response, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // globex takes the last place overall; any request past it is shed with
    // 503 before it is even authenticated.
    held.push(hold(&foreign_path, &app.other_tenant_key));
    wait_for_waiters("globex", 1).await;
    let started = Instant::now();
    let shed = app.http.get(app.url("/healthz")).send().await.unwrap();
    println!("shed within {:?}", started.elapsed());
    assert_eq!(shed.headers()["retry-after"], "1");
    problem(shed, StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable").await;

    // Places come back when the held requests end.
    for poll in held {
        poll.abort();
    }
    let deadline = Instant::now() + BOUND;
    loop {
        let response = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "places never came back");
        tokio::task::yield_now().await;
    }
    app.shutdown().await;
}

/// A well-formed token of `key`'s id with another secret: a wrong guess.
fn wrong_secret(key: &str) -> String {
    let (id, _) = key.rsplit_once('_').expect("a key token");
    format!("{id}_{}", longrun_core::id::random_base32::<32>())
}

/// What the flood tests count, by status.
#[derive(Debug, Default)]
struct Answers {
    ok: usize,
    unauthorized: usize,
    limited: usize,
}

impl Answers {
    async fn count(&mut self, response: reqwest::Response) {
        match response.status() {
            StatusCode::OK => self.ok += 1,
            StatusCode::UNAUTHORIZED => self.unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(response.headers().contains_key("retry-after"));
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["code"], "rate_limited");
                self.limited += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
}

/// 10,000 bad keys from one address — made-up ids, malformed tokens, and
/// wrong secrets of an existing key — while the good key from that address
/// gets `200` every time it asks, with its record read from the store on
/// every request (a key cache of zero: the case where a good key used to be
/// throttled once its cache entry expired). Made-up ids are refused from
/// memory: they cost no store read past the process-wide miss budget, and
/// never a `429`; only the wrong secrets spend the source's budget.
#[tokio::test]
async fn a_flood_of_bad_keys_never_refuses_a_good_key_from_the_same_source() {
    let app = spawn_app_with(limits(|l| l.auth_failures_per_source = 1.0)).await;
    let get = |key: &str| app.request(Method::GET, "/v1/operations", key).send();
    assert_eq!(get(&app.client_key).await.unwrap().status(), StatusCode::OK);

    let (mut made_up, mut malformed, mut guesses, mut good) = (
        Answers::default(),
        Answers::default(),
        Answers::default(),
        Answers::default(),
    );
    let started = Instant::now();
    let before = app.state.key_lookups();
    for i in 0..10_000 {
        match i % 4 {
            0 | 1 => made_up.count(get(&NewApiKey::generate().token).await.unwrap()).await,
            2 => malformed.count(get(&format!("lr_not-a-key-{i}")).await.unwrap()).await,
            _ => guesses.count(get(&wrong_secret(&app.client_key)).await.unwrap()).await,
        }
        if i % 50 == 0 {
            good.count(get(&app.client_key).await.unwrap()).await;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let lookups = app.state.key_lookups() - before;
    println!(
        "10,000 bad keys in {elapsed:.1}s: made-up {made_up:?}, malformed {malformed:?}, \
         wrong secrets {guesses:?}, good key {good:?}, {lookups} store reads"
    );
    assert_eq!(
        (good.ok, good.unauthorized, good.limited),
        (200, 0, 0),
        "the good key is never refused"
    );
    assert_eq!(
        (made_up.unauthorized, made_up.limited),
        (5_000, 0),
        "made-up ids: 401, never 429"
    );
    assert_eq!((malformed.unauthorized, malformed.limited), (2_500, 0));
    // The source's burst (ten seconds of one a second) and what refilled,
    // then 429 for every further wrong secret.
    assert!(
        guesses.unauthorized <= 10 + elapsed.ceil() as usize + 1,
        "wrong secrets past the budget: {guesses:?}"
    );
    assert_eq!(guesses.unauthorized + guesses.limited, 2_500);
    // Store reads: the known key's record on every good request and every
    // wrong secret (cache of zero), plus made-up ids within the miss budget.
    let known = good.ok + guesses.unauthorized + guesses.limited;
    let budget = 100 + (10.0 * elapsed).ceil() as u64 + 1;
    assert!(
        lookups <= known as u64 + budget,
        "{lookups} reads for {known} known-key requests and a miss budget of {budget}"
    );
    app.shutdown().await;
}

/// Behind a trusted proxy the source is the forwarded client: one client's
/// wrong secrets spend its budget, not the proxy's, and neither another
/// client nor a good key from the same client is refused.
#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_budget() {
    let app = spawn_app_with(limits(|l| {
        l.auth_failures_per_source = 1.0;
        l.trusted_proxies = longrun_server::source::TrustedProxies::parse("127.0.0.0/8").unwrap();
    }))
    .await;
    let from = |client: &str, key: &str| {
        app.request(Method::GET, "/v1/operations", key)
            // A hop the client claims first, then what the proxy saw.
            .header("x-forwarded-for", format!("6.6.6.6, {client}"))
            .send()
    };
    let (mut guesses, mut good) = (Answers::default(), Answers::default());
    for _ in 0..200 {
        guesses
            .count(from("203.0.113.7", &wrong_secret(&app.client_key)).await.unwrap())
            .await;
        good.count(from("203.0.113.7", &app.client_key).await.unwrap()).await;
    }
    assert_eq!(good.ok, 200, "the good key behind the same client: {good:?}");
    assert!(guesses.limited > 150, "the flooding client is limited: {guesses:?}");
    // Another client behind the same proxy still gets a plain 401.
    let other = from("198.51.100.9", &wrong_secret(&app.client_key)).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNAUTHORIZED);
    // The forged leftmost hop is not the source either.
    let forged = from("6.6.6.6", &wrong_secret(&app.client_key)).await.unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    app.shutdown().await;
}

/// From a peer that is no trusted proxy, `X-Forwarded-For` changes nothing:
/// a client cannot buy a fresh budget by naming another address.
#[tokio::test]
async fn a_spoofed_forwarded_header_from_an_untrusted_peer_changes_nothing() {
    let app = spawn_app_with(limits(|l| l.auth_failures_per_source = 1.0)).await;
    let mut guesses = Answers::default();
    for i in 0..100 {
        let response = app
            .request(Method::GET, "/v1/operations", &wrong_secret(&app.client_key))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("forwarded", format!("for=203.0.113.{i}"))
            .send()
            .await
            .unwrap();
        guesses.count(response).await;
    }
    assert!(guesses.limited >= 80, "one budget for the peer: {guesses:?}");
    let good = app
        .request(Method::GET, "/v1/operations", &app.client_key)
        .header("x-forwarded-for", "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(good.status(), StatusCode::OK);
    app.shutdown().await;
}
