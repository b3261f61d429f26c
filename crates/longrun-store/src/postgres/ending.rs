//! Ending operations: one set-based pass ends many (state and task), each
//! guarded by the version it was read at where it has one; one statement
//! publishes, one discards the uploaded results of many.

use super::*;

/// Ends each live operation of `ends` (at its guard version, where it has
/// one) in two statements — one UPDATE from arrays, one DELETE of their
/// tasks — and returns the ended ones by id; an operation that was already
/// terminal, or moved past its guard, is missing. Each ends at its own
/// `now`. What else an ending does (results, pieces, events, webhooks) is
/// the plan layer's (`plan::apply`).
pub(super) async fn operations_end(
    c: &mut PgConnection,
    policy: Policy,
    ends: &[&EndRow],
) -> Result<std::collections::HashMap<String, Operation>> {
    if ends.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    let endings: Vec<(&str, &Ending, Timestamp)> = ends.iter().map(|e| (e.id.as_str(), &e.ending, e.now)).collect();
    let versions: Vec<Option<i64>> = ends.iter().map(|e| e.guard).collect();
    let drops_input: Vec<bool> = ends.iter().map(|e| e.ending.drops_input(policy.keep_inputs)).collect();
    let ids: Vec<&str> = endings.iter().map(|(id, _, _)| *id).collect();
    let states: Vec<&str> = endings.iter().map(|(_, e, _)| e.to.as_str()).collect();
    let results: Vec<Option<String>> = endings
        .iter()
        .map(|(_, e, _)| e.result.as_ref().map(Value::to_string))
        .collect();
    let codes: Vec<Option<&str>> = endings
        .iter()
        .map(|(_, e, _)| e.error.as_ref().map(|e| e.code.as_str()))
        .collect();
    let messages: Vec<Option<&str>> = endings
        .iter()
        .map(|(_, e, _)| e.error.as_ref().map(|e| e.message.as_str()))
        .collect();
    let retryable: Vec<Option<bool>> = endings
        .iter()
        .map(|(_, e, _)| e.error.as_ref().map(|e| e.retryable))
        .collect();
    let progress: Vec<Option<String>> = endings.iter().map(|(_, e, _)| e.progress_json()).collect();
    let nows: Vec<i64> = endings.iter().map(|(_, _, now)| now.0).collect();
    let expiries: Vec<i64> = endings
        .iter()
        .map(|(_, _, now)| now.plus(policy.operation_retention).0)
        .collect();
    // Each operation is found by its id (`id = ANY($1)`, the primary key),
    // and whether it is still live is asked of the pair (`e.e_state IS
    // NULL OR …`, never true on the left): asked of `operations` alone, the
    // planner estimated it from the statistics, which, taken while nothing
    // was live, said no row is; it then read every live operation (a seq
    // scan, or `operations_by_tenant_state` with seq scans off) and
    // compared each with every ending: auto_explain showed 4.5 M rows
    // compared, 2 s, to end 233; 1.6–2.1 k jobs/s instead of 13–14 k for
    // a drain of 20 k jobs after an ANALYZE of 500 ended ones.
    let rows = sqlx::query(&format!(
        "UPDATE operations
            SET state = e.e_state, version = version + 1, result = e.e_result, error_code = e.e_code,
                error_message = e.e_message, error_retryable = e.e_retryable, completed_at = e.e_now,
                updated_at = e.e_now, expires_at = e.e_expires,
                input = CASE WHEN e.e_drop THEN NULL ELSE input END,
                progress = COALESCE(e.e_progress, progress)
           FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::BOOL[], $7::TEXT[],
                       $8::BIGINT[], $9::BIGINT[], $10::BOOL[], $11::BIGINT[])
                AS e(e_id, e_state, e_result, e_code, e_message, e_retryable, e_progress, e_now, e_expires, e_drop,
                     e_version)
          WHERE id = ANY($1::TEXT[]) AND id = e.e_id
            AND (e.e_state IS NULL OR state IN ('queued', 'running', 'paused'))
            AND (e.e_version IS NULL OR version = e.e_version)
      RETURNING {OP_COLUMNS}"
    ))
    .bind(&ids)
    .bind(&states)
    .bind(&results)
    .bind(&codes)
    .bind(&messages)
    .bind(&retryable)
    .bind(&progress)
    .bind(&nows)
    .bind(&expiries)
    .bind(&drops_input)
    .bind(&versions)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut ended = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let op = operation_of(row)?;
        ended.insert(op.id.as_str().to_owned(), op);
    }
    let ended_ids: Vec<&str> = ids.iter().copied().filter(|id| ended.contains_key(*id)).collect();
    sqlx::query("DELETE FROM tasks WHERE operation_id = ANY($1)")
        .bind(&ended_ids)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(ended)
}

/// See [`Driver::results_publish`](crate::plan::Driver::results_publish): one
/// statement for all.
pub(super) async fn results_publish(
    c: &mut PgConnection,
    policy: Policy,
    ended: &[(&str, Timestamp)],
) -> Result<Vec<(String, Vec<(String, ArtifactRef)>)>> {
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = ended.iter().map(|(id, _)| *id).collect();
    let expiries: Vec<i64> = ended
        .iter()
        .map(|(_, at)| result_expires_at(*at, policy.result_retention, policy.operation_retention).0)
        .collect();
    let rows = sqlx::query(
        "UPDATE results SET state = 'published', expires_at = p.expires
           FROM unnest($1::TEXT[], $2::BIGINT[]) AS p(op_id, expires)
          WHERE results.operation_id = p.op_id AND results.state = 'uploaded'
      RETURNING results.operation_id, results.id, results.content_type, results.size_bytes, results.sha256,
                results.expires_at, results.name",
    )
    .bind(&ids)
    .bind(&expiries)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut published: std::collections::BTreeMap<String, Vec<(String, ArtifactRef)>> = Default::default();
    for row in &rows {
        let operation_id: String = row.try_get(0).map_err(db)?;
        let artifact = ArtifactRef {
            id: Id::from_trusted(row.try_get(1).map_err(db)?),
            content_type: row.try_get(2).map_err(db)?,
            size_bytes: row.try_get(3).map_err(db)?,
            sha256: row.try_get(4).map_err(db)?,
            expires_at: Timestamp(row.try_get(5).map_err(db)?),
        };
        published
            .entry(operation_id)
            .or_default()
            .push((row.try_get(6).map_err(db)?, artifact));
    }
    Ok(published.into_iter().collect())
}

/// See [`Driver::results_discard`](crate::plan::Driver::results_discard): one
/// statement for all.
pub(super) async fn results_discard(c: &mut PgConnection, ids: &[&str], now: Timestamp) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH gone AS (DELETE FROM results WHERE operation_id = ANY($1) AND state = 'uploaded' RETURNING storage_key)
         INSERT INTO artifact_garbage (storage_key, created_at) SELECT storage_key, $2 FROM gone ON CONFLICT DO NOTHING",
    )
    .bind(ids)
    .bind(now.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}
