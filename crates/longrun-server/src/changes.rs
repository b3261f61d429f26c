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
                Ok(change) => {
                    if let Some(tx) = self.watchers.lock().expect("hub poisoned").get(&change.operation_id) {
                        tx.send_replace(change.version);
                    }
                }
                // Missed some: wake every waiter; each re-reads what it watches.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    for tx in self.watchers.lock().expect("hub poisoned").values() {
                        tx.send_modify(|_| {});
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
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
        let mut waiting = self.hub.waiting.lock().expect("hub poisoned");
        if let Some(count) = waiting.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.tenant);
            }
        }
    }
}
