//! Reads, on a reader connection or the writer's: operations, lists
//! (keyset pages), histories, results, and the console's and metrics' views.

use super::*;

pub(super) fn operation_get(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Operation>> {
    // The tenant is part of the lookup: another tenant's id is simply absent.
    let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = ?1 AND tenant = ?2");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str(), tenant], |r| operation_of(r))
        .optional()?)
}

/// [`operation_get`] for readers: with its re-runs, from the partial index
/// of `rerun_of`, in the same statement, and the size of its stored JSON
/// (for the read cache).
pub(super) fn operation_read(c: &Connection, tenant: &str, id: &Id) -> Result<Option<(Operation, usize)>> {
    let sql = format!(
        "SELECT {OP_COLUMNS}, (SELECT json_group_array(id) FROM
                   (SELECT r.id FROM operations r WHERE r.rerun_of = operations.id ORDER BY r.seq)),
                COALESCE(length(input), 0) + COALESCE(length(result), 0) + COALESCE(length(progress), 0)
                  + COALESCE(length(labels), 0)
           FROM operations WHERE id = ?1 AND tenant = ?2"
    );
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str(), tenant], |r| {
            let mut op = operation_of(r)?;
            let reruns: Vec<String> = json_column(r, OP_COLUMN_COUNT)?
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            op.reruns = Some(reruns.into_iter().map(Id::from_trusted).collect());
            let json_bytes: i64 = r.get(OP_COLUMN_COUNT + 1)?;
            Ok((op, usize::try_from(json_bytes).unwrap_or(usize::MAX)))
        })
        .optional()?)
}

pub(super) fn operation_list(c: &Connection, p: &ListParams) -> Result<OperationPage> {
    let mut sql = format!("SELECT {OP_COLUMNS}, seq FROM operations WHERE 1 = 1");
    let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
    if let Some(tenant) = &p.tenant {
        args.push(Box::new(tenant.clone()));
        sql.push_str(&format!(" AND tenant = ?{}", args.len()));
    }
    if let Some(from) = p.created_from {
        args.push(Box::new(from.0));
        sql.push_str(&format!(" AND created_at >= ?{}", args.len()));
    }
    if let Some(before) = p.created_before {
        args.push(Box::new(before.0));
        sql.push_str(&format!(" AND created_at < ?{}", args.len()));
    }
    if let Some(state) = p.state {
        args.push(Box::new(state.as_str()));
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(kind) = &p.kind {
        args.push(Box::new(kind.clone()));
        sql.push_str(&format!(" AND kind = ?{}", args.len()));
    }
    if let Some((key, value)) = &p.label {
        // Label keys are validated to [a-z0-9_.-/], so quoting the path is safe.
        args.push(Box::new(format!("$.\"{key}\"")));
        args.push(Box::new(value.clone()));
        sql.push_str(&format!(
            " AND json_extract(labels, ?{}) = ?{}",
            args.len() - 1,
            args.len()
        ));
    }
    if let Some(before) = p.before_seq {
        args.push(Box::new(before));
        sql.push_str(&format!(" AND seq < ?{}", args.len()));
    }
    if let Some(now) = p.visible_at {
        args.push(Box::new(now.0));
        sql.push_str(&format!(" AND (expires_at IS NULL OR expires_at > ?{})", args.len()));
    }
    let page_size = i64::from(p.page_size.max(1));
    args.push(Box::new(page_size + 1));
    sql.push_str(&format!(" ORDER BY seq DESC LIMIT ?{}", args.len()));

    let mut stmt = c.prepare_cached(&sql)?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
        let seq: i64 = r.get(OP_COLUMN_COUNT)?;
        Ok((seq, operation_of(r)?))
    })?;
    let mut operations = Vec::new();
    let mut seqs = Vec::new();
    for row in rows {
        let (seq, op) = row?;
        seqs.push(seq);
        operations.push(op);
    }
    Ok(crate::shared::page(operations, &seqs, page_size))
}

pub(super) fn operation_history(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>> {
    events_of(c, tenant, id, 0, u32::MAX, false)
}

pub(super) fn operation_events_after(
    c: &Connection,
    tenant: &str,
    id: &Id,
    after_version: i64,
    limit: u32,
) -> Result<Option<Vec<Event>>> {
    events_of(c, tenant, id, after_version, limit, true)
}

/// The events of `tenant`'s operation `id` after version `after`, at most
/// `limit`, with their snapshots when `snapshots`; those not kept as rows
/// derived from the operation's (plan/history.rs).
fn events_of(
    c: &Connection,
    tenant: &str,
    id: &Id,
    after: i64,
    limit: u32,
    snapshots: bool,
) -> Result<Option<Vec<Event>>> {
    let Some((row, seq)) = operation_for_history(c, tenant, id)? else {
        return Ok(None);
    };
    let mut stmt = c.prepare_cached(EVENTS_AFTER)?;
    let replay = snapshots.then_some(&row);
    let stored = stmt
        .query_map(params![seq, after, limit], |r| event_of(r, id, replay))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(with_derived(stored, &row, after, i64::from(limit), snapshots)))
}
