//! Accepting a submission: insert-or-detect of its idempotency record, the
//! operation, its task and first event, under the tenant's quota.

use super::*;

pub(super) fn operation_accept(c: &Connection, policy: WritePolicy, p: &AcceptParams) -> Result<AcceptOutcome> {
    let d = &mut SqliteDriver::new(c, policy);
    if let Some((key, fingerprint)) = &p.idempotency {
        // Insert-or-detect: the primary key on (tenant, kind, key) is where
        // concurrent first requests converge, never an in-memory check.
        let inserted = c
            .prepare_cached(
                "INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                p.tenant,
                p.kind,
                key.as_str(),
                &fingerprint.0[..],
                p.id.as_str(),
                p.now.0
            ])?;
        if inserted == 0 {
            return block(plan::accept::taken_key(d, p));
        }
    }
    // Quotas are checked after idempotency, so a replay still answers even
    // when the tenant is at its limit. The idempotency record inserted
    // above is rolled back with this job on a refusal.
    if let Some(full) = block(plan::accept::over_quota(d, &p.tenant))? {
        return Err(full);
    }

    let labels = serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let idempotency_key = p.idempotency.as_ref().map(|(k, _)| k.as_str());
    c.prepare_cached(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, input, callback_url, deadline_at,
                                 budget_max_cost, labels, idempotency_key, created_at, updated_at, rerun_of,
                                 not_before, priority)
         VALUES (?1, ?2, ?3, 'queued', 1, 0, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        p.id.as_str(),
        p.tenant,
        p.kind,
        p.input.to_string(),
        p.callback_url,
        p.deadline_at.map(|t| t.0),
        p.budget_max_cost,
        labels,
        idempotency_key,
        p.now.0,
        p.rerun_of.as_ref().map(Id::as_str),
        p.not_before.map(|t| t.0),
        p.priority,
    ])?;
    let seq = c.last_insert_rowid();
    if p.from_checkpoint
        && let Some(original) = &p.rerun_of
    {
        c.prepare_cached(
            "UPDATE OR FAIL operations SET checkpoint = (SELECT checkpoint FROM operations WHERE id = ?2) WHERE id = ?1",
        )?
        .execute(params![p.id.as_str(), original.as_str()])?;
        // The pieces the checkpoint counts on, shared with the original.
        c.prepare_cached(
            "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
             SELECT ?1, name, piece_offset, storage_key, size_bytes FROM artifact_pieces WHERE operation_id = ?2",
        )?
        .execute(params![p.id.as_str(), original.as_str()])?;
    }
    c.prepare_cached(
        "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
         VALUES (?1, ?2, ?3, ?4, 'ready', ?5, ?6)",
    )?
    .execute(params![
        p.id.as_str(),
        seq,
        p.tenant,
        p.kind,
        p.available_at().0,
        p.priority
    ])?;
    for upload in &p.uploads {
        c.prepare_cached("INSERT OR IGNORE INTO operation_uploads (operation_id, upload_id) VALUES (?1, ?2)")?
            .execute(params![p.id.as_str(), upload.as_str()])?;
    }

    let created = created_operation(p);
    event_insert_at(c, Some(seq), &created, EventType::Created, &json!({}))?;
    Ok(AcceptOutcome::Created(created))
}
