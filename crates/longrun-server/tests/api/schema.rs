//! The OpenAPI document states every rule the server enforces, and the
//! server accepts every spelling the document allows: the cases schemathesis
//! (scripts/api-conformance, `--checks all`) found, pinned here.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, TestApp, problem, spawn_app_with};

async fn app() -> TestApp {
    spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn whole_numbers_written_as_floats_are_whole_numbers() {
    let app = app().await;
    let op = app
        .submit_ok(
            "float-deadline",
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "deadline_seconds": 326.0}),
        )
        .await;
    assert!(op["deadline_at"].is_string());
    let fraction = app
        .submit(
            "fraction",
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "deadline_seconds": 326.5}),
        )
        .await;
    problem(fraction, StatusCode::BAD_REQUEST, "invalid_request").await;
    let patch = app
        .request(
            Method::PATCH,
            &format!("/v1/operations/{}", op["id"].as_str().unwrap()),
            &app.client_key,
        )
        .header("If-Match", "\"1\"")
        .json(&json!({"deadline_seconds": 600.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status(), StatusCode::OK);
    app.shutdown().await;
}

#[tokio::test]
async fn null_bodies_and_empty_conditions_mean_none() {
    let app = app().await;
    let op = app
        .submit_ok("nulls", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let path = format!("/v1/operations/{}", op["id"].as_str().unwrap());
    let read = app
        .request(Method::GET, &path, &app.client_key)
        .header("If-None-Match", "")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK, "an empty If-None-Match is no condition");
    let cancel = app
        .request(Method::PUT, &format!("{path}/cancellation"), &app.client_key)
        .header("Content-Type", "application/json")
        .header("If-Match", "")
        .body("null")
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK, "a null body is no body");
    app.shutdown().await;
}

#[tokio::test]
async fn nested_objects_must_be_objects_and_arrays_are_refused() {
    let app = app().await;
    let budget_as_array = app
        .submit(
            "array-budget",
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "budget": [5]}),
        )
        .await;
    problem(budget_as_array, StatusCode::BAD_REQUEST, "invalid_request").await;
    let zero_budget = app
        .submit(
            "zero-budget",
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "budget": {"max_cost_units": 0}}),
        )
        .await;
    problem(zero_budget, StatusCode::BAD_REQUEST, "invalid_request").await;

    app.submit_ok("work", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let task = app.claim("sleep", 1).await.remove(0);
    let beat = app
        .worker_post(
            &format!("/v1/worker/tasks/{}/heartbeat", task["operation_id"].as_str().unwrap()),
            &json!({"lease_token": task["lease_token"], "progress": [1, 2]}),
        )
        .await;
    problem(beat, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_malformed_outcome_refuses_only_itself() {
    let app = app().await;
    app.submit_ok("work", &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .await;
    let task = app.claim("sleep", 1).await.remove(0);
    let response = app
        .worker_post(
            "/v1/worker/outcomes",
            &json!({"outcomes": [
                {"operation_id": "op_x", "lease_token": "t", "outcome": "heartbeat", "progress": "half"},
                {"operation_id": task["operation_id"], "lease_token": task["lease_token"], "outcome": "complete"},
            ]}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["results"][0]["status"], 400);
    assert_eq!(body["results"][0]["operation_id"], "op_x");
    assert_eq!(body["results"][0]["problem"]["code"], "invalid_request");
    assert_eq!(body["results"][1]["status"], 200);
    assert_eq!(body["results"][1]["state"], "succeeded");
    let not_objects = app.worker_post("/v1/worker/outcomes", &json!({"outcomes": [1]})).await;
    problem(not_objects, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.shutdown().await;
}

#[tokio::test]
async fn page_tokens_are_what_the_document_says_and_any_such_token_pages() {
    let app = app().await;
    for i in 0..3 {
        app.submit_ok(&format!("p{i}"), &json!({"kind": "sleep", "input": {"duration_ms": 1}}))
            .await;
    }
    let list = |query: String| {
        let request = app.request(Method::GET, &format!("/v1/operations?{query}"), &app.client_key);
        async move { request.send().await.unwrap() }
    };
    let first: Value = list("page_size=2".into()).await.json().await.unwrap();
    let token = first["next_page_token"].as_str().unwrap().to_owned();
    let pattern_ok =
        !token.is_empty() && token.len() <= 12 && token.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    assert!(pattern_ok, "{token}");
    let second: Value = list(format!("page_size=2&page_token={token}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(second["operations"].as_array().unwrap().len(), 1);
    let anywhere: Value = list("page_token=zz".into()).await.json().await.unwrap();
    assert!(anywhere["operations"].is_array(), "any well-formed token is a position");
    problem(
        list("page_token=NOPE".into()).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn the_document_links_a_submission_to_its_operations_and_types_the_event_stream() {
    let app = app().await;
    let doc: Value = app
        .http
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let links = &doc["paths"]["/v1/operations"]["post"]["responses"]["202"]["links"];
    let read = links
        .as_object()
        .unwrap()
        .values()
        .find(|l| l["operationId"] == doc["paths"]["/v1/operations/{id}"]["get"]["operationId"])
        .expect("a link to GET /v1/operations/{id}");
    assert_eq!(read["parameters"]["id"], "$response.body#/id");
    assert!(links.as_object().unwrap().len() >= 8, "{links}");
    let event = &doc["paths"]["/v1/operations/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
        ["schema"];
    assert_eq!(
        event["properties"]["data"]["contentSchema"]["$ref"],
        "#/components/schemas/OperationBody"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                if parameter["in"] == "header" {
                    assert!(parameter["schema"]["type"].is_string(), "{method} {path}: {parameter}");
                }
            }
        }
    }
    app.shutdown().await;
}
