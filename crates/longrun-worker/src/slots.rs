//! How many tasks a worker claims, holds and runs at once: the one place
//! the in-process dispatcher and remote workers decide it.
//!
//! `concurrency` handlers run at once. A claim may take the free slots and,
//! while the work is quick, tasks beyond them: one per handler that ran for
//! less than [`QUICK`] and ended within the last window, at most
//! [`AHEAD_PER_SLOT`] × `concurrency` more. Quick work frees slots faster
//! than a claim comes back, so those tasks wait for a slot less than the
//! next claim would take; while the work is slow nothing is claimed ahead,
//! and it stays queued for a worker with a free slot. A task claimed ahead
//! waits for its slot in claim order, keeping its lease
//! (`task::wait_for_slot`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::error::WorkerError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::task::{Handler, Report, TaskContext, Waited, run_handler, wait_for_slot};

/// A handler that ran for less than this is quick, and each quick one that
/// ended within the last such window lets a claim take one task beyond the
/// free slots.
pub const QUICK: Duration = Duration::from_millis(100);

/// Most tasks a claim takes beyond the free slots, as a multiple of the
/// concurrency. What a claim takes ahead is bounded first by the quick ends
/// of the last window (what the slots finish in about [`QUICK`]), so a task
/// claimed ahead waits about that long at most; this cap bounds how many a
/// worker that dies takes with it until their leases lapse.
///
/// No-op drains of 20 k jobs, 64 slots, same runs (`scripts/drain`):
/// claiming ahead up to 1× took PostgreSQL from 3.3 k to 3.75 k jobs/s and
/// SQLite from 5.4–5.9 k to 6.9–8.9 k; 3× took PostgreSQL from 5.1 k to
/// 6.3–6.5 k and SQLite from 8.8–10.1 k to 12.4–12.6 k. On 2026-12-04, with
/// claims and outcomes cheaper per batch, larger batches paid again on
/// PostgreSQL: 3× 9.5–11.4 k, 7× 12.1–13.0 k, 15× 11.8–13.3 k, 31×
/// 13.4–13.7 k jobs/s (SQLite 3× 22.0–22.8 k, 15× 23.6–23.7 k). 15× keeps
/// most of that gain at half of 31×'s tasks held.
pub const AHEAD_PER_SLOT: usize = 15;

/// Tasks a worker holds at once, as a multiple of its concurrency: those
/// claimed (running or waiting for a slot) and as many again whose outcomes
/// are being stored or sent.
pub const IN_FLIGHT_PER_SLOT: usize = 2 * (1 + AHEAD_PER_SLOT);

/// A worker's slots. Cheap to clone.
#[derive(Clone)]
pub struct Slots(Arc<Shared>);

struct Shared {
    concurrency: usize,
    /// Handlers running at once, handed out in claim order.
    running: Arc<Semaphore>,
    /// Tasks claimed whose handler has not returned.
    claimed: AtomicUsize,
    /// Tasks between claim and stored outcome.
    in_flight: Arc<Semaphore>,
    quick_ends: QuickEnds,
    /// Something was given back: a claimed count or an in-flight place.
    freed: Notify,
}

impl Slots {
    /// Slots for `concurrency` handlers running at once (at least one).
    pub fn new(concurrency: usize) -> Self {
        let concurrency = concurrency.max(1);
        Self(Arc::new(Shared {
            concurrency,
            running: Arc::new(Semaphore::new(concurrency)),
            claimed: AtomicUsize::new(0),
            in_flight: Arc::new(Semaphore::new(concurrency * IN_FLIGHT_PER_SLOT)),
            quick_ends: QuickEnds::default(),
            freed: Notify::new(),
        }))
    }

    /// Tasks running, waiting for a slot or reporting now.
    pub fn busy(&self) -> bool {
        self.0.in_flight.available_permits() < self.0.concurrency * IN_FLIGHT_PER_SLOT
    }

    /// Reserves what a claim may take now, at most `max`: the free slots
    /// and as many beyond them as quick handlers just ended (see the module
    /// docs). Taken at once: a claim made beside this one cannot take them
    /// too; what a claim does not fill goes back when dropped.
    pub fn reserve(&self, max: usize) -> Vec<Reserved> {
        let shared = &self.0;
        let ahead = shared.quick_ends.recent().min(AHEAD_PER_SLOT * shared.concurrency);
        let limit = shared.concurrency + ahead;
        // How many more a claim may take with `held` already claimed.
        let room = |held: usize| limit.min(held.saturating_add(max)).saturating_sub(held);
        let took = shared
            .claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (room(n) > 0).then(|| n + room(n))
            })
            .map_or(0, room);
        let mut reserved = Vec::with_capacity(took);
        while reserved.len() < took {
            let Ok(in_flight) = shared.in_flight.clone().try_acquire_owned() else {
                break;
            };
            reserved.push(Reserved {
                slots: self.clone(),
                count: Some(ClaimedCount(self.clone())),
                in_flight: Some(in_flight),
            });
        }
        // The counts that found no in-flight place go back, silently as
        // every unused count does (see `ClaimedCount`).
        shared.claimed.fetch_sub(took - reserved.len(), Ordering::AcqRel);
        reserved
    }

    /// Waits until [`Slots::reserve`] has something, and returns it.
    pub async fn reserve_some(&self, max: usize) -> Vec<Reserved> {
        loop {
            let freed = self.0.freed.notified();
            tokio::pin!(freed);
            // Listening before looking: nothing given back in between is missed.
            freed.as_mut().enable();
            let reserved = self.reserve(max);
            if !reserved.is_empty() {
                return reserved;
            }
            freed.await;
        }
    }

    #[cfg(test)]
    fn claimed(&self) -> usize {
        self.0.claimed.load(Ordering::Acquire)
    }

    #[cfg(test)]
    fn record(&self, ran: Duration) {
        self.0.quick_ends.record(ran);
    }

    #[cfg(test)]
    fn in_flight(&self) -> &Arc<Semaphore> {
        &self.0.in_flight
    }
}

/// One of [`Shared::claimed`], given back when dropped. Silently: a count
/// `reserve` could not use wakes no one (a worker waiting in
/// [`Slots::reserve_some`] would wake itself, and spin); a task's count
/// given back says so ([`Reserved::ended`]).
struct ClaimedCount(Slots);

impl Drop for ClaimedCount {
    fn drop(&mut self) {
        self.0.0.claimed.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one claimed task holds: its claimed count until its handler
/// returns, a slot while the handler runs, and its in-flight place until
/// it is dropped (once the outcome is stored or sent).
pub struct Reserved {
    slots: Slots,
    count: Option<ClaimedCount>,
    in_flight: Option<OwnedSemaphorePermit>,
}

impl Reserved {
    /// Runs `handler` once this task's slot is free (at once when one is),
    /// or ends the task without running it: a cancel or pause request's
    /// report, or its lease lost. Then its slot takes the next task and, if
    /// the handler was quick, the next claim may take one more ahead.
    pub async fn run(
        &mut self,
        handler: Arc<dyn Handler>,
        ctx: TaskContext,
        heartbeat_every: Duration,
    ) -> Result<Report, WorkerError> {
        let report = match wait_for_slot(&self.slots.0.running, &ctx, heartbeat_every).await {
            Waited::Slot(slot) => {
                let began = tokio::time::Instant::now();
                let report = run_handler(handler, ctx, heartbeat_every).await;
                drop(slot);
                self.ended(Some(began.elapsed()));
                return report;
            }
            Waited::Stopped(report) => Ok(report),
            Waited::LeaseLost => Err(WorkerError::LeaseLost),
        };
        self.ended(None);
        report
    }

    /// Its handler returned after running for `ran` (`None`: it never ran):
    /// the task no longer counts as claimed, and a claim may take another.
    fn ended(&mut self, ran: Option<Duration>) {
        if let Some(ran) = ran {
            self.slots.0.quick_ends.record(ran);
        }
        if self.count.take().is_some() {
            self.slots.0.freed.notify_waiters();
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // The count and the place go back before anyone hears they are free.
        self.count = None;
        self.in_flight = None;
        self.slots.0.freed.notify_waiters();
    }
}

/// Quick handlers (ran for less than [`QUICK`]) that ended in the current
/// window of [`QUICK`] and in the one before it.
#[derive(Default)]
struct QuickEnds(std::sync::Mutex<QuickWindow>);

struct QuickWindow {
    start: tokio::time::Instant,
    current: usize,
    previous: usize,
}

impl Default for QuickWindow {
    fn default() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            current: 0,
            previous: 0,
        }
    }
}

impl QuickWindow {
    fn roll(&mut self) {
        let since = self.start.elapsed();
        if since >= QUICK {
            self.previous = if since < 2 * QUICK { self.current } else { 0 };
            self.current = 0;
            self.start = tokio::time::Instant::now();
        }
    }
}

impl QuickEnds {
    /// A handler ended after running for `ran`.
    fn record(&self, ran: Duration) {
        if ran < QUICK {
            let mut window = self.0.lock().expect("the window's lock is never poisoned");
            window.roll();
            window.current += 1;
        }
    }

    /// Quick ends in the last window: the busier of the current and the one before.
    fn recent(&self) -> usize {
        let mut window = self.0.lock().expect("the window's lock is never poisoned");
        window.roll();
        window.current.max(window.previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_claim_takes_ahead_of_its_free_slots_only_as_many_as_quick_handlers_just_ended() {
        let slots = Slots::new(4);

        // No handler has ended: the free slots, and once they are claimed, nothing.
        let first = slots.reserve(usize::MAX);
        assert_eq!(first.len(), 4);
        assert!(slots.reserve(usize::MAX).is_empty());
        drop(first);
        let running = slots.reserve(usize::MAX);
        assert_eq!(running.len(), 4, "what a claim did not fill goes back");

        // Slow handlers ending earn nothing ahead.
        for _ in 0..10 {
            slots.record(QUICK);
        }
        assert!(slots.reserve(usize::MAX).is_empty());

        // Quick ones do, one task each, up to AHEAD_PER_SLOT × `concurrency` more.
        slots.record(Duration::from_millis(1));
        let ahead = slots.reserve(usize::MAX);
        assert_eq!(ahead.len(), 1);
        let cap = AHEAD_PER_SLOT * 4;
        for _ in 0..cap + 8 {
            slots.record(Duration::from_millis(1));
        }
        assert_eq!(slots.reserve(5).len(), 5, "no more than a claim asks for");
        let more = slots.reserve(usize::MAX);
        assert_eq!(
            more.len(),
            cap - 1,
            "at most AHEAD_PER_SLOT × `concurrency` beyond the slots"
        );
        assert!(slots.reserve(usize::MAX).is_empty());

        // Within the window after the ends, they still count; then not.
        drop((ahead, more));
        tokio::time::advance(QUICK).await;
        assert_eq!(slots.reserve(usize::MAX).len(), cap);
        tokio::time::advance(QUICK).await;
        assert!(
            slots.reserve(usize::MAX).is_empty(),
            "quick ends long past claim nothing ahead"
        );
        drop(running);
        assert_eq!(slots.claimed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_never_take_more_than_the_tasks_in_flight_allow() {
        let slots = Slots::new(1);
        for _ in 0..10 {
            slots.record(Duration::ZERO);
        }
        // Outcomes still being stored hold most of the in-flight places.
        let storing = slots
            .in_flight()
            .clone()
            .try_acquire_many_owned(u32::try_from(IN_FLIGHT_PER_SLOT - 1).unwrap())
            .unwrap();
        let reserved = slots.reserve(usize::MAX);
        assert_eq!(reserved.len(), 1);
        assert_eq!(slots.claimed(), 1, "the counts not reserved went back");
        drop((storing, reserved));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_waiting_for_an_in_flight_place_waits_without_spinning_and_wakes_when_one_is_free() {
        let slots = Slots::new(1);
        // Every in-flight place is held by an outcome being stored; nothing
        // is claimed, so a claim would be allowed but has nowhere to go.
        let mut storing = Vec::new();
        for _ in 0..IN_FLIGHT_PER_SLOT {
            let mut reserved = slots.reserve(1);
            reserved[0].ended(None);
            storing.extend(reserved);
        }
        assert_eq!(slots.claimed(), 0);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.reserve_some(100).await.len() }
        });
        // On this one thread, a waiter that woke itself would never give
        // the thread back, and this test would not get past the yields.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        assert_eq!(slots.claimed(), 0, "the count it could not use went back");
        // An outcome is stored: its place is free, and the waiter takes it.
        storing.pop();
        assert_eq!(waiting.await.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_waiting_to_claim_wakes_when_a_handler_returns() {
        let slots = Slots::new(1);
        let mut held = slots.reserve(1);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.reserve_some(100).await.len() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // The handler returns (slowly: nothing ahead); its outcome is still
        // in flight, and the slot is already claimable.
        let slot = slots.0.running.clone().try_acquire_owned().unwrap();
        tokio::time::advance(QUICK).await;
        drop(slot);
        held[0].ended(Some(QUICK));
        assert_eq!(waiting.await.unwrap(), 1);
        drop(held);
    }
}
