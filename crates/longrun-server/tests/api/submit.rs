//! Submission: the accepted shape, running to an end, and every synchronous
//! refusal creating nothing.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{problem, sleep_body, spawn_app};

#[tokio::test]
async fn a_submission_is_accepted_with_location_retry_after_and_etag() {
    let app = spawn_app().await;
    let response = app
        .submit("first", &json!({"kind": "sleep", "input": {"duration_ms": 10}, "labels": {"team": "billing"}, "deadline_seconds": 600, "budget": {"max_cost_units": 5}}))
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let headers = response.headers().clone();
    let op: Value = response.json().await.unwrap();
    let id = op["id"].as_str().unwrap();
    assert!(id.starts_with("op_") && id.len() >= 3 + 20, "{id}");
    assert_eq!(headers["location"], format!("/v1/operations/{id}").as_str());
    assert_eq!(headers["etag"], "\"1\"");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert!(headers.get("idempotent-replayed").is_none());
    assert!(headers.get("x-request-id").is_some());

    for field in [
        "id",
        "kind",
        "state",
        "terminal",
        "cancel_requested",
        "version",
        "attempt",
        "created_at",
        "started_at",
        "completed_at",
        "updated_at",
        "deadline_at",
        "progress",
        "cost",
        "result",
        "error",
        "labels",
        "expires_at",
        "links",
    ] {
        assert!(op.get(field).is_some(), "representation lacks {field}: {op}");
    }
    assert_eq!(
        (op["kind"].as_str(), op["state"].as_str(), op["version"].as_i64()),
        (Some("sleep"), Some("queued"), Some(1))
    );
    assert_eq!(op["terminal"], false);
    assert_eq!(op["labels"], json!({"team": "billing"}));
    assert_eq!(op["cost"], json!({"units": 0.0, "max_units": 5.0}));
    assert!(op["deadline_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(op["links"]["self"], format!("/v1/operations/{id}"));
    assert_eq!(op["links"]["cancel"], format!("/v1/operations/{id}/cancellation"));
    assert_eq!(op["links"]["events"], format!("/v1/operations/{id}/events"));
    app.shutdown().await;
}

#[tokio::test]
async fn sleep_runs_queued_to_running_to_succeeded() {
    let app = spawn_app().await;
    let op = app.submit_ok("run", &sleep_body(50)).await;
    let done = app.wait_for_state(op["id"].as_str().unwrap(), "succeeded").await;
    assert_eq!(done["terminal"], true);
    assert_eq!(done["attempt"], 1);
    assert_eq!(done["result"], json!({"value": {"slept_ms": 50}}));
    assert_eq!(done["error"], Value::Null);
    assert_eq!(done["progress"]["completed_units"], 2.0);
    assert_eq!(done["progress"]["total_units"], 2.0);
    assert_eq!(done["progress"]["unit"], "steps");
    assert!(done["started_at"].is_string() && done["completed_at"].is_string() && done["expires_at"].is_string());
    app.shutdown().await;
}

#[tokio::test]
async fn sleep_with_fail_with_ends_failed_with_that_code() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "fail",
            &json!({"kind": "sleep", "input": {"duration_ms": 1, "steps": 1, "fail_with": "boom"}}),
        )
        .await;
    let done = app.wait_for_state(op["id"].as_str().unwrap(), "failed").await;
    assert_eq!(done["error"]["code"], "boom");
    assert_eq!(done["result"], Value::Null);
    app.shutdown().await;
}

#[tokio::test]
async fn synchronous_refusals_have_their_codes_and_create_nothing() {
    let app = spawn_app().await;
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!({"kind": "teleport"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_kind",
        ),
        (
            json!({"kind": "Not A Kind"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": -5}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5, "bogus": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "callback": {"url": "http://client.example/hook"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_callback_url",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "callback": {"url": "https://127.0.0.1/hook"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_callback_url",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "callback": {"url": "https://2130706433/hook"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_callback_url",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "callback": {"url": "not a url"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_callback_url",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "labels": {"Bad Key": "x"}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "labels": {"k": "v".repeat(257)}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "labels": {"k": 1}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "deadline_seconds": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "deadline_seconds": 99_999_999}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "budget": {"max_cost_units": -1}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"kind": "sleep", "input": {"duration_ms": 5}, "surprise": true}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"input": {"duration_ms": 5}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (json!(["kind", "sleep"]), StatusCode::BAD_REQUEST, "invalid_request"),
        (
            json!({"kind": "sleep", "input": {"blob": "x".repeat(300 * 1024)}}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (i, (body, status, code)) in cases.into_iter().enumerate() {
        let response = app.submit(&format!("refused-{i}"), &body).await;
        assert_eq!(response.status(), status, "case {i}: {body}");
        problem(response, status, code).await;
    }
    assert_eq!(
        app.operation_count("acme").await,
        0,
        "no refused submission created anything"
    );

    // The same key is still free for a valid request afterwards.
    let ok = app.submit("refused-0", &sleep_body(1)).await;
    assert_eq!(ok.status(), StatusCode::ACCEPTED);
    app.shutdown().await;
}

#[tokio::test]
async fn worker_and_foreign_keys_cannot_submit_as_a_client() {
    let app = spawn_app().await;
    let response = app
        .request(Method::POST, "/v1/operations", &app.worker_key)
        .header("Idempotency-Key", "w")
        .json(&sleep_body(1))
        .send()
        .await
        .unwrap();
    problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(app.operation_count("acme").await, 0);
    app.shutdown().await;
}

/// Ids changed shape (a millisecond prefix, 29 characters): an operation
/// stored under an id of the older shape (26 characters) is still found by
/// URL, runs to its end and keeps its history.
#[tokio::test]
async fn an_operation_with_an_id_of_the_older_shape_is_still_served() {
    let app = spawn_app().await;
    let old = format!("op_{}", longrun_core::id::random_base32::<16>());
    assert_eq!(old.len(), 3 + 26);
    let id = longrun_core::Id::parse(longrun_core::IdKind::Operation, &old).expect("the older shape parses");
    app.store
        .operation_accept(longrun_store::AcceptParams {
            id,
            not_before: None,
            priority: longrun_store::PRIORITY_DEFAULT,
            now: longrun_core::Clock::now(&longrun_core::SystemClock),
            ..longrun_store::conformance::accept_params("acme", "sleep", None, json!({"duration_ms": 0}))
        })
        .await
        .unwrap();
    let op = app.wait_for_state(&old, "succeeded").await;
    assert_eq!(op["id"], old.as_str());
    let history = app.get_json(&format!("/v1/operations/{old}/history")).await;
    let versions: Vec<i64> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, (1..=op["version"].as_i64().unwrap()).collect::<Vec<_>>());
}
