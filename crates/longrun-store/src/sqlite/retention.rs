//! Removing one operation and everything of it but its idempotency record
//! (retention and tenant deletion, `plan::retention`, call it).

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
