//! Bearer API keys: parsed, looked up by id, checked in constant time against
//! the stored SHA-256, role-checked. Verified records are cached for a few
//! seconds so the hot paths do not read the key table on every request; a
//! revocation takes effect within that time. An id no key has is refused
//! from the in-memory set of key ids (`crate::keys`), and a source that
//! keeps sending wrong secrets for existing ids gets `429` for them — never
//! for a correct key.

use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use longrun_core::Id;
use longrun_core::apikey::{PresentedKey, Role};
use longrun_store::ApiKeyRecord;

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
        let verified = authenticate(state, presented_key(parts), || {
            state.source_of(&parts.extensions, &parts.headers)
        })
        .await?;
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

/// Why a key was refused, as `longrun_auth_failures_total` counts it.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// No bearer key, or not a key's syntax: refused without a store read.
    Malformed,
    /// No key has its id: refused from memory (see `keys`).
    UnknownId,
    /// The id exists; the secret is wrong, or the key is revoked.
    WrongSecret,
}

impl Failure {
    fn label(self) -> &'static str {
        match self {
            Failure::Malformed => "malformed",
            Failure::UnknownId => "unknown_key",
            Failure::WrongSecret => "wrong_secret",
        }
    }
}

/// The record of a presented key that is valid now, or the refusal: `401`,
/// or `429` for a source past its budget of failures (`source` is asked
/// only then). A correct key is checked before any budget, so it is never
/// refused for what other requests from its address did; only failed
/// guesses of an existing key's secret spend the source's budget, and an
/// unknown id costs nothing but a set lookup.
pub(crate) async fn authenticate(
    state: &AppState,
    presented: Option<PresentedKey>,
    source: impl FnOnce() -> Option<std::net::IpAddr>,
) -> Result<ApiKeyRecord, ApiError> {
    let failure = match &presented {
        None => Failure::Malformed,
        Some(presented) => match state.api_key(&presented.id).await? {
            None => Failure::UnknownId,
            Some(record) if record.revoked_at.is_none() && presented.verify(&record.secret_hash) => {
                return Ok(record);
            }
            Some(_) => Failure::WrongSecret,
        },
    };
    metrics::counter!("longrun_auth_failures_total", "reason" => failure.label()).increment(1);
    if let (Failure::WrongSecret, Some(source)) = (failure, source()) {
        let rate = state.config.limits.auth_failures_per_source;
        if let Err(wait) = state.auth_failures.take(&source.to_string(), rate, Instant::now()) {
            return Err(too_many_failures(wait));
        }
    }
    Err(ApiError::Unauthenticated)
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
