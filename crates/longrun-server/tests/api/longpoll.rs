//! Observing without hammering: long-polls woken by the transition itself,
//! one-round-trip submissions, and event streams that resume without loss.

use std::time::{Duration, Instant};

use longrun_core::apikey::Role;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, TestApp, create_key, problem, sleep_body, spawn_app, spawn_app_with};

fn queued_only() -> Options {
    Options {
        builtin_workers: false,
        ..Options::default()
    }
}

fn long_poll(app: &TestApp, id: &str, wait: u64, if_none_match: Option<&str>) -> reqwest::RequestBuilder {
    let mut request = app
        .request(Method::GET, &format!("/v1/operations/{id}"), &app.client_key)
        .header("Prefer", format!("wait={wait}"));
    if let Some(tag) = if_none_match {
        request = request.header("If-None-Match", tag);
    }
    request
}

#[tokio::test]
async fn a_long_poll_is_woken_by_the_transition() {
    let app = spawn_app_with(queued_only()).await;
    let op = app.submit_ok("lp", &sleep_body(1)).await;
    let id = op["id"].as_str().unwrap().to_owned();
    let waiting = {
        let request = long_poll(&app, &id, 30, Some("\"1\""));
        tokio::spawn(async move {
            let started = Instant::now();
            let response = request.send().await.unwrap();
            (response, started.elapsed())
        })
    };
    // Cancel only once the poll is held, so it must be woken by the change.
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.waiters("acme") == 0 {
        assert!(Instant::now() < deadline, "the long-poll never started waiting");
        tokio::task::yield_now().await;
    }
    let cancelled = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    let cancelled_at = Instant::now();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let (response, elapsed) = waiting.await.unwrap();
    let woke_after = cancelled_at.elapsed();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["preference-applied"], "wait=30");
    assert_eq!(response.headers()["etag"], "\"2\"");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "cancelled");
    println!(
        "long-poll answered {:.1} ms after the cancel's response (held {:.1} ms in all)",
        woke_after.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e3
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "woken by the change, not by the 30 s timeout"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_conditional_long_poll_that_times_out_answers_304() {
    let app = spawn_app_with(queued_only()).await;
    let op = app.submit_ok("lp304", &sleep_body(1)).await;
    let id = op["id"].as_str().unwrap();
    let response = long_poll(&app, id, 1, Some("\"1\"")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(response.headers()["preference-applied"], "wait=1");
    assert_eq!(response.headers()["etag"], "\"1\"");
    assert!(response.headers().get("retry-after").is_some());
    // A stale tag answers at once with the current representation.
    let stale = long_poll(&app, id, 30, Some("\"0\"")).send().await.unwrap();
    assert_eq!(stale.status(), StatusCode::OK);
    app.shutdown().await;
}

#[tokio::test]
async fn without_a_condition_a_long_poll_returns_the_next_version() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "next",
            &json!({"kind": "sleep", "input": {"duration_ms": 2000, "steps": 20}}),
        )
        .await;
    let id = op["id"].as_str().unwrap();
    let running = app.wait_for_state(id, "running").await;
    let response = long_poll(&app, id, 30, None).send().await.unwrap();
    let next: Value = response.json().await.unwrap();
    assert!(next["version"].as_i64().unwrap() > running["version"].as_i64().unwrap());
    app.shutdown().await;
}

#[tokio::test]
async fn terminal_operations_answer_at_once_and_waits_are_capped() {
    let app = spawn_app().await;
    let op = app.submit_ok("done", &sleep_body(1)).await;
    let id = op["id"].as_str().unwrap();
    let done = app.wait_for_state(id, "succeeded").await;
    let tag = format!("\"{}\"", done["version"]);
    let started = Instant::now();
    let response = long_poll(&app, id, 600, Some(&tag)).send().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "nothing more can change: no wait"
    );
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(
        response.headers()["preference-applied"],
        "wait=60",
        "waits are capped at 60 s"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn waiting_requests_per_tenant_are_bounded() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        max_waiters_per_tenant: 2,
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("bounded", &sleep_body(1)).await;
    let id = op["id"].as_str().unwrap();
    // Event streams hold their place once their headers arrive.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let stream = app
            .request(Method::GET, &format!("/v1/operations/{id}/events"), &app.client_key)
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }
    // The gauge counts them (process-wide, so other tests' may be in it too).
    let admin = create_key(app.store.as_ref(), "acme", Role::Admin).await;
    let metrics = app
        .request(Method::GET, "/metrics", &admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let waiters: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("longrun_http_waiters "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the waiters gauge is exported");
    assert!(waiters >= 2.0, "two held streams, the gauge says {waiters}");
    let third = long_poll(&app, id, 5, None).send().await.unwrap();
    problem(third, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    let other_tenant = app
        .request(Method::GET, "/v1/operations", &app.other_tenant_key)
        .header("Prefer", "wait=1")
        .send()
        .await
        .unwrap();
    assert_eq!(other_tenant.status(), StatusCode::OK, "other tenants are not affected");
    drop(streams);
    // Places are freed when the streams close (the server notices on its next write).
    app.request(
        Method::PUT,
        &format!("/v1/operations/{id}/cancellation"),
        &app.client_key,
    )
    .send()
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = long_poll(&app, id, 0, None).send().await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "places were never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.shutdown().await;
}

#[tokio::test]
async fn short_work_is_answered_in_one_round_trip() {
    let app = spawn_app().await;
    let response = app
        .request(Method::POST, "/v1/operations", &app.client_key)
        .header("Idempotency-Key", "quick")
        .header("Prefer", "respond-async, wait=10")
        .json(&sleep_body(20))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["preference-applied"], "wait=10");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["result"], json!({"value": {"slept_ms": 20}}));

    let slow = app
        .request(Method::POST, "/v1/operations", &app.client_key)
        .header("Idempotency-Key", "slow")
        .header("Prefer", "wait=1")
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 60_000, "steps": 60}}))
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), StatusCode::ACCEPTED, "long work keeps the same shape");
    assert!(slow.headers().get("location").is_some());
    let body: Value = slow.json().await.unwrap();
    assert!(!body["terminal"].as_bool().unwrap());

    let replay = app
        .request(Method::POST, "/v1/operations", &app.client_key)
        .header("Idempotency-Key", "quick")
        .header("Prefer", "wait=10")
        .json(&sleep_body(20))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    app.shutdown().await;
}

/// One server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    id: i64,
    event: String,
    data: Value,
}

/// Reads events until the stream ends or `limit` events arrived.
async fn read_events(mut response: reqwest::Response, limit: usize) -> Vec<Sse> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    while events.len() < limit {
        let Some(chunk) = response.chunk().await.unwrap() else {
            break;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            // Comments (keep-alives) carry no id.
            if let Some(id) = id {
                events.push(Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
        }
    }
    events
}

fn events_request(app: &TestApp, id: &str, last_event_id: Option<i64>) -> reqwest::RequestBuilder {
    let mut request = app.request(Method::GET, &format!("/v1/operations/{id}/events"), &app.client_key);
    if let Some(last) = last_event_id {
        request = request.header("Last-Event-ID", last.to_string());
    }
    request
}

#[tokio::test]
async fn the_event_stream_has_every_version_and_resumes_without_loss_or_duplicates() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "sse",
            &json!({"kind": "sleep", "input": {"duration_ms": 300, "steps": 6}}),
        )
        .await;
    let id = op["id"].as_str().unwrap();

    let stream = events_request(&app, id, None).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    // Read a few, then drop the connection mid-stream.
    let first = read_events(stream, 3).await;
    assert_eq!(first.iter().map(|e| e.id).collect::<Vec<_>>(), vec![1, 2, 3]);
    let resumed = read_events(events_request(&app, id, Some(3)).send().await.unwrap(), usize::MAX).await;

    let all: Vec<Sse> = first.into_iter().chain(resumed).collect();
    let versions: Vec<i64> = all.iter().map(|e| e.id).collect();
    let last = *versions.last().unwrap();
    assert_eq!(versions, (1..=last).collect::<Vec<_>>(), "every version exactly once");
    for event in &all {
        assert_eq!(event.event, "operation.updated");
        assert_eq!(event.data["id"], id);
        assert_eq!(
            event.data["version"], event.id,
            "data is the representation at that version"
        );
    }
    assert_eq!(all[0].data["state"], "queued");
    assert_eq!(
        all.last().unwrap().data["state"],
        "succeeded",
        "the stream ends after the terminal event"
    );
    assert_eq!(all.last().unwrap().data, app.get_operation(id).await);

    // Resuming after the end replays nothing and ends at once.
    let after_end = read_events(events_request(&app, id, Some(last)).send().await.unwrap(), usize::MAX);
    let after_end = tokio::time::timeout(Duration::from_secs(10), after_end)
        .await
        .expect("the stream ends");
    assert!(after_end.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn event_streams_refuse_what_they_cannot_serve() {
    let app = spawn_app_with(queued_only()).await;
    let op = app.submit_ok("sse-refusals", &sleep_body(1)).await;
    let id = op["id"].as_str().unwrap();
    let foreign = app
        .request(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            &app.other_tenant_key,
        )
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    let bad = app
        .request(Method::GET, &format!("/v1/operations/{id}/events"), &app.client_key)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    problem(bad, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.shutdown().await;
}
