//! Time as a parameter: every service and store call takes its `now` from a
//! [`Clock`], so tests move time with [`ManualClock`] instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use time::OffsetDateTime;

/// Milliseconds since the Unix epoch, UTC. The only time type stores see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The instant `ms` milliseconds after the Unix epoch.
    pub fn from_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> i64 {
        self.0
    }

    /// `d` later (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Self(self.0.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }

    /// `d` earlier (saturating).
    pub fn minus(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0 - earlier.0).unwrap_or(0))
    }

    /// RFC 3339 in UTC, always with millisecond precision, e.g. `2026-11-29T08:49:14.123Z`.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let fmt =
            time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
        t.format(&fmt).unwrap_or_default()
    }

    /// An RFC 3339 date-time with an offset (`2026-12-06T02:00:00Z`,
    /// `…+01:00`), to the millisecond; `None` for anything else.
    pub fn parse_rfc3339(text: &str) -> Option<Self> {
        let t = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok().map(Self)
    }

    /// The HTTP-date form (RFC 9110 IMF-fixdate), for headers such as `Idempotency-Expires`.
    pub fn to_http_date(self) -> String {
        let t = OffsetDateTime::from_unix_timestamp(self.0.div_euclid(1000)).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let fmt = time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        );
        t.format(&fmt).unwrap_or_default()
    }
}

/// A source of "now".
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that only moves when a test moves it. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing still at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now: Arc::new(AtomicI64::new(start.0)),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now
            .fetch_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// Sets the clock to `t` (also backwards, to test clock skew).
    pub fn set(&self, t: Timestamp) {
        self.now.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }
}

/// A clock that runs `factor` times faster than the wall clock, for
/// benchmarks that compress minutes of operation life into seconds.
#[derive(Debug, Clone)]
pub struct ScaledClock {
    start: Timestamp,
    started: std::time::Instant,
    factor: f64,
}

impl ScaledClock {
    /// A clock at `start` now, running `factor` times as fast as the wall clock.
    pub fn new(start: Timestamp, factor: f64) -> Self {
        Self {
            start,
            started: std::time::Instant::now(),
            factor,
        }
    }
}

impl Clock for ScaledClock {
    fn now(&self) -> Timestamp {
        self.start.plus(self.started.elapsed().mul_f64(self.factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_has_millis_and_z() {
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp(1_796_000_000_123).to_rfc3339(), "2026-11-30T00:53:20.123Z");
    }

    #[test]
    fn http_date_is_imf_fixdate() {
        assert_eq!(
            Timestamp(784_111_777_000).to_http_date(),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(1_000));
        assert_eq!(c.now(), Timestamp(1_000));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.clone().now(), Timestamp(3_000));
    }
}
