//! Lease and retry maths.

use std::time::Duration;

/// Shortest and longest lease a worker may ask for.
pub const MIN_LEASE: Duration = Duration::from_secs(5);
/// The longest lease a worker may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(600);

/// Delay before attempt `next_attempt` (2, 3, …) of a re-run-safe operation
/// starts: exponential from 1 s, capped at 5 minutes.
pub fn retry_backoff(next_attempt: i64) -> Duration {
    let exponent = u32::try_from(next_attempt.saturating_sub(2).clamp(0, 16)).unwrap_or(16);
    Duration::from_secs(1u64 << exponent).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(retry_backoff(2), Duration::from_secs(1));
        assert_eq!(retry_backoff(3), Duration::from_secs(2));
        assert_eq!(retry_backoff(6), Duration::from_secs(16));
        assert_eq!(retry_backoff(40), Duration::from_secs(300));
        assert_eq!(retry_backoff(i64::MIN), Duration::from_secs(1));
    }
}
