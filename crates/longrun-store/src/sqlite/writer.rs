//! The single SQLite writer and its group commit.
//!
//! SQLite allows one writer at a time, and a durable commit costs an fsync.
//! Instead of every request fighting for the write lock and paying its own
//! fsync, requests send their write as a job to one thread. The thread takes
//! every job already waiting (up to a bound), runs them in one transaction
//! and commits them all with one `COMMIT`, one fsync; one job's failure rolls
//! back only that job. Replies are sent only after the commit succeeded:
//! nobody hears "done" before their write is durable.
//!
//! A savepoint per job would cost more than most jobs: SQLite copies every
//! page the job changes that the batch had already changed into the
//! savepoint's journal, and a batch of submissions changes the same few
//! pages again and again. Jobs rarely fail, and a job is a function of the
//! database alone, so it can run again. The jobs of a batch first run
//! together in the bare transaction, with no savepoint at all (one around
//! them all still copied every page they changed into its journal: 6 % of
//! the writer's time under single submissions); only if one fails is the
//! transaction rolled back, begun again, and every job run again in a
//! savepoint of its own.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::Connection;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::changes;
use crate::reads::ReadCache;
use crate::{Change, Result, StoreError};

/// One caller's write, run on the writer thread.
trait Job: Send {
    /// Runs the write against the writer connection inside a savepoint;
    /// `true` keeps its changes, `false` rolls them back. It may run again
    /// after its changes were rolled back; the last run's answer counts.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Replaces the answer with `err` (the job panicked, or its savepoint
    /// could not be released).
    fn spoil(&mut self, err: StoreError);
    /// Answers the caller once the batch's fate is known, with the commit's
    /// result.
    fn answer(self: Box<Self>, committed: Result<()>);
}

struct Write<T, F> {
    f: F,
    out: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
    span: tracing::Span,
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: Fn(&Connection) -> Result<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        // A panic leaves no answer behind: `answer` then reports it.
        self.out = None;
        // The job runs on the writer thread inside the caller's span, so
        // what it logs carries the caller's request and operation ids.
        let out = self.span.in_scope(|| (self.f)(conn));
        let keep = out.is_ok();
        self.out = Some(out);
        keep
    }

    fn spoil(&mut self, err: StoreError) {
        self.out = Some(Err(err));
    }

    fn answer(self: Box<Self>, committed: Result<()>) {
        let out = self
            .out
            .unwrap_or(Err(StoreError::Stopped("a store write that panicked")));
        let _ = self.reply.send(committed.and(out));
    }
}

#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

impl Writer {
    /// Starts the writer thread; it ends when every `Writer` clone is dropped.
    /// When `catch_up` is set (by the checkpointer), the thread checkpoints
    /// the WAL itself before its next batch (see [`catch_up`]).
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        changes: broadcast::Sender<Change>,
        reads: Arc<ReadCache>,
        catch_up: Arc<AtomicBool>,
    ) -> Self {
        let (jobs, rx) = mpsc::channel::<Box<dyn Job>>(max_batch * 4);
        std::thread::Builder::new()
            .name("longrun-sqlite-writer".into())
            .spawn(move || run(conn, rx, max_batch, &changes, &reads, &catch_up))
            .expect("failed to spawn the SQLite writer thread");
        Self { jobs }
    }

    /// Runs `f` in the next group commit and returns its result once durable.
    /// `f` may run more than once, each time after what the last run wrote
    /// was rolled back, so it must act on the database alone.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job = Box::new(Write {
            f,
            out: None,
            reply,
            span: tracing::Span::current(),
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
    mut rx: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    changes: &broadcast::Sender<Change>,
    reads: &ReadCache,
    wanted: &AtomicBool,
) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(max_batch);
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
        if wanted.swap(false, Ordering::AcqRel) {
            catch_up(&conn);
        }
        commit_batch(&conn, &mut batch, changes, reads);
    }
}

/// Copies into the database what the checkpointer left of the WAL, between
/// two transactions: with no write under way a PASSIVE checkpoint reaches
/// the end of the log (unless a reader still holds an older snapshot), and
/// the next commit then writes the log again from its start. It never
/// waits: if the checkpointer is mid-pass, it tries again next time.
fn catch_up(conn: &Connection) {
    let done = conn
        .prepare_cached("PRAGMA wal_checkpoint(PASSIVE)")
        .and_then(|mut s| s.query_row([], |r| Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))));
    match done {
        Ok((log, copied)) => tracing::trace!(log, copied, "the writer caught the WAL up"),
        Err(e) => tracing::warn!(error = %e, "the writer could not checkpoint the WAL; the next turn will try again"),
    }
}

/// What running the jobs of a batch came to.
enum Ran {
    /// Every job ran; its answer says whether its changes were kept.
    All,
    /// SQLite rolled the transaction back itself after the first `n` jobs
    /// ran: what they wrote is gone.
    RolledBack(usize),
}

/// Runs the jobs of `batch` in one transaction and answers them once it
/// commits. If SQLite rolls the transaction back itself mid-batch (it does on
/// a full disk or an I/O error), what ran is gone: those jobs are answered
/// `Unavailable`, and the jobs not yet run stay in `batch` for a new
/// transaction — never run outside one, where each statement would commit
/// on its own while its caller is told it failed.
fn commit_batch(
    conn: &Connection,
    batch: &mut Vec<Box<dyn Job>>,
    change_feed: &broadcast::Sender<Change>,
    reads: &ReadCache,
) {
    if !begin(conn, batch) {
        return;
    }
    let ran = match run_together(conn, batch) {
        Together::Ran(ran) => ran,
        Together::Failed => {
            // What they all wrote is rolled back with the transaction.
            changes::discard();
            if let Err(e) = control(conn, "ROLLBACK") {
                tracing::error!(error = %e, "could not roll back a failed batch");
            }
            if batch.len() == 1 {
                // The rollback undid the one job's writes: its answer stands.
                for job in batch.drain(..) {
                    job.answer(Ok(()));
                }
                return;
            }
            if !begin(conn, batch) {
                return;
            }
            run_each_alone(conn, batch)
        }
    };
    if let Ran::RolledBack(n) = ran {
        changes::discard();
        tracing::warn!(jobs = n, "the database rolled back a write transaction");
        let refused = Err(StoreError::Unavailable(
            "the database rolled the transaction back (full or failing storage)".into(),
        ));
        for job in batch.drain(..n) {
            job.answer(refused.clone());
        }
        return;
    }
    changes::committing(reads);
    let committed = control(conn, "COMMIT").map_err(StoreError::from);
    if committed.is_err() {
        let _ = control(conn, "ROLLBACK");
        changes::abandon(reads);
    } else {
        changes::publish(change_feed, reads);
    }
    for job in batch.drain(..) {
        job.answer(committed.clone());
    }
}

/// Begins the batch's write transaction; if it cannot, the batch is
/// dropped unrun (dropping a job drops its reply channel: the caller gets
/// an error and nothing was written) and `false` returned.
fn begin(conn: &Connection, batch: &mut Vec<Box<dyn Job>>) -> bool {
    match control(conn, "BEGIN IMMEDIATE") {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "could not begin a write transaction");
            batch.clear();
            false
        }
    }
}

/// Runs one of the writer's own control statements (savepoints,
/// transactions) from the statement cache: `execute_batch` would parse it
/// again every time (an eighth of the writer's time in a profile of batch
/// submissions).
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs a job, catching a panic: `None` if it panicked.
fn run_caught(conn: &Connection, job: &mut Box<dyn Job>) -> Option<bool> {
    std::panic::catch_unwind(AssertUnwindSafe(|| job.run(conn))).ok()
}

/// What running a batch's jobs together came to.
enum Together {
    Ran(Ran),
    /// A job failed or panicked: the transaction must be rolled back (with
    /// what every job wrote) and the jobs run again, each alone.
    Failed,
}

/// Runs every job of `batch` in the bare transaction, in order, until one
/// fails.
fn run_together(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Together {
    for (i, job) in batch.iter_mut().enumerate() {
        let kept = run_caught(conn, job);
        if conn.is_autocommit() {
            return Together::Ran(Ran::RolledBack(i + 1));
        }
        match kept {
            Some(true) => {}
            Some(false) => return Together::Failed,
            None => {
                tracing::error!("a store write panicked; it was rolled back");
                return Together::Failed;
            }
        }
    }
    Together::Ran(Ran::All)
}

/// Runs every job of `batch` in a savepoint of its own.
fn run_each_alone(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Ran {
    for (i, job) in batch.iter_mut().enumerate() {
        run_alone(conn, job);
        if conn.is_autocommit() {
            return Ran::RolledBack(i + 1);
        }
    }
    Ran::All
}

/// Runs one job inside a savepoint. A panicking job is rolled back and its
/// caller answered with an error instead of the writer thread dying.
fn run_alone(conn: &Connection, job: &mut Box<dyn Job>) {
    if let Err(e) = control(conn, "SAVEPOINT job") {
        tracing::error!(error = %e, "could not open a savepoint");
        job.spoil(StoreError::from(e));
        return;
    }
    let mark = changes::mark();
    match run_caught(conn, job) {
        Some(true) => {
            if let Err(e) = control(conn, "RELEASE job") {
                changes::rollback_to(mark);
                let _ = roll_back(conn, "job");
                job.spoil(StoreError::from(e));
            }
        }
        Some(false) => {
            let _ = roll_back(conn, "job");
            changes::rollback_to(mark);
        }
        None => {
            changes::rollback_to(mark);
            let _ = roll_back(conn, "job");
            tracing::error!("a store write panicked; it was rolled back");
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn writer() -> Writer {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)").unwrap();
        let (changes, _) = broadcast::channel(16);
        Writer::spawn(
            conn,
            64,
            changes,
            Arc::new(ReadCache::default()),
            Arc::new(AtomicBool::new(false)),
        )
    }

    /// Holds the writer inside a job until the returned sender is used (or
    /// dropped), so that the writes sent meanwhile form one batch.
    async fn hold(writer: &Writer) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<Result<()>>) {
        let (inside, wait_inside) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .write(move |_| {
                        let _ = inside.send(());
                        let _ = released.recv();
                        Ok(())
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || wait_inside.recv().unwrap())
            .await
            .unwrap();
        (release, held)
    }

    /// Waits until `n` jobs are queued behind the held one.
    async fn queued(writer: &Writer, n: usize) {
        while writer.jobs.max_capacity() - writer.jobs.capacity() < n {
            tokio::task::yield_now().await;
        }
    }

    fn insert(n: i64, runs: Arc<AtomicUsize>) -> impl Fn(&Connection) -> Result<i64> + Send + 'static {
        move |c| {
            runs.fetch_add(1, Ordering::SeqCst);
            c.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
            Ok(n)
        }
    }

    async fn stored(writer: &Writer) -> Vec<i64> {
        writer
            .write(|c| {
                let mut s = c.prepare("SELECT n FROM t ORDER BY n")?;
                let rows = s.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
                Ok(rows)
            })
            .await
            .unwrap()
    }

    /// A batch whose jobs all succeed runs each of them once, together in
    /// one transaction, and keeps what they all wrote.
    #[tokio::test]
    async fn a_batch_that_succeeds_runs_each_job_once() {
        let writer = writer();
        let (release, held) = hold(&writer).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let writes: Vec<_> = (1..=5)
            .map(|n| {
                tokio::spawn({
                    let (writer, runs) = (writer.clone(), runs.clone());
                    async move { writer.write(insert(n, runs)).await }
                })
            })
            .collect();
        queued(&writer, 5).await;
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for (n, write) in (1..=5).zip(writes) {
            assert_eq!(write.await.unwrap().unwrap(), n);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 5, "no job ran twice");
        assert_eq!(stored(&writer).await, vec![1, 2, 3, 4, 5]);
    }

    /// A job alone in its batch that fails after writing is answered with
    /// its error and leaves nothing (the rollback of the transaction undoes
    /// it); one that panics is answered with an error, and the writer goes
    /// on.
    #[tokio::test]
    async fn a_lone_failing_or_panicking_job_leaves_nothing() {
        let writer = writer();
        let runs = Arc::new(AtomicUsize::new(0));
        let failed = writer
            .write({
                let runs = runs.clone();
                move |c| {
                    insert(1, runs.clone())(c)?;
                    Err::<i64, _>(StoreError::NotFound)
                }
            })
            .await;
        assert!(matches!(failed, Err(StoreError::NotFound)), "{failed:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a lone job is not run again");
        let panicked = writer
            .write(move |c| {
                c.execute("INSERT INTO t (n) VALUES (2)", [])?;
                panic!("a job that panics after writing")
            })
            .await;
        assert!(matches!(panicked, Err::<(), _>(StoreError::Stopped(_))), "{panicked:?}");
        assert_eq!(writer.write(insert(3, runs)).await.unwrap(), 3);
        assert_eq!(stored(&writer).await, vec![3]);
    }

    /// In a batch where one job fails after writing and another panics
    /// after writing, those two are rolled back and answered with errors,
    /// and every other job's write is kept and answered once.
    #[tokio::test]
    async fn a_failing_or_panicking_job_rolls_back_only_itself() {
        let writer = writer();
        let (release, held) = hold(&writer).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let mut writes = Vec::new();
        for n in 1..=5_i64 {
            let (w, runs) = (writer.clone(), runs.clone());
            writes.push(tokio::spawn(async move {
                let writer = w;
                match n {
                    2 => {
                        writer
                            .write(move |c| {
                                insert(n, runs.clone())(c)?;
                                Err::<i64, _>(StoreError::NotFound)
                            })
                            .await
                    }
                    4 => {
                        writer
                            .write(move |c| {
                                insert(n, runs.clone())(c)?;
                                panic!("a job that panics after writing")
                            })
                            .await
                    }
                    _ => writer.write(insert(n, runs)).await,
                }
            }));
            // In this order in the batch.
            queued(&writer, n as usize).await;
        }
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        let answers: Vec<_> = futures_util::future::join_all(writes)
            .await
            .into_iter()
            .map(|r| r.unwrap().ok())
            .collect();
        assert_eq!(answers, vec![Some(1), None, Some(3), None, Some(5)]);
        assert_eq!(stored(&writer).await, vec![1, 3, 5]);
    }
}
