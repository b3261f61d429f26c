//! The PostgreSQL backend: many `longrun serve` processes on one database.
//!
//! Every call is one transaction on a pooled connection; concurrent writers
//! are ordinary PostgreSQL transactions, so no writer thread is needed. Rows
//! other nodes may work on at the same moment are taken with
//! `FOR UPDATE SKIP LOCKED` (claims, the reaper, the enforcer, webhook
//! delivery, retention), so each piece of work is done once. The same schema
//! invariants as SQLite live in `postgres/migrations/` (a trigger refuses
//! illegal transitions).
//!
//! # Layout
//!
//! This file holds the store's state (pool, group-commit writers, read
//! cache), opening and migrations, and the transaction wrapper. The rest is
//! one file a concern: `store` (the [`Store`] methods), `driver` (the plan
//! layer's primitives), `accept`, `claim`, `finish` (fenced reads),
//! `ending`, `reads`,
//! `retention`, `uploads`, `rows` (column codecs and shared statements),
//! `notify` (the change feed) and `group_commit`.

use std::sync::Arc;
use std::time::Duration;

use longrun_core::{Id, State, Timestamp};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection as _, PgConnection, PgPool, Row};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::plan::{self, EVENTS_AFTER, EndRow, EventRow, EventType, Lock, Policy, event_row, with_derived};
use crate::reads::ReadCache;
use crate::shared::*;
use crate::*;

/// Changes one NOTIFY payload carries: payloads are limited to 8000 bytes.
/// A macro so that the submission statement's SQL can spell it too.
macro_rules! changes_per_payload {
    () => {
        20
    };
}

const CHANGES_PER_PAYLOAD: usize = changes_per_payload!();

mod accept;
mod claim;
mod deliveries;
mod driver;
mod ending;
mod finish;
mod group_commit;
mod history;
mod notify;
mod reads;
mod retention;
mod rows;
mod schedules;
mod script;
mod store;
mod uploads;

use accept::*;
use claim::*;
use driver::PgDriver;
use ending::*;
use finish::*;
use group_commit::*;
use notify::*;
use reads::*;
use retention::*;
use rows::*;
use uploads::*;

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
    fn record(&mut self, op: &Operation, event_type: EventType) {
        self.list.push(change_of(op, event_type));
        if let Some(other) = Change::also_alters(op, event_type.as_str()) {
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
    (1, include_str!("postgres/migrations/0001_schema.sql")),
    (2, include_str!("postgres/migrations/0002_guard_when.sql")),
    (3, include_str!("postgres/migrations/0003_fewer_indexes.sql")),
    (4, include_str!("postgres/migrations/0004_uploads.sql")),
    (5, include_str!("postgres/migrations/0005_reruns.sql")),
    (6, include_str!("postgres/migrations/0006_paused.sql")),
    (7, include_str!("postgres/migrations/0007_checkpoints.sql")),
    (8, include_str!("postgres/migrations/0008_console.sql")),
    (9, include_str!("postgres/migrations/0009_job_path_indexes.sql")),
    (10, include_str!("postgres/migrations/0010_guard_after.sql")),
    (11, include_str!("postgres/migrations/0011_history_vacuum.sql")),
    (12, include_str!("postgres/migrations/0012_keys_by_tombstone.sql")),
    (13, include_str!("postgres/migrations/0013_upload_appends.sql")),
    (14, include_str!("postgres/migrations/0014_not_before_priority.sql")),
    (15, include_str!("postgres/migrations/0015_schedules.sql")),
    (16, include_str!("postgres/migrations/0016_partitioned_history.sql")),
    (17, include_str!("postgres/migrations/0017_live_work_from_tasks.sql")),
    (18, include_str!("postgres/migrations/0018_hot_claims.sql")),
    (19, include_str!("postgres/migrations/0019_partitioned_deliveries.sql")),
];

/// The database's collation when it compares text by a locale rather than
/// by bytes: its libc collation is not `C` or `POSIX` (PostgreSQL compares
/// by bytes without a locale only for those two names, `C.UTF-8` included
/// in the cost), or it is an ICU database (`'a' < 'B'` holds under a
/// locale, not under `C`). Every key of Longrun (ids, tenants, kinds,
/// idempotency keys) is ASCII, compared for equality or by its bytes, and a
/// locale's comparison costs each index lookup: drains of 20,000 jobs here
/// ran 5–7 % faster on a `C` database than on `C.UTF-8` or ICU `en-US`
/// ones (`scripts/drain`, alternating pairs).
async fn compares_by_locale(pool: &PgPool) -> Result<Option<String>> {
    let (collation, by_locale): (String, bool) = sqlx::query_as(
        "SELECT datcollate::TEXT, datcollate NOT IN ('C', 'POSIX') OR 'a' < 'B'
           FROM pg_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .map_err(db)?;
    Ok(by_locale.then_some(collation))
}

/// Logged once at start when [`compares_by_locale`].
const COLLATION_ADVICE: &str = "the database compares text by a locale; Longrun's keys compare faster in a \
    database created with the C collation (CREATE DATABASE ... TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'; \
    docs/operations.md)";

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

/// The PostgreSQL backend: many nodes on one database.
pub struct PostgresStore {
    pool: PgPool,
    policy: Policy,
    changes: broadcast::Sender<Change>,
    /// What `operation_get` read, kept coherent by every commit and NOTIFY.
    reads: Arc<ReadCache>,
    finishes: GroupCommit<FinishParams, Operation>,
    accepts: GroupCommit<AcceptParams, AcceptOutcome>,
    /// Where the history upkeep's look through the default partition
    /// goes on (`history.rs`).
    strays_from: Arc<std::sync::atomic::AtomicI64>,
}

/// How long a call waits for a pool connection before it is refused as
/// unavailable (sqlx's default of 30 s would hold every request through an
/// outage).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

impl PostgresStore {
    /// Rows of each retention phase a transaction handles: all of a
    /// sweep's. Concurrent writes wait for none of its row locks (they are
    /// of expired work), so a pass is not cut into more statements.
    pub(crate) const RETENTION_STEP: u32 = u32::MAX;

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
        if let Some(collation) = compares_by_locale(&pool).await? {
            tracing::info!(collation, "{COLLATION_ADVICE}");
        }
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
                |c, ch, policy, batch| {
                    Box::pin(
                        async move { plan::finish::task_finish_many(&mut PgDriver { c, ch, policy }, batch).await },
                    )
                },
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
            strays_from: Arc::default(),
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

/// `FOR UPDATE NOWAIT` found the row locked.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The channel every node listens on for committed changes.
const CHANNEL: &str = "longrun_changes";

#[cfg(test)]
pub(crate) use script::explain;

/// A connection to a new database of the test cluster, migrated (`None`
/// where no PostgreSQL can run).
#[cfg(test)]
pub(crate) async fn migrated_connection() -> Option<PgConnection> {
    let url = crate::pgtest::cluster()?.database().await;
    migrate(&url).await.unwrap();
    Some(PgConnection::connect(&url).await.unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start-up advice is given on a database that compares by a
    /// locale (libc or ICU) and not on one that compares bytes.
    #[tokio::test]
    async fn a_database_that_compares_by_a_locale_is_told_apart() {
        let Some(cluster) = crate::pgtest::cluster() else {
            return;
        };
        let url = cluster.database().await;
        let pool = PgPool::connect(&url).await.unwrap();
        assert_eq!(compares_by_locale(&pool).await.unwrap(), None, "the test cluster is C");
        for (name, locale) in [
            ("collate_libc", "LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8'"),
            (
                "collate_icu",
                "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LC_COLLATE 'C' LC_CTYPE 'C'",
            ),
        ] {
            let name = format!("{name}_{}", std::process::id());
            sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE template0 {locale}"))
                .execute(&pool)
                .await
                .unwrap();
            let other = PgPool::connect(&url.replace(url.rsplit('/').next().unwrap(), &name))
                .await
                .unwrap();
            assert!(compares_by_locale(&other).await.unwrap().is_some(), "{locale}");
        }
    }
}
