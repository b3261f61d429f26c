//! How long a client should wait before polling a non-terminal operation.
//!
//! Polls are paced by the server: early in an operation's life a client learns
//! quickly whether short work finished; later, polling slows down in
//! proportion to the operation's age, so a client polling a two-hour job does
//! not ask every two seconds. When the kind's typical duration is known, the
//! hint aims a little past the expected end. Always within 1–60 s.

use std::time::Duration;

pub const MIN: Duration = Duration::from_secs(1);
pub const MAX: Duration = Duration::from_secs(60);

/// The `Retry-After` for an operation of `age`, of a kind whose typical
/// (median) duration is `typical`, if known.
pub fn retry_after(age: Duration, typical: Option<Duration>) -> Duration {
    // A tenth of the age: after 10 s poll every second, after 10 min every minute.
    let by_age = age / 10;
    let hint = match typical {
        // Still before the typical end: wake up around it (never before MIN).
        Some(typical) if typical > age => by_age.max((typical - age).min(MAX)),
        _ => by_age,
    };
    hint.clamp(MIN, MAX)
}

/// Whole seconds for the header, rounded up so the hint is never shortened.
pub fn header_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn young_operations_poll_every_second() {
        assert_eq!(retry_after(s(0), None), s(1));
        assert_eq!(retry_after(s(9), None), s(1));
    }

    #[test]
    fn pace_slows_with_age_and_is_capped() {
        assert_eq!(retry_after(s(100), None), s(10));
        assert_eq!(retry_after(s(600), None), s(60));
        assert_eq!(retry_after(s(86_400), None), s(60));
    }

    #[test]
    fn known_durations_aim_at_the_expected_end() {
        assert_eq!(retry_after(s(0), Some(s(5))), s(5));
        assert_eq!(retry_after(s(3), Some(s(5))), s(2));
        assert_eq!(retry_after(s(0), Some(s(3600))), s(60));
        // Past the typical duration, age decides.
        assert_eq!(retry_after(s(200), Some(s(5))), s(20));
    }

    #[test]
    fn header_rounds_up() {
        assert_eq!(header_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(header_seconds(s(3)), 3);
    }
}
