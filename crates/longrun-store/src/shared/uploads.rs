//! Client uploads' rows as [`Script`]s both stores run; the use cases that
//! lock, decide and write them are `plan/uploads.rs`.

use super::*;

fn upload(r: &Row) -> Result<UploadRecord> {
    Ok(UploadRecord {
        id: Id::from_trusted(r.text(0)?),
        tenant: r.text(1)?,
        content_type: r.text(2)?,
        offset: r.int(3)?,
        complete: r.bool(4)?,
        sha256: r.opt_text(5)?,
        expected_sha256: r.opt_text(6)?,
        chunks: chunks_from_json(&r.text(7)?),
        created_at: r.ts(8)?,
        expires_at: r.ts(9)?,
        referenced: r.bool(10)?,
    })
}

/// `SELECT` of an upload's columns (as [`upload`] reads them) `FROM
/// uploads`, then `$rest`.
macro_rules! upload_select {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant, content_type, upload_offset, complete, sha256, expected_sha256, chunks, created_at,
                    expires_at, EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
               FROM uploads ",
            $rest
        )
    };
}

/// `SELECT` of who holds the right to append to an upload (`?1`, of the
/// tenant `?2` when not `NULL`), then `$rest`.
macro_rules! upload_lease_select {
    ($rest:literal) => {
        concat!(
            "SELECT appending_token, appending_until FROM uploads WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)",
            $rest
        )
    };
}

/// Storage keys of objects to delete, oldest garbage first.
pub(crate) fn artifact_garbage(limit: u32) -> Script<Vec<String>> {
    Script::one(
        "SELECT storage_key FROM artifact_garbage ORDER BY created_at LIMIT ?1",
        vec![i64::from(limit).into()],
        |d| all(d, |r| r.text(0)),
    )
}

/// Forgets the garbage of `keys`, in one statement however many there
/// are (they go as one JSON array).
pub(crate) fn artifact_garbage_done(keys: &[String]) -> Script<()> {
    Script::one(
        "DELETE FROM artifact_garbage WHERE storage_key IN
           (SELECT value FROM {sqlite: json_each(?1)}{pg: json_array_elements_text(?1::JSON)})",
        vec![serde_json::to_string(keys).expect("strings serialize").into()],
        nothing,
    )
}

/// Who holds the right to append to upload `id` (the tenant's, when one is
/// named); on PostgreSQL locked for the rest of the transaction when
/// `locked` (the plan's appends take it so).
pub(crate) fn upload_lease(tenant: Option<&str>, id: &Id, locked: bool) -> Script<Option<UploadLease>> {
    let sql = if locked {
        upload_lease_select!(" {for_update}")
    } else {
        upload_lease_select!("")
    };
    Script::one(sql, vec![id.as_str().into(), tenant.into()], |d| {
        optional(d, |r| {
            Ok(UploadLease {
                token: r.opt_text(0)?,
                until: r.opt_ts(1)?,
            })
        })
    })
}

/// The tenant's upload.
pub(crate) fn upload_get(tenant: &str, id: &Id) -> Script<Option<UploadRecord>> {
    Script::one(
        upload_select!("WHERE id = ?1 AND tenant = ?2"),
        vec![id.as_str().into(), tenant.into()],
        |d| optional(d, upload),
    )
}

/// The tenant's upload, locked for the rest of the transaction.
pub(crate) fn upload_locked(tenant: &str, id: &Id) -> Script<Option<UploadRecord>> {
    Script::one(
        upload_select!("WHERE id = ?1 AND tenant = ?2 {for_update}"),
        vec![id.as_str().into(), tenant.into()],
        |d| optional(d, upload),
    )
}

/// The upload `upload_id` as the worker holding `lease_token` on
/// `operation_id` may read it: `LeaseLost` unless the lease is current (the
/// task leased with that token, the operation running), then the upload if
/// the operation names it.
pub(crate) fn upload_for_task(operation_id: &Id, lease_token: &str, upload_id: &Id) -> Script<Option<UploadRecord>> {
    Script {
        stmts: vec![
            Stmt {
                // Not a join: see `sqlite/finish.rs` (a join on a bound
                // parameter is prepared again on every use there).
                sql: "SELECT 1 FROM operations WHERE id = ?1 AND state = 'running'
                         AND EXISTS (SELECT 1 FROM tasks WHERE operation_id = ?1 AND status = 'leased'
                                                           AND lease_token = ?2)",
                args: vec![operation_id.as_str().into(), lease_token.into()],
            },
            Stmt {
                sql: upload_select!(
                    "WHERE id = ?1 AND EXISTS (SELECT 1 FROM operation_uploads WHERE operation_id = ?2 AND upload_id = ?1)"
                ),
                args: vec![upload_id.as_str().into(), operation_id.as_str().into()],
            },
        ],
        decode: |d| {
            if d.before.first().is_none_or(Vec::is_empty) {
                return Err(StoreError::LeaseLost);
            }
            optional(d, upload)
        },
    }
}

pub(crate) fn upload_insert(p: &UploadCreateParams) -> Script<()> {
    Script::one(
        "INSERT INTO uploads (id, tenant, content_type, upload_offset, complete, expected_sha256, chunks, created_at,
                              expires_at)
         VALUES (?1, ?2, ?3, 0, ?4, ?5, '[]', ?6, ?7)",
        vec![
            p.id.as_str().into(),
            p.tenant.as_str().into(),
            p.content_type.as_str().into(),
            false.into(),
            p.expected_sha256.clone().into(),
            p.now.into(),
            p.expires_at.into(),
        ],
        nothing,
    )
}

/// Writes what an append or a completion decided.
pub(crate) fn upload_store(u: &UploadRecord) -> Script<()> {
    Script::one(
        "UPDATE uploads SET upload_offset = ?2, complete = ?3, sha256 = ?4, expected_sha256 = ?5, chunks = ?6
          WHERE id = ?1",
        vec![
            u.id.as_str().into(),
            u.offset.into(),
            u.complete.into(),
            u.sha256.clone().into(),
            u.expected_sha256.clone().into(),
            chunks_to_json(&u.chunks).into(),
        ],
        nothing,
    )
}

/// Objects no row names any more, deleted by retention (object first).
pub(crate) fn garbage_add(keys: &[String], now: Timestamp) -> Script<()> {
    Script {
        stmts: keys
            .iter()
            .map(|key| Stmt {
                sql: "INSERT INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                args: vec![key.as_str().into(), now.into()],
            })
            .collect(),
        decode: nothing,
    }
}

/// The pieces of an operation's resumable artifact `name`, by offset.
pub(crate) fn pieces_of(operation_id: &str, name: &str) -> Script<Vec<(i64, UploadChunk)>> {
    Script::one(
        "SELECT piece_offset, storage_key, size_bytes FROM artifact_pieces
          WHERE operation_id = ?1 AND name = ?2 ORDER BY piece_offset",
        vec![operation_id.into(), name.into()],
        |d| {
            all(d, |r| {
                Ok((
                    r.int(0)?,
                    UploadChunk {
                        storage_key: r.text(1)?,
                        size_bytes: r.int(2)?,
                    },
                ))
            })
        },
    )
}

pub(crate) fn piece_insert(p: &ArtifactPieceParams) -> Script<()> {
    Script::one(
        "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        vec![
            p.operation_id.as_str().into(),
            p.name.as_str().into(),
            p.offset.into(),
            p.piece.storage_key.as_str().into(),
            p.piece.size_bytes.into(),
        ],
        nothing,
    )
}

/// One upload per name: a new one replaces this attempt's earlier one of
/// the name, and whatever earlier attempts left; their objects become
/// garbage.
pub(crate) fn results_replaced(p: &ResultUploadParams) -> Script<()> {
    let args = || -> Vec<Val> {
        vec![
            p.operation_id.as_str().into(),
            p.name.as_str().into(),
            p.lease_token.as_str().into(),
        ]
    };
    let mut with_now = args();
    with_now.push(p.now.into());
    Script {
        stmts: vec![
            Stmt {
                sql: "INSERT INTO artifact_garbage (storage_key, created_at)
                      SELECT storage_key, ?4 FROM results
                       WHERE operation_id = ?1 AND state = 'uploaded' AND (name = ?2 OR lease_token IS DISTINCT FROM ?3)
                      ON CONFLICT DO NOTHING",
                args: with_now,
            },
            Stmt {
                sql: "DELETE FROM results
                       WHERE operation_id = ?1 AND state = 'uploaded' AND (name = ?2 OR lease_token IS DISTINCT FROM ?3)",
                args: args(),
            },
        ],
        decode: nothing,
    }
}

/// A result artifact uploaded under the lease, published by the outcome.
pub(crate) fn result_insert(p: &ResultUploadParams) -> Script<()> {
    Script::one(
        "INSERT INTO results (id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state,
                              lease_token, created_at, name)
         SELECT ?1, ?2, tenant, ?3, ?4, ?5, ?6, 'uploaded', ?7, ?8, ?9 FROM operations WHERE id = ?2",
        vec![
            p.result_id.as_str().into(),
            p.operation_id.as_str().into(),
            p.storage_key.as_str().into(),
            p.content_type.as_str().into(),
            p.size_bytes.into(),
            p.sha256.as_str().into(),
            p.lease_token.as_str().into(),
            p.now.into(),
            p.name.as_str().into(),
        ],
        nothing,
    )
}
