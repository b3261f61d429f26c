//! Removing one operation and everything of it but its idempotency record
//! (retention and tenant deletion, `plan::retention`, call it).

use super::*;

pub(super) async fn operation_remove(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    removal: Removal,
    now: Timestamp,
) -> Result<()> {
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
    // An expired operation's events stay for their partition's drop
    // (`history.rs`); nothing reads the events of a removed operation.
    if removal == Removal::Erased {
        sqlx::query("DELETE FROM operation_events WHERE op_seq = (SELECT seq FROM operations WHERE id = $1)")
            .bind(id)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    for sql in [
        "DELETE FROM results WHERE operation_id = $1",
        "DELETE FROM operation_uploads WHERE operation_id = $1",
        "DELETE FROM webhook_attempts WHERE operation_id = $1",
        "DELETE FROM webhook_deliveries WHERE operation_id = $1",
        "DELETE FROM tasks WHERE operation_id = $1",
        "DELETE FROM operations WHERE id = $1",
    ] {
        sqlx::query(sql).bind(id).execute(&mut *c).await.map_err(db)?;
    }
    Ok(())
}
