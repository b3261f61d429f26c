//! The database unable to take writes: the server says so with `503` and
//! `Retry-After`, applies nothing, keeps serving reads, and recovers on its
//! own when the database can write again. (PostgreSQL stopped hard is
//! drilled at the store level, in longrun-store's tests/postgres.rs.)

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Options, problem, spawn_app_with};

/// 4 MiB of 4 KiB pages: the test's "disk".
const PAGES: u32 = 1024;

#[tokio::test]
async fn a_full_disk_refuses_writes_with_503_keeps_reads_and_recovers_when_space_returns() {
    let app = spawn_app_with(Options {
        builtin_workers: false,
        max_page_count: Some(PAGES),
        ..Options::default()
    })
    .await;
    app.declare_kind("bulk", true, 3).await;
    let pad = "x".repeat(200 * 1024);
    let body = |i: usize| json!({"kind": "bulk", "input": {"pad": pad, "i": i}});
    // Another tenant holds part of the disk.
    for i in 0..6 {
        let response = app
            .request(Method::POST, "/v1/operations", &app.other_tenant_key)
            .header("Idempotency-Key", format!("g{i}"))
            .json(&body(i))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    let first = app.submit_ok("a0", &body(0)).await;
    let (full_at, refused) = 'fill: {
        for i in 1..100 {
            let response = app.submit(&format!("a{i}"), &body(i)).await;
            if response.status() == StatusCode::SERVICE_UNAVAILABLE {
                break 'fill (i, response);
            }
            assert_eq!(response.status(), StatusCode::ACCEPTED, "submission {i}");
        }
        panic!("the disk never filled");
    };
    assert_eq!(refused.headers()["retry-after"], "2");
    problem(refused, StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable").await;

    // Reads go on.
    let id = first["id"].as_str().unwrap();
    assert_eq!(app.get_operation(id).await["state"], "queued");
    let list = app
        .request(Method::GET, "/v1/operations", &app.client_key)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), StatusCode::OK);

    // Space comes back (the other tenant is deleted): the refused key was
    // never taken, so the same submission now creates its operation.
    let now = longrun_core::Clock::now(&longrun_core::SystemClock);
    app.store.tenant_delete("globex", now).await.unwrap();
    let again = app.submit(&format!("a{full_at}"), &body(full_at)).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert!(again.headers().get("idempotent-replayed").is_none());
    let created: Value = again.json().await.unwrap();
    assert_eq!(
        app.get_operation(created["id"].as_str().unwrap()).await["state"],
        "queued"
    );
    app.shutdown().await;
}
