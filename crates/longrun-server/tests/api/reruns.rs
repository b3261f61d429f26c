//! `POST /v1/operations/{id}/reruns`: a new operation of the same kind and
//! input, linked both ways; the original is never changed.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, problem, spawn_app};

async fn rerun(app: &TestApp, id: &str, key: Option<&str>, body: Option<Value>) -> reqwest::Response {
    let mut request = app.request(Method::POST, &format!("/v1/operations/{id}/reruns"), &app.client_key);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn a_failed_operation_is_rerun_as_a_linked_chain_and_the_original_never_changes() {
    let app = spawn_app().await;
    let failing = json!({"kind": "sleep", "input": {"duration_ms": 1, "fail_with": "flaky"},
                         "labels": {"team": "billing"}, "deadline_seconds": 600});
    let first = app.submit_ok("original", &failing).await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    let failed = app.wait_for_state(&first_id, "failed").await;

    let mut chain = vec![first_id.clone()];
    for n in 1..=2 {
        let response = rerun(&app, chain.last().unwrap(), Some(&format!("rerun-{n}")), None).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let op: Value = response.json().await.unwrap();
        assert_eq!(op["rerun_of"], chain.last().unwrap().as_str());
        assert_eq!(op["kind"], "sleep");
        assert_eq!(
            op["labels"],
            json!({"team": "billing"}),
            "what is not overridden is the original's"
        );
        assert!(op["deadline_at"].is_string());
        let id = op["id"].as_str().unwrap().to_owned();
        // It ran the same input: it fails the same way.
        assert_eq!(app.wait_for_state(&id, "failed").await["error"]["code"], "flaky");
        chain.push(id);
    }
    let original = app.get_operation(&first_id).await;
    assert_eq!(original["reruns"], json!([chain[1]]));
    assert_eq!(original["version"], failed["version"], "the original is unchanged");
    assert_eq!(original["state"], "failed");
    let middle = app.get_operation(&chain[1]).await;
    assert_eq!(
        (middle["rerun_of"].clone(), middle["reruns"].clone()),
        (json!(chain[0]), json!([chain[2]]))
    );
    let last = app.get_operation(&chain[2]).await;
    assert!(last["reruns"].is_null(), "no re-runs, no member: {last}");
    let history: Value = app.get_json(&format!("/v1/operations/{first_id}/history")).await;
    assert_eq!(
        history["events"].as_array().unwrap().len(),
        3,
        "no event added to the original: {history}"
    );

    // The same re-run again (a client that timed out): the same operation.
    let again = rerun(&app, &chain[0], Some("rerun-1"), None).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap()["id"], chain[1].as_str());
    // The original submission's key on a re-run is another request: a conflict.
    let reused = rerun(&app, &chain[0], Some("original"), None).await;
    problem(reused, StatusCode::CONFLICT, "idempotency_key_reused").await;
    // Overrides.
    let overridden = rerun(
        &app,
        &chain[0],
        Some("rerun-overridden"),
        Some(json!({"labels": {"team": "ops"}, "deadline_seconds": 60})),
    )
    .await;
    assert_eq!(overridden.status(), StatusCode::ACCEPTED);
    assert_eq!(
        overridden.json::<Value>().await.unwrap()["labels"],
        json!({"team": "ops"})
    );
    app.shutdown().await;
}

#[tokio::test]
async fn reruns_are_refused_clearly() {
    let app = spawn_app().await;
    // A success drops its input (no --keep-inputs): nothing to re-run.
    let done = app
        .submit_ok("succeeds", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let done_id = done["id"].as_str().unwrap().to_owned();
    app.wait_for_state(&done_id, "succeeded").await;
    let gone = rerun(&app, &done_id, Some("k1"), None).await;
    let body = problem(gone, StatusCode::CONFLICT, "input_not_kept").await;
    assert_eq!(body["operation_id"], done_id.as_str());

    // A cancelled one keeps its input and can be re-run.
    let long = app
        .submit_ok("long", &json!({"kind": "sleep", "input": {"duration_ms": 3_600_000}}))
        .await;
    let long_id = long["id"].as_str().unwrap().to_owned();
    app.request(
        Method::PUT,
        &format!("/v1/operations/{long_id}/cancellation"),
        &app.client_key,
    )
    .send()
    .await
    .unwrap();
    app.wait_for_state(&long_id, "cancelled").await;
    assert_eq!(
        rerun(&app, &long_id, Some("k2"), None).await.status(),
        StatusCode::ACCEPTED
    );

    let other_tenant = app
        .request(
            Method::POST,
            &format!("/v1/operations/{long_id}/reruns"),
            &app.other_tenant_key,
        )
        .header("idempotency-key", "k3")
        .send()
        .await
        .unwrap();
    problem(other_tenant, StatusCode::NOT_FOUND, "not_found").await;
    problem(
        rerun(&app, "op_aaaaaaaaaaaaaaaaaaaaaaaaaa", Some("k4"), None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        rerun(&app, &long_id, None, None).await,
        StatusCode::BAD_REQUEST,
        "idempotency_key_required",
    )
    .await;
    problem(
        rerun(&app, &long_id, Some("k5"), Some(json!({"kind": "export"}))).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    // From the original's last checkpoint (from the start if it saved none).
    let from_checkpoint = rerun(&app, &long_id, Some("k6"), Some(json!({"from_checkpoint": true}))).await;
    assert_eq!(from_checkpoint.status(), StatusCode::ACCEPTED);
    let from_checkpoint: Value = from_checkpoint.json().await.unwrap();
    assert_eq!(from_checkpoint["rerun_of"], long_id.as_str());
    // The same key without from_checkpoint is another request.
    problem(
        rerun(&app, &long_id, Some("k6"), None).await,
        StatusCode::CONFLICT,
        "idempotency_key_reused",
    )
    .await;
    let worker = app
        .request(
            Method::POST,
            &format!("/v1/operations/{long_id}/reruns"),
            &app.worker_key,
        )
        .header("idempotency-key", "k7")
        .send()
        .await
        .unwrap();
    problem(worker, StatusCode::FORBIDDEN, "forbidden").await;
    app.shutdown().await;
}
