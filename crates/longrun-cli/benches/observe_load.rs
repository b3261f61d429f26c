//! Webhook deliveries per second: 5,000 events written concurrently
//! straight to the store, delivered signed to a loopback receiver.
//!
//! `cargo bench -p longrun-cli --bench observe_load`
//!
//! How many requests each way of observing costs (polling, `Retry-After`,
//! long-poll, the event stream, webhooks) is measured by the lab
//! (`cargo bench -p longrun-cli --bench lab`), against the same server.

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use longrun_core::{Clock, Id, IdKind, SystemClock};
use longrun_server::ServeOptions;
use longrun_store::{AcceptOutcome, AcceptParams, CancelParams, SqliteConfig};
use serde_json::Value;

/// A loopback receiver counting deliveries.
async fn receiver() -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook"), count)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ServeOptions::new("127.0.0.1:0".parse().unwrap(), SqliteConfig::new(dir.path().join("longrun.db")));
        options.builtin_workers = false;
        options.http.callback_policy = longrun_server::CallbackPolicy { allow_http: true, allow_private: true };
        options.webhooks.interval = Duration::from_millis(20);
        let server = longrun_server::start(options).await.unwrap();
        let store = server.store.clone();
        common::rerun_safe_kind(store.as_ref(), "fixed").await;
        // Delivery throughput: events written straight to the store, delivered to loopback.
        let (url, deliveries) = receiver().await;
        let events = 5000;
        let now = SystemClock.now();
        let mut writes = Vec::new();
        for _ in 0..events {
            let (store, url) = (store.clone(), url.clone());
            writes.push(tokio::spawn(async move {
                let AcceptOutcome::Created(op) = store
                    .operation_accept(AcceptParams {
                        id: Id::generate(IdKind::Operation),
                        tenant: "bench".into(),
                        kind: "fixed".into(),
                        input: Value::Null,
                        callback_url: Some(url),
                        deadline_at: None,
                        budget_max_cost: None,
                        labels: Default::default(),
                        idempotency: None,
                        uploads: Vec::new(),
                        rerun_of: None,
                        from_checkpoint: false,
                        not_before: None,
                        priority: longrun_store::PRIORITY_DEFAULT,
                        now,
                    })
                    .await
                    .unwrap()
                else {
                    unreachable!()
                };
                store
                    .operation_cancel(CancelParams {
                        tenant: "bench".into(),
                        id: op.id,
                        requested_by: "bench".into(),
                        reason: None,
                        if_match: None,
                        now,
                    })
                    .await
                    .unwrap();
            }));
        }
        let started = Instant::now();
        for w in writes {
            w.await.unwrap();
        }
        while deliveries.load(Ordering::Relaxed) < events {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        println!(
            "\nwebhook deliveries to a loopback receiver: {:.0}/s ({events} signed deliveries in {:.2} s, events written concurrently)",
            events as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64()
        );
        server.shutdown().await.unwrap();
    });
}
