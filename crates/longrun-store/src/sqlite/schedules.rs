//! A round's firing records (docs/schedules.md), one statement each in
//! the writer's batch; everything else of schedules is `Tables`'.

use super::*;

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
