//! Authentication and ownership (docs/api.md §2).

use longrun_core::apikey::Role;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::{Options, create_key, problem, sleep_body, spawn_app_with};

fn queued_only() -> Options {
    Options {
        builtin_workers: false,
        ..Options::default()
    }
}

#[tokio::test]
async fn requests_without_a_valid_key_are_unauthenticated() {
    let app = spawn_app_with(queued_only()).await;
    let valid_id_wrong_secret = {
        let (head, _) = app.client_key.rsplit_once('_').unwrap();
        format!("{head}_{}", "a".repeat(52))
    };
    let bad_headers: Vec<Option<String>> = vec![
        None,
        Some("Basic dXNlcjpwYXNz".into()),
        Some("Bearer".into()),
        Some("Bearer not-a-key".into()),
        Some(format!("Bearer lr_{}_{}", "a".repeat(26), "b".repeat(52))),
        Some(format!("Bearer {valid_id_wrong_secret}")),
    ];
    for header in bad_headers {
        let mut request = app.http.get(app.url("/v1/operations"));
        if let Some(h) = &header {
            request = request.header("Authorization", h);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.headers().get("www-authenticate").map(|v| v.to_str().unwrap()),
            Some("Bearer")
        );
        problem(response, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    }
    // The scheme is case-insensitive.
    let ok = app
        .http
        .get(app.url("/v1/operations"))
        .header("Authorization", format!("bearer {}", app.client_key))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    app.shutdown().await;
}

#[tokio::test]
async fn a_revoked_key_stops_working() {
    let app = spawn_app_with(queued_only()).await;
    let key = create_key(app.store.as_ref(), "acme", Role::Client).await;
    let ok = app.request(Method::GET, "/v1/operations", &key).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let id = longrun_core::apikey::PresentedKey::parse(&key).unwrap().id;
    assert!(app.store.api_key_revoke(&id, longrun_core::Timestamp(1)).await.unwrap());
    let refused = app.request(Method::GET, "/v1/operations", &key).send().await.unwrap();
    problem(refused, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_worker_key_cannot_use_the_client_api() {
    let app = spawn_app_with(queued_only()).await;
    for (method, path) in [
        (Method::GET, "/v1/operations"),
        (Method::GET, "/v1/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ] {
        let response = app.request(method, path, &app.worker_key).send().await.unwrap();
        problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    }
    app.shutdown().await;
}

/// The body of a 404 without its request id.
async fn not_found_body(response: reqwest::Response) -> Value {
    let mut body = problem(response, StatusCode::NOT_FOUND, "not_found").await;
    body.as_object_mut().unwrap().remove("request_id");
    body
}

#[tokio::test]
async fn another_tenants_id_is_indistinguishable_from_a_missing_one() {
    let app = spawn_app_with(queued_only()).await;
    let theirs = app
        .request(Method::POST, "/v1/operations", &app.other_tenant_key)
        .header("Idempotency-Key", "secret-plans")
        .json(&sleep_body(1))
        .send()
        .await
        .unwrap();
    let theirs: Value = theirs.json().await.unwrap();
    let foreign = theirs["id"].as_str().unwrap().to_owned();
    let missing = longrun_core::Id::generate(longrun_core::IdKind::Operation).to_string();
    let malformed = "op_nope".to_owned();

    let requests: Vec<(Method, String)> = vec![
        (Method::GET, "/v1/operations/{}".into()),
        (Method::GET, "/v1/operations/{}/history".into()),
        (Method::GET, "/v1/operations/{}/cancellation".into()),
        (Method::PUT, "/v1/operations/{}/cancellation".into()),
        (Method::DELETE, "/v1/operations/{}".into()),
    ];
    for (method, template) in requests {
        let mut bodies = Vec::new();
        for id in [&foreign, &missing, &malformed] {
            let path = template.replace("{}", id);
            let response = app
                .request(method.clone(), &path, &app.client_key)
                .send()
                .await
                .unwrap();
            bodies.push(not_found_body(response).await);
        }
        assert_eq!(bodies[0], bodies[1], "{method} {template}: foreign vs missing");
        assert_eq!(bodies[1], bodies[2], "{method} {template}: missing vs malformed");
    }
    // And the foreign operation was not touched by the cancel attempts.
    let still = app
        .request(Method::GET, &format!("/v1/operations/{foreign}"), &app.other_tenant_key)
        .send()
        .await
        .unwrap();
    let still: Value = still.json().await.unwrap();
    assert_eq!(
        (still["state"].as_str(), still["version"].as_i64()),
        (Some("queued"), Some(1))
    );
    let listed = app
        .request(Method::GET, "/v1/operations", &app.client_key)
        .send()
        .await
        .unwrap();
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(listed["operations"], serde_json::json!([]), "lists are per tenant");
    app.shutdown().await;
}
