//! The [`Caller`] of a request: its bearer key, checked by
//! `app::auth::authenticate`, role-checked, and counted against its
//! tenant's requests in flight and rate.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use longrun_core::Id;
use longrun_core::apikey::{PresentedKey, Role};

use crate::app::ApiError;
use crate::app::AppState;
use crate::ratelimit::InFlightGuard;

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
        let verified = crate::app::auth::authenticate(state, presented_key(parts), || {
            crate::source::of_request(&parts.extensions, &parts.headers, &state.config.limits.trusted_proxies)
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

/// The bearer key of the request, if it has one that parses.
fn presented_key(parts: &Parts) -> Option<PresentedKey<'_>> {
    let header = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    PresentedKey::parse(token.trim())
}
