//! Retention and tenant deletion: removing expired operations (tombstones
//! for their window), their records, results, deliveries and uploads.

use super::*;

/// Deletes everything of one operation but its idempotency record; its
/// result objects become garbage.
pub(super) fn operation_remove(c: &Connection, id: &str, now: Timestamp) -> Result<()> {
    super::changes::touch(id);
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE operation_id = ?1 AND state <> 'expired'",
    )?
    .execute(params![id, now.0])?;
    pieces_drop(c, id, None, None, now)?;
    for sql in [
        "DELETE FROM results WHERE operation_id = ?1",
        "DELETE FROM operation_uploads WHERE operation_id = ?1",
        // Found through the operation's row, so before it goes (below).
        "DELETE FROM operation_events WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1)",
        "DELETE FROM webhook_attempts WHERE operation_id = ?1",
        "DELETE FROM webhook_deliveries WHERE operation_id = ?1",
        "DELETE FROM tasks WHERE operation_id = ?1",
        "DELETE FROM operations WHERE id = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![id])?;
    }
    Ok(())
}

pub(super) fn retention_sweep(c: &Connection, p: &RetentionParams) -> Result<RetentionCounts> {
    let mut counts = RetentionCounts::default();
    let now = p.now.0;

    // Results past their lifetime: the operation stays `succeeded`; the bytes go.
    let expired: Vec<(String, String, String)> = c
        .prepare_cached(
            "SELECT id, operation_id, storage_key FROM results
              WHERE state = 'published' AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, _operation_id, key) in expired {
        c.prepare_cached("UPDATE results SET state = 'expired' WHERE id = ?1")?
            .execute(params![id])?;
        c.prepare_cached("INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2)")?
            .execute(params![key, now])?;
        counts.results_expired += 1;
    }

    // Operations past their retention: removed, with a tombstone. The
    // tombstone window counts from the operation's expiry (when readers began
    // to see it gone), not from when this sweep got to it.
    type Removable = (String, String, i64, String, Option<String>);
    let removable: Vec<Removable> = c
        .prepare_cached(
            "SELECT id, tenant, expires_at, kind, idempotency_key FROM operations
              WHERE expires_at IS NOT NULL AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, tenant, expired_at, kind, key) in removable {
        operation_remove(c, &id, p.now)?;
        let tombstone_until = Timestamp(expired_at).plus(p.tombstone_retention).0;
        // The tombstone keeps the key of the idempotency record it outlives,
        // which its burial deletes.
        c.prepare_cached(
            "INSERT OR REPLACE INTO tombstones (operation_id, tenant, removed_at, expires_at, kind, idempotency_key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![id, tenant, expired_at, tombstone_until, kind, key])?;
        counts.operations_removed += 1;
    }

    // Tombstones past their window: the id is forgotten, its key freed.
    type Buried = (String, String, Option<String>, Option<String>);
    let buried: Vec<Buried> = c
        .prepare_cached(
            "SELECT operation_id, tenant, kind, idempotency_key FROM tombstones WHERE expires_at <= ?1
              ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, tenant, kind, key) in buried {
        c.prepare_cached(
            "DELETE FROM idempotency_keys WHERE tenant = ?2 AND kind = ?3 AND key = ?4 AND operation_id = ?1",
        )?
        .execute(params![id, tenant, kind, key])?;
        c.prepare_cached("DELETE FROM tombstones WHERE operation_id = ?1")?
            .execute(params![id])?;
        counts.tombstones_removed += 1;
    }

    // Finished deliveries and their log, past the delivery retention.
    let cutoff = p.now.minus(p.delivery_retention).0;
    let finished: Vec<String> = c
        .prepare_cached(
            "SELECT event_id FROM webhook_deliveries WHERE status <> 'pending' AND created_at <= ?1
              ORDER BY created_at LIMIT ?2",
        )?
        .query_map(params![cutoff, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for event_id in finished {
        c.prepare_cached("DELETE FROM webhook_attempts WHERE event_id = ?1")?
            .execute(params![event_id])?;
        c.prepare_cached("DELETE FROM webhook_deliveries WHERE event_id = ?1")?
            .execute(params![event_id])?;
        counts.deliveries_removed += 1;
    }

    // Uploads past their expiry that no operation names.
    let unused: Vec<String> = c
        .prepare_cached(
            "SELECT id FROM uploads WHERE expires_at <= ?1
                AND NOT EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
              ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in unused {
        upload_drop(c, &id, p.now)?;
        counts.uploads_removed += 1;
    }
    Ok(counts)
}

pub(super) fn tenant_delete(c: &Connection, tenant: &str, now: Timestamp) -> Result<TenantDeleteCounts> {
    let mut counts = TenantDeleteCounts::default();
    let ids: Vec<String> = c
        .prepare_cached("SELECT id FROM operations WHERE tenant = ?1")?
        .query_map(params![tenant], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let count = |sql: &str| -> Result<u64> {
        let n: i64 = c.query_row(sql, params![tenant], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    counts.results = count("SELECT COUNT(*) FROM results WHERE tenant = ?1")?;
    counts.deliveries = count("SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = ?1")?;
    for id in &ids {
        operation_remove(c, id, now)?;
    }
    counts.operations = ids.len() as u64;
    // Results of operations already removed (expired ones have no object left).
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE tenant = ?1 AND state <> 'expired'",
    )?
    .execute(params![tenant, now.0])?;
    counts.keys = c
        .prepare_cached("DELETE FROM api_keys WHERE tenant = ?1")?
        .execute(params![tenant])? as u64;
    let uploads: Vec<String> = c
        .prepare_cached("SELECT id FROM uploads WHERE tenant = ?1")?
        .query_map(params![tenant], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in &uploads {
        upload_drop(c, id, now)?;
    }
    counts.uploads = uploads.len() as u64;
    for sql in [
        "DELETE FROM results WHERE tenant = ?1",
        "DELETE FROM idempotency_keys WHERE tenant = ?1",
        "DELETE FROM tombstones WHERE tenant = ?1",
        "DELETE FROM webhook_deliveries WHERE tenant = ?1",
        "DELETE FROM webhook_secrets WHERE tenant = ?1",
        "DELETE FROM tenant_dispatch WHERE tenant = ?1",
        "DELETE FROM tasks WHERE tenant = ?1 AND status IN ('ready', 'leased')",
        "DELETE FROM tenants WHERE name = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![tenant])?;
    }
    Ok(counts)
}
