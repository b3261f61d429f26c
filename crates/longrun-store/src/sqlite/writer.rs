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
use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::changes;
use crate::reads::ReadCache;
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
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        changes: broadcast::Sender<Change>,
        reads: Arc<ReadCache>,
    ) -> Self {
        let (jobs, rx) = mpsc::channel::<Job>(max_batch * 4);
        std::thread::Builder::new()
            .name("longrun-sqlite-writer".into())
            .spawn(move || run(conn, rx, max_batch, &changes, &reads))
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
        // The job runs on the writer thread inside the caller's span, so
        // what it logs carries the caller's request and operation ids.
        let span = tracing::Span::current();
        let job: Job = Box::new(move |conn| {
            let out = span.in_scope(|| f(conn));
            let keep = out.is_ok();
            let reply: Reply = Box::new(move |committed| {
                let _ = tx.send(committed.and(out));
            });
            (keep, reply)
        });
        self.jobs
            .send(job)
            .await
            .map_err(|_| StoreError::Stopped("the SQLite writer"))?;
        rx.await.map_err(|_| StoreError::Stopped("the SQLite writer"))?
    }
}

fn run(
    conn: Connection,
    mut rx: mpsc::Receiver<Job>,
    max_batch: usize,
    changes: &broadcast::Sender<Change>,
    reads: &ReadCache,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    loop {
        // Jobs a rolled-back batch did not reach are still here; otherwise wait.
        if batch.is_empty() {
            match rx.blocking_recv() {
                Some(first) => batch.push(first),
                None => return,
            }
        }
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&conn, &mut batch, changes, reads);
    }
}

/// Runs the jobs of `batch` in one transaction and answers them once it
/// commits. If SQLite rolls the transaction back itself mid-batch (it does on
/// a full disk or an I/O error), what ran is gone: those jobs are answered
/// `Unavailable`, and the jobs not yet run stay in `batch` for a new
/// transaction — never run outside one, where each statement would commit
/// on its own while its caller is told it failed.
fn commit_batch(conn: &Connection, batch: &mut Vec<Job>, change_feed: &broadcast::Sender<Change>, reads: &ReadCache) {
    if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
        // Dropping a job that never ran drops its reply channel: the caller
        // gets an error and nothing was written.
        tracing::error!(error = %e, "could not begin a write transaction");
        batch.clear();
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
    let mut jobs = std::mem::take(batch).into_iter();
    let mut rolled_back = false;
    for job in jobs.by_ref() {
        replies.push(run_job_isolated(conn, job));
        if conn.is_autocommit() {
            rolled_back = true;
            break;
        }
    }
    batch.extend(jobs);
    if rolled_back {
        changes::discard();
        tracing::warn!(jobs = replies.len(), "the database rolled back a write transaction");
        let refused = Err(StoreError::Unavailable(
            "the database rolled the transaction back (full or failing storage)".into(),
        ));
        for reply in replies {
            reply(refused.clone());
        }
        return;
    }
    let committed = control(conn, "COMMIT").map_err(StoreError::from);
    if committed.is_err() {
        let _ = control(conn, "ROLLBACK");
        changes::discard();
    } else {
        changes::publish(change_feed, reads);
    }
    for reply in replies {
        reply(committed.clone());
    }
}

/// Runs one of the writer's own control statements (savepoints,
/// transactions) from the statement cache: `execute_batch` would parse it
/// again every time (an eighth of the writer's time in a profile of batch
/// submissions).
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs one job inside a savepoint. A panicking job is rolled back and its
/// caller answered with an error instead of the writer thread dying.
fn run_job_isolated(conn: &Connection, job: Job) -> Reply {
    if let Err(e) = control(conn, "SAVEPOINT job") {
        tracing::error!(error = %e, "could not open a savepoint");
        return Box::new(|_| {});
    }
    let mark = changes::mark();
    match std::panic::catch_unwind(AssertUnwindSafe(|| job(conn))) {
        Ok((true, reply)) => match control(conn, "RELEASE job") {
            Ok(()) => reply,
            Err(e) => {
                changes::rollback_to(mark);
                let err = StoreError::from(e);
                Box::new(move |_| reply(Err(err)))
            }
        },
        Ok((false, reply)) => {
            let _ = roll_back(conn, "job");
            changes::rollback_to(mark);
            reply
        }
        Err(_) => {
            changes::rollback_to(mark);
            // The job's reply channel was dropped while unwinding: its caller
            // sees an error.
            let _ = roll_back(conn, "job");
            tracing::error!("a store write panicked; it was rolled back");
            Box::new(|_| {})
        }
    }
}

fn roll_back(conn: &Connection, savepoint: &str) -> rusqlite::Result<()> {
    control(conn, &format!("ROLLBACK TO {savepoint}"))?;
    control(conn, &format!("RELEASE {savepoint}"))
}

/// Runs the items of one job in order, answered item by item, as if each
/// were a job of its own but without a job's hand-off and reply each. An
/// item that fails rolls back only what it wrote (and the changes it
/// recorded); the others go on. `Err` only when a savepoint itself could not
/// be opened or closed; the whole job then fails.
///
/// A savepoint per item costs more than most items (a profile of batch
/// submissions: a third of the writer's time in opening, releasing and
/// journaling them), and items rarely fail. So the items first run under
/// one savepoint; only if one of them fails — and it may have written part
/// of itself first — is that rolled back and the job run again with a
/// savepoint per item.
pub(crate) fn each_isolated<P, T>(
    conn: &Connection,
    items: &[P],
    f: impl Fn(&Connection, &P) -> Result<T>,
) -> Result<Vec<Result<T>>> {
    control(conn, "SAVEPOINT items")?;
    let mark = changes::mark();
    let mut answers = Vec::with_capacity(items.len());
    for item in items {
        match f(conn, item) {
            Ok(answer) => answers.push(Ok(answer)),
            Err(_) => {
                changes::rollback_to(mark);
                roll_back(conn, "items")?;
                return each_in_its_savepoint(conn, items, f);
            }
        }
    }
    control(conn, "RELEASE items")?;
    Ok(answers)
}

/// Runs `f` in a savepoint of its own: its failure rolls back only what it
/// wrote (and the changes it recorded). The outer `Err` only when the
/// savepoint itself could not be opened or closed.
pub(crate) fn isolated<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<Result<T>> {
    control(conn, "SAVEPOINT item")?;
    let mark = changes::mark();
    let answer = f(conn);
    if answer.is_ok() {
        control(conn, "RELEASE item")?;
    } else {
        changes::rollback_to(mark);
        roll_back(conn, "item")?;
    }
    Ok(answer)
}

fn each_in_its_savepoint<P, T>(
    conn: &Connection,
    items: &[P],
    f: impl Fn(&Connection, &P) -> Result<T>,
) -> Result<Vec<Result<T>>> {
    items.iter().map(|item| isolated(conn, |c| f(c, item))).collect()
}
