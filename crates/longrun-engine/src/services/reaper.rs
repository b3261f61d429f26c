//! The lease reaper: a lease not renewed in time means the worker is gone.
//! Re-run-safe kinds with attempts left go back to the queue after a backoff;
//! any other kind ends `failed` with `outcome_unknown`.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::Clock;
use longrun_store::{ReapCounts, ReapParams, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::in_process::signals::Signals;

/// How the reaper runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Longest wait between rounds.
    pub interval: Duration,
    /// Most leases handled per round.
    pub batch: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch: 500,
        }
    }
}

/// Ends leases that were not renewed: the task is retried or ends `outcome_unknown`.
pub struct Reaper {
    store: Arc<dyn Store>,
    signals: Signals,
    clock: Arc<dyn Clock>,
    config: Config,
}

impl Reaper {
    /// A reaper over `store`, waking claimers through `signals` when it requeues work.
    pub fn new(store: Arc<dyn Store>, signals: Signals, clock: Arc<dyn Clock>, config: Config) -> Self {
        Self {
            store,
            signals,
            clock,
            config,
        }
    }

    /// One round: every expired lease up to the batch size.
    #[tracing::instrument(name = "reap", skip_all)]
    pub async fn run_once(&self) -> Result<ReapCounts, StoreError> {
        let counts = self
            .store
            .task_reap(ReapParams {
                now: self.clock.now(),
                limit: self.config.batch,
            })
            .await?;
        if counts.requeued > 0 {
            self.signals.work_available();
        }
        metrics::counter!("longrun_reaper_actions_total", "action" => "requeued").increment(counts.requeued);
        metrics::counter!("longrun_reaper_actions_total", "action" => "outcome_unknown")
            .increment(counts.failed_outcome_unknown);
        metrics::counter!("longrun_reaper_actions_total", "action" => "ended_cancel_requested")
            .increment(counts.ended_cancel_requested);
        if counts != ReapCounts::default() {
            tracing::info!(
                requeued = counts.requeued,
                failed_outcome_unknown = counts.failed_outcome_unknown,
                ended_cancel_requested = counts.ended_cancel_requested,
                "reaped expired leases"
            );
        }
        Ok(counts)
    }

    /// Rounds every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        crate::services::run::run_every("reaping leases", self.config.interval, shutdown, || self.run_once()).await;
    }
}
