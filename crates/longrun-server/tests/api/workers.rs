//! The remote worker protocol (docs/api.md §4) over real HTTP: claims, fenced
//! heartbeats and outcomes, the reaper, retries, cancellation races,
//! deadlines, budgets, intent changes, quotas and fairness. Leases and
//! deadlines expire by moving the server's manual clock, never by sleeping.

use std::time::Duration;

use longrun_store::{AcceptParams, TenantLimits};
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
    (app, clock)
}

async fn submit_kind(app: &TestApp, key: &str, kind: &str, extra: Value) -> String {
    let mut body = json!({"kind": kind, "input": {"n": key}});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let op = app.submit_ok(key, &body).await;
    op["id"].as_str().unwrap().to_owned()
}

fn task_path(task: &Value, action: &str) -> String {
    format!("/v1/worker/tasks/{}/{action}", task["operation_id"].as_str().unwrap())
}

async fn heartbeat(app: &TestApp, task: &Value, extra: Value) -> reqwest::Response {
    let mut body = json!({"lease_token": task["lease_token"]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    app.worker_post(&task_path(task, "heartbeat"), &body).await
}

async fn complete(app: &TestApp, task: &Value, result: Value) -> reqwest::Response {
    app.worker_post(
        &task_path(task, "complete"),
        &json!({"lease_token": task["lease_token"], "result": result}),
    )
    .await
}

#[tokio::test]
async fn a_task_is_claimed_reported_on_and_completed() {
    let app = spawn_app_with(Options::default()).await;
    app.declare_kind("thumbnail", false, 1).await;
    let id = submit_kind(
        &app,
        "t1",
        "thumbnail",
        json!({"deadline_seconds": 600, "budget": {"max_cost_units": 50}}),
    )
    .await;

    let tasks = app.claim("thumbnail", 5).await;
    assert_eq!(tasks.len(), 1);
    let task = &tasks[0];
    assert_eq!(task["operation_id"], id.as_str());
    assert_eq!(task["kind"], "thumbnail");
    assert_eq!(task["input"], json!({"n": "t1"}));
    assert_eq!(task["attempt"], 1);
    assert!(task["lease_token"].as_str().unwrap().len() >= 16);
    assert!(task["lease_expires_at"].as_str().unwrap().ends_with('Z'));
    assert!(task["deadline_at"].is_string());
    assert_eq!(task["budget"], json!({"max_cost_units": 50.0}));
    assert_eq!(app.get_operation(&id).await["state"], "running");

    let ack = heartbeat(
        &app,
        task,
        json!({"progress": {"completed_units": 3, "total_units": 10, "unit": "pages", "phase": "RENDERING",
                             "details": {"first_page": "ok"}}, "cost_units": 2.5}),
    )
    .await;
    assert_eq!(ack.status(), StatusCode::OK);
    let ack: Value = ack.json().await.unwrap();
    assert_eq!(
        (ack["cancel_requested"].as_bool(), ack["cancel_reason"].clone()),
        (Some(false), Value::Null)
    );
    let op = app.get_operation(&id).await;
    assert_eq!(op["progress"]["completed_units"], 3.0);
    assert_eq!(op["progress"]["phase"], "RENDERING");
    assert_eq!(op["progress"]["details"], json!({"first_page": "ok"}));
    assert_eq!(op["cost"], json!({"units": 2.5, "max_units": 50.0}));

    let done = complete(&app, task, json!({"pages": 10})).await;
    assert_eq!(done.status(), StatusCode::OK);
    let op = app.get_operation(&id).await;
    assert_eq!(
        (op["state"].as_str(), op["result"].clone()),
        (Some("succeeded"), json!({"value": {"pages": 10}}))
    );
    let again = complete(&app, task, json!({"pages": 11})).await;
    problem(again, StatusCode::CONFLICT, "lease_lost").await;
    assert_eq!(
        app.get_operation(&id).await["result"],
        json!({"value": {"pages": 10}}),
        "completed at most once"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn claims_hand_out_batches_and_long_poll_for_new_work() {
    let app = spawn_app_with(Options::default()).await;
    app.declare_kind("batch", true, 3).await;
    for i in 0..5 {
        submit_kind(&app, &format!("b{i}"), "batch", json!({})).await;
    }
    assert_eq!(app.claim("batch", 3).await.len(), 3);
    assert_eq!(app.claim("batch", 3).await.len(), 2);
    assert!(app.claim("batch", 3).await.is_empty());

    // A claim that waits is answered by work submitted while it waits.
    let waiting = {
        let request = app
            .request(Method::POST, "/v1/worker/claims", &app.worker_key)
            .json(&json!({"kinds": ["batch"], "max_tasks": 1, "wait_seconds": 30}));
        tokio::spawn(async move { request.send().await.unwrap().json::<Value>().await.unwrap() })
    };
    let id = submit_kind(&app, "late", "batch", json!({})).await;
    let answered = waiting.await.unwrap();
    assert_eq!(answered["tasks"][0]["operation_id"], id.as_str());
    app.shutdown().await;
}

#[tokio::test]
async fn bad_worker_requests_have_their_codes() {
    let app = spawn_app_with(Options::default()).await;
    app.declare_kind("strict", false, 1).await;
    for body in [
        json!({"kinds": []}),
        json!({"kinds": ["Bad Kind"]}),
        json!({"kinds": ["strict"], "max_tasks": 0}),
        json!({"kinds": ["strict"], "max_tasks": 101}),
        json!({"kinds": ["strict"], "lease_seconds": 1}),
        json!({"kinds": ["strict"], "lease_seconds": 3600}),
        json!({"kinds": ["strict"], "wait_seconds": 61}),
        json!({"kinds": ["strict"], "surprise": 1}),
        json!({"kinds": "strict"}),
    ] {
        let text = body.to_string();
        let response = app.worker_post("/v1/worker/claims", &body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{text}");
        problem(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let as_client = app
        .request(Method::POST, "/v1/worker/claims", &app.client_key)
        .json(&json!({"kinds": ["strict"]}))
        .send()
        .await
        .unwrap();
    problem(as_client, StatusCode::FORBIDDEN, "forbidden").await;

    let id = submit_kind(&app, "s1", "strict", json!({})).await;
    let task = app.claim("strict", 1).await.remove(0);
    let big_details = heartbeat(
        &app,
        &task,
        json!({"progress": {"details": {"blob": "x".repeat(5000)}}}),
    )
    .await;
    problem(big_details, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let negative = heartbeat(&app, &task, json!({"cost_units": -1})).await;
    problem(negative, StatusCode::BAD_REQUEST, "invalid_request").await;
    let big_result = complete(&app, &task, json!({"blob": "x".repeat(70 * 1024)})).await;
    let body = problem(big_result, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    assert!(body["detail"].as_str().unwrap().contains("artifact"), "{body}");
    let bad_code = app
        .worker_post(
            &task_path(&task, "fail"),
            &json!({"lease_token": task["lease_token"], "error": {"code": "Not OK"}}),
        )
        .await;
    problem(bad_code, StatusCode::BAD_REQUEST, "invalid_request").await;

    let stale = app
        .worker_post(&task_path(&task, "complete"), &json!({"lease_token": "forged"}))
        .await;
    let body = problem(stale, StatusCode::CONFLICT, "lease_lost").await;
    assert_eq!(body["operation_id"], id.as_str());
    let unknown = app
        .worker_post(
            "/v1/worker/tasks/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/heartbeat",
            &json!({"lease_token": "x"}),
        )
        .await;
    problem(unknown, StatusCode::CONFLICT, "lease_lost").await;
    assert_eq!(
        app.get_operation(&id).await["state"],
        "running",
        "refused calls changed nothing"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_zombie_worker_is_fenced_out_after_its_lease_is_reaped_and_reclaimed() {
    let (app, clock) = app_with_clock().await;
    app.declare_kind("resize", true, 3).await;
    let id = submit_kind(&app, "z1", "resize", json!({})).await;
    let zombie = app.claim("resize", 1).await.remove(0);

    clock.advance(Duration::from_secs(31));
    app.wait_for_event(&id, "retry_scheduled").await;
    let op = app.get_operation(&id).await;
    assert_eq!(
        (op["state"].as_str(), op["attempt"].as_i64()),
        (Some("running"), Some(2))
    );
    clock.advance(Duration::from_secs(2));
    let fresh = app.claim("resize", 1).await.remove(0);
    assert_eq!(fresh["attempt"], 2);
    assert_ne!(fresh["lease_token"], zombie["lease_token"]);

    let late = complete(&app, &zombie, json!("from the zombie")).await;
    problem(late, StatusCode::CONFLICT, "lease_lost").await;
    let late_beat = heartbeat(&app, &zombie, json!({})).await;
    problem(late_beat, StatusCode::CONFLICT, "lease_lost").await;
    assert_eq!(
        complete(&app, &fresh, json!("from the new holder")).await.status(),
        StatusCode::OK
    );

    let op = app.get_operation(&id).await;
    assert_eq!(op["result"], json!({"value": "from the new holder"}));
    let history: Value = app
        .request(Method::GET, &format!("/v1/operations/{id}/history"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ends = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "succeeded")
        .count();
    assert_eq!(ends, 1, "completed once");
    app.shutdown().await;
}

#[tokio::test]
async fn a_lapsed_lease_on_a_kind_not_safe_to_rerun_ends_outcome_unknown() {
    let (app, clock) = app_with_clock().await;
    app.declare_kind("charge-card", false, 1).await;
    let id = submit_kind(&app, "c1", "charge-card", json!({})).await;
    let task = app.claim("charge-card", 1).await.remove(0);
    // The worker charged the card, then its `complete` never arrived.
    clock.advance(Duration::from_secs(31));
    let op = app.wait_for_state(&id, "failed").await;
    assert_eq!(op["error"]["code"], "outcome_unknown");
    let late = complete(&app, &task, json!({"charged": true})).await;
    problem(late, StatusCode::CONFLICT, "lease_lost").await;
    assert!(
        app.claim("charge-card", 1).await.is_empty(),
        "it is never run a second time"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_retryable_failure_runs_again_and_can_succeed() {
    let (app, clock) = app_with_clock().await;
    app.declare_kind("fetch", false, 3).await;
    let id = submit_kind(&app, "f1", "fetch", json!({})).await;
    let first = app.claim("fetch", 1).await.remove(0);
    let failed = app
        .worker_post(
            &task_path(&first, "fail"),
            &json!({"lease_token": first["lease_token"], "error": {"code": "upstream_unavailable", "message": "503", "retryable": true}}),
        )
        .await;
    assert_eq!(failed.status(), StatusCode::OK);
    let body: Value = failed.json().await.unwrap();
    assert_eq!(
        (body["state"].as_str(), body["attempt"].as_i64()),
        (Some("running"), Some(2))
    );
    assert!(
        app.claim("fetch", 1).await.is_empty(),
        "the retry waits for its backoff"
    );
    clock.advance(Duration::from_secs(2));
    let second = app.claim("fetch", 1).await.remove(0);
    assert_eq!(second["attempt"], 2);
    complete(&app, &second, json!("ok")).await;
    assert_eq!(app.get_operation(&id).await["state"], "succeeded");
    app.shutdown().await;
}

#[tokio::test]
async fn cancellation_races_and_the_commit_point() {
    let app = spawn_app_with(Options::default()).await;
    app.declare_kind("race", false, 1).await;
    let cancel = |id: String| {
        app.request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .json(&json!({"reason": "user clicked cancel"}))
        .send()
    };

    // The worker acknowledges: cancelled.
    let acked = submit_kind(&app, "r1", "race", json!({})).await;
    let task = app.claim("race", 1).await.remove(0);
    assert_eq!(cancel(acked.clone()).await.unwrap().status(), StatusCode::ACCEPTED);
    let ack: Value = heartbeat(&app, &task, json!({})).await.json().await.unwrap();
    assert_eq!(
        (ack["cancel_requested"].as_bool(), ack["cancel_reason"].as_str()),
        (Some(true), Some("user clicked cancel"))
    );
    let response = app
        .worker_post(
            &task_path(&task, "cancelled"),
            &json!({"lease_token": task["lease_token"]}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(app.get_operation(&acked).await["state"], "cancelled");

    // The worker finishes first: succeeded, the request stays on record.
    let finished = submit_kind(&app, "r2", "race", json!({})).await;
    let task = app.claim("race", 1).await.remove(0);
    assert_eq!(cancel(finished.clone()).await.unwrap().status(), StatusCode::ACCEPTED);
    complete(&app, &task, json!("done anyway")).await;
    let op = app.get_operation(&finished).await;
    assert_eq!(
        (op["state"].as_str(), op["cancel_requested"].as_bool()),
        (Some("succeeded"), Some(true))
    );
    let record: Value = app
        .request(
            Method::GET,
            &format!("/v1/operations/{finished}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["outcome"], "succeeded");

    // Past the commit point: refused, and nothing recorded.
    let committed = submit_kind(&app, "r3", "race", json!({})).await;
    let task = app.claim("race", 1).await.remove(0);
    assert_eq!(
        heartbeat(&app, &task, json!({"cancellable": false})).await.status(),
        StatusCode::OK
    );
    let refused = cancel(committed.clone()).await.unwrap();
    let body = problem(refused, StatusCode::CONFLICT, "operation_not_cancellable").await;
    assert_eq!(body["operation_id"], committed.as_str());
    assert_eq!(app.get_operation(&committed).await["cancel_requested"], false);
    app.shutdown().await;
}

#[tokio::test]
async fn deadlines_stop_work_with_and_without_the_workers_acknowledgement() {
    let (app, clock) = app_with_clock().await;
    app.declare_kind("slow", false, 1).await;

    let acked = submit_kind(&app, "d1", "slow", json!({"deadline_seconds": 60})).await;
    let ignored = submit_kind(&app, "d2", "slow", json!({"deadline_seconds": 60})).await;
    let never_started = submit_kind(&app, "d3", "slow", json!({"deadline_seconds": 60})).await;
    let tasks = app.claim("slow", 2).await;
    let task_of = |id: &str| tasks.iter().find(|t| t["operation_id"] == id).unwrap().clone();
    let (acked_task, ignored_task) = (task_of(&acked), task_of(&ignored));

    // Both workers stay alive (heartbeats) while the deadline passes.
    for step in [25, 25, 11] {
        clock.advance(Duration::from_secs(step));
        for task in &tasks {
            assert_eq!(heartbeat(&app, task, json!({})).await.status(), StatusCode::OK);
        }
    }
    let queued = app.wait_for_state(&never_started, "failed").await;
    assert_eq!(
        (queued["error"]["code"].as_str(), queued["started_at"].clone()),
        (Some("deadline_exceeded"), Value::Null)
    );
    let event = app.wait_for_event(&acked, "cancel_requested").await;
    assert_eq!(event["data"]["reason"], "deadline_exceeded");

    let ack: Value = heartbeat(&app, &acked_task, json!({})).await.json().await.unwrap();
    assert_eq!(
        (ack["cancel_requested"].as_bool(), ack["cancel_reason"].as_str()),
        (Some(true), Some("deadline_exceeded"))
    );
    app.worker_post(
        &task_path(&acked_task, "cancelled"),
        &json!({"lease_token": acked_task["lease_token"]}),
    )
    .await;
    let op = app.get_operation(&acked).await;
    assert_eq!(
        (op["state"].as_str(), op["error"]["code"].as_str()),
        (Some("failed"), Some("deadline_exceeded"))
    );

    // The other worker keeps its lease alive but never stops: after the
    // grace period the server ends the operation and fences the worker out.
    app.wait_for_event(&ignored, "cancel_requested").await;
    clock.advance(Duration::from_secs(20));
    assert_eq!(heartbeat(&app, &ignored_task, json!({})).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(11));
    let op = app.wait_for_state(&ignored, "failed").await;
    assert_eq!(op["error"]["code"], "deadline_exceeded");
    problem(
        complete(&app, &ignored_task, json!("too late")).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn budgets_stop_work_with_and_without_the_workers_acknowledgement() {
    let (app, clock) = app_with_clock().await;
    app.declare_kind("metered", false, 1).await;
    let acked = submit_kind(&app, "m1", "metered", json!({"budget": {"max_cost_units": 10}})).await;
    let ignored = submit_kind(&app, "m2", "metered", json!({"budget": {"max_cost_units": 10}})).await;
    let tasks = app.claim("metered", 2).await;
    for task in &tasks {
        let ack: Value = heartbeat(&app, task, json!({"cost_units": 11}))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(
            (ack["cancel_requested"].as_bool(), ack["cancel_reason"].as_str()),
            (Some(true), Some("budget_exhausted"))
        );
    }
    let acked_task = tasks.iter().find(|t| t["operation_id"] == acked.as_str()).unwrap();
    app.worker_post(
        &task_path(acked_task, "cancelled"),
        &json!({"lease_token": acked_task["lease_token"]}),
    )
    .await;
    let op = app.get_operation(&acked).await;
    assert_eq!(
        (op["state"].as_str(), op["error"]["code"].as_str()),
        (Some("failed"), Some("budget_exhausted"))
    );
    assert_eq!(op["cost"]["units"], 11.0);

    // The other keeps heartbeating without stopping: ended after the grace.
    let ignored_task = tasks.iter().find(|t| t["operation_id"] == ignored.as_str()).unwrap();
    clock.advance(Duration::from_secs(20));
    assert_eq!(heartbeat(&app, ignored_task, json!({})).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(11));
    let op = app.wait_for_state(&ignored, "failed").await;
    assert_eq!(op["error"]["code"], "budget_exhausted");
    problem(
        complete(&app, ignored_task, json!("too late")).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn intent_changes_need_if_match_and_lose_to_terminal_intent() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let op = app
        .submit_ok(
            "patch",
            &json!({"kind": "sleep", "input": {"duration_ms": 1}, "deadline_seconds": 60}),
        )
        .await;
    let id = op["id"].as_str().unwrap();
    let path = format!("/v1/operations/{id}");
    let patch = |if_match: Option<&str>, body: Value| {
        let mut request = app.request(Method::PATCH, &path, &app.client_key).json(&body);
        if let Some(tag) = if_match {
            request = request.header("If-Match", tag);
        }
        request.send()
    };

    problem(
        patch(None, json!({"deadline_seconds": 120})).await.unwrap(),
        StatusCode::PRECONDITION_REQUIRED,
        "precondition_required",
    )
    .await;
    problem(
        patch(Some("\"7\""), json!({"deadline_seconds": 120})).await.unwrap(),
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    problem(
        patch(Some("\"1\""), json!({"deadline_seconds": 0})).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        patch(Some("\"1\""), json!({"labels": {"Bad": "x"}})).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        patch(Some("\"1\""), json!({"state": "succeeded"})).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;

    let changed = patch(
        Some("\"1\""),
        json!({"deadline_seconds": 3600, "labels": {"team": "red"}}),
    )
    .await
    .unwrap();
    assert_eq!(changed.status(), StatusCode::OK);
    assert_eq!(changed.headers()["etag"], "\"2\"");
    let changed: Value = changed.json().await.unwrap();
    assert_eq!(changed["labels"], json!({"team": "red"}));
    let created = time::OffsetDateTime::parse(
        op["created_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let deadline = time::OffsetDateTime::parse(
        changed["deadline_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(
        deadline - created,
        time::Duration::hours(1),
        "deadline_seconds counts from creation"
    );

    // Removing the deadline with null.
    let cleared: Value = patch(Some("\"2\""), json!({"deadline_seconds": null}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cleared["deadline_at"], Value::Null);

    app.request(Method::PUT, &format!("{path}/cancellation"), &app.client_key)
        .send()
        .await
        .unwrap();
    let after_end = patch(Some("\"4\""), json!({"labels": {"team": "blue"}})).await.unwrap();
    let body = problem(after_end, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    assert!(body["detail"].as_str().unwrap().contains("terminal"));
    let foreign = app
        .request(Method::PATCH, &path, &app.other_tenant_key)
        .header("If-Match", "\"4\"")
        .json(&json!({"labels": {}}))
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    app.shutdown().await;
}

#[tokio::test]
async fn max_active_refuses_before_creating_anything() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.store
        .tenant_set(TenantLimits {
            name: "acme".into(),
            max_active: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    app.submit_ok("q1", &crate::helpers::sleep_body(1)).await;
    app.submit_ok("q2", &crate::helpers::sleep_body(1)).await;
    let refused = app.submit("q3", &crate::helpers::sleep_body(1)).await;
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    let body = problem(refused, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded").await;
    assert_eq!(body["retryable"], true);
    assert_eq!(app.operation_count("acme").await, 2, "nothing was created");
    let replay = app.submit("q1", &crate::helpers::sleep_body(1)).await;
    assert_eq!(
        replay.status(),
        StatusCode::ACCEPTED,
        "replays still answer at the limit"
    );
    app.shutdown().await;
}

/// A server whose waiting claims look again unwoken only once an hour,
/// tenant `acme` capped at one running task, two tasks of kind `capped`
/// queued and the first leased: the app, the second's id, the first task.
async fn capped_with_one_running() -> (TestApp, String, Value) {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        claim_poll: Duration::from_secs(3600),
        ..Options::default()
    })
    .await;
    app.declare_kind("capped", true, 3).await;
    app.store
        .tenant_set(TenantLimits {
            name: "acme".into(),
            max_running: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let first = submit_kind(&app, "c1", "capped", json!({})).await;
    let second = submit_kind(&app, "c2", "capped", json!({})).await;
    let mut running = app.claim("capped", 5).await;
    assert_eq!(running.len(), 1, "max_running 1 leases one");
    assert_eq!(running[0]["operation_id"], first.as_str());
    assert!(app.claim("capped", 5).await.is_empty(), "the tenant is at its cap");
    (app, second, running.remove(0))
}

/// A claim of `capped` waiting up to 20 s, returned once it waits.
async fn waiting_claim(app: &TestApp) -> tokio::task::JoinHandle<Value> {
    let request = app
        .request(Method::POST, "/v1/worker/claims", &app.worker_key)
        .json(&json!({"kinds": ["capped"], "max_tasks": 5, "wait_seconds": 20}));
    let waiting = tokio::spawn(async move { request.send().await.unwrap().json::<Value>().await.unwrap() });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !app.state.claims_waiting("capped") {
        assert!(tokio::time::Instant::now() < deadline, "the claim never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting
}

/// The waiting claim's answer, once a place was freed: the tenant's next
/// task alone, by a look after a wake-up. Its own poll comes after its
/// wait, and a last look as the wait ends would find the task too, so what
/// is asserted is an answer well before that (milliseconds, here).
async fn answered_with_the_next(waiting: tokio::task::JoinHandle<Value>, second: &str) {
    let freed = tokio::time::Instant::now();
    let answered = waiting.await.unwrap();
    assert!(
        freed.elapsed() < Duration::from_secs(15),
        "answered only as its wait ended"
    );
    let tasks = answered["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "still one at a time: {answered}");
    assert_eq!(tasks[0]["operation_id"], second);
}

/// A claim waiting for a capped tenant's next task is woken when the
/// running one's outcome arrives here.
#[tokio::test]
async fn a_waiting_claim_gets_a_capped_tenants_next_task_once_a_running_one_ends() {
    let (app, second, running) = capped_with_one_running().await;
    let waiting = waiting_claim(&app).await;
    assert_eq!(complete(&app, &running, json!({})).await.status(), StatusCode::OK);
    answered_with_the_next(waiting, &second).await;
    app.shutdown().await;
}

/// The same place, freed by an ending this node's outcome path never saw
/// (another node's worker reported it; here the store is told directly):
/// the change feed wakes the claim waiting here.
#[tokio::test]
async fn a_capped_tenants_place_freed_elsewhere_wakes_a_claim_waiting_here() {
    let (app, second, running) = capped_with_one_running().await;
    let waiting = waiting_claim(&app).await;
    let id = running["operation_id"].as_str().unwrap();
    app.store
        .task_finish(longrun_store::FinishParams {
            operation_id: longrun_core::Id::parse(longrun_core::IdKind::Operation, id).unwrap(),
            lease_token: running["lease_token"].as_str().unwrap().to_owned(),
            outcome: longrun_core::task::Outcome::Succeeded { result: None },
            progress: None,
            now: longrun_core::Clock::now(&longrun_core::SystemClock),
        })
        .await
        .unwrap();
    answered_with_the_next(waiting, &second).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_tenant_over_its_rate_is_told_to_slow_down() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.store
        .tenant_set(TenantLimits {
            name: "globex".into(),
            rate: Some(1.0),
            ..Default::default()
        })
        .await
        .unwrap();
    let list = || app.request(Method::GET, "/v1/operations", &app.other_tenant_key).send();
    assert_eq!(list().await.unwrap().status(), StatusCode::OK);
    let limited = list().await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.headers().get("retry-after").is_some());
    problem(limited, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    let other = app
        .request(Method::GET, "/v1/operations", &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK, "other tenants are not limited");
    app.shutdown().await;
}

#[tokio::test]
async fn a_big_backlog_does_not_starve_a_small_tenant() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.declare_kind("fair", true, 3).await;
    // 10,000 queued operations of one tenant, written straight to the store.
    let mut pending = Vec::new();
    for i in 0..10_000 {
        let store = app.store.clone();
        pending.push(tokio::spawn(async move {
            store
                .operation_accept(AcceptParams {
                    not_before: None,
                    priority: longrun_store::PRIORITY_DEFAULT,
                    now: longrun_core::Timestamp(1),
                    ..longrun_store::conformance::accept_params("big", "fair", None, json!({"i": i}))
                })
                .await
                .unwrap()
        }));
    }
    for p in pending {
        p.await.unwrap();
    }
    let mut small = Vec::new();
    for i in 0..10 {
        small.push(submit_kind(&app, &format!("small-{i}"), "fair", json!({})).await);
    }
    let mut claims_until_first_small = None;
    let mut small_started = 0;
    for n in 1..=20 {
        let task = app.claim("fair", 1).await.remove(0);
        if small.iter().any(|id| task["operation_id"] == id.as_str()) {
            claims_until_first_small.get_or_insert(n);
            small_started += 1;
        }
    }
    println!(
        "fairness: the small tenant's first task was claim #{claims_until_first_small:?} after 10,000 queued by another tenant; {small_started} of its 10 started within 20 claims"
    );
    assert!(claims_until_first_small.is_some_and(|n| n <= 2));
    assert_eq!(small_started, 10);
    app.shutdown().await;
}

/// A remote worker claims quick work ahead of its free slots (the same
/// reservation as the in-process dispatcher's): each task runs once, on its
/// first attempt, and never more handlers at once than its concurrency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_worker_claiming_quick_work_ahead_runs_each_task_once_within_its_concurrency() {
    use longrun_engine::testing::Counting;
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.declare_kind("counting", true, 3).await;
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(submit_kind(&app, &format!("quick-{i}"), "counting", json!({})).await);
    }
    let handler = std::sync::Arc::new(Counting::new("counting"));
    let worker = app.remote_worker(handler.clone(), 3);

    app.wait_for_state(ids.last().unwrap(), "succeeded").await;
    for id in &ids {
        let op = app.wait_for_state(id, "succeeded").await;
        assert_eq!(op["attempt"], 1, "{id} was claimed again: {op}");
    }
    worker.stop().await;
    let runs = handler.runs();
    assert_eq!(runs.len(), ids.len());
    assert!(runs.values().all(|&n| n == 1), "a task ran twice");
    let most = handler.most_at_once();
    assert!(
        (1..=3).contains(&most),
        "{most} handlers ran at once, with concurrency 3"
    );
    app.shutdown().await;
}
