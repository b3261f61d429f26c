//! Which operations changed in the batch the writer is committing.
//!
//! `event_insert` notes every change here (the writer thread is the only
//! caller); the writer forgets a job's notes when the job rolls back, and
//! publishes the rest after the batch's `COMMIT` succeeded — so subscribers
//! never hear of a change that is not durable. The read cache forgets what
//! changed first, so whoever hears of a change reads it.

use std::cell::RefCell;

use tokio::sync::broadcast;

use crate::reads::ReadCache;
use crate::{Change, Operation};

/// A change (a new version of an operation), or an operation whose stored
/// representation changed without one (a re-run's source gains a re-run; a
/// removed operation is gone), which only the read cache needs to hear of.
enum Note {
    Change(Change),
    Touched(String),
}

thread_local! {
    static PENDING: RefCell<Vec<Note>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(op: &Operation, event_type: crate::plan::EventType) {
    let event_type = event_type.as_str();
    let change = Change::of(op, event_type);
    PENDING.with(|p| p.borrow_mut().push(Note::Change(change)));
    if let Some(other) = Change::also_alters(op, event_type) {
        touch(other.as_str());
    }
}

pub(crate) fn touch(id: &str) {
    PENDING.with(|p| p.borrow_mut().push(Note::Touched(id.to_owned())));
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

fn note_id(note: &Note) -> &str {
    match note {
        Note::Change(change) => change.operation_id.as_str(),
        Note::Touched(id) => id.as_str(),
    }
}

/// The batch is about to commit: the read cache keeps no read of what it
/// changed until [`publish`] (it committed) or [`abandon`] (it did not).
pub(crate) fn committing(reads: &ReadCache) {
    PENDING.with(|p| reads.writing(p.borrow().iter().map(note_id)));
}

/// The commit announced by [`committing`] failed: nothing is published.
pub(crate) fn abandon(reads: &ReadCache) {
    let notes = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    reads.written(notes.iter().map(note_id));
}

pub(crate) fn publish(sender: &broadcast::Sender<Change>, reads: &ReadCache) {
    let notes = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    reads.written(notes.iter().map(note_id));
    for note in notes {
        if let Note::Change(change) = note {
            // No subscriber is not an error.
            let _ = sender.send(change);
        }
    }
}
