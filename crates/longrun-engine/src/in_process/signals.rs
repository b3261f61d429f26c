//! In-process wake-ups: new work for the dispatcher and for long-polling
//! remote claims, and cancel and pause requests for tasks running in this
//! process. They only shorten waits; the store stays the source of truth
//! (a missed signal is caught by the next poll or heartbeat).
//!
//! A unit of new work wakes one claimer of its kind, the one that has
//! waited longest: every other claimer woken for it would make a store
//! claim that finds nothing (a round trip, on SQLite a turn of its one
//! writer). Work that may be claimable without a unit to name (a lapsed
//! lease, changes this node missed) wakes every claimer.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use longrun_core::Id;
use tokio::sync::Notify;

use longrun_worker::task::StopFlags;

/// In-process wake-ups: new work for claimers, cancel and pause for running tasks. Cheap to clone.
#[derive(Clone, Default)]
pub struct Signals {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    waiting: Mutex<Waiting>,
    heard: Mutex<Heard>,
    running: Mutex<HashMap<Id, Arc<StopFlags>>>,
}

/// The units of work heard of lately, each an operation at a version: a
/// unit is heard twice on this node (from the request that made it, and
/// again from the change feed) and wakes a claimer once.
#[derive(Default)]
struct Heard {
    units: HashSet<(String, i64)>,
    order: VecDeque<(String, i64)>,
}

/// How many units [`Heard`] keeps: more than a change feed lags behind
/// the requests of one node. Past it, a unit heard again wakes a claimer
/// again (one claim that finds nothing).
const HEARD: usize = 4096;

impl Heard {
    /// Whether this is the first time `unit` is heard of (it is kept).
    fn first(&mut self, unit: (String, i64)) -> bool {
        if !self.units.insert(unit.clone()) {
            return false;
        }
        self.order.push_back(unit);
        if self.order.len() > HEARD
            && let Some(oldest) = self.order.pop_front()
        {
            self.units.remove(&oldest);
        }
        true
    }
}

/// The watches not woken yet, by when they were taken (oldest first).
#[derive(Default)]
struct Waiting {
    next: u64,
    watches: BTreeMap<u64, Waiter>,
}

struct Waiter {
    /// The kinds its claimer claims (`None`: every kind).
    kinds: Option<Arc<[String]>>,
    slot: Arc<Slot>,
}

impl Waiter {
    fn claims(&self, kind: &str) -> bool {
        self.kinds.as_ref().is_none_or(|kinds| kinds.iter().any(|k| k == kind))
    }
}

/// Where a watch is woken, and by what.
#[derive(Default)]
struct Slot {
    notify: Notify,
    /// Set under the waiting list's lock as the watch leaves it, so a
    /// watch that finds itself gone from the list finds why here.
    woken_by: Mutex<Option<Wake>>,
}

/// What woke a watch.
#[derive(Clone)]
enum Wake {
    /// Work of any kind: every watch was woken.
    Any,
    /// A unit of work of this kind: this watch alone was.
    Kind(String),
}

/// A subscription taken *before* looking for work, so that work arriving
/// between the look and the wait is never missed. It is woken once: by
/// work of any kind, or by a unit of work of one of its kinds that no
/// watch taken earlier was woken for.
pub struct WorkWatch {
    inner: Arc<Inner>,
    id: u64,
    slot: Arc<Slot>,
    /// Whether `changed` returned: its claimer looks again.
    heard: bool,
}

impl WorkWatch {
    /// Resolves once work of its kinds (or of any kind, unnamed) was
    /// signalled for it after this watch was taken; work of other kinds does
    /// not wake it.
    pub async fn changed(&mut self) {
        self.slot.notify.notified().await;
        self.heard = true;
    }
}

impl Drop for WorkWatch {
    /// A watch never woken leaves the list. One woken by a unit of work but
    /// dropped before its claimer heard (the claim ended another way: its
    /// look found work, its request went away, its fallback poll came
    /// first) hands that unit to the next watch of the kind, so the work is
    /// not left to a poll.
    fn drop(&mut self) {
        let mut waiting = self.inner.waiting.lock().expect("signals poisoned");
        if waiting.watches.remove(&self.id).is_some() || self.heard {
            return;
        }
        drop(waiting);
        let woken_by = self.slot.woken_by.lock().expect("signals poisoned").take();
        if let Some(Wake::Kind(kind)) = woken_by {
            Signals {
                inner: self.inner.clone(),
            }
            .work_available_of(&kind);
        }
    }
}

impl Signals {
    /// Something of any kind may be claimable without a unit of work to
    /// name (leases lapsed, changes this node missed): wake every claimer
    /// (in-process dispatcher and long-polling remote workers).
    pub fn work_available(&self) {
        let woken = {
            let mut waiting = self.inner.waiting.lock().expect("signals poisoned");
            let woken = std::mem::take(&mut waiting.watches);
            for waiter in woken.values() {
                *waiter.slot.woken_by.lock().expect("signals poisoned") = Some(Wake::Any);
            }
            woken
        };
        for waiter in woken.values() {
            // Kept as a permit when its claimer is not waiting yet.
            waiter.slot.notify.notify_one();
        }
    }

    /// A unit of work of `kind` may be claimable (a submission, a retry, a
    /// slot of a capped tenant): wake the claimer of that kind that has
    /// waited longest, and no other. With none waiting, nothing is owed: a
    /// claimer that starts waiting later looks first.
    pub fn work_available_of(&self, kind: &str) {
        let waiter = {
            let mut waiting = self.inner.waiting.lock().expect("signals poisoned");
            let Some(id) = waiting.watches.iter().find(|(_, w)| w.claims(kind)).map(|(id, _)| *id) else {
                return;
            };
            let waiter = waiting.watches.remove(&id).expect("found above");
            *waiter.slot.woken_by.lock().expect("signals poisoned") = Some(Wake::Kind(kind.to_owned()));
            waiter
        };
        waiter.slot.notify.notify_one();
    }

    /// Operation `operation_id` of `kind` became claimable at `version`
    /// (accepted, resumed, scheduled to retry): one unit of work, which
    /// wakes one claimer ([`work_available_of`](Self::work_available_of))
    /// the first time it is heard of, and nobody after.
    pub fn work_available_for(&self, kind: &str, operation_id: &str, version: i64) {
        if self.first_heard(operation_id, version) {
            self.work_available_of(kind);
        }
    }

    /// Operation `operation_id` at `version` was leased as it was made (a
    /// hand-off): when the change feed brings it, it wakes nobody. (Should
    /// the feed bring it first, it wakes one claimer, which finds nothing.)
    pub fn work_taken(&self, operation_id: &str, version: i64) {
        self.first_heard(operation_id, version);
    }

    /// Whether a claimer of `kind` waits (a watch not woken yet claims it):
    /// what a wake-up that costs something to decide on asks first.
    pub fn waiting_for(&self, kind: &str) -> bool {
        let waiting = self.inner.waiting.lock().expect("signals poisoned");
        waiting.watches.values().any(|w| w.claims(kind))
    }

    fn first_heard(&self, operation_id: &str, version: i64) -> bool {
        let mut heard = self.inner.heard.lock().expect("signals poisoned");
        heard.first((operation_id.to_owned(), version))
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
        let slot = Arc::new(Slot::default());
        let mut waiting = self.inner.waiting.lock().expect("signals poisoned");
        let id = waiting.next;
        waiting.next += 1;
        waiting.watches.insert(
            id,
            Waiter {
                kinds,
                slot: slot.clone(),
            },
        );
        WorkWatch {
            inner: self.inner.clone(),
            id,
            slot,
            heard: false,
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
    async fn a_unit_of_work_wakes_the_claimer_of_its_kind_that_waited_longest_and_no_other() {
        let signals = Signals::default();
        let mut first = signals.watch_work_of(kinds(&["export"]));
        let mut other_kind = signals.watch_work_of(kinds(&["import"]));
        let mut second = signals.watch_work_of(kinds(&["import", "export"]));
        signals.work_available_of("export");
        assert!(woken(&mut first).await, "the oldest export claimer was not woken");
        assert!(!woken(&mut second).await, "one unit of work woke two claimers");
        signals.work_available_of("export");
        assert!(woken(&mut second).await, "the next unit did not wake the next claimer");
        assert!(!woken(&mut other_kind).await);
        // With no claimer of the kind waiting, nothing is owed: a claimer
        // that watches later looks first.
        signals.work_available_of("export");
        let mut later = signals.watch_work_of(kinds(&["export"]));
        assert!(!woken(&mut later).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_its_claimer_did_not_hear_goes_to_the_next_claimer() {
        let signals = Signals::default();
        let first = signals.watch_work_of(kinds(&["export"]));
        let mut second = signals.watch_work_of(kinds(&["export"]));
        signals.work_available_of("export");
        // The first claim ended another way (its look found work, its
        // request went away) before it heard.
        drop(first);
        assert!(woken(&mut second).await, "the unit of work was lost with the watch");

        // Heard, the wake-up was the claimer's: nothing is handed on.
        let mut heard = signals.watch_work_of(kinds(&["export"]));
        let mut next = signals.watch_work_of(kinds(&["export"]));
        signals.work_available_of("export");
        assert!(woken(&mut heard).await);
        drop(heard);
        assert!(!woken(&mut next).await, "a heard wake-up was handed on");

        // Work of any kind woke everyone: nothing to hand on either.
        let everyone = signals.watch_work();
        signals.work_available();
        drop(everyone);
        assert!(woken(&mut next).await, "work of any kind did not wake it");
        let mut after = signals.watch_work_of(kinds(&["export"]));
        assert!(!woken(&mut after).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_unit_heard_twice_wakes_one_claimer_and_a_unit_taken_wakes_none() {
        let signals = Signals::default();
        let mut first = signals.watch_work_of(kinds(&["export"]));
        let mut second = signals.watch_work_of(kinds(&["export"]));
        // From the accepting request, then from the change feed.
        signals.work_available_for("export", "op_1", 1);
        signals.work_available_for("export", "op_1", 1);
        assert!(woken(&mut first).await);
        assert!(!woken(&mut second).await, "one unit woke two claimers");
        // The same operation made claimable again (a retry) is a new unit.
        signals.work_available_for("export", "op_1", 3);
        assert!(woken(&mut second).await);

        let mut third = signals.watch_work_of(kinds(&["export"]));
        signals.work_taken("op_2", 1);
        signals.work_available_for("export", "op_2", 1);
        assert!(!woken(&mut third).await, "work handed off woke a claimer");
    }

    #[tokio::test]
    async fn a_claimer_waits_for_its_kinds_until_it_is_woken() {
        let signals = Signals::default();
        assert!(!signals.waiting_for("a"));
        let watch = signals.watch_work_of(kinds(&["a", "b"]));
        assert!(signals.waiting_for("b") && !signals.waiting_for("c"));
        signals.work_available_of("a");
        assert!(!signals.waiting_for("b"), "woken, it waits no more");
        drop(watch);
        let _every = signals.watch_work();
        assert!(signals.waiting_for("c"), "a claimer of every kind");
    }

    #[test]
    fn units_heard_long_ago_are_forgotten() {
        let mut heard = Heard::default();
        assert!(heard.first(("op_0".into(), 1)));
        for n in 1..=HEARD {
            assert!(heard.first((format!("op_{n}"), 1)));
        }
        assert_eq!((heard.units.len(), heard.order.len()), (HEARD, HEARD));
        assert!(heard.first(("op_0".into(), 1)), "the oldest was not forgotten");
        assert!(!heard.first((format!("op_{HEARD}"), 1)));
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
