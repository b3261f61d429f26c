//! Which API key ids exist, held in memory by every node, so that a key
//! whose id does not exist is refused without a store read and without
//! throttling anyone: a flood of made-up keys costs a set lookup each.
//!
//! The set is loaded from the store at the first authentication and kept
//! current as keys are used: a key id this process has not seen is looked
//! up in the store (a key created by another process or node becomes
//! usable at once), each such lookup spending a token of one process-wide
//! budget ([`MISSES_PER_SECOND`], bursts of [`MISS_BURST_SECONDS`] of it).
//! Past the budget an unknown id is refused from memory. So a flood of
//! made-up ids reads the store at most that often, whoever sends it, and
//! never refuses a key that exists and was seen before; only a key created
//! elsewhere *during* such a flood may be refused until the flood's budget
//! refills. An id that turns out gone (its tenant deleted) is forgotten.

use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Instant;

use longrun_core::Id;
use longrun_store::{ApiKeyRecord, Store, StoreError};
use tokio::sync::OnceCell;

use crate::ratelimit::RateLimiter;

/// Store lookups of ids that turned out unknown, per second, per process.
pub const MISSES_PER_SECOND: f64 = 10.0;
/// The budget of such lookups holds this many seconds of its rate.
pub const MISS_BURST_SECONDS: f64 = 10.0;

/// The key ids that exist (revoked ones too: their refusal is the record's).
pub struct KnownKeys {
    ids: RwLock<HashSet<Id>>,
    loaded: OnceCell<()>,
    misses: RateLimiter,
}

impl Default for KnownKeys {
    fn default() -> Self {
        Self {
            ids: RwLock::new(HashSet::new()),
            loaded: OnceCell::new(),
            misses: RateLimiter::with_burst(MISS_BURST_SECONDS),
        }
    }
}

/// What the set says of an id.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    /// The id exists (or did when last seen): check its secret.
    Yes,
    /// Not known here, and the budget allows one store lookup.
    LookUp,
    /// Not known here, and the budget of lookups is spent: refuse.
    No,
}

impl KnownKeys {
    /// Loads every key id once (the first caller waits for it).
    pub async fn ensure_loaded(&self, store: &dyn Store) -> Result<(), StoreError> {
        self.loaded
            .get_or_try_init(|| async {
                let keys = store.api_key_list().await?;
                self.ids
                    .write()
                    .expect("key set poisoned")
                    .extend(keys.into_iter().map(|k| k.id));
                Ok::<(), StoreError>(())
            })
            .await
            .map(|_| ())
    }

    /// Whether `id` is known, or may be looked up.
    pub fn check(&self, id: &Id) -> Known {
        if self.ids.read().expect("key set poisoned").contains(id) {
            return Known::Yes;
        }
        match self.misses.take("", MISSES_PER_SECOND, Instant::now()) {
            Ok(()) => Known::LookUp,
            Err(_) => Known::No,
        }
    }

    /// Records what a lookup of `id` found.
    pub fn found(&self, id: &Id, record: Option<&ApiKeyRecord>) {
        let mut ids = self.ids.write().expect("key set poisoned");
        if record.is_some() {
            ids.insert(id.clone());
        } else {
            ids.remove(id);
        }
    }

    /// Adds a key this process just created.
    pub fn insert(&self, id: &Id) {
        self.ids.write().expect("key set poisoned").insert(id.clone());
    }
}
