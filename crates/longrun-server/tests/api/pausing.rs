//! `PATCH {"desired_state"}`: queued work pauses (out of the queue) and
//! resumes; running work of a pausable kind is asked of its worker, which
//! saves a checkpoint and reports `paused` (other kinds are not pausable);
//! terminal intent dominates; events and webhooks carry `paused` and
//! `resumed`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, Receiver, TestApp, problem, spawn_app_with};

async fn patch(app: &TestApp, id: &str, if_match: Option<i64>, body: Value) -> reqwest::Response {
    let mut request = app
        .request(Method::PATCH, &format!("/v1/operations/{id}"), &app.client_key)
        .json(&body);
    if let Some(version) = if_match {
        request = request.header("if-match", format!("\"{version}\""));
    }
    request.send().await.unwrap()
}

fn desired(state: &str) -> Value {
    json!({"desired_state": state})
}

#[tokio::test]
async fn queued_work_pauses_out_of_the_queue_and_resumes_into_it() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        webhooks_to_loopback: true,
        webhook_schedule: Some(vec![Duration::from_millis(10)]),
        ..Options::default()
    })
    .await;
    let receiver = Receiver::start(vec![]).await;
    app.declare_kind("held", true, 3).await;
    let op = app
        .submit_ok("pause-me", &json!({"kind": "held", "callback": {"url": receiver.url}}))
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    assert_eq!(op["desired_state"], "running");

    let paused = patch(&app, &id, Some(1), desired("paused")).await;
    assert_eq!(paused.status(), StatusCode::OK);
    let paused: Value = paused.json().await.unwrap();
    assert_eq!(
        (
            paused["state"].as_str(),
            paused["desired_state"].as_str(),
            paused["version"].as_i64()
        ),
        (Some("paused"), Some("paused"), Some(2))
    );
    assert!(
        app.claim("held", 1).await.is_empty(),
        "paused work is held back from claims"
    );
    let listed: Value = app.get_json("/v1/operations?state=paused").await;
    assert_eq!(listed["operations"][0]["id"], id.as_str());
    // Asking again for what holds changes nothing.
    let again: Value = patch(&app, &id, Some(2), desired("paused")).await.json().await.unwrap();
    assert_eq!(again["version"], 2);

    problem(
        patch(&app, &id, Some(1), desired("running")).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    problem(
        patch(&app, &id, None, desired("running")).await,
        StatusCode::PRECONDITION_REQUIRED,
        "precondition_required",
    )
    .await;
    problem(
        patch(
            &app,
            &id,
            Some(2),
            json!({"desired_state": "running", "labels": {"a": "b"}}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        patch(&app, &id, Some(2), desired("cancelled")).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;

    let resumed: Value = patch(&app, &id, Some(2), desired("running"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (resumed["state"].as_str(), resumed["version"].as_i64()),
        (Some("queued"), Some(3))
    );
    let task = app.claim("held", 1).await.remove(0);
    assert_eq!(task["operation_id"], id.as_str());
    // A worker holds it now: the kind cannot pause running work.
    problem(
        patch(&app, &id, Some(4), desired("paused")).await,
        StatusCode::CONFLICT,
        "not_pausable",
    )
    .await;

    let history: Value = app.get_json(&format!("/v1/operations/{id}/history")).await;
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["created", "paused", "resumed", "started"]);
    // Webhooks: operation.paused and operation.resumed, signed like the rest.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let kinds: Vec<String> = receiver
            .received()
            .iter()
            .filter_map(|r| serde_json::from_str::<Value>(&r.body).ok())
            .map(|b| b["type"].as_str().unwrap_or_default().to_owned())
            .collect();
        if kinds.contains(&"operation.paused".to_owned()) && kinds.contains(&"operation.resumed".to_owned()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "webhooks so far: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.shutdown().await;
}

#[tokio::test]
async fn terminal_intent_dominates_and_a_paused_operation_cancels_at_once() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.declare_kind("held", true, 3).await;
    let op = app.submit_ok("paused-then-cancelled", &json!({"kind": "held"})).await;
    let id = op["id"].as_str().unwrap().to_owned();
    patch(&app, &id, Some(1), desired("paused")).await;
    let cancelled = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success());
    let read = app.get_operation(&id).await;
    assert_eq!(
        (read["state"].as_str(), read["desired_state"].as_str()),
        (Some("cancelled"), Some("cancelled"))
    );
    // Whatever the version named, no pause or resume applies any more.
    for version in [1, 3, 99] {
        for state in ["paused", "running"] {
            problem(
                patch(&app, &id, Some(version), desired(state)).await,
                StatusCode::CONFLICT,
                "intent_conflict",
            )
            .await;
        }
    }
    // Another tenant's operation is not found, whatever the body.
    let foreign = app
        .request(Method::PATCH, &format!("/v1/operations/{id}"), &app.other_tenant_key)
        .header("if-match", "\"3\"")
        .json(&desired("paused"))
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    app.shutdown().await;
}

/// The deadline keeps counting while paused: nothing happens to paused
/// work, and once resumed past its deadline it fails as queued work does.
#[tokio::test]
async fn a_deadline_that_passes_while_paused_fails_the_work_once_resumed() {
    let clock = crate::helpers::manual_clock();
    let app = spawn_app_with(Options {
        builtin_workers: false,
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    app.declare_kind("held", true, 3).await;
    let op = app
        .submit_ok("paused-past-deadline", &json!({"kind": "held", "deadline_seconds": 60}))
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    patch(&app, &id, Some(1), desired("paused")).await;
    clock.advance(Duration::from_secs(120));
    // A round of the deadline enforcer now leaves paused work alone.
    let counts = app
        .store
        .deadline_enforce(longrun_store::EnforceParams {
            now: longrun_core::Clock::now(&clock),
            grace: Duration::from_secs(30),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(counts, longrun_store::EnforceCounts::default());
    assert_eq!(app.get_operation(&id).await["state"], "paused");
    patch(&app, &id, Some(2), desired("running")).await;
    let failed = app.wait_for_state(&id, "failed").await;
    assert_eq!(failed["error"]["code"], "deadline_exceeded");
    app.shutdown().await;
}

/// Running work of a pausable kind, over the worker protocol: checkpoints
/// ride heartbeats (bounded), `PATCH` answers `202` and the heartbeat says
/// `pause_requested`, the `paused` report ends the lease, and the claim
/// after a resume hands the checkpoint back. Reports are checked like any.
#[tokio::test]
async fn running_work_pauses_through_its_worker_and_resumes_from_its_checkpoint() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let spec = longrun_store::KindSpec {
        rerun_safe: true,
        pausable: true,
        ..longrun_store::KindSpec::declared("resumable")
    };
    app.store.kind_upsert(spec).await.unwrap();
    let op = app.submit_ok("resumable-1", &json!({"kind": "resumable"})).await;
    let id = op["id"].as_str().unwrap().to_owned();
    let task = app.claim("resumable", 1).await.remove(0);
    assert!(task.get("checkpoint").is_none(), "a fresh start has none: {task}");
    let token = task["lease_token"].as_str().unwrap().to_owned();
    let path = format!("/v1/worker/tasks/{id}/heartbeat");
    let heartbeat = |body: Value| {
        let (app, path) = (&app, path.clone());
        async move { app.worker_post(&path, &body).await }
    };

    let beat: Value = heartbeat(json!({"lease_token": token, "checkpoint": {"row": 100}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(beat["pause_requested"], false);
    let huge = "x".repeat(longrun_store::MAX_CHECKPOINT_BYTES);
    problem(
        heartbeat(json!({"lease_token": token, "checkpoint": {"blob": huge}})).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    // A paused report's checkpoint has the same bound.
    problem(
        app.worker_post(
            &format!("/v1/worker/tasks/{id}/paused"),
            &json!({"lease_token": token, "checkpoint": {"blob": "x".repeat(longrun_store::MAX_CHECKPOINT_BYTES)}}),
        )
        .await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    // Nobody asked for a pause yet.
    problem(
        app.worker_post(&format!("/v1/worker/tasks/{id}/paused"), &json!({"lease_token": token}))
            .await,
        StatusCode::CONFLICT,
        "intent_conflict",
    )
    .await;

    let asked = patch(&app, &id, Some(2), desired("paused")).await;
    assert_eq!(asked.status(), StatusCode::ACCEPTED);
    let asked: Value = asked.json().await.unwrap();
    assert_eq!(
        (
            asked["state"].as_str(),
            asked["desired_state"].as_str(),
            asked["version"].as_i64()
        ),
        (Some("running"), Some("paused"), Some(3))
    );
    let beat: Value = heartbeat(json!({"lease_token": token})).await.json().await.unwrap();
    assert_eq!(
        (beat["pause_requested"].as_bool(), beat["cancel_requested"].as_bool()),
        (Some(true), Some(false))
    );
    // A checkpoint belongs only on heartbeats and paused reports.
    let misplaced: Value = app
        .worker_post(
            "/v1/worker/outcomes",
            &json!({"outcomes": [{"operation_id": id, "lease_token": token, "outcome": "complete", "checkpoint": {}}]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(misplaced["results"][0]["status"], 400);
    // Paused through the batch endpoint, with the checkpoint to resume from.
    let answer: Value = app
        .worker_post(
            "/v1/worker/outcomes",
            &json!({"outcomes": [{"operation_id": id, "lease_token": token, "outcome": "paused",
                                   "checkpoint": {"row": 150}, "progress": {"completed_units": 150}}]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            answer["results"][0]["status"].as_u64(),
            answer["results"][0]["state"].as_str()
        ),
        (Some(200), Some("paused"))
    );
    problem(
        heartbeat(json!({"lease_token": token})).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    let paused = app.get_operation(&id).await;
    assert_eq!(
        (
            paused["state"].as_str(),
            paused["attempt"].as_i64(),
            paused["progress"]["completed_units"].as_f64()
        ),
        (Some("paused"), Some(1), Some(150.0))
    );
    assert!(app.claim("resumable", 1).await.is_empty());

    let resumed = patch(&app, &id, paused["version"].as_i64(), desired("running")).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let next = app.claim("resumable", 1).await.remove(0);
    assert_eq!(
        (next["attempt"].as_i64(), next["checkpoint"].clone()),
        (Some(1), json!({"row": 150}))
    );
    let token = next["lease_token"].as_str().unwrap();
    let done = app
        .worker_post(
            &format!("/v1/worker/tasks/{id}/complete"),
            &json!({"lease_token": token}),
        )
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let history: Value = app.get_json(&format!("/v1/operations/{id}/history")).await;
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        vec![
            "created",
            "started",
            "pause_requested",
            "paused",
            "resumed",
            "started",
            "succeeded"
        ]
    );
    let admin = crate::helpers::create_key(app.store.as_ref(), "acme", longrun_core::apikey::Role::Admin).await;
    let metrics = app
        .request(Method::GET, "/metrics", &admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for change in ["pause_requested", "paused", "resumed"] {
        assert!(
            metrics.contains(&format!("longrun_operations_intents_total{{change=\"{change}\"}}")),
            "{change} counted"
        );
    }
    app.shutdown().await;
}

/// The built-in `sleep` kind in this process: a pause stops it mid-run and
/// a resume finishes the steps that were left.
#[tokio::test]
async fn a_running_sleep_pauses_in_process_and_resumes() {
    let app = spawn_app_with(Options::default()).await;
    let op = app
        .submit_ok(
            "sleepy",
            &json!({"kind": "sleep", "input": {"duration_ms": 600_000, "steps": 1000}}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let running = app.wait_for_state(&id, "running").await;
    let asked = patch(&app, &id, running["version"].as_i64(), desired("paused")).await;
    assert_eq!(asked.status(), StatusCode::ACCEPTED);
    // The in-process task hears it at once (no heartbeat to wait for).
    let paused = app.wait_for_state(&id, "paused").await;
    assert_eq!(
        (paused["attempt"].as_i64(), paused["desired_state"].as_str()),
        (Some(1), Some("paused"))
    );
    let resumed = patch(&app, &id, paused["version"].as_i64(), desired("running")).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    app.wait_for(&id, "a second start", |op| {
        op["state"] == "running" && op["version"].as_i64() > paused["version"].as_i64()
    })
    .await;
    let cancelled = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::ACCEPTED);
    app.wait_for_state(&id, "cancelled").await;
    app.shutdown().await;
}

/// `desired_state` changes on its own, as the document's rule says: a
/// `null` `desired_state` or `labels` is absent (SDKs that write every field
/// send them), while `deadline_seconds: null` removes the deadline, so it
/// counts as given.
#[tokio::test]
async fn nulls_in_a_patch_are_absent_but_a_null_deadline_is_a_change() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.declare_kind("held", true, 3).await;
    let op = app.submit_ok("nulls", &json!({"kind": "held"})).await;
    let id = op["id"].as_str().unwrap().to_owned();

    let relabelled = patch(
        &app,
        &id,
        Some(1),
        json!({"desired_state": null, "labels": {"team": "a"}, "deadline_seconds": null}),
    )
    .await;
    assert_eq!(relabelled.status(), StatusCode::OK);
    let relabelled: Value = relabelled.json().await.unwrap();
    assert_eq!(
        (relabelled["labels"].clone(), relabelled["version"].as_i64()),
        (json!({"team": "a"}), Some(2))
    );

    let paused = patch(&app, &id, Some(2), json!({"desired_state": "paused", "labels": null})).await;
    assert_eq!(paused.status(), StatusCode::OK);
    let paused: Value = paused.json().await.unwrap();
    assert_eq!(
        (paused["state"].as_str(), paused["labels"].clone()),
        (Some("paused"), json!({"team": "a"})),
        "the null labels changed nothing"
    );

    problem(
        patch(
            &app,
            &id,
            Some(3),
            json!({"desired_state": "running", "deadline_seconds": null}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    app.shutdown().await;
}
