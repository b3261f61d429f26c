//! Work that starts later (`not_before`, `start_after_seconds`) and work
//! that matters more (`priority`) over real HTTP: the representation, the
//! fingerprint, `Retry-After`, `PATCH` of the start, claims, and every
//! refusal. Time moves by the server's manual clock, never by sleeping.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, TestApp, manual_clock, problem, spawn_app_with};

async fn app_with_clock() -> (TestApp, longrun_core::ManualClock) {
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    app.declare_kind("later", true, 3).await;
    (app, clock)
}

fn rfc3339(clock: &longrun_core::ManualClock, ahead: Duration) -> String {
    use longrun_core::Clock;
    clock.now().plus(ahead).to_rfc3339()
}

async fn patch(app: &TestApp, id: &str, version: i64, body: &Value) -> reqwest::Response {
    app.request(Method::PATCH, &format!("/v1/operations/{id}"), &app.client_key)
        .header("If-Match", format!("\"{version}\""))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn work_that_starts_later_waits_for_its_start_and_says_when() {
    let (app, clock) = app_with_clock().await;
    let start = rfc3339(&clock, Duration::from_secs(3600));
    let op = app
        .submit_ok("at-two", &json!({"kind": "later", "not_before": start, "priority": 7}))
        .await;
    assert_eq!(op["state"], "queued");
    assert_eq!(op["not_before"], json!(start));
    assert_eq!(op["priority"], 7);
    let id = op["id"].as_str().unwrap();

    // Retry-After points at the start, not at a poll loop.
    let response = app
        .request(Method::GET, &format!("/v1/operations/{id}"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["retry-after"], "3600");
    assert!(app.claim("later", 10).await.is_empty(), "not claimed before its start");

    clock.advance(Duration::from_secs(1800));
    let relative = app
        .submit_ok("in-ten", &json!({"kind": "later", "start_after_seconds": 10}))
        .await;
    assert_eq!(relative["not_before"], json!(rfc3339(&clock, Duration::from_secs(10))));
    assert_eq!(relative["priority"], 5, "the default is the middle of 1–9");
    assert!(app.claim("later", 10).await.is_empty());

    clock.advance(Duration::from_secs(10));
    let tasks = app.claim("later", 10).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["operation_id"], relative["id"]);
    clock.advance(Duration::from_secs(1790));
    let tasks = app.claim("later", 10).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["operation_id"], json!(id));
}

#[tokio::test]
async fn the_start_and_priority_are_part_of_the_request() {
    let (app, clock) = app_with_clock().await;
    let start = rfc3339(&clock, Duration::from_secs(60));
    let body = json!({"kind": "later", "not_before": start, "priority": 8});
    let first = app.submit_ok("k-1", &body).await;
    let again = app.submit("k-1", &body).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap()["id"], first["id"]);
    for changed in [
        json!({"kind": "later", "not_before": start, "priority": 9}),
        json!({"kind": "later", "not_before": rfc3339(&clock, Duration::from_secs(61)), "priority": 8}),
        json!({"kind": "later", "priority": 8}),
    ] {
        let response = app.submit("k-1", &changed).await;
        problem(response, StatusCode::CONFLICT, "idempotency_key_reused").await;
    }
    // A retry of a relative start, sent again later (after a lost answer),
    // is the same request: the seconds as asked are fingerprinted, not the
    // instant they came to, and the start stays the first one's.
    let relative = json!({"kind": "later", "start_after_seconds": 600});
    let first_try = app.submit_ok("k-rel", &relative).await;
    clock.advance(Duration::from_secs(5));
    let retried = app.submit("k-rel", &relative).await;
    assert_eq!(retried.headers()["idempotent-replayed"], "true");
    let retried: Value = retried.json().await.unwrap();
    assert_eq!(
        (retried["id"].clone(), retried["not_before"].clone()),
        (first_try["id"].clone(), first_try["not_before"].clone())
    );
    // The default priority said aloud is the same request as none at all.
    let plain = app.submit_ok("k-2", &json!({"kind": "later"})).await;
    let explicit = app.submit("k-2", &json!({"kind": "later", "priority": 5})).await;
    assert_eq!(explicit.json::<Value>().await.unwrap()["id"], plain["id"]);
}

#[tokio::test]
async fn bad_starts_and_priorities_are_refused_and_create_nothing() {
    let (app, clock) = app_with_clock().await;
    for (n, body) in [
        json!({"kind": "later", "not_before": "tomorrow"}),
        json!({"kind": "later", "not_before": "2026-12-06T02:00:00"}),
        json!({"kind": "later", "start_after_seconds": 40_000_000}),
        json!({"kind": "later", "not_before": "2026-13-01T00:00:00Z"}),
        json!({"kind": "later", "not_before": rfc3339(&clock, Duration::from_secs(5)), "start_after_seconds": 5}),
        json!({"kind": "later", "priority": 0}),
        json!({"kind": "later", "priority": 10}),
        json!({"kind": "later", "priority": -1}),
        json!({"kind": "later", "priority": "high"}),
        json!({"kind": "later", "not_before": 1_800_000_000}),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app.submit(&format!("bad-{n}"), &body).await;
        problem(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    assert_eq!(app.operation_count("default").await, 0);
    // A deadline counts from creation: one that passes before the start
    // ends the work unstarted, as any queued work past its deadline.
    let late = app
        .submit_ok(
            "late",
            &json!({"kind": "later", "start_after_seconds": 600, "deadline_seconds": 300}),
        )
        .await;
    clock.advance(Duration::from_secs(600));
    assert!(app.claim("later", 10).await.is_empty());
    let ended = app.get_operation(late["id"].as_str().unwrap()).await;
    assert_eq!(
        (ended["state"].clone(), ended["error"]["code"].clone()),
        (json!("failed"), json!("deadline_exceeded"))
    );
    // In a batch, a bad item refuses only itself.
    let response = app
        .request(Method::POST, "/v1/operations/batch", &app.client_key)
        .json(&json!({"operations": [
            {"idempotency_key": "b-1", "kind": "later", "priority": 11},
            {"idempotency_key": "b-2", "kind": "later", "priority": 9, "start_after_seconds": 30},
        ]}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["results"][0]["status"], 400);
    assert_eq!(answer["results"][1]["status"], 202);
    assert_eq!(answer["results"][1]["operation"]["priority"], 9);
    assert_eq!(
        answer["results"][1]["operation"]["not_before"],
        json!(rfc3339(&clock, Duration::from_secs(30)))
    );
}

#[tokio::test]
async fn the_start_moves_under_if_match_while_queued() {
    let (app, clock) = app_with_clock().await;
    let op = app
        .submit_ok("move", &json!({"kind": "later", "start_after_seconds": 3600}))
        .await;
    let id = op["id"].as_str().unwrap();
    let sooner = rfc3339(&clock, Duration::from_secs(60));
    let stale = patch(&app, id, 9, &json!({"not_before": sooner})).await;
    problem(stale, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    let malformed = patch(&app, id, 1, &json!({"not_before": "soon"})).await;
    problem(malformed, StatusCode::BAD_REQUEST, "invalid_request").await;
    let mixed = patch(&app, id, 1, &json!({"not_before": sooner, "desired_state": "paused"})).await;
    problem(mixed, StatusCode::BAD_REQUEST, "invalid_request").await;
    let moved = patch(&app, id, 1, &json!({"not_before": sooner})).await;
    assert_eq!(moved.status(), StatusCode::OK);
    let moved: Value = moved.json().await.unwrap();
    assert_eq!(
        (moved["not_before"].clone(), moved["version"].clone()),
        (json!(sooner), json!(2))
    );
    let history = app.get_json(&format!("/v1/operations/{id}/history")).await;
    assert_eq!(history["events"][1]["data"]["not_before"], json!(sooner));

    let now = patch(&app, id, 2, &json!({"not_before": null})).await;
    assert_eq!(now.json::<Value>().await.unwrap()["not_before"], Value::Null);
    let tasks = app.claim("later", 1).await;
    assert_eq!(tasks[0]["operation_id"], json!(id));
    let started = patch(&app, id, 4, &json!({"not_before": sooner})).await;
    problem(started, StatusCode::CONFLICT, "intent_conflict").await;
}

#[tokio::test]
async fn a_high_priority_submission_overtakes_a_backlog_of_its_tenant() {
    let (app, _clock) = app_with_clock().await;
    let mut batch = Vec::new();
    for n in 0..200 {
        batch.push(json!({"idempotency_key": format!("low-{n}"), "kind": "later", "priority": 1}));
    }
    let response = app
        .request(Method::POST, "/v1/operations/batch", &app.client_key)
        .json(&json!({"operations": batch}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let urgent = app.submit_ok("urgent", &json!({"kind": "later", "priority": 9})).await;
    let tasks = app.claim("later", 1).await;
    assert_eq!(
        tasks[0]["operation_id"], urgent["id"],
        "the first claim after it takes it"
    );
}

/// The console's operation page says when work that starts later may
/// start and what its priority is (plain HTTP with a session; no browser
/// needed to read a fact).
#[tokio::test]
async fn the_console_shows_the_start_and_the_priority() {
    let (app, clock) = app_with_clock().await;
    let start = rfc3339(&clock, Duration::from_secs(7200));
    let op = app
        .submit_ok("page", &json!({"kind": "later", "not_before": start, "priority": 8}))
        .await;
    let (http, session) = app.console_session(&app.client_key).await;
    let page = http
        .get(app.url(&format!("/ui/operations/{}", op["id"].as_str().unwrap())))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"id="not-before""#), "{html}");
    assert!(html.contains(r#"<td id="priority">8 of 1–9</td>"#), "{html}");
}
