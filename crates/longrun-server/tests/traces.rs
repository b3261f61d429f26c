//! One operation's trace: the edge's request span carries its id, the SQLite
//! writer thread runs the submission's job inside that span, and the
//! in-process worker runs the task in a span with the same id. (A test
//! binary of its own: it installs the process-wide subscriber.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longrun_server::ServeOptions;
use longrun_store::SqliteConfig;
use serde_json::{Value, json};
use tracing::field::{Field, Visit};
use tracing::span;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Default)]
struct Seen {
    /// Span id → (name, op.id once recorded).
    spans: HashMap<span::Id, (&'static str, Option<String>)>,
    /// (span id, thread name) of every enter.
    enters: Vec<(span::Id, String)>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct OpId(Option<String>);

impl Visit for OpId {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "op.id" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "op.id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, _: Context<'_, S>) {
        let mut op = OpId(None);
        attrs.record(&mut op);
        let mut seen = self.0.lock().unwrap();
        seen.spans.insert(id.clone(), (attrs.metadata().name(), op.0));
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, _: Context<'_, S>) {
        let mut op = OpId(None);
        values.record(&mut op);
        if let Some(op) = op.0
            && let Some(span) = self.0.lock().unwrap().spans.get_mut(id)
        {
            span.1 = Some(op);
        }
    }

    fn on_enter(&self, id: &span::Id, _: Context<'_, S>) {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        self.0.lock().unwrap().enters.push((id.clone(), thread));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operation_is_followed_from_the_edge_through_the_store_to_the_worker() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone())).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut options = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        SqliteConfig::new(dir.path().join("longrun.db")),
    );
    options.dispatcher.poll_interval = Duration::from_millis(50);
    options.dispatcher.shutdown_grace = Duration::from_millis(100);
    let server = longrun_server::start(options).await.unwrap();
    let token = server.bootstrap.clone().unwrap().client;
    let http = reqwest::Client::new();
    let op: Value = http
        .post(format!("http://{}/v1/operations", server.addr))
        .bearer_auth(&token)
        .header("idempotency-key", "traced")
        .header("prefer", "wait=10")
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 1}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(op["state"], "succeeded", "{op}");
    let id = op["id"].as_str().unwrap().to_owned();
    server.shutdown().await.unwrap();

    let seen = capture.0.lock().unwrap();
    let entered_on = |name: &str| -> Vec<String> {
        seen.enters
            .iter()
            .filter(|(span, _)| {
                seen.spans
                    .get(span)
                    .is_some_and(|(n, op)| *n == name && op.as_deref() == Some(&id))
            })
            .map(|(_, thread)| thread.clone())
            .collect()
    };
    let http_threads = entered_on("http");
    assert!(!http_threads.is_empty(), "the request span carries the operation id");
    assert!(
        http_threads.iter().any(|t| t == "longrun-sqlite-writer"),
        "the store's writer ran the submission inside its request span: {http_threads:?}"
    );
    assert!(
        !entered_on("task").is_empty(),
        "the worker ran the task in a span with its id"
    );
}
