//! The embedded SQLite backend: one file under `--data-dir`, WAL mode,
//! `synchronous = FULL`, one writer thread with group commit
//! (`writer`), and a small pool of read connections.
//!
//! The driver is rusqlite rather than sqlx: on this workload it commits
//! 1.5–3.5× faster, and the single-writer design needs a synchronous
//! connection owned by one thread anyway.
//!
//! Every statement runs on a connection handed to it by the writer thread
//! (inside a group commit) or by the reader pool; none opens its own
//! transaction. Every change of `operations` is `UPDATE OR FAIL` of one row
//! by id, and the rules the schema enforces on it (migration 0014) refuse
//! with `RAISE(FAIL)`: nothing then makes SQLite open a statement journal
//! for the update (a third of its cost on the job path), and the writer's
//! transaction (or a savepoint) is what rolls a refused write back whole.
//! For the same reason a list of constants after `IN` has at most two: a
//! longer one is evaluated through an ephemeral table built on every run.
//!
//! # Layout
//!
//! This file holds the store (writer, readers, read cache, checkpointer)
//! and its [`Store`] methods; the statements live one file a concern:
//! `driver` (the plan layer's primitives), `accept`, `claim`, `finish`
//! (heartbeats, outcomes, the reaper), `ending`, `control` (cancel, pause,
//! resume), `reads`, `retention`, `schedules`, `uploads`, `webhooks`, `admin` (keys,
//! kinds, tenants, sessions), `rows` (column codecs and shared statements),
//! `changes` (the change feed) and `writer` (group commit).

mod accept;
mod changes;
mod claim;
mod driver;
mod ending;
mod finish;
mod reads;
mod retention;
mod rows;
mod schedules;
mod script;
mod uploads;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longrun_core::id::random_base32;
use longrun_core::{Id, State, Timestamp};
use rusqlite::types::Type;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use serde_json::{Value, json};

use crate::plan::{self, EVENTS_AFTER, EventType, event_row, with_derived};
use crate::reads::ReadCache;
use crate::shared::*;
use crate::*;
use accept::*;
use claim::*;
use driver::{SqliteDriver, block};
use ending::*;
use finish::*;
use reads::*;
use retention::*;
use rows::*;
use schedules::*;
use uploads::*;
use writer::Writer;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("sqlite/migrations/0001_init.sql")),
    (2, include_str!("sqlite/migrations/0002_engine.sql")),
    (3, include_str!("sqlite/migrations/0003_observing.sql")),
    (4, include_str!("sqlite/migrations/0004_webhooks.sql")),
    (5, include_str!("sqlite/migrations/0005_results_retention.sql")),
    (6, include_str!("sqlite/migrations/0006_operating.sql")),
    (7, include_str!("sqlite/migrations/0007_fewer_indexes.sql")),
    (8, include_str!("sqlite/migrations/0008_uploads.sql")),
    (9, include_str!("sqlite/migrations/0009_reruns.sql")),
    (10, include_str!("sqlite/migrations/0010_paused.sql")),
    (11, include_str!("sqlite/migrations/0011_checkpoints.sql")),
    (12, include_str!("sqlite/migrations/0012_console.sql")),
    (13, include_str!("sqlite/migrations/0013_events_append.sql")),
    (14, include_str!("sqlite/migrations/0014_cheaper_checks.sql")),
    (15, include_str!("sqlite/migrations/0015_keys_by_tombstone.sql")),
    (16, include_str!("sqlite/migrations/0016_upload_appends.sql")),
    (17, include_str!("sqlite/migrations/0017_not_before_priority.sql")),
    (18, include_str!("sqlite/migrations/0018_schedules.sql")),
];

/// How to open the embedded database.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// The database file (`longrun.db`).
    pub path: PathBuf,
    /// How long a terminal operation (and its idempotency record) is kept.
    pub operation_retention: Duration,
    /// How long a published result artifact is kept.
    pub result_retention: Duration,
    /// Keep `input` after the operation ends.
    pub keep_inputs: bool,
    /// Most jobs one group commit takes.
    pub max_batch: usize,
    /// A cap on the database's size in pages (SQLite's `max_page_count`):
    /// past it, writes are refused as unavailable while reads go on, as on a
    /// full disk. For drills and tests; `None` (no cap) by default.
    pub max_page_count: Option<u32>,
}

impl SqliteConfig {
    /// Defaults for the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            operation_retention: Duration::from_secs(30 * 24 * 3600),
            result_retention: Duration::from_secs(24 * 3600),
            keep_inputs: false,
            max_batch: 256,
            max_page_count: None,
        }
    }
}

/// Settings the SQL needs at write time.
pub(crate) type WritePolicy = crate::plan::Policy;

/// The SQLite backend: one writer thread committing in groups, pooled WAL readers.
pub struct SqliteStore {
    writer: Writer,
    /// Stops the checkpointer thread when the store is dropped.
    _checkpointer: std::sync::mpsc::Sender<()>,
    changes: tokio::sync::broadcast::Sender<Change>,
    /// What `operation_get` read; the writer evicts what each commit changed.
    reads: Arc<ReadCache>,
    readers: Arc<ReaderPool>,
    policy: WritePolicy,
}

impl SqliteStore {
    /// Rows of each retention phase a writer job handles (see
    /// `plan::retention::steps`).
    pub(crate) const RETENTION_STEP: u32 = 100;

    /// Opens (creating if needed) the database and applies migrations.
    pub fn open(config: SqliteConfig) -> Result<Self> {
        if let Some(dir) = config.path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mut conn = open_connection(&config.path, false)?;
        migrate_connection(&mut conn)?;
        // Checkpoints run on a thread of their own (see `checkpointer`),
        // not inside the writer's commits.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
        // The writer's page cache holds a batch's pages: with SQLite's
        // default (2 MiB) a batch of submissions spilled dirty pages into the
        // WAL mid-transaction and read index pages back from the file.
        conn.execute_batch(&format!("PRAGMA cache_size = -{WRITER_CACHE_KIB}"))?;
        if let Some(pages) = config.max_page_count {
            conn.execute_batch(&format!("PRAGMA max_page_count = {pages}"))?;
        }
        let checkpoints = open_connection(&config.path, false)?;
        let catch_up = Arc::new(AtomicBool::new(false));
        let (changes, _) = tokio::sync::broadcast::channel(4096);
        let reads = Arc::new(ReadCache::default());
        Ok(Self {
            writer: Writer::spawn(
                conn,
                config.max_batch.max(1),
                changes.clone(),
                reads.clone(),
                catch_up.clone(),
            ),
            _checkpointer: spawn_checkpointer(checkpoints, catch_up),
            changes,
            reads,
            readers: Arc::new(ReaderPool {
                path: config.path.clone(),
                idle: Mutex::new(Vec::new()),
            }),
            policy: WritePolicy {
                operation_retention: config.operation_retention,
                result_retention: config.result_retention,
                keep_inputs: config.keep_inputs,
            },
        })
    }

    /// Writes `items` as one writer job, answered item by item (see
    /// `writer::each_isolated`).
    async fn write_each<P, T, F>(&self, items: Vec<P>, f: F) -> Vec<Result<T>>
    where
        P: Send + 'static,
        T: Send + 'static,
        F: Fn(&Connection, &P) -> Result<T> + Send + 'static,
    {
        let n = items.len();
        self.writer
            .write(move |c| writer::each_isolated(c, &items, &f))
            .await
            .unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect())
    }

    /// A point read (one row, or a few, found by key) on the calling
    /// thread. Handing it to the blocking pool, as [`Self::read`] does, cost
    /// more than the read: two thread wake-ups per request, a quarter of the
    /// server's time in a profile of `GET /v1/operations/{id}`, against ~1 %
    /// in SQLite itself. A WAL reader never waits for the writer, so this
    /// blocks the async thread for microseconds; reads that may walk many
    /// rows go through [`Self::read`].
    fn read_now<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.readers.with(f)
    }

    /// Runs a shared write script as one writer job.
    async fn write_script<T: Send + 'static>(&self, script: Script<T>) -> Result<T> {
        self.writer.write(move |c| script::run(c, &script)).await
    }

    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let pool = self.readers.clone();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| pool.with(f)))
            .await
            .map_err(|_| StoreError::Stopped("a SQLite read task"))?
    }
}

/// The writer connection's page cache, in KiB: big enough for a batch's
/// dirty pages (SQLite's default 2 MiB spilled them mid-transaction), and
/// no bigger, because its size is paid at commits. A page split that
/// reorders sibling pages (`balance_nonroot`) parks one under a page number
/// past the end of the file, and the commit's cache truncation then walks
/// every cached page: at 64 MiB that walk was 6–9 % of the writer's time in
/// a profile of the in-process drain, at 16 MiB 2.4 %.
const WRITER_CACHE_KIB: u32 = 16 * 1024;

/// How often the checkpointer copies the WAL back into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// WAL length (in pages) past which the checkpointer has the log started
/// again from its beginning (SQLite's own default threshold).
const WAL_RESTART_PAGES: i64 = 1000;

/// The most pages the checkpointer leaves the writer to copy when it hands
/// the log over: it copies again what was appended while it copied, until
/// no more than this was.
const CATCH_UP_PAGES: i64 = 256;

/// How many times the checkpointer copies again before it hands over.
const CHASE_PASSES: usize = 4;

/// Copies committed WAL frames into the database file every
/// `CHECKPOINT_EVERY`, on its own connection and thread. SQLite's automatic
/// checkpoint would run inside the commit that crosses its threshold, on the
/// single writer thread (a tenth of that thread's time in a profile of the
/// job path); a PASSIVE checkpoint here runs beside the writer and never
/// blocks it or a reader.
///
/// But under steady writes a PASSIVE checkpoint never catches up with the
/// writer, and the log only starts again from its beginning once one has:
/// the WAL would grow for as long as the load lasts, every frame appended
/// past its end (where the file system zeroes each new block first: a
/// quarter of the writer's time in a profile of single submissions), and
/// every page lookup walking a longer WAL index. So once the log is past
/// `WAL_RESTART_PAGES` the checkpointer copies again what was appended
/// while it copied, until little was, and then hands the log over: it sets
/// `catch_up`, and the writer, between two batches, copies the rest itself
/// (`writer::catch_up`), so its next commit starts the log again.
///
/// It used to finish with a RESTART checkpoint instead, which must take
/// SQLite's write lock: the two threads then met through SQLite's busy
/// handler, which sleeps 1, 2, 5, 10… ms between tries. The checkpointer
/// rarely found the writer's lock free within its 100 ms (the WAL of 3 ×
/// 50 k single submissions reached 150–460 MB), and when it did, the writer
/// slept through several of those steps: the stalls behind the single
/// submissions' p99, longer on a store of a million operations.
/// The thread ends when the returned sender drops.
fn spawn_checkpointer(conn: Connection, catch_up: Arc<AtomicBool>) -> std::sync::mpsc::Sender<()> {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("longrun-sqlite-checkpointer".into())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                if let Err(e) = checkpoint(&conn, &catch_up) {
                    tracing::warn!(error = %e, "a WAL checkpoint failed; the next one will try again");
                }
            }
        })
        .expect("failed to spawn the SQLite checkpointer thread");
    stop
}

/// One turn of the checkpointer: PASSIVE, and when the log has grown past
/// `WAL_RESTART_PAGES`, more PASSIVE passes until one copied little, then
/// the hand-over to the writer.
fn checkpoint(conn: &Connection, catch_up: &AtomicBool) -> rusqlite::Result<Checkpoint> {
    // The log's length in pages (-1 while another checkpoint runs).
    let passive = || conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1));
    let mut log = passive()?;
    if log <= WAL_RESTART_PAGES {
        return Ok(Checkpoint::Passive);
    }
    for _ in 0..CHASE_PASSES {
        let now = passive()?;
        let appended = now - log;
        log = now;
        if appended <= CATCH_UP_PAGES {
            break;
        }
    }
    catch_up.store(true, Ordering::Release);
    Ok(Checkpoint::HandedOver)
}

/// What one turn of the checkpointer did.
#[derive(Debug, PartialEq)]
enum Checkpoint {
    Passive,
    /// The log is long: the writer is to copy the rest and start it again.
    HandedOver,
}

/// Applies pending migrations to the database at `path`; returns how many ran.
pub fn migrate(path: &Path) -> Result<usize> {
    let mut conn = open_connection(path, false)?;
    migrate_connection(&mut conn)
}

fn open_connection(path: &Path, read_only: bool) -> Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    // Another process (`longrun keys create` beside a running server) may hold
    // the write lock for a moment: wait instead of failing.
    conn.busy_timeout(Duration::from_secs(10))?;
    // Every statement the store runs stays prepared (rusqlite keeps 16 by
    // default, fewer than the writer's hot path uses).
    conn.set_prepared_statement_cache_capacity(256);
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY;",
    )?;
    Ok(conn)
}

fn migrate_connection(conn: &mut Connection) -> Result<usize> {
    migrate_connection_to(conn, i64::MAX)
}

/// Applies the migrations after the store's version up to `last`.
fn migrate_connection_to(conn: &mut Connection, last: i64) -> Result<usize> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
        r.get(0)
    })?;
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current && *v <= last) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            rusqlite::params![
                version,
                longrun_core::Clock::now(&longrun_core::SystemClock).as_millis()
            ],
        )?;
        applied += 1;
    }
    tx.commit()?;
    if applied > 0 {
        // A migration may change the schema in place (0010): parse it again.
        conn.execute_batch("PRAGMA writable_schema = RESET")?;
    }
    Ok(applied)
}

/// Read connections, opened on demand and kept for reuse.
struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    /// Runs `f` on an idle connection (a new one if none is), then keeps it.
    fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.take()?;
        let out = f(&conn);
        self.give_back(conn);
        out
    }

    fn take(&self) -> Result<Connection> {
        let idle = self.idle.lock().expect("reader pool poisoned").pop();
        match idle {
            Some(conn) => Ok(conn),
            None => open_connection(&self.path, true),
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.idle.lock().expect("reader pool poisoned");
        if idle.len() < 16 {
            idle.push(conn);
        }
    }
}

/// A worker's outcome, as the plan layer applies it (one item of a group
/// commit: a batch of one, isolated from the others).
fn task_finish(c: &Connection, policy: WritePolicy, p: &FinishParams) -> Result<Operation> {
    let mut outcome = block(plan::finish::task_finish_many(&mut SqliteDriver::new(c, policy), &[p]))?;
    outcome.pop().expect("one answer")
}

/// A heartbeat, as the plan layer applies it.
fn task_heartbeat(c: &Connection, policy: WritePolicy, p: &HeartbeatParams) -> Result<HeartbeatAck> {
    block(plan::finish::task_heartbeat(&mut SqliteDriver::new(c, policy), p))
}

impl crate::tables::RunScripts for SqliteStore {
    fn read_now<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        std::future::ready(SqliteStore::read_now(self, |c| script::run(c, &script)))
    }

    fn read<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        SqliteStore::read(self, move |c| script::run(c, &script))
    }

    fn write<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        self.write_script(script)
    }
}

/// Runs a use case of the plan layer as one writer job, with the driver
/// bound to `$d`.
macro_rules! run_plan {
    ($self:ident, |$d:ident| $body:expr) => {{
        let policy = $self.policy;
        $self
            .writer
            .write(move |c| {
                block(async {
                    let $d = &mut SqliteDriver::new(c, policy);
                    $body
                })
            })
            .await
    }};
}

crate::plan::store::impl_store!(SqliteStore, run_plan, {
    async fn operation_accept(&self, params: AcceptParams) -> Result<AcceptOutcome> {
        let policy = self.policy;
        self.writer.write(move |c| operation_accept(c, policy, &params)).await
    }

    async fn operation_accept_many(&self, params: Vec<AcceptParams>) -> Vec<Result<AcceptOutcome>> {
        let policy = self.policy;
        self.write_each(params, move |c, p| operation_accept(c, policy, p))
            .await
    }

    async fn operation_shared(&self, tenant: &str, id: &Id) -> Result<Option<Arc<Operation>>> {
        self.reads
            .read_through(tenant, id.as_str(), || async {
                self.read_now(|c| operation_read(c, tenant, id))
            })
            .await
    }

    async fn operation_list(&self, params: ListParams) -> Result<OperationPage> {
        self.read(move |c| operation_list(c, &params)).await
    }

    async fn operation_history(&self, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>> {
        let (tenant, id) = (tenant.to_owned(), id.clone());
        self.read(move |c| operation_history(c, &tenant, &id)).await
    }

    async fn task_claim(&self, params: ClaimParams) -> Result<Vec<Task>> {
        let policy = self.policy;
        self.writer.write(move |c| task_claim(c, policy, &params)).await
    }

    async fn task_heartbeat(&self, params: HeartbeatParams) -> Result<HeartbeatAck> {
        let policy = self.policy;
        self.writer.write(move |c| task_heartbeat(c, policy, &params)).await
    }

    async fn task_finish(&self, params: FinishParams) -> Result<Operation> {
        let policy = self.policy;
        self.writer.write(move |c| task_finish(c, policy, &params)).await
    }

    async fn task_finish_many(&self, params: Vec<FinishParams>) -> Vec<Result<Operation>> {
        let policy = self.policy;
        self.write_each(params, move |c, p| task_finish(c, policy, p)).await
    }

    async fn task_finish_and_claim(
        &self,
        outcomes: Vec<FinishParams>,
        claim: ClaimParams,
    ) -> (Vec<Result<Operation>>, Result<Vec<Task>>) {
        let policy = self.policy;
        let n = outcomes.len();
        self.writer
            .write(move |c| {
                let finished = writer::each_isolated(c, &outcomes, |c, p| task_finish(c, policy, p))?;
                let claimed = writer::isolated(c, |c| task_claim(c, policy, &claim))?;
                Ok((finished, claimed))
            })
            .await
            .unwrap_or_else(|e| ((0..n).map(|_| Err(e.clone())).collect(), Err(e)))
    }

    async fn task_heartbeat_many(&self, params: Vec<HeartbeatParams>) -> Vec<Result<HeartbeatAck>> {
        let policy = self.policy;
        self.write_each(params, move |c, p| task_heartbeat(c, policy, p)).await
    }

    async fn operation_events_after(
        &self,
        tenant: &str,
        id: &Id,
        after_version: i64,
        limit: u32,
    ) -> Result<Option<Vec<Event>>> {
        self.read_now(|c| operation_events_after(c, tenant, id, after_version, limit))
    }

    fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    async fn artifact_keys_named(&self, keys: Vec<String>) -> Result<Vec<String>> {
        self.read(move |c| artifact_keys_named(c, &keys)).await
    }

    async fn schedule_update_many(&self, updates: Vec<(ScheduleRecord, i64)>) -> Result<Vec<bool>> {
        self.writer
            .write(move |c| {
                updates
                    .iter()
                    .map(|(schedule, expected)| script::run(c, &crate::shared::schedule_update(schedule, *expected)))
                    .collect()
            })
            .await
    }

    async fn schedule_fires_record(&self, fires: Vec<ScheduleFire>, keep_after: Timestamp) -> Result<()> {
        self.writer
            .write(move |c| schedule_fires_record(c, &fires, keep_after))
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.read_now(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
    }
});

#[cfg(test)]
mod tests {

    use super::*;

    /// A read by key runs on the caller's thread, beside the writer: while
    /// a write to the same operation is held open mid-transaction, the read
    /// answers at once with what was committed, and sees the write after.
    #[tokio::test]
    async fn a_point_read_answers_while_the_writer_holds_a_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).unwrap();
        let params = crate::conformance::accept_params("t1", "k", None, serde_json::json!({}));
        let id = params.id.clone();
        store.operation_accept(params).await.unwrap();

        let (inside, wait_inside) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = tokio::spawn({
            let writer = store.writer.clone();
            let id = id.clone();
            async move {
                writer
                    .write(move |c| {
                        c.execute(
                            "UPDATE operations SET labels = '{\"held\":\"yes\"}' WHERE id = ?1",
                            [id.as_str()],
                        )?;
                        // As every write of the store notes what it changed.
                        changes::touch(id.as_str());
                        inside.send(()).unwrap();
                        released.recv().unwrap();
                        Ok(())
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || wait_inside.recv().unwrap())
            .await
            .unwrap();
        // The writer is inside its transaction and cannot commit before the
        // read has answered: a read that queued behind it would never return.
        let during = store.operation_get("t1", &id).await.unwrap().unwrap();
        assert!(during.labels.is_empty(), "the uncommitted write is not seen");
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        let after = store.operation_get("t1", &id).await.unwrap().unwrap();
        assert_eq!(after.labels.get("held").map(String::as_str), Some("yes"));
    }

    /// The console's and operators' summaries of live work read the tasks
    /// (live work only), never every stored operation, even when SQLite's
    /// statistics were taken while the queue was empty: on such a store the
    /// overview page took 292 ms at p99 with 100 k operations stored and
    /// 2.5 ms with none (`peers`' history group).
    #[tokio::test]
    async fn summaries_of_live_work_never_read_every_stored_operation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        drop(SqliteStore::open(SqliteConfig::new(path.clone())).unwrap());
        let conn = open_connection(&path, false).unwrap();
        conn.execute_batch(
            "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 5000)
             INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result,
                                     created_at, started_at, completed_at, updated_at)
             SELECT 'op_' || i, 't1', 'noop', 'succeeded', 3, 1, '{}', 'null', i, i, i, i FROM g;
             ANALYZE;",
        )
        .unwrap();
        let now = Timestamp::from_millis(10_000);
        let mut stmts = Vec::new();
        stmts.extend(active_summary(Some("t1")).stmts);
        stmts.extend(active_summary(None).stmts);
        stmts.extend(backlog(now).stmts);
        stmts.extend(lease_list(None, 50).stmts);
        stmts.extend(tenant_usage().stmts);
        for stmt in stmts {
            let sql = format!("EXPLAIN QUERY PLAN {}", sqlite_sql(stmt.sql));
            let mut st = conn.prepare(&sql).unwrap();
            let plan: Vec<String> = st
                .query_map(rusqlite::params_from_iter(stmt.args.iter()), |r| r.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let reads_all = plan
                .iter()
                .any(|step| step == "SCAN o" || step == "SCAN operations" || step.starts_with("SCAN o USING"));
            assert!(!reads_all, "{}\nreads every stored operation: {plan:?}", stmt.sql);
        }
    }

    /// Migration 0013 re-keys events by the operation's `seq`: a store
    /// written before it keeps every operation's history, in version order,
    /// and drops only events no operation owns.
    #[tokio::test]
    async fn events_written_before_the_append_only_table_keep_their_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        {
            let mut conn = open_connection(&path, false).unwrap();
            migrate_connection_to(&mut conn, 12).unwrap();
            let op = |id: &str| {
                format!(
                    "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result,
                                             idempotency_key, created_at, started_at, completed_at, updated_at)
                     VALUES ('{id}', 't1', 'noop', 'succeeded', 3, 1, '{{}}', 'null', NULL, 1, 2, 3, 3)"
                )
            };
            conn.execute_batch(&op("op_older")).unwrap();
            conn.execute_batch(&op("op_newer")).unwrap();
            // Written out of order, as concurrent batches could: the history
            // still comes back by version.
            conn.execute_batch(
                "INSERT INTO operation_events (operation_id, version, type, state, at, data, snapshot) VALUES
                   ('op_newer', 2, 'started', 'running', 5, '{}', NULL),
                   ('op_older', 1, 'created', 'queued', 1, '{}', NULL),
                   ('op_newer', 1, 'created', 'queued', 4, '{}', NULL),
                   ('op_older', 3, 'succeeded', 'succeeded', 3, '{}', NULL),
                   ('op_older', 2, 'started', 'running', 2, '{}', NULL),
                   ('op_gone', 1, 'created', 'queued', 1, '{}', NULL)",
            )
            .unwrap();
        }
        let store = SqliteStore::open(SqliteConfig::new(path.clone())).unwrap();
        let versions = |events: Vec<Event>| {
            events
                .iter()
                .map(|e| (e.version, e.event_type.clone()))
                .collect::<Vec<_>>()
        };
        let older = store
            .operation_history("t1", &Id::from_trusted("op_older".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            versions(older),
            [(1, "created".into()), (2, "started".into()), (3, "succeeded".into())]
        );
        let newer = store
            .operation_events_after("t1", &Id::from_trusted("op_newer".into()), 1, 10)
            .await
            .unwrap()
            .unwrap();
        // Its terminal event was never written: the row, which has
        // ended, gives it back (plan/history.rs).
        assert_eq!(versions(newer), [(2, "started".into()), (3, "succeeded".into())]);
        let conn = open_connection(&path, true).unwrap();
        let total: i64 = conn
            .query_row("SELECT COUNT(*) FROM operation_events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(total, 5, "the orphan event is gone, every other one kept");
    }

    /// Migration 0015 drops the index from an idempotency record to its
    /// operation: a tombstone written before it still frees its key when it
    /// is buried.
    #[tokio::test]
    async fn a_tombstone_from_before_migration_15_still_frees_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        {
            // Schema 14, with what retention left of an operation then: its
            // idempotency record and its tombstone.
            let mut conn = open_connection(&path, false).unwrap();
            migrate_connection_to(&mut conn, 14).unwrap();
            conn.execute_batch(
                "INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
                      VALUES ('t1', 'k', 'old-key', zeroblob(32), 'op_removed', 1000);
                 INSERT INTO tombstones (operation_id, tenant, removed_at, expires_at)
                      VALUES ('op_removed', 't1', 2000, 5000);",
            )
            .unwrap();
        }
        let store = SqliteStore::open(SqliteConfig::new(path)).unwrap();
        crate::conformance::bury_and_reuse_old_key(&store).await;
    }

    /// Migration 0017 adds `not_before` and `priority` and re-makes the
    /// ready index with them: work queued before it is claimed after it as
    /// it would have been (at once, at the default priority, oldest first).
    #[tokio::test]
    async fn work_queued_before_migration_17_is_claimed_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        {
            let mut conn = open_connection(&path, false).unwrap();
            migrate_connection_to(&mut conn, 16).unwrap();
            for (n, id) in ["op_before_1", "op_before_2"].iter().enumerate() {
                conn.execute(
                    "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, created_at, updated_at)
                     VALUES (?1, 't1', 'old', 'queued', 1, 0, '{}', ?2, ?2)",
                    rusqlite::params![id, 1_800_000_000_000_i64 + n as i64],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
                     SELECT id, seq, tenant, kind, 'ready', created_at FROM operations WHERE id = ?1",
                    rusqlite::params![id],
                )
                .unwrap();
            }
        }
        let store = SqliteStore::open(SqliteConfig::new(path)).unwrap();
        let before = store
            .operation_get("t1", &Id::from_trusted("op_before_1".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((before.priority, before.not_before), (crate::PRIORITY_DEFAULT, None));
        let tasks = store
            .task_claim(ClaimParams {
                kinds: vec!["old".into()],
                max_tasks: 10,
                lease: Duration::from_secs(30),
                worker_id: "w".into(),
                now: Timestamp(1_800_000_001_000),
            })
            .await
            .unwrap();
        let ids: Vec<&str> = tasks.iter().map(|t| t.operation_id.as_str()).collect();
        assert_eq!(ids, ["op_before_1", "op_before_2"]);
    }

    /// The log's length in pages, as a PASSIVE checkpoint reports it.
    fn wal_pages(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
            .unwrap()
    }

    /// Under writes that never pause, PASSIVE checkpoints never let the log
    /// start again, however often they run; past `WAL_RESTART_PAGES` the
    /// checkpointer hands the log over, and the writer thread copies the
    /// rest before its next batch, whose commit starts the log again.
    #[tokio::test]
    async fn the_checkpointer_bounds_the_log_under_steady_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        let conn = open_connection(&path, false).unwrap();
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (b BLOB)")
            .unwrap();
        let checkpointer = open_connection(&path, false).unwrap();
        let insert = "INSERT INTO t VALUES (zeroblob(16384))";
        // Each checkpoint runs while the next write is under way, as under
        // load: it copies everything committed, yet the log only grows.
        let mut pages = 0;
        while pages <= WAL_RESTART_PAGES {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            conn.execute(insert, []).unwrap();
            let now = wal_pages(&checkpointer);
            assert!(now >= pages, "the log started again by itself");
            pages = now;
            conn.execute_batch("COMMIT").unwrap();
        }
        // The checkpointer's turn, again while a write is under way: it
        // copies what is committed and hands the log over.
        let catch_up = Arc::new(AtomicBool::new(false));
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.execute(insert, []).unwrap();
        assert_eq!(checkpoint(&checkpointer, &catch_up).unwrap(), Checkpoint::HandedOver);
        assert!(catch_up.load(Ordering::SeqCst));
        // That write is not copied, so the next commit would not start the
        // log again by itself; the writer thread copies it before its next
        // batch.
        conn.execute_batch("COMMIT").unwrap();
        let (changes, _) = tokio::sync::broadcast::channel(16);
        let writer = Writer::spawn(conn, 64, changes, Arc::new(ReadCache::default()), catch_up.clone());
        let write = || {
            writer.write(move |c| {
                c.execute(insert, [])?;
                Ok(())
            })
        };
        write().await.unwrap();
        assert!(!catch_up.load(Ordering::SeqCst), "the writer took the log over");
        let after = wal_pages(&checkpointer);
        assert!(after < 20, "the log went on from {pages} pages to {after}");
        // Below the threshold a turn is PASSIVE only.
        write().await.unwrap();
        assert_eq!(checkpoint(&checkpointer, &catch_up).unwrap(), Checkpoint::Passive);
        assert!(!catch_up.load(Ordering::SeqCst));
    }
}
