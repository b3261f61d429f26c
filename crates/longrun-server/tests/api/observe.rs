//! Reading operations: ETags and 304, lists with filters and cursors, history,
//! health.

use std::collections::HashSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, problem, sleep_body, spawn_app, spawn_app_with};

#[tokio::test]
async fn etag_and_if_none_match_give_304_until_the_version_changes() {
    let app = spawn_app().await;
    let op = app.submit_ok("etag", &sleep_body(30)).await;
    let id = op["id"].as_str().unwrap();
    let done = app.wait_for_state(id, "succeeded").await;
    let version = done["version"].as_i64().unwrap();
    let path = format!("/v1/operations/{id}");

    for tag in [
        format!("\"{version}\""),
        format!("W/\"{version}\""),
        format!("\"1\", \"{version}\""),
        "*".into(),
    ] {
        let response = app
            .request(Method::GET, &path, &app.client_key)
            .header("If-None-Match", &tag)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{tag}");
        assert_eq!(response.headers()["etag"], format!("\"{version}\"").as_str());
        assert!(
            response.headers().get("retry-after").is_none(),
            "terminal operations need no polling"
        );
        assert!(response.bytes().await.unwrap().is_empty());
    }
    let stale = app
        .request(Method::GET, &path, &app.client_key)
        .header("If-None-Match", "\"1\"")
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), StatusCode::OK);
    let bad = app
        .request(Method::GET, &path, &app.client_key)
        .header("If-None-Match", "nonsense")
        .send()
        .await
        .unwrap();
    problem(bad, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.shutdown().await;
}

#[tokio::test]
async fn non_terminal_representations_carry_retry_after() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("ra", &sleep_body(1)).await;
    let response = app
        .request(
            Method::GET,
            &format!("/v1/operations/{}", op["id"].as_str().unwrap()),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    let seconds: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&seconds));
    app.shutdown().await;
}

#[tokio::test]
async fn lists_are_newest_first_paginated_and_filtered() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let team = if i % 2 == 0 { "red" } else { "blue" };
        let op = app
            .submit_ok(
                &format!("list-{i}"),
                &json!({"kind": "sleep", "input": {"duration_ms": i}, "labels": {"team": team}}),
            )
            .await;
        ids.push(op["id"].as_str().unwrap().to_owned());
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/v1/operations?page_size=3".to_owned();
        if let Some(t) = &token {
            path.push_str(&format!("&page_token={t}"));
        }
        let page: Value = app
            .request(Method::GET, &path, &app.client_key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pages += 1;
        for op in page["operations"].as_array().unwrap() {
            seen.push(op["id"].as_str().unwrap().to_owned());
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    assert_eq!(
        seen.iter().collect::<HashSet<_>>().len(),
        7,
        "no duplicates across pages"
    );

    let blue: Value = app
        .request(Method::GET, "/v1/operations?label=team:blue", &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(blue["operations"].as_array().unwrap().len(), 3);
    let queued: Value = app
        .request(Method::GET, "/v1/operations?state=queued&kind=sleep", &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(queued["operations"].as_array().unwrap().len(), 7);
    let running: Value = app
        .request(Method::GET, "/v1/operations?state=running", &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(running, json!({"operations": [], "next_page_token": null}));

    for bad in [
        "page_size=101",
        "page_size=-1",
        "page_size=many",
        "state=done",
        "kind=Bad%20Kind",
        "label=team",
        "page_token=garbage!",
        "colour=blue",
    ] {
        let response = app
            .request(Method::GET, &format!("/v1/operations?{bad}"), &app.client_key)
            .send()
            .await
            .unwrap();
        problem(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let hundred = app
        .request(Method::GET, "/v1/operations?page_size=100", &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(hundred.status(), StatusCode::OK);
    app.shutdown().await;
}

#[tokio::test]
async fn history_is_oldest_first_one_event_per_version() {
    let app = spawn_app().await;
    let op = app.submit_ok("history", &sleep_body(20)).await;
    let id = op["id"].as_str().unwrap();
    let done = app.wait_for_state(id, "succeeded").await;
    let history: Value = app
        .request(Method::GET, &format!("/v1/operations/{id}/history"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = history["events"].as_array().unwrap();
    let versions: Vec<i64> = events.iter().map(|e| e["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, (1..=done["version"].as_i64().unwrap()).collect::<Vec<_>>());
    assert_eq!(events.first().unwrap()["type"], "created");
    assert_eq!(events.first().unwrap()["state"], "queued");
    assert_eq!(events.last().unwrap()["type"], "succeeded");
    assert!(
        events
            .iter()
            .all(|e| e["at"].as_str().is_some_and(|at| at.ends_with('Z')))
    );
    app.shutdown().await;
}

#[tokio::test]
async fn health_and_readiness() {
    let app = spawn_app().await;
    let health: Value = app
        .http
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    assert!(ready.headers().get("x-request-id").is_some());
    app.shutdown().await;
}
