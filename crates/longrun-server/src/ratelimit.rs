//! What one process lets callers take:
//!
//! - [`RateLimiter`]: token buckets per name, refilled at R tokens per
//!   second. Per tenant (`longrun tenants set T --rate R`, holding at most one
//!   second's worth, at least one request) and per source for failed
//!   authentications (a larger burst).
//! - [`InFlight`] and [`TenantsInFlight`]: how many requests are being
//!   handled at once, overall and per tenant; a guard leaves on drop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Buckets kept before idle ones are forgotten (sources are unbounded).
const MAX_BUCKETS: usize = 10_000;

pub struct RateLimiter {
    buckets: Mutex<HashMap<String, Bucket>>,
    /// A bucket holds this many seconds of its rate (at least one token).
    burst_seconds: f64,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::with_burst(1.0)
    }
}

struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

impl RateLimiter {
    /// Buckets holding `burst_seconds` of their rate.
    pub fn with_burst(burst_seconds: f64) -> Self {
        Self {
            buckets: Mutex::new(HashMap::new()),
            burst_seconds,
        }
    }

    /// Takes one token for `name` at `rate` per second; `Err(wait)` says how
    /// long until one is available.
    pub fn take(&self, name: &str, rate: f64, now: Instant) -> Result<(), Duration> {
        let capacity = (rate * self.burst_seconds).max(1.0);
        let mut buckets = self.buckets.lock().expect("rate limiter poisoned");
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(name) {
            // Full buckets carry no state worth keeping.
            buckets
                .retain(|_, b| b.tokens + now.saturating_duration_since(b.refilled_at).as_secs_f64() * rate < capacity);
            if buckets.len() >= MAX_BUCKETS {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(name.to_owned()).or_insert(Bucket {
            tokens: capacity,
            refilled_at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled_at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(capacity);
        bucket.refilled_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

/// Requests being handled at once, up to a limit.
pub struct InFlight {
    limit: usize,
    count: Arc<AtomicUsize>,
}

/// One request counted in an [`InFlight`]; leaves when dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<AtomicUsize>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InFlight {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            count: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A place, or `None` when `limit` requests are already in.
    pub fn try_enter(&self) -> Option<InFlightGuard> {
        enter(&self.count, self.limit)
    }
}

fn enter(count: &Arc<AtomicUsize>, limit: usize) -> Option<InFlightGuard> {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
        .ok()
        .map(|_| InFlightGuard(count.clone()))
}

/// An [`InFlight`] per tenant.
pub struct TenantsInFlight {
    limit: usize,
    counts: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

impl TenantsInFlight {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            counts: Mutex::new(HashMap::new()),
        }
    }

    pub fn try_enter(&self, tenant: &str) -> Option<InFlightGuard> {
        let count = {
            let mut counts = self.counts.lock().expect("in-flight counts poisoned");
            match counts.get(tenant) {
                Some(count) => count.clone(),
                None => counts.entry(tenant.to_owned()).or_default().clone(),
            }
        };
        enter(&count, self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_rate_and_says_when_to_come_back() {
        let limiter = RateLimiter::default();
        let t0 = Instant::now();
        assert!(limiter.take("a", 2.0, t0).is_ok());
        assert!(limiter.take("a", 2.0, t0).is_ok());
        let wait = limiter.take("a", 2.0, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(limiter.take("b", 2.0, t0).is_ok(), "tenants have their own buckets");
        assert!(limiter.take("a", 2.0, t0 + Duration::from_millis(500)).is_ok());
        // Slow rates still allow one request.
        assert!(limiter.take("slow", 0.1, t0).is_ok());
        assert_eq!(limiter.take("slow", 0.1, t0).unwrap_err(), Duration::from_secs(10));
    }

    #[test]
    fn bursts_hold_several_seconds_of_the_rate() {
        let limiter = RateLimiter::with_burst(10.0);
        let t0 = Instant::now();
        for _ in 0..20 {
            assert!(limiter.take("src", 2.0, t0).is_ok());
        }
        assert_eq!(limiter.take("src", 2.0, t0).unwrap_err(), Duration::from_millis(500));
        assert!(limiter.take("src", 2.0, t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn in_flight_places_are_bounded_and_come_back_on_drop() {
        let overall = InFlight::new(2);
        let a = overall.try_enter().unwrap();
        let _b = overall.try_enter().unwrap();
        assert!(overall.try_enter().is_none());
        drop(a);
        assert!(overall.try_enter().is_some());

        let tenants = TenantsInFlight::new(1);
        let held = tenants.try_enter("acme").unwrap();
        assert!(tenants.try_enter("acme").is_none());
        assert!(tenants.try_enter("globex").is_some(), "tenants have their own places");
        drop(held);
        assert!(tenants.try_enter("acme").is_some());
    }
}
