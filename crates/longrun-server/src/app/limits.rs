//! [`Limits`]: every bound the server keeps against hostile and careless
//! clients, in one place (the listener, the edge and the application read
//! them from here).

use std::time::Duration;

use crate::source::TrustedProxies;

/// What the edge holds at most, and for how long: the bounds against
/// hostile and careless clients, in one place.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections; one more is answered `503` and closed.
    pub max_connections: usize,
    /// To receive a request's head, and to keep an idle connection.
    pub header_read_timeout: Duration,
    /// Between two chunks of a request body.
    pub body_stall_timeout: Duration,
    /// A write to the client making no progress (it stopped reading); then
    /// the connection is closed.
    pub send_stall_timeout: Duration,
    /// Requests being handled at once; more are shed with `503` and
    /// `Retry-After` at once instead of queueing.
    pub max_in_flight: usize,
    /// Requests of one tenant being handled at once (long-polls included);
    /// more are `429 rate_limited`, so one tenant cannot take every slot.
    pub max_in_flight_per_tenant: usize,
    /// Failed authentications of existing key ids (a wrong secret, a
    /// revoked key) per second a source may make, with a burst of ten times
    /// that; beyond it, its failing requests are `429 rate_limited`. A
    /// correct key is never refused for what its source did.
    pub auth_failures_per_source: f64,
    /// Proxies whose `Forwarded`/`X-Forwarded-For` name the source
    /// (`--trusted-proxies`); from any other peer, the peer is the source.
    pub trusted_proxies: TrustedProxies,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            body_stall_timeout: Duration::from_secs(30),
            send_stall_timeout: Duration::from_secs(30),
            max_in_flight: 4096,
            max_in_flight_per_tenant: 1024,
            auth_failures_per_source: 2.0,
            trusted_proxies: TrustedProxies::default(),
        }
    }
}
