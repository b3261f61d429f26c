//! The batch endpoints of docs/api.md §9 over real HTTP: `POST
//! /v1/operations/batch` answers each submission as its single request
//! would, and `POST /v1/worker/outcomes` applies each report fenced by its
//! own lease token. Bad items refuse only themselves; bad batches refuse
//! everything with a problem.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, TestApp, problem, spawn_app, spawn_app_with};

async fn post_batch(app: &TestApp, key: &str, body: &Value) -> reqwest::Response {
    app.request(Method::POST, "/v1/operations/batch", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn batch_ok(app: &TestApp, body: &Value) -> Vec<Value> {
    let response = post_batch(app, &app.client_key, body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    answer["results"].as_array().unwrap().clone()
}

async fn no_workers() -> TestApp {
    spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn a_batch_answers_every_item_as_its_single_submission_would() {
    let app = no_workers().await;
    let earlier = app
        .submit_ok("earlier", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let results = batch_ok(
        &app,
        &json!({"operations": [
            {"idempotency_key": "a", "kind": "sleep", "input": {"duration_ms": 1}, "labels": {"team": "x"}},
            {"idempotency_key": "earlier", "kind": "sleep", "input": {"duration_ms": 1}},
            {"idempotency_key": "earlier", "kind": "sleep", "input": {"duration_ms": 2}},
            {"idempotency_key": "b", "kind": "nope"},
            {"idempotency_key": "c", "kind": "sleep", "input": {"duration_ms": -1}},
            {"kind": "sleep", "input": {"duration_ms": 1}},
            {"idempotency_key": "has space", "kind": "sleep", "input": {"duration_ms": 1}},
            {"idempotency_key": "d", "kind": "sleep", "input": {"duration_ms": 1},
             "callback": {"url": "http://127.0.0.1/hook"}},
        ]}),
    )
    .await;
    let codes: Vec<(u64, &str)> = results
        .iter()
        .map(|r| {
            (
                r["status"].as_u64().unwrap(),
                r["problem"]["code"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            (202, ""),
            (202, ""),
            (409, "idempotency_key_reused"),
            (422, "unsupported_kind"),
            (422, "invalid_input"),
            (400, "idempotency_key_required"),
            (400, "invalid_request"),
            (422, "invalid_callback_url"),
        ]
    );
    let created = &results[0]["operation"];
    assert_eq!(created["state"], "queued");
    assert_eq!(created["labels"]["team"], "x");
    assert_eq!(
        app.get_operation(created["id"].as_str().unwrap()).await["id"],
        created["id"]
    );
    assert_eq!(results[1]["replayed"], true);
    assert_eq!(results[1]["operation"]["id"], earlier["id"]);
    assert!(results[0].get("replayed").is_none());
    for refused in &results[2..] {
        assert!(refused["operation"].is_null());
        assert!(refused["problem"]["request_id"].as_str().unwrap().starts_with("req_"));
    }
    // Only what was accepted exists: the earlier one and item 0.
    assert_eq!(app.operation_count("acme").await, 2);
    app.shutdown().await;
}

/// An item's problem names the request it came in (docs/api.md §6): the
/// id of the batch's own `X-Request-Id`, not one of its own.
#[tokio::test]
async fn a_refused_item_carries_the_batch_requests_id() {
    let app = no_workers().await;
    let body = json!({"operations": [{"idempotency_key": "x", "kind": "nope"}]});
    let response = post_batch(&app, &app.client_key, &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let header = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    let answer: Value = response.json().await.unwrap();
    assert!(header.starts_with("req_"), "{header}");
    assert_eq!(answer["results"][0]["problem"]["request_id"], header.as_str());
    app.shutdown().await;
}

#[tokio::test]
async fn a_retried_batch_replays_what_it_accepted() {
    let app = no_workers().await;
    let body = json!({"operations": (0..50).map(|i| json!({
        "idempotency_key": format!("k{i}"), "kind": "sleep", "input": {"duration_ms": i}
    })).collect::<Vec<_>>()});
    let first = batch_ok(&app, &body).await;
    let again = batch_ok(&app, &body).await;
    assert_eq!(first.len(), 50);
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(a["status"], 202);
        assert_eq!(b["status"], 202);
        assert_eq!(b["replayed"], true);
        assert_eq!(a["operation"]["id"], b["operation"]["id"]);
    }
    assert_eq!(app.operation_count("acme").await, 50);
    app.shutdown().await;
}

#[tokio::test]
async fn bad_batches_are_refused_whole() {
    let app = no_workers().await;
    let too_many = json!({"operations": (0..1001).map(|_| json!({"kind": "sleep"})).collect::<Vec<_>>()});
    problem(
        post_batch(&app, &app.client_key, &too_many).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        post_batch(&app, &app.client_key, &json!({"operations": []})).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        post_batch(
            &app,
            &app.client_key,
            &json!({"operations": [{"kind": "sleep", "extra": 1}]}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    let malformed = app
        .request(Method::POST, "/v1/operations/batch", &app.client_key)
        .header("content-type", "application/json")
        .body("{\"operations\": [")
        .send()
        .await
        .unwrap();
    problem(malformed, StatusCode::BAD_REQUEST, "invalid_request").await;
    problem(
        post_batch(&app, &app.worker_key, &json!({"operations": [{"kind": "sleep"}]})).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    problem(
        post_batch(&app, "lr_nope", &json!({"operations": [{"kind": "sleep"}]})).await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    )
    .await;
    // Larger than the body limit (1 MiB in tests).
    let huge = json!({"operations": [{"kind": "sleep", "input": {"pad": "x".repeat(2 << 20)}}]});
    problem(
        post_batch(&app, &app.client_key, &huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    assert_eq!(app.operation_count("acme").await, 0);
    app.shutdown().await;
}

async fn outcomes(app: &TestApp, items: Value) -> Vec<Value> {
    let response = app
        .worker_post("/v1/worker/outcomes", &json!({"outcomes": items}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    answer["results"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_batch_of_outcomes_is_fenced_item_by_item() {
    let app = no_workers().await;
    for i in 0..4 {
        app.submit_ok(&format!("k{i}"), &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
            .await;
    }
    let tasks = app.claim("sleep", 4).await;
    assert_eq!(tasks.len(), 4);
    let item = |t: &Value, outcome: &str| json!({"operation_id": t["operation_id"], "lease_token": t["lease_token"], "outcome": outcome});
    let mut fail = item(&tasks[1], "fail");
    fail["error"] = json!({"code": "boom", "message": "it broke"});
    let mut beat = item(&tasks[2], "heartbeat");
    beat["progress"] = json!({"completed_units": 3, "total_units": 10});
    let mut forged = item(&tasks[3], "complete");
    forged["lease_token"] = json!("forged");
    let mut misplaced = item(&tasks[3], "heartbeat");
    misplaced["result"] = json!(1);
    let mut done = item(&tasks[0], "complete");
    done["result"] = json!({"rows": 1});
    done["progress"] = json!({"completed_units": 10, "total_units": 10});
    let results = outcomes(
        &app,
        json!([done, fail, beat, forged, misplaced, item(&tasks[3], "paused"), {"operation_id": "op_nope", "lease_token": "x", "outcome": "cancelled"}]),
    )
    .await;
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, vec![200, 200, 200, 409, 400, 409, 400]);
    // A pause nobody asked for is refused, and leaves the lease alone.
    assert_eq!(results[5]["problem"]["code"], "intent_conflict");
    assert_eq!(results[0]["state"], "succeeded");
    assert_eq!(results[1]["state"], "failed");
    assert_eq!(results[2]["cancel_requested"], false);
    assert!(results[2]["lease_expires_at"].is_string());
    assert_eq!(results[3]["problem"]["code"], "lease_lost");
    let op = app.get_operation(tasks[0]["operation_id"].as_str().unwrap()).await;
    assert_eq!(op["result"]["value"]["rows"], 1);
    assert_eq!(op["progress"]["completed_units"], 10.0);
    let beaten = app.get_operation(tasks[2]["operation_id"].as_str().unwrap()).await;
    assert_eq!(beaten["progress"]["completed_units"], 3.0);
    // The forged and refused items harmed nothing: the holder completes.
    let last = outcomes(&app, json!([item(&tasks[3], "complete")])).await;
    assert_eq!(last[0]["status"], 200);
    // Only workers may report.
    let response = app
        .request(Method::POST, "/v1/worker/outcomes", &app.client_key)
        .json(&json!({"outcomes": [item(&tasks[3], "complete")]}))
        .send()
        .await
        .unwrap();
    problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    let empty = app.worker_post("/v1/worker/outcomes", &json!({"outcomes": []})).await;
    problem(empty, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.shutdown().await;
}

/// A batch of outcomes past 1,000 items, past the body limit or cut short is
/// refused whole, and nothing in it applies: the lease holder still reports.
#[tokio::test]
async fn bad_batches_of_outcomes_are_refused_whole() {
    let app = no_workers().await;
    app.submit_ok("k", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let task = app.claim("sleep", 1).await.remove(0);
    let complete =
        json!({"operation_id": task["operation_id"], "lease_token": task["lease_token"], "outcome": "complete"});
    let too_many: Vec<Value> = (0..1001).map(|_| complete.clone()).collect();
    let response = app
        .worker_post("/v1/worker/outcomes", &json!({"outcomes": too_many}))
        .await;
    problem(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    // Larger than the body limit (1 MiB in tests), as schemathesis once sent.
    let mut huge = complete.clone();
    huge["result"] = json!({"pad": "x".repeat(2 << 20)});
    let response = app
        .worker_post("/v1/worker/outcomes", &json!({"outcomes": [huge]}))
        .await;
    problem(response, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let cut = app
        .request(Method::POST, "/v1/worker/outcomes", &app.worker_key)
        .header("content-type", "application/json")
        .body(format!("{{\"outcomes\": [{complete}"))
        .send()
        .await
        .unwrap();
    problem(cut, StatusCode::BAD_REQUEST, "invalid_request").await;
    let unknown = app
        .worker_post("/v1/worker/outcomes", &json!({"outcomes": [complete], "extra": 1}))
        .await;
    problem(unknown, StatusCode::BAD_REQUEST, "invalid_request").await;
    let op = app.get_operation(task["operation_id"].as_str().unwrap()).await;
    assert_eq!(op["state"], "running", "no refused batch applied its outcome");
    let last = outcomes(&app, json!([complete])).await;
    assert_eq!(last[0]["status"], 200);
    assert_eq!(last[0]["state"], "succeeded");
    app.shutdown().await;
}

/// The built-in `sleep` of ten steps that ends within the progress
/// interval stores no progress change of its own: created, started,
/// succeeded, and the final progress rides the last one.
#[tokio::test]
async fn a_short_task_stores_its_progress_only_with_its_outcome() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "short",
            &json!({"kind": "sleep", "input": {"duration_ms": 0, "steps": 10}}),
        )
        .await;
    let id = op["id"].as_str().unwrap();
    let done = app.wait_for_state(id, "succeeded").await;
    assert_eq!(done["progress"]["completed_units"], 10.0);
    let history: Value = app
        .request(Method::GET, &format!("/v1/operations/{id}/history"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["created", "started", "succeeded"]);
    app.shutdown().await;
}

/// A paused kind refuses its items with `503 temporarily_unavailable`
/// (retryable), and the batch's other kinds are accepted.
#[tokio::test]
async fn a_paused_kind_refuses_only_its_own_items() {
    let app = no_workers().await;
    app.store.accepting_pause(Some("sleep".into()), true).await.unwrap();
    let results = batch_ok(
        &app,
        &json!({"operations": [
            {"idempotency_key": "s", "kind": "sleep", "input": {"duration_ms": 1}},
            {"idempotency_key": "e", "kind": "export", "input": {"rows": 1}},
        ]}),
    )
    .await;
    assert_eq!(results[0]["status"], 503);
    assert_eq!(results[0]["problem"]["code"], "temporarily_unavailable");
    assert_eq!(results[0]["problem"]["retryable"], true);
    assert_eq!(results[1]["status"], 202);
    app.shutdown().await;
}

/// Replaying an operation that has ended answers `200`, as a single
/// submission's replay does.
#[tokio::test]
async fn a_replayed_item_of_an_ended_operation_answers_200() {
    let app = no_workers().await;
    let body = json!({"operations": [{"idempotency_key": "k", "kind": "sleep", "input": {"duration_ms": 1}}]});
    let first = batch_ok(&app, &body).await;
    let id = first[0]["operation"]["id"].as_str().unwrap().to_owned();
    let cancel = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    let again = batch_ok(&app, &body).await;
    assert_eq!(again[0]["status"], 200);
    assert_eq!(again[0]["replayed"], true);
    assert_eq!(again[0]["operation"]["state"], "cancelled");
    app.shutdown().await;
}
