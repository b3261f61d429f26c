//! Schedules and their firing records (docs/schedules.md): rows the
//! firing service reads when due and changes by compare-and-set.

use longrun_core::schedule::FireDecision;

use super::*;

const SCHEDULE_COLUMNS: &str =
    "id, tenant, version, paused, spec, next_fire_at, last_operation_id, buffered_fire_at, created_at, updated_at";

fn schedule_from_row(r: &Row<'_>) -> rusqlite::Result<ScheduleRecord> {
    let spec: String = r.get(4)?;
    Ok(ScheduleRecord {
        id: Id::from_trusted(r.get::<_, String>(0)?),
        tenant: r.get(1)?,
        version: r.get(2)?,
        paused: r.get(3)?,
        spec: serde_json::from_str(&spec)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(4, Type::Text, e.into()))?,
        next_fire_at: r.get::<_, Option<i64>>(5)?.map(Timestamp),
        last_operation_id: r.get(6)?,
        buffered_fire_at: r.get::<_, Option<i64>>(7)?.map(Timestamp),
        created_at: Timestamp(r.get(8)?),
        updated_at: Timestamp(r.get(9)?),
    })
}

pub(super) fn schedule_insert(c: &Connection, s: &ScheduleRecord) -> Result<()> {
    c.prepare_cached(&format!(
        "INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
    ))?
    .execute(params![
        s.id.as_str(),
        s.tenant,
        s.version,
        s.paused,
        s.spec.to_string(),
        s.next_fire_at.map(|t| t.0),
        s.last_operation_id,
        s.buffered_fire_at.map(|t| t.0),
        s.created_at.0,
        s.updated_at.0
    ])?;
    Ok(())
}

pub(super) fn schedule_update(c: &Connection, s: &ScheduleRecord, expected_version: i64) -> Result<bool> {
    let changed = c
        .prepare_cached(
            "UPDATE schedules SET version = ?3, paused = ?4, spec = ?5, next_fire_at = ?6, last_operation_id = ?7,
                    buffered_fire_at = ?8, updated_at = ?9
              WHERE id = ?1 AND tenant = ?2 AND version = ?10",
        )?
        .execute(params![
            s.id.as_str(),
            s.tenant,
            s.version,
            s.paused,
            s.spec.to_string(),
            s.next_fire_at.map(|t| t.0),
            s.last_operation_id,
            s.buffered_fire_at.map(|t| t.0),
            s.updated_at.0,
            expected_version
        ])?;
    Ok(changed == 1)
}

pub(super) fn schedule_get(c: &Connection, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>> {
    Ok(c.prepare_cached(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?1 AND tenant = ?2"
    ))?
    .query_row(params![id.as_str(), tenant], schedule_from_row)
    .optional()?)
}

pub(super) fn schedule_list(
    c: &Connection,
    tenant: &str,
    after: Option<&Id>,
    limit: u32,
) -> Result<Vec<ScheduleRecord>> {
    let rows = c
        .prepare_cached(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = ?1 AND id > ?2 ORDER BY id LIMIT ?3"
        ))?
        .query_map(
            params![tenant, after.map_or("", |a| a.as_str()), limit],
            schedule_from_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn schedule_delete(c: &Connection, tenant: &str, id: &Id) -> Result<bool> {
    let gone = c
        .prepare_cached("DELETE FROM schedules WHERE id = ?1 AND tenant = ?2")?
        .execute(params![id.as_str(), tenant])?;
    c.prepare_cached("DELETE FROM schedule_fires WHERE schedule_id = ?1 AND tenant = ?2")?
        .execute(params![id.as_str(), tenant])?;
    Ok(gone == 1)
}

pub(super) fn schedule_due(c: &Connection, now: Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>> {
    let rows = c
        .prepare_cached(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules
              WHERE paused = 0 AND (next_fire_at <= ?1 OR buffered_fire_at IS NOT NULL)
              ORDER BY next_fire_at LIMIT ?2"
        ))?
        .query_map(params![now.0, limit], schedule_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn schedule_fires_record(c: &Connection, fires: &[ScheduleFire], keep_after: Timestamp) -> Result<()> {
    for f in fires {
        c.prepare_cached(
            "INSERT INTO schedule_fires (schedule_id, fire_time, tenant, operation_id, decision, recorded_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (schedule_id, fire_time) DO UPDATE SET operation_id = excluded.operation_id,
                 decision = excluded.decision, recorded_at = excluded.recorded_at
              WHERE schedule_fires.operation_id IS NULL OR excluded.operation_id IS NOT NULL",
        )?
        .execute(params![
            f.schedule_id.as_str(),
            f.fire_time.0,
            f.tenant,
            f.operation_id,
            f.decision.as_str(),
            f.recorded_at.0
        ])?;
        c.prepare_cached("DELETE FROM schedule_fires WHERE schedule_id = ?1 AND fire_time < ?2")?
            .execute(params![f.schedule_id.as_str(), keep_after.0])?;
    }
    Ok(())
}

pub(super) fn schedule_fires(c: &Connection, id: &Id, limit: u32) -> Result<Vec<ScheduleFire>> {
    let rows = c
        .prepare_cached(
            "SELECT schedule_id, tenant, fire_time, operation_id, decision, recorded_at FROM schedule_fires
              WHERE schedule_id = ?1 ORDER BY fire_time DESC LIMIT ?2",
        )?
        .query_map(params![id.as_str(), limit], |r| {
            let decision: String = r.get(4)?;
            Ok(ScheduleFire {
                schedule_id: Id::from_trusted(r.get::<_, String>(0)?),
                tenant: r.get(1)?,
                fire_time: Timestamp(r.get(2)?),
                operation_id: r.get(3)?,
                decision: FireDecision::parse(&decision).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(4, Type::Text, format!("decision {decision:?}").into())
                })?,
                recorded_at: Timestamp(r.get(5)?),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}
