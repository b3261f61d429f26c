//! In-process wake-ups: new work for the dispatcher, and cancellation requests
//! for tasks running in this process. They only shorten waits; the store
//! stays the source of truth (a missed signal is caught by the next poll or
//! heartbeat).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use longrun_core::Id;
use tokio::sync::watch;

#[derive(Clone)]
pub struct Signals {
    inner: Arc<Inner>,
}

struct Inner {
    /// Bumped whenever work may have become claimable; every waiter wakes.
    work: watch::Sender<u64>,
    running: Mutex<HashMap<Id, Arc<watch::Sender<bool>>>>,
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                work: watch::channel(0).0,
                running: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// A subscription taken *before* looking for work, so that work arriving
/// between the look and the wait is never missed.
pub struct WorkWatch(watch::Receiver<u64>);

impl WorkWatch {
    /// Resolves once work was signalled after this watch was taken.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Signals {
    /// Something may be claimable: wake every claimer (in-process dispatcher
    /// and long-polling remote workers).
    pub fn work_available(&self) {
        self.inner.work.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn watch_work(&self) -> WorkWatch {
        WorkWatch(self.inner.work.subscribe())
    }

    /// Registers a task running here; its flag turns `true` on cancel.
    pub fn track(&self, id: &Id) -> Arc<watch::Sender<bool>> {
        let flag = Arc::new(watch::channel(false).0);
        self.inner
            .running
            .lock()
            .expect("signals poisoned")
            .insert(id.clone(), flag.clone());
        flag
    }

    pub fn untrack(&self, id: &Id) {
        self.inner.running.lock().expect("signals poisoned").remove(id);
    }

    /// Tells a task running in this process that cancellation was requested.
    pub fn cancel_requested(&self, id: &Id) {
        if let Some(tx) = self.inner.running.lock().expect("signals poisoned").get(id) {
            tx.send_replace(true);
        }
    }
}
