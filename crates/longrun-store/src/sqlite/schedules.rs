//! Schedules and their firing records (docs/schedules.md): the shared
//! statements of `shared::schedules`, bound and run.

use super::*;

fn schedule_row(r: &Row<'_>) -> rusqlite::Result<ScheduleValues> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

fn schedules(rows: rusqlite::Result<Vec<ScheduleValues>>) -> Result<Vec<ScheduleRecord>> {
    rows?.into_iter().map(schedule_from_values).collect()
}

fn bind(v: &ScheduleValues) -> [&dyn rusqlite::ToSql; 10] {
    [&v.0, &v.1, &v.2, &v.3, &v.4, &v.5, &v.6, &v.7, &v.8, &v.9]
}

pub(super) fn schedule_insert(c: &Connection, s: &ScheduleRecord) -> Result<()> {
    c.prepare_cached(SCHEDULE_INSERT)?
        .execute(&bind(&schedule_values(s))[..])?;
    Ok(())
}

pub(super) fn schedule_update(c: &Connection, s: &ScheduleRecord, expected_version: i64) -> Result<bool> {
    let v = schedule_values(s);
    let mut values = bind(&v).to_vec();
    values.push(&expected_version);
    Ok(c.prepare_cached(SCHEDULE_UPDATE)?.execute(&values[..])? == 1)
}

pub(super) fn schedule_get(c: &Connection, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>> {
    let row = c
        .prepare_cached(SCHEDULE_GET)?
        .query_row(params![id.as_str(), tenant], schedule_row)
        .optional()?;
    row.map(schedule_from_values).transpose()
}

pub(super) fn schedule_list(
    c: &Connection,
    tenant: &str,
    after: Option<&Id>,
    limit: u32,
) -> Result<Vec<ScheduleRecord>> {
    let mut stmt = c.prepare_cached(SCHEDULE_LIST)?;
    let rows = stmt.query_map(params![tenant, after.map_or("", |a| a.as_str()), limit], schedule_row)?;
    schedules(rows.collect())
}

pub(super) fn schedule_delete(c: &Connection, tenant: &str, id: &Id) -> Result<bool> {
    let gone = c
        .prepare_cached(SCHEDULE_DELETE)?
        .execute(params![id.as_str(), tenant])?;
    c.prepare_cached(SCHEDULE_FIRES_DELETE)?
        .execute(params![id.as_str(), tenant])?;
    Ok(gone == 1)
}

pub(super) fn schedule_due(c: &Connection, now: Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>> {
    let mut stmt = c.prepare_cached(SCHEDULE_DUE)?;
    let rows = stmt.query_map(params![now.0, limit], schedule_row)?;
    schedules(rows.collect())
}

pub(super) fn schedule_fires_record(c: &Connection, fires: &[ScheduleFire], keep_after: Timestamp) -> Result<()> {
    let sql = format!("INSERT INTO schedule_fires ({FIRE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6) {FIRE_MERGE}");
    let mut insert = c.prepare_cached(&sql)?;
    for f in fires {
        insert.execute(params![
            f.schedule_id.as_str(),
            f.fire_time.0,
            f.tenant,
            f.operation_id,
            f.decision.as_str(),
            f.recorded_at.0
        ])?;
    }
    // Each schedule's old records go once, however many of its firings came.
    let mut prune = c.prepare_cached("DELETE FROM schedule_fires WHERE schedule_id = ?1 AND fire_time < ?2")?;
    let mut pruned = std::collections::HashSet::new();
    for f in fires.iter().filter(|f| pruned.insert(f.schedule_id.as_str())) {
        prune.execute(params![f.schedule_id.as_str(), keep_after.0])?;
    }
    Ok(())
}

pub(super) fn schedule_fires(c: &Connection, id: &Id, limit: u32) -> Result<Vec<ScheduleFire>> {
    let mut stmt = c.prepare_cached(SCHEDULE_FIRES)?;
    let rows = stmt.query_map(params![id.as_str(), limit], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
    })?;
    rows.collect::<rusqlite::Result<Vec<FireValues>>>()?
        .into_iter()
        .map(fire_from_values)
        .collect()
}
