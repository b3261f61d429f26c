//! Cancellation (docs/api.md §3 "Cancelling").

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, problem, sleep_body, spawn_app, spawn_app_with};

fn cancel_path(id: &str) -> String {
    format!("/v1/operations/{id}/cancellation")
}

#[tokio::test]
async fn queued_work_is_cancelled_at_once_and_repeats_change_nothing() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("cancel-queued", &sleep_body(10)).await;
    let id = op["id"].as_str().unwrap();

    let response = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .json(&json!({"reason": "not needed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("retry-after").is_none());
    let cancelled: Value = response.json().await.unwrap();
    assert_eq!(
        (cancelled["state"].as_str(), cancelled["version"].as_i64()),
        (Some("cancelled"), Some(2))
    );
    assert_eq!(cancelled["cancel_requested"], true);
    assert_eq!(cancelled["terminal"], true);

    for method in [Method::PUT, Method::DELETE] {
        let path = if method == Method::PUT {
            cancel_path(id)
        } else {
            format!("/v1/operations/{id}")
        };
        let again = app.request(method, &path, &app.client_key).send().await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        let again: Value = again.json().await.unwrap();
        assert_eq!(again, cancelled, "a repeated cancel changes nothing");
    }

    let record: Value = app
        .request(Method::GET, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["requested"], true);
    assert_eq!(record["reason"], "not needed");
    assert_eq!(record["outcome"], "cancelled");
    assert!(record["requested_by"].as_str().unwrap().starts_with("key_"));
    assert!(record["requested_at"].as_str().unwrap().ends_with('Z'));
    app.shutdown().await;
}

#[tokio::test]
async fn the_delete_alias_cancels_too() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("delete-alias", &sleep_body(10)).await;
    let id = op["id"].as_str().unwrap();
    let response = app
        .request(Method::DELETE, &format!("/v1/operations/{id}"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "cancelled");
    app.shutdown().await;
}

#[tokio::test]
async fn a_running_sleep_stops_at_its_next_step_and_ends_cancelled() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "cancel-running",
            &json!({"kind": "sleep", "input": {"duration_ms": 600_000, "steps": 600}}),
        )
        .await;
    let id = op["id"].as_str().unwrap();
    app.wait_for_state(id, "running").await;

    let response = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let requested: Value = response.json().await.unwrap();
    assert_eq!(
        (requested["state"].as_str(), requested["cancel_requested"].as_bool()),
        (Some("running"), Some(true))
    );

    let repeat = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap();
    assert!(
        matches!(repeat.status(), StatusCode::ACCEPTED | StatusCode::OK),
        "repeat cancels are idempotent"
    );

    let done = app.wait_for_state(id, "cancelled").await;
    assert_eq!(done["error"], Value::Null);
    assert!(
        done["progress"]["completed_units"].as_f64().unwrap_or(0.0) < 600.0,
        "it stopped early"
    );
    let record: Value = app
        .request(Method::GET, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["outcome"], "cancelled");
    app.shutdown().await;
}

#[tokio::test]
async fn cancelling_finished_work_answers_200_unchanged() {
    let app = spawn_app().await;
    let op = app.submit_ok("cancel-done", &sleep_body(5)).await;
    let id = op["id"].as_str().unwrap();
    let done = app.wait_for_state(id, "succeeded").await;
    let response = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, done);
    let record: Value = app
        .request(Method::GET, &cancel_path(id), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (record["requested"].as_bool(), record["outcome"].clone()),
        (Some(false), Value::Null)
    );
    app.shutdown().await;
}

#[tokio::test]
async fn if_match_is_honoured_and_bad_bodies_are_refused() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("cancel-if-match", &sleep_body(10)).await;
    let id = op["id"].as_str().unwrap();

    let stale = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .header("If-Match", "\"9\"")
        .send()
        .await
        .unwrap();
    problem(stale, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    let long_reason = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .json(&json!({"reason": "x".repeat(1025)}))
        .send()
        .await
        .unwrap();
    problem(long_reason, StatusCode::BAD_REQUEST, "invalid_request").await;
    let malformed = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    problem(malformed, StatusCode::BAD_REQUEST, "invalid_request").await;
    let wrong_type = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .header("Content-Type", "text/plain")
        .body("please")
        .send()
        .await
        .unwrap();
    problem(wrong_type, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type").await;
    assert_eq!(
        app.get_operation(id).await["state"],
        "queued",
        "refused cancels changed nothing"
    );

    let fresh = app
        .request(Method::PUT, &cancel_path(id), &app.client_key)
        .header("If-Match", "\"1\"")
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), StatusCode::OK);
    app.shutdown().await;
}
