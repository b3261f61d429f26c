//! Schedules' rows, written once for both drivers: the statements (in
//! SQLite's `?N` form), the values a schedule binds, how a row's columns
//! become a record, and the scripts `Tables` runs. Only a round's batch
//! writes stay per driver (PostgreSQL's `unnest` forms reuse the column
//! list and [`FIRE_MERGE`]).

use longrun_core::schedule::FireDecision;

use super::*;

/// A schedule's values, bound as `?1`…`?10` and read in this order: id,
/// tenant, version, paused, spec, next_fire_at, last_operation_id,
/// buffered_fire_at, created_at, updated_at.
pub(crate) type ScheduleValues = (
    String,
    String,
    i64,
    bool,
    String,
    Option<i64>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
);

/// A firing record's columns as read: schedule, tenant, time, operation,
/// decision, when recorded.
pub(crate) type FireValues = (String, String, i64, Option<String>, String, i64);

pub(crate) const SCHEDULE_INSERT: &str = "INSERT INTO schedules (id, tenant, version, paused, spec, next_fire_at,
    last_operation_id, buffered_fire_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// The compare-and-set: `?1`…`?10` as [`ScheduleValues`], `?11` the
/// version the change was based on.
pub(crate) const SCHEDULE_UPDATE: &str = "UPDATE schedules SET version = ?3, paused = ?4, spec = ?5,
    next_fire_at = ?6, last_operation_id = ?7, buffered_fire_at = ?8, created_at = ?9, updated_at = ?10
    WHERE id = ?1 AND tenant = ?2 AND version = ?11";

pub(crate) const SCHEDULE_GET: &str = "SELECT id, tenant, version, paused, spec, next_fire_at, last_operation_id,
    buffered_fire_at, created_at, updated_at FROM schedules WHERE id = ?1 AND tenant = ?2";

/// `?1` tenant, `?2` the last id of the previous page (`''` for the first), `?3` limit.
pub(crate) const SCHEDULE_LIST: &str = "SELECT id, tenant, version, paused, spec, next_fire_at, last_operation_id,
    buffered_fire_at, created_at, updated_at FROM schedules WHERE tenant = ?1 AND id > ?2 ORDER BY id LIMIT ?3";

pub(crate) const SCHEDULE_DELETE: &str = "DELETE FROM schedules WHERE id = ?1 AND tenant = ?2";
pub(crate) const SCHEDULE_FIRES_DELETE: &str = "DELETE FROM schedule_fires WHERE schedule_id = ?1 AND tenant = ?2";

/// Due at `?1`: unpaused with a firing time come (soonest first), then
/// those holding a firing back; `?2` at most. Each arm reads its own
/// partial index, so the read does not walk the schedules that are not due.
pub(crate) const SCHEDULE_DUE: &str = "SELECT id, tenant, version, paused, spec, next_fire_at, last_operation_id,
    buffered_fire_at, created_at, updated_at FROM (
      SELECT * FROM (SELECT 0 AS arm, s.* FROM schedules s WHERE NOT paused AND next_fire_at <= ?1
                      ORDER BY next_fire_at LIMIT ?2) came
      UNION ALL
      SELECT * FROM (SELECT 1 AS arm, s.* FROM schedules s
                      WHERE buffered_fire_at IS NOT NULL AND NOT paused AND (next_fire_at > ?1 OR next_fire_at IS NULL)
                      LIMIT ?2) held
    ) due ORDER BY arm, next_fire_at LIMIT ?2";

/// `?1` schedule, `?2` limit: newest first.
pub(crate) const SCHEDULE_FIRES: &str = "SELECT schedule_id, tenant, fire_time, operation_id, decision, recorded_at
    FROM schedule_fires WHERE schedule_id = ?1 ORDER BY fire_time DESC LIMIT ?2";

pub(crate) const FIRE_COLUMNS: &str = "schedule_id, fire_time, tenant, operation_id, decision, recorded_at";

/// How a firing time recorded again merges: the newer record wins, unless
/// it would hide the operation the older one names (two nodes that decided
/// one time differently: the one that started an operation tells the truth).
pub(crate) const FIRE_MERGE: &str = "ON CONFLICT (schedule_id, fire_time) DO UPDATE SET
    operation_id = excluded.operation_id, decision = excluded.decision, recorded_at = excluded.recorded_at
    WHERE schedule_fires.operation_id IS NULL OR excluded.operation_id IS NOT NULL";

/// What a schedule binds.
pub(crate) fn schedule_values(s: &ScheduleRecord) -> ScheduleValues {
    (
        s.id.as_str().to_owned(),
        s.tenant.clone(),
        s.version,
        s.paused,
        s.spec.to_string(),
        s.next_fire_at.map(|t| t.0),
        s.last_operation_id.clone(),
        s.buffered_fire_at.map(|t| t.0),
        s.created_at.0,
        s.updated_at.0,
    )
}

/// A schedule row as a record.
pub(crate) fn schedule_from_values(v: ScheduleValues) -> Result<ScheduleRecord> {
    let (id, tenant, version, paused, spec, next, last, buffered, created, updated) = v;
    Ok(ScheduleRecord {
        spec: serde_json::from_str(&spec).map_err(|e| StoreError::Corrupt(format!("schedule {id} spec: {e}")))?,
        id: Id::from_trusted(id),
        tenant,
        version,
        paused,
        next_fire_at: next.map(Timestamp),
        last_operation_id: last,
        buffered_fire_at: buffered.map(Timestamp),
        created_at: Timestamp(created),
        updated_at: Timestamp(updated),
    })
}

/// A firing record row as a record.
pub(crate) fn fire_from_values(v: FireValues) -> Result<ScheduleFire> {
    let (schedule_id, tenant, fire_time, operation_id, decision, recorded_at) = v;
    Ok(ScheduleFire {
        decision: FireDecision::parse(&decision)
            .ok_or_else(|| StoreError::Corrupt(format!("schedule {schedule_id} decision {decision:?}")))?,
        schedule_id: Id::from_trusted(schedule_id),
        tenant,
        fire_time: Timestamp(fire_time),
        operation_id,
        recorded_at: Timestamp(recorded_at),
    })
}

fn schedule(r: &Row) -> Result<ScheduleRecord> {
    schedule_from_values((
        r.text(0)?,
        r.text(1)?,
        r.int(2)?,
        r.bool(3)?,
        r.text(4)?,
        r.opt_int(5)?,
        r.opt_text(6)?,
        r.opt_int(7)?,
        r.int(8)?,
        r.int(9)?,
    ))
}

fn schedule_args(s: &ScheduleRecord) -> Vec<Val> {
    let v = schedule_values(s);
    vec![
        v.0.into(),
        v.1.into(),
        v.2.into(),
        v.3.into(),
        v.4.into(),
        v.5.into(),
        v.6.into(),
        v.7.into(),
        v.8.into(),
        v.9.into(),
    ]
}

pub(crate) fn schedule_insert(s: &ScheduleRecord) -> Script<()> {
    Script::one(SCHEDULE_INSERT, schedule_args(s), nothing)
}

/// The compare-and-set: whether the schedule was still at `expected_version`.
pub(crate) fn schedule_update(s: &ScheduleRecord, expected_version: i64) -> Script<bool> {
    let mut args = schedule_args(s);
    args.push(expected_version.into());
    Script::one(SCHEDULE_UPDATE, args, changed_one)
}

pub(crate) fn schedule_get(tenant: &str, id: &Id) -> Script<Option<ScheduleRecord>> {
    Script::one(SCHEDULE_GET, vec![id.as_str().into(), tenant.into()], |d| {
        optional(d, schedule)
    })
}

pub(crate) fn schedule_list(tenant: &str, after: Option<&Id>, limit: u32) -> Script<Vec<ScheduleRecord>> {
    Script::one(
        SCHEDULE_LIST,
        vec![
            tenant.into(),
            after.map_or("", |a| a.as_str()).into(),
            i64::from(limit).into(),
        ],
        |d| all(d, schedule),
    )
}

/// Deletes the schedule and its firing records; whether it was there.
pub(crate) fn schedule_delete(tenant: &str, id: &Id) -> Script<bool> {
    let args = || -> Vec<Val> { vec![id.as_str().into(), tenant.into()] };
    Script {
        stmts: vec![
            Stmt {
                sql: SCHEDULE_FIRES_DELETE,
                args: args(),
            },
            Stmt {
                sql: SCHEDULE_DELETE,
                args: args(),
            },
        ],
        decode: changed_one,
    }
}

pub(crate) fn schedule_due(now: Timestamp, limit: u32) -> Script<Vec<ScheduleRecord>> {
    Script::one(SCHEDULE_DUE, vec![now.into(), i64::from(limit).into()], |d| {
        all(d, schedule)
    })
}

pub(crate) fn schedule_fires(id: &Id, limit: u32) -> Script<Vec<ScheduleFire>> {
    Script::one(SCHEDULE_FIRES, vec![id.as_str().into(), i64::from(limit).into()], |d| {
        all(d, |r| {
            fire_from_values((r.text(0)?, r.text(1)?, r.int(2)?, r.opt_text(3)?, r.text(4)?, r.int(5)?))
        })
    })
}
