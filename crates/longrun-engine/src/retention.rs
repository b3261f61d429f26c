//! The retention service: results expire (`410 result_expired`, the
//! operation stays `succeeded`), operations past their retention are removed
//! behind a tombstone (`410 gone`, then `404`), finished webhook deliveries
//! are forgotten, and unreachable artifact objects are deleted. Batched,
//! idempotent and restart-safe: every step can be repeated, and objects are
//! deleted before their garbage rows.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::Clock;
use longrun_store::{RetentionCounts, RetentionParams, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::artifacts::ArtifactStore;

/// How retention runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Longest wait between passes.
    pub interval: Duration,
    /// How long the tombstone of a removed operation still answers `410`.
    pub tombstone_retention: Duration,
    /// How long webhook delivery records are kept.
    pub delivery_retention: Duration,
    /// Rows of each kind per store call.
    pub batch: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            tombstone_retention: Duration::from_secs(30 * 24 * 3600),
            delivery_retention: Duration::from_secs(7 * 24 * 3600),
            batch: 500,
        }
    }
}

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Rows removed, by kind.
    pub records: RetentionCounts,
    /// Artifact objects deleted.
    pub objects_deleted: u64,
}

/// Removes expired operations, results, uploads and records, and their objects.
pub struct Retention {
    store: Arc<dyn Store>,
    artifacts: Arc<dyn ArtifactStore>,
    clock: Arc<dyn Clock>,
    config: Config,
}

impl Retention {
    /// Retention over `store` and `artifacts`.
    pub fn new(
        store: Arc<dyn Store>,
        artifacts: Arc<dyn ArtifactStore>,
        clock: Arc<dyn Clock>,
        config: Config,
    ) -> Self {
        Self {
            store,
            artifacts,
            clock,
            config,
        }
    }

    /// Works until nothing is due now.
    #[tracing::instrument(name = "retention", skip_all)]
    pub async fn run_once(&self) -> Result<Report, StoreError> {
        let mut report = Report::default();
        loop {
            let counts = self
                .store
                .retention_sweep(RetentionParams {
                    now: self.clock.now(),
                    tombstone_retention: self.config.tombstone_retention,
                    delivery_retention: self.config.delivery_retention,
                    limit: self.config.batch,
                })
                .await?;
            report.records.results_expired += counts.results_expired;
            report.records.operations_removed += counts.operations_removed;
            report.records.tombstones_removed += counts.tombstones_removed;
            report.records.deliveries_removed += counts.deliveries_removed;
            if counts.total() == 0 {
                break;
            }
        }
        report.objects_deleted = self.collect_garbage().await?;
        let removed = |what: &'static str, n: u64| {
            metrics::counter!("longrun_retention_removed_total", "what" => what).increment(n)
        };
        removed("results_expired", report.records.results_expired);
        removed("operations", report.records.operations_removed);
        removed("tombstones", report.records.tombstones_removed);
        removed("deliveries", report.records.deliveries_removed);
        removed("objects", report.objects_deleted);
        if report != Report::default() {
            tracing::info!(?report, "retention pass");
        }
        Ok(report)
    }

    /// Deletes unreachable objects, then forgets them.
    pub async fn collect_garbage(&self) -> Result<u64, StoreError> {
        collect_garbage(self.store.as_ref(), self.artifacts.as_ref(), self.config.batch).await
    }

    /// Passes every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        crate::service::run_every("the retention pass", self.config.interval, shutdown, || self.run_once()).await;
    }
}

/// Deletes every unreachable object (`batch` at a time), then forgets it:
/// the object goes before its garbage row, so a crash in between deletes it
/// again rather than losing track of it. An object that cannot be deleted
/// now is logged and left for the next pass. Returns how many were deleted.
pub async fn collect_garbage(store: &dyn Store, artifacts: &dyn ArtifactStore, batch: u32) -> Result<u64, StoreError> {
    let mut deleted = 0;
    loop {
        let keys = store.artifact_garbage(batch).await?;
        if keys.is_empty() {
            return Ok(deleted);
        }
        let mut done = Vec::with_capacity(keys.len());
        for key in keys {
            match artifacts.delete(&key).await {
                Ok(()) => done.push(key),
                Err(e) => tracing::warn!(key, error = %e, "could not delete an artifact; will retry"),
            }
        }
        if done.is_empty() {
            return Ok(deleted);
        }
        deleted += done.len() as u64;
        store.artifact_garbage_done(done).await?;
    }
}
