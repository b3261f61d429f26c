//! A small time-bounded cache for records read on hot paths (API keys, kind
//! declarations, tenant limits) that other processes may change: a change is
//! seen within the TTL.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAX_ENTRIES: usize = 10_000;

pub struct TtlCache<K, V> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().expect("cache poisoned");
        entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(v, _)| v.clone())
    }

    /// Forgets `key`: the next read loads it again.
    pub fn forget(&self, key: &K) {
        self.entries.lock().expect("cache poisoned").remove(key);
    }

    pub fn put(&self, key: K, value: V) {
        let mut entries = self.entries.lock().expect("cache poisoned");
        if entries.len() >= MAX_ENTRIES {
            let ttl = self.ttl;
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now()));
    }

    /// The cached value, or the one `load` reads (then cached).
    pub async fn get_or_load<E, F, Fut>(&self, key: &K, load: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, E>>,
    {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let v = load().await?;
        self.put(key.clone(), v.clone());
        Ok(v)
    }
}
