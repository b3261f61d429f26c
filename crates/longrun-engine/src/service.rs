//! The loop every periodic service runs: a round each `interval` until
//! shutdown, a failed round logged and retried at the next tick.

use std::fmt::Display;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub async fn run_every<F, Fut, T, E>(what: &'static str, interval: Duration, shutdown: CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        if let Err(e) = round().await {
            tracing::error!(error = %e, "{what} failed");
        }
    }
}
