//! Group commit on the job path: concurrent accepts and outcomes queue for
//! a writer task that commits them together, each writer on a connection of
//! its own while it works.

use super::*;

/// How one kind of write is group-committed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    /// The most items one transaction commits.
    pub(super) max_batch: usize,
    /// How many batches commit at once (each on its own connection).
    pub(super) writers: usize,
    /// A batch smaller than this commits alone: the other writers wait
    /// until it has, and the next batch gathers meanwhile. Small batches
    /// one after another cost the database less than the same items in
    /// more, smaller batches side by side; large ones gain from overlapping
    /// one's statements with another's WAL flush.
    pub(super) alone_below: usize,
}

/// Worker outcomes: applied set-based (`plan::finish::task_finish_many`).
pub(super) const FINISH: Batching = Batching {
    max_batch: 256,
    writers: 2,
    alone_below: 0,
};

/// Submissions: one statement per batch (see `operation_accept_run`).
/// Measured with the peers bench (32 single submitters; 4 submitters of
/// 100): 1 writer took the most singles and the fewest batches, 4 writers
/// the reverse; 2 writers with small batches committed alone took the most
/// of both.
pub(super) const ACCEPT: Batching = Batching {
    max_batch: 1024,
    writers: 2,
    alone_below: 64,
};

/// Applies a batch in one transaction and answers each item. An item may
/// refuse (an `Err` in its place) only before it wrote anything; an `Err`
/// for the whole batch (a database error) rolls it back.
pub(super) type Apply<P, R> = for<'c> fn(
    &'c mut PgConnection,
    &'c mut Changes,
    Policy,
    &'c [&'c P],
) -> futures_util::future::BoxFuture<'c, Result<Vec<Result<R>>>>;

/// Writes a batch on the writer's connection and answers each item once
/// what it wrote is durable (`commit_batch` with an [`Apply`], or the
/// submissions' own way); an `Err` for the whole batch means it wrote
/// nothing, and each item is then written alone, so only the bad one fails.
pub(super) type Run<P, R> = for<'c> fn(
    &'c Writer,
    &'c mut PgConnection,
    &'c [&'c P],
) -> futures_util::future::BoxFuture<'c, Result<Vec<Result<R>>>>;

/// What a group-commit writer writes with.
pub(super) struct Writer {
    /// Each writer's own connection is opened with these (the pool's).
    pub(super) connect: PgConnectOptions,
    pub(super) reads: Arc<ReadCache>,
    pub(super) policy: Policy,
}

impl Writer {
    /// A connection of a writer's own, outside the pool. Kept for as long as
    /// it works: the pool hands out its idle connections in turn, and each
    /// prepares and plans the writer's statements anew (0.8 ms a plan of the
    /// submission statement, 5 times before PostgreSQL settles on a generic
    /// one). Measured with 4 clients submitting 20 k in batches of 100 to a
    /// fresh server: 31.9 k/s on whichever pool connection was next,
    /// 33.9 k/s on the writers' own.
    pub(super) async fn connect(&self) -> Result<PgConnection> {
        match tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(&self.connect)).await {
            Ok(connected) => connected.map_err(db),
            Err(_) => Err(StoreError::Unavailable(
                "the database did not accept a connection in time".into(),
            )),
        }
    }
}

/// Writes waiting for the next batch: one caller's items, kept together
/// and in order in one transaction.
pub(super) struct Job<P, R> {
    pub(super) params: Vec<P>,
    pub(super) reply: oneshot::Sender<Vec<Result<R>>>,
}

/// Group commit, as the SQLite writer does it: whatever arrived while the
/// writers were busy goes into one transaction, so under load many writes
/// share one WAL flush and one NOTIFY, and alone one pays one as before.
/// Every caller is answered only after its batch committed.
pub(super) struct GroupCommit<P, R> {
    pub(super) queue: mpsc::Sender<Job<P, R>>,
}

impl<P: Send + Sync + 'static, R: Send + 'static> GroupCommit<P, R> {
    pub(super) fn spawn(writer: &Arc<Writer>, batching: Batching, run: Run<P, R>) -> Self {
        let (queue, rx) = mpsc::channel(4 * batching.max_batch);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..batching.writers {
            tokio::spawn(group_writer(writer.clone(), batching, run, rx.clone()));
        }
        Self { queue }
    }

    /// Runs `params` in the next batch; the answer comes once it is durable.
    pub(super) async fn write(&self, params: P) -> Result<R> {
        self.write_many(vec![params]).await.pop().expect("one answer per item")
    }

    /// Runs all of `params` in one transaction, in order (with other
    /// callers' writes); answered item by item once it is durable.
    pub(super) async fn write_many(&self, params: Vec<P>) -> Vec<Result<R>> {
        let n = params.len();
        if n == 0 {
            return Vec::new();
        }
        let failed = |why: &'static str| (0..n).map(|_| Err(StoreError::Stopped(why))).collect();
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Job { params, reply }).await.is_err() {
            return failed("the group commit has stopped");
        }
        answer
            .await
            .unwrap_or_else(|_| failed("the group commit dropped a write"))
    }
}

pub(super) async fn group_writer<P, R>(
    writer: Arc<Writer>,
    batching: Batching,
    run: Run<P, R>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Job<P, R>>>>,
) {
    let mut held: Option<PgConnection> = None;
    loop {
        let (batch, turn) = {
            let mut queue = queue.clone().lock_owned().await;
            let Some(first) = queue.recv().await else { return };
            let mut items = first.params.len();
            let mut batch = vec![first];
            while items < batching.max_batch {
                match queue.try_recv() {
                    Ok(next) => {
                        items += next.params.len();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            // The queue stays held (no other writer starts) while a small
            // batch commits.
            (batch, (items < batching.alone_below).then_some(queue))
        };
        let params: Vec<&P> = batch.iter().flat_map(|job| &job.params).collect();
        let answers = match held.take() {
            Some(c) => Ok(c),
            None => writer.connect().await,
        };
        let answers = match answers {
            Ok(mut c) => {
                let answers = alone_on_error(&writer, &mut c, run, &params).await;
                // A connection that failed may be broken: the next batch
                // takes another.
                if !answers.iter().any(|a| matches!(a, Err(StoreError::Unavailable(_)))) {
                    held = Some(c);
                }
                answers
            }
            Err(e) => params.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut results = answers.into_iter();
        drop(turn);
        for job in batch {
            let answers = results.by_ref().take(job.params.len()).collect();
            let _ = job.reply.send(answers);
        }
    }
}

/// `run` over `batch`; when the batch as a whole fails (one bad item aborts
/// its transaction), each item goes again on its own, so only the bad one
/// fails. Not when the database was unavailable: that is no item's fault,
/// and on the writer's one connection each item would only fail again.
pub(super) async fn alone_on_error<P, R>(
    writer: &Writer,
    c: &mut PgConnection,
    run: Run<P, R>,
    batch: &[&P],
) -> Vec<Result<R>> {
    match run(writer, c, batch).await {
        Ok(results) => results,
        Err(e) if batch.len() > 1 && !matches!(e, StoreError::Unavailable(_)) => {
            let mut results = Vec::with_capacity(batch.len());
            for p in batch {
                results.push(match run(writer, c, std::slice::from_ref(p)).await {
                    Ok(mut one) => one.pop().expect("one result per item"),
                    Err(e) => Err(e),
                });
            }
            results
        }
        Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
    }
}

/// One transaction over `batch`; `Err` when the transaction itself failed.
pub(super) async fn commit_batch<P, R>(
    writer: &Writer,
    c: &mut PgConnection,
    apply: Apply<P, R>,
    batch: &[&P],
) -> Result<Vec<Result<R>>> {
    let mut tx = sqlx::Connection::begin(c).await.map_err(db)?;
    let mut changes = Changes::default();
    let results = apply(&mut tx, &mut changes, writer.policy, batch).await?;
    commit(tx, &mut changes, &writer.reads).await?;
    Ok(results)
}

/// Commits a transaction that made `changes`. They are announced with
/// `pg_notify` inside it, so every node (this one included) hears of them
/// exactly when — and only if — they commit; and this node's read cache
/// forgets them before the caller is answered (even when the commit's
/// outcome is unknown), so the caller reads its own write.
pub(super) async fn commit(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    changes: &mut Changes,
    reads: &ReadCache,
) -> Result<()> {
    announce(&mut tx, changes).await?;
    reads.writing(changes.ids());
    let committed = tx.commit().await.map_err(db);
    reads.written(changes.ids());
    committed
}
