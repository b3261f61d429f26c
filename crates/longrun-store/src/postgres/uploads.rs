//! Uploads and the pieces of resumable artifacts, and the garbage their
//! objects become.

use super::*;

/// Drops the piece rows of `operation_ids` (of `name`, at or past `from`,
/// when given); each object becomes garbage once no row of another
/// operation names it (the statement sees the rows as they were before
/// its own delete), unless it is `keep` (a single piece that became the
/// result itself).
pub(super) async fn pieces_drop(
    c: &mut PgConnection,
    operation_ids: &[&str],
    only: Option<(&str, i64)>,
    keep: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let (name, from) = only.map_or((None, 0), |(n, f)| (Some(n), f));
    sqlx::query(
        "WITH gone AS (DELETE FROM artifact_pieces
                        WHERE operation_id = ANY($1) AND ($2::TEXT IS NULL OR name = $2) AND piece_offset >= $3
                    RETURNING storage_key)
         INSERT INTO artifact_garbage (storage_key, created_at)
         SELECT DISTINCT storage_key, $4 FROM gone
          WHERE storage_key IS DISTINCT FROM $5
            AND NOT EXISTS (SELECT 1 FROM artifact_pieces p
                             WHERE p.storage_key = gone.storage_key AND p.operation_id <> ALL($1))
         ON CONFLICT DO NOTHING",
    )
    .bind(operation_ids)
    .bind(name)
    .bind(from)
    .bind(now.0)
    .bind(keep)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}
