//! Firing many schedules due in the same second, on both stores, beside
//! the same number of plain submissions through the store in the same
//! sitting (the ratio is what the schedule bookkeeping costs).
//!
//! `cargo bench -p longrun-cli --bench schedules`
//!
//! `LONGRUN_SCHEDULES` (default 10,000) schedules `@every 1m` are stored,
//! all due at the same minute; the server's manual clock is moved past it
//! and the time is taken from then until no schedule is due (each one has
//! submitted its operation, recorded its firing and moved on). The firing
//! service looks every 100 ms here (1 s by default), so up to 0.1 s of
//! the figure is that wait. Then as many operations are accepted through
//! `Store::operation_accept`, 32 at a time (the firing's concurrency), on
//! the same server: the same commits without the schedule around them.
//! Target (issue "Work that starts later…"): ≤ 2 s for 10,000.

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "record/mod.rs"]
mod record;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use longrun_core::schedule::Cadence;
use longrun_core::{Clock, Id, IdKind, ManualClock, SystemClock, Timestamp};
use longrun_server::ServeOptions;
use longrun_store::{AcceptParams, ScheduleRecord, SqliteConfig, Store};
use serde_json::json;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `n` schedules of tenant `bench`, all due at `due`.
async fn stored(store: &dyn Store, n: usize, due: Timestamp, now: Timestamp) {
    let records = (0..n).map(|i| ScheduleRecord {
        id: Id::generate(IdKind::Schedule),
        tenant: "bench".into(),
        version: 1,
        paused: false,
        spec: json!({"kind": "bench", "cron": "@every 1m", "overlap": "allow", "input": {"n": i}}),
        next_fire_at: Some(due),
        last_operation_id: None,
        buffered_fire_at: None,
        created_at: now,
        updated_at: now,
    });
    futures_util::stream::iter(records)
        .map(|r| store.schedule_insert(r))
        .buffer_unordered(32)
        .for_each(|r| async { r.unwrap() })
        .await;
}

/// Seconds to accept `n` operations through the store, 32 at a time.
async fn plain_accepts(store: &dyn Store, n: usize, now: Timestamp) -> f64 {
    let started = Instant::now();
    futures_util::stream::iter(0..n)
        .map(|i| {
            store.operation_accept(AcceptParams {
                id: Id::generate(IdKind::Operation),
                tenant: "bench".into(),
                kind: "bench".into(),
                input: json!({"n": i}),
                callback_url: None,
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
        })
        .buffer_unordered(32)
        .for_each(|r| async {
            r.unwrap();
        })
        .await;
    started.elapsed().as_secs_f64()
}

fn main() {
    let n = env_number("LONGRUN_SCHEDULES", 10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let cluster = longrun_store::pgtest::start_durable();
        if let Err(why) = &cluster {
            println!("PostgreSQL is not available here ({why}); SQLite only");
        }
        let mut record = record::Record::new("schedules");
        record.line(format!(
            "{n} schedules due in the same second: from the due instant until every one has fired, \
             beside {n} plain accepts through the store (32 at a time), same server, same sitting."
        ));
        record.line("");
        record.line("| store | firing all | plain accepts | ratio | target |");
        record.line("|---|---|---|---|---|");
        let dir = tempfile::tempdir().unwrap();
        let mut stores = vec!["SQLite"];
        if cluster.is_ok() {
            stores.push("PostgreSQL");
        }
        for name in stores {
            // A minute's start, 30 s before it: nothing is due yet.
            let now = SystemClock.now();
            let due = Cadence::parse("@every 1m", None)
                .unwrap()
                .next_after(now.plus(Duration::from_secs(60)))
                .unwrap();
            let clock = ManualClock::new(due.minus(Duration::from_secs(30)));
            let mut options = ServeOptions::new(
                "127.0.0.1:0".parse().unwrap(),
                SqliteConfig::new(dir.path().join(format!("{name}.db"))),
            );
            options.builtin_workers = false;
            options.artifacts_dir = dir.path().join(format!("artifacts-{name}"));
            options.clock = std::sync::Arc::new(clock.clone());
            options.schedules.interval = Duration::from_millis(100);
            if let Ok(cluster) = &cluster
                && name == "PostgreSQL"
            {
                options.postgres = Some(longrun_store::postgres::PostgresConfig::new(cluster.database().await));
            }
            let server = longrun_server::start(options).await.unwrap();
            let store = server.store.clone();
            common::rerun_safe_kind(store.as_ref(), "bench").await;
            common::key_of(store.as_ref(), "bench", longrun_core::apikey::Role::Client).await;
            stored(store.as_ref(), n, due, clock.now()).await;
            assert!(store.schedule_due(clock.now(), 1).await.unwrap().is_empty());

            clock.set(due.plus(Duration::from_millis(1)));
            let started = Instant::now();
            loop {
                if store.schedule_due(clock.now(), 1).await.unwrap().is_empty() {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(300),
                    "{name}: firing did not finish"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let firing = started.elapsed().as_secs_f64();
            let queued: u64 = store
                .active_summary(Some("bench".into()))
                .await
                .unwrap()
                .iter()
                .map(|g| g.count)
                .sum();
            assert_eq!(queued, n as u64, "{name}: one operation per schedule");
            let plain = plain_accepts(store.as_ref(), n, clock.now()).await;
            record.line(format!(
                "| {name} | {firing:.2} s ({:.0}/s) | {plain:.2} s ({:.0}/s) | {:.2}× | ≤ 2 s: {} |",
                n as f64 / firing,
                n as f64 / plain,
                firing / plain,
                if firing <= 2.0 { "met" } else { "missed" }
            ));
            server.shutdown().await.unwrap();
        }
        record.line("");
        record.write();
    });
}
