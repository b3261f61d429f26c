//! Idempotency exactly as docs/api.md §3 specifies it: replays, conflicts,
//! scope, convergence of concurrent first requests, and a retry after a lost
//! response.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, problem, response_dropping_proxy, sleep_body, spawn_app, spawn_app_with};

fn queued_only() -> Options {
    // No built-in workers: operations stay queued, so replays see non-terminal ones.
    Options {
        builtin_workers: false,
        ..Options::default()
    }
}

#[tokio::test]
async fn a_replay_returns_the_original_202_then_200_once_terminal() {
    let app = spawn_app().await;
    let body = sleep_body(30);
    let first = app.submit_ok("replay", &body).await;
    let id = first["id"].as_str().unwrap().to_owned();

    let done = app.wait_for_state(&id, "succeeded").await;
    let replay = app.submit("replay", &body).await;
    assert_eq!(replay.status(), StatusCode::OK, "terminal replays answer 200");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], format!("/v1/operations/{id}").as_str());
    let replayed: Value = replay.json().await.unwrap();
    assert_eq!(replayed, done, "the replay is the operation as it is now");
    assert_eq!(app.operation_count("acme").await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_replay_of_unfinished_work_is_202_with_the_same_operation() {
    let app = spawn_app_with(queued_only()).await;
    let first = app.submit_ok("pending", &sleep_body(30)).await;
    let replay = app.submit("pending", &sleep_body(30)).await;
    assert_eq!(replay.status(), StatusCode::ACCEPTED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed: Value = replay.json().await.unwrap();
    assert_eq!(replayed["id"], first["id"]);
    app.shutdown().await;
}

#[tokio::test]
async fn equivalent_spellings_replay_and_any_semantic_change_conflicts() {
    let app = spawn_app_with(queued_only()).await;
    let original = json!({"kind": "sleep", "input": {"duration_ms": 100, "steps": 4}, "labels": {"a": "1", "b": "2"}});
    let first = app.submit_ok("spelling", &original).await;

    let same_spellings = [
        r#"{"labels":{"b":"2","a":"1"},"input":{"steps":4,"duration_ms":100},"kind":"sleep"}"#,
        r#"{"kind":"sleep","input":{"duration_ms":100.0,"steps":4},"labels":{"a":"1","b":"2"}}"#,
        r#"{"kind":"sleep","input":{"duration_ms":1e2,"steps":4.0},"labels":{"a":"1","b":"2"}}"#,
        "{ \"kind\" : \"sleep\" ,\n \"input\" : {\"duration_ms\": 100, \"steps\": 4}, \"labels\": {\"a\": \"1\", \"b\": \"2\"} }",
    ];
    for raw in same_spellings {
        let response = app
            .request(Method::POST, "/v1/operations", &app.client_key)
            .header("Idempotency-Key", "spelling")
            .header("Content-Type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{raw}");
        assert_eq!(response.headers()["idempotent-replayed"], "true", "{raw}");
        let op: Value = response.json().await.unwrap();
        assert_eq!(op["id"], first["id"], "{raw}");
    }

    let changed = [
        json!({"kind": "sleep", "input": {"duration_ms": 101, "steps": 4}, "labels": {"a": "1", "b": "2"}}),
        json!({"kind": "sleep", "input": {"duration_ms": 100, "steps": 4}, "labels": {"a": "1"}}),
        json!({"kind": "sleep", "input": {"duration_ms": 100, "steps": 4}, "labels": {"a": "1", "b": "2"}, "deadline_seconds": 60}),
        json!({"kind": "sleep", "input": {"duration_ms": 100, "steps": 4}, "labels": {"a": "1", "b": "2"}, "budget": {"max_cost_units": 3}}),
        json!({"kind": "sleep", "input": {"duration_ms": 100}, "labels": {"a": "1", "b": "2"}}),
    ];
    for body in changed {
        let body_text = body.to_string();
        let response = app.submit("spelling", &body).await;
        let err = problem(response, StatusCode::CONFLICT, "idempotency_key_reused").await;
        assert_eq!(err["operation_id"], first["id"], "{body_text}");
    }
    assert_eq!(app.operation_count("acme").await, 1, "conflicts create nothing");
    app.shutdown().await;
}

#[tokio::test]
async fn key_presence_and_syntax_are_checked() {
    let app = spawn_app_with(queued_only()).await;
    let no_key = app
        .request(Method::POST, "/v1/operations", &app.client_key)
        .json(&sleep_body(1))
        .send()
        .await
        .unwrap();
    problem(no_key, StatusCode::BAD_REQUEST, "idempotency_key_required").await;

    for bad in ["x".repeat(256), "has space".to_owned(), "tab\there".to_owned()] {
        let response = app
            .request(Method::POST, "/v1/operations", &app.client_key)
            .header("Idempotency-Key", bad.as_str())
            .json(&sleep_body(1))
            .send()
            .await
            .unwrap();
        problem(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let longest = app.submit(&"k".repeat(255), &sleep_body(1)).await;
    assert_eq!(longest.status(), StatusCode::ACCEPTED);
    assert_eq!(app.operation_count("acme").await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn the_scope_is_tenant_plus_kind_plus_key() {
    let app = spawn_app_with(queued_only()).await;
    let mine = app.submit_ok("shared-key", &sleep_body(1)).await;
    let theirs = app
        .request(Method::POST, "/v1/operations", &app.other_tenant_key)
        .header("Idempotency-Key", "shared-key")
        .json(&sleep_body(2))
        .send()
        .await
        .unwrap();
    assert_eq!(
        theirs.status(),
        StatusCode::ACCEPTED,
        "another tenant's key space is separate"
    );
    let theirs: Value = theirs.json().await.unwrap();
    assert_ne!(theirs["id"], mine["id"]);
    app.shutdown().await;
}

#[tokio::test]
async fn idempotency_expires_is_an_http_date_at_least_a_day_away() {
    let app = spawn_app_with(queued_only()).await;
    let response = app.submit("expiry", &sleep_body(1)).await;
    let header = response.headers()["idempotency-expires"].to_str().unwrap().to_owned();
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let expires = time::PrimitiveDateTime::parse(&header, &format)
        .expect("an IMF-fixdate")
        .assume_utc();
    assert!(
        expires - time::OffsetDateTime::now_utc() > time::Duration::hours(24),
        "{header}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn concurrent_duplicate_first_requests_create_one_operation() {
    let app = spawn_app_with(queued_only()).await;
    let body = sleep_body(5);
    let responses = futures_join(32, |_| {
        let request = app
            .request(Method::POST, "/v1/operations", &app.client_key)
            .header("Idempotency-Key", "stampede")
            .json(&body);
        async move { request.send().await.unwrap() }
    })
    .await;
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for response in responses {
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        if response.headers().get("idempotent-replayed").is_none() {
            fresh += 1;
        }
        let op: Value = response.json().await.unwrap();
        ids.insert(op["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "every response names the same operation");
    assert_eq!(fresh, 1, "exactly one response created it");
    assert_eq!(app.operation_count("acme").await, 1);
    app.shutdown().await;
}

/// Runs `n` futures concurrently on the runtime and collects their outputs.
async fn futures_join<F, Fut>(n: usize, make: F) -> Vec<Fut::Output>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_retry_after_a_lost_response_returns_the_operation_created_once() {
    let app = spawn_app_with(queued_only()).await;
    let upstream = app.base.trim_start_matches("http://").parse().unwrap();
    let proxy = response_dropping_proxy(upstream).await;
    let through_proxy = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let lost = through_proxy
        .post(format!("http://{proxy}/v1/operations"))
        .bearer_auth(&app.client_key)
        .header("Idempotency-Key", "lost-response")
        .json(&sleep_body(5))
        .send()
        .await;
    assert!(lost.is_err(), "the client never saw the response: {lost:?}");
    assert_eq!(
        app.operation_count("acme").await,
        1,
        "the server had committed before answering"
    );

    let retry = app.submit("lost-response", &sleep_body(5)).await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.operation_count("acme").await, 1, "the retry created nothing new");
    app.shutdown().await;
}

#[tokio::test]
async fn with_keys_optional_a_keyless_submission_is_accepted_and_not_deduplicated() {
    let app = spawn_app_with(Options {
        require_idempotency_key: false,
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    for _ in 0..2 {
        let response = app
            .request(Method::POST, "/v1/operations", &app.client_key)
            .json(&sleep_body(1))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert!(response.headers().get("idempotency-expires").is_none());
    }
    assert_eq!(
        app.operation_count("acme").await,
        2,
        "without a key, a retry is a new operation"
    );
    app.shutdown().await;
}
