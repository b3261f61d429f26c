//! Handlers for tests of the workers (feature `test-support`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use longrun_core::Id;
use longrun_core::validate::Invalid;
use serde_json::Value;

use crate::worker::{Handler, KindInfo, TaskContext, TaskError};

/// A quick handler of kind `kind` that counts its runs, by operation, and
/// the most running at once.
pub struct Counting {
    kind: String,
    running: AtomicUsize,
    most: AtomicUsize,
    runs: Mutex<HashMap<Id, u32>>,
}

impl Counting {
    /// A handler of `kind` that has run nothing yet.
    pub fn new(kind: &str) -> Self {
        Self {
            kind: kind.into(),
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// The most runs at once so far.
    pub fn most_at_once(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// How many times each operation ran.
    pub fn runs(&self) -> HashMap<Id, u32> {
        self.runs.lock().expect("runs lock").clone()
    }
}

#[async_trait]
impl Handler for Counting {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: self.kind.clone(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: false,
        }
    }

    fn validate(&self, _: &Value) -> Result<(), Invalid> {
        Ok(())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        *self
            .runs
            .lock()
            .expect("runs lock")
            .entry(ctx.operation_id().clone())
            .or_default() += 1;
        // Let the other tasks of the batch start beside this one, if they could.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(None)
    }
}
