//! Waiting for an operation to change without re-reading the database in a
//! loop: the store publishes every committed change; this hub forwards each
//! to the requests waiting on that operation (long-polls, event streams,
//! `Prefer: wait` submissions). A bounded number of waiters per tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use longrun_core::Id;
use longrun_store::Change;
use tokio::sync::{broadcast, watch};

pub struct ChangeHub {
    watchers: Mutex<HashMap<Id, watch::Sender<i64>>>,
    waiting: Mutex<HashMap<String, usize>>,
    max_per_tenant: usize,
}

/// The tenant already has as many waiting requests as it may.
#[derive(Debug)]
pub struct TooManyWaiters;

impl ChangeHub {
    pub fn new(max_per_tenant: usize) -> Arc<Self> {
        Arc::new(Self {
            watchers: Mutex::default(),
            waiting: Mutex::default(),
            max_per_tenant,
        })
    }

    /// Forwards the store's change feed until it closes.
    pub async fn forward(self: Arc<Self>, mut feed: broadcast::Receiver<Change>) {
        loop {
            match feed.recv().await {
                // Missed some: wake every waiter; each re-reads what it watches.
                Ok(change) if change.is_resync() => self.wake_all(),
                Err(broadcast::error::RecvError::Lagged(_)) => self.wake_all(),
                Ok(change) => {
                    if let Some(tx) = self.watchers.lock().expect("hub poisoned").get(&change.operation_id) {
                        tx.send_replace(change.version);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn wake_all(&self) {
        for tx in self.watchers.lock().expect("hub poisoned").values() {
            tx.send_modify(|_| {});
        }
    }

    /// How many requests of `tenant` are waiting now.
    pub fn waiting(&self, tenant: &str) -> usize {
        self.waiting
            .lock()
            .expect("hub poisoned")
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }

    /// Starts watching `id` for `tenant`. Take the watch *before* reading the
    /// operation, so a change between the read and the wait is not missed.
    pub fn watch(self: &Arc<Self>, tenant: &str, id: &Id) -> Result<Waiter, TooManyWaiters> {
        {
            let mut waiting = self.waiting.lock().expect("hub poisoned");
            let count = waiting.entry(tenant.to_owned()).or_insert(0);
            if *count >= self.max_per_tenant {
                return Err(TooManyWaiters);
            }
            *count += 1;
        }
        metrics::gauge!("longrun_http_waiters").increment(1.0);
        let rx = self
            .watchers
            .lock()
            .expect("hub poisoned")
            .entry(id.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Ok(Waiter {
            rx: Some(rx),
            hub: self.clone(),
            tenant: tenant.to_owned(),
            id: id.clone(),
        })
    }
}

/// One waiting request. Dropping it frees its place.
pub struct Waiter {
    rx: Option<watch::Receiver<i64>>,
    hub: Arc<ChangeHub>,
    tenant: String,
    id: Id,
}

impl Waiter {
    /// Resolves at the next committed change of the operation.
    pub async fn changed(&mut self) {
        let rx = self.rx.as_mut().expect("a live waiter");
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut watchers = self.hub.watchers.lock().expect("hub poisoned");
        if watchers.get(&self.id).is_some_and(|tx| tx.receiver_count() == 0) {
            watchers.remove(&self.id);
        }
        drop(watchers);
        metrics::gauge!("longrun_http_waiters").decrement(1.0);
        let mut waiting = self.hub.waiting.lock().expect("hub poisoned");
        if let Some(count) = waiting.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use longrun_core::IdKind;

    use super::*;

    #[tokio::test]
    async fn a_resync_wakes_every_waiter_and_a_change_only_its_own() {
        let hub = ChangeHub::new(10);
        let (feed, rx) = broadcast::channel(16);
        tokio::spawn(hub.clone().forward(rx));
        let (a, b) = (Id::generate(IdKind::Operation), Id::generate(IdKind::Operation));
        let mut waiting_a = hub.watch("t1", &a).unwrap();
        let mut waiting_b = hub.watch("t1", &b).unwrap();

        let mut change = Change::resync();
        change.operation_id = a.clone();
        change.event_type = "progress".into();
        change.version = 2;
        feed.send(change).unwrap();
        waiting_a.changed().await;
        let b_woken = |w: &Waiter| w.rx.as_ref().unwrap().has_changed().unwrap();
        assert!(!b_woken(&waiting_b), "a change of `a` left `b` waiting");
        feed.send(Change::resync()).unwrap();
        // Both resolve: `a` for the resync after its change, `b` for the resync.
        waiting_a.changed().await;
        waiting_b.changed().await;
        assert_eq!(hub.waiting("t1"), 2);
    }
}
