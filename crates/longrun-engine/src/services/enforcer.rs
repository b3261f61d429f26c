//! The deadline enforcer: queued work past its deadline is failed without
//! starting; running work past it is asked to stop (reason
//! `deadline_exceeded`); work whose worker ignores a stop the server asked for
//! (deadline or budget) is ended after a grace period and its worker fenced out.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::Clock;
use longrun_store::{EnforceCounts, EnforceParams, Store, StoreError};
use tokio_util::sync::CancellationToken;

/// How the deadline enforcer runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Longest wait between rounds.
    pub interval: Duration,
    /// How long a worker has to acknowledge a server-requested stop.
    pub grace: Duration,
    /// Most operations handled per round.
    pub batch: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            grace: Duration::from_secs(30),
            batch: 500,
        }
    }
}

/// Fails operations past their deadline and ends work that ignored a stop.
pub struct Enforcer {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: Config,
}

impl Enforcer {
    /// An enforcer over `store`, reading time from `clock`.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Self {
        Self { store, clock, config }
    }

    /// One round: what it ended.
    #[tracing::instrument(name = "enforce", skip_all)]
    pub async fn run_once(&self) -> Result<EnforceCounts, StoreError> {
        let counts = self
            .store
            .deadline_enforce(EnforceParams {
                now: self.clock.now(),
                grace: self.config.grace,
                limit: self.config.batch,
            })
            .await?;
        metrics::counter!("longrun_deadline_actions_total", "action" => "expired_before_start")
            .increment(counts.expired_before_start);
        metrics::counter!("longrun_deadline_actions_total", "action" => "cancel_requested")
            .increment(counts.cancel_requested);
        metrics::counter!("longrun_deadline_actions_total", "action" => "ended_without_ack")
            .increment(counts.ended_without_ack);
        if counts != EnforceCounts::default() {
            tracing::info!(
                expired_before_start = counts.expired_before_start,
                cancel_requested = counts.cancel_requested,
                ended_without_ack = counts.ended_without_ack,
                "enforced deadlines"
            );
        }
        Ok(counts)
    }

    /// Rounds every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        crate::services::run::run_every("enforcing deadlines", self.config.interval, shutdown, || {
            self.run_once()
        })
        .await;
    }
}
