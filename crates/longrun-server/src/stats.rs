//! What the console's overview charts: per minute of the last hour, how many
//! operations were accepted, succeeded, failed and cancelled, and how long
//! work waited to be picked up — per tenant, counted from the store's change
//! feed as it is published (every node hears every node's changes). Nothing
//! here reads the database, so the overview costs the same with a million
//! stored operations as with ten; the price is that a server counts from the
//! moment it started.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use longrun_core::{Clock, Timestamp};
use longrun_store::Change;
use tokio::sync::broadcast;

/// Minutes kept: the last hour.
pub const MINUTES: usize = 60;
const MINUTE_MS: i64 = 60_000;
/// Pickup delays are counted in buckets of powers of two milliseconds, up
/// to 2^(BUCKETS-1) ms (about 9 hours).
const BUCKETS: usize = 25;

/// The counts of one minute (of one tenant, or summed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub accepted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// First pickups by delay bucket (`2^i` ms at most).
    pickups: [u64; BUCKETS],
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.accepted += other.accepted;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        for (a, b) in self.pickups.iter_mut().zip(other.pickups.iter()) {
            *a += b;
        }
    }

    /// The pickup delay at quantile `q` (0–1), as the upper bound of its
    /// bucket in milliseconds; `None` when nothing was picked up.
    pub fn pickup_quantile_ms(&self, q: f64) -> Option<u64> {
        let total: u64 = self.pickups.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.pickups.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(1 << i);
            }
        }
        Some(1 << (BUCKETS - 1))
    }

    pub fn pickups(&self) -> u64 {
        self.pickups.iter().sum()
    }
}

fn bucket(delay_ms: i64) -> usize {
    let ms = u64::try_from(delay_ms.max(1)).unwrap_or(1);
    // The smallest i with ms <= 2^i.
    (u64::BITS - (ms - 1).leading_zeros()).min(BUCKETS as u32 - 1) as usize
}

struct Minute {
    /// Minutes since the epoch.
    index: i64,
    by_tenant: HashMap<String, Counts>,
}

pub struct ConsoleStats {
    minutes: Mutex<VecDeque<Minute>>,
    clock: Arc<dyn Clock>,
}

impl ConsoleStats {
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            minutes: Mutex::default(),
            clock,
        })
    }

    /// Counts the store's change feed until it closes.
    pub async fn follow(self: Arc<Self>, mut feed: broadcast::Receiver<Change>) {
        loop {
            match feed.recv().await {
                Ok(change) => self.record(&change),
                // Missed some: the chart is a little low for that minute.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Counts one change at the instant it happened.
    pub fn record(&self, change: &Change) {
        if change.is_resync() {
            return;
        }
        let (at, apply): (Timestamp, fn(&mut Counts, &Change)) = match change.event_type.as_str() {
            "created" => (change.created_at, |c, _| c.accepted += 1),
            "succeeded" => (change.completed_at.unwrap_or(change.created_at), |c, _| {
                c.succeeded += 1
            }),
            "failed" => (change.completed_at.unwrap_or(change.created_at), |c, _| c.failed += 1),
            "cancelled" => (change.completed_at.unwrap_or(change.created_at), |c, _| {
                c.cancelled += 1
            }),
            // The first pickup only: a retry's wait is the backoff's.
            "started" if change.attempt <= 1 => match change.started_at {
                Some(started) => (started, |c, ch| {
                    let delay = ch.started_at.map_or(0, |s| s.0 - ch.created_at.0);
                    c.pickups[bucket(delay)] += 1;
                }),
                None => return,
            },
            _ => return,
        };
        let index = at.0.div_euclid(MINUTE_MS);
        let now = self.clock.now().0.div_euclid(MINUTE_MS);
        if index <= now - MINUTES as i64 || index > now + 1 {
            return;
        }
        let mut minutes = self.minutes.lock().expect("stats poisoned");
        while minutes.front().is_some_and(|m| m.index <= now - MINUTES as i64) {
            minutes.pop_front();
        }
        // Changes arrive nearly in order: the minute is at the back, or near it.
        let position = minutes.iter().rposition(|m| m.index <= index);
        let slot = match position {
            Some(p) if minutes[p].index == index => p,
            Some(p) => {
                minutes.insert(
                    p + 1,
                    Minute {
                        index,
                        by_tenant: HashMap::new(),
                    },
                );
                p + 1
            }
            None => {
                minutes.push_front(Minute {
                    index,
                    by_tenant: HashMap::new(),
                });
                0
            }
        };
        apply(
            minutes[slot].by_tenant.entry(change.tenant.clone()).or_default(),
            change,
        );
    }

    /// The last hour, oldest minute first, each with the start of its
    /// minute: one tenant's counts, or every tenant's summed (`None`).
    pub fn last_hour(&self, tenant: Option<&str>) -> Vec<(Timestamp, Counts)> {
        let now = self.clock.now().0.div_euclid(MINUTE_MS);
        let minutes = self.minutes.lock().expect("stats poisoned");
        let first = now - MINUTES as i64 + 1;
        (first..=now)
            .map(|index| {
                let mut counts = Counts::default();
                if let Some(minute) = minutes.iter().find(|m| m.index == index) {
                    match tenant {
                        Some(t) => {
                            if let Some(c) = minute.by_tenant.get(t) {
                                counts.add(c);
                            }
                        }
                        None => minute.by_tenant.values().for_each(|c| counts.add(c)),
                    }
                }
                (Timestamp(index * MINUTE_MS), counts)
            })
            .collect()
    }

    /// The whole hour in one.
    pub fn hour_total(&self, tenant: Option<&str>) -> Counts {
        let mut total = Counts::default();
        for (_, c) in self.last_hour(tenant) {
            total.add(&c);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use longrun_core::{Id, IdKind, ManualClock, State};

    use super::*;

    fn change(tenant: &str, event: &str, created: i64, at: i64) -> Change {
        Change {
            operation_id: Id::generate(IdKind::Operation),
            tenant: tenant.into(),
            version: 1,
            event_type: event.into(),
            kind: "k".into(),
            state: State::Queued,
            attempt: 1,
            created_at: Timestamp(created),
            started_at: Some(Timestamp(at)),
            completed_at: Some(Timestamp(at)),
            cancel_requested_at: None,
            callback: false,
        }
    }

    #[test]
    fn counts_by_minute_and_tenant_and_forgets_past_the_hour() {
        let t0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE_MS;
        let clock = ManualClock::new(Timestamp(t0 + 30_000));
        let stats = ConsoleStats::new(Arc::new(clock.clone()));
        stats.record(&change("a", "created", t0, t0));
        stats.record(&change("a", "created", t0 + 1, t0));
        stats.record(&change("b", "created", t0, t0));
        stats.record(&change("a", "started", t0, t0 + 7));
        stats.record(&change("a", "succeeded", t0, t0 + 9));
        stats.record(&change("a", "progress", t0, t0 + 9));
        // Two hours old: not counted.
        stats.record(&change("a", "failed", t0 - 7_200_000, t0 - 7_200_000));

        let hour = stats.last_hour(Some("a"));
        assert_eq!(hour.len(), MINUTES);
        let (start, last) = hour.last().unwrap();
        assert_eq!(start.0, t0);
        assert_eq!((last.accepted, last.succeeded, last.failed), (2, 1, 0));
        assert_eq!(last.pickup_quantile_ms(0.5), Some(8), "7 ms is in the bucket up to 8");
        assert_eq!(stats.hour_total(None).accepted, 3);
        assert_eq!(stats.hour_total(Some("b")).accepted, 1);
        assert_eq!(stats.hour_total(Some("c")), Counts::default());

        // An hour on, all of it has slid out.
        clock.advance(std::time::Duration::from_secs(3600));
        stats.record(&change("a", "created", t0 + 3_600_000, t0));
        assert_eq!(stats.hour_total(Some("a")).accepted, 1);
        assert_eq!(stats.hour_total(None).succeeded, 0);
    }

    #[test]
    fn pickup_buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 1);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(1024), 10);
        assert_eq!(bucket(1025), 11);
        assert_eq!(bucket(i64::MAX), BUCKETS - 1);
    }
}
