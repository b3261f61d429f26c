//! Bearer API keys: looked up by id, checked in constant time against the
//! stored SHA-256. Verified records are cached for a few seconds so the hot
//! paths do not read the key table on every request; a revocation takes
//! effect within that time. An id no key has is refused from the in-memory
//! set of key ids (`crate::keys`), and a source that keeps sending wrong
//! secrets for existing ids gets `429` for them — never for a correct key.
//! The API (`Authorization: Bearer`) and the console's sign-in check keys
//! through here.

use std::time::{Duration, Instant};

use longrun_core::apikey::PresentedKey;
use longrun_store::ApiKeyRecord;

use super::{ApiError, AppState};

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
pub async fn authenticate(
    state: &AppState,
    presented: Option<PresentedKey<'_>>,
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

fn too_many_failures(wait: Duration) -> ApiError {
    ApiError::RateLimited {
        detail: "too many failed authentications from this address".into(),
        retry_after: wait.max(Duration::from_secs(1)),
    }
}
