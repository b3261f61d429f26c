//! Retention and tenant deletion, written once for every backend: which
//! rows each phase of a pass removes, in what order, with what tombstone,
//! and what the pass counts. The driver fetches what is due (locked and
//! skipped where another node works on it) and removes it.

use std::time::Duration;

use longrun_core::Timestamp;

use super::Driver;
use crate::{Result, RetentionCounts, RetentionParams, TenantDeleteCounts};

/// What is left of a deleted tenant once its operations, uploads and keys
/// are gone: each table, the column that names the tenant, and a
/// condition that lets an index find the rows (tasks are gone with their
/// operations already; this removes any a race left).
const TENANT_ROWS: [(&str, &str, &str); 10] = [
    ("schedule_fires", "tenant", ""),
    ("schedules", "tenant", ""),
    ("results", "tenant", ""),
    ("idempotency_keys", "tenant", ""),
    ("tombstones", "tenant", ""),
    ("webhook_deliveries", "tenant", ""),
    ("webhook_secrets", "tenant", ""),
    ("tenant_dispatch", "tenant", ""),
    ("tasks", "tenant", " AND status IN ('ready', 'leased')"),
    ("tenants", "name", ""),
];

/// What of an operation goes with it besides its events and webhooks,
/// each table by the column naming the operation (its idempotency record
/// stays, kept by its tombstone or freed by the tenant's deletion).
const OPERATION_ROWS: [&str; 3] = ["results", "operation_uploads", "tasks"];

/// What of an operation with a callback goes with it: its deliveries and
/// their log. Only work submitted with a callback has any (the callback is
/// fixed at submission), and on PostgreSQL finding them by operation reads
/// every day's partition, so work without one skips it.
const WEBHOOK_ROWS: [&str; 2] = ["webhook_attempts", "webhook_deliveries"];

/// Why an operation is removed (see `operations_remove`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Past its retention: its history may go later, with its partition.
    Expired,
    /// Its tenant is deleted: everything goes now.
    Erased,
}

/// An operation past its retention, as the sweep reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expiring {
    pub id: String,
    pub tenant: String,
    pub expired_at: Timestamp,
    pub kind: String,
    pub idempotency_key: Option<String>,
    /// Submitted with a callback: it may have webhook deliveries.
    pub hooked: bool,
}

/// What stays of a removed operation for its window: `410 gone` for its id,
/// and the key of the idempotency record it outlives (its burial frees it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tombstone {
    pub operation_id: String,
    pub tenant: String,
    pub removed_at: Timestamp,
    pub expires_at: Timestamp,
    pub kind: String,
    pub idempotency_key: Option<String>,
}

/// The tombstone of `op`. Its window counts from the operation's expiry
/// (when readers began to see it gone), not from when a sweep got to it.
fn tombstone_of(op: &Expiring, window: Duration) -> Tombstone {
    Tombstone {
        operation_id: op.id.clone(),
        tenant: op.tenant.clone(),
        removed_at: op.expired_at,
        expires_at: op.expired_at.plus(window),
        kind: op.kind.clone(),
        idempotency_key: op.idempotency_key.clone(),
    }
}

/// The limits of the steps a sweep of `limit` rows a phase is taken in:
/// `step` each, the rest last (one step of `limit` where `step` is not
/// smaller). A store with one writer takes a pass in short steps: on
/// SQLite a step of 500 expired operations held the writer, and every
/// submission queued behind it, ~9 ms (`retention_load`, SQLite: a pass
/// of 200 sweeps, each followed by a rest as long, took 3.5 s).
pub(crate) fn steps(limit: u32, step: u32) -> impl Iterator<Item = u32> {
    let step = step.clamp(1, limit.max(1));
    (0..limit.div_ceil(step)).map(move |i| step.min(limit - i * step))
}

/// Whether a step that removed `counts` with `limit` rows a phase may have
/// left some due: a phase used all of its rows.
pub(crate) fn more_due(counts: &RetentionCounts, limit: u32) -> bool {
    let limit = u64::from(limit);
    [
        counts.results_expired,
        counts.operations_removed,
        counts.tombstones_removed,
        counts.deliveries_removed,
        counts.uploads_removed,
    ]
    .contains(&limit)
}

/// One batched, idempotent pass (see `Store::retention_sweep`): each phase
/// handles at most `limit` rows.
pub(crate) async fn retention_sweep<D: Driver>(d: &mut D, p: &RetentionParams) -> Result<RetentionCounts> {
    let mut counts = RetentionCounts::default();

    // Results past their lifetime: the operation stays `succeeded`; the
    // bytes go.
    for (id, storage_key) in d.results_expiring(p.now, p.limit).await? {
        d.result_expire(&id, &storage_key, p.now).await?;
        counts.results_expired += 1;
    }

    // Operations past their retention: removed, each with a tombstone.
    let expiring = d.operations_expiring(p.now, p.limit).await?;
    if !expiring.is_empty() {
        let ids: Vec<&str> = expiring.iter().map(|op| op.id.as_str()).collect();
        let hooked: Vec<&str> = expiring
            .iter()
            .filter(|op| op.hooked)
            .map(|op| op.id.as_str())
            .collect();
        operations_remove(d, &ids, &hooked, Removal::Expired, p.now).await?;
        let tombstones: Vec<Tombstone> = expiring
            .iter()
            .map(|op| tombstone_of(op, p.tombstone_retention))
            .collect();
        d.tombstones_set(&tombstones).await?;
        counts.operations_removed = expiring.len() as u64;
    }

    // Tombstones past their window: the id is forgotten, its key freed.
    counts.tombstones_removed = d.tombstones_bury(p.now, p.limit).await?;

    // Finished deliveries and their log, past the delivery retention.
    let finished = d
        .deliveries_finished(p.now.minus(p.delivery_retention), p.limit)
        .await?;
    if !finished.is_empty() {
        let event_ids: Vec<&str> = finished.iter().map(String::as_str).collect();
        for table in ["webhook_attempts", "webhook_deliveries"] {
            d.rows_delete(table, "event_id", "", &event_ids).await?;
        }
        counts.deliveries_removed = finished.len() as u64;
    }

    // Uploads past their expiry that no operation names.
    for id in d.uploads_unused(p.now, p.limit).await? {
        d.upload_drop(&id, p.now).await?;
        counts.uploads_removed += 1;
    }
    Ok(counts)
}

/// Deletes everything of the operations `ids` but their idempotency
/// records: their objects become garbage, then their history, the rows
/// that name them (webhook rows only of those of them `hooked`) and their
/// own rows go. Nothing can read the events of a removed operation: where
/// history goes a partition at a time, an expired operation's events wait
/// for their partition's drop.
async fn operations_remove<D: Driver>(
    d: &mut D,
    ids: &[&str],
    hooked: &[&str],
    removal: Removal,
    now: Timestamp,
) -> Result<()> {
    d.operations_release(ids, now).await?;
    if removal == Removal::Erased || !D::HISTORY_BY_PARTITION {
        d.events_remove(ids).await?;
    }
    for table in OPERATION_ROWS {
        d.rows_delete(table, "operation_id", "", ids).await?;
    }
    if !hooked.is_empty() {
        for table in WEBHOOK_ROWS {
            d.rows_delete(table, "operation_id", "", hooked).await?;
        }
    }
    d.rows_delete("operations", "id", "", ids).await?;
    Ok(())
}

/// How many of a deleted tenant's operations are removed a batch.
const ERASE_BATCH: usize = 500;

/// Removes everything of the tenant (see `Store::tenant_delete`): its
/// operations in batches as retention removes them (no tombstones), its
/// uploads, then the rest of its rows; result objects become garbage.
pub(crate) async fn tenant_delete<D: Driver>(d: &mut D, tenant: &str, now: Timestamp) -> Result<TenantDeleteCounts> {
    let (results, deliveries) = d.tenant_counts(tenant).await?;
    let operations = d.tenant_operations(tenant).await?;
    for batch in operations.chunks(ERASE_BATCH) {
        let ids: Vec<&str> = batch.iter().map(String::as_str).collect();
        operations_remove(d, &ids, &ids, Removal::Erased, now).await?;
    }
    let uploads = d.tenant_uploads(tenant).await?;
    for id in &uploads {
        d.upload_drop(id, now).await?;
    }
    d.tenant_results_to_garbage(tenant, now).await?;
    let keys = d.rows_delete("api_keys", "tenant", "", &[tenant]).await?;
    for (table, column, and) in TENANT_ROWS {
        d.rows_delete(table, column, and, &[tenant]).await?;
    }
    Ok(TenantDeleteCounts {
        operations: operations.len() as u64,
        results,
        keys,
        deliveries,
        uploads: uploads.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_is_taken_in_steps_that_add_up_to_its_limit() {
        let of = |limit, step| steps(limit, step).collect::<Vec<u32>>();
        assert_eq!(of(500, 100), [100; 5]);
        assert_eq!(of(250, 100), [100, 100, 50]);
        assert_eq!(of(500, u32::MAX), [500]);
        assert_eq!(of(7, 0), [1; 7]);
        assert!(of(0, 100).is_empty());
    }

    #[test]
    fn a_step_that_filled_any_phase_may_have_left_more_due() {
        let removed = |operations_removed, tombstones_removed| RetentionCounts {
            operations_removed,
            tombstones_removed,
            ..RetentionCounts::default()
        };
        assert!(more_due(&removed(100, 0), 100));
        assert!(more_due(&removed(3, 100), 100));
        assert!(!more_due(&removed(99, 99), 100));
        assert!(!more_due(&RetentionCounts::default(), 100));
    }

    #[test]
    fn a_tombstone_window_counts_from_the_expiry_and_keeps_the_key() {
        let op = Expiring {
            id: "op_a".into(),
            tenant: "t".into(),
            expired_at: Timestamp(1_000),
            kind: "export".into(),
            idempotency_key: Some("k".into()),
            hooked: false,
        };
        let t = tombstone_of(&op, Duration::from_secs(2));
        assert_eq!((t.removed_at, t.expires_at), (Timestamp(1_000), Timestamp(3_000)));
        assert_eq!(t.idempotency_key.as_deref(), Some("k"));
    }
}
