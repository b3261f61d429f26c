//! The single SQLite writer and its group commit.
//!
//! SQLite allows one writer at a time, and a durable commit costs an fsync.
//! Instead of every request fighting for the write lock and paying its own
//! fsync, requests send their write as a job to one thread. The thread takes
//! every job already waiting (up to a bound), runs each inside its own
//! SAVEPOINT — so one job's failure rolls back only that job — and commits
//! them all with one `COMMIT`, one fsync. Replies are sent only after the
//! commit succeeded: nobody hears "done" before their write is durable.

use std::panic::AssertUnwindSafe;

use rusqlite::Connection;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::changes;
use crate::{Change, Result, StoreError};

/// Called once the batch's fate is known, with the commit's result.
type Reply = Box<dyn FnOnce(Result<()>) + Send>;
/// Runs against the writer connection inside a savepoint; `true` keeps its
/// changes, `false` rolls them back.
type Job = Box<dyn FnOnce(&Connection) -> (bool, Reply) + Send>;

#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread; it ends when every `Writer` clone is dropped.
    pub(crate) fn spawn(conn: Connection, max_batch: usize, changes: broadcast::Sender<Change>) -> Self {
        let (jobs, rx) = mpsc::channel::<Job>(max_batch * 4);
        std::thread::Builder::new()
            .name("longrun-sqlite-writer".into())
            .spawn(move || run(conn, rx, max_batch, changes))
            .expect("failed to spawn the SQLite writer thread");
        Self { jobs }
    }

    /// Runs `f` in the next group commit and returns its result once durable.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let out = f(conn);
            let keep = out.is_ok();
            let reply: Reply = Box::new(move |committed| {
                let _ = tx.send(committed.and(out));
            });
            (keep, reply)
        });
        self.jobs
            .send(job)
            .await
            .map_err(|_| StoreError::Backend("the SQLite writer has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Backend("the SQLite writer dropped a job".into()))?
    }
}

fn run(conn: Connection, mut rx: mpsc::Receiver<Job>, max_batch: usize, changes: broadcast::Sender<Change>) {
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&conn, &mut batch, &changes);
    }
}

fn commit_batch(conn: &Connection, batch: &mut Vec<Job>, change_feed: &broadcast::Sender<Change>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        // Dropping a job that never ran drops its reply channel: the caller
        // gets an error and nothing was written.
        tracing::error!(error = %e, "could not begin a write transaction");
        batch.clear();
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
    for job in batch.drain(..) {
        replies.push(run_job_isolated(conn, job));
    }
    let committed = conn.execute_batch("COMMIT").map_err(StoreError::from);
    if committed.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
        changes::discard();
    } else {
        changes::publish(change_feed);
    }
    for reply in replies {
        reply(committed.clone());
    }
}

/// Runs one job inside a savepoint. A panicking job is rolled back and its
/// caller answered with an error instead of the writer thread dying.
fn run_job_isolated(conn: &Connection, job: Job) -> Reply {
    if let Err(e) = conn.execute_batch("SAVEPOINT job") {
        tracing::error!(error = %e, "could not open a savepoint");
        return Box::new(|_| {});
    }
    let mark = changes::mark();
    match std::panic::catch_unwind(AssertUnwindSafe(|| job(conn))) {
        Ok((true, reply)) => match conn.execute_batch("RELEASE job") {
            Ok(()) => reply,
            Err(e) => {
                changes::rollback_to(mark);
                let err = StoreError::from(e);
                Box::new(move |_| reply(Err(err)))
            }
        },
        Ok((false, reply)) => {
            let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
            changes::rollback_to(mark);
            reply
        }
        Err(_) => {
            changes::rollback_to(mark);
            // The job's reply channel was dropped while unwinding: its caller
            // sees an error.
            let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
            tracing::error!("a store write panicked; it was rolled back");
            Box::new(|_| {})
        }
    }
}
