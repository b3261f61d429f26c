//! The webhook deliveries' partitions (schema 19): `webhook_deliveries` and
//! `webhook_attempts` are partitioned alike by `event_id`, whose text
//! begins with its creation millisecond and sorts by it, into a partition
//! per day of ids. The retention pass makes the next day's partition a day
//! ahead and drops a day once it ended a delivery retention ago and none
//! of its deliveries is pending: its finished deliveries and their log go
//! at once, leaving no dead tuple. Steps are taken as the history's are
//! (`history.rs`: an advisory lock, a short `lock_timeout`, the next pass
//! when refused).
//!
//! Rows whose id has no partition (moved here from before schema 19, ids of
//! the older shapes, a node whose clock runs behind a dropped day) are in
//! the default partitions; the retention sweep deletes those finished past
//! the retention row by row (`PgDriver::deliveries_finished`).

use super::history::{DAY_MS, Detachable, deferred, detach_and_drop, drop_detached, in_step, literal};
use super::*;

/// Taken for each step, so that nodes do not make or drop partitions at once.
const UPKEEP_LOCK: i64 = 7_723_003;
/// The partition is no longer there.
const UNDEFINED_TABLE: &str = "42P01";

/// A partition as `delivery_partitions` lists it.
struct Partition {
    hi: String,
    ends_at: i64,
    name: String,
    detached: bool,
}

impl From<(String, i64, String, bool)> for Partition {
    fn from((hi, ends_at, name, detached): (String, i64, String, bool)) -> Self {
        Self {
            hi,
            ends_at,
            name,
            detached,
        }
    }
}

/// The partition's tables, deliveries then attempts.
fn tables(name: &str) -> [String; 2] {
    [format!("webhook_deliveries_{name}"), format!("webhook_attempts_{name}")]
}

impl Partition {
    /// What to detach and drop: both tables, the row listing them; in use
    /// while one of its deliveries is pending. No delivery joins a day
    /// that has ended (new ids are of now), and a finished delivery is
    /// never written again; only a pending one is (an attempt updates it
    /// and logs its attempt).
    fn detachable(&self) -> Detachable {
        let [deliveries, attempts] = tables(&self.name);
        Detachable {
            upkeep: UPKEEP_LOCK,
            in_use: format!("SELECT EXISTS (SELECT 1 FROM {deliveries} WHERE status = 'pending')"),
            tables: vec![("webhook_deliveries", deliveries), ("webhook_attempts", attempts)],
            listed_in: "delivery_partitions",
            row: format!("hi = {}", literal(&self.hi)),
        }
    }
}

/// The first id past every id of the UTC day after tomorrow's start: the
/// bound of the partition made at `now`, and the millisecond it ends.
pub(super) fn next_end(now: Timestamp) -> (String, i64) {
    let ends_at = (now.0.div_euclid(DAY_MS) + 2) * DAY_MS;
    let hi = Id::lowest_at(longrun_core::IdKind::Event, u64::try_from(ends_at).unwrap_or(0));
    (hi.into_string(), ends_at)
}

pub(super) async fn deliveries_upkeep(pool: &PgPool, now: Timestamp, retention: Duration) -> Result<DeliveriesUpkeep> {
    let mut done = DeliveriesUpkeep::default();
    match make_ahead(pool, now).await {
        Ok(made) => done.partitions_created = made,
        Err(e) if deferred(&e) => {
            tracing::info!(error = %e, "webhook deliveries: making a partition ahead waits for the next pass");
            done.steps_deferred += 1;
        }
        Err(e) => return Err(e),
    }
    let over: Vec<(String, i64, String, bool)> = sqlx::query_as(
        "SELECT hi, ends_at, name, detached FROM delivery_partitions WHERE ends_at <= $1 OR detached ORDER BY hi",
    )
    .bind(now.minus(retention).0)
    .fetch_all(pool)
    .await
    .map_err(db)?;
    for partition in over.into_iter().map(Partition::from) {
        if partition.detached {
            // Detached by a pass that stopped before dropping it (its
            // deliveries were counted then).
            drop_detached(pool, &partition.detachable()).await?;
            continue;
        }
        match drop_if_done(pool, &partition).await {
            Ok(Some(removed)) => {
                done.partitions_dropped += 1;
                done.deliveries_removed += removed;
            }
            Ok(None) => {}
            Err(e) if deferred(&e) => {
                tracing::info!(error = %e, partition = partition.name, "webhook deliveries: a drop waits for the next pass");
                done.steps_deferred += 1;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Makes the partition of the ids up to the end of the day after tomorrow
/// once the newest ends within a day; returns how many it made (0 or 1).
async fn make_ahead(pool: &PgPool, now: Timestamp) -> Result<u64> {
    let made = in_step(pool, UPKEEP_LOCK, async |tx| {
        let newest: Option<Partition> = sqlx::query_as::<_, (String, i64, String, bool)>(
            "SELECT hi, ends_at, name, detached FROM delivery_partitions ORDER BY hi DESC LIMIT 1",
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .map(Partition::from);
        let (hi, ends_at) = next_end(now);
        if newest.as_ref().is_some_and(|p| p.ends_at >= now.0 + DAY_MS) {
            return Ok(None);
        }
        // Rows in the default partitions below the new bound stay there: the
        // new range begins above them (PostgreSQL refuses a range that would
        // take rows from the default partition).
        let strays_top: Option<String> = sqlx::query_scalar(
            "SELECT GREATEST((SELECT MAX(event_id) FROM webhook_deliveries_default WHERE event_id < $1),
                         (SELECT MAX(event_id) FROM webhook_attempts_default WHERE event_id < $1))",
        )
        .bind(&hi)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        // The least text above the newest stray (the ids are of one length).
        let above_strays = strays_top.map(|top| top + "0");
        let lo = newest.map(|p| p.hi).max(above_strays);
        if lo.as_ref().is_some_and(|lo| *lo >= hi) {
            return Ok(None);
        }
        let from = lo.as_deref().map_or_else(|| "MINVALUE".to_owned(), literal);
        let name = ends_at.to_string();
        for (table, parent) in tables(&name).iter().zip(["webhook_deliveries", "webhook_attempts"]) {
            let create = format!(
                "CREATE TABLE {table} PARTITION OF {parent} FOR VALUES FROM ({from}) TO ({})
             WITH (autovacuum_vacuum_cost_delay = 10)",
                literal(&hi)
            );
            sqlx::query(&create).execute(&mut *tx).await.map_err(db)?;
        }
        sqlx::query("INSERT INTO delivery_partitions (hi, lo, ends_at, name) VALUES ($1, $2, $3, $4)")
            .bind(&hi)
            .bind(lo.unwrap_or_default())
            .bind(ends_at)
            .bind(&name)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        Ok(Some(1))
    })
    .await?;
    Ok(made.unwrap_or(0))
}

/// Drops `partition` (deliveries and attempts, `detach_and_drop`) if none
/// of its deliveries is pending; returns how many deliveries went with it.
async fn drop_if_done(pool: &PgPool, partition: &Partition) -> Result<Option<u64>> {
    let [deliveries, _] = tables(&partition.name);
    // Counted before the step, outside its statement timeout and without
    // holding anything: nothing adds to a day that has ended.
    let count = format!("SELECT COUNT(*) FROM {deliveries}");
    let removed: i64 = match sqlx::query_scalar(&count).fetch_one(pool).await {
        Ok(removed) => removed,
        // Dropped meanwhile by another node's pass.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_TABLE) => return Ok(None),
        Err(e) => return Err(db(e)),
    };
    let dropped = detach_and_drop(pool, &partition.detachable()).await?;
    Ok(dropped.then(|| u64::try_from(removed).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_made_now_ends_at_the_start_of_the_day_after_tomorrow() {
        let now = Timestamp(20 * DAY_MS + 5);
        let (hi, ends_at) = next_end(now);
        assert_eq!(ends_at, 22 * DAY_MS);
        let made_before = Id::generate_at(longrun_core::IdKind::Event, 22 * DAY_MS as u64 - 1);
        let made_at = Id::generate_at(longrun_core::IdKind::Event, 22 * DAY_MS as u64);
        assert!(made_before.as_str() < hi.as_str() && hi.as_str() <= made_at.as_str());
        assert_eq!(literal("it's"), "'it''s'");
    }
}
