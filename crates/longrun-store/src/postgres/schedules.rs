//! Schedules and their firing records (docs/schedules.md): rows the
//! firing service reads when due and changes by compare-and-set.

use longrun_core::schedule::FireDecision;

use super::*;

const SCHEDULE_COLUMNS: &str =
    "id, tenant, version, paused, spec, next_fire_at, last_operation_id, buffered_fire_at, created_at, updated_at";

fn schedule_from_row(r: &PgRow) -> Result<ScheduleRecord> {
    let spec: String = r.try_get(4).map_err(db)?;
    Ok(ScheduleRecord {
        id: Id::from_trusted(r.try_get::<String, _>(0).map_err(db)?),
        tenant: r.try_get(1).map_err(db)?,
        version: r.try_get(2).map_err(db)?,
        paused: r.try_get(3).map_err(db)?,
        spec: serde_json::from_str(&spec).map_err(|e| StoreError::Corrupt(format!("schedule spec: {e}")))?,
        next_fire_at: r.try_get::<Option<i64>, _>(5).map_err(db)?.map(Timestamp),
        last_operation_id: r.try_get(6).map_err(db)?,
        buffered_fire_at: r.try_get::<Option<i64>, _>(7).map_err(db)?.map(Timestamp),
        created_at: Timestamp(r.try_get(8).map_err(db)?),
        updated_at: Timestamp(r.try_get(9).map_err(db)?),
    })
}

/// A compare-and-set of one schedule on `c`: whether it was still at
/// `expected_version` (and so changed).
async fn update_row(c: &mut PgConnection, s: &ScheduleRecord, expected_version: i64) -> Result<bool> {
    let changed = sqlx::query(
        "UPDATE schedules SET version = $3, paused = $4, spec = $5, next_fire_at = $6, last_operation_id = $7,
                buffered_fire_at = $8, updated_at = $9
          WHERE id = $1 AND tenant = $2 AND version = $10",
    )
    .bind(s.id.as_str())
    .bind(&s.tenant)
    .bind(s.version)
    .bind(s.paused)
    .bind(s.spec.to_string())
    .bind(s.next_fire_at.map(|t| t.0))
    .bind(&s.last_operation_id)
    .bind(s.buffered_fire_at.map(|t| t.0))
    .bind(s.updated_at.0)
    .bind(expected_version)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(changed.rows_affected() == 1)
}

impl PostgresStore {
    pub(super) async fn schedule_insert_row(&self, s: &ScheduleRecord) -> Result<()> {
        sqlx::query(&format!(
            "INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        ))
        .bind(s.id.as_str())
        .bind(&s.tenant)
        .bind(s.version)
        .bind(s.paused)
        .bind(s.spec.to_string())
        .bind(s.next_fire_at.map(|t| t.0))
        .bind(&s.last_operation_id)
        .bind(s.buffered_fire_at.map(|t| t.0))
        .bind(s.created_at.0)
        .bind(s.updated_at.0)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    pub(super) async fn schedule_update_row(&self, s: &ScheduleRecord, expected_version: i64) -> Result<bool> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        update_row(&mut c, s, expected_version).await
    }

    /// Every update in one statement (a round's page): one round trip and
    /// one commit, whatever its size. A page names each schedule once.
    pub(super) async fn schedule_update_rows(&self, updates: &[(ScheduleRecord, i64)]) -> Result<Vec<bool>> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
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
        .bind(
            updates
                .iter()
                .map(|(s, _)| s.id.as_str().to_owned())
                .collect::<Vec<_>>(),
        )
        .bind(updates.iter().map(|(s, _)| s.tenant.clone()).collect::<Vec<_>>())
        .bind(updates.iter().map(|(s, _)| s.version).collect::<Vec<_>>())
        .bind(updates.iter().map(|(s, _)| s.paused).collect::<Vec<_>>())
        .bind(updates.iter().map(|(s, _)| s.spec.to_string()).collect::<Vec<_>>())
        .bind(
            updates
                .iter()
                .map(|(s, _)| s.next_fire_at.map(|t| t.0))
                .collect::<Vec<_>>(),
        )
        .bind(
            updates
                .iter()
                .map(|(s, _)| s.last_operation_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            updates
                .iter()
                .map(|(s, _)| s.buffered_fire_at.map(|t| t.0))
                .collect::<Vec<_>>(),
        )
        .bind(updates.iter().map(|(s, _)| s.updated_at.0).collect::<Vec<_>>())
        .bind(updates.iter().map(|(_, expected)| *expected).collect::<Vec<_>>())
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let changed: std::collections::HashSet<String> = rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(db)?;
        Ok(updates.iter().map(|(s, _)| changed.contains(s.id.as_str())).collect())
    }

    pub(super) async fn schedule_get_row(&self, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = $1 AND tenant = $2"
        ))
        .bind(id.as_str())
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        row.as_ref().map(schedule_from_row).transpose()
    }

    pub(super) async fn schedule_list_rows(
        &self,
        tenant: &str,
        after: Option<&Id>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3"
        ))
        .bind(tenant)
        .bind(after.map_or("", |a| a.as_str()))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(schedule_from_row).collect()
    }

    pub(super) async fn schedule_delete_row(&self, tenant: &str, id: &Id) -> Result<bool> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let gone = sqlx::query("DELETE FROM schedules WHERE id = $1 AND tenant = $2")
            .bind(id.as_str())
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = $1 AND tenant = $2")
            .bind(id.as_str())
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(gone.rows_affected() == 1)
    }

    pub(super) async fn schedule_due_rows(&self, now: Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules
              WHERE NOT paused AND (next_fire_at <= $1 OR buffered_fire_at IS NOT NULL)
              ORDER BY next_fire_at LIMIT $2"
        ))
        .bind(now.0)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(schedule_from_row).collect()
    }

    pub(super) async fn schedule_fires_record_rows(&self, fires: &[ScheduleFire], keep_after: Timestamp) -> Result<()> {
        if fires.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query(
            "INSERT INTO schedule_fires (schedule_id, fire_time, tenant, operation_id, decision, recorded_at)
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[])
             ON CONFLICT (schedule_id, fire_time) DO UPDATE SET operation_id = excluded.operation_id,
                 decision = excluded.decision, recorded_at = excluded.recorded_at
              WHERE schedule_fires.operation_id IS NULL OR excluded.operation_id IS NOT NULL",
        )
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
        let rows = sqlx::query(
            "SELECT schedule_id, tenant, fire_time, operation_id, decision, recorded_at FROM schedule_fires
              WHERE schedule_id = $1 ORDER BY fire_time DESC LIMIT $2",
        )
        .bind(id.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|r| {
                let decision: String = r.try_get(4).map_err(db)?;
                Ok(ScheduleFire {
                    schedule_id: Id::from_trusted(r.try_get::<String, _>(0).map_err(db)?),
                    tenant: r.try_get(1).map_err(db)?,
                    fire_time: Timestamp(r.try_get(2).map_err(db)?),
                    operation_id: r.try_get(3).map_err(db)?,
                    decision: FireDecision::parse(&decision)
                        .ok_or_else(|| StoreError::Corrupt(format!("schedule decision {decision:?}")))?,
                    recorded_at: Timestamp(r.try_get(5).map_err(db)?),
                })
            })
            .collect()
    }
}
