//! Bearer API keys: parsed, looked up by id, checked in constant time against
//! the stored SHA-256, role-checked. Verified records are cached for a few
//! seconds so the hot paths do not read the key table on every request; a
//! revocation takes effect within that time. Unknown ids are cached apart,
//! and a source (peer IP) that keeps failing is refused with `429` before
//! any store read.

use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use longrun_core::Id;
use longrun_core::apikey::{PresentedKey, Role};

use crate::AppState;
use crate::http::error::ApiError;
use crate::ratelimit::InFlightGuard;

/// How long a looked-up key record is trusted before it is read again, by default.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// The authenticated caller of a request. While it lives, the request
/// counts against its tenant's requests in flight.
#[derive(Debug)]
pub struct Caller {
    pub key_id: Id,
    pub tenant: String,
    pub role: Role,
    _in_flight: InFlightGuard,
}

impl Caller {
    /// Clients and admins may use the operations API.
    pub fn require_client(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Client | Role::Admin => Ok(()),
            Role::Worker => Err(ApiError::Forbidden),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let source = || crate::listen::peer(&parts.extensions).map(|p| p.ip().to_string());
        let presented = presented_key(parts);
        let record = match &presented {
            None => None,
            Some(presented) => match state.cached_api_key(&presented.id) {
                Some(known) => known,
                None => {
                    // A source that keeps failing gets no more store reads:
                    // only keys this process already knows are checked for it.
                    if let Some(source) = source() {
                        let rate = state.config.limits.auth_failures_per_source;
                        if let Err(wait) = state.auth_failures.check(&source, rate, Instant::now()) {
                            return Err(too_many_failures(wait));
                        }
                    }
                    state.load_api_key(&presented.id).await?
                }
            },
        };
        let verified = match (&presented, record) {
            (Some(presented), Some(record)) if record.revoked_at.is_none() && presented.verify(&record.secret_hash) => {
                record
            }
            _ => {
                metrics::counter!("longrun_auth_failures_total").increment(1);
                if let Some(source) = source() {
                    let rate = state.config.limits.auth_failures_per_source;
                    let _ = state.auth_failures.take(&source, rate, Instant::now());
                }
                return Err(ApiError::Unauthenticated);
            }
        };
        tracing::Span::current().record("tenant", verified.tenant.as_str());
        let in_flight = state
            .tenants_in_flight
            .try_enter(&verified.tenant)
            .ok_or_else(|| ApiError::RateLimited {
                detail: "the tenant has as many requests in flight as it may".into(),
                retry_after: Duration::from_secs(1),
            })?;
        let caller = Caller {
            key_id: verified.id,
            tenant: verified.tenant,
            role: verified.role,
            _in_flight: in_flight,
        };
        if caller.role != Role::Admin {
            state.check_rate(&caller.tenant).await?;
        }
        Ok(caller)
    }
}

/// The bearer key of the request, if it has one that parses.
fn presented_key(parts: &Parts) -> Option<PresentedKey> {
    let header = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    PresentedKey::parse(token.trim())
}

fn too_many_failures(wait: Duration) -> ApiError {
    ApiError::RateLimited {
        detail: "too many failed authentications from this address".into(),
        retry_after: wait.max(Duration::from_secs(1)),
    }
}
