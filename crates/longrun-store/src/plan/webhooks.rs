//! Webhook delivery, written once for every backend: taking the deliveries
//! due (each node its own, held for a lease) and recording an attempt's
//! outcome with its line in the delivery log.

use std::time::Duration;

use longrun_core::Timestamp;

use super::Driver;
use crate::shared::{attempt_insert, deliveries_due, deliveries_held, delivery_attempted};
use crate::{AttemptParams, Delivery, Result, StoreError};

/// The deliveries due at `now`, held for `lease` (see `Store::webhook_due`).
pub(crate) async fn webhook_due<D: Driver>(
    d: &mut D,
    now: Timestamp,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Delivery>> {
    let due = d.script(&deliveries_due(now, limit)).await?;
    d.script(&deliveries_held(&due, now.plus(lease))).await?;
    Ok(due)
}

/// Records an attempt (see `Store::webhook_attempt`): `NotFound` when the
/// delivery is no longer pending.
pub(crate) async fn webhook_attempt<D: Driver>(d: &mut D, p: &AttemptParams) -> Result<()> {
    let (operation_id, event_type) = d.script(&delivery_attempted(p)).await?.ok_or(StoreError::NotFound)?;
    d.script(&attempt_insert(p, &operation_id, &event_type)).await
}
