//! The loop every periodic service runs: a round each `interval` until
//! shutdown, a failed round logged and retried at the next tick.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs `round` every `interval` until `shutdown`, logging failures as [`Failures`] says.
pub async fn run_every<F, Fut, T, E>(what: &'static str, interval: Duration, shutdown: CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = Failures::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match round().await {
            Ok(_) => failures.succeeded(what),
            Err(e) => failures.failed(what, &e),
        };
    }
}

/// How often a failure that goes on is logged again.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// Logs a service's failing rounds without flooding the log while, say, the
/// database is down: the first failure at ERROR, then one line a minute
/// while it goes on, and one when a round succeeds again. Each method says
/// whether it logged.
#[derive(Debug, Default)]
pub struct Failures {
    /// Failed rounds in a row, and when the run of them began.
    run: Option<(u64, Instant)>,
    last_logged: Option<Instant>,
}

impl Failures {
    /// Counts a failed round; `true` when it should be logged now.
    pub fn failed(&mut self, what: &str, error: &dyn Display) -> bool {
        let now = Instant::now();
        let (count, since) = self.run.get_or_insert((0, now));
        *count += 1;
        let due = self.last_logged.is_none_or(|at| now.duration_since(at) >= REPEAT_EVERY);
        if due {
            if *count == 1 {
                tracing::error!(error = %error, "{what} failed");
            } else {
                let for_seconds = now.duration_since(*since).as_secs();
                tracing::error!(error = %error, rounds = *count, for_seconds, "{what} still failing");
            }
            self.last_logged = Some(now);
        } else {
            tracing::debug!(error = %error, "{what} failed");
        }
        due
    }

    /// Ends a run of failures; `true` when it ended one (and logged that).
    pub fn succeeded(&mut self, what: &str) -> bool {
        let Some((count, since)) = self.run.take() else {
            return false;
        };
        self.last_logged = None;
        let for_seconds = since.elapsed().as_secs();
        tracing::info!(rounds = count, for_seconds, "{what} works again");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failure_that_goes_on_is_logged_once_a_minute_and_its_end_once() {
        let mut failures = Failures::default();
        assert!(!failures.succeeded("reaping"), "nothing to report before a failure");
        assert!(failures.failed("reaping", &"down"));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!failures.failed("reaping", &"down"));
        tokio::time::advance(REPEAT_EVERY).await;
        assert!(failures.failed("reaping", &"down"), "a minute later it says so again");
        assert!(!failures.failed("reaping", &"down"));
        assert!(failures.succeeded("reaping"));
        assert!(!failures.succeeded("reaping"));
        assert!(failures.failed("reaping", &"down"), "a new failure is news at once");
    }
}
