//! Client uploads and a task's artifacts, written once for every backend:
//! uploads created, appended to and completed under a lock of their row,
//! removed while no operation names them, and the right to append that one
//! request on any node holds at a time (see `Store::upload_append_lease`);
//! the pieces of a task's resumable artifacts and its uploaded results,
//! each fenced by the task's lease.

use longrun_core::Timestamp;

use super::Driver;
use super::finish::fenced_lease;
use crate::shared::{
    UploadLease, append_lease_free, garbage_add, piece_insert, piece_placement, pieces_of, result_insert,
    results_replaced, upload_appended, upload_completed, upload_get, upload_insert, upload_locked, upload_store,
};
use crate::{
    AppendLease, AppendLeaseParams, ArtifactPieceParams, Id, Result, ResultUploadParams, StoreError,
    UploadAppendParams, UploadChunk, UploadCompleteParams, UploadCreateParams, UploadRecord,
};

/// A new, empty upload.
pub(crate) async fn upload_create<D: Driver>(d: &mut D, p: &UploadCreateParams) -> Result<UploadRecord> {
    d.script(&upload_insert(p)).await?;
    d.script(&upload_get(&p.tenant, &p.id))
        .await?
        .ok_or(StoreError::NotFound)
}

/// Appends a piece at the upload's offset (see `shared::upload_appended`).
pub(crate) async fn upload_append<D: Driver>(d: &mut D, p: &UploadAppendParams) -> Result<UploadRecord> {
    let current = d
        .script(&upload_locked(&p.tenant, &p.id))
        .await?
        .ok_or(StoreError::NotFound)?;
    let appended = upload_appended(&current, p)?;
    d.script(&upload_store(&appended)).await?;
    Ok(appended)
}

/// Completes the upload; the pieces it joined become garbage.
pub(crate) async fn upload_complete<D: Driver>(d: &mut D, p: &UploadCompleteParams) -> Result<UploadRecord> {
    let current = d
        .script(&upload_locked(&p.tenant, &p.id))
        .await?
        .ok_or(StoreError::NotFound)?;
    let (completed, garbage) = upload_completed(&current, p)?;
    d.script(&upload_store(&completed)).await?;
    d.script(&garbage_add(&garbage, p.now)).await?;
    Ok(completed)
}

/// Removes the upload unless an operation names it; whether it went.
pub(crate) async fn upload_remove<D: Driver>(d: &mut D, tenant: &str, id: &Id, now: Timestamp) -> Result<bool> {
    match d.script(&upload_locked(tenant, id)).await? {
        Some(upload) if !upload.referenced => {
            d.upload_drop(id.as_str(), now).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Takes or renews the right to append (see `Store::upload_append_lease`).
pub(crate) async fn upload_append_lease<D: Driver>(d: &mut D, p: &AppendLeaseParams) -> Result<AppendLease> {
    let current = d
        .upload_lease_locked(Some(&p.tenant), &p.id)
        .await?
        .ok_or(StoreError::NotFound)?;
    if let Err(until) = append_lease_free(&current, &p.token, p.now) {
        return Ok(AppendLease::Busy { until });
    }
    let held = UploadLease {
        token: Some(p.token.clone()),
        until: Some(p.until),
    };
    d.upload_lease_set(&p.id, &held).await?;
    Ok(AppendLease::Held)
}

/// Gives the right back if `token` still holds it.
pub(crate) async fn upload_append_release<D: Driver>(d: &mut D, id: &Id, token: &str) -> Result<()> {
    let Some(current) = d.upload_lease_locked(None, id).await? else {
        return Ok(());
    };
    if current.token.as_deref() == Some(token) {
        d.upload_lease_set(id, &UploadLease::default()).await?;
    }
    Ok(())
}

/// Places a piece at its offset (see `shared::piece_placement`); the
/// pieces at or past it are replaced. Returns the pieces now held.
pub(crate) async fn artifact_piece_add<D: Driver>(d: &mut D, p: &ArtifactPieceParams) -> Result<Vec<UploadChunk>> {
    fenced_lease(d, &p.operation_id, &p.lease_token).await?;
    let id = p.operation_id.as_str();
    let pieces = d.script(&pieces_of(id, &p.name)).await?;
    let kept = piece_placement(&pieces, p.offset)?;
    if kept < pieces.len() {
        d.pieces_drop(id, Some((&p.name, p.offset)), None, p.now).await?;
    }
    d.script(&piece_insert(p)).await?;
    let mut held: Vec<UploadChunk> = pieces.into_iter().take(kept).map(|(_, piece)| piece).collect();
    held.push(p.piece.clone());
    Ok(held)
}

/// The pieces of the task's artifact `name`, for the lease's holder.
pub(crate) async fn artifact_pieces<D: Driver>(
    d: &mut D,
    operation_id: &Id,
    lease_token: &str,
    name: &str,
) -> Result<Vec<UploadChunk>> {
    fenced_lease(d, operation_id, lease_token).await?;
    let pieces = d.script(&pieces_of(operation_id.as_str(), name)).await?;
    Ok(pieces.into_iter().map(|(_, piece)| piece).collect())
}

/// Records a result artifact uploaded under the lease (replacing an earlier
/// one of the name); one joined from pieces drops their rows, keeping the
/// object that became the result.
pub(crate) async fn result_upload<D: Driver>(d: &mut D, p: &ResultUploadParams) -> Result<()> {
    fenced_lease(d, &p.operation_id, &p.lease_token).await?;
    if p.joins_pieces {
        let only = Some((p.name.as_str(), 0));
        d.pieces_drop(p.operation_id.as_str(), only, Some(&p.storage_key), p.now)
            .await?;
    }
    d.script(&results_replaced(p)).await?;
    d.script(&result_insert(p)).await
}
