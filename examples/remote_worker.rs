//! A remote worker in Rust: serves the kind `thumbnail` over the HTTP worker
//! protocol with the same Handler trait the built-in kinds use.
//!
//! ```sh
//! longrun kinds set thumbnail --rerun-safe
//! LONGRUN_TOKEN=lr_…(worker key) cargo run -p longrun-worker --example remote_worker
//! ```

use std::sync::Arc;

use longrun_worker::{
    CancellationToken, Handler, Invalid, KindInfo, ProgressUpdate, Registry, RemoteConfig, RemoteWorker, TaskContext,
    TaskError, async_trait,
};
use serde_json::{Value, json};

struct Thumbnail;

#[async_trait]
impl Handler for Thumbnail {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: "thumbnail".into(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: false,
        }
    }

    fn validate(&self, _input: &Value) -> Result<(), Invalid> {
        Ok(())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        for page in 1..=5 {
            if ctx.is_cancelled() {
                return Err(TaskError::Cancelled);
            }
            // The operation id is stable across attempts: use it as the
            // idempotency key of any external call.
            let _idempotency_key = ctx.operation_id().as_str();
            ctx.progress(ProgressUpdate {
                completed_units: Some(page as f64),
                total_units: Some(5.0),
                unit: Some("pages".into()),
                phase: Some("RENDERING".into()),
                details: None,
            })
            .await?;
        }
        Ok(Some(json!({"pages": 5})))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("LONGRUN_SERVER").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let mut registry = Registry::default();
    registry.register(Arc::new(Thumbnail));
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    RemoteWorker::new(RemoteConfig::new(server, std::env::var("LONGRUN_TOKEN")?), registry)
        .run(shutdown)
        .await;
    Ok(())
}
