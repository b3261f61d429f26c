//! Which operations changed in the batch the writer is committing.
//!
//! `event_insert` notes every change here (the writer thread is the only
//! caller); the writer forgets a job's notes when the job rolls back, and
//! publishes the rest after the batch's `COMMIT` succeeded — so subscribers
//! never hear of a change that is not durable.

use std::cell::RefCell;

use tokio::sync::broadcast;

use crate::{Change, Operation};

thread_local! {
    static PENDING: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(op: &Operation, event_type: &str) {
    let change = Change::of(op, event_type);
    PENDING.with(|p| p.borrow_mut().push(change));
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
    for change in changes {
        // No subscriber is not an error.
        let _ = sender.send(change);
    }
}
