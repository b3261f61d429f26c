//! The PostgreSQL backend: many `longrun serve` processes on one database.
//!
//! Every call is one transaction on a pooled connection; concurrent writers
//! are ordinary PostgreSQL transactions, so no writer thread is needed. Rows
//! other nodes may work on at the same moment are taken with
//! `FOR UPDATE SKIP LOCKED` (claims, the reaper, the enforcer, webhook
//! delivery, retention), so each piece of work is done once. The same schema
//! invariants as SQLite live in `postgres/schema.sql` (a trigger refuses
//! illegal transitions). The SQL mirrors `sqlite/sql.rs` function by function.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::lease::retry_backoff;
use longrun_core::{Id, IdKind, State, Timestamp};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection as _, PgConnection, PgPool, Row};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::shared::*;
use crate::*;

use crate::reads::ReadCache;

/// What a transaction changed, announced when it commits: its changes (a
/// new version of an operation each), and the operations whose stored
/// representation changed without one (a re-run's source gains a re-run; a
/// removed operation is gone), which only read caches need to hear of.
#[derive(Default)]
struct Changes {
    list: Vec<Change>,
    touched: Vec<String>,
    /// How many of `list` and of `touched` were already queued for the
    /// listeners (by a statement that also wrote, see `events_insert`).
    announced: (usize, usize),
}

impl Changes {
    /// The change `op` went through, as its event `event_type` records it.
    fn record(&mut self, op: &Operation, event_type: &str) {
        self.list.push(change_of(op, event_type));
        if let Some(other) = Change::also_alters(op, event_type) {
            self.touch(other.as_str());
        }
    }

    fn touch(&mut self, id: &str) {
        self.touched.push(id.to_owned());
    }

    /// The NOTIFY payloads of what was not announced yet, [`CHANGES_PER_PAYLOAD`]
    /// changes each; from now on they count as announced. What was touched
    /// comes first: a listener forgets it before it publishes a change that
    /// may send someone to read it (a re-run's `created`).
    fn unannounced_payloads(&mut self) -> Vec<String> {
        let (changes, touched) = self.announced;
        let touched = self.touched[touched..].iter().map(|id| WireItem::touched(id));
        let items: Vec<WireItem> = touched
            .chain(self.list[changes..].iter().map(WireItem::change))
            .collect();
        let payloads = items.chunks(CHANGES_PER_PAYLOAD).map(wire_text).collect();
        self.announced = (self.list.len(), self.touched.len());
        payloads
    }

    /// Every operation the transaction changed.
    fn ids(&self) -> impl Iterator<Item = &str> {
        self.list
            .iter()
            .map(|c| c.operation_id.as_str())
            .chain(self.touched.iter().map(String::as_str))
    }
}

/// The schema, one step per version, applied in order from the database's
/// current version.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("postgres/schema.sql")),
    (2, include_str!("postgres/0002_guard_when.sql")),
    (3, include_str!("postgres/0003_fewer_indexes.sql")),
    (4, include_str!("postgres/0004_uploads.sql")),
    (5, include_str!("postgres/0005_reruns.sql")),
    (6, include_str!("postgres/0006_paused.sql")),
    (7, include_str!("postgres/0007_checkpoints.sql")),
    (8, include_str!("postgres/0008_console.sql")),
    (9, include_str!("postgres/0009_job_path_indexes.sql")),
    (10, include_str!("postgres/0010_guard_after.sql")),
    (11, include_str!("postgres/0011_history_vacuum.sql")),
    (12, include_str!("postgres/0012_keys_by_tombstone.sql")),
];

/// How to reach and use a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A `postgres://` URL.
    pub url: String,
    /// Connections in this process's pool.
    pub max_connections: u32,
    /// How long terminal operations are kept.
    pub operation_retention: Duration,
    /// How long published results are kept.
    pub result_retention: Duration,
    /// Keep inputs after success (for re-runs); dropped otherwise.
    pub keep_inputs: bool,
}

impl PostgresConfig {
    /// Defaults for the database at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            operation_retention: Duration::from_secs(30 * 24 * 3600),
            result_retention: Duration::from_secs(24 * 3600),
            keep_inputs: false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Policy {
    operation_retention: Duration,
    result_retention: Duration,
    keep_inputs: bool,
}

/// The PostgreSQL backend: many nodes on one database.
pub struct PostgresStore {
    pool: PgPool,
    policy: Policy,
    changes: broadcast::Sender<Change>,
    /// What `operation_get` read, kept coherent by every commit and NOTIFY.
    reads: Arc<ReadCache>,
    finishes: GroupCommit<FinishParams, Operation>,
    accepts: GroupCommit<AcceptParams, AcceptOutcome>,
}

fn db(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(d) = &e
        && d.code().as_deref() == Some(crate::error::POSTGRES_GUARD)
    {
        return StoreError::IllegalTransition(d.message().to_owned());
    }
    if is_unavailable(&e) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Postgres(std::sync::Arc::new(e))
    }
}

/// The database is unreachable, shutting down, out of space or read-only:
/// the statement was not applied and may succeed later.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|code| {
            // 08: connection exceptions; 57P01-57P03: shutting down or not
            // yet accepting; 53: insufficient resources (disk full, out of
            // memory, too many connections); 25006: read-only transaction.
            code.starts_with("08") || code.starts_with("53") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25006")
        }),
        _ => false,
    }
}

/// How long a call waits for a pool connection before it is refused as
/// unavailable (sqlx's default of 30 s would hold every request through an
/// outage).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

async fn listen(pool: &PgPool) -> std::result::Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Publishes every notification on `feed`, each after the read cache forgot
/// what it changed. Notifications sent while the listening connection was
/// down are gone: meanwhile the read cache serves nothing, and once the
/// listener is back a resync tells subscribers to re-read what they watch
/// (a missed notification delays a waiter by one reconnect, not until its
/// wait ends).
async fn follow_notifications(
    pool: PgPool,
    mut listener: sqlx::postgres::PgListener,
    feed: broadcast::Sender<Change>,
    reads: Arc<ReadCache>,
) {
    loop {
        let lost = match listener.try_recv().await {
            Ok(Some(notification)) => {
                let Ok(mut items) = serde_json::from_str::<Vec<WireItem>>(notification.payload()) else {
                    continue;
                };
                // Forgotten, all of them, before anyone hears of one.
                let touched: Vec<String> = items
                    .iter_mut()
                    .filter_map(|item| item.touched.take().map(std::borrow::Cow::into_owned))
                    .collect();
                let changes: Vec<Change> = items.into_iter().filter_map(WireItem::into_change).collect();
                reads.evict(
                    touched
                        .iter()
                        .map(String::as_str)
                        .chain(changes.iter().map(|c| c.operation_id.as_str())),
                );
                for change in changes {
                    let _ = feed.send(change);
                }
                continue;
            }
            Ok(None) => "the change listener lost its connection; reconnecting".to_owned(),
            Err(_) if pool.is_closed() => return,
            Err(e) => format!("the change listener failed ({e}); reconnecting"),
        };
        reads.suspend();
        tracing::warn!("{lost}");
        // A new listener, rather than sqlx's reconnect inside `try_recv`:
        // the cache may serve again only once it is known to listen.
        drop(listener);
        loop {
            if pool.is_closed() {
                return;
            }
            match listen(&pool).await {
                Ok(fresh) => {
                    listener = fresh;
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "the change listener cannot reconnect yet"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        reads.resume();
        let _ = feed.send(Change::resync());
    }
}

impl PostgresStore {
    /// Connects and applies the schema if the database has none yet.
    pub async fn open(config: PostgresConfig) -> Result<Self> {
        let options: PgConnectOptions = config.url.parse().map_err(db)?;
        // No JIT compilation: every statement here is short, and a plan
        // whose estimate passed `jit_above_cost` (the claim's generic plan,
        // its LIMIT unknown) paid ~35 ms compiling to run in 1 ms.
        let options = options.options([("jit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // sqlx pings every connection it hands out by default: a round
            // trip to the server before each call's own. A connection that
            // died while idle fails its call's first statement instead, which
            // is refused as unavailable (`db`) before anything is applied,
            // and sqlx drops it.
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(db)?;
        migrate_pool(&pool).await?;
        let (changes, _) = broadcast::channel(4096);
        let listener = listen(&pool).await.map_err(db)?;
        let reads = Arc::new(ReadCache::default());
        tokio::spawn(follow_notifications(
            pool.clone(),
            listener,
            changes.clone(),
            reads.clone(),
        ));
        let policy = Policy {
            operation_retention: config.operation_retention,
            result_retention: config.result_retention,
            keep_inputs: config.keep_inputs,
        };
        let writer = Arc::new(Writer {
            connect: (*pool.connect_options()).clone(),
            reads: reads.clone(),
            policy,
        });
        let finishes = GroupCommit::spawn(&writer, FINISH, |w, c, batch| {
            Box::pin(commit_batch(
                w,
                c,
                |c, ch, policy, batch| Box::pin(task_finish_batch(c, ch, policy, batch)),
                batch,
            ))
        });
        let accepts = GroupCommit::spawn(&writer, ACCEPT, |w, c, batch| {
            Box::pin(operation_accept_run(w, c, batch))
        });
        Ok(Self {
            pool,
            policy,
            changes,
            reads,
            finishes,
            accepts,
        })
    }

    /// Runs `f` in one transaction, ended by [`commit`]. The transaction runs in its own task: a caller that goes away (a
    /// client that dropped its request) cannot cut it in two; it commits or
    /// rolls back whole.
    async fn tx<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection, &'c mut Changes) -> futures_util::future::BoxFuture<'c, Result<T>>
            + Send
            + 'static,
    {
        self.tx_begun_with("BEGIN", f).await
    }

    /// [`tx`](Self::tx), begun with `begin` (`BEGIN` and settings of the
    /// transaction, sent as one).
    async fn tx_begun_with<T, F>(&self, begin: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection, &'c mut Changes) -> futures_util::future::BoxFuture<'c, Result<T>>
            + Send
            + 'static,
    {
        let (pool, reads) = (self.pool.clone(), self.reads.clone());
        let run = async move {
            let mut tx = pool.begin_with(begin).await.map_err(db)?;
            let mut changes = Changes::default();
            let out = f(&mut tx, &mut changes).await;
            match out {
                Ok(value) => commit(tx, &mut changes, &reads).await.map(|()| value),
                Err(e) => {
                    let _ = tx.rollback().await;
                    Err(e)
                }
            }
        };
        tokio::spawn(tracing::Instrument::instrument(run, tracing::Span::current()))
            .await
            .map_err(|_| StoreError::Stopped("a transaction task"))?
    }
}

/// Changes one NOTIFY payload carries: payloads are limited to 8000 bytes.
/// A macro so that the submission statement's SQL can spell it too.
macro_rules! changes_per_payload {
    () => {
        20
    };
}
const CHANGES_PER_PAYLOAD: usize = changes_per_payload!();

/// Queues `changes` for every listener; they are delivered if and when the
/// transaction commits. Sent [`CHANGES_PER_PAYLOAD`] to a payload, all in one
/// statement (a claim of 64 tasks had paid a round trip per payload), in
/// order: `unnest` yields the array's items in order and each row's
/// `pg_notify` runs as it is read.
async fn announce(c: &mut PgConnection, changes: &mut Changes) -> Result<()> {
    let payloads = changes.unannounced_payloads();
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, payload) FROM unnest($2::TEXT[]) AS p(payload)")
        .bind(CHANNEL)
        .bind(payloads)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

/// How one kind of write is group-committed.
#[derive(Debug, Clone, Copy)]
struct Batching {
    /// The most items one transaction commits.
    max_batch: usize,
    /// How many batches commit at once (each on its own connection).
    writers: usize,
    /// A batch smaller than this commits alone: the other writers wait
    /// until it has, and the next batch gathers meanwhile. Small batches
    /// one after another cost the database less than the same items in
    /// more, smaller batches side by side; large ones gain from overlapping
    /// one's statements with another's WAL flush.
    alone_below: usize,
}

/// Worker outcomes: applied set-based (`task_finish_batch`).
const FINISH: Batching = Batching {
    max_batch: 256,
    writers: 2,
    alone_below: 0,
};

/// Submissions: one statement per batch (see `operation_accept_run`).
/// Measured with the peers bench (32 single submitters; 4 submitters of
/// 100): 1 writer took the most singles and the fewest batches, 4 writers
/// the reverse; 2 writers with small batches committed alone took the most
/// of both.
const ACCEPT: Batching = Batching {
    max_batch: 1024,
    writers: 2,
    alone_below: 64,
};

/// Applies a batch in one transaction and answers each item. An item may
/// refuse (an `Err` in its place) only before it wrote anything; an `Err`
/// for the whole batch (a database error) rolls it back.
type Apply<P, R> = for<'c> fn(
    &'c mut PgConnection,
    &'c mut Changes,
    Policy,
    &'c [&'c P],
) -> futures_util::future::BoxFuture<'c, Result<Vec<Result<R>>>>;

/// Writes a batch on the writer's connection and answers each item once
/// what it wrote is durable (`commit_batch` with an [`Apply`], or the
/// submissions' own way); an `Err` for the whole batch means it wrote
/// nothing, and each item is then written alone, so only the bad one fails.
type Run<P, R> = for<'c> fn(
    &'c Writer,
    &'c mut PgConnection,
    &'c [&'c P],
) -> futures_util::future::BoxFuture<'c, Result<Vec<Result<R>>>>;

/// What a group-commit writer writes with.
struct Writer {
    /// Each writer's own connection is opened with these (the pool's).
    connect: PgConnectOptions,
    reads: Arc<ReadCache>,
    policy: Policy,
}

impl Writer {
    /// A connection of a writer's own, outside the pool. Kept for as long as
    /// it works: the pool hands out its idle connections in turn, and each
    /// prepares and plans the writer's statements anew (0.8 ms a plan of the
    /// submission statement, 5 times before PostgreSQL settles on a generic
    /// one). Measured with 4 clients submitting 20 k in batches of 100 to a
    /// fresh server: 31.9 k/s on whichever pool connection was next,
    /// 33.9 k/s on the writers' own.
    async fn connect(&self) -> Result<PgConnection> {
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
struct Job<P, R> {
    params: Vec<P>,
    reply: oneshot::Sender<Vec<Result<R>>>,
}

/// Group commit, as the SQLite writer does it: whatever arrived while the
/// writers were busy goes into one transaction, so under load many writes
/// share one WAL flush and one NOTIFY, and alone one pays one as before.
/// Every caller is answered only after its batch committed.
struct GroupCommit<P, R> {
    queue: mpsc::Sender<Job<P, R>>,
}

impl<P: Send + Sync + 'static, R: Send + 'static> GroupCommit<P, R> {
    fn spawn(writer: &Arc<Writer>, batching: Batching, run: Run<P, R>) -> Self {
        let (queue, rx) = mpsc::channel(4 * batching.max_batch);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..batching.writers {
            tokio::spawn(group_writer(writer.clone(), batching, run, rx.clone()));
        }
        Self { queue }
    }

    /// Runs `params` in the next batch; the answer comes once it is durable.
    async fn write(&self, params: P) -> Result<R> {
        self.write_many(vec![params]).await.pop().expect("one answer per item")
    }

    /// Runs all of `params` in one transaction, in order (with other
    /// callers' writes); answered item by item once it is durable.
    async fn write_many(&self, params: Vec<P>) -> Vec<Result<R>> {
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

async fn group_writer<P, R>(
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
async fn alone_on_error<P, R>(writer: &Writer, c: &mut PgConnection, run: Run<P, R>, batch: &[&P]) -> Vec<Result<R>> {
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
async fn commit_batch<P, R>(
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
async fn commit(mut tx: sqlx::Transaction<'_, sqlx::Postgres>, changes: &mut Changes, reads: &ReadCache) -> Result<()> {
    announce(&mut tx, changes).await?;
    reads.writing(changes.ids());
    let committed = tx.commit().await.map_err(db);
    reads.written(changes.ids());
    committed
}

/// Applies the schema once (an advisory lock keeps concurrent starts apart).
pub async fn migrate(url: &str) -> Result<usize> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect(url)
        .await
        .map_err(db)?;
    migrate_pool(&pool).await
}

async fn migrate_pool(pool: &PgPool) -> Result<usize> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SELECT pg_advisory_xact_lock(7723001)")
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('schema_migrations') IS NOT NULL")
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
    let current: i64 = if exists {
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?
    } else {
        0
    };
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > current) {
        sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)")
            .bind(version)
            .bind(longrun_core::Clock::now(&longrun_core::SystemClock).as_millis())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        applied += 1;
    }
    tx.commit().await.map_err(db)?;
    Ok(applied)
}

const OP_COLUMNS: &str = "id, tenant, kind, state, version, attempt, input, callback_url, deadline_at, \
    budget_max_cost, cost_units, labels, progress, result, error_code, error_message, error_retryable, \
    cancel_requested_at, cancel_requested_by, cancel_reason, cancellable, idempotency_key, created_at, \
    started_at, completed_at, updated_at, expires_at, artifact, rerun_of, pause_requested_at";

/// How many columns `OP_COLUMNS` names: what a query selects after them starts here.
const OP_COLUMN_COUNT: usize = 30;

fn json_text(text: Option<String>) -> Result<Option<Value>> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp)
}

fn state_of(text: &str) -> Result<State> {
    text.parse()
        .map_err(|e: longrun_core::state::UnknownState| StoreError::Corrupt(e.to_string()))
}

fn operation_from_row(r: &PgRow) -> Result<Operation> {
    let get = |e: sqlx::Error| db(e);
    let labels: BTreeMap<String, String> = match json_text(r.try_get(11).map_err(get)?)? {
        Some(v) => serde_json::from_value(v).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        None => BTreeMap::new(),
    };
    let error_code: Option<String> = r.try_get(14).map_err(get)?;
    let cancel_requested_at: Option<i64> = r.try_get(17).map_err(get)?;
    Ok(Operation {
        id: Id::from_trusted(r.try_get(0).map_err(get)?),
        tenant: r.try_get(1).map_err(get)?,
        kind: r.try_get(2).map_err(get)?,
        state: state_of(r.try_get(3).map_err(get)?)?,
        version: r.try_get(4).map_err(get)?,
        attempt: r.try_get(5).map_err(get)?,
        input: json_text(r.try_get(6).map_err(get)?)?,
        callback_url: r.try_get(7).map_err(get)?,
        deadline_at: ts(r.try_get(8).map_err(get)?),
        budget_max_cost: r.try_get(9).map_err(get)?,
        cost_units: r.try_get(10).map_err(get)?,
        labels,
        progress: json_text(r.try_get(12).map_err(get)?)?.map(|v| progress_from_json(&v)),
        result: json_text(r.try_get(13).map_err(get)?)?,
        error: match error_code {
            Some(code) => Some(OperationError {
                code,
                message: r.try_get::<Option<String>, _>(15).map_err(get)?.unwrap_or_default(),
                retryable: r.try_get::<Option<bool>, _>(16).map_err(get)?.unwrap_or(false),
            }),
            None => None,
        },
        cancel: match cancel_requested_at {
            Some(at) => Some(CancelRequest {
                requested_at: Timestamp(at),
                requested_by: r.try_get::<Option<String>, _>(18).map_err(get)?.unwrap_or_default(),
                reason: r.try_get(19).map_err(get)?,
            }),
            None => None,
        },
        cancellable: r.try_get(20).map_err(get)?,
        idempotency_key: r.try_get(21).map_err(get)?,
        created_at: Timestamp(r.try_get(22).map_err(get)?),
        started_at: ts(r.try_get(23).map_err(get)?),
        completed_at: ts(r.try_get(24).map_err(get)?),
        updated_at: Timestamp(r.try_get(25).map_err(get)?),
        expires_at: ts(r.try_get(26).map_err(get)?),
        artifact: None,
        artifacts: std::collections::BTreeMap::new(),
        rerun_of: r.try_get::<Option<String>, _>(28).map_err(get)?.map(Id::from_trusted),
        reruns: None,
        pause_requested_at: ts(r.try_get(29).map_err(get)?),
    })
    .and_then(|mut op| {
        (op.artifact, op.artifacts) = artifacts_from_json(json_text(r.try_get(27).map_err(get)?)?.as_ref());
        Ok(op)
    })
}

/// `FOR UPDATE NOWAIT` found the row locked.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The channel every node listens on for committed changes.
const CHANNEL: &str = "longrun_changes";

/// One item of a NOTIFY payload (a JSON array of them): a change, or an
/// operation to forget (`touched`). Written and read through this struct,
/// never a `serde_json::Value` (building and walking those was 5 % of the
/// server's time in an in-process drain). Absent and `null` fields read the
/// same, so nodes of neighbouring versions understand each other.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct WireItem<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    touched: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    t: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    v: Option<i64>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    e: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    k: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    s: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    a: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    c: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    st: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    co: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cr: Option<i64>,
    /// Sent only when true (an operation with a callback): a node of the
    /// version before reads none, and its deliverer finds the webhook at
    /// its next interval instead of at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    w: Option<bool>,
}

impl<'a> WireItem<'a> {
    fn touched(id: &'a str) -> Self {
        Self {
            touched: Some(id.into()),
            ..Self::default()
        }
    }

    fn change(c: &'a Change) -> Self {
        Self {
            touched: None,
            id: Some(c.operation_id.as_str().into()),
            t: Some(c.tenant.as_str().into()),
            v: Some(c.version),
            e: Some(c.event_type.as_str().into()),
            k: Some(c.kind.as_str().into()),
            s: Some(c.state.as_str().into()),
            a: Some(c.attempt),
            c: Some(c.created_at.0),
            st: c.started_at.map(|t| t.0),
            co: c.completed_at.map(|t| t.0),
            cr: c.cancel_requested_at.map(|t| t.0),
            w: c.callback.then_some(true),
        }
    }

    /// The change this item announces, if it is one.
    fn into_change(self) -> Option<Change> {
        Some(Change {
            operation_id: Id::from_trusted(self.id?.into_owned()),
            tenant: self.t?.into_owned(),
            version: self.v?,
            event_type: self.e?.into_owned(),
            kind: self.k?.into_owned(),
            state: self.s?.parse().ok()?,
            attempt: self.a?,
            created_at: Timestamp(self.c?),
            started_at: self.st.map(Timestamp),
            completed_at: self.co.map(Timestamp),
            cancel_requested_at: self.cr.map(Timestamp),
            callback: self.w.unwrap_or(false),
        })
    }
}

/// `items` as one JSON text.
fn wire_text<'a>(items: impl IntoIterator<Item = &'a WireItem<'a>>) -> String {
    let mut text = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(item).expect("notification items serialize"));
    }
    text.push(']');
    text
}

fn change_of(op: &Operation, event_type: &str) -> Change {
    Change::of(op, event_type)
}

async fn event_insert(
    c: &mut PgConnection,
    ch: &mut Changes,
    op: &Operation,
    event_type: &str,
    data: &Value,
) -> Result<()> {
    events_insert(c, ch, &[(op, event_type, data.clone())]).await
}

async fn operation_by_id(c: &mut PgConnection, id: &str) -> Result<Option<Operation>> {
    let row = sqlx::query(&format!("SELECT {OP_COLUMNS} FROM operations WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    row.as_ref().map(operation_from_row).transpose()
}

async fn owned(c: &mut PgConnection, tenant: &str, id: &str) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM operations WHERE id = $1 AND tenant = $2")
        .bind(id)
        .bind(tenant)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?
        .is_some())
}

/// `UPDATE … RETURNING` every column; `None` when no row matched.
async fn update_returning(
    c: &mut PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<Option<Operation>> {
    let row = query.fetch_optional(&mut *c).await.map_err(db)?;
    row.as_ref().map(operation_from_row).transpose()
}

/// Accepts a batch in one round trip in the common case: one statement
/// outside any transaction (`insert_submissions`, announcing) writes the
/// idempotency records (insert-or-detect), the operations, their tasks and
/// first events and NOTIFYs what it created, all committed together when the
/// statement ends. No BEGIN, no separate NOTIFY, no COMMIT: a group commit of
/// any size costs the database one round trip and one WAL flush. What the
/// statement leaves undecided (it wrote nothing for them) goes afterwards in
/// one transaction (`operation_accept_batch`): a key already taken (a replay
/// or a reuse, perhaps of an earlier item of this batch) and a tenant with a
/// `max_active` quota.
async fn operation_accept_run(
    w: &Writer,
    c: &mut PgConnection,
    batch: &[&AcceptParams],
) -> Result<Vec<Result<AcceptOutcome>>> {
    // A re-run's source lists it: the statement commits that change too.
    let sources: Vec<&str> = batch
        .iter()
        .filter_map(|p| p.rerun_of.as_ref().map(Id::as_str))
        .collect();
    w.reads.writing(sources.iter().copied());
    let written = insert_submissions(c, batch, Mode::Announcing).await;
    w.reads.written(sources.iter().copied());
    let written = written?;
    let mut results: Vec<Option<Result<AcceptOutcome>>> = Vec::with_capacity(batch.len());
    let mut undecided = Vec::new();
    for (p, written) in batch.iter().zip(written) {
        match written {
            Inserted::Created(op) => {
                // Its source was forgotten by `written` above.
                w.reads.evict([op.id.as_str()]);
                results.push(Some(Ok(AcceptOutcome::Created(*op))));
            }
            Inserted::Capped | Inserted::KeyTaken => {
                undecided.push(*p);
                results.push(None);
            }
        }
    }
    if !undecided.is_empty() {
        let run: Run<AcceptParams, AcceptOutcome> = |w, c, batch| {
            Box::pin(commit_batch(
                w,
                c,
                |c, ch, _, batch| Box::pin(operation_accept_batch(c, ch, batch)),
                batch,
            ))
        };
        let mut answers = alone_on_error(w, c, run, &undecided).await.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            *slot = answers.next();
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| StoreError::Corrupt("a submission went unanswered".into())))
        .collect()
}

/// Accepts, in the caller's transaction, what the announcing statement left
/// undecided: the same statement, transactional, then item by item a key
/// already taken (`taken_key`) and a tenant with a `max_active` quota
/// (`accept_with_quota`). A refusal writes nothing, so the batch needs no
/// savepoints; a database error fails the whole batch.
async fn operation_accept_batch(
    c: &mut PgConnection,
    ch: &mut Changes,
    batch: &[&AcceptParams],
) -> Result<Vec<Result<AcceptOutcome>>> {
    let written = insert_submissions(c, batch, Mode::Unchecked).await?;
    let mut results = Vec::with_capacity(batch.len());
    for (p, written) in batch.iter().zip(written) {
        let outcome = match written {
            Inserted::Created(op) => {
                ch.record(&op, "created");
                Ok(AcceptOutcome::Created(*op))
            }
            Inserted::Capped => accept_with_quota(c, ch, p).await,
            Inserted::KeyTaken => taken_key(c, p).await,
        };
        match outcome {
            // A database error leaves the transaction aborted.
            Err(e @ (StoreError::Postgres(_) | StoreError::IllegalTransition(_))) => return Err(e),
            answered => results.push(answered),
        }
    }
    Ok(results)
}

/// A submission and its lease in one statement outside any transaction
/// (so one round trip and one WAL flush): the operation is inserted as a
/// claim would leave it (running, version 2, attempt 1), its task leased
/// (the token drawn here, as `lease_tasks` draws it), with both events and
/// both changes announced. Nothing is written for a tenant with a quota on
/// active or running work (those are counted under the tenant's lock, as
/// `accept_with_quota` and `task_claim` do) or a key already taken.
const SUBMIT_LEASED: &str = "WITH q AS (
         SELECT NOT EXISTS (SELECT 1 FROM tenants
                             WHERE name = $2 AND (max_active IS NOT NULL OR max_running IS NOT NULL)) AS open
     ), k AS (
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT $2, $3, $8, $9, $1, $10 FROM q WHERE open AND $8::TEXT IS NOT NULL
         ON CONFLICT DO NOTHING RETURNING operation_id
     ), o AS (
         INSERT INTO operations (id, tenant, kind, state, version, attempt, input, deadline_at, budget_max_cost,
                                 labels, idempotency_key, created_at, updated_at, started_at)
         SELECT $1, $2, $3, 'running', 2, 1, $4, $5, $6, $7, $8, $10, $10, $10 FROM q
          WHERE open AND ($8::TEXT IS NULL OR EXISTS (SELECT 1 FROM k))
         RETURNING id, seq
     ), t AS (
         INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, lease_token, lease_expires_at,
                            worker_id, lease_ms)
         SELECT o.id, o.seq, $2, $3, 'leased', $10, replace(gen_random_uuid()::TEXT, '-', ''), $11, $12, $13 FROM o
         RETURNING lease_token
     ), e AS (
         INSERT INTO operation_events (operation_id, version, type, state, at, data, snapshot)
         SELECT o.id, v.version, v.type, v.state, $10, v.data, v.snapshot
           FROM o CROSS JOIN (VALUES (1::BIGINT, 'created', 'queued', '{}', $14::TEXT),
                                     (2::BIGINT, 'started', 'running', $15::TEXT, $16::TEXT))
                AS v(version, type, state, data, snapshot)
     ), n AS (
         SELECT pg_notify($17, $18) FROM o
     )
     SELECT t.lease_token FROM t WHERE (SELECT count(*) FROM n) >= 0";

/// See [`Store::operation_accept_leased`] and [`SUBMIT_LEASED`].
async fn operation_accept_leased(
    pool: &PgPool,
    reads: &ReadCache,
    p: &AcceptParams,
    to: &LeaseTo,
) -> Result<Option<(Operation, Task)>> {
    if !p.may_be_handed_off() {
        return Ok(None);
    }
    let created = created_operation(p);
    let running = started(created.clone(), p.now);
    let started_data = json!({"attempt": running.attempt, "worker_id": to.worker_id});
    let changes = [change_of(&created, "created"), change_of(&running, "started")];
    let payload = wire_text(&changes.iter().map(WireItem::change).collect::<Vec<_>>());
    let lease_expires_at = p.now.plus(to.lease);
    let mut c = pool.acquire().await.map_err(db)?;
    reads.writing([created.id.as_str()]);
    let token: Result<Option<String>> = sqlx::query_scalar(SUBMIT_LEASED)
        .bind(p.id.as_str())
        .bind(&p.tenant)
        .bind(&p.kind)
        .bind(p.input.to_string())
        .bind(p.deadline_at.map(|t| t.0))
        .bind(p.budget_max_cost)
        .bind(serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?)
        .bind(p.idempotency.as_ref().map(|(k, _)| k.as_str()))
        .bind(p.idempotency.as_ref().map(|(_, f)| f.0.to_vec()))
        .bind(p.now.0)
        .bind(lease_expires_at.0)
        .bind(&to.worker_id)
        .bind(lease_ms(to.lease))
        .bind(snapshot_text(&created))
        .bind(started_data.to_string())
        .bind(snapshot_text(&running))
        .bind(CHANNEL)
        .bind(payload)
        .fetch_optional(&mut *c)
        .await
        .map_err(db);
    reads.written([created.id.as_str()]);
    let Some(lease_token) = token? else {
        return Ok(None);
    };
    let task = Task {
        operation_id: running.id.clone(),
        tenant: running.tenant.clone(),
        kind: running.kind.clone(),
        input: p.input.clone(),
        attempt: running.attempt,
        lease_token,
        lease_expires_at,
        deadline_at: running.deadline_at,
        budget_max_cost: running.budget_max_cost,
        checkpoint: None,
    };
    Ok(Some((created, task)))
}

/// What the submission statement did with one item.
enum Inserted {
    Created(Box<Operation>),
    /// The tenant has a `max_active` quota that was not checked: nothing written.
    Capped,
    /// The key names an earlier submission: nothing written.
    KeyTaken,
}

/// The submission statement's CTEs: what it writes (see
/// `insert_submissions`). Item `ord` of the arrays is one submission; `$13`
/// says the caller checked the quota; `$17` is each item's notification
/// (announcing only).
macro_rules! submit_ctes {
    () => {
        "WITH q AS (
             SELECT i.*, NOT $13 AND EXISTS (SELECT 1 FROM tenants WHERE name = i.tenant AND max_active IS NOT NULL) AS capped
               FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
                           $7::FLOAT8[], $8::TEXT[], $9::TEXT[], $10::BYTEA[], $11::BIGINT[], $12::TEXT[],
                           $14::TEXT[], $15::TEXT[], $16::TEXT[], $17::TEXT[])
                    WITH ORDINALITY AS i(id, tenant, kind, input, callback_url, deadline_at, budget_max_cost,
                                         labels, key, fingerprint, now, snapshot, uploads, rerun_of,
                                         checkpoint_from, change, ord)
         ), k AS (
             INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
             SELECT tenant, kind, key, fingerprint, id, now FROM q WHERE key IS NOT NULL AND NOT capped ORDER BY ord
             ON CONFLICT DO NOTHING RETURNING operation_id
         ), o AS (
             INSERT INTO operations (id, tenant, kind, state, version, attempt, input, callback_url, deadline_at,
                                     budget_max_cost, labels, idempotency_key, created_at, updated_at, rerun_of,
                                     checkpoint)
             SELECT id, tenant, kind, 'queued', 1, 0, input, callback_url, deadline_at, budget_max_cost, labels,
                    key, now, now, rerun_of,
                    (SELECT r.checkpoint FROM operations r WHERE r.id = q.checkpoint_from) FROM q
              WHERE NOT capped AND (key IS NULL OR id IN (SELECT operation_id FROM k))
              ORDER BY ord
             RETURNING id, seq
         ), t AS (
             INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
             SELECT o.id, o.seq, q.tenant, q.kind, 'ready', q.now FROM o JOIN q USING (id)
         ), e AS (
             INSERT INTO operation_events (operation_id, version, type, state, at, data, snapshot)
             SELECT o.id, 1, 'created', 'queued', q.now, '{}', q.snapshot FROM o JOIN q USING (id)
         ), pc AS (
             INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
             SELECT o.id, p.name, p.piece_offset, p.storage_key, p.size_bytes
               FROM o JOIN q USING (id) JOIN artifact_pieces p ON p.operation_id = q.checkpoint_from
         ), u AS (
             INSERT INTO operation_uploads (operation_id, upload_id)
             SELECT o.id, unnest(string_to_array(q.uploads, ',')) FROM o JOIN q USING (id) WHERE q.uploads <> ''
             ON CONFLICT DO NOTHING
         )"
    };
}

/// The submission statement in the caller's transaction.
const SUBMIT_IN_TX: &str = concat!(
    submit_ctes!(),
    " SELECT q.capped, o.id IS NOT NULL FROM q LEFT JOIN o USING (id) ORDER BY q.ord"
);

/// The submission statement on its own: it also NOTIFYs (`$18`) what it
/// created, [`CHANGES_PER_PAYLOAD`] items per payload, and commits as it
/// ends.
const SUBMIT_ANNOUNCING: &str = concat!(
    submit_ctes!(),
    ", n AS (
         SELECT pg_notify($18, '[' || string_agg(q.change, ',' ORDER BY q.ord) || ']')
           FROM o JOIN q USING (id) GROUP BY (q.ord - 1) / ",
    changes_per_payload!(),
    "
     )
     SELECT q.capped, o.id IS NOT NULL FROM q LEFT JOIN o USING (id) WHERE (SELECT count(*) FROM n) >= 0 ORDER BY q.ord"
);

/// How `insert_submissions` runs.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// On its own, outside a transaction: it commits when it ends and
    /// NOTIFYs what it created itself; tenants with a quota are left.
    Announcing,
    /// In the caller's transaction, which announces; quota tenants are left.
    Unchecked,
    /// In the caller's transaction, which holds the tenant rows and counted.
    QuotaChecked,
}

/// The one statement that writes submissions, item by item in batch order
/// (see `operation_accept_run`). Two items with one key: the first is
/// written, the second finds the key taken.
async fn insert_submissions(c: &mut PgConnection, batch: &[&AcceptParams], mode: Mode) -> Result<Vec<Inserted>> {
    let created: Vec<Operation> = batch.iter().map(|p| created_operation(p)).collect();
    let mut labels = Vec::with_capacity(batch.len());
    for p in batch {
        labels.push(serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?);
    }
    let column = |f: fn(&AcceptParams) -> Option<&str>| batch.iter().map(|p| f(p)).collect::<Vec<_>>();
    let announcing = mode == Mode::Announcing;
    // Each item's notification as it will be if the item is created: its
    // change, after the re-run source it touches.
    let change: Vec<String> = if announcing {
        created
            .iter()
            .map(|op| {
                let change = change_of(op, "created");
                let touched = Change::also_alters(op, "created").map(|id| WireItem::touched(id.as_str()));
                let items: Vec<WireItem> = touched.into_iter().chain([WireItem::change(&change)]).collect();
                let text = wire_text(&items);
                // The statement joins the items of many submissions into
                // one array: each item's text without its brackets.
                text[1..text.len() - 1].to_owned()
            })
            .collect()
    } else {
        Vec::new()
    };
    let query = sqlx::query(if announcing { SUBMIT_ANNOUNCING } else { SUBMIT_IN_TX })
        .bind(column(|p| Some(p.id.as_str())))
        .bind(column(|p| Some(p.tenant.as_str())))
        .bind(column(|p| Some(p.kind.as_str())))
        .bind(batch.iter().map(|p| p.input.to_string()).collect::<Vec<_>>())
        .bind(column(|p| p.callback_url.as_deref()))
        .bind(batch.iter().map(|p| p.deadline_at.map(|t| t.0)).collect::<Vec<_>>())
        .bind(batch.iter().map(|p| p.budget_max_cost).collect::<Vec<_>>())
        .bind(labels)
        .bind(column(|p| p.idempotency.as_ref().map(|(k, _)| k.as_str())))
        .bind(
            batch
                .iter()
                .map(|p| p.idempotency.as_ref().map(|(_, f)| f.0.to_vec()))
                .collect::<Vec<_>>(),
        )
        .bind(batch.iter().map(|p| p.now.0).collect::<Vec<_>>())
        .bind(created.iter().map(snapshot_text).collect::<Vec<_>>())
        .bind(mode == Mode::QuotaChecked)
        .bind(
            batch
                .iter()
                .map(|p| p.uploads.iter().map(Id::as_str).collect::<Vec<_>>().join(","))
                .collect::<Vec<_>>(),
        )
        .bind(column(|p| p.rerun_of.as_ref().map(Id::as_str)))
        .bind(column(|p| {
            p.rerun_of.as_ref().filter(|_| p.from_checkpoint).map(Id::as_str)
        }))
        .bind(change);
    let query = if announcing { query.bind(CHANNEL) } else { query };
    let rows = query.fetch_all(&mut *c).await.map_err(db)?;
    if rows.len() != batch.len() {
        return Err(StoreError::Corrupt("the submission statement lost an item".into()));
    }
    rows.iter()
        .zip(created)
        .map(|(row, op)| {
            let capped: bool = row.try_get(0).map_err(db)?;
            let inserted: bool = row.try_get(1).map_err(db)?;
            Ok(if inserted {
                Inserted::Created(Box::new(op))
            } else if capped {
                Inserted::Capped
            } else {
                Inserted::KeyTaken
            })
        })
        .collect()
}

/// The answer for a key the submission statement found taken.
async fn taken_key(c: &mut PgConnection, p: &AcceptParams) -> Result<AcceptOutcome> {
    known_key(c, p)
        .await?
        .ok_or_else(|| StoreError::Corrupt("an idempotency key that was taken is gone".into()))
}

/// The operation an earlier submission with the same key created, or the
/// refusal when this request differs from it; `None` when the key is new.
async fn known_key(c: &mut PgConnection, p: &AcceptParams) -> Result<Option<AcceptOutcome>> {
    let Some((key, fingerprint)) = &p.idempotency else {
        return Ok(None);
    };
    let row = sqlx::query(
        "SELECT fingerprint, operation_id FROM idempotency_keys WHERE tenant = $1 AND kind = $2 AND key = $3",
    )
    .bind(&p.tenant)
    .bind(&p.kind)
    .bind(key.as_str())
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    let Some(row) = row else { return Ok(None) };
    let stored: Vec<u8> = row.try_get(0).map_err(db)?;
    let operation_id = Id::from_trusted(row.try_get(1).map_err(db)?);
    let stored = longrun_core::fingerprint::Fingerprint(
        stored
            .try_into()
            .map_err(|_| StoreError::Corrupt("a stored fingerprint is not 32 bytes".into()))?,
    );
    if !fingerprint.matches(&stored) {
        return Ok(Some(AcceptOutcome::KeyReused { operation_id }));
    }
    let original = operation_by_id(c, operation_id.as_str())
        .await?
        .ok_or(StoreError::Gone)?;
    sqlx::query("UPDATE idempotency_keys SET replays = replays + 1 WHERE tenant = $1 AND kind = $2 AND key = $3")
        .bind(&p.tenant)
        .bind(&p.kind)
        .bind(key.as_str())
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(Some(AcceptOutcome::Replayed(original)))
}

/// A tenant's tasks (its operations not yet ended), counted through the
/// partial indexes of ready and of leased tasks.
const ACTIVE_TASKS: &str = "SELECT (SELECT COUNT(*) FROM tasks WHERE tenant = $1 AND status = 'ready')
                                 + (SELECT COUNT(*) FROM tasks WHERE tenant = $1 AND status = 'leased')";

/// A tenant with a `max_active` quota: its row is locked while the quota is
/// counted, so concurrent submissions cannot overshoot it. A replay still
/// answers when the tenant is full.
async fn accept_with_quota(c: &mut PgConnection, ch: &mut Changes, p: &AcceptParams) -> Result<AcceptOutcome> {
    let max_active: Option<i64> = sqlx::query_scalar("SELECT max_active FROM tenants WHERE name = $1 FOR UPDATE")
        .bind(&p.tenant)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?
        .flatten();
    if let Some(max_active) = max_active {
        let active: i64 = sqlx::query_scalar(ACTIVE_TASKS)
            .bind(&p.tenant)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
        if active >= max_active {
            return match known_key(c, p).await? {
                Some(known) => Ok(known),
                None => Err(StoreError::QuotaExceeded { active, max_active }),
            };
        }
    }
    match insert_submissions(c, &[p], Mode::QuotaChecked).await?.pop() {
        Some(Inserted::Created(op)) => {
            ch.record(&op, "created");
            Ok(AcceptOutcome::Created(*op))
        }
        _ => taken_key(c, p).await,
    }
}

async fn operation_list(c: &mut PgConnection, p: &ListParams) -> Result<OperationPage> {
    let page_size = i64::from(p.page_size.max(1));
    // The text names only the filters given (as SQLite's does), never
    // `$n IS NULL OR …`, and the limit is in the text (at most 101 of them).
    let limit = page_size + 1;
    let mut sql = String::new();
    let mut n = 0;
    let mut arg = |sql: &mut String, clause: &str| {
        n += 1;
        sql.push_str(&clause.replace("$?", &format!("${n}")));
    };
    if p.tenant.is_some() {
        arg(&mut sql, " AND tenant = $?");
    }
    if p.state.is_some() {
        arg(&mut sql, " AND state = $?");
    }
    if p.kind.is_some() {
        arg(&mut sql, " AND kind = $?");
    }
    if p.label.is_some() {
        arg(&mut sql, " AND (labels::jsonb ->> $?)");
        arg(&mut sql, " = $?");
    }
    if p.before_seq.is_some() {
        arg(&mut sql, " AND seq < $?");
    }
    if p.visible_at.is_some() {
        arg(&mut sql, " AND (expires_at IS NULL OR expires_at > $?)");
    }
    if p.created_from.is_some() {
        arg(&mut sql, " AND created_at >= $?");
    }
    if p.created_before.is_some() {
        arg(&mut sql, " AND created_at < $?");
    }
    // One tenant's newest: by `operations_by_tenant_state` or
    // `operations_by_tenant_kind` when a state or a kind is given, else
    // merged from the newest of each state's range of the first (no index
    // orders a tenant's operations by `seq` alone: one would cost every
    // state change an index write). `tenant` is the condition on the
    // tenant that `sql` does not hold.
    let newest_of = |tenant: &str| {
        if p.state.is_some() || p.kind.is_some() {
            format!("SELECT {OP_COLUMNS}, seq FROM operations WHERE TRUE{tenant}{sql} ORDER BY seq DESC LIMIT {limit}")
        } else {
            let states = State::ALL.map(|s| format!("'{}'", s.as_str())).join(", ");
            format!(
                "SELECT o.* FROM unnest(ARRAY[{states}]) AS s(state) CROSS JOIN LATERAL (
                     SELECT {OP_COLUMNS}, seq FROM operations
                      WHERE state = s.state{tenant}{sql} ORDER BY seq DESC LIMIT {limit}) o
                  ORDER BY o.seq DESC LIMIT {limit}"
            )
        }
    };
    let sql = if p.tenant.is_some() {
        newest_of("")
    } else {
        // Every tenant's (the admin console): each tenant's newest, merged,
        // the tenants found by skipping through the index's leading column —
        // a probe per tenant, never a read of every operation (which took
        // 330 ms at a million of them).
        format!(
            "WITH RECURSIVE t(name) AS (
                 SELECT min(tenant) FROM operations
                 UNION ALL
                 SELECT (SELECT min(tenant) FROM operations WHERE tenant > t.name) FROM t WHERE t.name IS NOT NULL)
             SELECT n.* FROM t CROSS JOIN LATERAL ({}) n
              WHERE t.name IS NOT NULL
             ORDER BY n.seq DESC LIMIT {limit}",
            newest_of(" AND tenant = t.name")
        )
    };
    let mut query = sqlx::query(&sql);
    if let Some(tenant) = &p.tenant {
        query = query.bind(tenant);
    }
    if let Some(state) = p.state {
        query = query.bind(state.as_str());
    }
    if let Some(kind) = &p.kind {
        query = query.bind(kind);
    }
    if let Some((key, value)) = &p.label {
        query = query.bind(key).bind(value);
    }
    if let Some(before) = p.before_seq {
        query = query.bind(before);
    }
    if let Some(at) = p.visible_at {
        query = query.bind(at.0);
    }
    if let Some(at) = p.created_from {
        query = query.bind(at.0);
    }
    if let Some(at) = p.created_before {
        query = query.bind(at.0);
    }
    let rows = query.fetch_all(&mut *c).await.map_err(db)?;
    let mut operations = Vec::with_capacity(rows.len());
    let mut seqs = Vec::with_capacity(rows.len());
    for row in &rows {
        operations.push(operation_from_row(row)?);
        seqs.push(row.try_get::<i64, _>(OP_COLUMN_COUNT).map_err(db)?);
    }
    Ok(crate::shared::page(operations, &seqs, page_size))
}

async fn events_of(
    c: &mut PgConnection,
    tenant: &str,
    id: &Id,
    after: i64,
    limit: i64,
    snapshots: bool,
) -> Result<Option<Vec<Event>>> {
    if !owned(c, tenant, id.as_str()).await? {
        return Ok(None);
    }
    let rows = sqlx::query(
        "SELECT version, type, state, at, data, snapshot FROM operation_events
          WHERE operation_id = $1 AND version > $2 ORDER BY version LIMIT $3",
    )
    .bind(id.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        let snapshot = if snapshots {
            json_text(r.try_get(5).map_err(db)?)?
                .as_ref()
                .and_then(snapshot_from_json)
        } else {
            None
        };
        events.push(Event {
            operation_id: id.clone(),
            version: r.try_get(0).map_err(db)?,
            event_type: r.try_get(1).map_err(db)?,
            state: state_of(r.try_get(2).map_err(db)?)?,
            at: Timestamp(r.try_get(3).map_err(db)?),
            data: json_text(r.try_get(4).map_err(db)?)?.unwrap_or(Value::Null),
            snapshot,
        });
    }
    Ok(Some(events))
}

/// Moves a non-terminal operation to a terminal state and returns it (see
/// `sqlite/sql.rs`).
async fn operation_end(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    id: &str,
    ending: &Ending,
    now: Timestamp,
) -> Result<Operation> {
    operations_end(c, ch, policy, &[(id, ending, now)])
        .await?
        .remove(id)
        .ok_or(StoreError::LeaseLost)
}

/// Ends many non-terminal operations in a constant number of statements
/// (one UPDATE from arrays, one DELETE of their tasks, one each to publish
/// and to discard uploaded results, one INSERT of their events) and returns
/// the ended ones by id; an operation that was already terminal is missing.
/// Each ends at its own `now`.
async fn operations_end(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    endings: &[(&str, &Ending, Timestamp)],
) -> Result<std::collections::HashMap<String, Operation>> {
    operations_end_guarded(c, ch, policy, endings, &[]).await
}

/// [`operations_end`], each ending applied only while its operation is at
/// the version of the same place in `versions` (when it has one): an
/// operation changed since (a cancel request, a lapsed lease) is missing
/// from the answer, as one already ended is.
async fn operations_end_guarded(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    endings: &[(&str, &Ending, Timestamp)],
    versions: &[i64],
) -> Result<std::collections::HashMap<String, Operation>> {
    if endings.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    let versions: Vec<Option<i64>> = (0..endings.len()).map(|i| versions.get(i).copied()).collect();
    let ids: Vec<&str> = endings.iter().map(|(id, _, _)| *id).collect();
    let states: Vec<&str> = endings.iter().map(|(_, e, _)| e.to.as_str()).collect();
    let results: Vec<Option<String>> = endings
        .iter()
        .map(|(_, e, _)| e.result.as_ref().map(Value::to_string))
        .collect();
    let error = |e: &Ending| e.error.clone();
    let codes: Vec<Option<String>> = endings.iter().map(|(_, e, _)| error(e).map(|e| e.code)).collect();
    let messages: Vec<Option<String>> = endings.iter().map(|(_, e, _)| error(e).map(|e| e.message)).collect();
    let retryable: Vec<Option<bool>> = endings.iter().map(|(_, e, _)| error(e).map(|e| e.retryable)).collect();
    let progress: Vec<Option<String>> = endings.iter().map(|(_, e, _)| e.progress_json()).collect();
    let nows: Vec<i64> = endings.iter().map(|(_, _, now)| now.0).collect();
    let expiries: Vec<i64> = endings
        .iter()
        .map(|(_, _, now)| now.plus(policy.operation_retention).0)
        .collect();
    // Each operation is found by its id (`id = ANY($1)`, the primary key),
    // and whether it is still live is asked of the pair (`e.e_state IS
    // NULL OR …`, never true on the left): asked of `operations` alone, the
    // planner estimated it from the statistics, which, taken while nothing
    // was live, said no row is; it then read every live operation (a seq
    // scan, or `operations_by_tenant_state` with seq scans off) and
    // compared each with every ending: auto_explain showed 4.5 M rows
    // compared, 2 s, to end 233; 1.6–2.1 k jobs/s instead of 13–14 k for
    // a drain of 20 k jobs after an ANALYZE of 500 ended ones.
    let rows = sqlx::query(&format!(
        "UPDATE operations
            SET state = e.e_state, version = version + 1, result = e.e_result, error_code = e.e_code,
                error_message = e.e_message, error_retryable = e.e_retryable, completed_at = e.e_now,
                updated_at = e.e_now, expires_at = e.e_expires,
                input = CASE WHEN $10 OR e.e_state <> 'succeeded' THEN input ELSE NULL END,
                progress = COALESCE(e.e_progress, progress)
           FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::BOOL[], $7::TEXT[],
                       $8::BIGINT[], $9::BIGINT[], $11::BIGINT[])
                AS e(e_id, e_state, e_result, e_code, e_message, e_retryable, e_progress, e_now, e_expires, e_version)
          WHERE id = ANY($1::TEXT[]) AND id = e.e_id
            AND (e.e_state IS NULL OR state IN ('queued', 'running', 'paused'))
            AND (e.e_version IS NULL OR version = e.e_version)
      RETURNING {OP_COLUMNS}"
    ))
    .bind(&ids)
    .bind(&states)
    .bind(&results)
    .bind(&codes)
    .bind(&messages)
    .bind(&retryable)
    .bind(&progress)
    .bind(&nows)
    .bind(&expiries)
    .bind(policy.keep_inputs)
    .bind(&versions)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut ended = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let op = operation_from_row(row)?;
        ended.insert(op.id.as_str().to_owned(), op);
    }
    let ended_ids: Vec<&str> = ids.iter().copied().filter(|id| ended.contains_key(*id)).collect();
    sqlx::query("DELETE FROM tasks WHERE operation_id = ANY($1)")
        .bind(&ended_ids)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    let publishes: std::collections::HashSet<&str> = endings
        .iter()
        .filter(|(_, e, _)| e.publishes)
        .map(|(id, _, _)| *id)
        .collect();
    let (succeeded, other): (Vec<&str>, Vec<&str>) = ended_ids.iter().partition(|id| publishes.contains(**id));
    // Results are kept from the moment the operation ended.
    let ended_at = |id: &str| ended.get(id).map_or(Timestamp(0), |op| op.updated_at);
    let publish: Vec<(&str, Timestamp)> = succeeded.iter().map(|id| (*id, ended_at(id))).collect();
    let discard_at = other.iter().map(|id| ended_at(id)).max().unwrap_or(Timestamp(0));
    for (id, published) in results_publish(c, policy, &publish).await? {
        if let Some(op) = ended.remove(&id) {
            ended.insert(id, with_published(op, published));
        }
    }
    results_discard(c, &other, discard_at).await?;
    // Cancelled work leaves nothing behind; a failed one keeps its pieces
    // for a `from_checkpoint` re-run.
    for (id, ending, at) in endings {
        if ending.to == State::Cancelled && ended.contains_key(*id) {
            pieces_drop(c, id, None, None, *at).await?;
        }
    }
    let events: Vec<(&Operation, &str, Value)> = endings
        .iter()
        .filter_map(|(id, e, _)| ended.get(*id).map(|op| (op, e.to.as_str(), e.event_data())))
        .collect();
    events_insert(c, ch, &events).await?;
    for (id, _, _) in endings {
        if let Some(op) = ended.get(*id) {
            outbox_insert(c, op).await?;
        }
    }
    Ok(ended)
}

/// Publishes the uploaded results of operations that publish them (each
/// with the time it ended); returns the published artifacts, by name, of
/// each operation that had any (usually none).
async fn results_publish(
    c: &mut PgConnection,
    policy: Policy,
    ended: &[(&str, Timestamp)],
) -> Result<Vec<(String, Vec<(String, ArtifactRef)>)>> {
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = ended.iter().map(|(id, _)| *id).collect();
    let expiries: Vec<i64> = ended
        .iter()
        .map(|(_, at)| result_expires_at(*at, policy.result_retention, policy.operation_retention).0)
        .collect();
    let rows = sqlx::query(
        "UPDATE results SET state = 'published', expires_at = p.expires
           FROM unnest($1::TEXT[], $2::BIGINT[]) AS p(op_id, expires)
          WHERE results.operation_id = p.op_id AND results.state = 'uploaded'
      RETURNING results.operation_id, results.id, results.content_type, results.size_bytes, results.sha256,
                results.expires_at, results.name",
    )
    .bind(&ids)
    .bind(&expiries)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut published: std::collections::BTreeMap<String, Vec<(String, ArtifactRef)>> = Default::default();
    for row in &rows {
        let operation_id: String = row.try_get(0).map_err(db)?;
        let artifact = ArtifactRef {
            id: Id::from_trusted(row.try_get(1).map_err(db)?),
            content_type: row.try_get(2).map_err(db)?,
            size_bytes: row.try_get(3).map_err(db)?,
            sha256: row.try_get(4).map_err(db)?,
            expires_at: Timestamp(row.try_get(5).map_err(db)?),
        };
        published
            .entry(operation_id)
            .or_default()
            .push((row.try_get(6).map_err(db)?, artifact));
    }
    for (operation_id, artifacts) in &published {
        let (mut default, mut named) = (None, std::collections::BTreeMap::new());
        for (name, artifact) in artifacts {
            if name == DEFAULT_ARTIFACT {
                default = Some(artifact.clone());
            } else {
                named.insert(name.clone(), artifact.clone());
            }
        }
        sqlx::query("UPDATE operations SET artifact = $2 WHERE id = $1")
            .bind(operation_id)
            .bind(artifacts_to_json(default.as_ref(), &named).map(|v| v.to_string()))
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(published.into_iter().collect())
}

/// Moves uploaded but unpublished results of `ids` to the garbage list.
async fn results_discard(c: &mut PgConnection, ids: &[&str], now: Timestamp) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH gone AS (DELETE FROM results WHERE operation_id = ANY($1) AND state = 'uploaded' RETURNING storage_key)
         INSERT INTO artifact_garbage (storage_key, created_at) SELECT storage_key, $2 FROM gone ON CONFLICT DO NOTHING",
    )
    .bind(ids)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

async fn outbox_insert(c: &mut PgConnection, op: &Operation) -> Result<()> {
    outbox_insert_as(c, op, &format!("operation.{}", op.state.as_str())).await
}

/// The webhook of a change, of type `event_type` (see the SQLite backend).
async fn outbox_insert_as(c: &mut PgConnection, op: &Operation, event_type: &str) -> Result<()> {
    let Some(url) = &op.callback_url else { return Ok(()) };
    let event_id = Id::generate(IdKind::Event);
    let payload = crate::shared::webhook_payload(op, event_type);
    sqlx::query(
        "INSERT INTO webhook_deliveries (event_id, operation_id, tenant, url, type, payload, created_at, status, next_attempt_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $7)",
    )
    .bind(event_id.as_str())
    .bind(op.id.as_str())
    .bind(&op.tenant)
    .bind(url)
    .bind(event_type)
    .bind(payload)
    .bind(op.updated_at.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

async fn cancel_request(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    by: &str,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<i64> {
    let sql = format!(
        "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4,
                version = version + 1, updated_at = $2
          WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
    );
    let requested = update_returning(c, sqlx::query(&sql).bind(id).bind(now.0).bind(by).bind(reason))
        .await?
        .ok_or(StoreError::NotFound)?;
    event_insert(
        c,
        ch,
        &requested,
        "cancel_requested",
        &json!({"requested_by": by, "reason": reason}),
    )
    .await?;
    Ok(requested.version)
}

/// Pauses or resumes (see `Store::operation_intent`). The operation's row
/// is locked first, as a cancel locks it, so the two take turns. A claim
/// locks the task row first and the operation's after: its task is taken
/// with `NOWAIT`, and a claim in progress means the work is being started —
/// held by a worker, so not pausable — instead of a deadlock.
async fn operation_intent(c: &mut PgConnection, ch: &mut Changes, p: &IntentParams) -> Result<Operation> {
    let op = lock_operation(c, &p.tenant, &p.id).await?;
    let pausable: bool = sqlx::query_scalar("SELECT COALESCE((SELECT pausable FROM kinds WHERE name = $1), FALSE)")
        .bind(&op.kind)
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    // A lock not granted aborts the transaction, up to this savepoint: a
    // pause of a pausable kind goes on to ask the worker.
    sqlx::query("SAVEPOINT task_lock").execute(&mut *c).await.map_err(db)?;
    let status: Option<String> =
        match sqlx::query_scalar("SELECT status FROM tasks WHERE operation_id = $1 FOR UPDATE NOWAIT")
            .bind(p.id.as_str())
            .fetch_optional(&mut *c)
            .await
        {
            Ok(status) => status,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                sqlx::query("ROLLBACK TO SAVEPOINT task_lock")
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                Some("leased".into())
            }
            Err(e) => return Err(db(e)),
        };
    let id = p.id.as_str();
    let holder = Holder {
        leased: status.as_deref() == Some("leased"),
        pausable,
    };
    let change = decide_intent(&op, holder, p)?;
    match change {
        IntentChange::Unchanged => Ok(op),
        IntentChange::Pause => operation_pause(c, ch, id, None, None, None, &json!({}), p.now).await,
        IntentChange::RequestPause | IntentChange::WithdrawPause => {
            let (requested_at, event) = change.pause_request(p.now);
            let sql = format!(
                "UPDATE operations SET pause_requested_at = $2, version = version + 1, updated_at = $3
                  WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
            );
            let query = sqlx::query(&sql).bind(id).bind(requested_at.map(|t| t.0)).bind(p.now.0);
            let changed = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
            event_insert(c, ch, &changed, event, &json!({})).await?;
            Ok(changed)
        }
        IntentChange::Resume => {
            let sql = format!(
                "UPDATE operations SET state = 'queued', version = version + 1, updated_at = $2
                  WHERE id = $1 AND state = 'paused' RETURNING {OP_COLUMNS}"
            );
            let query = sqlx::query(&sql).bind(id).bind(p.now.0);
            let resumed = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
            sqlx::query(
                "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
                 SELECT id, seq, tenant, kind, 'ready', $2 FROM operations WHERE id = $1",
            )
            .bind(id)
            .bind(p.now.0)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            event_insert(c, ch, &resumed, "resumed", &json!({})).await?;
            outbox_insert_as(c, &resumed, "operation.resumed").await?;
            Ok(resumed)
        }
    }
}

/// Takes a queued or running operation out of the queue as `paused` (as
/// SQLite's `operation_pause`): its task row goes, what a pausing worker
/// reports is kept, and the `paused` event and webhook are written.
/// `attempt` is the attempt a resume runs (`None`: unchanged).
#[allow(clippy::too_many_arguments)]
async fn operation_pause(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    attempt: Option<i64>,
    progress: Option<&Progress>,
    checkpoint: Option<&Value>,
    data: &Value,
    now: Timestamp,
) -> Result<Operation> {
    let sql = format!(
        "UPDATE operations SET state = 'paused', version = version + 1, updated_at = $2,
                attempt = COALESCE($3, attempt), progress = COALESCE($4, progress),
                checkpoint = COALESCE($5, checkpoint), pause_requested_at = NULL
          WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
    );
    let query = sqlx::query(&sql)
        .bind(id)
        .bind(now.0)
        .bind(attempt)
        .bind(progress.map(progress_text))
        .bind(checkpoint.map(Value::to_string));
    let paused = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
    sqlx::query("DELETE FROM tasks WHERE operation_id = $1")
        .bind(id)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    event_insert(c, ch, &paused, "paused", data).await?;
    outbox_insert_as(c, &paused, "operation.paused").await?;
    Ok(paused)
}

/// The tenant's operation, locked for the rest of the transaction.
async fn lock_operation(c: &mut PgConnection, tenant: &str, id: &Id) -> Result<Operation> {
    let row = sqlx::query(&format!(
        "SELECT {OP_COLUMNS} FROM operations WHERE id = $1 AND tenant = $2 FOR UPDATE"
    ))
    .bind(id.as_str())
    .bind(tenant)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    row.as_ref()
        .map(operation_from_row)
        .transpose()?
        .ok_or(StoreError::NotFound)
}

async fn operation_cancel(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    p: &CancelParams,
) -> Result<CancelOutcome> {
    // Lock the row: a cancel and a worker's outcome must not interleave.
    let op = lock_operation(c, &p.tenant, &p.id).await?;
    if let std::ops::ControlFlow::Break(answered) = crate::shared::cancel_checks(op, p)? {
        return Ok(answered);
    }
    let leased: Option<bool> = sqlx::query_scalar("SELECT status = 'leased' FROM tasks WHERE operation_id = $1")
        .bind(p.id.as_str())
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let id = p.id.as_str();
    if leased == Some(true) {
        cancel_request(c, ch, id, &p.requested_by, p.reason.as_deref(), p.now).await?;
        let op = operation_by_id(c, id).await?.ok_or(StoreError::NotFound)?;
        return Ok(CancelOutcome::Requested(op));
    }
    sqlx::query(
        "UPDATE operations SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(p.now.0)
    .bind(&p.requested_by)
    .bind(&p.reason)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let op = operation_end(c, ch, policy, id, &Ending::cancelled(), p.now).await?;
    Ok(CancelOutcome::CancelledNow(op))
}

/// Up to `$3` of one tenant's (`TENANT`'s) ready tasks of the claimed kinds
/// (`$1`) available at `$2`, oldest first, locked. Each kind is read from
/// the head of its own index range (a claim reads about as many rows as it
/// takes, however many are queued), then the oldest across kinds are
/// taken. Rows other claimers hold are skipped, not waited for; the few
/// extra rows locked are released at commit. The row's `ctid` is what
/// `lease_tasks` updates it by: stable while the row is locked, and a plan
/// that cannot turn into a scan of the table (keyed by `operation_id =
/// ANY(…)`, the planner read every queued task to lease 64). The picked
/// rows' operations are looked up one by one (a LATERAL with a LIMIT is
/// never turned into a join): the generic plan, the LIMIT unknown, had
/// hash-joined every stored operation.
macro_rules! pick_ready_sql {
    ($tenant:literal) => {
        concat!(
            "SELECT p.operation_id, p.seq, p.ctid::TEXT AS ctid, o.deadline_at, o.state = 'queued' AS was_queued
               FROM (SELECT t.operation_id, t.seq, t.ctid
                       FROM unnest($1::TEXT[]) AS k(kind)
                      CROSS JOIN LATERAL (
                            SELECT operation_id, seq, ctid FROM tasks
                             WHERE status = 'ready' AND tenant = ",
            $tenant,
            " AND kind = k.kind AND available_at <= $2
                             ORDER BY seq LIMIT $3 FOR UPDATE SKIP LOCKED) t
                      ORDER BY t.seq LIMIT $3) p
              CROSS JOIN LATERAL (SELECT deadline_at, state FROM operations WHERE id = p.operation_id LIMIT 1) o"
        )
    };
}

/// The tenants with ready work, least recently served first, each with
/// up to `max_tasks` of its ready tasks picked and locked (`pick_ready_sql`)
/// unless it is capped: one round trip for what had taken one for the
/// tenants and one per tenant.
async fn tenants_with_ready_work(c: &mut PgConnection, p: &ClaimParams) -> Result<Vec<ReadyTenant>> {
    // A capped tenant's rows are not read here (the one-time filter on
    // `max_running`): they are picked after its cap was checked.
    let rows = sqlx::query(concat!(
        "WITH RECURSIVE ready(tenant) AS (
             SELECT MIN(tenant) FROM tasks WHERE status = 'ready'
             UNION ALL
             SELECT (SELECT MIN(tenant) FROM tasks WHERE status = 'ready' AND tenant > ready.tenant)
               FROM ready WHERE ready.tenant IS NOT NULL
         ), served AS (
             SELECT ready.tenant, t.max_running, COALESCE(d.last_claimed, 0) AS last_claimed
               FROM ready
               LEFT JOIN tenants t ON t.name = ready.tenant
               LEFT JOIN tenant_dispatch d ON d.tenant = ready.tenant
              WHERE ready.tenant IS NOT NULL
         )
         SELECT s.tenant, s.max_running, picked.operation_id, picked.ctid, picked.deadline_at, picked.was_queued
           FROM served s
           LEFT JOIN LATERAL (",
        pick_ready_sql!("s.tenant"),
        ") picked ON s.max_running IS NULL
          ORDER BY s.last_claimed, s.tenant, picked.seq"
    ))
    .bind(&p.kinds)
    .bind(p.now.0)
    .bind(i64::from(p.max_tasks))
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut tenants: Vec<ReadyTenant> = Vec::new();
    for r in &rows {
        let tenant: String = r.try_get(0).map_err(db)?;
        if tenants.last().is_none_or(|last| last.tenant != tenant) {
            tenants.push(ReadyTenant {
                tenant: tenant.clone(),
                max_running: r.try_get(1).map_err(db)?,
                picked: std::collections::VecDeque::new(),
            });
        }
        if r.try_get::<Option<String>, _>(2).map_err(db)?.is_none() {
            continue;
        }
        let last = tenants.last_mut().expect("pushed above");
        last.picked.push_back(picked_from_row(tenant, r, 2)?);
    }
    Ok(tenants)
}

/// A tenant with ready work, least recently served first, and what was
/// picked for it (nothing yet for a capped tenant).
struct ReadyTenant {
    tenant: String,
    max_running: Option<i64>,
    picked: std::collections::VecDeque<Picked>,
}

/// Picks up to `allowance` of `tenant`'s ready tasks (`pick_ready_sql`).
async fn pick_ready(
    c: &mut PgConnection,
    p: &ClaimParams,
    tenant: &str,
    allowance: i64,
) -> Result<std::collections::VecDeque<Picked>> {
    let rows = sqlx::query(concat!(
        "SELECT operation_id, ctid, deadline_at, was_queued FROM (",
        pick_ready_sql!("$4"),
        ") picked ORDER BY seq"
    ))
    .bind(&p.kinds)
    .bind(p.now.0)
    .bind(allowance)
    .bind(tenant)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter().map(|r| picked_from_row(tenant.to_owned(), r, 0)).collect()
}

/// A ready task picked for a claim, with what leasing it needs to know.
struct Picked {
    tenant: String,
    operation_id: String,
    /// The locked row's place in `tasks`.
    ctid: String,
    deadline_at: Option<i64>,
    was_queued: bool,
}

/// The `Picked` in the columns `from..from + 4` of `r` (operation id,
/// ctid, deadline, whether it was queued).
fn picked_from_row(tenant: String, r: &PgRow, from: usize) -> Result<Picked> {
    Ok(Picked {
        tenant,
        operation_id: r.try_get(from).map_err(db)?,
        ctid: r.try_get(from + 1).map_err(db)?,
        deadline_at: r.try_get(from + 2).map_err(db)?,
        was_queued: r.try_get(from + 3).map_err(db)?,
    })
}

async fn task_claim(c: &mut PgConnection, ch: &mut Changes, policy: Policy, p: &ClaimParams) -> Result<Vec<Task>> {
    if p.kinds.is_empty() || p.max_tasks == 0 {
        return Ok(Vec::new());
    }
    let want = p.max_tasks as usize;
    let mut queues: Vec<std::collections::VecDeque<Picked>> = Vec::new();
    let tenants = tenants_with_ready_work(c, p).await?;
    let record_order = records_served_order(tenants.len());
    for ReadyTenant {
        tenant,
        max_running,
        picked,
    } in tenants
    {
        let heads = match max_running {
            None => picked,
            Some(max_running) => {
                // Nodes claiming for the same capped tenant take turns, so
                // together they never exceed max_running.
                sqlx::query("SELECT 1 FROM tenants WHERE name = $1 FOR UPDATE")
                    .bind(&tenant)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                let running: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE tenant = $1 AND status = 'leased'")
                        .bind(&tenant)
                        .fetch_one(&mut *c)
                        .await
                        .map_err(db)?;
                let allowance = (want as i64).min(max_running - running);
                if allowance <= 0 {
                    continue;
                }
                pick_ready(c, p, &tenant, allowance).await?
            }
        };
        if !heads.is_empty() {
            queues.push(heads);
        }
    }
    // Round-robin over the tenants, least recently served first.
    let mut picked: Vec<Picked> = Vec::with_capacity(want);
    while picked.len() < want && !queues.is_empty() {
        queues.retain_mut(|queue| {
            if picked.len() < want
                && let Some(task) = queue.pop_front()
            {
                picked.push(task);
            }
            !queue.is_empty()
        });
    }
    // A queued operation whose deadline passed is never started.
    let (expired, live): (Vec<Picked>, Vec<Picked>) = picked
        .into_iter()
        .partition(|task| task.deadline_at.is_some_and(|d| d <= p.now.0));
    let ending = Ending::failed(deadline_error_before_start());
    let endings: Vec<(&str, &Ending, Timestamp)> = expired
        .iter()
        .map(|task| (task.operation_id.as_str(), &ending, p.now))
        .collect();
    operations_end(c, ch, policy, &endings).await?;
    if live.is_empty() {
        return Ok(Vec::new());
    }
    let tasks = lease_tasks(c, ch, p, &live).await?;
    if !record_order {
        return Ok(tasks);
    }
    let mut served: Vec<&str> = Vec::new();
    for task in &live {
        if !served.contains(&task.tenant.as_str()) {
            served.push(&task.tenant);
        }
    }
    sqlx::query(
        "INSERT INTO tenant_dispatch (tenant, last_claimed)
         SELECT tenant, nextval('tenant_dispatch_order') FROM unnest($1::TEXT[]) WITH ORDINALITY AS s(tenant, n)
          ORDER BY n
         ON CONFLICT (tenant) DO UPDATE SET last_claimed = excluded.last_claimed",
    )
    .bind(&served)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(tasks)
}

/// Leases the picked tasks and starts their operations in one statement,
/// then records their `started` events in one more: a claim's cost does not
/// grow by a round trip per task.
async fn lease_tasks(c: &mut PgConnection, ch: &mut Changes, p: &ClaimParams, picked: &[Picked]) -> Result<Vec<Task>> {
    let lease_expires_at = p.now.plus(p.lease);
    let ctids: Vec<&str> = picked.iter().map(|t| t.ctid.as_str()).collect();
    let ids: Vec<&str> = picked.iter().map(|t| t.operation_id.as_str()).collect();
    // By the rows' places alone (a TID scan): the picked rows are locked
    // (FOR UPDATE in `task_claim`) and so still ready and where they were.
    // Keyed by `operation_id = ANY(…)` the planner, its statistics taken
    // while the queue was short, chose a scan of the whole table (with
    // `status = 'ready'`, of the partial index): auto_explain showed 20,000
    // rows read to lease 64, 13 ms a claim, growing with the queue.
    // Each lease's token is drawn here (`gen_random_uuid`, 122 random bits
    // from the server's strong random source): matching tokens sent along
    // to rows by `array_position($1::TID[], ctid)` cast the whole array
    // again for every row on the generic plan (perf: `tidin`, `array_map`
    // and `strtoull` under the lease), 2.5–7 ms of a claim of 200–400.
    // The operations are found by id and their liveness asked of the pair,
    // as in `operations_end_guarded` (the same statistics made the planner
    // read every live operation for each claim).
    let rows = sqlx::query(&format!(
        "WITH t AS (UPDATE tasks SET status = 'leased', lease_expires_at = $2, worker_id = $3, lease_ms = $4,
                                     lease_token = replace(gen_random_uuid()::TEXT, '-', '')
                      WHERE ctid = ANY($1::TID[])
                 RETURNING operation_id AS op_id, lease_token AS token)
         UPDATE operations
            SET state = 'running', attempt = GREATEST(attempt, 1), started_at = COALESCE(started_at, $5),
                version = version + 1, updated_at = $5
           FROM t
          WHERE operations.id = ANY($6::TEXT[]) AND operations.id = t.op_id
            AND (t.token IS NULL OR operations.state IN ('queued', 'running'))
      RETURNING {OP_COLUMNS}, t.token, operations.checkpoint"
    ))
    .bind(&ctids)
    .bind(lease_expires_at.0)
    .bind(&p.worker_id)
    .bind(lease_ms(p.lease))
    .bind(p.now.0)
    .bind(&ids)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut started: std::collections::HashMap<String, (Operation, String, Option<Value>)> =
        std::collections::HashMap::new();
    for row in &rows {
        let op = operation_from_row(row)?;
        let token: String = row.try_get(OP_COLUMN_COUNT).map_err(db)?;
        let checkpoint = json_text(row.try_get(OP_COLUMN_COUNT + 1).map_err(db)?)?;
        started.insert(op.id.as_str().to_owned(), (op, token, checkpoint));
    }
    // In pick order (fair across tenants), as the claimer gets them.
    let mut leased = Vec::with_capacity(started.len());
    for pick in picked {
        if let Some((op, token, checkpoint)) = started.remove(&pick.operation_id) {
            if pick.was_queued {
                outbox_insert(c, &op).await?;
            }
            leased.push((op, token, pick.deadline_at, checkpoint));
        }
    }
    let events: Vec<(&Operation, &str, Value)> = leased
        .iter()
        .map(|(op, ..)| (op, "started", json!({"attempt": op.attempt, "worker_id": p.worker_id})))
        .collect();
    events_insert(c, ch, &events).await?;
    let tasks = leased
        .into_iter()
        .map(|(op, lease_token, deadline_at, checkpoint)| Task {
            operation_id: op.id,
            tenant: op.tenant,
            kind: op.kind,
            input: op.input.unwrap_or(Value::Null),
            attempt: op.attempt,
            lease_token,
            lease_expires_at,
            deadline_at: ts(deadline_at),
            budget_max_cost: op.budget_max_cost,
            checkpoint,
        })
        .collect();
    Ok(tasks)
}

/// Records events, each with the representation at its version, and notes
/// them as changes to announce; many in one statement.
async fn events_insert(c: &mut PgConnection, ch: &mut Changes, events: &[(&Operation, &str, Value)]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(events.len());
    let (mut versions, mut types, mut states, mut ats) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut data, mut snapshots) = (Vec::new(), Vec::new());
    for (op, event_type, d) in events {
        ids.push(op.id.as_str());
        versions.push(op.version);
        types.push(*event_type);
        states.push(op.state.as_str());
        ats.push(op.updated_at.0);
        data.push(d.to_string());
        snapshots.push(snapshot_text(op));
    }
    for (op, event_type, _) in events {
        ch.record(op, event_type);
    }
    // What the transaction changed so far is announced by the same
    // statement: most transactions record their last change here, and then
    // the commit sends no NOTIFY statement of its own (a round trip less).
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO operation_events (operation_id, version, type, state, at, data, snapshot)
             SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[], $6::TEXT[], $7::TEXT[]))
         SELECT pg_notify($8, payload) FROM unnest($9::TEXT[]) AS p(payload)",
    )
    .bind(&ids)
    .bind(&versions)
    .bind(&types)
    .bind(&states)
    .bind(&ats)
    .bind(&data)
    .bind(&snapshots)
    .bind(CHANNEL)
    .bind(ch.unannounced_payloads())
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

async fn fenced(c: &mut PgConnection, operation_id: &Id, lease_token: &str) -> Result<Fenced> {
    fenced_many(c, &[(operation_id.as_str(), lease_token)], Lock::ForUpdate)
        .await?
        .remove(&(operation_id.as_str().to_owned(), lease_token.to_owned()))
        .ok_or(StoreError::LeaseLost)
}

/// Whether `fenced_many` locks what it reads.
#[derive(Clone, Copy, PartialEq)]
enum Lock {
    /// Read only: what was read may change before the transaction writes.
    None,
    /// Locked until the transaction ends.
    ForUpdate,
}

/// The fenced rows of many leases in one statement, keyed by operation id
/// and lease token: only the current holders' tasks are found; with
/// `Lock::ForUpdate` they are locked (in id order, so concurrent batches
/// cannot deadlock) until the transaction ends. Each lease is looked up by
/// its task's primary key (a LATERAL with a LIMIT, never a join the planner
/// could turn into a scan of every leased task; its other conditions are
/// outside it, or the planner, its statistics taken before anything was
/// leased, read every leased task through the partial index instead).
async fn fenced_many(
    c: &mut PgConnection,
    leases: &[(&str, &str)],
    lock: Lock,
) -> Result<std::collections::HashMap<(String, String), Fenced>> {
    // Sorted by id: the locking variant locks in this order.
    let mut leases = leases.to_vec();
    leases.sort_unstable();
    let (ids, tokens): (Vec<&str>, Vec<&str>) = leases.into_iter().unzip();
    macro_rules! fenced_sql {
        ($lock:literal) => {
            concat!(
                "SELECT o.version, o.progress, o.cost_units, o.cancellable, o.cancel_requested_at IS NOT NULL,
                        o.cancel_reason, o.cancel_requested_by, o.attempt, COALESCE(k.max_attempts, 1),
                        o.budget_max_cost, COALESCE(t.lease_ms, 30000), t.operation_id, t.lease_token,
                        o.pause_requested_at IS NOT NULL
                   FROM unnest($1::TEXT[], $2::TEXT[]) WITH ORDINALITY AS f(op_id, token, n)
                  CROSS JOIN LATERAL (
                        SELECT operation_id, lease_token, lease_ms, status FROM tasks
                         WHERE operation_id = f.op_id LIMIT 1 ",
                $lock,
                ") t
                  CROSS JOIN LATERAL (
                        SELECT version, progress, cost_units, cancellable, cancel_requested_at, cancel_reason,
                               cancel_requested_by, attempt, budget_max_cost, pause_requested_at, kind, state
                          FROM operations WHERE id = f.op_id LIMIT 1 ",
                $lock,
                ") o
                   LEFT JOIN kinds k ON k.name = o.kind
                  WHERE t.lease_token = f.token AND t.status = 'leased' AND o.state = 'running'
                  ORDER BY f.n"
            )
        };
    }
    let rows = sqlx::query(match lock {
        Lock::ForUpdate => fenced_sql!("FOR UPDATE"),
        Lock::None => fenced_sql!(""),
    })
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let fenced = Fenced {
                version: row.try_get(0).map_err(db)?,
                progress: json_text(row.try_get(1).map_err(db)?)?.map(|v| progress_from_json(&v)),
                cost_units: row.try_get(2).map_err(db)?,
                cancellable: row.try_get(3).map_err(db)?,
                cancel_requested: row.try_get(4).map_err(db)?,
                cancel_reason: row.try_get(5).map_err(db)?,
                cancel_requested_by: row.try_get(6).map_err(db)?,
                attempt: row.try_get(7).map_err(db)?,
                max_attempts: row.try_get(8).map_err(db)?,
                budget_max_cost: row.try_get(9).map_err(db)?,
                lease_ms: row.try_get(10).map_err(db)?,
                pause_requested: row.try_get(13).map_err(db)?,
            };
            Ok(((row.try_get(11).map_err(db)?, row.try_get(12).map_err(db)?), fenced))
        })
        .collect()
}

/// The fenced rows of a batch of outcomes, in the batch's order: `None`
/// where the lease is not (or no longer) held, and for a second outcome
/// with the same lease in one batch, which finds it already used.
async fn fenced_outcomes(c: &mut PgConnection, batch: &[&FinishParams], lock: Lock) -> Result<Vec<Option<Fenced>>> {
    let leases: Vec<(&str, &str)> = batch
        .iter()
        .map(|p| (p.operation_id.as_str(), p.lease_token.as_str()))
        .collect();
    let mut found = fenced_many(c, &leases, lock).await?;
    Ok(leases
        .into_iter()
        .map(|(id, token)| found.remove(&(id.to_owned(), token.to_owned())))
        .collect())
}

async fn task_heartbeat(c: &mut PgConnection, ch: &mut Changes, p: &HeartbeatParams) -> Result<HeartbeatAck> {
    let current = fenced(c, &p.operation_id, &p.lease_token).await?;
    let lease_expires_at = p
        .now
        .plus(Duration::from_millis(u64::try_from(current.lease_ms).unwrap_or(0)));
    sqlx::query("UPDATE tasks SET lease_expires_at = $2 WHERE operation_id = $1")
        .bind(p.operation_id.as_str())
        .bind(lease_expires_at.0)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    if let Some(checkpoint) = &p.checkpoint {
        // Kept with the operation, not a change of its representation.
        sqlx::query("UPDATE operations SET checkpoint = $2 WHERE id = $1")
            .bind(p.operation_id.as_str())
            .bind(checkpoint.to_string())
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    let effect = heartbeat_effect(&current, p);
    let mut version = current.version;
    if let Some(data) = &effect.event {
        let sql = format!(
            "UPDATE operations SET progress = $2, cost_units = $3, cancellable = $4, version = version + 1, updated_at = $5
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        let updated = update_returning(
            c,
            sqlx::query(&sql)
                .bind(p.operation_id.as_str())
                .bind(effect.progress.as_ref().map(progress_text))
                .bind(effect.cost_units)
                .bind(effect.cancellable)
                .bind(p.now.0),
        )
        .await?
        .ok_or(StoreError::LeaseLost)?;
        version = updated.version;
        event_insert(c, ch, &updated, "progress", data).await?;
    }
    let (mut cancel_requested, mut cancel_reason) = (current.cancel_requested, current.cancel_reason);
    if effect.over_budget {
        let reason = "budget_exhausted";
        version = cancel_request(c, ch, p.operation_id.as_str(), SYSTEM, Some(reason), p.now).await?;
        (cancel_requested, cancel_reason) = (true, Some(reason.to_owned()));
    }
    Ok(HeartbeatAck {
        lease_expires_at,
        cancel_requested,
        cancel_reason,
        pause_requested: current.pause_requested && !cancel_requested,
        version,
    })
}

async fn requeue(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    next_attempt: i64,
    progress: Option<&Progress>,
    now: Timestamp,
    data: &Value,
) -> Result<Operation> {
    let available_at = now.plus(retry_backoff(next_attempt));
    sqlx::query(
        "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL, available_at = $2
          WHERE operation_id = $1",
    )
    .bind(id)
    .bind(available_at.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let sql = format!(
        "UPDATE operations SET attempt = $2, version = version + 1, updated_at = $3, progress = COALESCE($4, progress)
          WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
    );
    let progress = progress.map(progress_text);
    let requeued = update_returning(
        c,
        sqlx::query(&sql).bind(id).bind(next_attempt).bind(now.0).bind(progress),
    )
    .await?
    .ok_or(StoreError::NotFound)?;
    let mut data = data.clone();
    if let Some(fields) = data.as_object_mut() {
        fields.insert("next_attempt".into(), json!(next_attempt));
        fields.insert("available_at".into(), json!(available_at.to_rfc3339()));
    }
    event_insert(c, ch, &requeued, "retry_scheduled", &data).await?;
    Ok(requeued)
}

/// Applies a batch of outcomes with a constant number of statements, most
/// of them without row locks: the fenced rows are read in one statement,
/// what each outcome means decided in Rust (`decide_finish`), and the
/// endings applied by `operations_end_guarded`, each only while its
/// operation is still at the version read. An ending whose operation
/// changed in between, and every outcome that is not an ending (a retry, a
/// pause, a refusal), go through `task_finish_locked`, which reads again
/// under row locks. A stale lease refuses only its own item, before
/// anything is written; a second outcome for one operation in the same
/// batch finds the lease already gone, as it would one batch later.
///
/// Locking every row first (`FOR UPDATE`) had cost each job two WAL
/// records and two more writes of its heap pages (`pg_walinspect` over an
/// in-process drain: 6.9 `Heap/LOCK` records per job).
async fn task_finish_batch(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    batch: &[&FinishParams],
) -> Result<Vec<Result<Operation>>> {
    let seen = fenced_outcomes(c, batch, Lock::None).await?;
    let mut answers: Vec<Option<Result<Operation>>> = (0..batch.len()).map(|_| None).collect();
    let mut ends: Vec<(usize, Ending, i64)> = Vec::new();
    let mut again: Vec<usize> = Vec::new();
    for (i, (p, fenced)) in batch.iter().zip(seen).enumerate() {
        let Some(fenced) = fenced else {
            // A lease, once gone, never comes back.
            answers[i] = Some(Err(StoreError::LeaseLost));
            continue;
        };
        match decide_finish(&fenced, &p.outcome) {
            Ok(Decision::End(ending)) => {
                // The worker's last progress rides the outcome's own change.
                let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
                ends.push((i, ending.with_progress(progress), fenced.version));
            }
            _ => again.push(i),
        }
    }
    // In id order, as the locked path locks: two batches ending the same
    // operations cannot wait for each other.
    ends.sort_by(|a, b| batch[a.0].operation_id.as_str().cmp(batch[b.0].operation_id.as_str()));
    let endings: Vec<(&str, &Ending, Timestamp)> = ends
        .iter()
        .map(|(i, e, _)| (batch[*i].operation_id.as_str(), e, batch[*i].now))
        .collect();
    let versions: Vec<i64> = ends.iter().map(|(_, _, version)| *version).collect();
    let mut ended = operations_end_guarded(c, ch, policy, &endings, &versions).await?;
    for (i, _, _) in &ends {
        match ended.remove(batch[*i].operation_id.as_str()) {
            Some(op) => answers[*i] = Some(Ok(op)),
            None => again.push(*i),
        }
    }
    if !again.is_empty() {
        again.sort_unstable();
        let rest: Vec<&FinishParams> = again.iter().map(|&i| batch[i]).collect();
        for (i, answer) in again.into_iter().zip(task_finish_locked(c, ch, policy, &rest).await?) {
            answers[i] = Some(answer);
        }
    }
    Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect())
}

/// Applies outcomes under row locks: the fenced rows are read and locked
/// (in id order) in one statement, so nothing changes them between the
/// decision and its writes.
async fn task_finish_locked(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    batch: &[&FinishParams],
) -> Result<Vec<Result<Operation>>> {
    let current = fenced_outcomes(c, batch, Lock::ForUpdate).await?;
    let mut answers: Vec<Option<Result<Operation>>> = Vec::with_capacity(batch.len());
    let mut ends: Vec<(usize, &str, Ending)> = Vec::new();
    for (i, (p, fenced)) in batch.iter().zip(current).enumerate() {
        let id = p.operation_id.as_str();
        let Some(fenced) = fenced else {
            answers.push(Some(Err(StoreError::LeaseLost)));
            continue;
        };
        // The worker's last progress rides the outcome's own change.
        let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
        let decision = match decide_finish(&fenced, &p.outcome) {
            Ok(decision) => decision,
            Err(refused) => {
                answers.push(Some(Err(refused)));
                continue;
            }
        };
        match decision {
            Decision::End(ending) => {
                ends.push((i, id, ending.with_progress(progress)));
                answers.push(None);
            }
            Decision::Retry { next_attempt, data } => {
                let requeued = requeue(c, ch, id, next_attempt, progress.as_ref(), p.now, &data).await?;
                answers.push(Some(Ok(requeued)));
            }
            Decision::Pause {
                attempt,
                checkpoint,
                data,
            } => {
                let paused = operation_pause(
                    c,
                    ch,
                    id,
                    Some(attempt),
                    progress.as_ref(),
                    checkpoint.as_ref(),
                    &data,
                    p.now,
                )
                .await?;
                answers.push(Some(Ok(paused)));
            }
        }
    }
    let endings: Vec<(&str, &Ending, Timestamp)> = ends.iter().map(|(i, id, e)| (*id, e, batch[*i].now)).collect();
    let mut ended = operations_end(c, ch, policy, &endings).await?;
    for (i, id, _) in &ends {
        answers[*i] = Some(ended.remove(*id).ok_or(StoreError::LeaseLost));
    }
    Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect())
}

async fn task_reap(c: &mut PgConnection, ch: &mut Changes, policy: Policy, p: &ReapParams) -> Result<ReapCounts> {
    let rows = sqlx::query(
        "SELECT t.operation_id, o.attempt, o.cancel_requested_at IS NOT NULL, o.cancel_requested_by, o.cancel_reason,
                COALESCE(k.rerun_safe, FALSE), COALESCE(k.max_attempts, 1), o.pause_requested_at IS NOT NULL
           FROM tasks t
           JOIN operations o ON o.id = t.operation_id
           LEFT JOIN kinds k ON k.name = t.kind
          WHERE t.status = 'leased' AND t.lease_expires_at < $1
          ORDER BY t.lease_expires_at LIMIT $2
          FOR UPDATE OF t, o SKIP LOCKED",
    )
    .bind(p.now.0)
    .bind(i64::from(p.limit))
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut counts = ReapCounts::default();
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let task = Lapsed {
            attempt: r.try_get(1).map_err(db)?,
            cancel_requested: r.try_get(2).map_err(db)?,
            cancel_requested_by: r.try_get(3).map_err(db)?,
            cancel_reason: r.try_get(4).map_err(db)?,
            rerun_safe: r.try_get(5).map_err(db)?,
            max_attempts: r.try_get(6).map_err(db)?,
            pause_requested: r.try_get(7).map_err(db)?,
        };
        let decision = decide_reap(&task);
        match &decision {
            Decision::End(ending) => operation_end(c, ch, policy, &id, ending, p.now).await?,
            Decision::Retry { next_attempt, data } => requeue(c, ch, &id, *next_attempt, None, p.now, data).await?,
            Decision::Pause { attempt, data, .. } => {
                operation_pause(c, ch, &id, Some(*attempt), None, None, data, p.now).await?
            }
        };
        counts.count(&task, &decision);
    }
    Ok(counts)
}

async fn operation_update(c: &mut PgConnection, ch: &mut Changes, p: &UpdateParams) -> Result<Operation> {
    let op = lock_operation(c, &p.tenant, &p.id).await?;
    let Some(change) = crate::shared::decide_update(&op, p)? else {
        return Ok(op);
    };
    let labels_json = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let sql = format!(
        "UPDATE operations SET deadline_at = $2, labels = $3, version = version + 1, updated_at = $4
          WHERE id = $1 AND state IN ('queued', 'running') RETURNING {OP_COLUMNS}"
    );
    let updated = update_returning(
        c,
        sqlx::query(&sql)
            .bind(p.id.as_str())
            .bind(change.deadline_at.map(|t| t.0))
            .bind(labels_json)
            .bind(p.now.0),
    )
    .await?
    .ok_or(StoreError::NotFound)?;
    event_insert(c, ch, &updated, "updated", &change.data).await?;
    Ok(updated)
}

/// The rows of `sql`, a query of two numbers (an instant and a limit, as
/// the maintenance passes ask).
async fn rows_of(c: &mut PgConnection, sql: &str, a: i64, b: i64) -> Result<Vec<PgRow>> {
    sqlx::query(sql).bind(a).bind(b).fetch_all(&mut *c).await.map_err(db)
}

/// The first column of [`rows_of`], text.
async fn ids(c: &mut PgConnection, sql: &str, a: i64, b: i64) -> Result<Vec<String>> {
    let rows = rows_of(c, sql, a, b).await?;
    rows.iter().map(|r| r.try_get::<String, _>(0).map_err(db)).collect()
}

async fn deadline_enforce(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    p: &EnforceParams,
) -> Result<EnforceCounts> {
    let mut counts = EnforceCounts::default();
    let limit = i64::from(p.limit);
    let waiting = ids(
        c,
        "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
          WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= $1 AND o.state IN ('queued', 'running') AND t.status = 'ready'
          ORDER BY o.deadline_at LIMIT $2 FOR UPDATE OF o, t SKIP LOCKED",
        p.now.0,
        limit,
    )
    .await?;
    for id in waiting {
        let queued = operation_by_id(c, &id)
            .await?
            .is_some_and(|op| op.state == State::Queued);
        let error = if queued {
            deadline_error_before_start()
        } else {
            failing_cancel(Some(SYSTEM), Some("deadline_exceeded")).expect("a failing reason")
        };
        operation_end(c, ch, policy, &id, &Ending::failed(error), p.now).await?;
        counts.expired_before_start += 1;
    }
    let running = ids(
        c,
        "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
          WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= $1 AND o.state IN ('queued', 'running')
            AND t.status = 'leased' AND o.cancel_requested_at IS NULL AND o.cancellable
          ORDER BY o.deadline_at LIMIT $2 FOR UPDATE OF o, t SKIP LOCKED",
        p.now.0,
        limit,
    )
    .await?;
    for id in running {
        cancel_request(c, ch, &id, SYSTEM, Some("deadline_exceeded"), p.now).await?;
        counts.cancel_requested += 1;
    }
    let cutoff = p.now.minus(p.grace);
    let rows = sqlx::query(
        "SELECT id, cancel_reason FROM operations
          WHERE state = 'running' AND cancel_requested_by = 'system' AND cancel_requested_at <= $1
          ORDER BY cancel_requested_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(cutoff.0)
    .bind(limit)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let reason: Option<String> = r.try_get(1).map_err(db)?;
        let error = failing_cancel(Some(SYSTEM), reason.as_deref()).unwrap_or_else(|| OperationError {
            code: "deadline_exceeded".into(),
            message: "the operation's deadline passed".into(),
            retryable: false,
        });
        operation_end(c, ch, policy, &id, &Ending::failed(error), p.now).await?;
        counts.ended_without_ack += 1;
    }
    // Asked to pause and not paused within the grace period: the work goes
    // on, and the history says the request was not honoured.
    let rows = sqlx::query(
        "SELECT id, pause_requested_at FROM operations
          WHERE state = 'running' AND pause_requested_at <= $1
          ORDER BY pause_requested_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(cutoff.0)
    .bind(limit)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let requested_at: i64 = r.try_get(1).map_err(db)?;
        let sql = format!(
            "UPDATE operations SET pause_requested_at = NULL, version = version + 1, updated_at = $2
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        let query = sqlx::query(&sql).bind(&id).bind(p.now.0);
        let withdrawn = update_returning(c, query).await?.ok_or(StoreError::NotFound)?;
        let data = pause_not_honoured_data(Timestamp(requested_at), p.grace);
        event_insert(c, ch, &withdrawn, "pause_not_honoured", &data).await?;
        counts.pause_not_honoured += 1;
    }
    Ok(counts)
}

fn api_key_from_row(r: &PgRow) -> Result<ApiKeyRecord> {
    let role: String = r.try_get(2).map_err(db)?;
    Ok(ApiKeyRecord {
        id: Id::from_trusted(r.try_get(0).map_err(db)?),
        tenant: r.try_get(1).map_err(db)?,
        role: longrun_core::apikey::Role::parse(&role)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown role {role}")))?,
        secret_hash: r.try_get(3).map_err(db)?,
        created_at: Timestamp(r.try_get(4).map_err(db)?),
        revoked_at: ts(r.try_get(5).map_err(db)?),
    })
}

fn kind_from_row(r: &PgRow) -> Result<KindSpec> {
    Ok(KindSpec {
        name: r.try_get(0).map_err(db)?,
        builtin: r.try_get(1).map_err(db)?,
        rerun_safe: r.try_get(2).map_err(db)?,
        max_attempts: r.try_get(3).map_err(db)?,
        default_deadline_seconds: r.try_get(4).map_err(db)?,
        max_deadline_seconds: r.try_get(5).map_err(db)?,
        pausable: r.try_get(6).map_err(db)?,
    })
}

const KIND_COLUMNS: &str =
    "name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds, pausable";
const RESULT_COLUMNS: &str =
    "id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state, created_at, expires_at, name";

fn result_from_row(r: &PgRow) -> Result<ResultRecord> {
    Ok(ResultRecord {
        id: Id::from_trusted(r.try_get(0).map_err(db)?),
        operation_id: Id::from_trusted(r.try_get(1).map_err(db)?),
        tenant: r.try_get(2).map_err(db)?,
        storage_key: r.try_get(3).map_err(db)?,
        content_type: r.try_get(4).map_err(db)?,
        size_bytes: r.try_get(5).map_err(db)?,
        sha256: r.try_get(6).map_err(db)?,
        state: r.try_get(7).map_err(db)?,
        created_at: Timestamp(r.try_get(8).map_err(db)?),
        expires_at: ts(r.try_get(9).map_err(db)?),
        name: r.try_get(10).map_err(db)?,
    })
}

async fn webhook_attempt(c: &mut PgConnection, p: &AttemptParams) -> Result<()> {
    let attempt = crate::shared::attempt_row(&p.outcome);
    let row = sqlx::query(
        "UPDATE webhook_deliveries SET status = $2, attempts = $3, next_attempt_at = $4, lease_until = NULL
          WHERE event_id = $1 AND status = 'pending' RETURNING operation_id, type",
    )
    .bind(p.event_id.as_str())
    .bind(attempt.status)
    .bind(p.attempt)
    .bind(attempt.next_attempt_at)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?
    .ok_or(StoreError::NotFound)?;
    let operation_id: String = row.try_get(0).map_err(db)?;
    let event_type: String = row.try_get(1).map_err(db)?;
    sqlx::query(
        "INSERT INTO webhook_attempts (event_id, attempt, operation_id, type, at, status_code, error, next_attempt_at, latency_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
    )
    .bind(p.event_id.as_str())
    .bind(p.attempt)
    .bind(operation_id)
    .bind(event_type)
    .bind(p.now.0)
    .bind(attempt.status_code.map(i32::from))
    .bind(attempt.error)
    .bind(attempt.next_attempt_at)
    .bind(p.latency_ms)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

async fn operation_remove(c: &mut PgConnection, ch: &mut Changes, id: &str, now: Timestamp) -> Result<()> {
    ch.touch(id);
    sqlx::query(
        "INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, $2 FROM results WHERE operation_id = $1 AND state <> 'expired' ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    pieces_drop(c, id, None, None, now).await?;
    for sql in [
        "DELETE FROM results WHERE operation_id = $1",
        "DELETE FROM operation_uploads WHERE operation_id = $1",
        "DELETE FROM operation_events WHERE operation_id = $1",
        "DELETE FROM webhook_attempts WHERE operation_id = $1",
        "DELETE FROM webhook_deliveries WHERE operation_id = $1",
        "DELETE FROM tasks WHERE operation_id = $1",
        "DELETE FROM operations WHERE id = $1",
    ] {
        sqlx::query(sql).bind(id).execute(&mut *c).await.map_err(db)?;
    }
    Ok(())
}

async fn retention_sweep(c: &mut PgConnection, ch: &mut Changes, p: &RetentionParams) -> Result<RetentionCounts> {
    let mut counts = RetentionCounts::default();
    let (now, limit) = (p.now.0, i64::from(p.limit));
    let rows = rows_of(
        c,
        "SELECT id, storage_key FROM results WHERE state = 'published' AND expires_at <= $1
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let key: String = r.try_get(1).map_err(db)?;
        sqlx::query("UPDATE results SET state = 'expired' WHERE id = $1")
            .bind(id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query("INSERT INTO artifact_garbage (storage_key, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        counts.results_expired += 1;
    }
    let rows = rows_of(
        c,
        "SELECT id, tenant, expires_at, kind, idempotency_key FROM operations
          WHERE expires_at IS NOT NULL AND expires_at <= $1
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let tenant: String = r.try_get(1).map_err(db)?;
        // The tombstone window counts from the expiry, when readers began to
        // see the operation gone, not from when this sweep got to it.
        let expired_at: i64 = r.try_get(2).map_err(db)?;
        let kind: String = r.try_get(3).map_err(db)?;
        let key: Option<String> = r.try_get(4).map_err(db)?;
        let until = Timestamp(expired_at).plus(p.tombstone_retention).0;
        operation_remove(c, ch, &id, p.now).await?;
        // The tombstone keeps the key of the idempotency record it outlives,
        // which its burial deletes.
        sqlx::query(
            "INSERT INTO tombstones (operation_id, tenant, removed_at, expires_at, kind, idempotency_key)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (operation_id) DO UPDATE SET removed_at = excluded.removed_at, expires_at = excluded.expires_at,
                                                      kind = excluded.kind, idempotency_key = excluded.idempotency_key",
        )
        .bind(&id)
        .bind(tenant)
        .bind(expired_at)
        .bind(until)
        .bind(kind)
        .bind(key)
        .execute(&mut *c)
        .await
        .map_err(db)?;
        counts.operations_removed += 1;
    }
    // Tombstones past their window, and the idempotency records they kept,
    // in one statement: the id is forgotten, its key freed.
    let buried: i64 = sqlx::query_scalar(
        "WITH buried AS (
             DELETE FROM tombstones WHERE operation_id IN (
                 SELECT operation_id FROM tombstones WHERE expires_at <= $1
                  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING operation_id, tenant, kind, idempotency_key),
         freed AS (
             DELETE FROM idempotency_keys k USING buried b
              WHERE k.tenant = b.tenant AND k.kind = b.kind AND k.key = b.idempotency_key
                AND k.operation_id = b.operation_id)
         SELECT count(*) FROM buried",
    )
    .bind(now)
    .bind(limit)
    .fetch_one(&mut *c)
    .await
    .map_err(db)?;
    counts.tombstones_removed += u64::try_from(buried).unwrap_or(0);
    let cutoff = p.now.minus(p.delivery_retention).0;
    let finished = ids(
        c,
        "SELECT event_id FROM webhook_deliveries WHERE status <> 'pending' AND created_at <= $1
          ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        cutoff,
        limit,
    )
    .await?;
    for event_id in finished {
        sqlx::query("DELETE FROM webhook_attempts WHERE event_id = $1")
            .bind(&event_id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM webhook_deliveries WHERE event_id = $1")
            .bind(&event_id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        counts.deliveries_removed += 1;
    }
    let unused = ids(
        c,
        "SELECT id FROM uploads WHERE expires_at <= $1
            AND NOT EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for id in unused {
        upload_drop(c, &id, p.now).await?;
        counts.uploads_removed += 1;
    }
    Ok(counts)
}

/// Deletes an upload's row; its objects become garbage.
async fn upload_drop(c: &mut PgConnection, id: &str, now: Timestamp) -> Result<()> {
    let chunks: Option<String> = sqlx::query_scalar("DELETE FROM uploads WHERE id = $1 RETURNING chunks")
        .bind(id)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let keys: Vec<String> = chunks_from_json(chunks.as_deref().unwrap_or("[]"))
        .into_iter()
        .map(|chunk| chunk.storage_key)
        .collect();
    garbage_insert(c, &keys, now).await
}

async fn garbage_insert(c: &mut PgConnection, keys: &[String], now: Timestamp) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO artifact_garbage (storage_key, created_at) SELECT unnest($1::TEXT[]), $2 ON CONFLICT DO NOTHING",
    )
    .bind(keys)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

const UPLOAD_COLUMNS: &str = "id, tenant, content_type, upload_offset, complete, sha256, expected_sha256, chunks,
    created_at, expires_at, EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)";

fn upload_from_row(r: &PgRow) -> Result<UploadRecord> {
    let chunks: String = r.try_get(7).map_err(db)?;
    Ok(UploadRecord {
        id: Id::from_trusted(r.try_get(0).map_err(db)?),
        tenant: r.try_get(1).map_err(db)?,
        content_type: r.try_get(2).map_err(db)?,
        offset: r.try_get(3).map_err(db)?,
        complete: r.try_get(4).map_err(db)?,
        sha256: r.try_get(5).map_err(db)?,
        expected_sha256: r.try_get(6).map_err(db)?,
        chunks: chunks_from_json(&chunks),
        created_at: Timestamp(r.try_get(8).map_err(db)?),
        expires_at: Timestamp(r.try_get(9).map_err(db)?),
        referenced: r.try_get(10).map_err(db)?,
    })
}

/// The tenant's upload, locked for an update when `lock`.
async fn upload_row(c: &mut PgConnection, tenant: &str, id: &Id, lock: bool) -> Result<Option<UploadRecord>> {
    let lock = if lock { "FOR UPDATE" } else { "" };
    let row = sqlx::query(&format!(
        "SELECT {UPLOAD_COLUMNS} FROM uploads WHERE id = $1 AND tenant = $2 {lock}"
    ))
    .bind(id.as_str())
    .bind(tenant)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    row.as_ref().map(upload_from_row).transpose()
}

async fn upload_store(c: &mut PgConnection, u: &UploadRecord) -> Result<()> {
    sqlx::query(
        "UPDATE uploads SET upload_offset = $2, complete = $3, sha256 = $4, expected_sha256 = $5, chunks = $6
          WHERE id = $1",
    )
    .bind(u.id.as_str())
    .bind(u.offset)
    .bind(u.complete)
    .bind(&u.sha256)
    .bind(&u.expected_sha256)
    .bind(chunks_to_json(&u.chunks))
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

/// Drops the piece rows of `operation_id` (of `name`, at or past `from`,
/// when given); each object becomes garbage once no row names it, unless
/// it is `keep` (a single piece that became the result itself).
async fn pieces_drop(
    c: &mut PgConnection,
    operation_id: &str,
    only: Option<(&str, i64)>,
    keep: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let (name, from) = only.map_or((None, 0), |(n, f)| (Some(n), f));
    sqlx::query(
        "WITH gone AS (DELETE FROM artifact_pieces
                        WHERE operation_id = $1 AND ($2::TEXT IS NULL OR name = $2) AND piece_offset >= $3
                    RETURNING storage_key)
         INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT DISTINCT storage_key, $4 FROM gone
          WHERE storage_key IS DISTINCT FROM $5
            AND NOT EXISTS (SELECT 1 FROM artifact_pieces p
                             WHERE p.storage_key = gone.storage_key AND p.operation_id <> $1)
         ON CONFLICT DO NOTHING",
    )
    .bind(operation_id)
    .bind(name)
    .bind(from)
    .bind(now.0)
    .bind(keep)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}

async fn pieces_of(c: &mut PgConnection, operation_id: &str, name: &str) -> Result<Vec<(i64, UploadChunk)>> {
    let rows = sqlx::query(
        "SELECT piece_offset, storage_key, size_bytes FROM artifact_pieces
          WHERE operation_id = $1 AND name = $2 ORDER BY piece_offset",
    )
    .bind(operation_id)
    .bind(name)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(db)?,
                UploadChunk {
                    storage_key: r.try_get(1).map_err(db)?,
                    size_bytes: r.try_get(2).map_err(db)?,
                },
            ))
        })
        .collect()
}

async fn tenant_delete(
    c: &mut PgConnection,
    ch: &mut Changes,
    tenant: &str,
    now: Timestamp,
) -> Result<TenantDeleteCounts> {
    let mut counts = TenantDeleteCounts::default();
    let rows = sqlx::query("SELECT id FROM operations WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let op_ids: Vec<String> = rows.iter().map(|r| r.try_get(0).map_err(db)).collect::<Result<_>>()?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    counts.results = count(
        sqlx::query_scalar("SELECT COUNT(*) FROM results WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?,
    );
    counts.deliveries = count(
        sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?,
    );
    for id in &op_ids {
        operation_remove(c, ch, id, now).await?;
    }
    counts.operations = op_ids.len() as u64;
    let uploads: Vec<String> = sqlx::query_scalar("SELECT id FROM uploads WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    for id in &uploads {
        upload_drop(c, id, now).await?;
    }
    counts.uploads = uploads.len() as u64;
    sqlx::query(
        "INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, $2 FROM results WHERE tenant = $1 AND state <> 'expired' ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    counts.keys = sqlx::query("DELETE FROM api_keys WHERE tenant = $1")
        .bind(tenant)
        .execute(&mut *c)
        .await
        .map_err(db)?
        .rows_affected();
    for sql in [
        "DELETE FROM results WHERE tenant = $1",
        "DELETE FROM idempotency_keys WHERE tenant = $1",
        "DELETE FROM tombstones WHERE tenant = $1",
        "DELETE FROM webhook_deliveries WHERE tenant = $1",
        "DELETE FROM webhook_secrets WHERE tenant = $1",
        "DELETE FROM tenant_dispatch WHERE tenant = $1",
        "DELETE FROM tasks WHERE tenant = $1 AND status IN ('ready', 'leased')",
        "DELETE FROM tenants WHERE name = $1",
    ] {
        sqlx::query(sql).bind(tenant).execute(&mut *c).await.map_err(db)?;
    }
    Ok(counts)
}

/// The operation with its re-runs (from the partial index of `rerun_of`,
/// in the same statement) and the size of its stored JSON, for the read
/// cache.
async fn operation_read(pool: &PgPool, tenant: &str, id: &Id) -> Result<Option<(Operation, usize)>> {
    let row = sqlx::query(&format!(
        "SELECT {OP_COLUMNS}, ARRAY(SELECT r.id FROM operations r WHERE r.rerun_of = operations.id ORDER BY r.seq),
                COALESCE(octet_length(input), 0) + COALESCE(octet_length(result), 0)
                  + COALESCE(octet_length(progress), 0) + COALESCE(octet_length(labels), 0)
           FROM operations WHERE id = $1 AND tenant = $2"
    ))
    .bind(id.as_str())
    .bind(tenant)
    .fetch_optional(pool)
    .await
    .map_err(db)?;
    let Some(row) = row else { return Ok(None) };
    let mut op = operation_from_row(&row)?;
    let reruns: Vec<String> = row.try_get(OP_COLUMN_COUNT).map_err(db)?;
    op.reruns = Some(reruns.into_iter().map(Id::from_trusted).collect());
    let json_bytes: i32 = row.try_get(OP_COLUMN_COUNT + 1).map_err(db)?;
    Ok(Some((op, usize::try_from(json_bytes).unwrap_or(usize::MAX))))
}

/// How a claim's transaction begins: its statements on generic plans. The
/// pick chose a custom plan every time (its generic estimate, the LIMIT a
/// parameter, looked dearer): pg_stat_statements counted 117 plannings for
/// 108 picks, 0.42 ms each, on the path of every idle pickup. On generic
/// plans a woken claim answered 0.5 ms sooner (python probe, 200 pickups
/// each, three alternating pairs: submit-to-claim p50 3.34–3.84 → 2.45–3.02
/// ms) and the drain did not move (scripts/drain, three pairs). Their shape
/// does not hang on statistics: the pick walks its index from the head,
/// the lease finds rows by place and by id.
const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";

macro_rules! in_tx {
    ($self:ident, |$c:ident, $ch:ident| $body:expr) => {
        $self.tx(move |$c, $ch| Box::pin(async move { $body })).await
    };
}

#[async_trait]
impl Store for PostgresStore {
    async fn operation_accept(&self, params: AcceptParams) -> Result<AcceptOutcome> {
        self.accepts.write(params).await
    }

    async fn operation_accept_many(&self, params: Vec<AcceptParams>) -> Vec<Result<AcceptOutcome>> {
        self.accepts.write_many(params).await
    }

    async fn operation_accept_leased(&self, params: &AcceptParams, to: &LeaseTo) -> Result<Option<(Operation, Task)>> {
        operation_accept_leased(&self.pool, &self.reads, params, to).await
    }

    fn hands_off(&self) -> bool {
        true
    }

    async fn operation_get(&self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        self.reads
            .read_through(tenant, id.as_str(), || operation_read(&self.pool, tenant, id))
            .await
    }

    async fn operation_list(&self, params: ListParams) -> Result<OperationPage> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        operation_list(&mut c, &params).await
    }

    async fn operation_history(&self, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        events_of(&mut c, tenant, id, 0, i64::MAX, false).await
    }

    async fn operation_cancel(&self, params: CancelParams) -> Result<CancelOutcome> {
        let policy = self.policy;
        in_tx!(self, |c, ch| operation_cancel(c, ch, policy, &params).await)
    }

    async fn task_claim(&self, params: ClaimParams) -> Result<Vec<Task>> {
        let policy = self.policy;
        self.tx_begun_with(CLAIM_BEGIN, move |c, ch| {
            Box::pin(async move { task_claim(c, ch, policy, &params).await })
        })
        .await
    }

    async fn task_heartbeat(&self, params: HeartbeatParams) -> Result<HeartbeatAck> {
        in_tx!(self, |c, ch| task_heartbeat(c, ch, &params).await)
    }

    async fn task_finish(&self, params: FinishParams) -> Result<Operation> {
        self.finishes.write(params).await
    }

    async fn task_finish_many(&self, params: Vec<FinishParams>) -> Vec<Result<Operation>> {
        self.finishes.write_many(params).await
    }

    async fn task_finish_and_claim(
        &self,
        outcomes: Vec<FinishParams>,
        claim: ClaimParams,
    ) -> (Vec<Result<Operation>>, Result<Vec<Task>>) {
        // Side by side on two connections: the outcomes join the finishes'
        // group commit while the claim runs, so neither waits for the
        // other's commit.
        tokio::join!(self.task_finish_many(outcomes), self.task_claim(claim))
    }

    async fn task_expire_worker(&self, worker_id: &str, now: Timestamp) -> Result<u64> {
        let n = sqlx::query(
            "UPDATE tasks SET lease_expires_at = $2 WHERE status = 'leased' AND worker_id = $1 AND lease_expires_at >= $2",
        )
        .bind(worker_id)
        .bind(now.0 - 1)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(n.rows_affected())
    }

    async fn task_reap(&self, params: ReapParams) -> Result<ReapCounts> {
        let policy = self.policy;
        in_tx!(self, |c, ch| task_reap(c, ch, policy, &params).await)
    }

    async fn operation_update(&self, params: UpdateParams) -> Result<Operation> {
        in_tx!(self, |c, ch| operation_update(c, ch, &params).await)
    }

    async fn operation_intent(&self, params: IntentParams) -> Result<Operation> {
        in_tx!(self, |c, ch| operation_intent(c, ch, &params).await)
    }

    async fn deadline_enforce(&self, params: EnforceParams) -> Result<EnforceCounts> {
        let policy = self.policy;
        in_tx!(self, |c, ch| deadline_enforce(c, ch, policy, &params).await)
    }

    async fn tenant_set(&self, limits: TenantLimits) -> Result<()> {
        sqlx::query(
            "INSERT INTO tenants (name, created_at, max_active, max_running, rate)
             VALUES ($1, (extract(epoch from clock_timestamp()) * 1000)::BIGINT, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE SET max_active = excluded.max_active, max_running = excluded.max_running,
                 rate = excluded.rate",
        )
        .bind(&limits.name)
        .bind(limits.max_active)
        .bind(limits.max_running)
        .bind(limits.rate)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn tenant_get(&self, name: &str) -> Result<Option<TenantLimits>> {
        let row = sqlx::query("SELECT name, max_active, max_running, rate FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.map(|r| {
            Ok(TenantLimits {
                name: r.try_get(0).map_err(db)?,
                max_active: r.try_get(1).map_err(db)?,
                max_running: r.try_get(2).map_err(db)?,
                rate: r.try_get(3).map_err(db)?,
            })
        })
        .transpose()
    }

    async fn api_key_create(&self, params: ApiKeyCreateParams) -> Result<()> {
        in_tx!(self, |c, _ch| {
            sqlx::query("INSERT INTO tenants (name, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(&params.tenant)
                .bind(params.now.0)
                .execute(&mut *c)
                .await
                .map_err(db)?;
            sqlx::query("INSERT INTO api_keys (id, tenant, role, secret_hash, created_at) VALUES ($1, $2, $3, $4, $5)")
                .bind(params.id.as_str())
                .bind(&params.tenant)
                .bind(params.role.as_str())
                .bind(&params.secret_hash[..])
                .bind(params.now.0)
                .execute(&mut *c)
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    async fn api_key_get(&self, id: &Id) -> Result<Option<ApiKeyRecord>> {
        let row =
            sqlx::query("SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
        row.as_ref().map(api_key_from_row).transpose()
    }

    async fn api_key_list(&self) -> Result<Vec<ApiKeyRecord>> {
        let rows = sqlx::query(
            "SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(api_key_from_row).collect()
    }

    async fn api_key_revoke(&self, id: &Id, now: Timestamp) -> Result<bool> {
        let n = sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id.as_str())
            .bind(now.0)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(n.rows_affected() == 1)
    }

    async fn api_key_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_keys")
            .fetch_one(&self.pool)
            .await
            .map_err(db)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn kind_upsert(&self, k: KindSpec) -> Result<()> {
        sqlx::query(
            "INSERT INTO kinds (name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds,
                                pausable)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (name) DO UPDATE SET builtin = excluded.builtin, rerun_safe = excluded.rerun_safe,
                 max_attempts = excluded.max_attempts, default_deadline_seconds = excluded.default_deadline_seconds,
                 max_deadline_seconds = excluded.max_deadline_seconds, pausable = excluded.pausable",
        )
        .bind(&k.name)
        .bind(k.builtin)
        .bind(k.rerun_safe)
        .bind(k.max_attempts)
        .bind(k.default_deadline_seconds)
        .bind(k.max_deadline_seconds)
        .bind(k.pausable)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn kind_get(&self, name: &str) -> Result<Option<KindSpec>> {
        let row = sqlx::query(&format!("SELECT {KIND_COLUMNS} FROM kinds WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.as_ref().map(kind_from_row).transpose()
    }

    async fn kind_list(&self) -> Result<Vec<KindSpec>> {
        let rows = sqlx::query(&format!("SELECT {KIND_COLUMNS} FROM kinds ORDER BY name"))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.iter().map(kind_from_row).collect()
    }

    async fn server_secret(&self, name: &str, candidate: Vec<u8>, now: Timestamp) -> Result<Vec<u8>> {
        sqlx::query("INSERT INTO server_secrets (name, value, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
            .bind(name)
            .bind(&candidate)
            .bind(now.0)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        sqlx::query_scalar("SELECT value FROM server_secrets WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(db)
    }

    async fn operation_events_after(
        &self,
        tenant: &str,
        id: &Id,
        after_version: i64,
        limit: u32,
    ) -> Result<Option<Vec<Event>>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        events_of(&mut c, tenant, id, after_version, i64::from(limit), true).await
    }

    async fn kind_typical_duration(&self, kind: &str) -> Result<Option<Duration>> {
        let mut durations: Vec<i64> = sqlx::query_scalar(
            "SELECT completed_at - created_at FROM operations WHERE state = 'succeeded' AND kind = $1
              ORDER BY completed_at DESC LIMIT 101",
        )
        .bind(kind)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        if durations.is_empty() {
            return Ok(None);
        }
        durations.sort_unstable();
        Ok(Some(
            Duration::from_millis(durations[durations.len() / 2].max(0) as u64),
        ))
    }

    fn subscribe_changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    async fn webhook_due(&self, now: Timestamp, limit: u32, lease: Duration) -> Result<Vec<Delivery>> {
        in_tx!(self, |c, _ch| {
            let rows = sqlx::query(
                "SELECT event_id, operation_id, tenant, url, type, payload, attempts FROM webhook_deliveries
                  WHERE status = 'pending' AND next_attempt_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)
                  ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            )
            .bind(now.0)
            .bind(i64::from(limit))
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
            let mut due = Vec::with_capacity(rows.len());
            for r in &rows {
                due.push(Delivery {
                    event_id: Id::from_trusted(r.try_get(0).map_err(db)?),
                    operation_id: Id::from_trusted(r.try_get(1).map_err(db)?),
                    tenant: r.try_get(2).map_err(db)?,
                    url: r.try_get(3).map_err(db)?,
                    event_type: r.try_get(4).map_err(db)?,
                    payload: r.try_get(5).map_err(db)?,
                    attempts: r.try_get(6).map_err(db)?,
                });
            }
            let until = now.plus(lease).0;
            for d in &due {
                sqlx::query("UPDATE webhook_deliveries SET lease_until = $2 WHERE event_id = $1")
                    .bind(d.event_id.as_str())
                    .bind(until)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
            }
            Ok(due)
        })
    }

    async fn webhook_attempt(&self, params: AttemptParams) -> Result<()> {
        in_tx!(self, |c, _ch| webhook_attempt(c, &params).await)
    }

    async fn webhook_log(&self, tenant: &str, id: &Id) -> Result<Option<Vec<AttemptRecord>>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        if !owned(&mut c, tenant, id.as_str()).await? {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT event_id, type, attempt, status_code, error, at, next_attempt_at, latency_ms FROM webhook_attempts
              WHERE operation_id = $1 ORDER BY at, event_id, attempt",
        )
        .bind(id.as_str())
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
        let mut log = Vec::with_capacity(rows.len());
        for r in &rows {
            log.push(AttemptRecord {
                event_id: Id::from_trusted(r.try_get(0).map_err(db)?),
                event_type: r.try_get(1).map_err(db)?,
                attempt: r.try_get(2).map_err(db)?,
                status_code: r
                    .try_get::<Option<i32>, _>(3)
                    .map_err(db)?
                    .and_then(|s| u16::try_from(s).ok()),
                error: r.try_get(4).map_err(db)?,
                at: Timestamp(r.try_get(5).map_err(db)?),
                next_attempt_at: ts(r.try_get(6).map_err(db)?),
                latency_ms: r.try_get(7).map_err(db)?,
            });
        }
        Ok(Some(log))
    }

    async fn webhook_secrets(&self, tenant: &str, candidate: String, now: Timestamp) -> Result<Vec<String>> {
        let tenant = tenant.to_owned();
        in_tx!(self, |c, _ch| {
            let active =
                "SELECT secret FROM webhook_secrets WHERE tenant = $1 AND (retired_at IS NULL OR retired_at > $2)
                           ORDER BY created_at DESC, secret";
            let secrets: Vec<String> = sqlx::query_scalar(active)
                .bind(&tenant)
                .bind(now.0)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            if !secrets.is_empty() {
                return Ok(secrets);
            }
            sqlx::query(
                "INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            )
            .bind(&tenant)
            .bind(&candidate)
            .bind(now.0)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            sqlx::query_scalar(active)
                .bind(&tenant)
                .bind(now.0)
                .fetch_all(&mut *c)
                .await
                .map_err(db)
        })
    }

    async fn webhook_secret_rotate(
        &self,
        tenant: &str,
        new_secret: String,
        now: Timestamp,
        overlap: Duration,
    ) -> Result<()> {
        let tenant = tenant.to_owned();
        in_tx!(self, |c, _ch| {
            sqlx::query("UPDATE webhook_secrets SET retired_at = $2 WHERE tenant = $1 AND retired_at IS NULL")
                .bind(&tenant)
                .bind(now.plus(overlap).0)
                .execute(&mut *c)
                .await
                .map_err(db)?;
            sqlx::query("INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)")
                .bind(&tenant)
                .bind(&new_secret)
                .bind(now.0)
                .execute(&mut *c)
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    async fn artifact_piece_add(&self, params: ArtifactPieceParams) -> Result<Vec<UploadChunk>> {
        in_tx!(self, |c, _ch| {
            fenced(c, &params.operation_id, &params.lease_token).await?;
            let id = params.operation_id.as_str();
            let pieces = pieces_of(c, id, &params.name).await?;
            let kept = piece_placement(&pieces, params.offset)?;
            if kept < pieces.len() {
                pieces_drop(c, id, Some((&params.name, params.offset)), None, params.now).await?;
            }
            sqlx::query(
                "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id)
            .bind(&params.name)
            .bind(params.offset)
            .bind(&params.piece.storage_key)
            .bind(params.piece.size_bytes)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            let mut held: Vec<UploadChunk> = pieces.into_iter().take(kept).map(|(_, piece)| piece).collect();
            held.push(params.piece.clone());
            Ok(held)
        })
    }

    async fn artifact_pieces(&self, operation_id: &Id, lease_token: &str, name: &str) -> Result<Vec<UploadChunk>> {
        let (id, token, name) = (operation_id.clone(), lease_token.to_owned(), name.to_owned());
        in_tx!(self, |c, _ch| {
            fenced(c, &id, &token).await?;
            Ok(pieces_of(c, id.as_str(), &name)
                .await?
                .into_iter()
                .map(|(_, piece)| piece)
                .collect())
        })
    }

    async fn result_upload(&self, params: ResultUploadParams) -> Result<()> {
        in_tx!(self, |c, _ch| {
            fenced(c, &params.operation_id, &params.lease_token).await?;
            if params.joins_pieces {
                let keep = Some(params.storage_key.as_str());
                pieces_drop(
                    c,
                    params.operation_id.as_str(),
                    Some((&params.name, 0)),
                    keep,
                    params.now,
                )
                .await?;
            }
            // One upload per name: a new one replaces this attempt's earlier
            // one of the name, and whatever earlier attempts left.
            sqlx::query(
                "WITH gone AS (DELETE FROM results WHERE operation_id = $1 AND state = 'uploaded'
                                  AND (name = $2 OR lease_token IS DISTINCT FROM $3) RETURNING storage_key)
                 INSERT INTO artifact_garbage (storage_key, created_at) SELECT storage_key, $4 FROM gone
                 ON CONFLICT DO NOTHING",
            )
            .bind(params.operation_id.as_str())
            .bind(&params.name)
            .bind(&params.lease_token)
            .bind(params.now.0)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            let tenant: String = sqlx::query_scalar("SELECT tenant FROM operations WHERE id = $1")
                .bind(params.operation_id.as_str())
                .fetch_one(&mut *c)
                .await
                .map_err(db)?;
            sqlx::query(
                "INSERT INTO results (id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state,
                                      lease_token, created_at, name)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'uploaded', $8, $9, $10)",
            )
            .bind(params.result_id.as_str())
            .bind(params.operation_id.as_str())
            .bind(tenant)
            .bind(&params.storage_key)
            .bind(&params.content_type)
            .bind(params.size_bytes)
            .bind(&params.sha256)
            .bind(&params.lease_token)
            .bind(params.now.0)
            .bind(&params.name)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    async fn result_for_operation(&self, tenant: &str, id: &Id) -> Result<Vec<ResultRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {RESULT_COLUMNS} FROM results WHERE operation_id = $1 AND tenant = $2 AND state <> 'uploaded'
              ORDER BY name"
        ))
        .bind(id.as_str())
        .bind(tenant)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(result_from_row).collect()
    }

    async fn result_get(&self, id: &Id) -> Result<Option<ResultRecord>> {
        let row = sqlx::query(&format!("SELECT {RESULT_COLUMNS} FROM results WHERE id = $1"))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.as_ref().map(result_from_row).transpose()
    }

    async fn operation_tombstone(&self, tenant: &str, id: &Id) -> Result<Option<Timestamp>> {
        let removed: Option<i64> =
            sqlx::query_scalar("SELECT removed_at FROM tombstones WHERE operation_id = $1 AND tenant = $2")
                .bind(id.as_str())
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
        Ok(removed.map(Timestamp))
    }

    async fn retention_sweep(&self, params: RetentionParams) -> Result<RetentionCounts> {
        in_tx!(self, |c, ch| retention_sweep(c, ch, &params).await)
    }

    async fn artifact_garbage(&self, limit: u32) -> Result<Vec<String>> {
        sqlx::query_scalar("SELECT storage_key FROM artifact_garbage ORDER BY created_at LIMIT $1")
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)
    }

    async fn artifact_garbage_done(&self, keys: Vec<String>) -> Result<()> {
        sqlx::query("DELETE FROM artifact_garbage WHERE storage_key = ANY($1)")
            .bind(&keys)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn tenant_delete(&self, tenant: &str, now: Timestamp) -> Result<TenantDeleteCounts> {
        let tenant = tenant.to_owned();
        in_tx!(self, |c, ch| tenant_delete(c, ch, &tenant, now).await)
    }

    async fn server_secret_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let rows =
            sqlx::query("SELECT name, value FROM server_secrets WHERE starts_with(name, $1) ORDER BY created_at, name")
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?)))
            .collect()
    }

    async fn backlog(&self, now: Timestamp) -> Result<Backlog> {
        let rows = sqlx::query(
            "SELECT o.kind, o.state, MIN(o.created_at) FROM tasks t JOIN operations o ON o.id = t.operation_id
              GROUP BY o.kind, o.state",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let mut oldest_active = Vec::with_capacity(rows.len());
        for r in &rows {
            oldest_active.push((
                r.try_get(0).map_err(db)?,
                state_of(r.try_get(1).map_err(db)?)?,
                Timestamp(r.try_get(2).map_err(db)?),
            ));
        }
        let count = |sql: &'static str| {
            let pool = self.pool.clone();
            async move {
                let n: i64 = sqlx::query_scalar(sql).bind(now.0).fetch_one(&pool).await.map_err(db)?;
                Ok::<u64, StoreError>(u64::try_from(n).unwrap_or(0))
            }
        };
        Ok(Backlog {
            oldest_active,
            retention_due: count("SELECT COUNT(*) FROM operations WHERE expires_at IS NOT NULL AND expires_at <= $1")
                .await?
                + count("SELECT COUNT(*) FROM results WHERE state = 'published' AND expires_at <= $1").await?
                + count("SELECT COUNT(*) FROM tombstones WHERE expires_at <= $1").await?,
            garbage_objects: count("SELECT COUNT(*) FROM artifact_garbage WHERE $1::BIGINT IS NOT NULL").await?,
            webhooks_due: count(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= $1",
            )
            .await?,
            webhooks_failing: count(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0 AND $1::BIGINT IS NOT NULL",
            )
            .await?,
        })
    }

    async fn console_session_start(&self, session: ConsoleSession) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
            .bind(session.created_at.0)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(
            "INSERT INTO console_sessions (token_hash, key_id, created_at, expires_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(&session.token_hash)
        .bind(session.key_id.as_str())
        .bind(session.created_at.0)
        .bind(session.expires_at.0)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn console_session_key(&self, token_hash: &[u8], now: Timestamp) -> Result<Option<Id>> {
        let id: Option<String> =
            sqlx::query_scalar("SELECT key_id FROM console_sessions WHERE token_hash = $1 AND expires_at > $2")
                .bind(token_hash)
                .bind(now.0)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
        Ok(id.map(Id::from_trusted))
    }

    async fn console_session_end(&self, token_hash: &[u8]) -> Result<()> {
        sqlx::query("DELETE FROM console_sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn operation_tenant(&self, id: &Id) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT tenant FROM operations WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db)
    }

    async fn operation_by_key(&self, tenant: &str, kinds: Vec<String>, key: &str) -> Result<Option<Id>> {
        // Keys are scoped by (tenant, kind): the primary key, for each kind.
        let id: Option<String> = sqlx::query_scalar(
            "SELECT operation_id FROM idempotency_keys WHERE tenant = $1 AND kind = ANY($2) AND key = $3 LIMIT 1",
        )
        .bind(tenant)
        .bind(&kinds)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        Ok(id.map(Id::from_trusted))
    }

    async fn idempotency_record(&self, tenant: &str, id: &Id) -> Result<Option<IdempotencyRecord>> {
        let row = sqlx::query(
            "SELECT k.key, k.kind, k.created_at, k.replays FROM operations o
               JOIN idempotency_keys k ON k.tenant = o.tenant AND k.kind = o.kind AND k.key = o.idempotency_key
              WHERE o.id = $1 AND o.tenant = $2 AND k.operation_id = o.id",
        )
        .bind(id.as_str())
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        row.map(|r| {
            Ok(IdempotencyRecord {
                key: r.try_get(0).map_err(db)?,
                kind: r.try_get(1).map_err(db)?,
                created_at: Timestamp(r.try_get(2).map_err(db)?),
                replays: r.try_get(3).map_err(db)?,
            })
        })
        .transpose()
    }

    async fn active_summary(&self, tenant: Option<String>) -> Result<Vec<ActiveGroup>> {
        let rows = sqlx::query(
            "SELECT o.kind, o.state, COUNT(*), MIN(o.created_at) FROM tasks t JOIN operations o ON o.id = t.operation_id
              WHERE $1::TEXT IS NULL OR t.tenant = $1 GROUP BY o.kind, o.state ORDER BY o.kind, o.state",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(ActiveGroup {
                    kind: r.try_get(0).map_err(db)?,
                    state: state_of(r.try_get(1).map_err(db)?)?,
                    count: u64::try_from(r.try_get::<i64, _>(2).map_err(db)?).unwrap_or(0),
                    oldest_created_at: Timestamp(r.try_get(3).map_err(db)?),
                })
            })
            .collect()
    }

    async fn lease_list(&self, tenant: Option<String>, limit: u32) -> Result<Vec<LeaseInfo>> {
        let rows = sqlx::query(
            "SELECT t.operation_id, t.tenant, t.kind, t.worker_id, o.attempt, t.lease_expires_at, t.lease_ms, o.progress
               FROM tasks t JOIN operations o ON o.id = t.operation_id
              WHERE t.status = 'leased' AND ($1::TEXT IS NULL OR t.tenant = $1)
              ORDER BY t.lease_expires_at LIMIT $2",
        )
        .bind(tenant)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|r| {
                let expires = Timestamp(r.try_get(5).map_err(db)?);
                let lease_ms: Option<i64> = r.try_get(6).map_err(db)?;
                Ok(LeaseInfo {
                    operation_id: Id::from_trusted(r.try_get(0).map_err(db)?),
                    tenant: r.try_get(1).map_err(db)?,
                    kind: r.try_get(2).map_err(db)?,
                    worker_id: r.try_get(3).map_err(db)?,
                    attempt: r.try_get(4).map_err(db)?,
                    lease_expires_at: expires,
                    last_heartbeat_at: lease_ms.map(|ms| Timestamp(expires.0 - ms)),
                    progress: json_text(r.try_get(7).map_err(db)?)?.map(|v| progress_from_json(&v)),
                })
            })
            .collect()
    }

    async fn tenant_usage(&self) -> Result<Vec<TenantUsage>> {
        let rows = sqlx::query(
            "SELECT n.name, n.max_active, n.max_running, n.rate,
                    (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name),
                    (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name AND t.status = 'leased')
               FROM tenants n ORDER BY n.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(TenantUsage {
                    limits: TenantLimits {
                        name: r.try_get(0).map_err(db)?,
                        max_active: r.try_get(1).map_err(db)?,
                        max_running: r.try_get(2).map_err(db)?,
                        rate: r.try_get(3).map_err(db)?,
                    },
                    active: u64::try_from(r.try_get::<i64, _>(4).map_err(db)?).unwrap_or(0),
                    running: u64::try_from(r.try_get::<i64, _>(5).map_err(db)?).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn accepting_pause(&self, kind: Option<String>, paused: bool) -> Result<()> {
        let scope = kind.unwrap_or_else(|| "*".into());
        let sql = if paused {
            "INSERT INTO accept_pauses (scope) VALUES ($1) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM accept_pauses WHERE scope = $1"
        };
        sqlx::query(sql).bind(scope).execute(&self.pool).await.map_err(db)?;
        Ok(())
    }

    async fn accepting_pauses(&self) -> Result<Vec<Option<String>>> {
        let scopes: Vec<String> = sqlx::query_scalar("SELECT scope FROM accept_pauses ORDER BY scope")
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        Ok(scopes.into_iter().map(|s| (s != "*").then_some(s)).collect())
    }

    async fn upload_create(&self, params: UploadCreateParams) -> Result<UploadRecord> {
        in_tx!(self, |c, _ch| {
            sqlx::query(
                "INSERT INTO uploads (id, tenant, content_type, upload_offset, complete, expected_sha256, chunks,
                                      created_at, expires_at)
                 VALUES ($1, $2, $3, 0, FALSE, $4, '[]', $5, $6)",
            )
            .bind(params.id.as_str())
            .bind(&params.tenant)
            .bind(&params.content_type)
            .bind(&params.expected_sha256)
            .bind(params.now.0)
            .bind(params.expires_at.0)
            .execute(&mut *c)
            .await
            .map_err(db)?;
            upload_row(c, &params.tenant, &params.id, false)
                .await?
                .ok_or(StoreError::NotFound)
        })
    }

    async fn upload_get(&self, tenant: &str, id: &Id) -> Result<Option<UploadRecord>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        upload_row(&mut c, tenant, id, false).await
    }

    async fn upload_append(&self, params: UploadAppendParams) -> Result<UploadRecord> {
        in_tx!(self, |c, _ch| {
            let current = upload_row(c, &params.tenant, &params.id, true)
                .await?
                .ok_or(StoreError::NotFound)?;
            let appended = upload_appended(&current, &params)?;
            upload_store(c, &appended).await?;
            Ok(appended)
        })
    }

    async fn upload_complete(&self, params: UploadCompleteParams) -> Result<UploadRecord> {
        in_tx!(self, |c, _ch| {
            let current = upload_row(c, &params.tenant, &params.id, true)
                .await?
                .ok_or(StoreError::NotFound)?;
            let (completed, garbage) = upload_completed(&current, &params)?;
            upload_store(c, &completed).await?;
            garbage_insert(c, &garbage, params.now).await?;
            Ok(completed)
        })
    }

    async fn upload_remove(&self, tenant: &str, id: &Id, now: Timestamp) -> Result<bool> {
        let (tenant, id) = (tenant.to_owned(), id.clone());
        in_tx!(self, |c, _ch| {
            match upload_row(c, &tenant, &id, true).await? {
                Some(upload) if !upload.referenced => {
                    upload_drop(c, id.as_str(), now).await?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }

    async fn upload_for_task(
        &self,
        operation_id: &Id,
        lease_token: &str,
        upload_id: &Id,
    ) -> Result<Option<UploadRecord>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        fenced(&mut c, operation_id, lease_token).await?;
        let row = sqlx::query(&format!(
            "SELECT {UPLOAD_COLUMNS} FROM uploads WHERE id = $1
                AND EXISTS (SELECT 1 FROM operation_uploads WHERE operation_id = $2 AND upload_id = $1)"
        ))
        .bind(upload_id.as_str())
        .bind(operation_id.as_str())
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
        row.as_ref().map(upload_from_row).transpose()
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
        Ok(())
    }
}
