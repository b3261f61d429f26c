//! Bearer API keys: parsed, looked up by id, checked in constant time against
//! the stored SHA-256, role-checked. Verified records are cached for a few
//! seconds so the hot paths do not read the key table on every request; a
//! revocation takes effect within that time.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use longrun_core::Id;
use longrun_core::apikey::{PresentedKey, Role};

use crate::AppState;
use crate::http::error::ApiError;

/// How long a looked-up key record is trusted before it is read again, by default.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key_id: Id,
    pub tenant: String,
    pub role: Role,
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
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(ApiError::Unauthenticated)?;
        let (scheme, token) = header.split_once(' ').ok_or(ApiError::Unauthenticated)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(ApiError::Unauthenticated);
        }
        let presented = PresentedKey::parse(token.trim()).ok_or(ApiError::Unauthenticated)?;
        let record = state
            .keys
            .get_or_load(&presented.id, || state.store.api_key_get(&presented.id))
            .await?
            .ok_or(ApiError::Unauthenticated)?;
        if record.revoked_at.is_some() || !presented.verify(&record.secret_hash) {
            return Err(ApiError::Unauthenticated);
        }
        let caller = Caller {
            key_id: record.id,
            tenant: record.tenant,
            role: record.role,
        };
        tracing::Span::current().record("tenant", caller.tenant.as_str());
        if caller.role != Role::Admin {
            state.check_rate(&caller.tenant).await?;
        }
        Ok(caller)
    }
}
