//! The history's partitions (schema 16): `operation_events` is partitioned
//! by the operation's `seq`; the retention pass makes the next partition
//! ahead and drops a partition once no operation of its range remains.
//!
//! Each step is its own transaction under an advisory lock (one node at a
//! time), a short `lock_timeout` and a `statement_timeout`: creating or
//! dropping a partition takes the parent table's `ACCESS EXCLUSIVE` lock,
//! which holds every history read and write for the few milliseconds the
//! DDL takes; a step that cannot get it within the timeout gives up until
//! the next pass rather than queue the job path behind it. Creating a
//! partition also scans the default partition (PostgreSQL checks that no
//! row there belongs to the new range): normally empty, but should rows
//! pile up there (an upkeep that could not run for long), the scan is cut
//! at 1 s and the history lives on in the default partition, its removed
//! operations' rows deleted a batch a pass, as before partitioning.

use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

/// Taken for each step, so that nodes do not make or drop partitions at once.
const UPKEEP_LOCK: i64 = 7_723_002;
/// The narrowest and widest partition, in `seq` numbers.
const MIN_WIDTH: i64 = 100_000;
const MAX_WIDTH: i64 = 50_000_000;
pub(super) const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;
/// The highest `seq` handed out so far (whether its operation is still
/// there or not; retention removes the newest too).
const HIGHEST_SEQ: &str = "SELECT last_value FROM operations_seq_seq";

/// Runs `body` as a step: its own transaction under the advisory lock
/// `upkeep`, committed when `body` returns `Some`, rolled back when it
/// returns `None` or fails; `None` as well when another node holds the
/// lock. The rollback is awaited here, whatever the step's end, so the
/// step's locks (the advisory one among them) are gone when it returns: a
/// transaction merely dropped is rolled back only when the pool tests its
/// connection, in a task of its own; and a failed one's error reaches us
/// before PostgreSQL has aborted it and let its locks go, which the
/// rollback waits for. A pass going on at once (the next partition, a
/// retry) would otherwise find the upkeep taken and pass it over. The
/// webhook deliveries' partitions take steps alike.
pub(super) async fn in_step<T>(
    pool: &PgPool,
    upkeep: i64,
    body: impl AsyncFnOnce(&mut PgConnection) -> Result<Option<T>>,
) -> Result<Option<T>> {
    let mut tx = pool
        .begin_with("BEGIN; SET LOCAL lock_timeout = '100ms'; SET LOCAL statement_timeout = '1s'")
        .await
        .map_err(db)?;
    let mine = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(upkeep)
        .fetch_one(&mut *tx)
        .await
        .map_err(db);
    let done = match mine {
        Ok(true) => body(&mut tx).await,
        Ok(false) => Ok(None),
        Err(e) => Err(e),
    };
    match done {
        Ok(Some(done)) => {
            tx.commit().await.map_err(db)?;
            Ok(Some(done))
        }
        Ok(None) => {
            tx.rollback().await.map_err(db)?;
            Ok(None)
        }
        Err(e) => {
            // The step's error is the one to tell (a rollback that fails
            // too leaves the connection to the pool's test, as before).
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Whether `e` is the `lock_timeout` of a step (or a row that reached the
/// default partition meanwhile): the step waits for the next pass.
pub(super) fn deferred(e: &StoreError) -> bool {
    let StoreError::Postgres(e) = e else { return false };
    let sqlx::Error::Database(d) = e.as_ref() else {
        return false;
    };
    // lock_not_available; query_canceled (the statement timeout);
    // check_violation (of the default partition's new bound, by a row that
    // reached it after the range was chosen).
    matches!(d.code().as_deref(), Some(LOCK_NOT_AVAILABLE | "57014" | "23514"))
}

/// The partition that holds `lo..`.
fn partition(lo: i64) -> String {
    format!("operation_events_{lo}")
}

/// The width of the next partition: about a day of submissions at the pace
/// since the newest was made (`made_at_seq` handed out then, `made_at`
/// when), within bounds.
pub(super) fn next_width(made_at_seq: i64, made_at: i64, max_seq: i64, now: Timestamp) -> i64 {
    let age = (now.0 - made_at).max(HOUR_MS);
    let per_day = i128::from((max_seq - made_at_seq).max(0)) * i128::from(DAY_MS) / i128::from(age);
    i64::try_from(per_day).unwrap_or(MAX_WIDTH).clamp(MIN_WIDTH, MAX_WIDTH)
}

pub(super) async fn history_upkeep(
    pool: &PgPool,
    strays_from: &AtomicI64,
    now: Timestamp,
    limit: u32,
) -> Result<HistoryUpkeep> {
    let mut done = HistoryUpkeep::default();
    // Read once for the pass: a sequence only grows, and a partition made
    // or passed over on a value a moment old is made or dropped next pass.
    let max_seq: i64 = sqlx::query_scalar(HIGHEST_SEQ).fetch_one(pool).await.map_err(db)?;
    match make_ahead(pool, max_seq, now).await {
        Ok(made) => done.partitions_created = made,
        Err(e) if deferred(&e) => {
            tracing::info!(error = %e, "history: making partitions ahead waits for the next pass");
            done.steps_deferred += 1;
        }
        Err(e) => return Err(e),
    }
    // Every seq below `max_seq` was handed out before now, by the
    // database's clock: a partition seen closed for the first time
    // notes when (its operations' ids were made before, see `Span`).
    sqlx::query(&format!(
        "UPDATE history_partitions SET closed_clock = {DB_NOW} WHERE hi <= $1 AND closed_clock IS NULL"
    ))
    .bind(max_seq)
    .execute(pool)
    .await
    .map_err(db)?;
    /// `lo`, `hi`, `detached`, `made_clock`, `closed_clock`.
    type Listed = (i64, i64, bool, Option<i64>, Option<i64>);
    let closed: Vec<Listed> = sqlx::query_as(
        "SELECT lo, hi, detached, made_clock, closed_clock FROM history_partitions
          WHERE hi <= $1 OR detached ORDER BY lo",
    )
    .bind(max_seq)
    .fetch_all(pool)
    .await
    .map_err(db)?;
    for (lo, hi, detached, made, closed) in closed {
        let detachable = Detachable::history(&Span {
            lo,
            hi,
            made: made.zip(closed),
        });
        if detached {
            // Detached by a pass that stopped before dropping it.
            drop_detached(pool, &detachable).await?;
            done.partitions_dropped += 1;
            continue;
        }
        match detach_and_drop(pool, &detachable).await {
            Ok(dropped) => done.partitions_dropped += u64::from(dropped),
            Err(e) if deferred(&e) => {
                tracing::info!(error = %e, partition = partition(lo), "history: a drop waits for the next pass");
                done.steps_deferred += 1;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    done.strays_removed = strays_remove(pool, strays_from, limit).await?;
    Ok(done)
}

/// Deletes the default partition's rows of removed operations, looking at
/// `limit` operations' rows a call from where the last call stopped (its
/// key order; back to the start once through): a call costs as much
/// whatever the default partition holds.
async fn strays_remove(pool: &PgPool, strays_from: &AtomicI64, limit: u32) -> Result<u64> {
    let (last, seen, removed): (Option<i64>, i64, i64) = sqlx::query_as(
        "WITH seen AS (
             SELECT DISTINCT op_seq FROM operation_events_default WHERE op_seq > $1 ORDER BY op_seq LIMIT $2
         ), gone AS (
             SELECT s.op_seq FROM seen s WHERE NOT EXISTS (SELECT 1 FROM operations o WHERE o.seq = s.op_seq)
         ), removed AS (
             DELETE FROM operation_events_default d USING gone g WHERE d.op_seq = g.op_seq RETURNING 1
         )
         SELECT (SELECT MAX(op_seq) FROM seen), (SELECT COUNT(*) FROM seen), (SELECT COUNT(*) FROM removed)",
    )
    .bind(strays_from.load(Ordering::Relaxed))
    .bind(i64::from(limit))
    .fetch_one(pool)
    .await
    .map_err(db)?;
    let through = seen < i64::from(limit);
    strays_from.store(if through { -1 } else { last.unwrap_or(-1) }, Ordering::Relaxed);
    Ok(u64::try_from(removed).unwrap_or(0))
}

/// Makes the next partition once the newest is half used; returns how many
/// it made (0 or 1).
async fn make_ahead(pool: &PgPool, max_seq: i64, now: Timestamp) -> Result<u64> {
    let made = in_step(pool, UPKEEP_LOCK, async |tx| {
        let (lo, hi, made_at, made_at_seq): (i64, i64, i64, i64) =
            sqlx::query_as("SELECT lo, hi, created_at, made_at_seq FROM history_partitions ORDER BY lo DESC LIMIT 1")
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?
                .unwrap_or((0, 0, now.0, 0));
        if hi > 0 && max_seq < lo + (hi - lo) / 2 {
            return Ok(None);
        }
        let width = next_width(made_at_seq, made_at, max_seq, now);
        // Rows that reached the default partition (a burst past `hi`) stay
        // there: the new range begins above them.
        let strays_top: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(op_seq) + 1, 0) FROM operation_events_default")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        let new_lo = hi.max(strays_top);
        let new_hi = (new_lo + width).max(max_seq + width);
        let create = format!(
            "CREATE TABLE {} PARTITION OF operation_events FOR VALUES FROM ({new_lo}) TO ({new_hi})",
            partition(new_lo)
        );
        sqlx::query(&create).execute(&mut *tx).await.map_err(db)?;
        // When no seq of the range was handed out yet, the database's clock
        // now is before every one of its operations' ids was made.
        let made_clock = if max_seq < new_lo { DB_NOW } else { "NULL" };
        sqlx::query(&format!(
            "INSERT INTO history_partitions (lo, hi, created_at, made_at_seq, made_clock)
             VALUES ($1, $2, $3, $4, {made_clock})"
        ))
        .bind(new_lo)
        .bind(new_hi)
        .bind(now.0)
        .bind(max_seq)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        Ok(Some(1))
    })
    .await?;
    Ok(made.unwrap_or(0))
}

/// A partition to detach and drop: each of its tables with its parent, the
/// upkeep's advisory lock, its row in the bookkeeping table (the table,
/// and a condition naming the row), and the statement that says whether
/// anything still uses it (one boolean).
pub(super) struct Detachable {
    pub upkeep: i64,
    pub tables: Vec<(&'static str, String)>,
    pub listed_in: &'static str,
    pub row: String,
    pub in_use: String,
}

impl Detachable {
    /// The history partition of `span`: in use while an operation of its
    /// range remains.
    fn history(span: &Span) -> Self {
        Self {
            upkeep: UPKEEP_LOCK,
            tables: vec![("operation_events", partition(span.lo))],
            listed_in: "history_partitions",
            row: format!("lo = {}", span.lo),
            in_use: live(span),
        }
    }
}

/// Detaches `p` and drops it if its `in_use` finds nothing using it;
/// returns whether it went. The history's and the webhook deliveries' partitions
/// go this way.
///
/// `in_use` is asked once without the parents' lock, so that a partition
/// still in use is passed over without holding anything up, then again
/// under it: a transaction that already wrote there holds the lock, so
/// what it wrote is seen; one that writes after finds no partition for its
/// row, which goes to the default partition. Under the lock the partition
/// is only detached (milliseconds) and marked so; its files go after, by a
/// drop that holds no lock of the parents (a drop under the lock held it
/// for 161 ms on a day of a million deliveries, 4 ms detached;
/// docs/scaling.md). A partition another node detached since it was
/// listed (read under the same advisory lock) is passed over; one left
/// detached by a pass that stopped is dropped by the next
/// ([`drop_detached`]).
pub(super) async fn detach_and_drop(pool: &PgPool, p: &Detachable) -> Result<bool> {
    let detached = in_step(pool, p.upkeep, async |tx| {
        let listed = format!("SELECT NOT detached FROM {} WHERE {}", p.listed_in, p.row);
        let attached: Option<bool> = sqlx::query_scalar(&listed).fetch_optional(&mut *tx).await.map_err(db)?;
        let in_use =
            async |c: &mut PgConnection| sqlx::query_scalar::<_, bool>(&p.in_use).fetch_one(c).await.map_err(db);
        if attached != Some(true) || in_use(&mut *tx).await? {
            return Ok(None);
        }
        let parents: Vec<&str> = p.tables.iter().map(|(parent, _)| *parent).collect();
        let lock = format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", parents.join(", "));
        sqlx::query(&lock).execute(&mut *tx).await.map_err(db)?;
        if in_use(&mut *tx).await? {
            return Ok(None);
        }
        for (parent, table) in &p.tables {
            let detach = format!("ALTER TABLE {parent} DETACH PARTITION {table}");
            sqlx::query(&detach).execute(&mut *tx).await.map_err(db)?;
        }
        let mark = format!("UPDATE {} SET detached = TRUE WHERE {}", p.listed_in, p.row);
        sqlx::query(&mark).execute(&mut *tx).await.map_err(db)?;
        Ok(Some(()))
    })
    .await?;
    if detached.is_none() {
        return Ok(false);
    }
    drop_detached(pool, p).await?;
    Ok(true)
}

/// Drops the tables of `p`, detached from their parents, and forgets it.
pub(super) async fn drop_detached(pool: &PgPool, p: &Detachable) -> Result<()> {
    let tables: Vec<&str> = p.tables.iter().map(|(_, table)| table.as_str()).collect();
    let mut tx = pool.begin().await.map_err(db)?;
    let drop = format!("DROP TABLE IF EXISTS {}", tables.join(", "));
    sqlx::query(&drop).execute(&mut *tx).await.map_err(db)?;
    let forget = format!("DELETE FROM {} WHERE {}", p.listed_in, p.row);
    sqlx::query(&forget).execute(&mut *tx).await.map_err(db)?;
    tx.commit().await.map_err(db)
}

/// The database's clock, in milliseconds.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";
/// How far a node's clock (which stamps ids) may run ahead of the
/// database's (which stamps partitions).
const CLOCK_SKEW_MS: i64 = 10 * 60_000;
/// How long before its seq an operation's id may have been made (a
/// submission's id is made before its row is written).
const ID_AHEAD_MS: i64 = DAY_MS;

/// A closed partition, and when its operations' ids were made if known.
pub(super) struct Span {
    lo: i64,
    hi: i64,
    /// The database's clock when the partition was made (before any of
    /// its seqs was handed out) and when it was first seen closed (after
    /// all were); `None` for a partition made before schema 19, or made
    /// after a burst had already handed out seqs of its range.
    made: Option<(i64, i64)>,
}

/// The statement that says whether any operation of the span remains.
///
/// `operations` has no index by `seq` (one would cost every accept and
/// every finish an entry), so a range of seqs alone is a scan of the whole
/// table, seconds at ten million, past the step's one-second timeout:
/// such a partition would never be dropped. Ids begin with the
/// millisecond they were made and the key reads them in that order, so a
/// span whose times are known is looked for by id: first between its
/// making and its closing (plus the clocks' skew), where a remaining
/// operation almost always is; then, only when none is there, in the day
/// before its making (an operation whose id was made well before its row
/// was written). Operations of a partition made before schema 19 may have
/// ids of older shapes, which do not sort by time: those are looked for
/// by seq, as before. (Literals, not parameters: the statement is run
/// twice a pass at most, by [`detach_and_drop`].)
fn live(span: &Span) -> String {
    let Span { lo, hi, made } = span;
    let Some((made, closed)) = made else {
        return format!("SELECT EXISTS (SELECT 1 FROM operations WHERE seq >= {lo} AND seq < {hi})");
    };
    let id_at =
        |ms: i64| literal(Id::lowest_at(longrun_core::IdKind::Operation, u64::try_from(ms).unwrap_or(0)).as_str());
    let (from, to) = (id_at(made - CLOCK_SKEW_MS), id_at(closed + CLOCK_SKEW_MS));
    let early = id_at(made - CLOCK_SKEW_MS - ID_AHEAD_MS);
    format!(
        "SELECT EXISTS (
             (SELECT 1 FROM operations WHERE id >= {from} AND id < {to} AND seq >= {lo} AND seq < {hi} LIMIT 1)
             UNION ALL
             (SELECT 1 FROM operations WHERE id >= {early} AND id < {from} AND seq >= {lo} AND seq < {hi} LIMIT 1))"
    )
}

/// `s` as an SQL string literal (partition bounds cannot be parameters).
pub(super) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check of a partition whose times are known reads the key by id
    /// (never a scan of every operation, which the seq alone needs).
    #[tokio::test]
    async fn a_remaining_operation_is_looked_for_by_its_id() {
        let Some(mut c) = super::super::migrated_connection().await else {
            return;
        };
        sqlx::query("SET enable_seqscan = off").execute(&mut c).await.unwrap();
        let span = Span {
            lo: 0,
            hi: 100,
            made: Some((1_800_000_000_000, 1_800_000_100_000)),
        };
        let sql = format!("EXPLAIN {}", live(&span));
        let plan: Vec<String> = sqlx::query_scalar(&sql).fetch_all(&mut c).await.unwrap();
        let plan = plan.join("\n");
        assert_eq!(plan.matches("operations_pkey").count(), 2, "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }

    /// A step whose body fails has let go of the upkeep's lock by the time
    /// it returns, so the next step, on another connection, can take it.
    /// PostgreSQL sends a statement's error before it aborts the
    /// transaction and lets go of its locks: a step that only dropped its
    /// failed transaction left the lock held for that moment. (A scratch
    /// loop of such drops, each followed at once by another connection
    /// asking, found the lock taken 54 times in 3,000 on a busy machine, 1
    /// idle, 0 with the rollback awaited; this test, asking 1,000 times,
    /// does not reliably catch the dropped form: it states the promise.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_that_fails_lets_go_of_the_upkeep_before_it_returns() {
        let Some(cluster) = crate::pgtest::cluster() else {
            return;
        };
        let url = cluster.database().await;
        let pool = PgPool::connect(&url).await.unwrap();
        let mut other = PgConnection::connect(&url).await.unwrap();
        for _ in 0..1000 {
            let failed: Result<Option<()>> = in_step(&pool, UPKEEP_LOCK, async |c| {
                sqlx::query("SELECT 1 / 0").execute(&mut *c).await.map_err(db)?;
                Ok(Some(()))
            })
            .await;
            assert!(failed.is_err());
            let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(UPKEEP_LOCK)
                .fetch_one(&mut other)
                .await
                .unwrap();
            assert!(free, "the failed step still held the upkeep's lock");
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(UPKEEP_LOCK)
                .execute(&mut other)
                .await
                .unwrap();
        }
    }

    #[test]
    fn a_partition_is_about_a_day_of_submissions_wide() {
        let now = Timestamp(10 * DAY_MS);
        // 2 M submissions in the 12 hours since the newest partition was made.
        assert_eq!(next_width(1_000, now.0 - DAY_MS / 2, 2_001_000, now), 4_000_000);
        // A quiet store: the narrowest.
        assert_eq!(next_width(0, now.0 - DAY_MS, 10, now), MIN_WIDTH);
        // A burst in the first minutes counts as an hour's pace at most.
        assert_eq!(next_width(0, now.0 - 60_000, 10_000_000, now), MAX_WIDTH);
    }
}
