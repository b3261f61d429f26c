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

pub(super) fn pieces_of(c: &Connection, operation_id: &str, name: &str) -> Result<Vec<(i64, UploadChunk)>> {
    Ok(c.prepare_cached(
        "SELECT piece_offset, storage_key, size_bytes FROM artifact_pieces
          WHERE operation_id = ?1 AND name = ?2 ORDER BY piece_offset",
    )?
    .query_map(params![operation_id, name], |r| {
        Ok((
            r.get(0)?,
            UploadChunk {
                storage_key: r.get(1)?,
                size_bytes: r.get(2)?,
            },
        ))
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn artifact_piece_add(c: &Connection, p: &ArtifactPieceParams) -> Result<Vec<UploadChunk>> {
    fenced(c, &p.operation_id, &p.lease_token)?;
    let id = p.operation_id.as_str();
    let pieces = pieces_of(c, id, &p.name)?;
    let kept = piece_placement(&pieces, p.offset)?;
    if kept < pieces.len() {
        pieces_drop(c, id, Some((&p.name, p.offset)), None, p.now)?;
    }
    c.prepare_cached(
        "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, p.name, p.offset, p.piece.storage_key, p.piece.size_bytes])?;
    let mut now_held: Vec<UploadChunk> = pieces.into_iter().take(kept).map(|(_, piece)| piece).collect();
    now_held.push(p.piece.clone());
    Ok(now_held)
}

pub(super) fn artifact_pieces(
    c: &Connection,
    operation_id: &Id,
    lease_token: &str,
    name: &str,
) -> Result<Vec<UploadChunk>> {
    fenced(c, operation_id, lease_token)?;
    Ok(pieces_of(c, operation_id.as_str(), name)?
        .into_iter()
        .map(|(_, piece)| piece)
        .collect())
}

pub(super) fn result_upload(c: &Connection, p: &ResultUploadParams) -> Result<()> {
    fenced(c, &p.operation_id, &p.lease_token)?;
    if p.joins_pieces {
        pieces_drop(
            c,
            p.operation_id.as_str(),
            Some((&p.name, 0)),
            Some(&p.storage_key),
            p.now,
        )?;
    }
    // One upload per name: a new one replaces this attempt's earlier one of
    // the name, and whatever earlier attempts left.
    let replaced =
        "FROM results WHERE operation_id = ?1 AND state = 'uploaded' AND (name = ?2 OR lease_token IS NOT ?3)";
    c.prepare_cached(&format!(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) SELECT storage_key, ?4 {replaced}"
    ))?
    .execute(params![p.operation_id.as_str(), p.name, p.lease_token, p.now.0])?;
    c.prepare_cached(&format!("DELETE {replaced}"))?.execute(params![
        p.operation_id.as_str(),
        p.name,
        p.lease_token
    ])?;
    let tenant: String = c
        .prepare_cached("SELECT tenant FROM operations WHERE id = ?1")?
        .query_row(params![p.operation_id.as_str()], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO results (id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state,
                              lease_token, created_at, name)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'uploaded', ?8, ?9, ?10)",
    )?
    .execute(params![
        p.result_id.as_str(),
        p.operation_id.as_str(),
        tenant,
        p.storage_key,
        p.content_type,
        p.size_bytes,
        p.sha256,
        p.lease_token,
        p.now.0,
        p.name
    ])?;
    Ok(())
}

pub(super) fn artifact_garbage(c: &Connection, limit: u32) -> Result<Vec<String>> {
    Ok(
        c.prepare_cached("SELECT storage_key FROM artifact_garbage ORDER BY created_at LIMIT ?1")?
            .query_map(params![limit], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?,
    )
}

pub(super) fn artifact_garbage_done(c: &Connection, keys: &[String]) -> Result<()> {
    for key in keys {
        c.prepare_cached("DELETE FROM artifact_garbage WHERE storage_key = ?1")?
            .execute(params![key])?;
    }
    Ok(())
}

/// Deletes an upload's row; its objects become garbage.
pub(super) fn upload_drop(c: &Connection, id: &str, now: Timestamp) -> Result<()> {
    let chunks: Option<String> = c
        .prepare_cached("DELETE FROM uploads WHERE id = ?1 RETURNING chunks")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    for chunk in chunks_from_json(chunks.as_deref().unwrap_or("[]")) {
        c.prepare_cached("INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2)")?
            .execute(params![chunk.storage_key, now.0])?;
    }
    Ok(())
}

pub(super) fn upload_for_task(
    c: &Connection,
    operation_id: &Id,
    lease_token: &str,
    upload_id: &Id,
) -> Result<Option<UploadRecord>> {
    fenced(c, operation_id, lease_token)?;
    script::run(c, &upload_named_by(operation_id, upload_id))
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

/// Who holds the right to append to upload `id` (the tenant's, when given).
pub(super) fn upload_lease(c: &Connection, tenant: Option<&str>, id: &Id) -> Result<Option<UploadLease>> {
    Ok(c.prepare_cached(
        "SELECT appending_token, appending_until FROM uploads WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)",
    )?
    .query_row(params![id.as_str(), tenant], |r| {
        Ok(UploadLease {
            token: r.get(0)?,
            until: r.get::<_, Option<i64>>(1)?.map(Timestamp),
        })
    })
    .optional()?)
}
