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
    /// Bumped whenever work may have become claimable; every waiter wakes.
    work: watch::Sender<u64>,
    running: Mutex<HashMap<Id, Arc<StopFlags>>>,
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

    /// Subscribes to new work; subscribe before looking, so nothing is missed.
    pub fn watch_work(&self) -> WorkWatch {
        WorkWatch(self.inner.work.subscribe())
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
