//! Ending an operation: state and task, written at the version it was
//! read at, and the statements that publish or discard its uploaded
//! results (what an ending does with them is the plan layer's, with its
//! event and webhook).

use super::*;

/// Ends `current`, the operation's row as just read in this transaction:
/// moves it to its terminal state, removes its dispatch record and drops
/// its input (unless kept). The ended row is [`Ending::apply`]'s,
/// written as is (at the version read), so it is not read back. `None` if
/// it had ended already or moved on since it was read.
pub(super) fn end_operation(
    c: &Connection,
    policy: WritePolicy,
    current: Operation,
    ending: &Ending,
    now: Timestamp,
) -> Result<Option<Operation>> {
    debug_assert!(ending.to.is_terminal());
    if current.state.is_terminal() {
        return Ok(None);
    }
    let read_at = current.version;
    let ended = ending.apply(current, now, policy.operation_retention, policy.keep_inputs);
    let id = ended.id.clone();
    let id = id.as_str();
    let changed = c
        .prepare_cached(
            "UPDATE OR FAIL operations
                SET state = ?2, version = ?3, result = ?4, error_code = ?5, error_message = ?6,
                    error_retryable = ?7, completed_at = ?8, updated_at = ?8, expires_at = ?9,
                    input = CASE WHEN ?10 THEN NULL ELSE input END, progress = COALESCE(?11, progress)
              WHERE id = ?1 AND version = ?12",
        )?
        .execute(params![
            id,
            ended.state.as_str(),
            ended.version,
            ended.result.as_ref().map(Value::to_string),
            ended.error.as_ref().map(|e| e.code.as_str()),
            ended.error.as_ref().map(|e| e.message.as_str()),
            ended.error.as_ref().map(|e| e.retryable),
            now.0,
            ended.expires_at.map(|t| t.0),
            ending.drops_input(policy.keep_inputs),
            ending.progress_json(),
            read_at,
        ])?;
    if changed == 0 {
        return Ok(None);
    }
    c.prepare_cached("DELETE FROM tasks WHERE operation_id = ?1")?
        .execute(params![id])?;
    Ok(Some(ended))
}

/// The uploaded artifacts of operation `id`, which ended at `now`,
/// published, if it has any (see `Driver::results_publish`).
pub(super) fn result_publish(
    c: &Connection,
    policy: WritePolicy,
    id: &str,
    now: Timestamp,
) -> Result<Vec<(String, ArtifactRef)>> {
    let expires_at = result_expires_at(now, policy.result_retention, policy.operation_retention);
    // Read, then updated (only if there is something to publish): most
    // operations have no artifact, and an UPDATE … RETURNING opens an
    // ephemeral table even when it returns nothing (see the driver's `operation_update`).
    let published: Vec<(String, ArtifactRef)> = c
        .prepare_cached(
            "SELECT name, id, content_type, size_bytes, sha256 FROM results
              WHERE operation_id = ?1 AND state = 'uploaded'",
        )?
        .query_map(params![id], |r| {
            Ok((
                r.get(0)?,
                ArtifactRef {
                    id: Id::from_trusted(r.get(1)?),
                    content_type: r.get(2)?,
                    size_bytes: r.get(3)?,
                    sha256: r.get(4)?,
                    expires_at,
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if !published.is_empty() {
        c.prepare_cached(
            "UPDATE results SET state = 'published', expires_at = ?2 WHERE operation_id = ?1 AND state = 'uploaded'",
        )?
        .execute(params![id, expires_at.0])?;
    }
    Ok(published)
}

/// Drops uploads of an operation that did not succeed: nothing is published
/// and the objects become garbage.
pub(super) fn result_discard(c: &Connection, operation_id: &str, now: Timestamp) -> Result<()> {
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE operation_id = ?1 AND state = 'uploaded'",
    )?
    .execute(params![operation_id, now.0])?;
    c.prepare_cached("DELETE FROM results WHERE operation_id = ?1 AND state = 'uploaded'")?
        .execute(params![operation_id])?;
    Ok(())
}
