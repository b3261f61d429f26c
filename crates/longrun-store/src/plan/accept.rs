//! The parts of an accept written once: what a submission whose key is
//! taken is answered, and whether its tenant is at its `max_active` quota.
//! How a submission is written stays each driver's (PostgreSQL's one
//! statement of data-modifying CTEs, SQLite's point statements; see
//! `docs/ARCHITECTURE.md`, "One plan, two drivers"); both ask these.

use super::Driver;
use crate::shared::{key_record, key_replayed, key_taken, tenant_active, tenant_max_active};
use crate::{AcceptOutcome, AcceptParams, Result, StoreError};

/// The answer for `p` when an earlier submission took its key: a replay
/// of the operation that submission made when `p` is the same request
/// (counted), else the refusal naming it; `None` when the key is free.
pub(crate) async fn known_key<D: Driver>(d: &mut D, p: &AcceptParams) -> Result<Option<AcceptOutcome>> {
    let Some((key, fingerprint)) = &p.idempotency else {
        return Ok(None);
    };
    let Some((stored, operation_id)) = d.script(&key_record(p, key.as_str())).await? else {
        return Ok(None);
    };
    let operation_id = match key_taken(fingerprint, &stored, operation_id) {
        Ok(id) => id,
        Err(operation_id) => return Ok(Some(AcceptOutcome::KeyReused { operation_id })),
    };
    // A removed operation's key stays taken while its tombstone lives: a
    // replay must not silently start the work again.
    let original = d.operation(operation_id.as_str()).await?.ok_or(StoreError::Gone)?;
    d.script(&key_replayed(p, key.as_str())).await?;
    Ok(Some(AcceptOutcome::Replayed(original)))
}

/// [`known_key`] where the driver found `p`'s key taken as it wrote it.
pub(crate) async fn taken_key<D: Driver>(d: &mut D, p: &AcceptParams) -> Result<AcceptOutcome> {
    known_key(d, p)
        .await?
        .ok_or_else(|| StoreError::Corrupt("an idempotency key that was taken is gone".into()))
}

/// The refusal when the tenant's active work (ready and leased tasks) is
/// at its `max_active` quota. Its row stays locked until the transaction
/// ends, so concurrent submissions counted after it cannot overshoot; a
/// tenant without a quota costs one lookup.
pub(crate) async fn over_quota<D: Driver>(d: &mut D, tenant: &str) -> Result<Option<StoreError>> {
    let Some(max_active) = d.script(&tenant_max_active(tenant)).await? else {
        return Ok(None);
    };
    let active = d.script(&tenant_active(tenant)).await?;
    Ok((active >= max_active).then_some(StoreError::QuotaExceeded { active, max_active }))
}
