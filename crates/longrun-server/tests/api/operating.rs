//! The operator's view (docs/api.md §7): metrics and pausing acceptance.

use longrun_core::apikey::Role;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{Options, create_key, problem, sleep_body, spawn_app, spawn_app_with};

#[tokio::test]
async fn metrics_need_an_admin_key_and_show_the_life_of_operations() {
    let app = spawn_app().await;
    let admin = create_key(app.store.as_ref(), "acme", Role::Admin).await;
    let op = app.submit_ok("metrics", &sleep_body(5)).await;
    app.wait_for_state(op["id"].as_str().unwrap(), "succeeded").await;
    let queued = app
        .submit_ok(
            "metrics-cancel",
            &json!({"kind": "sleep", "input": {"duration_ms": 60000, "steps": 60}}),
        )
        .await;
    app.wait_for_state(queued["id"].as_str().unwrap(), "running").await;

    let refused = app
        .request(Method::GET, "/metrics", &app.client_key)
        .send()
        .await
        .unwrap();
    problem(refused, StatusCode::FORBIDDEN, "forbidden").await;
    let anonymous = app.http.get(app.url("/metrics")).send().await.unwrap();
    problem(anonymous, StatusCode::UNAUTHORIZED, "unauthenticated").await;

    let response = app.request(Method::GET, "/metrics", &admin).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = response.text().await.unwrap();
    for series in [
        "longrun_operations_accepted_total{kind=\"sleep\"}",
        "longrun_operation_transitions_total{kind=\"sleep\",to=\"running\"}",
        "longrun_operation_transitions_total{kind=\"sleep\",to=\"succeeded\"}",
        "longrun_queue_to_start_seconds_bucket",
        "longrun_execution_duration_seconds_bucket",
        "longrun_oldest_active_age_seconds{kind=\"sleep\",state=\"running\"}",
        "longrun_retention_backlog",
        "longrun_webhooks_due",
        "longrun_http_responses_total",
        // Request times get buckets of their own, down to half a millisecond.
        "longrun_http_request_duration_seconds_bucket{le=\"0.0005\"}",
        "longrun_http_request_duration_seconds_bucket{le=\"60\"}",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert!(!text.contains("op_"), "no operation id is ever a label");
    app.shutdown().await;
}

#[tokio::test]
async fn pausing_acceptance_refuses_submissions_while_observation_goes_on() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let existing = app.submit_ok("before-pause", &sleep_body(1)).await;

    app.store.accepting_pause(None, true).await.unwrap();
    let refused = app.submit("during-pause", &sleep_body(1)).await;
    assert!(refused.headers().get("retry-after").is_some());
    let body = problem(refused, StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable").await;
    assert_eq!(body["retryable"], true);
    assert_eq!(
        app.get_operation(existing["id"].as_str().unwrap()).await["state"],
        "queued",
        "reads go on"
    );
    let cancel = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{}/cancellation", existing["id"].as_str().unwrap()),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK, "cancellation goes on");

    // Per kind: only that kind is refused.
    app.store.accepting_pause(None, false).await.unwrap();
    app.store.accepting_pause(Some("sleep".into()), true).await.unwrap();
    problem(
        app.submit("sleep-paused", &sleep_body(1)).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
    )
    .await;
    let other = app
        .submit("export-allowed", &json!({"kind": "export", "input": {"rows": 1}}))
        .await;
    assert_eq!(other.status(), StatusCode::ACCEPTED);
    app.store.accepting_pause(Some("sleep".into()), false).await.unwrap();
    assert_eq!(
        app.submit("after-resume", &sleep_body(1)).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        app.store.accepting_pauses().await.unwrap(),
        Vec::<Option<String>>::new()
    );
    app.shutdown().await;
}

/// SQLite serves one node: a second `serve` on the same database is refused
/// (rather than two processes each believing they own the leases), and the
/// database is free again once the first has stopped.
#[tokio::test]
async fn a_second_server_on_the_same_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = || {
        longrun_server::ServeOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            longrun_store::SqliteConfig::new(dir.path().join("longrun.db")),
        )
    };
    let first = longrun_server::start(options()).await.unwrap();
    let refused = longrun_server::start(options())
        .await
        .err()
        .expect("the second start is refused");
    assert!(
        format!("{refused:#}").contains("another `longrun serve` is using"),
        "{refused:#}"
    );
    first.shutdown().await.unwrap();
    let again = longrun_server::start(options()).await.unwrap();
    again.shutdown().await.unwrap();
}
