//! In-process wake-ups: new work for the dispatcher, and cancel and pause requests
//! for tasks running in this process. They only shorten waits; the store
//! stays the source of truth (a missed signal is caught by the next poll or
//! heartbeat).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use longrun_core::Id;
use tokio::sync::watch;

use longrun_worker::task::StopFlags;

/// In-process wake-ups: new work for claimers, cancel and pause for running tasks. Cheap to clone.
#[derive(Clone)]
pub struct Signals {
    inner: Arc<Inner>,
}

struct Inner {
    /// Bumped whenever work may have become claimable; every waiter looks
    /// at `moved` to see whether it was work it claims.
    work: watch::Sender<u64>,
    moved: Mutex<Moved>,
    running: Mutex<HashMap<Id, Arc<StopFlags>>>,
}

/// Signals of new work so far: of any kind, and of each kind named.
#[derive(Default)]
struct Moved {
    any: u64,
    of_kind: HashMap<String, u64>,
}

impl Moved {
    /// The signals a claimer of `kinds` (every kind when `None`) has had.
    /// Every count only grows, so their sum moves exactly when one of them
    /// does.
    fn seen(&self, kinds: Option<&[String]>) -> u64 {
        self.any
            + match kinds {
                None => self.of_kind.values().sum::<u64>(),
                Some(kinds) => kinds.iter().filter_map(|k| self.of_kind.get(k)).sum(),
            }
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                work: watch::channel(0).0,
                moved: Mutex::new(Moved::default()),
                running: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// A subscription taken *before* looking for work, so that work arriving
/// between the look and the wait is never missed.
pub struct WorkWatch {
    rx: watch::Receiver<u64>,
    inner: Arc<Inner>,
    /// The kinds its claimer claims (`None`: every kind).
    kinds: Option<Arc<[String]>>,
    seen: u64,
}

impl WorkWatch {
    /// Resolves once work of its kinds (or of any kind, unnamed) was
    /// signalled after this watch was taken; work of other kinds does not
    /// wake it.
    pub async fn changed(&mut self) {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let now = self
                .inner
                .moved
                .lock()
                .expect("signals poisoned")
                .seen(self.kinds.as_deref());
            if now != self.seen {
                return;
            }
        }
    }
}

impl Signals {
    /// Something of any kind may be claimable: wake every claimer
    /// (in-process dispatcher and long-polling remote workers).
    pub fn work_available(&self) {
        self.inner.moved.lock().expect("signals poisoned").any += 1;
        self.inner.work.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Work of `kind` may be claimable (a submission, a retry): wake the
    /// claimers of that kind. The others stay asleep: a claim that cannot
    /// find its kinds' work is a store round trip (and on SQLite a turn of
    /// its one writer) spent for nothing.
    pub fn work_available_of(&self, kind: &str) {
        {
            let mut moved = self.inner.moved.lock().expect("signals poisoned");
            match moved.of_kind.get_mut(kind) {
                Some(n) => *n += 1,
                None => {
                    moved.of_kind.insert(kind.to_owned(), 1);
                }
            }
        }
        self.inner.work.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Subscribes to new work of every kind; subscribe before looking, so
    /// nothing is missed.
    pub fn watch_work(&self) -> WorkWatch {
        self.watch(None)
    }

    /// Subscribes to new work of `kinds` (and to work of any kind).
    pub fn watch_work_of(&self, kinds: Arc<[String]>) -> WorkWatch {
        self.watch(Some(kinds))
    }

    fn watch(&self, kinds: Option<Arc<[String]>>) -> WorkWatch {
        // Subscribed first: a signal after this is seen by `rx`, and one
        // before the count below is in it (so it is no news).
        let rx = self.inner.work.subscribe();
        let seen = self
            .inner
            .moved
            .lock()
            .expect("signals poisoned")
            .seen(kinds.as_deref());
        WorkWatch {
            rx,
            inner: self.inner.clone(),
            kinds,
            seen,
        }
    }

    /// Registers a task running here; its flags turn `true` on a cancel or
    /// pause request.
    pub fn track(&self, id: &Id) -> Arc<StopFlags> {
        let flag = Arc::new(StopFlags::default());
        self.inner
            .running
            .lock()
            .expect("signals poisoned")
            .insert(id.clone(), flag.clone());
        flag
    }

    /// Forgets a task that stopped running here.
    pub fn untrack(&self, id: &Id) {
        self.inner.running.lock().expect("signals poisoned").remove(id);
    }

    /// Tells a task running in this process that cancellation was requested.
    pub fn cancel_requested(&self, id: &Id) {
        if let Some(flags) = self.inner.running.lock().expect("signals poisoned").get(id) {
            flags.cancel.send_replace(true);
        }
    }

    /// Tells a task running in this process that a pause was requested.
    pub fn pause_requested(&self, id: &Id) {
        if let Some(flags) = self.inner.running.lock().expect("signals poisoned").get(id) {
            flags.pause.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn kinds(names: &[&str]) -> Arc<[String]> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// Whether `watch` is woken within a (paused, so instant) minute.
    async fn woken(watch: &mut WorkWatch) -> bool {
        tokio::time::timeout(Duration::from_secs(60), watch.changed())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn work_of_other_kinds_does_not_wake_a_claimer() {
        let signals = Signals::default();
        let mut export = signals.watch_work_of(kinds(&["export", "import"]));
        signals.work_available_of("noop");
        assert!(!woken(&mut export).await, "noop work woke an export claimer");
        signals.work_available_of("import");
        assert!(woken(&mut export).await, "import work did not wake it");
    }

    #[tokio::test(start_paused = true)]
    async fn work_of_any_kind_wakes_every_claimer() {
        let signals = Signals::default();
        let mut export = signals.watch_work_of(kinds(&["export"]));
        let mut every = signals.watch_work();
        signals.work_available();
        assert!(woken(&mut export).await);
        assert!(woken(&mut every).await);
        let mut every = signals.watch_work();
        signals.work_available_of("noop");
        assert!(woken(&mut every).await, "an unfiltered watch hears every kind");
    }

    #[tokio::test(start_paused = true)]
    async fn work_signalled_before_the_watch_is_not_news_and_after_it_is() {
        let signals = Signals::default();
        signals.work_available_of("export");
        let mut watch = signals.watch_work_of(kinds(&["export"]));
        // The claimer looks after subscribing: what came before, it finds.
        assert!(!woken(&mut watch).await, "a signal from before the watch woke it");
        signals.work_available_of("export");
        assert!(woken(&mut watch).await, "a signal after the watch did not");
    }
}
