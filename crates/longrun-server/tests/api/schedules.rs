//! Schedules over real HTTP: the resource (create, read, list, `PATCH`
//! under `If-Match`, delete), every refusal, and the firing itself under
//! the server's manual clock — one operation per firing time with the key
//! `schedule:{id}:{fire_time}`, the overlap policies, the catch-up window
//! and a trigger. Time moves by the manual clock; the firing service runs
//! every 20 ms here, and tests wait on what it records, bounded.

use std::time::Duration;

use longrun_core::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, Receiver, TestApp, manual_clock, problem, spawn_app_with};

/// A Monday, 10:00:30 UTC.
const START: &str = "2027-01-04T10:00:30Z";

async fn app_at_start() -> (TestApp, longrun_core::ManualClock) {
    let clock = manual_clock();
    clock.set(Timestamp::parse_rfc3339(START).unwrap());
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    app.declare_kind("report", true, 3).await;
    (app, clock)
}

async fn create(app: &TestApp, body: &Value) -> reqwest::Response {
    app.request(Method::POST, "/v1/schedules", &app.client_key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn create_ok(app: &TestApp, body: &Value) -> Value {
    let response = create(app, body).await;
    assert_eq!(response.status(), StatusCode::CREATED, "{:?}", response.text().await);
    response.json().await.unwrap()
}

async fn patch(app: &TestApp, id: &str, version: Option<i64>, body: &Value) -> reqwest::Response {
    let mut request = app.request(Method::PATCH, &format!("/v1/schedules/{id}"), &app.client_key);
    if let Some(version) = version {
        request = request.header("If-Match", format!("\"{version}\""));
    }
    request.json(body).send().await.unwrap()
}

async fn fires(app: &TestApp, id: &str) -> Vec<Value> {
    let body = app.get_json(&format!("/v1/schedules/{id}/fires")).await;
    body["fires"].as_array().unwrap().clone()
}

/// Waits (bounded) until the schedule's records hold `n` entries.
async fn wait_for_fires(app: &TestApp, id: &str, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let fires = fires(app, id).await;
        if fires.len() >= n {
            return fires;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {n} firing records: {fires:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn decisions(fires: &[Value]) -> Vec<(String, String)> {
    fires
        .iter()
        .rev()
        .map(|f| {
            (
                f["fire_time"].as_str().unwrap().to_owned(),
                f["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(time: &str, decision: &str) -> (String, String) {
    (time.to_owned(), decision.to_owned())
}

#[tokio::test]
async fn a_schedule_is_created_read_listed_changed_and_deleted() {
    let (app, _clock) = app_at_start().await;
    let response = create(
        &app,
        &json!({"kind": "report", "input": {"scope": "all"}, "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
                "labels": {"team": "data"}}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["etag"], "\"1\"");
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let created: Value = response.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sch_"));
    assert_eq!(location, format!("/v1/schedules/{id}"));
    assert_eq!(
        (
            created["version"].as_i64(),
            created["paused"].as_bool(),
            created["overlap"].as_str()
        ),
        (Some(1), Some(false), Some("skip"))
    );
    assert_eq!(
        (created["catchup_window"].as_u64(), created["priority"].as_u64()),
        (Some(3600), Some(5))
    );
    // 02:30 in Berlin (CET, UTC+1) is 01:30Z, the next five days.
    assert_eq!(
        created["next_fire_times"],
        json!([
            "2027-01-05T01:30:00.000Z",
            "2027-01-06T01:30:00.000Z",
            "2027-01-07T01:30:00.000Z",
            "2027-01-08T01:30:00.000Z",
            "2027-01-09T01:30:00.000Z"
        ])
    );
    assert_eq!(app.get_json(&location).await, created);

    // Another tenant sees nothing of it.
    for (method, path) in [
        (Method::GET, location.clone()),
        (Method::DELETE, location.clone()),
        (Method::GET, format!("{location}/fires")),
        (Method::POST, format!("{location}/trigger")),
    ] {
        let response = app.request(method, &path, &app.other_tenant_key).send().await.unwrap();
        problem(response, StatusCode::NOT_FOUND, "not_found").await;
    }

    // Keyset pages in id order (creation order to the millisecond).
    let second = create_ok(&app, &json!({"kind": "report", "cron": "@hourly"})).await;
    let third = create_ok(&app, &json!({"kind": "report", "cron": "@every 15m"})).await;
    let mut all = [
        id.clone(),
        second["id"].as_str().unwrap().to_owned(),
        third["id"].as_str().unwrap().to_owned(),
    ];
    all.sort();
    let page = app.get_json("/v1/schedules?page_size=2").await;
    let ids: Vec<&str> = page["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [all[0].as_str(), all[1].as_str()]);
    let token = page["next_page_token"].as_str().unwrap();
    let rest = app
        .get_json(&format!("/v1/schedules?page_size=2&page_token={token}"))
        .await;
    assert_eq!(rest["schedules"][0]["id"], json!(all[2]));
    assert!(rest.get("next_page_token").is_none());
    let theirs = app
        .request(Method::GET, "/v1/schedules", &app.other_tenant_key)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(theirs["schedules"], json!([]));

    // PATCH: If-Match required, and current.
    problem(
        patch(&app, &id, None, &json!({"paused": true})).await,
        StatusCode::PRECONDITION_REQUIRED,
        "precondition_required",
    )
    .await;
    problem(
        patch(&app, &id, Some(7), &json!({"paused": true})).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    let paused = patch(&app, &id, Some(1), &json!({"paused": true})).await;
    assert_eq!(paused.status(), StatusCode::OK);
    assert_eq!(paused.headers()["etag"], "\"2\"");
    let paused: Value = paused.json().await.unwrap();
    assert_eq!(
        (paused["paused"].as_bool(), paused["next_fire_times"].clone()),
        (Some(true), json!([]))
    );
    let changed = patch(
        &app,
        &id,
        Some(2),
        &json!({"paused": false, "cron": "0 6 * * mon", "time_zone": null, "overlap": "buffer_one"}),
    )
    .await
    .json::<Value>()
    .await
    .unwrap();
    assert_eq!(changed["version"], 3);
    assert_eq!(changed["time_zone"], "UTC");
    assert_eq!(changed["overlap"], "buffer_one");
    assert_eq!(changed["next_fire_times"][0], "2027-01-11T06:00:00.000Z");
    assert_eq!(
        changed["input"],
        json!({"scope": "all"}),
        "what the patch leaves out stays"
    );
    // A change is checked as a creation is.
    problem(
        patch(&app, &id, Some(3), &json!({"cron": "61 * * * *"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
    )
    .await;

    let deleted = app
        .request(Method::DELETE, &location, &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    problem(
        app.request(Method::GET, &location, &app.client_key)
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        app.request(Method::DELETE, &location, &app.client_key)
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn bad_definitions_are_refused_with_a_stable_code() {
    let (app, _clock) = app_at_start().await;
    for (body, status, code, says) in [
        (
            json!({"kind": "report", "cron": "* * *"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            "3 fields",
        ),
        (
            json!({"kind": "report", "cron": "0 25 * * *"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            "hour",
        ),
        (
            json!({"kind": "report", "cron": "@every 0s"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            "1s",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "time_zone": "Mars/Base"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            "time_zone",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "overlap": "sometimes"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "buffer_one",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "catchup_window": 2_592_001}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "catchup_window",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "priority": 10}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "priority",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "every": "day"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "every",
        ),
        (
            json!({"kind": "report"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "cron",
        ),
        (
            json!({"kind": "nothing-runs-this", "cron": "@daily"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_kind",
            "nothing-runs-this",
        ),
        (
            json!({"kind": "report", "cron": "@daily", "callback": {"url": "http://10.0.0.1/hook"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_callback_url",
            "",
        ),
    ] {
        let response = create(&app, &body).await;
        let detail = problem(response, status, code).await["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(detail.contains(says), "{body}: {detail}");
    }
    // Unauthorised, wrong role, malformed and oversized bodies.
    let anonymous = app
        .http
        .post(app.url("/v1/schedules"))
        .json(&json!({"kind": "report", "cron": "@daily"}))
        .send()
        .await
        .unwrap();
    problem(anonymous, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let worker = app
        .request(Method::POST, "/v1/schedules", &app.worker_key)
        .json(&json!({"kind": "report", "cron": "@daily"}))
        .send()
        .await
        .unwrap();
    problem(worker, StatusCode::FORBIDDEN, "forbidden").await;
    let garbage = app
        .request(Method::POST, "/v1/schedules", &app.client_key)
        .header("Content-Type", "application/json")
        .body("{\"kind\":")
        .send()
        .await
        .unwrap();
    problem(garbage, StatusCode::BAD_REQUEST, "invalid_request").await;
    let huge = json!({"kind": "report", "cron": "@daily", "input": {"blob": "x".repeat(2 << 20)}});
    let response = create(&app, &huge).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Malformed ids are unknown ids; page tokens must be ones the server gave.
    problem(
        app.request(Method::GET, "/v1/schedules/op_nope", &app.client_key)
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        app.request(Method::GET, "/v1/schedules?page_token=zzz", &app.client_key)
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        app.request(Method::GET, "/v1/schedules?page_size=101", &app.client_key)
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    // A client may not use the firings' keys.
    let forged = app
        .submit(
            "schedule:sch_00000000000000000000000000:2027-01-04T10:01:00.000Z",
            &json!({"kind": "report"}),
        )
        .await;
    problem(forged, StatusCode::BAD_REQUEST, "invalid_request").await;
}

#[tokio::test]
async fn each_firing_time_makes_one_operation_that_names_its_schedule() {
    let (app, clock) = app_at_start().await;
    let schedule = create_ok(&app, &json!({"kind": "report", "input": {"n": 1}, "cron": "@every 1m", "overlap": "allow", "labels": {"from": "schedule"}})).await;
    let id = schedule["id"].as_str().unwrap();
    assert_eq!(schedule["next_fire_times"][0], "2027-01-04T10:01:00.000Z");
    // Nothing is due yet.
    assert!(fires(&app, id).await.is_empty());

    clock.advance(Duration::from_secs(30));
    let first = wait_for_fires(&app, id, 1).await;
    assert_eq!(decisions(&first), [pair("2027-01-04T10:01:00.000Z", "started")]);
    let op_id = first[0]["operation_id"].as_str().unwrap();
    let op = app.get_operation(op_id).await;
    assert_eq!(op["schedule_id"], json!(id));
    assert_eq!(op["labels"], json!({"from": "schedule"}));
    assert_eq!(op["state"], "queued");
    // The firing is an ordinary operation; its webhook-free history starts as any.
    let history = app.get_json(&format!("/v1/operations/{op_id}/history")).await;
    assert_eq!(history["events"][0]["type"], "created");

    // Two minutes later: two more, one each, in order; the schedule moves on.
    clock.advance(Duration::from_secs(120));
    let three = wait_for_fires(&app, id, 3).await;
    assert_eq!(
        decisions(&three),
        [
            pair("2027-01-04T10:01:00.000Z", "started"),
            pair("2027-01-04T10:02:00.000Z", "started"),
            pair("2027-01-04T10:03:00.000Z", "started")
        ]
    );
    let read = app.get_json(&format!("/v1/schedules/{id}")).await;
    assert_eq!(read["next_fire_times"][0], "2027-01-04T10:04:00.000Z");
    assert_eq!(read["last_operation_id"], three[0]["operation_id"]);
    // Exactly one operation per firing time.
    let listed = app.get_json("/v1/operations?label=from:schedule").await;
    assert_eq!(listed["operations"].as_array().unwrap().len(), 3);
    // Rounds keep running; nothing is fired twice.
    for _ in 0..5 {
        assert_eq!(fires(&app, id).await.len(), 3);
    }
    assert_eq!(
        app.get_json("/v1/operations?label=from:schedule").await["operations"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // A paused schedule does not fire; resumed, it counts from now.
    patch(&app, id, read["version"].as_i64(), &json!({"paused": true})).await;
    clock.advance(Duration::from_secs(600));
    let resumed = patch(
        &app,
        id,
        Some(read["version"].as_i64().unwrap() + 1),
        &json!({"paused": false}),
    )
    .await
    .json::<Value>()
    .await
    .unwrap();
    assert_eq!(resumed["next_fire_times"][0], "2027-01-04T10:14:00.000Z");
}

#[tokio::test]
async fn overlap_skip_and_buffer_one_wait_for_the_running_firing() {
    let (app, clock) = app_at_start().await;
    let skip = create_ok(&app, &json!({"kind": "report", "cron": "@every 1m"})).await;
    let skip_id = skip["id"].as_str().unwrap();
    let buffer = create_ok(
        &app,
        &json!({"kind": "report", "cron": "@every 1m", "overlap": "buffer_one"}),
    )
    .await;
    let buffer_id = buffer["id"].as_str().unwrap();
    clock.advance(Duration::from_secs(30));
    wait_for_fires(&app, skip_id, 1).await;
    wait_for_fires(&app, buffer_id, 1).await;

    // The first firings are still queued at 10:02 and 10:03.
    clock.advance(Duration::from_secs(60));
    wait_for_fires(&app, skip_id, 2).await;
    wait_for_fires(&app, buffer_id, 2).await;
    clock.advance(Duration::from_secs(60));
    let skipped = wait_for_fires(&app, skip_id, 3).await;
    assert_eq!(
        decisions(&skipped),
        [
            pair("2027-01-04T10:01:00.000Z", "started"),
            pair("2027-01-04T10:02:00.000Z", "skipped"),
            pair("2027-01-04T10:03:00.000Z", "skipped")
        ]
    );
    let buffered = wait_for_fires(&app, buffer_id, 3).await;
    assert_eq!(
        decisions(&buffered),
        [
            pair("2027-01-04T10:01:00.000Z", "started"),
            pair("2027-01-04T10:02:00.000Z", "buffered"),
            pair("2027-01-04T10:03:00.000Z", "skipped")
        ]
    );

    // The buffer_one schedule's running firing ends: its held-back one starts.
    let first = buffered.last().unwrap()["operation_id"].as_str().unwrap().to_owned();
    let tasks = app.claim("report", 10).await;
    let task = tasks
        .iter()
        .find(|t| t["operation_id"] == json!(first))
        .expect("the first firing is claimable");
    let done = app
        .worker_post(
            &format!("/v1/worker/tasks/{first}/complete"),
            &json!({"lease_token": task["lease_token"]}),
        )
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = fires(&app, buffer_id).await;
        let held = now
            .iter()
            .find(|f| f["fire_time"] == "2027-01-04T10:02:00.000Z")
            .unwrap()
            .clone();
        if held["decision"] == "started" {
            let op = app.get_operation(held["operation_id"].as_str().unwrap()).await;
            assert_eq!(op["schedule_id"], json!(buffer_id));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held-back firing never started: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn firings_missed_while_down_start_within_the_catchup_window_only() {
    let (app, clock) = app_at_start().await;
    let schedule = create_ok(
        &app,
        &json!({"kind": "report", "cron": "@every 1m", "overlap": "allow", "catchup_window": 120}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap();
    // Every node was "down" for an hour: the clock jumps.
    clock.advance(Duration::from_secs(3600));
    let fires = wait_for_fires(&app, id, 3).await;
    // 11:00:30 now; the window opens at 10:58:30, so 10:59 is the first inside it.
    assert_eq!(
        decisions(&fires),
        [
            pair("2027-01-04T10:01:00.000Z", "missed"),
            pair("2027-01-04T10:59:00.000Z", "started"),
            pair("2027-01-04T11:00:00.000Z", "started")
        ]
    );
}

#[tokio::test]
async fn a_trigger_fires_now_whatever_the_overlap_policy_says() {
    let (app, clock) = app_at_start().await;
    let schedule = create_ok(&app, &json!({"kind": "report", "cron": "@yearly"})).await;
    let id = schedule["id"].as_str().unwrap();
    let response = app
        .request(Method::POST, &format!("/v1/schedules/{id}/trigger"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let op: Value = response.json().await.unwrap();
    assert_eq!(op["schedule_id"], json!(id));
    assert_eq!(op["state"], "queued");
    clock.advance(Duration::from_millis(5));
    let again: Value = app
        .request(Method::POST, &format!("/v1/schedules/{id}/trigger"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(again["id"], op["id"], "a second trigger is a second firing");
    let fires = fires(&app, id).await;
    assert_eq!(fires.len(), 2);
    assert!(fires.iter().all(|f| f["decision"] == "triggered"));
    let read = app.get_json(&format!("/v1/schedules/{id}")).await;
    assert_eq!(read["last_operation_id"], again["id"]);
    // Unknown schedules are 404.
    let unknown = app
        .request(
            Method::POST,
            "/v1/schedules/sch_00000000000000000000000000/trigger",
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    problem(unknown, StatusCode::NOT_FOUND, "not_found").await;
}

/// A node that submitted a firing and died before moving the schedule on
/// leaves the time due; the next round finds that operation by the
/// firing's key instead of making a second one.
#[tokio::test]
async fn a_firing_submitted_by_a_node_that_died_is_found_not_repeated() {
    use longrun_core::fingerprint::Fingerprinter;
    use longrun_core::{Id, IdKind, IdempotencyKey};

    let (app, clock) = app_at_start().await;
    let schedule = create_ok(&app, &json!({"kind": "report", "cron": "@every 1m"})).await;
    let id = schedule["id"].as_str().unwrap();
    let fire_time = Timestamp::parse_rfc3339("2027-01-04T10:01:00Z").unwrap();
    // What the dead node wrote: the firing's operation, nothing else. (Its
    // fingerprint is not the server's, as if the definition changed since.)
    let orphan = app
        .store
        .operation_accept(longrun_store::AcceptParams {
            id: Id::generate(IdKind::Operation),
            tenant: "acme".into(),
            kind: "report".into(),
            input: Value::Null,
            callback_url: None,
            deadline_at: None,
            budget_max_cost: None,
            labels: Default::default(),
            idempotency: Some((
                IdempotencyKey::for_firing(id, fire_time),
                Fingerprinter::new(b"another node").fingerprint(&json!({"kind": "report"})),
            )),
            uploads: Vec::new(),
            rerun_of: None,
            from_checkpoint: false,
            not_before: None,
            priority: 5,
            now: fire_time,
        })
        .await
        .unwrap();
    let longrun_store::AcceptOutcome::Created(orphan) = orphan else {
        panic!("the orphan is created")
    };
    clock.advance(Duration::from_secs(30));
    let fires = wait_for_fires(&app, id, 1).await;
    assert_eq!(decisions(&fires), [pair("2027-01-04T10:01:00.000Z", "started")]);
    assert_eq!(fires[0]["operation_id"], json!(orphan.id.as_str()));
    assert_eq!(app.operation_count("acme").await, 1, "no second operation");
    let op = app.get_operation(orphan.id.as_str()).await;
    assert_eq!(op["schedule_id"], json!(id));
}

async fn backfill(app: &TestApp, id: &str, start: &str, end: &str) -> reqwest::Response {
    app.request(Method::POST, &format!("/v1/schedules/{id}/backfill"), &app.client_key)
        .json(&json!({"start": start, "end": end}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_backfill_fires_the_past_times_that_have_no_operation_once() {
    let (app, clock) = app_at_start().await;
    let schedule = create_ok(
        &app,
        &json!({"kind": "report", "cron": "@every 1m", "overlap": "allow", "catchup_window": 120}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap();
    clock.advance(Duration::from_secs(3600));
    wait_for_fires(&app, id, 3).await;

    // 10:01 was missed; 10:59 fired. 10:01–10:05 get an operation each, 10:59 keeps its own.
    let response = backfill(&app, id, "2027-01-04T10:01:00Z", "2027-01-04T10:05:30Z").await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let body: Value = response.json().await.unwrap();
    let times: Vec<&str> = body["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["fire_time"].as_str().unwrap())
        .collect();
    assert_eq!(
        times,
        [
            "2027-01-04T10:01:00.000Z",
            "2027-01-04T10:02:00.000Z",
            "2027-01-04T10:03:00.000Z",
            "2027-01-04T10:04:00.000Z",
            "2027-01-04T10:05:00.000Z"
        ]
    );
    assert!(
        body["fires"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["decision"] == "backfilled")
    );
    let op = body["fires"][0]["operation_id"].as_str().unwrap();
    assert_eq!(app.get_operation(op).await["schedule_id"], json!(id));
    // Again, and over a time that fired on its own: nothing new.
    let again: Value = backfill(&app, id, "2027-01-04T10:01:00Z", "2027-01-04T10:59:00Z")
        .await
        .json()
        .await
        .unwrap();
    let new: Vec<&str> = again["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["fire_time"].as_str().unwrap())
        .collect();
    assert_eq!(new.len(), 53, "10:06 to 10:58: {new:?}");
    assert_eq!(app.operation_count("acme").await, 2 + 5 + 53);
    let fires = fires(&app, id).await;
    let first = fires
        .iter()
        .find(|f| f["fire_time"] == "2027-01-04T10:01:00.000Z")
        .unwrap();
    assert_eq!(
        first["decision"], "backfilled",
        "the missed record now names its operation"
    );

    // Refusals.
    problem(
        backfill(&app, id, "2027-01-04T11:00:00Z", "2027-01-04T12:00:00Z").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        backfill(&app, id, "2027-01-04T10:05:00Z", "2027-01-04T10:01:00Z").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        backfill(&app, id, "2026-01-01T00:00:00Z", "2027-01-04T10:00:00Z").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        backfill(&app, id, "yesterday", "2027-01-04T10:00:00Z").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        backfill(
            &app,
            "sch_00000000000000000000000000",
            "2027-01-04T10:01:00Z",
            "2027-01-04T10:02:00Z",
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let theirs = app
        .request(
            Method::POST,
            &format!("/v1/schedules/{id}/backfill"),
            &app.other_tenant_key,
        )
        .json(&json!({"start": "2027-01-04T10:01:00Z", "end": "2027-01-04T10:02:00Z"}))
        .send()
        .await
        .unwrap();
    problem(theirs, StatusCode::NOT_FOUND, "not_found").await;
}

/// The contract's promise that a firing's webhooks name its schedule:
/// a real receiver on loopback reads `data.schedule_id`.
#[tokio::test]
async fn a_firings_webhooks_carry_its_schedule_id() {
    let clock = manual_clock();
    clock.set(Timestamp::parse_rfc3339(START).unwrap());
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        webhooks_to_loopback: true,
        ..Options::default()
    })
    .await;
    app.declare_kind("report", true, 3).await;
    let receiver = Receiver::start(vec![]).await;
    let schedule = create_ok(
        &app,
        &json!({"kind": "report", "cron": "@yearly", "callback": {"url": receiver.url}}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap();
    let fired: Value = app
        .request(Method::POST, &format!("/v1/schedules/{id}/trigger"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op = fired["id"].as_str().unwrap();
    let cancelled = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{op}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let got = receiver.received();
        if let Some(r) = got.iter().find(|r| r.body.contains("operation.cancelled")) {
            break serde_json::from_str::<Value>(&r.body).unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "no webhook: {got:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(body["data"]["operation_id"], json!(op));
    assert_eq!(body["data"]["schedule_id"], json!(id));

    // An operation submitted by hand names no schedule, in its webhooks either.
    let own = app
        .submit_ok("by-hand", &json!({"kind": "report", "callback": {"url": receiver.url}}))
        .await;
    assert!(own.get("schedule_id").is_none(), "{own}");
}

/// A client may not use a firing's key anywhere a key is taken: the batch
/// refuses the item (and creates nothing), the single submit refuses it.
#[tokio::test]
async fn a_firings_key_is_refused_from_clients_in_a_batch_too() {
    let (app, _clock) = app_at_start().await;
    let key = "schedule:sch_00000000000000000000000000:2027-01-04T10:01:00.000Z";
    let batch: Value = app
        .request(Method::POST, "/v1/operations/batch", &app.client_key)
        .json(&json!({"operations": [
            {"idempotency_key": key, "kind": "report"},
            {"idempotency_key": "plain-1", "kind": "report"}
        ]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(batch["results"][0]["status"], 400, "{batch}");
    assert_eq!(batch["results"][0]["problem"]["code"], "invalid_request");
    assert_eq!(batch["results"][1]["status"], 202);
    assert_eq!(app.operation_count("acme").await, 1);
    problem(
        app.submit(key, &json!({"kind": "report"})).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
}
