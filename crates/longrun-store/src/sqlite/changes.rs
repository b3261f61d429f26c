//! Which operations changed in the batch the writer is committing.
//!
//! `event_insert` notes every change here (the writer thread is the only
//! caller); the writer forgets a job's notes when the job rolls back, and
//! publishes the rest after the batch's `COMMIT` succeeded — so subscribers
//! never hear of a change that is not durable.

use std::cell::RefCell;

use longrun_core::Id;
use tokio::sync::broadcast;

use crate::Change;

thread_local! {
    static PENDING: RefCell<Vec<(String, i64)>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(operation_id: &str, version: i64) {
    PENDING.with(|p| p.borrow_mut().push((operation_id.to_owned(), version)));
}

/// A mark to roll back to if the current job fails.
pub(crate) fn mark() -> usize {
    PENDING.with(|p| p.borrow().len())
}

pub(crate) fn rollback_to(mark: usize) {
    PENDING.with(|p| p.borrow_mut().truncate(mark));
}

pub(crate) fn discard() {
    PENDING.with(|p| p.borrow_mut().clear());
}

pub(crate) fn publish(sender: &broadcast::Sender<Change>) {
    let changes = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    for (id, version) in changes {
        // No subscriber is not an error.
        let _ = sender.send(Change {
            operation_id: Id::from_trusted(id),
            version,
        });
    }
}
