//! In-process wake-ups: new work for the dispatcher, and cancellation requests
//! for tasks running in this process. They only shorten waits; the store
//! stays the source of truth (a missed signal is caught by the next poll or
//! heartbeat).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use longrun_core::Id;
use tokio::sync::{Notify, watch};

#[derive(Clone, Default)]
pub struct Signals {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    work: Notify,
    running: Mutex<HashMap<Id, Arc<watch::Sender<bool>>>>,
}

impl Signals {
    /// Something was queued: wake a dispatcher.
    pub fn work_available(&self) {
        self.inner.work.notify_one();
    }

    pub async fn wait_for_work(&self) {
        self.inner.work.notified().await;
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
