//! Schedules and their firing records (docs/schedules.md): the shared
//! statements of `shared::schedules` in `$N` form, bound and run; a
//! round's page moves on in one `UPDATE … FROM unnest` and records its
//! firings in one insert.

use super::*;

type Query<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind(q: Query<'_>, v: ScheduleValues) -> Query<'_> {
    q.bind(v.0)
        .bind(v.1)
        .bind(v.2)
        .bind(v.3)
        .bind(v.4)
        .bind(v.5)
        .bind(v.6)
        .bind(v.7)
        .bind(v.8)
        .bind(v.9)
}

impl PostgresStore {
    pub(super) async fn schedule_insert_row(&self, s: &ScheduleRecord) -> Result<()> {
        bind(sqlx::query(&pg(SCHEDULE_INSERT)), schedule_values(s))
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    pub(super) async fn schedule_update_row(&self, s: &ScheduleRecord, expected_version: i64) -> Result<bool> {
        let changed = bind(sqlx::query(&pg(SCHEDULE_UPDATE)), schedule_values(s))
            .bind(expected_version)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(changed.rows_affected() == 1)
    }

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

    pub(super) async fn schedule_get_row(&self, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>> {
        let row: Option<ScheduleValues> = sqlx::query_as(&pg(SCHEDULE_GET))
            .bind(id.as_str())
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.map(schedule_from_values).transpose()
    }

    pub(super) async fn schedule_list_rows(
        &self,
        tenant: &str,
        after: Option<&Id>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>> {
        let rows: Vec<ScheduleValues> = sqlx::query_as(&pg(SCHEDULE_LIST))
            .bind(tenant)
            .bind(after.map_or("", |a| a.as_str()))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.into_iter().map(schedule_from_values).collect()
    }

    pub(super) async fn schedule_delete_row(&self, tenant: &str, id: &Id) -> Result<bool> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let gone = sqlx::query(&pg(SCHEDULE_DELETE))
            .bind(id.as_str())
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(&pg(SCHEDULE_FIRES_DELETE))
            .bind(id.as_str())
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(gone.rows_affected() == 1)
    }

    pub(super) async fn schedule_due_rows(&self, now: Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>> {
        let rows: Vec<ScheduleValues> = sqlx::query_as(&pg(SCHEDULE_DUE))
            .bind(now.0)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.into_iter().map(schedule_from_values).collect()
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

    pub(super) async fn schedule_fires_rows(&self, id: &Id, limit: u32) -> Result<Vec<ScheduleFire>> {
        let rows: Vec<FireValues> = sqlx::query_as(&pg(SCHEDULE_FIRES))
            .bind(id.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.into_iter().map(fire_from_values).collect()
    }
}
