//! Results as expiring artifacts and retention (docs/api.md §3 "Results",
//! "Retention"): the export kind, signed download links with `Range`, worker
//! uploads, cleanup of cancelled work, and retention walked with a manual clock.

use std::time::Duration;

use longrun_core::apikey::Role;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Options, TestApp, create_key, manual_clock, problem, spawn_app, spawn_app_with};

fn sha256_hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(&Sha256::digest(bytes))
}

async fn export(app: &TestApp, key: &str, rows: u64, format: &str) -> Value {
    let op = app
        .submit_ok(
            key,
            &json!({"kind": "export", "input": {"rows": rows, "format": format}}),
        )
        .await;
    app.wait_for_state(op["id"].as_str().unwrap(), "succeeded").await
}

async fn result_resource(app: &TestApp, id: &str) -> reqwest::Response {
    app.request(Method::GET, &format!("/v1/operations/{id}/result"), &app.client_key)
        .send()
        .await
        .unwrap()
}

async fn download_url(app: &TestApp, id: &str) -> String {
    let response = result_resource(app, id).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    app.url(body["download"]["url"].as_str().unwrap())
}

#[tokio::test]
async fn an_export_downloads_through_a_signed_link_without_a_key_and_resumes_with_range() {
    let app = spawn_app().await;
    let rows = 20_000;
    let op = export(&app, "export-csv", rows, "csv").await;
    let id = op["id"].as_str().unwrap();
    let artifact = &op["result"]["artifact"];
    assert!(artifact["id"].as_str().unwrap().starts_with("res_"));
    assert_eq!(artifact["content_type"], "text/csv; charset=utf-8");
    assert_eq!(op["links"]["result"], format!("/v1/operations/{id}/result"));
    assert_eq!(op["progress"]["completed_units"], rows as f64);
    assert_eq!(op["progress"]["unit"], "rows");

    let resource: Value = result_resource(&app, id).await.json().await.unwrap();
    for field in [
        "id",
        "operation_id",
        "content_type",
        "size_bytes",
        "sha256",
        "created_at",
        "expires_at",
        "download",
    ] {
        assert!(resource.get(field).is_some(), "{field} missing: {resource}");
    }
    assert_eq!(resource["id"], artifact["id"]);
    let url = app.url(resource["download"]["url"].as_str().unwrap());

    // No API key: the link is the authorisation.
    let whole = app.http.get(&url).send().await.unwrap();
    assert_eq!(whole.status(), StatusCode::OK);
    let headers = whole.headers().clone();
    let bytes = whole.bytes().await.unwrap();
    assert_eq!(headers["content-length"], bytes.len().to_string().as_str());
    assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(headers["accept-ranges"], "bytes");
    assert_eq!(
        headers["content-disposition"],
        format!("attachment; filename=\"{id}.csv\"").as_str()
    );
    assert_eq!(
        headers["etag"],
        format!("\"{}\"", resource["sha256"].as_str().unwrap()).as_str()
    );
    assert_eq!(
        sha256_hex(&bytes),
        resource["sha256"].as_str().unwrap(),
        "the bytes match the published SHA-256"
    );
    assert_eq!(bytes.len() as i64, resource["size_bytes"].as_i64().unwrap());
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.starts_with("id,name,email,company,country,created_at,balance\r\n"));
    assert_eq!(
        text.matches("\r\n").count() as u64,
        rows + 1,
        "a header row and one line per row"
    );

    // A download cut at 1000 bytes resumes with Range.
    let first = &bytes[..1000];
    let rest = app.http.get(&url).header("Range", "bytes=1000-").send().await.unwrap();
    assert_eq!(rest.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        rest.headers()["content-range"],
        format!("bytes 1000-{}/{}", bytes.len() - 1, bytes.len()).as_str()
    );
    let rest = rest.bytes().await.unwrap();
    assert_eq!([first, &rest[..]].concat(), bytes.to_vec());
    let suffix = app
        .http
        .get(&url)
        .header("Range", "bytes=-10")
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&suffix[..], &bytes[bytes.len() - 10..]);
    let beyond = app
        .http
        .get(&url)
        .header("Range", format!("bytes={}-", bytes.len()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        beyond.headers()["content-range"],
        format!("bytes */{}", bytes.len()).as_str()
    );
    problem(beyond, StatusCode::RANGE_NOT_SATISFIABLE, "invalid_request").await;

    // JSON Lines too.
    let jsonl = export(&app, "export-jsonl", 100, "jsonl").await;
    let url = download_url(&app, jsonl["id"].as_str().unwrap()).await;
    let text = app.http.get(&url).send().await.unwrap().text().await.unwrap();
    assert_eq!(text.lines().count(), 100);
    assert!(text.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()));
    app.shutdown().await;
}

#[tokio::test]
async fn tampered_expired_and_foreign_links_are_refused_and_rotation_keeps_links_working() {
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    let op = export(&app, "links", 10, "csv").await;
    let id = op["id"].as_str().unwrap();
    let url = download_url(&app, id).await;
    assert_eq!(app.http.get(&url).send().await.unwrap().status(), StatusCode::OK);

    let other = export(&app, "links-other", 10, "csv").await;
    let other_id = other["result"]["artifact"]["id"].as_str().unwrap();
    let mine = op["result"]["artifact"]["id"].as_str().unwrap();
    let tampered_signature = {
        let (head, signature) = url.rsplit_once("signature=").unwrap();
        let flipped = if signature.starts_with('A') { "B" } else { "A" };
        format!("{head}signature={flipped}{}", &signature[1..])
    };
    let longer = url.replace("expires=", "expires=9");
    let elsewhere = url.replace(mine, other_id);
    let unknown_key = url.replace("kid=", "kid=zz");
    for bad in [tampered_signature, longer, elsewhere, unknown_key] {
        let response = app.http.get(&bad).send().await.unwrap();
        let body = problem(response, StatusCode::FORBIDDEN, "forbidden").await;
        assert!(body["detail"].as_str().unwrap().contains("signature"), "{body}");
    }
    let no_signature = app.http.get(url.split('?').next().unwrap()).send().await.unwrap();
    problem(no_signature, StatusCode::BAD_REQUEST, "invalid_request").await;

    // A new key signs new links; links signed by the old one keep working.
    longrun_server::add_link_key(app.store.as_ref(), &longrun_core::SystemClock)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let new_url = download_url(&app, id).await;
    assert_eq!(app.http.get(&new_url).send().await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        app.http.get(&url).send().await.unwrap().status(),
        StatusCode::OK,
        "in-flight links survive a rotation"
    );

    clock.advance(Duration::from_secs(301));
    let expired = app.http.get(&url).send().await.unwrap();
    let body = problem(expired, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(body["detail"].as_str().unwrap().contains("expired"), "{body}");
    app.shutdown().await;
}

#[tokio::test]
async fn result_resources_answer_only_for_artifacts_of_the_tenant() {
    let app = spawn_app().await;
    let op = export(&app, "owned", 10, "csv").await;
    let id = op["id"].as_str().unwrap();
    let foreign = app
        .request(
            Method::GET,
            &format!("/v1/operations/{id}/result"),
            &app.other_tenant_key,
        )
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    let inline = app.submit_ok("inline", &crate::helpers::sleep_body(1)).await;
    let inline_id = inline["id"].as_str().unwrap();
    app.wait_for_state(inline_id, "succeeded").await;
    problem(
        result_resource(&app, inline_id).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_export_leaves_no_artifact_and_no_temporary_object() {
    let app = spawn_app().await;
    let op = app
        .submit_ok(
            "cancel-export",
            &json!({"kind": "export", "input": {"rows": 50_000_000}}),
        )
        .await;
    let id = op["id"].as_str().unwrap();
    app.wait_for(id, "the export to write", |op| {
        op["progress"]["completed_units"].as_f64().unwrap_or(0.0) > 0.0
    })
    .await;
    assert!(!app.artifact_files().is_empty(), "an upload is in progress");
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
    let done = app.wait_for_state(id, "cancelled").await;
    assert_eq!(done["result"], Value::Null);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !app.artifact_files().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: {:?}",
            app.artifact_files()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    problem(result_resource(&app, id).await, StatusCode::NOT_FOUND, "not_found").await;
    app.shutdown().await;
}

#[tokio::test]
async fn remote_workers_upload_artifacts_that_complete_publishes() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        max_artifact_bytes: 64 * 1024,
        ..Options::default()
    })
    .await;
    app.declare_kind("render", false, 1).await;
    let op = app.submit_ok("render", &json!({"kind": "render"})).await;
    let id = op["id"].as_str().unwrap();
    let task = app.claim("render", 1).await.remove(0);
    let path = format!("/v1/worker/tasks/{id}/artifact");
    let put = |token: Option<&str>, body: Vec<u8>| {
        let mut request = app
            .request(Method::PUT, &path, &app.worker_key)
            .header("Content-Type", "image/png")
            .body(body);
        if let Some(t) = token {
            request = request.header("Lease-Token", t);
        }
        request.send()
    };
    let token = task["lease_token"].as_str().unwrap();
    problem(
        put(None, b"png".to_vec()).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    problem(
        put(Some("stale"), b"png".to_vec()).await.unwrap(),
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    problem(
        put(Some(token), vec![0u8; 65 * 1024]).await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    let as_client = app
        .request(Method::PUT, &path, &app.client_key)
        .header("Lease-Token", token)
        .body("x")
        .send()
        .await
        .unwrap();
    problem(as_client, StatusCode::FORBIDDEN, "forbidden").await;

    let image = (0..40_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let uploaded = put(Some(token), image.clone()).await.unwrap();
    assert_eq!(uploaded.status(), StatusCode::CREATED);
    let uploaded: Value = uploaded.json().await.unwrap();
    assert_eq!(uploaded["size_bytes"], 40_000);
    assert_eq!(uploaded["sha256"], sha256_hex(&image));
    problem(result_resource(&app, id).await, StatusCode::NOT_FOUND, "not_found").await;

    let completed = app
        .worker_post(
            &format!("/v1/worker/tasks/{id}/complete"),
            &json!({"lease_token": token}),
        )
        .await;
    assert_eq!(completed.status(), StatusCode::OK);
    let op = app.get_operation(id).await;
    assert_eq!(op["result"]["artifact"]["id"], uploaded["id"]);
    let url = download_url(&app, id).await;
    let response = app.http.get(&url).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "image/png");
    assert_eq!(response.bytes().await.unwrap().to_vec(), image);
    app.shutdown().await;
}

#[tokio::test]
async fn a_poll_answered_from_memory_is_gone_as_soon_as_the_operation_expires() {
    // Visibility is decided at read time, not by the sweep: a poll the read
    // cache answers (shared, not re-read) says 410 the moment the
    // operation's retention has passed, before anything removed it.
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    let op = app.submit_ok("expiring", &crate::helpers::sleep_body(0)).await;
    let id = op["id"].as_str().unwrap().to_owned();
    app.wait_for_state(&id, "succeeded").await;
    let path = format!("/v1/operations/{id}");
    for _ in 0..2 {
        let kept = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
        assert_eq!(kept.status(), StatusCode::OK);
    }
    clock.advance(Duration::from_secs(31 * 24 * 3600));
    let response = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
    problem(response, StatusCode::GONE, "gone").await;
    app.shutdown().await;
}

#[tokio::test]
async fn retention_expires_results_then_removes_operations_behind_a_tombstone() {
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    let body = json!({"kind": "export", "input": {"rows": 10}});
    let op = app.submit_ok("retained", &body).await;
    let id = op["id"].as_str().unwrap().to_owned();
    let done = app.wait_for_state(&id, "succeeded").await;
    assert!(
        done["expires_at"].is_string(),
        "a terminal operation says when it will be removed"
    );
    assert!(!app.artifact_files().is_empty());

    // The result expires after 24 h; the operation stays succeeded.
    clock.advance(Duration::from_secs(24 * 3600 + 1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = result_resource(&app, &id).await;
        if response.status() == StatusCode::GONE {
            problem(response, StatusCode::GONE, "result_expired").await;
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the result never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.get_operation(&id).await["state"], "succeeded");
    app.wait_for(&id, "the artifact bytes to go", |_| app.artifact_files().is_empty())
        .await;

    // The operation is removed after 30 days: 410 gone, also for a replay.
    clock.advance(Duration::from_secs(30 * 24 * 3600));
    let path = format!("/v1/operations/{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
        if response.status() == StatusCode::GONE {
            problem(response, StatusCode::GONE, "gone").await;
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the operation was never removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for sub in ["/history", "/cancellation", "/deliveries", "/result"] {
        let response = app
            .request(Method::GET, &format!("{path}{sub}"), &app.client_key)
            .send()
            .await
            .unwrap();
        problem(response, StatusCode::GONE, "gone").await;
    }
    problem(app.submit("retained", &body).await, StatusCode::GONE, "gone").await;
    let foreign = app
        .request(Method::GET, &path, &app.other_tenant_key)
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;

    // After the tombstone window: 404, and the key is free again.
    clock.advance(Duration::from_secs(30 * 24 * 3600));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = app.request(Method::GET, &path, &app.client_key).send().await.unwrap();
        if response.status() == StatusCode::NOT_FOUND {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the tombstone never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = app.submit("retained", &body).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert!(again.headers().get("idempotent-replayed").is_none());
    app.shutdown().await;
}

/// Visibility is decided when the request is read, not by the sweep: with
/// no sweep running at all, a result and an operation answer `410` from the
/// instant their `expires_at` passes.
#[tokio::test]
async fn results_and_operations_answer_410_from_their_expiry_without_a_sweep() {
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        // The sweep runs once at start (nothing is due) and never again here.
        retention_interval: Duration::from_secs(24 * 3600),
        ..Options::default()
    })
    .await;
    let body = json!({"kind": "export", "input": {"rows": 10}});
    let op = app.submit_ok("expiring", &body).await;
    let id = op["id"].as_str().unwrap().to_owned();
    let done = app.wait_for_state(&id, "succeeded").await;
    let version = done["version"].as_i64().unwrap();

    // A minute before the result's expiry: a link is minted and works.
    clock.advance(Duration::from_secs(24 * 3600 - 60));
    let url = download_url(&app, &id).await;
    assert_eq!(app.http.get(&url).send().await.unwrap().status(), StatusCode::OK);

    // At its expiry the result is gone at once, link or not; the operation stays.
    clock.advance(Duration::from_secs(60));
    problem(result_resource(&app, &id).await, StatusCode::GONE, "result_expired").await;
    problem(
        app.http.get(&url).send().await.unwrap(),
        StatusCode::GONE,
        "result_expired",
    )
    .await;
    assert_eq!(app.get_operation(&id).await["state"], "succeeded");

    // At the operation's expiry every read and change of it is 410 gone.
    clock.advance(Duration::from_secs(29 * 24 * 3600));
    let path = format!("/v1/operations/{id}");
    let mut calls: Vec<(Method, String)> = ["", "/history", "/cancellation", "/deliveries", "/result", "/events"]
        .iter()
        .map(|sub| (Method::GET, format!("{path}{sub}")))
        .collect();
    calls.push((Method::PUT, format!("{path}/cancellation")));
    calls.push((Method::DELETE, path.clone()));
    for (method, url) in calls {
        let response = app.request(method, &url, &app.client_key).send().await.unwrap();
        problem(response, StatusCode::GONE, "gone").await;
    }
    let patch = app
        .request(Method::PATCH, &path, &app.client_key)
        .header("if-match", format!("\"{version}\""))
        .json(&json!({"labels": {"a": "b"}}))
        .send()
        .await
        .unwrap();
    problem(patch, StatusCode::GONE, "gone").await;
    problem(app.submit("expiring", &body).await, StatusCode::GONE, "gone").await;
    let list: Value = app
        .request(Method::GET, "/v1/operations", &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["operations"], json!([]), "an expired operation is not listed");
    let foreign = app
        .request(Method::GET, &path, &app.other_tenant_key)
        .send()
        .await
        .unwrap();
    problem(foreign, StatusCode::NOT_FOUND, "not_found").await;

    let stored = app
        .store
        .operation_get("acme", &longrun_core::Id::from_trusted(id))
        .await
        .unwrap();
    assert!(stored.is_some(), "no sweep ran: the record is still stored");
    app.shutdown().await;
}

#[tokio::test]
async fn deleting_a_tenant_leaves_no_row_and_no_file_of_it() {
    let app = spawn_app_with(Options {
        webhooks_to_loopback: true,
        ..Options::default()
    })
    .await;
    let doomed = create_key(app.store.as_ref(), "doomed", Role::Client).await;
    let submit = |key: &str, body: Value| {
        app.request(Method::POST, "/v1/operations", &doomed)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let exported = submit("d1", json!({"kind": "export", "input": {"rows": 100}}))
        .await
        .unwrap();
    let exported: Value = exported.json().await.unwrap();
    submit(
        "d2",
        json!({"kind": "sleep", "input": {"duration_ms": 1}, "callback": {"url": "http://127.0.0.1:9/hook"}}),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let op: Value = app
            .request(
                Method::GET,
                &format!("/v1/operations/{}", exported["id"].as_str().unwrap()),
                &doomed,
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if op["state"] == "succeeded" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kept = app
        .submit_ok("kept", &json!({"kind": "export", "input": {"rows": 10}}))
        .await;
    app.wait_for_state(kept["id"].as_str().unwrap(), "succeeded").await;
    assert_eq!(app.artifact_files().len(), 2);

    app.store
        .tenant_delete("doomed", longrun_core::Clock::now(&longrun_core::SystemClock))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while app.artifact_files().len() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "files left: {:?}",
            app.artifact_files()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let db = rusqlite::Connection::open(app.dir.path().join("longrun.db")).unwrap();
    let count = |sql: &str| -> i64 { db.query_row(sql, ["doomed"], |r| r.get(0)).unwrap() };
    for (table, sql) in [
        ("operations", "SELECT COUNT(*) FROM operations WHERE tenant = ?1"),
        (
            "events",
            "SELECT COUNT(*) FROM operation_events e WHERE ?1 = ?1 AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.seq = e.op_seq)",
        ),
        ("idempotency", "SELECT COUNT(*) FROM idempotency_keys WHERE tenant = ?1"),
        ("tasks", "SELECT COUNT(*) FROM tasks WHERE tenant = ?1"),
        ("results", "SELECT COUNT(*) FROM results WHERE tenant = ?1"),
        (
            "deliveries",
            "SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = ?1",
        ),
        (
            "attempts",
            "SELECT COUNT(*) FROM webhook_attempts a WHERE ?1 = ?1 AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.id = a.operation_id)",
        ),
        ("secrets", "SELECT COUNT(*) FROM webhook_secrets WHERE tenant = ?1"),
        ("keys", "SELECT COUNT(*) FROM api_keys WHERE tenant = ?1"),
        ("tenants", "SELECT COUNT(*) FROM tenants WHERE name = ?1"),
        ("tombstones", "SELECT COUNT(*) FROM tombstones WHERE tenant = ?1"),
    ] {
        assert_eq!(count(sql), 0, "rows of the deleted tenant left in {table}");
    }
    let refused = app
        .request(Method::GET, "/v1/operations", &doomed)
        .send()
        .await
        .unwrap();
    problem(refused, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    assert_eq!(
        app.get_operation(kept["id"].as_str().unwrap()).await["state"],
        "succeeded",
        "others are untouched"
    );
    app.shutdown().await;
}

/// A remote worker's resumable artifact: pieces at the offset the stored
/// ones end (a wrong one is `409` with `Upload-Offset`), replaced from where
/// a later piece starts, joined once into the artifact `complete` publishes;
/// fenced by the lease, refused to clients.
#[tokio::test]
async fn pieces_are_placed_at_their_offset_and_joined_into_the_artifact() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    app.declare_kind("pieced", true, 3).await;
    let op = app.submit_ok("pieced-1", &json!({"kind": "pieced"})).await;
    let id = op["id"].as_str().unwrap().to_owned();
    let task = app.claim("pieced", 1).await.remove(0);
    let token = task["lease_token"].as_str().unwrap().to_owned();
    let put = |offset: u64, body: &'static [u8], token: String, key: String| {
        let url = format!("/v1/worker/tasks/{id}/artifacts/default/pieces/{offset}");
        let app = &app;
        async move {
            app.request(Method::PUT, &url, &key)
                .header("lease-token", token)
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    let worker = app.worker_key.clone();
    let first = put(0, b"id,name\r\n", token.clone(), worker.clone()).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.json::<Value>().await.unwrap()["upload_offset"], 9);
    let stale = put(3, b"x", token.clone(), worker.clone()).await;
    assert_eq!(stale.headers()["upload-offset"], "9");
    problem(stale, StatusCode::CONFLICT, "upload_offset_mismatch").await;
    let wrong = put(9, b"1,Ada\r\n", token.clone(), worker.clone()).await;
    assert_eq!(wrong.json::<Value>().await.unwrap()["upload_offset"], 16);
    // Written again from 9 (as a resumed attempt would): the old piece goes.
    let again = put(9, b"1,Grace\r\n", token.clone(), worker.clone()).await;
    assert_eq!(again.json::<Value>().await.unwrap()["upload_offset"], 18);
    problem(
        put(18, b"2,Alan\r\n", "forged".into(), worker.clone()).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    problem(
        put(18, b"2,Alan\r\n", token.clone(), app.client_key.clone()).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;

    let join = |size: u64| {
        let (app, path) = (&app, format!("/v1/worker/tasks/{id}/artifacts/default/join"));
        let body = json!({"lease_token": token, "content_type": "text/csv", "size_bytes": size});
        async move { app.worker_post(&path, &body).await }
    };
    problem(join(17).await, StatusCode::CONFLICT, "upload_offset_mismatch").await;
    let bad_type = app
        .worker_post(
            &format!("/v1/worker/tasks/{id}/artifacts/default/join"),
            &json!({"lease_token": token, "content_type": "", "size_bytes": 18}),
        )
        .await;
    problem(bad_type, StatusCode::BAD_REQUEST, "invalid_request").await;
    let joined = join(18).await;
    assert_eq!(joined.status(), StatusCode::CREATED);
    let joined: Value = joined.json().await.unwrap();
    let expected = b"id,name\r\n1,Grace\r\n";
    assert_eq!(joined["sha256"], sha256_hex(expected));
    let done = app
        .worker_post(
            &format!("/v1/worker/tasks/{id}/complete"),
            &json!({"lease_token": token}),
        )
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let url = download_url(&app, &id).await;
    let bytes = app.http.get(url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[..], expected);
    app.shutdown().await;
}

/// The SDK's remote worker runs `export` over HTTP: its pieces go through
/// `…/pieces/{offset}` at the offsets the checkpoints name and are joined
/// by `…/join`; the file is the export's bytes.
#[tokio::test]
async fn a_remote_worker_exports_through_pieces_and_a_join() {
    use longrun_engine::kinds::export::{CSV_HEADER, Export, Format, render};
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    // Two pieces: 200,000 rows, then 10,000.
    let rows = 210_000;
    let op = app
        .submit_ok("remote-export", &json!({"kind": "export", "input": {"rows": rows}}))
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let worker = app.remote_worker(std::sync::Arc::new(Export), 4);
    let done = app.wait_for_state(&id, "succeeded").await;
    let expected = [CSV_HEADER.as_bytes(), render(Format::Csv, 0, rows).as_bytes()].concat();
    assert_eq!(done["result"]["artifact"]["sha256"], sha256_hex(&expected));
    let url = download_url(&app, &id).await;
    let bytes = app.http.get(url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(sha256_hex(&bytes), sha256_hex(&expected));
    worker.stop().await;
    app.shutdown().await;
}

/// An artifact over the server's limit fails its task for good, the same
/// for an in-process worker (the store link's `TooLarge`) and a remote one
/// (the server's `413 payload_too_large`): the same bytes would not fit on
/// a later attempt, so the export is not retried.
#[tokio::test]
async fn an_artifact_over_the_limit_fails_the_task_alike_in_process_and_remote() {
    use longrun_engine::kinds::export::Export;
    for remote in [false, true] {
        let app = spawn_app_with(Options {
            builtin_workers: !remote,
            max_artifact_bytes: 1024,
            ..Options::default()
        })
        .await;
        let op = app
            .submit_ok(
                &format!("too-large-{remote}"),
                &json!({"kind": "export", "input": {"rows": 5_000}}),
            )
            .await;
        let id = op["id"].as_str().unwrap().to_owned();
        let worker = remote.then(|| app.remote_worker(std::sync::Arc::new(Export), 2));
        let failed = app.wait_for_state(&id, "failed").await;
        assert_eq!(
            failed["error"]["code"], "artifact_too_large",
            "remote: {remote}: {failed}"
        );
        assert_eq!(failed["error"]["retryable"], false, "remote: {remote}");
        assert_eq!(failed["attempt"], 1, "remote: {remote}: not retried");
        if let Some(worker) = worker {
            worker.stop().await;
        }
        app.shutdown().await;
    }
}
