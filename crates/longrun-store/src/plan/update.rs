//! `PATCH` of deadline and labels, written once for every backend: lock
//! the operation, decide with `shared::decide_update`, apply.

use super::{Driver, Effect, apply};
use crate::shared::decide_update;
use crate::{Operation, Result, StoreError, UpdateParams};

/// Changes deadline or labels of a live operation under `If-Match` (see
/// `Store::operation_update`).
pub(crate) async fn operation_update<D: Driver>(d: &mut D, p: &UpdateParams) -> Result<Operation> {
    let op = d
        .operation_locked(&p.tenant, &p.id)
        .await?
        .ok_or(StoreError::NotFound)?;
    let Some(change) = decide_update(&op, p)? else {
        return Ok(op);
    };
    let effects = [Effect::SetDeadlineAndLabels {
        id: p.id.as_str().to_owned(),
        change,
    }];
    apply(d, &effects, p.now)
        .await?
        .pop()
        .flatten()
        .ok_or(StoreError::NotFound)
}
