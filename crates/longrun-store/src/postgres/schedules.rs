//! A round of the schedules' firing (docs/schedules.md) on PostgreSQL:
//! its page moves on in one `UPDATE … FROM unnest` and records its
//! firings in one insert; everything else of schedules is `Tables`'.

use super::*;

impl PostgresStore {
    /// Every update in one statement (a round's page): one round trip and
    /// one commit, whatever its size. A page names each schedule once.
    pub(super) async fn schedule_update_rows(&self, updates: &[(ScheduleRecord, i64)]) -> Result<Vec<bool>> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<ScheduleValues> = updates.iter().map(|(s, _)| schedule_values(s)).collect();
        let column = |f: fn(&ScheduleValues) -> String| values.iter().map(f).collect::<Vec<_>>();
        let rows = sqlx::query(
            "UPDATE schedules s SET version = u.version, paused = u.paused, spec = u.spec,
                    next_fire_at = u.next_fire_at, last_operation_id = u.last_operation_id,
                    buffered_fire_at = u.buffered_fire_at, updated_at = u.updated_at
               FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bool[], $5::text[], $6::bigint[],
                           $7::text[], $8::bigint[], $9::bigint[], $10::bigint[])
                    AS u(id, tenant, version, paused, spec, next_fire_at, last_operation_id, buffered_fire_at,
                         updated_at, expected)
              WHERE s.id = u.id AND s.tenant = u.tenant AND s.version = u.expected
             RETURNING s.id",
        )
        .bind(column(|v| v.0.clone()))
        .bind(column(|v| v.1.clone()))
        .bind(values.iter().map(|v| v.2).collect::<Vec<_>>())
        .bind(values.iter().map(|v| v.3).collect::<Vec<_>>())
        .bind(column(|v| v.4.clone()))
        .bind(values.iter().map(|v| v.5).collect::<Vec<_>>())
        .bind(values.iter().map(|v| v.6.clone()).collect::<Vec<_>>())
        .bind(values.iter().map(|v| v.7).collect::<Vec<_>>())
        .bind(values.iter().map(|v| v.9).collect::<Vec<_>>())
        .bind(updates.iter().map(|(_, expected)| *expected).collect::<Vec<_>>())
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let changed: std::collections::HashSet<String> = rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(db)?;
        Ok(values.iter().map(|v| changed.contains(&v.0)).collect())
    }

    pub(super) async fn schedule_fires_record_rows(&self, fires: &[ScheduleFire], keep_after: Timestamp) -> Result<()> {
        if fires.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query(&format!(
            "INSERT INTO schedule_fires ({FIRE_COLUMNS})
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[])
             {FIRE_MERGE}"
        ))
        .bind(
            fires
                .iter()
                .map(|f| f.schedule_id.as_str().to_owned())
                .collect::<Vec<_>>(),
        )
        .bind(fires.iter().map(|f| f.fire_time.0).collect::<Vec<_>>())
        .bind(fires.iter().map(|f| f.tenant.clone()).collect::<Vec<_>>())
        .bind(fires.iter().map(|f| f.operation_id.clone()).collect::<Vec<_>>())
        .bind(fires.iter().map(|f| f.decision.as_str().to_owned()).collect::<Vec<_>>())
        .bind(fires.iter().map(|f| f.recorded_at.0).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let mut ids: Vec<String> = fires.iter().map(|f| f.schedule_id.as_str().to_owned()).collect();
        ids.sort();
        ids.dedup();
        sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = ANY($1) AND fire_time < $2")
            .bind(ids)
            .bind(keep_after.0)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)
    }
}
