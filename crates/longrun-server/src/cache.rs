//! A small time-bounded cache for records read on hot paths (API keys, kind
//! declarations, tenant limits) that other processes may change: a change is
//! seen within the TTL.

use std::borrow::Borrow;
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

    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
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
    /// Looked up by a borrowed key (`&str` for a `String` key), which is
    /// copied only when the value is loaded: a hit allocates nothing.
    pub async fn get_or_load<Q, E, F, Fut>(&self, key: &Q, load: F) -> Result<V, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, E>>,
    {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let v = load().await?;
        self.put(key.to_owned(), v.clone());
        Ok(v)
    }
}

/// Bodies rendered once per state of a record: a `GET` of an operation
/// that did not change since the last one sends the same bytes again
/// instead of formatting its timestamps and serializing it anew.
///
/// A body is keyed by the record's id and stamped with a digest of what
/// its rendering depends on that can change (for an operation: its
/// version, `updated_at` and the re-runs read with it, which point at it
/// without changing its version), so a stale body is never served, only
/// replaced. Bounded like the store's read cache: in entries and bytes,
/// and a body over [`MAX_BODY_BYTES`] is rendered each time, not kept.
#[derive(Default)]
pub struct RenderedBodies {
    inner: Mutex<Bodies>,
}

#[derive(Default)]
struct Bodies {
    entries: HashMap<Box<str>, (u64, axum::body::Bytes)>,
    bytes: usize,
}

/// The most bytes of rendered bodies kept.
const MAX_BODIES_BYTES: usize = 32 << 20;
/// A body larger than this (a large inline result) is not kept.
const MAX_BODY_BYTES: usize = 64 << 10;

impl RenderedBodies {
    /// The body of `id` as of `stamp`, rendered by `render` unless it was
    /// before.
    pub fn get_or_render(&self, id: &str, stamp: u64, render: impl FnOnce() -> Vec<u8>) -> axum::body::Bytes {
        if let Some((s, body)) = self.inner.lock().expect("cache poisoned").entries.get(id)
            && *s == stamp
        {
            return body.clone();
        }
        let body = axum::body::Bytes::from(render());
        if body.len() > MAX_BODY_BYTES {
            return body;
        }
        let mut inner = self.inner.lock().expect("cache poisoned");
        let full = inner.entries.len() >= MAX_ENTRIES || inner.bytes + body.len() > MAX_BODIES_BYTES;
        if full && !inner.entries.contains_key(id) {
            inner.entries.clear();
            inner.bytes = 0;
        }
        inner.bytes += body.len();
        if let Some((_, old)) = inner.entries.insert(id.into(), (stamp, body.clone())) {
            inner.bytes -= old.len();
        }
        body
    }

    /// Bytes of the bodies kept now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().expect("cache poisoned").bytes
    }
}

/// The stamp of `parts` for [`RenderedBodies`].
pub fn stamp(parts: impl Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_rendered_again_once_its_stamp_moves() {
        let bodies = RenderedBodies::default();
        let text = |version: i64, reruns: &[&str], body: &'static str| {
            bodies.get_or_render("op_a", stamp((version, reruns)), || body.as_bytes().to_vec())
        };
        assert_eq!(&text(1, &[], "one")[..], b"one");
        assert_eq!(
            &text(1, &[], "not rendered")[..],
            b"one",
            "the same state is not rendered again"
        );
        assert_eq!(&text(2, &[], "two")[..], b"two", "a new version is");
        assert_eq!(
            &text(2, &["op_b"], "three")[..],
            b"three",
            "so is a new re-run at the same version"
        );
        assert_eq!(bodies.bytes(), 5, "a replaced body no longer counts");
    }

    #[test]
    fn kept_bodies_are_bounded_in_bytes() {
        let bodies = RenderedBodies::default();
        let big = vec![b'x'; MAX_BODY_BYTES + 1];
        let mut renders = 0;
        for _ in 0..2 {
            bodies.get_or_render("op_big", 1, || {
                renders += 1;
                big.clone()
            });
        }
        assert_eq!(renders, 2, "a body over the limit is rendered each time");
        assert_eq!(bodies.bytes(), 0);
        let body = vec![b'y'; MAX_BODY_BYTES];
        for n in 0..(MAX_BODIES_BYTES / MAX_BODY_BYTES) * 2 {
            bodies.get_or_render(&format!("op_{n}"), 1, || body.clone());
            assert!(bodies.bytes() <= MAX_BODIES_BYTES, "{} bytes kept", bodies.bytes());
        }
    }
}
