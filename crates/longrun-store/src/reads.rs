//! Operations as `operation_shared` last read them, so that a poll of an
//! operation that has not changed since is answered from memory instead of a
//! round trip to PostgreSQL (clients poll far more often than operations
//! change).
//!
//! Coherence, in three rules:
//!
//! - Every committed write evicts the operations it changed: on this node
//!   right after its commit, before its caller hears of it (so a client
//!   reads its own writes), and on every node when the write's NOTIFY
//!   arrives, before the change is published on the change feed (so a
//!   long-poll woken by a change reads it). Another node's write is seen
//!   here once its notification arrives: a read may trail it by that delay.
//! - A read that overlapped an eviction of its operation is not kept: it
//!   may have read the row before the write committed. Nor is one that
//!   ends while a write of its operation is committing (between
//!   [`ReadCache::writing`] and [`ReadCache::written`]): a read that began
//!   before that commit could otherwise be kept after another reader had
//!   already read the new version from the database, and that reader would
//!   then read the old one again from here.
//! - While the change listener is down, notifications are lost: nothing is
//!   served or kept until it listens again, and then everything read before
//!   is forgotten.
//!
//! Entries also age out after [`TTL`], and the whole cache is bounded in
//! entries and bytes.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Operation;

/// How long an entry is served at most, whatever the notifications say.
pub const TTL: Duration = Duration::from_secs(5);
/// The most operations kept.
const MAX_ENTRIES: usize = 8192;
/// The most bytes of stored JSON (input, result, progress, labels) kept.
const MAX_BYTES: usize = 32 << 20;
/// An operation with more stored JSON than this is not kept.
const MAX_ENTRY_BYTES: usize = 64 << 10;
/// How many recent evictions a read that overlapped them is checked
/// against; a read that overlapped more is not kept.
const RECENT_EVICTIONS: usize = 1024;

pub struct ReadCache {
    inner: Mutex<Inner>,
}

struct Inner {
    entries: HashMap<String, Entry>,
    bytes: usize,
    /// Evictions so far; `recent` holds the last ones, numbered.
    evictions: u64,
    recent: VecDeque<(u64, u64)>,
    /// Bumped whenever everything is forgotten.
    epoch: u64,
    /// Operations (by hash) with writes committing, and how many.
    writing: HashMap<u64, usize>,
    listening: bool,
}

/// An operation kept. Shared: a hit hands out the `Arc`, and a read that
/// needs its own copy makes it outside the lock, which is held for a map
/// lookup, not for a copy of up to [`MAX_ENTRY_BYTES`] of JSON that every
/// other poll of this node would wait behind.
struct Entry {
    op: Arc<Operation>,
    bytes: usize,
    at: Instant,
}

/// Taken before a read: what `keep` checks the read against.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    evictions: u64,
    epoch: u64,
}

fn hash_of(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl Default for ReadCache {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                bytes: 0,
                evictions: 0,
                recent: VecDeque::with_capacity(RECENT_EVICTIONS),
                epoch: 0,
                writing: HashMap::new(),
                listening: true,
            }),
        }
    }
}

impl ReadCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("read cache poisoned")
    }

    /// `operation_shared` of both backends (and so their `operation_get`):
    /// the kept operation `id` when it is `tenant`'s and fresh, shared, not
    /// copied; otherwise what `load` reads from the database (with the size
    /// of its stored JSON), kept unless the read may be stale.
    pub async fn read_through<E, Fut>(
        &self,
        tenant: &str,
        id: &str,
        load: impl FnOnce() -> Fut,
    ) -> std::result::Result<Option<Arc<Operation>>, E>
    where
        Fut: std::future::Future<Output = std::result::Result<Option<(Operation, usize)>, E>>,
    {
        let ticket = match self.get(tenant, id) {
            Ok(op) => return Ok(Some(op)),
            Err(ticket) => ticket,
        };
        Ok(load().await?.map(|(op, json_bytes)| {
            let op = Arc::new(op);
            self.keep(ticket, &op, json_bytes);
            op
        }))
    }

    /// The kept operation `id` when it is `tenant`'s and fresh; otherwise the
    /// ticket to read it from the database with.
    fn get(&self, tenant: &str, id: &str) -> Result<Arc<Operation>, Ticket> {
        let inner = self.lock();
        let kept = inner
            .entries
            .get(id)
            .filter(|e| inner.listening && e.op.tenant == tenant && e.at.elapsed() < TTL);
        match kept {
            Some(e) => Ok(e.op.clone()),
            None => Err(Ticket {
                evictions: inner.evictions,
                epoch: inner.epoch,
            }),
        }
    }

    #[cfg(test)]
    fn kept(&self, tenant: &str, id: &str) -> Option<Arc<Operation>> {
        self.get(tenant, id).ok()
    }

    #[cfg(test)]
    fn ticket(&self) -> Ticket {
        let inner = self.lock();
        Ticket {
            evictions: inner.evictions,
            epoch: inner.epoch,
        }
    }

    /// Keeps `op`, read after `ticket` was taken, unless its read may be
    /// stale or it is too large. `bytes`: the size of its stored JSON.
    fn keep(&self, ticket: Ticket, op: &Arc<Operation>, bytes: usize) {
        let mut inner = self.lock();
        if !inner.listening || inner.epoch != ticket.epoch || bytes > MAX_ENTRY_BYTES {
            return;
        }
        let hash = hash_of(op.id.as_str());
        if inner.writing.contains_key(&hash) {
            return;
        }
        if inner.evictions != ticket.evictions {
            let oldest_recent = inner.recent.front().map_or(inner.evictions, |(n, _)| *n);
            // Evictions since the read began that are no longer listed.
            if oldest_recent > ticket.evictions {
                return;
            }
            if inner.recent.iter().any(|(n, h)| *n >= ticket.evictions && *h == hash) {
                return;
            }
        }
        if inner.entries.len() >= MAX_ENTRIES || inner.bytes + bytes > MAX_BYTES {
            // Full: start again rather than track what to drop first.
            inner.forget_all();
            return;
        }
        let entry = Entry {
            op: op.clone(),
            bytes,
            at: Instant::now(),
        };
        let replaced = inner.entries.insert(op.id.as_str().to_owned(), entry);
        if let Some(old) = &replaced {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        drop(inner);
        // The entry it replaced is freed outside the lock.
        drop(replaced);
    }

    /// Forgets `ids`: each changed, or may have.
    pub fn evict<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            inner.evict(id);
        }
    }

    /// Writes of `ids` are about to commit: forgets them, and keeps no read
    /// of them until [`written`](Self::written) is told the same ids.
    pub fn writing<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            inner.evict(id);
            *inner.writing.entry(hash_of(id)).or_default() += 1;
        }
    }

    /// The commit that [`writing`](Self::writing) announced is over,
    /// whatever its outcome: forgets `ids` again (a read begun before now
    /// may have read the row before the commit), and reads that begin from
    /// now on may be kept.
    pub fn written<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            let hash = hash_of(id);
            if let Some(n) = inner.writing.get_mut(&hash) {
                *n -= 1;
                if *n == 0 {
                    inner.writing.remove(&hash);
                }
            }
            inner.evict(id);
        }
    }

    /// The change listener lost its connection: serve and keep nothing.
    pub fn suspend(&self) {
        let mut inner = self.lock();
        inner.listening = false;
        inner.forget_all();
    }

    /// The change listener listens again: keep what is read from now on.
    pub fn resume(&self) {
        let mut inner = self.lock();
        inner.forget_all();
        inner.listening = true;
    }
}

impl Inner {
    /// Forgets `id` and notes the eviction for reads that overlap it.
    fn evict(&mut self, id: &str) {
        if let Some(old) = self.entries.remove(id) {
            self.bytes -= old.bytes;
        }
        let n = self.evictions;
        if self.recent.len() == RECENT_EVICTIONS {
            self.recent.pop_front();
        }
        self.recent.push_back((n, hash_of(id)));
        self.evictions += 1;
    }

    fn forget_all(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longrun_core::{Id, IdKind, State, Timestamp};

    fn op(id: &str, tenant: &str, version: i64) -> Arc<Operation> {
        Arc::new(Operation {
            id: Id::from_trusted(id.to_owned()),
            tenant: tenant.to_owned(),
            kind: "k".into(),
            state: State::Queued,
            version,
            attempt: 0,
            input: None,
            callback_url: None,
            deadline_at: None,
            budget_max_cost: None,
            cost_units: 0.0,
            labels: Default::default(),
            progress: None,
            result: None,
            error: None,
            cancel: None,
            cancellable: true,
            created_at: Timestamp(0),
            started_at: None,
            completed_at: None,
            updated_at: Timestamp(0),
            expires_at: None,
            idempotency_key: None,
            artifact: None,
            artifacts: Default::default(),
            rerun_of: None,
            reruns: None,
            pause_requested_at: None,
            not_before: None,
            priority: crate::PRIORITY_DEFAULT,
        })
    }

    #[test]
    fn a_hit_shares_the_kept_operation_and_a_miss_keeps_what_it_read() {
        let cache = ReadCache::default();
        let read = op("x", "a", 1);
        let load = || async { Ok::<_, ()>(Some((Operation::clone(&read), 10))) };
        let missed = futures_util::FutureExt::now_or_never(cache.read_through("a", "x", load))
            .expect("nothing to wait for")
            .unwrap()
            .expect("read");
        async fn not_read() -> Result<Option<(Operation, usize)>, ()> {
            unreachable!("a hit does not read the database")
        }
        let hit = futures_util::FutureExt::now_or_never(cache.read_through("a", "x", not_read))
            .expect("nothing to wait for")
            .unwrap()
            .expect("kept");
        assert!(Arc::ptr_eq(&missed, &hit), "the kept Arc, not a copy");
        let again = cache.kept("a", "x").expect("kept");
        assert!(Arc::ptr_eq(&hit, &again));
    }

    #[test]
    fn a_kept_read_is_served_to_its_tenant_only() {
        let cache = ReadCache::default();
        let id = Id::generate(IdKind::Operation);
        let t = cache.ticket();
        cache.keep(t, &op(id.as_str(), "a", 1), 10);
        assert_eq!(cache.kept("a", id.as_str()).map(|o| o.version), Some(1));
        assert!(cache.kept("b", id.as_str()).is_none());
    }

    #[test]
    fn an_eviction_forgets_and_a_read_that_overlapped_it_is_not_kept() {
        let cache = ReadCache::default();
        cache.keep(cache.ticket(), &op("x", "a", 1), 10);
        // A read begins, a write commits and evicts, the read ends.
        let during = cache.ticket();
        cache.evict(["x"]);
        assert!(cache.kept("a", "x").is_none());
        cache.keep(during, &op("x", "a", 1), 10);
        assert!(
            cache.kept("a", "x").is_none(),
            "a read that overlapped an eviction is stale"
        );
        // Evictions of other operations do not stop a read being kept.
        let other = cache.ticket();
        cache.evict(["y", "z"]);
        cache.keep(other, &op("x", "a", 2), 10);
        assert_eq!(cache.kept("a", "x").map(|o| o.version), Some(2));
    }

    /// The interleaving `reads_racing_writes_never_go_back_a_version` once
    /// caught: one reader's read of version 1 began before the commit of
    /// version 2 and ended after it, but before that write's eviction;
    /// another reader had read version 2 from the database meanwhile, and
    /// then read version 1 from here.
    #[test]
    fn no_read_is_kept_while_a_write_of_its_operation_commits() {
        let cache = ReadCache::default();
        cache.writing(["x"]);
        // Begun after the write started committing, ended before it was over.
        let during = cache.ticket();
        cache.keep(during, &op("x", "a", 1), 10);
        assert!(cache.kept("a", "x").is_none(), "kept while a commit was in flight");
        // Other operations are kept meanwhile.
        cache.keep(cache.ticket(), &op("y", "a", 1), 10);
        assert_eq!(cache.kept("a", "y").map(|o| o.version), Some(1));
        cache.written(["x"]);
        cache.keep(during, &op("x", "a", 1), 10);
        assert!(cache.kept("a", "x").is_none(), "begun before the commit was over");
        cache.keep(cache.ticket(), &op("x", "a", 2), 10);
        assert_eq!(cache.kept("a", "x").map(|o| o.version), Some(2));
        // Two writes of one operation at once: kept only after both.
        cache.writing(["x"]);
        cache.writing(["x"]);
        cache.written(["x"]);
        cache.keep(cache.ticket(), &op("x", "a", 3), 10);
        assert!(cache.kept("a", "x").is_none());
        cache.written(["x"]);
        cache.keep(cache.ticket(), &op("x", "a", 4), 10);
        assert_eq!(cache.kept("a", "x").map(|o| o.version), Some(4));
    }

    #[test]
    fn a_read_that_overlapped_more_evictions_than_are_listed_is_not_kept() {
        let cache = ReadCache::default();
        let t = cache.ticket();
        let ids: Vec<String> = (0..=RECENT_EVICTIONS).map(|i| format!("o{i}")).collect();
        cache.evict(ids.iter().map(String::as_str));
        cache.keep(t, &op("x", "a", 1), 10);
        assert!(cache.kept("a", "x").is_none());
    }

    #[test]
    fn while_the_listener_is_down_nothing_is_served_or_kept() {
        let cache = ReadCache::default();
        cache.keep(cache.ticket(), &op("x", "a", 1), 10);
        let before = cache.ticket();
        cache.suspend();
        assert!(cache.kept("a", "x").is_none());
        cache.keep(cache.ticket(), &op("x", "a", 1), 10);
        assert!(cache.kept("a", "x").is_none());
        cache.resume();
        // A read that began before the listener came back may have missed a change.
        cache.keep(before, &op("x", "a", 1), 10);
        assert!(cache.kept("a", "x").is_none());
        cache.keep(cache.ticket(), &op("x", "a", 2), 10);
        assert_eq!(cache.kept("a", "x").map(|o| o.version), Some(2));
    }

    #[test]
    fn large_operations_are_not_kept_and_a_full_cache_starts_again() {
        let cache = ReadCache::default();
        cache.keep(cache.ticket(), &op("big", "a", 1), MAX_ENTRY_BYTES + 1);
        assert!(cache.kept("a", "big").is_none());
        for i in 0..MAX_ENTRIES {
            cache.keep(cache.ticket(), &op(&format!("o{i}"), "a", 1), 1);
        }
        assert!(cache.kept("a", "o0").is_some());
        cache.keep(cache.ticket(), &op("one-more", "a", 1), 1);
        assert!(cache.kept("a", "o0").is_none(), "full: forgotten");
        cache.keep(cache.ticket(), &op("one-more", "a", 1), 1);
        assert!(cache.kept("a", "one-more").is_some());
    }
}
