//! [`AppState`]: what every request and service of this process shares —
//! the store, the caches of keys, kinds and limits, the rate limits, the
//! change hub, the hand-offs — and [`Config`], the server's settings.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use longrun_core::fingerprint::Fingerprinter;
use longrun_core::{Clock, Id};
use longrun_engine::bytes::artifacts::ArtifactStore;
use longrun_engine::{Registry, Signals};
use longrun_store::{ApiKeyRecord, KindSpec, Operation, Store, StoreError, TenantLimits};

use super::callback::CallbackPolicy;
use super::error::ApiError;
use super::limits::Limits;
use crate::cache::{RenderedBodies, TtlCache};
use crate::changes::ChangeHub;
use crate::keys;
use crate::ratelimit::{InFlight, RateLimiter, TenantsInFlight};
use crate::{handoff, metrics};

/// How long a verified key is trusted before it is read again, unless
/// `--key-cache-ttl` says otherwise.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// Settings of the HTTP edge.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest request body accepted (`--max-body-bytes`).
    pub max_body_bytes: usize,
    /// Refuse submissions without `Idempotency-Key` (the default).
    pub require_idempotency_key: bool,
    /// Retention of terminal operations (and so of their idempotency records).
    pub operation_retention: Duration,
    /// Which callback URLs a submission may name.
    pub callback_policy: CallbackPolicy,
    /// How long a verified API key is trusted before it is read again (so how
    /// long a revocation may take to bite).
    pub key_cache_ttl: Duration,
    /// Long-polls and event streams one tenant may hold open at once.
    pub max_waiters_per_tenant: usize,
    /// How long a minted download link works.
    pub link_ttl: Duration,
    /// Largest artifact a worker may upload.
    pub max_artifact_bytes: u64,
    /// Largest upload a client may stream (`--max-upload-bytes`).
    pub max_upload_bytes: u64,
    /// How long an upload no operation names is kept (`--upload-retention`).
    pub upload_retention: Duration,
    /// Connections, timeouts and requests in flight.
    pub limits: Limits,
    /// How often a waiting worker claim looks again without being woken
    /// (`--claim-poll`): what finds work whose start time or retry backoff
    /// arrived, or that a changed tenant limit let go. Each waiting claim
    /// costs a store claim this often.
    pub claim_poll: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            require_idempotency_key: true,
            operation_retention: Duration::from_secs(30 * 24 * 3600),
            callback_policy: CallbackPolicy::default(),
            key_cache_ttl: KEY_CACHE_TTL,
            max_waiters_per_tenant: 1000,
            link_ttl: Duration::from_secs(300),
            max_artifact_bytes: 64 * 1024 * 1024 * 1024,
            max_upload_bytes: 64 * 1024 * 1024 * 1024,
            upload_retention: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            claim_poll: Duration::from_millis(500),
        }
    }
}

/// How soon a pause of acceptance set by another process takes effect.
const PAUSE_CACHE_TTL: Duration = Duration::from_secs(2);
/// What a paused submission is told to wait.
pub const PAUSED_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Server secrets holding download-link keys are named `link-key:<kid>`.
pub const LINK_KEY_PREFIX: &str = "link-key:";

/// A source's bucket of failed authentications holds this many seconds of
/// its rate.
const AUTH_FAILURE_BURST_SECONDS: f64 = 10.0;

/// Console pages that may follow live changes at once.
const MAX_CONSOLE_STREAMS: usize = 256;

/// How long kind declarations and tenant limits read from the store are trusted.
const RECORD_CACHE_TTL: Duration = Duration::from_secs(5);
/// How long a kind's typical duration is reused before it is computed again
/// (short, so a new kind's first successes count soon).
const TYPICAL_DURATION_TTL: Duration = Duration::from_secs(5);

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// What [`AppState`] shares; its parts are the crate's own.
pub struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) artifacts: Arc<dyn ArtifactStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) registry: Registry,
    pub(crate) signals: Signals,
    pub(crate) fingerprinter: Fingerprinter,
    /// Verified key records (revoked ones too).
    pub(crate) keys: TtlCache<Id, ApiKeyRecord>,
    /// The key ids that exist: an unknown one is refused from memory.
    pub(crate) known_keys: keys::KnownKeys,
    /// Failed authentications of existing key ids, per source.
    pub(crate) auth_failures: RateLimiter,
    key_lookups: AtomicU64,
    pub(crate) in_flight: InFlight,
    pub(crate) tenants_in_flight: TenantsInFlight,
    kinds: TtlCache<String, Option<KindSpec>>,
    tenants: TtlCache<String, Option<TenantLimits>>,
    typical: TtlCache<String, Option<Duration>>,
    link_keys: TtlCache<(), Vec<(String, Vec<u8>)>>,
    rates: RateLimiter,
    pub(crate) changes: Arc<ChangeHub>,
    /// Claims waiting for work that a submission may be leased to.
    pub(crate) handoffs: handoff::HandOffs,
    pub(crate) scrape: metrics::Scrape,
    pauses: TtlCache<(), Vec<Option<String>>>,
    /// The console's per-minute counts (fed by the change feed).
    pub(crate) stats: Arc<crate::stats::ConsoleStats>,
    /// Console pages following live changes.
    pub(crate) console_streams: InFlight,
    /// Operation bodies as last rendered, per version.
    pub(crate) rendered: RenderedBodies,
    pub(crate) config: Config,
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The state of a server over `store` and `artifacts`.
    pub fn new(
        store: Arc<dyn Store>,
        artifacts: Arc<dyn ArtifactStore>,
        clock: Arc<dyn Clock>,
        registry: Registry,
        signals: Signals,
        fingerprinter: Fingerprinter,
        config: Config,
    ) -> Self {
        Self(Arc::new(Inner {
            store: store.clone(),
            artifacts,
            clock: clock.clone(),
            registry,
            signals,
            fingerprinter,
            keys: TtlCache::new(config.key_cache_ttl),
            known_keys: keys::KnownKeys::default(),
            auth_failures: RateLimiter::with_burst(AUTH_FAILURE_BURST_SECONDS),
            key_lookups: AtomicU64::new(0),
            in_flight: InFlight::new(config.limits.max_in_flight),
            tenants_in_flight: TenantsInFlight::new(config.limits.max_in_flight_per_tenant),
            kinds: TtlCache::new(RECORD_CACHE_TTL),
            tenants: TtlCache::new(config.key_cache_ttl.min(RECORD_CACHE_TTL)),
            typical: TtlCache::new(TYPICAL_DURATION_TTL),
            link_keys: TtlCache::new(RECORD_CACHE_TTL),
            rates: RateLimiter::default(),
            changes: ChangeHub::new(config.max_waiters_per_tenant),
            handoffs: handoff::HandOffs::default(),
            scrape: metrics::Scrape::new(store.clone(), clock.clone()),
            pauses: TtlCache::new(config.key_cache_ttl.min(PAUSE_CACHE_TTL)),
            stats: crate::stats::ConsoleStats::new(clock.clone()),
            console_streams: InFlight::new(MAX_CONSOLE_STREAMS),
            rendered: RenderedBodies::default(),
            config,
        }))
    }

    /// The record of key `id`, as this process may trust it: `None` when no
    /// such key exists. An id no key has is refused from memory (see
    /// [`keys`]); a known one is read from the store when its cached record
    /// is older than `--key-cache-ttl`.
    pub(crate) async fn api_key(&self, id: &Id) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.known_keys.ensure_loaded(self.store.as_ref()).await?;
        match self.known_keys.check(id) {
            keys::Known::No => return Ok(None),
            keys::Known::Yes => {
                if let Some(record) = self.keys.get(id) {
                    return Ok(Some(record));
                }
            }
            keys::Known::LookUp => {}
        }
        self.load_api_key(id).await
    }

    /// Reads key `id` from the store (counted in [`Self::key_lookups`]),
    /// caches the record and tells the set of known ids what was found.
    async fn load_api_key(&self, id: &Id) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.key_lookups.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!("longrun_api_key_lookups_total").increment(1);
        let record = self.store.api_key_get(id).await?;
        self.known_keys.found(id, record.as_ref());
        if let Some(record) = &record {
            self.keys.put(id.clone(), record.clone());
        }
        Ok(record)
    }

    /// Key records read from the store by this process so far.
    pub fn key_lookups(&self) -> u64 {
        self.key_lookups.load(Ordering::Relaxed)
    }

    /// The declaration of `kind`; `longrun kinds set` from another process is
    /// seen within a few seconds.
    pub async fn kind_spec(&self, kind: &str) -> Result<Option<KindSpec>, StoreError> {
        self.kinds.get_or_load(kind, || self.store.kind_get(kind)).await
    }

    /// The kind's median duration to success, refreshed every 5 s.
    pub async fn typical_duration(&self, kind: &str) -> Result<Option<Duration>, StoreError> {
        self.typical
            .get_or_load(kind, || self.store.kind_typical_duration(kind))
            .await
    }

    /// Answers for an operation that is not there: `410 gone` while its
    /// tombstone lives, else `404`.
    pub async fn missing(&self, tenant: &str, id: &Id) -> ApiError {
        match self.store.operation_tombstone(tenant, id).await {
            Ok(Some(_)) => ApiError::Gone,
            Ok(None) => ApiError::NotFound,
            Err(e) => e.into(),
        }
    }

    /// The operation as its readers may see it: `404` when unknown or
    /// another tenant's, `410 gone` once past its `expires_at` (whether or not
    /// the retention sweep has removed it yet) or while its tombstone lives.
    /// Every read of one operation goes through here or [`Self::visible`].
    /// Long-polls and event streams the tenant holds open on this node (tests
    /// wait on it to know a waiter is registered).
    pub fn waiters(&self, tenant: &str) -> usize {
        self.changes.waiting(tenant)
    }

    /// The tenant's operation `id`: `404` for another tenant's, `410` once removed.
    pub(crate) async fn operation(&self, tenant: &str, id: &Id) -> Result<Operation, ApiError> {
        self.operation_shared(tenant, id).await.map(Arc::unwrap_or_clone)
    }

    /// [`Self::operation`], shared with the read cache rather than copied
    /// (a poll renders the operation; it needs no copy of its own).
    pub(crate) async fn operation_shared(&self, tenant: &str, id: &Id) -> Result<Arc<Operation>, ApiError> {
        let op = self.store.operation_shared(tenant, id).await?;
        let op = self.found(tenant, id, op).await?;
        self.visible(op)
    }

    /// `op`, or `410 gone` if it is past its expiry now: visibility is decided
    /// at read time; the sweep only reclaims the storage.
    pub fn visible<O: std::borrow::Borrow<Operation>>(&self, op: O) -> Result<O, ApiError> {
        if op.borrow().is_expired(self.clock.now()) {
            return Err(ApiError::Gone);
        }
        Ok(op)
    }

    /// `value`, or the right answer for its absence (see [`Self::missing`]).
    pub async fn found<T>(&self, tenant: &str, id: &Id, value: Option<T>) -> Result<T, ApiError> {
        match value {
            Some(v) => Ok(v),
            None => Err(self.missing(tenant, id).await),
        }
    }

    /// The pauses of acceptance in force (`None`: every kind), as cached.
    pub async fn acceptance_pauses(&self) -> Result<Vec<Option<String>>, StoreError> {
        self.pauses.get_or_load(&(), || self.store.accepting_pauses()).await
    }

    /// Forgets the cached pauses (after this process changed them).
    pub fn forget_pauses(&self) {
        self.pauses.forget(&());
    }

    /// `503 temporarily_unavailable` if acceptance of `kind` is paused.
    pub async fn check_accepting(&self, kind: &str) -> Result<(), ApiError> {
        let pauses = self.acceptance_pauses().await?;
        let paused = pauses.iter().any(|p| p.as_deref().is_none_or(|k| k == kind));
        if paused {
            return Err(ApiError::TemporarilyUnavailable {
                detail: format!("acceptance of {kind} operations is paused by an operator"),
                retry_after: PAUSED_RETRY_AFTER,
            });
        }
        Ok(())
    }

    /// The newest download-link key and its id.
    pub async fn link_key_current(&self) -> Result<(String, Vec<u8>), StoreError> {
        let keys = self
            .link_keys
            .get_or_load(&(), || self.store.server_secret_list(LINK_KEY_PREFIX))
            .await?;
        keys.last()
            .map(|(name, key)| (name.trim_start_matches(LINK_KEY_PREFIX).to_owned(), key.clone()))
            .ok_or_else(|| StoreError::Corrupt("no download-link key is stored".into()))
    }

    /// The download-link key `kid`, if it exists (re-read once on a miss, so a
    /// key added by another process is found at once).
    pub async fn link_key(&self, kid: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let name = format!("{LINK_KEY_PREFIX}{kid}");
        let find = |keys: &[(String, Vec<u8>)]| keys.iter().find(|(n, _)| *n == name).map(|(_, k)| k.clone());
        let cached = self
            .link_keys
            .get_or_load(&(), || self.store.server_secret_list(LINK_KEY_PREFIX))
            .await?;
        if let Some(key) = find(&cached) {
            return Ok(Some(key));
        }
        let fresh = self.store.server_secret_list(LINK_KEY_PREFIX).await?;
        self.link_keys.put((), fresh.clone());
        Ok(find(&fresh))
    }

    /// Whether a worker claim of `kind` waits on this node (for tests and
    /// embedding).
    pub fn claims_waiting(&self, kind: &str) -> bool {
        self.signals.waiting_for(kind)
    }

    /// Operation `operation_id` of `kind` left running at `version` (it
    /// ended, paused or goes to retry), here or on another node: under its
    /// tenant's `max_running`, a claim of the kind may now take the
    /// tenant's next task, so the one that has waited longest is woken,
    /// once for the two hearings (this node's outcome and the change feed).
    /// Only for a tenant with a cap (its limits cached briefly): any other
    /// tenant's work was never held back, and a claim woken for it would
    /// find nothing.
    pub(crate) async fn slot_freed(&self, tenant: &str, kind: &str, operation_id: &str, version: i64) {
        let capped = self
            .tenant_limits(tenant)
            .await
            .map_or(true, |limits| limits.is_some_and(|l| l.max_running.is_some()));
        if capped {
            self.signals.work_available_for(kind, operation_id, version);
        }
    }

    /// The tenant's quotas (cached briefly).
    pub(crate) async fn tenant_limits(&self, tenant: &str) -> Result<Option<TenantLimits>, StoreError> {
        self.tenants.get_or_load(tenant, || self.store.tenant_get(tenant)).await
    }

    /// Applies the tenant's request rate, if it has one.
    pub async fn check_rate(&self, tenant: &str) -> Result<(), ApiError> {
        let Some(rate) = self.tenant_limits(tenant).await?.and_then(|l| l.rate) else {
            return Ok(());
        };
        self.rates
            .take(tenant, rate, std::time::Instant::now())
            .map_err(|wait| ApiError::RateLimited {
                detail: format!("the tenant is limited to {rate} requests per second"),
                retry_after: wait,
            })
    }
}
