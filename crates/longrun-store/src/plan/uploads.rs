//! The right to append to an upload, written once for every backend: one
//! request on any node appends at a time (see `Store::upload_append_lease`).

use super::Driver;
use crate::shared::{UploadLease, append_lease_free};
use crate::{AppendLease, AppendLeaseParams, Id, Result, StoreError};

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
