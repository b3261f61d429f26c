//! Prometheus metrics (docs/api.md §7). Counters and histograms of the life of
//! operations are derived from the store's committed-change feed — one place,
//! and only for changes that are durable; services count what they do (reaper,
//! enforcer, webhooks, retention); ages and backlogs are read at scrape time.
//! No operation id is ever a label.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use longrun_core::{Clock, State};
use longrun_store::{Change, Store};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::broadcast;

/// Buckets for durations, in seconds: 10 ms to 6 h.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 21600.0,
];

/// Buckets for the time a request takes, in seconds: 0.5 ms to a minute,
/// the longest a long-poll waits (`MAX_WAIT_SECONDS`); the operations'
/// buckets above start at 10 ms, where nearly every request would fall in
/// the first.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The process's recorder (installed once; every server in the process shares it).
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
                .expect("valid buckets")
                // A full name's buckets win over a suffix's.
                .set_buckets_for_metric(
                    Matcher::Full("longrun_http_request_duration_seconds".into()),
                    HTTP_BUCKETS,
                )
                .expect("valid buckets")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics shows only what it records");
            }
            handle
        })
        .clone()
}

fn seconds(from: longrun_core::Timestamp, to: longrun_core::Timestamp) -> f64 {
    to.since(from).as_secs_f64()
}

/// Turns one committed change into counters and histograms.
pub fn observe(change: &Change) {
    let kind = change.kind.clone();
    match change.event_type.as_str() {
        "created" => metrics::counter!("longrun_operations_accepted_total", "kind" => kind).increment(1),
        "started" if change.attempt == 1 => {
            metrics::counter!("longrun_operation_transitions_total", "kind" => kind.clone(), "to" => "running")
                .increment(1);
            if let Some(started) = change.started_at {
                metrics::histogram!("longrun_queue_to_start_seconds", "kind" => kind)
                    .record(seconds(change.created_at, started));
            }
        }
        "succeeded" | "failed" | "cancelled" => {
            let to = change.state.as_str();
            metrics::counter!("longrun_operation_transitions_total", "kind" => kind.clone(), "to" => to).increment(1);
            if let (Some(started), Some(completed)) = (change.started_at, change.completed_at) {
                metrics::histogram!("longrun_execution_duration_seconds", "kind" => kind.clone(), "outcome" => to)
                    .record(seconds(started, completed));
            }
            if let (State::Cancelled, Some(asked), Some(completed)) =
                (change.state, change.cancel_requested_at, change.completed_at)
            {
                metrics::histogram!("longrun_cancellation_latency_seconds", "kind" => kind)
                    .record(seconds(asked, completed));
            }
        }
        _ => {}
    }
}

/// Follows the change feed until it closes.
pub async fn follow(mut feed: broadcast::Receiver<Change>) {
    loop {
        match feed.recv().await {
            Ok(change) if change.is_resync() => {}
            Ok(change) => observe(&change),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                metrics::counter!("longrun_metrics_changes_missed_total").increment(n);
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Gauges read at scrape time.
pub struct Scrape {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    seen: Mutex<HashSet<(String, &'static str)>>,
}

impl Scrape {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            seen: Mutex::default(),
        }
    }

    /// Updates the gauges and renders every metric in Prometheus text.
    pub async fn render(&self) -> String {
        let now = self.clock.now();
        match self.store.backlog(now).await {
            Ok(backlog) => {
                let mut current = HashSet::new();
                for (kind, state, oldest) in backlog.oldest_active {
                    metrics::gauge!("longrun_oldest_active_age_seconds", "kind" => kind.clone(), "state" => state.as_str())
                        .set(seconds(oldest, now));
                    current.insert((kind, state.as_str()));
                }
                let mut seen = self.seen.lock().expect("scrape poisoned");
                for (kind, state) in seen.difference(&current) {
                    metrics::gauge!("longrun_oldest_active_age_seconds", "kind" => kind.clone(), "state" => *state)
                        .set(0.0);
                }
                *seen = current;
                metrics::gauge!("longrun_retention_backlog").set(backlog.retention_due as f64);
                metrics::gauge!("longrun_artifact_garbage").set(backlog.garbage_objects as f64);
                metrics::gauge!("longrun_webhooks_due").set(backlog.webhooks_due as f64);
                metrics::gauge!("longrun_database_up").set(1.0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the backlog for /metrics failed");
                metrics::gauge!("longrun_database_up").set(0.0);
            }
        }
        handle().render()
    }
}
