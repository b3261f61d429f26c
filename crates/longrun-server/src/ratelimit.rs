//! Per-tenant request rate limits (`longrun tenants set T --rate R`): a token
//! bucket per tenant in this process, refilled at R tokens per second, holding
//! at most one second's worth (at least one request).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

impl RateLimiter {
    /// Takes one token for `tenant` at `rate` per second; `Err(wait)` says how
    /// long until one is available.
    pub fn take(&self, tenant: &str, rate: f64, now: Instant) -> Result<(), Duration> {
        let capacity = rate.max(1.0);
        let mut buckets = self.buckets.lock().expect("rate limiter poisoned");
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
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
}
