//! The HTTP edge of Longrun and the process that serves it.
//!
//! [`app`] builds the axum router from an [`AppState`] (tests may call it
//! without a socket); [`start`] opens the store, bootstraps keys on first
//! start, declares the built-in kinds, binds the listener and runs the
//! background services until shutdown.

pub mod callback;
pub mod http;
mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use longrun_core::Clock;
use longrun_core::fingerprint::Fingerprinter;
use longrun_engine::{Registry, Signals};
use longrun_store::{KindSpec, Store, StoreError};
use tower_http::catch_panic::CatchPanicLayer;

pub use callback::CallbackPolicy;
pub use server::{BootstrapKeys, HARD_STOP_AFTER, RunningServer, ServeOptions, shutdown_signal, start};

/// Settings of the HTTP edge.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_body_bytes: usize,
    /// Refuse submissions without `Idempotency-Key` (the default).
    pub require_idempotency_key: bool,
    /// Retention of terminal operations (and so of their idempotency records).
    pub operation_retention: Duration,
    pub callback_policy: CallbackPolicy,
    /// How long a verified API key is trusted before it is read again (so how
    /// long a revocation may take to bite).
    pub key_cache_ttl: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            require_idempotency_key: true,
            operation_retention: Duration::from_secs(30 * 24 * 3600),
            callback_policy: CallbackPolicy::default(),
            key_cache_ttl: http::auth::KEY_CACHE_TTL,
        }
    }
}

/// How long a kind declaration read from the store is trusted.
const KIND_CACHE_TTL: Duration = Duration::from_secs(5);

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub registry: Registry,
    pub signals: Signals,
    pub fingerprinter: Fingerprinter,
    pub config: Config,
    pub(crate) keys: http::auth::KeyCache,
    kinds: Mutex<HashMap<String, (Option<KindSpec>, Instant)>>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        registry: Registry,
        signals: Signals,
        fingerprinter: Fingerprinter,
        config: Config,
    ) -> Self {
        Self(Arc::new(Inner {
            store,
            clock,
            registry,
            signals,
            fingerprinter,
            keys: http::auth::KeyCache::new(config.key_cache_ttl),
            kinds: Mutex::new(HashMap::new()),
            config,
        }))
    }

    /// The declaration of `kind`, cached for a few seconds: `longrun kinds
    /// set` from another process is seen within that time.
    pub async fn kind_spec(&self, kind: &str) -> Result<Option<KindSpec>, StoreError> {
        if let Some((spec, at)) = self.kinds.lock().expect("kind cache poisoned").get(kind)
            && at.elapsed() < KIND_CACHE_TTL
        {
            return Ok(spec.clone());
        }
        let spec = self.store.kind_get(kind).await?;
        let mut cache = self.kinds.lock().expect("kind cache poisoned");
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(kind.to_owned(), (spec.clone(), Instant::now()));
        Ok(spec)
    }
}

/// The whole HTTP API as one router.
pub fn app(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    Router::new()
        .merge(http::operations::router())
        .merge(http::health::router())
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(CatchPanicLayer::new())
        .layer(axum::middleware::from_fn(http::edge))
        .with_state(state)
}
