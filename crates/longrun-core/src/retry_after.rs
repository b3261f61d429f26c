//! How long a client should wait before polling a non-terminal operation.
//!
//! Polls are paced by the server: early in an operation's life a client learns
//! quickly whether short work finished; later, polling slows down in
//! proportion to the operation's age (half of it: the polls fall at roughly
//! 1.5× intervals, like a client's exponential backoff), so a client polling
//! a two-hour job does not ask every two seconds. When the kind's typical
//! (median) duration is known and not yet reached, the hint aims at it.
//! Always within 1–60 s.

use std::time::Duration;

/// The shortest `Retry-After` the server asks for.
pub const MIN: Duration = Duration::from_secs(1);
/// The longest `Retry-After` the server asks for.
pub const MAX: Duration = Duration::from_secs(60);

/// The `Retry-After` for an operation of `age`, of a kind whose typical
/// (median) duration is `typical`, if known.
pub fn retry_after(age: Duration, typical: Option<Duration>) -> Duration {
    // Half the age: at 10 s wait 5 s, at 2 min wait a minute.
    let by_age = age / 2;
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
        assert_eq!(retry_after(s(2), None), s(1));
    }

    #[test]
    fn pace_slows_with_age_and_is_capped() {
        assert_eq!(retry_after(s(10), None), s(5));
        assert_eq!(retry_after(s(100), None), s(50));
        assert_eq!(retry_after(s(120), None), s(60));
        assert_eq!(retry_after(s(86_400), None), s(60));
    }

    #[test]
    fn known_durations_aim_at_the_expected_end() {
        assert_eq!(retry_after(s(0), Some(s(5))), s(5));
        assert_eq!(retry_after(s(3), Some(s(5))), s(2));
        assert_eq!(retry_after(s(0), Some(s(3600))), s(60));
        // Past the typical duration, age decides.
        assert_eq!(retry_after(s(200), Some(s(5))), s(60));
        assert_eq!(retry_after(s(30), Some(s(5))), s(15));
    }

    #[test]
    fn polls_of_a_ten_minute_job_stay_few() {
        // Follow the hints from acceptance until a 10-minute job ends.
        let count = |typical| {
            let (mut t, mut polls) = (s(0), 0);
            while t < s(600) {
                polls += 1;
                t += retry_after(t, typical);
            }
            polls + 1
        };
        assert!(count(None) <= 25, "age-paced: {}", count(None));
        assert!(count(Some(s(600))) <= 12, "duration-paced: {}", count(Some(s(600))));
    }

    #[test]
    fn header_rounds_up() {
        assert_eq!(header_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(header_seconds(s(3)), 3);
    }
}
