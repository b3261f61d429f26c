//! Retention and tenant deletion: removing expired operations (tombstones
//! for their window), their records, results, deliveries and uploads.

use super::*;

pub(super) async fn operation_remove(c: &mut PgConnection, ch: &mut Changes, id: &str, now: Timestamp) -> Result<()> {
    ch.touch(id);
    sqlx::query(
        "INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, $2 FROM results WHERE operation_id = $1 AND state <> 'expired' ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    pieces_drop(c, id, None, None, now).await?;
    for sql in [
        "DELETE FROM results WHERE operation_id = $1",
        "DELETE FROM operation_uploads WHERE operation_id = $1",
        "DELETE FROM operation_events WHERE operation_id = $1",
        "DELETE FROM webhook_attempts WHERE operation_id = $1",
        "DELETE FROM webhook_deliveries WHERE operation_id = $1",
        "DELETE FROM tasks WHERE operation_id = $1",
        "DELETE FROM operations WHERE id = $1",
    ] {
        sqlx::query(sql).bind(id).execute(&mut *c).await.map_err(db)?;
    }
    Ok(())
}

pub(super) async fn retention_sweep(
    c: &mut PgConnection,
    ch: &mut Changes,
    p: &RetentionParams,
) -> Result<RetentionCounts> {
    let mut counts = RetentionCounts::default();
    let (now, limit) = (p.now.0, i64::from(p.limit));
    let rows = rows_of(
        c,
        "SELECT id, storage_key FROM results WHERE state = 'published' AND expires_at <= $1
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let key: String = r.try_get(1).map_err(db)?;
        sqlx::query("UPDATE results SET state = 'expired' WHERE id = $1")
            .bind(id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query("INSERT INTO artifact_garbage (storage_key, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        counts.results_expired += 1;
    }
    let rows = rows_of(
        c,
        "SELECT id, tenant, expires_at, kind, idempotency_key FROM operations
          WHERE expires_at IS NOT NULL AND expires_at <= $1
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let tenant: String = r.try_get(1).map_err(db)?;
        // The tombstone window counts from the expiry, when readers began to
        // see the operation gone, not from when this sweep got to it.
        let expired_at: i64 = r.try_get(2).map_err(db)?;
        let kind: String = r.try_get(3).map_err(db)?;
        let key: Option<String> = r.try_get(4).map_err(db)?;
        let until = Timestamp(expired_at).plus(p.tombstone_retention).0;
        operation_remove(c, ch, &id, p.now).await?;
        // The tombstone keeps the key of the idempotency record it outlives,
        // which its burial deletes.
        sqlx::query(
            "INSERT INTO tombstones (operation_id, tenant, removed_at, expires_at, kind, idempotency_key)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (operation_id) DO UPDATE SET removed_at = excluded.removed_at, expires_at = excluded.expires_at,
                                                      kind = excluded.kind, idempotency_key = excluded.idempotency_key",
        )
        .bind(&id)
        .bind(tenant)
        .bind(expired_at)
        .bind(until)
        .bind(kind)
        .bind(key)
        .execute(&mut *c)
        .await
        .map_err(db)?;
        counts.operations_removed += 1;
    }
    // Tombstones past their window, and the idempotency records they kept,
    // in one statement: the id is forgotten, its key freed.
    let buried: i64 = sqlx::query_scalar(
        "WITH buried AS (
             DELETE FROM tombstones WHERE operation_id IN (
                 SELECT operation_id FROM tombstones WHERE expires_at <= $1
                  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING operation_id, tenant, kind, idempotency_key),
         freed AS (
             DELETE FROM idempotency_keys k USING buried b
              WHERE k.tenant = b.tenant AND k.kind = b.kind AND k.key = b.idempotency_key
                AND k.operation_id = b.operation_id)
         SELECT count(*) FROM buried",
    )
    .bind(now)
    .bind(limit)
    .fetch_one(&mut *c)
    .await
    .map_err(db)?;
    counts.tombstones_removed += u64::try_from(buried).unwrap_or(0);
    let cutoff = p.now.minus(p.delivery_retention).0;
    let finished = ids(
        c,
        "SELECT event_id FROM webhook_deliveries WHERE status <> 'pending' AND created_at <= $1
          ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        cutoff,
        limit,
    )
    .await?;
    for event_id in finished {
        sqlx::query("DELETE FROM webhook_attempts WHERE event_id = $1")
            .bind(&event_id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM webhook_deliveries WHERE event_id = $1")
            .bind(&event_id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        counts.deliveries_removed += 1;
    }
    let unused = ids(
        c,
        "SELECT id FROM uploads WHERE expires_at <= $1
            AND NOT EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
          ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .await?;
    for id in unused {
        upload_drop(c, &id, p.now).await?;
        counts.uploads_removed += 1;
    }
    Ok(counts)
}

pub(super) async fn tenant_delete(
    c: &mut PgConnection,
    ch: &mut Changes,
    tenant: &str,
    now: Timestamp,
) -> Result<TenantDeleteCounts> {
    let mut counts = TenantDeleteCounts::default();
    let rows = sqlx::query("SELECT id FROM operations WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let op_ids: Vec<String> = rows.iter().map(|r| r.try_get(0).map_err(db)).collect::<Result<_>>()?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    counts.results = count(
        sqlx::query_scalar("SELECT COUNT(*) FROM results WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?,
    );
    counts.deliveries = count(
        sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?,
    );
    for id in &op_ids {
        operation_remove(c, ch, id, now).await?;
    }
    counts.operations = op_ids.len() as u64;
    let uploads: Vec<String> = sqlx::query_scalar("SELECT id FROM uploads WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    for id in &uploads {
        upload_drop(c, id, now).await?;
    }
    counts.uploads = uploads.len() as u64;
    sqlx::query(
        "INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, $2 FROM results WHERE tenant = $1 AND state <> 'expired' ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    counts.keys = sqlx::query("DELETE FROM api_keys WHERE tenant = $1")
        .bind(tenant)
        .execute(&mut *c)
        .await
        .map_err(db)?
        .rows_affected();
    for sql in [
        "DELETE FROM results WHERE tenant = $1",
        "DELETE FROM idempotency_keys WHERE tenant = $1",
        "DELETE FROM tombstones WHERE tenant = $1",
        "DELETE FROM webhook_deliveries WHERE tenant = $1",
        "DELETE FROM webhook_secrets WHERE tenant = $1",
        "DELETE FROM tenant_dispatch WHERE tenant = $1",
        "DELETE FROM tasks WHERE tenant = $1 AND status IN ('ready', 'leased')",
        "DELETE FROM tenants WHERE name = $1",
    ] {
        sqlx::query(sql).bind(tenant).execute(&mut *c).await.map_err(db)?;
    }
    Ok(counts)
}
