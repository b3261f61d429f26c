//! The framework's own rejections are problems too, with a request id.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{Options, problem, spawn_app, spawn_app_with};

#[tokio::test]
async fn unknown_routes_and_wrong_methods() {
    let app = spawn_app().await;
    let unknown = app
        .request(Method::GET, "/v1/nothing-here", &app.client_key)
        .send()
        .await
        .unwrap();
    problem(unknown, StatusCode::NOT_FOUND, "not_found").await;
    let wrong = app
        .request(Method::PATCH, "/v1/operations", &app.client_key)
        .send()
        .await
        .unwrap();
    assert!(wrong.headers().get("allow").is_some());
    problem(wrong, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    app.shutdown().await;
}

#[tokio::test]
async fn malformed_bodies_wrong_types_and_oversized_requests() {
    let app = spawn_app_with(Options {
        max_body_bytes: 4096,
        ..Options::default()
    })
    .await;
    let post = |content_type: Option<&str>, body: Vec<u8>| {
        let mut request = app
            .request(Method::POST, "/v1/operations", &app.client_key)
            .header("Idempotency-Key", "errors");
        if let Some(ct) = content_type {
            request = request.header("Content-Type", ct);
        }
        request.body(body).send()
    };
    problem(
        post(Some("application/json"), b"{\"kind\": ".to_vec()).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        post(Some("application/json"), b"".to_vec()).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        post(Some("application/json"), vec![0xff, 0xfe]).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        post(Some("text/plain"), b"{}".to_vec()).await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    )
    .await;
    problem(
        post(None, b"{}".to_vec()).await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    )
    .await;
    let huge = json!({"kind": "sleep", "input": {"pad": "x".repeat(8192)}})
        .to_string()
        .into_bytes();
    problem(
        post(Some("application/json"), huge).await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    // A charset parameter is fine.
    let ok = post(
        Some("application/json; charset=utf-8"),
        json!({"kind": "sleep", "input": {"duration_ms": 1}})
            .to_string()
            .into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), StatusCode::ACCEPTED);
    app.shutdown().await;
}

#[tokio::test]
async fn every_response_has_a_request_id() {
    let app = spawn_app().await;
    let mut seen = std::collections::HashSet::new();
    for path in ["/healthz", "/readyz", "/v1/operations", "/nope"] {
        let response = app.request(Method::GET, path, &app.client_key).send().await.unwrap();
        let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(id.starts_with("req_"), "{id}");
        assert!(seen.insert(id), "request ids are unique");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn the_openapi_document_covers_every_endpoint_header_and_problem_code() {
    let app = spawn_app().await;
    let response = app.http.get(app.url("/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc: serde_json::Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/operations", "post"),
        ("/v1/operations", "get"),
        ("/v1/operations/{id}", "get"),
        ("/v1/operations/{id}", "patch"),
        ("/v1/operations/{id}", "delete"),
        ("/v1/operations/{id}/cancellation", "put"),
        ("/v1/operations/{id}/cancellation", "get"),
        ("/v1/operations/{id}/history", "get"),
        ("/v1/operations/{id}/events", "get"),
        ("/v1/operations/{id}/deliveries", "get"),
        ("/v1/operations/{id}/result", "get"),
        ("/v1/results/{id}/content", "get"),
        ("/v1/worker/claims", "post"),
        ("/v1/worker/tasks/{id}/heartbeat", "post"),
        ("/v1/worker/tasks/{id}/complete", "post"),
        ("/v1/worker/tasks/{id}/fail", "post"),
        ("/v1/worker/tasks/{id}/cancelled", "post"),
        ("/v1/worker/tasks/{id}/artifact", "put"),
        ("/healthz", "get"),
        ("/readyz", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is not documented"
        );
    }
    let text = doc.to_string();
    for header in [
        "Idempotency-Key",
        "Retry-After",
        "ETag",
        "If-None-Match",
        "Prefer",
        "Location",
        "Idempotent-Replayed",
        "If-Match",
        "Last-Event-ID",
        "Range",
    ] {
        assert!(
            text.contains(&format!("\"{header}\"")),
            "header {header} is not documented"
        );
    }
    let codes = doc["components"]["schemas"]["ProblemCode"]["enum"].as_array().unwrap();
    for code in [
        "invalid_request",
        "idempotency_key_reused",
        "lease_lost",
        "result_expired",
        "quota_exceeded",
        "temporarily_unavailable",
    ] {
        assert!(codes.iter().any(|c| c == code), "problem code {code} is not documented");
    }
    app.shutdown().await;
}
