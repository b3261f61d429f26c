//! The retention service: results expire (`410 result_expired`, the
//! operation stays `succeeded`), operations past their retention are removed
//! behind a tombstone (`410 gone`, then `404`), finished webhook deliveries
//! are forgotten, and unreachable artifact objects are deleted. Batched,
//! idempotent and restart-safe: every step can be repeated, and objects are
//! deleted before their garbage rows.
//!
//! Now and then (`orphan_interval`) it also sweeps for *orphans*: objects
//! no row names, older than `orphan_grace` by the artifact store's own
//! clock. A process that crashed between storing an object (an upload
//! piece, a result, a piece of a resumable artifact, a half-written
//! temporary file) and recording it leaves one; nothing else would ever
//! delete it. Every object is written moments before the row that names it,
//! so an object older than the grace that no row names never will be.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::Clock;
use longrun_store::{RetentionCounts, RetentionParams, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::bytes::artifacts::ArtifactStore;

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
    /// How old an object no row names must be before the orphan sweep
    /// deletes it.
    pub orphan_grace: Duration,
    /// How often the orphan sweep lists the artifact store (a list of every
    /// object: not every pass).
    pub orphan_interval: Duration,
}

/// The longest rest between two sweeps of a pass. A pass rests after each
/// sweep that removed something, as long as the sweep took: it then holds
/// the database at most half the time it runs, and the hot paths' tails
/// stay near (`retention_load`: accept p99 1.22–1.36× during a paced pass,
/// up to 1.58× back to back).
const MAX_REST: Duration = Duration::from_secs(1);

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            tombstone_retention: Duration::from_secs(30 * 24 * 3600),
            delivery_retention: Duration::from_secs(7 * 24 * 3600),
            batch: 500,
            orphan_grace: Duration::from_secs(3600),
            orphan_interval: Duration::from_secs(3600),
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
    /// Orphaned objects (named by no row) deleted.
    pub orphans_deleted: u64,
    /// The history's partitions made and dropped (PostgreSQL).
    pub history: longrun_store::HistoryUpkeep,
    /// The webhook deliveries' partitions made and dropped (PostgreSQL).
    pub deliveries: longrun_store::DeliveriesUpkeep,
}

/// Runs `sweep` until one removes nothing, resting after each that removed
/// something as long as it took (at most [`MAX_REST`]); what they removed,
/// summed.
async fn paced<F, Fut>(mut sweep: F) -> Result<RetentionCounts, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<RetentionCounts, StoreError>>,
{
    let mut sum = RetentionCounts::default();
    loop {
        let started = tokio::time::Instant::now();
        let counts = sweep().await?;
        sum += counts;
        if counts.total() == 0 {
            return Ok(sum);
        }
        tokio::time::sleep(started.elapsed().min(MAX_REST)).await;
    }
}

/// Removes expired operations, results, uploads and records, and their objects.
pub struct Retention {
    store: Arc<dyn Store>,
    artifacts: Arc<dyn ArtifactStore>,
    clock: Arc<dyn Clock>,
    config: Config,
    /// When the last orphan sweep ran (by the service's clock).
    swept_orphans_at: std::sync::Mutex<Option<longrun_core::Timestamp>>,
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
            swept_orphans_at: std::sync::Mutex::new(None),
        }
    }

    /// Works until nothing is due now.
    #[tracing::instrument(name = "retention", skip_all)]
    pub async fn run_once(&self) -> Result<Report, StoreError> {
        let mut report = Report {
            records: paced(|| {
                self.store.retention_sweep(RetentionParams {
                    now: self.clock.now(),
                    tombstone_retention: self.config.tombstone_retention,
                    delivery_retention: self.config.delivery_retention,
                    limit: self.config.batch,
                })
            })
            .await?,
            ..Report::default()
        };
        report.history = self.store.history_upkeep(self.clock.now(), self.config.batch).await?;
        report.deliveries = self
            .store
            .deliveries_upkeep(self.clock.now(), self.config.delivery_retention)
            .await?;
        report.objects_deleted = self.collect_garbage().await?;
        if self.orphan_sweep_due() {
            report.orphans_deleted = self.sweep_orphans().await?;
        }
        let removed = |what: &'static str, n: u64| {
            metrics::counter!("longrun_retention_removed_total", "what" => what).increment(n)
        };
        removed("results_expired", report.records.results_expired);
        removed("operations", report.records.operations_removed);
        removed("tombstones", report.records.tombstones_removed);
        removed(
            "deliveries",
            report.records.deliveries_removed + report.deliveries.deliveries_removed,
        );
        removed("uploads", report.records.uploads_removed);
        removed("objects", report.objects_deleted);
        removed("orphans", report.orphans_deleted);
        removed("history_partitions", report.history.partitions_dropped);
        removed("history_strays", report.history.strays_removed);
        removed("delivery_partitions", report.deliveries.partitions_dropped);
        metrics::counter!("longrun_retention_history_deferred_total").increment(report.history.steps_deferred);
        metrics::counter!("longrun_retention_deliveries_deferred_total").increment(report.deliveries.steps_deferred);
        if report != Report::default() {
            tracing::info!(?report, "retention pass");
        }
        Ok(report)
    }

    /// Deletes unreachable objects, then forgets them.
    pub async fn collect_garbage(&self) -> Result<u64, StoreError> {
        collect_garbage(self.store.as_ref(), self.artifacts.as_ref(), self.config.batch).await
    }

    /// Whether `orphan_interval` has passed since the last orphan sweep
    /// (the first pass always sweeps); if so, the sweep counts as started.
    fn orphan_sweep_due(&self) -> bool {
        let now = self.clock.now();
        let mut last = self.swept_orphans_at.lock().expect("retention poisoned");
        let due = last.is_none_or(|at| now.minus(self.config.orphan_interval) >= at);
        if due {
            *last = Some(now);
        }
        due
    }

    /// Deletes objects no row names that are older than `orphan_grace`
    /// (see the module); returns how many. An object that cannot be listed
    /// or deleted now is logged and left for the next sweep.
    pub async fn sweep_orphans(&self) -> Result<u64, StoreError> {
        let listed = match self.artifacts.list_modified().await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(error = %e, "could not list the artifact store for orphans; will retry");
                return Ok(0);
            }
        };
        let cutoff = std::time::SystemTime::now()
            .checked_sub(self.config.orphan_grace)
            .unwrap_or(std::time::UNIX_EPOCH);
        let old: Vec<String> = listed
            .into_iter()
            .filter(|o| o.modified <= cutoff)
            .map(|o| o.key)
            .collect();
        let mut deleted = 0;
        for keys in old.chunks(self.config.batch.max(1) as usize) {
            let named: std::collections::HashSet<String> = self
                .store
                .artifact_keys_named(keys.to_vec())
                .await?
                .into_iter()
                .collect();
            for key in keys.iter().filter(|k| !named.contains(*k)) {
                match self.artifacts.delete(key).await {
                    Ok(()) => {
                        tracing::info!(key, "deleted an orphaned artifact object");
                        deleted += 1;
                    }
                    Err(e) => tracing::warn!(key, error = %e, "could not delete an orphaned object; will retry"),
                }
            }
        }
        Ok(deleted)
    }

    /// Passes every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        crate::services::run::run_every("the retention pass", self.config.interval, shutdown, || self.run_once()).await;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A pass rests after each sweep that removed something, as long as the
    /// sweep took, and never longer than `MAX_REST`; it does not rest after
    /// the sweep that found nothing. Time is tokio's paused clock: the
    /// sweeps "take" their time by sleeping on it.
    #[tokio::test(start_paused = true)]
    async fn a_pass_rests_as_long_as_each_sweep_that_removed_something_took() {
        for (took, rest) in [
            (Duration::from_millis(300), Duration::from_millis(300)),
            (Duration::from_secs(3), MAX_REST),
        ] {
            let mut calls = 0_u64;
            let started = Instant::now();
            let sum = paced(|| {
                calls += 1;
                let removed = u64::from(calls <= 3);
                async move {
                    tokio::time::sleep(took).await;
                    Ok(RetentionCounts {
                        operations_removed: removed,
                        ..RetentionCounts::default()
                    })
                }
            })
            .await
            .unwrap();
            assert_eq!(sum.operations_removed, 3);
            assert_eq!(calls, 4, "three sweeps removed something, the fourth nothing");
            assert_eq!(started.elapsed(), took * 4 + rest * 3, "a sweep of {took:?}");
        }
    }
}
