//! Uploads and the `import` kind over real HTTP, on the file system and on
//! the S3-compatible store (moto): resumable uploads cut mid-stream, digests,
//! limits, tenancy, idempotent imports, row errors kept as an artifact on
//! success and on failure, cancellation, expiry and tenant deletion.

use std::sync::Arc;
use std::time::Duration;

use longrun_engine::bytes::artifacts::{ArtifactStore, FileArtifacts};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::helpers::{Options, TestApp, manual_clock, problem, spawn_app_with};
use crate::s3::{s3_store, start_moto};

fn sha256_hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(&Sha256::digest(bytes))
}

fn digest_header(bytes: &[u8]) -> String {
    format!("sha-256=:{}:", data_encoding::BASE64.encode(&Sha256::digest(bytes)))
}

/// A CSV of `rows` customers; every `bad_every`-th row (1-based) has an
/// email without `@`.
fn customers(rows: usize, bad_every: usize) -> String {
    let mut csv = String::from("id,email,plan\n");
    for i in 1..=rows {
        let email = if bad_every > 0 && i % bad_every == 0 {
            format!("user{i}.example.com")
        } else {
            format!("user{i}@example.com")
        };
        let plan = if i % 2 == 0 { "pro" } else { "free" };
        csv.push_str(&format!("{i},{email},{plan}\n"));
    }
    csv
}

fn import_input(upload: &str, max_errors: u64) -> Value {
    json!({
        "upload": upload,
        "format": "csv",
        "schema": {"fields": {
            "id": {"type": "integer", "required": true, "min": 1},
            "email": {"type": "string", "required": true, "pattern": "^[^@]+@[^@]+$"},
            "plan": {"type": "string", "enum": ["free", "pro"]},
        }},
        "max_errors": max_errors,
    })
}

/// Uploads `bytes` whole in one request; the upload id.
async fn upload(app: &TestApp, key: &str, bytes: &[u8]) -> String {
    let response = app
        .request(Method::POST, "/v1/uploads", key)
        .header("content-type", "text/csv")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["upload-complete"], "?1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["sha256"], sha256_hex(bytes));
    assert_eq!(body["size_bytes"], bytes.len());
    body["id"].as_str().unwrap().to_owned()
}

async fn head_offset(app: &TestApp, id: &str) -> (u64, String) {
    let response = app
        .request(Method::HEAD, &format!("/v1/uploads/{id}"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let h = response.headers();
    (
        h["upload-offset"].to_str().unwrap().parse().unwrap(),
        h["upload-complete"].to_str().unwrap().to_owned(),
    )
}

/// Sends a PATCH whose head declares `declared` bytes but whose body stops
/// after `sent` of them: the connection is closed mid-stream.
async fn cut_patch(app: &TestApp, id: &str, offset: usize, body: &[u8], sent: usize) {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PATCH /v1/uploads/{id} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Upload-Offset: {offset}\r\nUpload-Complete: ?1\r\nContent-Type: application/partial-upload\r\n\
         Content-Length: {}\r\n\r\n",
        app.client_key,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..sent]).await.unwrap();
    stream.flush().await.unwrap();
    drop(stream);
}

/// What is in the artifact store, results and upload pieces alike.
async fn objects(store: &dyn ArtifactStore) -> Vec<String> {
    store.list().await.unwrap()
}

async fn wait_until_objects(store: &dyn ArtifactStore, what: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = objects(store).await;
        if done(&now) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: objects {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn uploads_resume_check_digests_limits_and_tenancy(app: &TestApp, store: &dyn ArtifactStore) {
    // Resumable: create with no bytes, send half, lose the connection, ask
    // where the server stands, send the rest.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let created = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .header("upload-complete", "?0")
        .header("content-type", "application/octet-stream")
        .header("repr-digest", digest_header(&data))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(created.headers()["upload-offset"], "0");
    let id = location.trim_start_matches("/v1/uploads/").to_owned();
    let half = 1_234_567;
    cut_patch(app, &id, 0, &data, half).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let offset = loop {
        let (offset, complete) = head_offset(app, &id).await;
        assert_eq!(complete, "?0", "a cut body does not complete the upload");
        if offset > 0 {
            break offset;
        }
        assert!(tokio::time::Instant::now() < deadline, "the cut piece was never kept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(offset, half as u64, "what arrived before the cut is kept, exactly");
    // A stale offset is refused before the body is read, with the right one.
    let stale = app
        .request(Method::PATCH, &location, &app.client_key)
        .header("upload-offset", "0")
        .header("upload-complete", "?1")
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(stale.headers()["upload-offset"], half.to_string().as_str());
    problem(stale, StatusCode::CONFLICT, "upload_offset_mismatch").await;
    let rest = app
        .request(Method::PATCH, &location, &app.client_key)
        .header("upload-offset", half.to_string())
        .header("upload-complete", "?1")
        .header("content-digest", digest_header(&data[half..]))
        .body(data[half..].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), StatusCode::OK);
    let done: Value = rest.json().await.unwrap();
    assert_eq!(done["complete"], true);
    assert_eq!(
        done["sha256"],
        sha256_hex(&data),
        "the resumed upload is byte-identical"
    );
    assert_eq!(done["size_bytes"], data.len());
    assert_eq!(head_offset(app, &id).await, (data.len() as u64, "?1".to_owned()));
    let late = app
        .request(Method::PATCH, &location, &app.client_key)
        .header("upload-offset", data.len().to_string())
        .header("upload-complete", "?1")
        .body("more")
        .send()
        .await
        .unwrap();
    problem(late, StatusCode::CONFLICT, "upload_offset_mismatch").await;
    // The pieces were joined into one object.
    wait_until_objects(store, "one object for the upload", |o| {
        o.iter().filter(|k| k.contains(&id)).count() == 1
    })
    .await;

    // Two appends racing at one offset: one is kept, the other refused.
    let created: Value = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .header("upload-complete", "?0")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let raced = format!("/v1/uploads/{}", created["id"].as_str().unwrap());
    let bodies = [vec![b'a'; 1 << 20], vec![b'b'; 1 << 20]];
    let send = |body: Vec<u8>| {
        app.request(Method::PATCH, &raced, &app.client_key)
            .header("upload-offset", "0")
            .header("upload-complete", "?1")
            .body(body)
            .send()
    };
    let (first, second) = tokio::join!(send(bodies[0].clone()), send(bodies[1].clone()));
    let (first, second) = (first.unwrap(), second.unwrap());
    let statuses = [first.status(), second.status()];
    assert!(
        statuses.contains(&StatusCode::OK) && statuses.contains(&StatusCode::CONFLICT),
        "{statuses:?}"
    );
    let winner = if first.status() == StatusCode::OK { 0 } else { 1 };
    let kept: Value = app
        .request(Method::GET, &raced, &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(kept["sha256"], sha256_hex(&bodies[winner]), "the winner's bytes, whole");
    wait_until_objects(store, "the loser's piece is deleted", |o| {
        o.iter().filter(|k| k.contains(created["id"].as_str().unwrap())).count() == 1
    })
    .await;

    // Digests: a request's body that is not what Content-Digest says is not kept…
    let wrong = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .header("content-digest", digest_header(b"something else"))
        .body("the body")
        .send()
        .await
        .unwrap();
    problem(wrong, StatusCode::BAD_REQUEST, "digest_mismatch").await;
    // …and a whole upload that is not what Repr-Digest said is removed.
    let created: Value = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .header("upload-complete", "?0")
        .header("repr-digest", digest_header(b"abcdef"))
        .body("abc")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let partial = created["id"].as_str().unwrap();
    let wrong = app
        .request(Method::PATCH, &format!("/v1/uploads/{partial}"), &app.client_key)
        .header("upload-offset", "3")
        .header("upload-complete", "?1")
        .body("xyz")
        .send()
        .await
        .unwrap();
    problem(wrong, StatusCode::BAD_REQUEST, "digest_mismatch").await;
    let gone = app
        .request(Method::GET, &format!("/v1/uploads/{partial}"), &app.client_key)
        .send()
        .await
        .unwrap();
    problem(gone, StatusCode::NOT_FOUND, "not_found").await;
    let malformed = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .header("content-digest", "sha-256=not-base64")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(malformed, StatusCode::BAD_REQUEST, "invalid_request").await;
    let no_offset = app
        .request(Method::PATCH, &location, &app.client_key)
        .header("upload-complete", "?1")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(no_offset, StatusCode::BAD_REQUEST, "invalid_request").await;

    // Tenancy and roles: another tenant's id is 404 on every method, like
    // an unknown one; a worker key may not upload.
    for method in [Method::GET, Method::PATCH] {
        let foreign = app
            .request(method.clone(), &location, &app.other_tenant_key)
            .header("upload-offset", "0")
            .header("upload-complete", "?1")
            .send()
            .await
            .unwrap();
        problem(foreign, StatusCode::NOT_FOUND, "not_found").await;
    }
    let foreign_head = app
        .request(Method::HEAD, &location, &app.other_tenant_key)
        .send()
        .await
        .unwrap();
    assert_eq!(foreign_head.status(), StatusCode::NOT_FOUND);
    let worker = app
        .request(Method::POST, "/v1/uploads", &app.worker_key)
        .body("x")
        .send()
        .await
        .unwrap();
    problem(worker, StatusCode::FORBIDDEN, "forbidden").await;
    let anonymous = app.http.post(app.url("/v1/uploads")).body("x").send().await.unwrap();
    problem(anonymous, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let foreign_import = app
        .request(Method::POST, "/v1/operations", &app.other_tenant_key)
        .header("idempotency-key", "foreign-upload")
        .json(&json!({"kind": "import", "input": import_input(&id, 0)}))
        .send()
        .await
        .unwrap();
    problem(foreign_import, StatusCode::UNPROCESSABLE_ENTITY, "invalid_input").await;
}

async fn oversized_uploads_are_refused(app: &TestApp) {
    // The limit of this app is 4 MiB: refused from Content-Length before a
    // byte is read, and while streaming when no length is declared.
    let big = vec![7u8; 5 << 20];
    let declared = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .body(big.clone())
        .send()
        .await
        .unwrap();
    problem(declared, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big.chunks(1 << 20).map(|c| Ok(c.to_vec())).collect();
    let streamed = app
        .request(Method::POST, "/v1/uploads", &app.client_key)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    problem(streamed, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
}

async fn result_artifact(app: &TestApp, id: &str, name: &str) -> (Value, Vec<u8>) {
    let resource: Value = app.get_json(&format!("/v1/operations/{id}/result")).await;
    let artifact = resource["artifacts"][name].clone();
    let url = app.url(
        artifact["download"]["url"]
            .as_str()
            .unwrap_or_else(|| panic!("{resource}")),
    );
    let bytes = app.http.get(url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(sha256_hex(&bytes), artifact["sha256"].as_str().unwrap());
    (artifact, bytes.to_vec())
}

fn lines(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn imports_keep_row_errors_on_success_and_failure(app: &TestApp) {
    let file = customers(1000, 100);
    let upload_id = upload(app, &app.client_key, file.as_bytes()).await;
    let submit = |key: &'static str, input: Value| async move {
        app.request(Method::POST, "/v1/operations", &app.client_key)
            .header("idempotency-key", key)
            .json(&json!({"kind": "import", "input": input}))
            .send()
            .await
            .unwrap()
    };
    let first = submit("import-1", import_input(&upload_id, 10)).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let op: Value = first.json().await.unwrap();
    let id = op["id"].as_str().unwrap().to_owned();
    // The same import again (a client that timed out): the same operation.
    let again = submit("import-1", import_input(&upload_id, 10)).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap()["id"], id.as_str());
    // Another file under the same key is a conflict, not a second import.
    let other = upload(app, &app.client_key, customers(10, 0).as_bytes()).await;
    let conflict = submit("import-1", import_input(&other, 10)).await;
    problem(conflict, StatusCode::CONFLICT, "idempotency_key_reused").await;
    // An upload that does not exist cannot be named.
    let unknown = submit("import-unknown", import_input(&format!("upl_{}", "a".repeat(26)), 1)).await;
    assert_eq!(unknown.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let done = app.wait_for_state(&id, "succeeded").await;
    assert_eq!(
        done["result"]["summary"],
        json!({"rows_total": 1000, "rows_accepted": 990, "rows_rejected": 10})
    );
    assert_eq!(done["progress"]["completed_units"], 1000.0);
    let (accepted, bytes) = result_artifact(app, &id, "accepted").await;
    assert_eq!(accepted["content_type"], "application/jsonl");
    let good = lines(&bytes);
    assert_eq!(good.len(), 990);
    assert_eq!(good[0], json!({"email": "user1@example.com", "id": 1, "plan": "free"}));
    let (_, bytes) = result_artifact(app, &id, "errors").await;
    let errors = lines(&bytes);
    assert_eq!(errors.len(), 10);
    for (n, error) in errors.iter().enumerate() {
        let row = (n + 1) * 100;
        // Line 1 is the header: row r is on line r + 1.
        assert_eq!(error["line"], row + 1, "{error}");
        assert_eq!(error["field"], "email");
        assert_eq!(error["code"], "pattern_mismatch");
        assert_eq!(
            error["raw"],
            format!(
                "{row},user{row}.example.com,{}",
                if row % 2 == 0 { "pro" } else { "free" }
            )
        );
    }

    // One past the policy: failed, and the errors are still there to read.
    let failing = submit("import-2", import_input(&upload_id, 9)).await;
    let failing_id = failing.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = app.wait_for_state(&failing_id, "failed").await;
    assert_eq!(failed["error"]["code"], "too_many_row_errors");
    assert!(failed["result"]["artifacts"]["errors"]["id"].is_string(), "{failed}");
    let (_, bytes) = result_artifact(app, &failing_id, "errors").await;
    assert_eq!(lines(&bytes).len(), 10);

    // A re-run of the failed import names the same upload: it is kept for
    // it, and read again.
    let rerun = app
        .request(
            Method::POST,
            &format!("/v1/operations/{failing_id}/reruns"),
            &app.client_key,
        )
        .header("idempotency-key", "import-2-again")
        .json(&json!({"labels": {"try": "2"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(rerun.status(), StatusCode::ACCEPTED);
    let rerun_id = rerun.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let again = app.wait_for_state(&rerun_id, "failed").await;
    assert_eq!(again["error"]["code"], "too_many_row_errors");
    assert_eq!(lines(&result_artifact(app, &rerun_id, "errors").await.1).len(), 10);

    // A batch checks the uploads of each item alone: an unknown one refuses
    // only its item.
    let batch: Value = app
        .request(Method::POST, "/v1/operations/batch", &app.client_key)
        .json(&json!({"operations": [
            {"idempotency_key": "batch-import-ok", "kind": "import", "input": import_input(&upload_id, 100)},
            {"idempotency_key": "batch-import-unknown", "kind": "import",
             "input": import_input(&format!("upl_{}", "b".repeat(26)), 100)},
        ]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let statuses: Vec<u64> = batch["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![202, 422], "{batch}");
    assert_eq!(batch["results"][1]["problem"]["code"], "invalid_input");
}

async fn a_cancelled_import_leaves_no_artifact(app: &TestApp, store: &dyn ArtifactStore) {
    let file = customers(1_500_000, 1000);
    let upload_id = upload(app, &app.client_key, file.as_bytes()).await;
    let op = app
        .submit_ok(
            "import-cancel",
            &json!({"kind": "import", "input": import_input(&upload_id, 1_000_000)}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    app.wait_for(&id, "rows counted", |op| {
        op["progress"]["completed_units"].as_f64().unwrap_or(0.0) > 0.0
    })
    .await;
    let cancel = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{id}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert!(cancel.status().is_success());
    let cancelled = app.wait_for_state(&id, "cancelled").await;
    assert!(cancelled["result"].is_null(), "{cancelled}");
    let result = app
        .request(Method::GET, &format!("/v1/operations/{id}/result"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(result.status(), StatusCode::NOT_FOUND);
    wait_until_objects(store, "no result object of the cancelled import", |o| {
        o.iter().all(|k| k.starts_with("uploads/"))
    })
    .await;
}

async fn uploads_go_at_expiry_unless_named_and_with_their_tenant(
    app: &TestApp,
    store: &dyn ArtifactStore,
    clock: &longrun_core::ManualClock,
) {
    let loose = upload(app, &app.client_key, b"id,email\n1,a@b\n").await;
    let named = upload(app, &app.client_key, customers(5, 0).as_bytes()).await;
    let op = app
        .submit_ok(
            "import-named",
            &json!({"kind": "import", "input": import_input(&named, 0)}),
        )
        .await;
    app.wait_for_state(op["id"].as_str().unwrap(), "succeeded").await;
    clock.advance(Duration::from_secs(24 * 3600 + 1));
    let gone = |id: String| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = app
                .request(Method::GET, &format!("/v1/uploads/{id}"), &app.client_key)
                .send()
                .await
                .unwrap()
                .status();
            if status == StatusCode::NOT_FOUND {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{id} was not removed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    gone(loose.clone()).await;
    wait_until_objects(store, "the expired upload's object is deleted", |o| {
        !o.iter().any(|k| k.contains(&loose))
    })
    .await;
    let kept = app
        .request(Method::GET, &format!("/v1/uploads/{named}"), &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        kept.status(),
        StatusCode::OK,
        "an upload an operation names lives with it"
    );
    // Deleting the tenant removes its uploads and their objects.
    let counts = app.store.tenant_delete("acme", clock_now(clock)).await.unwrap();
    assert!(counts.uploads >= 1, "{counts:?}");
    let after = app
        .request(Method::GET, &format!("/v1/uploads/{named}"), &app.other_tenant_key)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::NOT_FOUND);
    wait_until_objects(store, "nothing of the deleted tenant", |o| o.is_empty()).await;
}

fn clock_now(clock: &longrun_core::ManualClock) -> longrun_core::Timestamp {
    use longrun_core::Clock;
    clock.now()
}

fn file_store(app: &TestApp) -> Arc<dyn ArtifactStore> {
    Arc::new(FileArtifacts::new(app.dir.path().join("artifacts")))
}

fn small_limit() -> Options {
    Options {
        max_upload_bytes: 4 << 20,
        ..Options::default()
    }
}

#[tokio::test]
async fn uploads_resume_after_a_cut_and_check_digests_limits_and_tenancy() {
    let app = spawn_app_with(small_limit()).await;
    uploads_resume_check_digests_limits_and_tenancy(&app, file_store(&app).as_ref()).await;
    oversized_uploads_are_refused(&app).await;
    app.shutdown().await;
}

#[tokio::test]
async fn imports_replay_conflict_and_keep_row_errors_on_success_and_failure() {
    let app = spawn_app_with(Options::default()).await;
    imports_keep_row_errors_on_success_and_failure(&app).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_import_leaves_no_artifact_on_the_file_system() {
    let app = spawn_app_with(Options::default()).await;
    a_cancelled_import_leaves_no_artifact(&app, file_store(&app).as_ref()).await;
    app.shutdown().await;
}

#[tokio::test]
async fn uploads_expire_unless_named_and_go_with_their_tenant() {
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        ..Options::default()
    })
    .await;
    uploads_go_at_expiry_unless_named_and_with_their_tenant(&app, file_store(&app).as_ref(), &clock).await;
    app.shutdown().await;
}

#[tokio::test]
async fn uploads_and_imports_on_s3() {
    let Some(moto) = start_moto().await else { return };
    let store = s3_store(&moto);
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        artifact_store: Some(store.clone()),
        ..small_limit()
    })
    .await;
    uploads_resume_check_digests_limits_and_tenancy(&app, store.as_ref()).await;
    oversized_uploads_are_refused(&app).await;
    imports_keep_row_errors_on_success_and_failure(&app).await;
    uploads_go_at_expiry_unless_named_and_with_their_tenant(&app, store.as_ref(), &clock).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_import_leaves_no_artifact_on_s3() {
    let Some(moto) = start_moto().await else { return };
    let store = s3_store(&moto);
    let app = spawn_app_with(Options {
        artifact_store: Some(store.clone()),
        ..Options::default()
    })
    .await;
    a_cancelled_import_leaves_no_artifact(&app, store.as_ref()).await;
    app.shutdown().await;
}

/// The worker protocol's side: a worker reads the upload an operation names
/// (fenced by its lease, nothing else), stores named artifacts, and the
/// SDK's remote worker runs the import kind over HTTP end to end.
#[tokio::test]
async fn remote_workers_read_named_uploads_and_store_named_artifacts() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    })
    .await;
    let file = customers(20, 10);
    let named = upload(&app, &app.client_key, file.as_bytes()).await;
    let unnamed = upload(&app, &app.client_key, b"id\n1\n").await;
    let op = app
        .submit_ok(
            "remote-import",
            &json!({"kind": "import", "input": import_input(&named, 5)}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let task = app.claim("import", 1).await.remove(0);
    let token = task["lease_token"].as_str().unwrap();
    let read = |upload: String, key: String, token: String| {
        let path = format!("/v1/worker/tasks/{id}/uploads/{upload}");
        app.request(Method::GET, &path, &key)
            .header("lease-token", token)
            .send()
    };
    let bytes = read(named.clone(), app.worker_key.clone(), token.to_owned())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(bytes, file.as_bytes(), "the upload's bytes, streamed");
    let forged = read(named.clone(), app.worker_key.clone(), "forged".into())
        .await
        .unwrap();
    problem(forged, StatusCode::CONFLICT, "lease_lost").await;
    let not_named = read(unnamed, app.worker_key.clone(), token.to_owned()).await.unwrap();
    problem(not_named, StatusCode::NOT_FOUND, "not_found").await;
    let as_client = read(named, app.client_key.clone(), token.to_owned()).await.unwrap();
    problem(as_client, StatusCode::FORBIDDEN, "forbidden").await;

    let put = |name: &str, body: &'static str| {
        app.request(
            Method::PUT,
            &format!("/v1/worker/tasks/{id}/artifacts/{name}"),
            &app.worker_key,
        )
        .header("lease-token", token)
        .header("content-type", "application/jsonl")
        .body(body)
        .send()
    };
    problem(
        put("Bad Name", "x").await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    assert_eq!(
        put("errors", "{\"line\": 2}\n").await.unwrap().status(),
        StatusCode::CREATED
    );
    let failed = app
        .worker_post(
            &format!("/v1/worker/tasks/{id}/fail"),
            &json!({"lease_token": token, "error": {"code": "too_many_row_errors", "message": "m", "retryable": false}}),
        )
        .await;
    assert!(failed.status().is_success());
    let failed = app.get_operation(&id).await;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["result"]["artifacts"]["errors"]["size_bytes"], 12, "{failed}");
    assert_eq!(result_artifact(&app, &id, "errors").await.1, b"{\"line\": 2}\n");

    // The remote worker of the SDK runs the import kind over HTTP.
    let again = upload(&app, &app.client_key, file.as_bytes()).await;
    let op = app
        .submit_ok(
            "remote-import-2",
            &json!({"kind": "import", "input": import_input(&again, 5)}),
        )
        .await;
    let worker = app.remote_worker(Arc::new(longrun_engine::kinds::import::Import), 4);
    let done = app.wait_for_state(op["id"].as_str().unwrap(), "succeeded").await;
    assert_eq!(
        done["result"]["summary"],
        json!({"rows_total": 20, "rows_accepted": 18, "rows_rejected": 2})
    );
    let (_, errors) = result_artifact(&app, op["id"].as_str().unwrap(), "errors").await;
    assert_eq!(
        lines(&errors)
            .iter()
            .map(|e| e["line"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![11, 21]
    );
    worker.stop().await;
    app.shutdown().await;
}
