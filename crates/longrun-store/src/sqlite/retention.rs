//! Before an operation is removed (`plan::retention`): caches forget it,
//! and its objects become garbage.

use super::*;

/// The operation's result objects and uploaded pieces become garbage.
pub(super) fn operation_release(c: &Connection, id: &str, now: Timestamp) -> Result<()> {
    super::changes::touch(id);
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE operation_id = ?1 AND state <> 'expired'",
    )?
    .execute(params![id, now.0])?;
    pieces_drop(c, id, None, None, now)
}
