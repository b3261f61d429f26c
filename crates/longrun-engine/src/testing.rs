//! For tests of the workers (feature `test-support`): a counting handler,
//! and a SQLite store with queued work for a dispatcher to drain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use longrun_core::validate::Invalid;
use longrun_core::{Clock, Id, State, SystemClock};
use longrun_store::conformance::accept_params;
use longrun_store::{AcceptOutcome, SqliteConfig, SqliteStore, Store};
use serde_json::Value;

use crate::bytes::artifacts::FileArtifacts;
use crate::in_process::dispatcher::{self, Dispatcher};
use crate::{Registry, Signals};
use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};

/// What a test kind `name` declares: safe to re-run, three attempts, not pausable.
pub fn kind(name: &str) -> KindInfo {
    KindInfo {
        name: name.into(),
        rerun_safe: true,
        max_attempts: 3,
        pausable: false,
    }
}

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
        kind(&self.kind)
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

/// A SQLite store in `dir` that knows `registry`'s kinds.
pub async fn sqlite_store(dir: &std::path::Path, registry: &Registry) -> Arc<dyn Store> {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(SqliteConfig::new(dir.join("longrun.db"))).expect("a SQLite store"));
    for spec in crate::kinds::specs(registry) {
        store.kind_upsert(spec).await.expect("the kinds are stored");
    }
    store
}

/// Queues `n` operations of `kind` with `input` for the tenant `t1`; their
/// ids, in the order queued.
pub async fn queue(store: &dyn Store, kind: &str, input: Value, n: usize) -> Vec<Id> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let mut params = accept_params("t1", kind, None, input.clone());
        params.now = SystemClock.now();
        let AcceptOutcome::Created(op) = store.operation_accept(params).await.expect("accepted") else {
            panic!("a new operation");
        };
        ids.push(op.id);
    }
    ids
}

/// An in-process dispatcher of `registry`'s kinds over `store`, its
/// artifacts in `dir`, on the system clock.
pub fn new_dispatcher(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    registry: Registry,
    signals: Signals,
    config: dispatcher::Config,
) -> Dispatcher {
    Dispatcher::new(
        store,
        Arc::new(FileArtifacts::new(dir.join("artifacts"))),
        registry,
        signals,
        Arc::new(SystemClock),
        config,
    )
}

/// Waits (up to a minute, yielding between reads) until the `t1` operation
/// `id` is `state`.
pub async fn until_state(store: &dyn Store, id: &Id, state: State) {
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while store
            .operation_get("t1", id)
            .await
            .expect("read")
            .expect("stored")
            .state
            != state
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{id} did not become {state:?}"));
}
