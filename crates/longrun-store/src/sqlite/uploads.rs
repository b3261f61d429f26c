//! Uploads, the pieces of resumable artifacts and uploaded results, and the
//! garbage their objects become.

use super::*;

/// Drops the piece rows of `operation_id` (of `name`, at or past `from`,
/// when given); each object becomes garbage once no row names it, unless
/// it is `keep` (a single piece that became the result itself).
pub(super) fn pieces_drop(
    c: &Connection,
    operation_id: &str,
    only: Option<(&str, i64)>,
    keep: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let (name, from) = only.map_or((None, 0), |(n, f)| (Some(n), f));
    let dropped: Vec<String> = c
        .prepare_cached(
            "DELETE FROM artifact_pieces WHERE operation_id = ?1 AND (?2 IS NULL OR name = ?2) AND piece_offset >= ?3
             RETURNING storage_key",
        )?
        .query_map(params![operation_id, name, from], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for key in dropped {
        c.prepare_cached(
            "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
             SELECT ?1, ?2 WHERE ?1 IS NOT ?3 AND NOT EXISTS (SELECT 1 FROM artifact_pieces WHERE storage_key = ?1)",
        )?
        .execute(params![key, now.0, keep])?;
    }
    Ok(())
}

/// See `Store::artifact_keys_named`: each key is looked up by the indexes
/// that name objects (results' and pieces' storage keys, the upload its key
/// says it belongs to).
pub(super) fn artifact_keys_named(c: &Connection, keys: &[String]) -> Result<Vec<String>> {
    let mut named = Vec::new();
    for key in keys {
        let found: bool = c
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM results WHERE storage_key = ?1)
                     OR EXISTS (SELECT 1 FROM artifact_pieces WHERE storage_key = ?1)
                     OR EXISTS (SELECT 1 FROM uploads WHERE id = ?2 AND instr(chunks, ?3) > 0)",
            )?
            .query_row(params![key, upload_of_key(key), key_in_chunks(key)], |r| r.get(0))?;
        if found {
            named.push(key.clone());
        }
    }
    Ok(named)
}
