//! What a backend provides to the use cases of the plan layer: fetch
//! primitives, and the writes [`apply`] turns [`Effect`]s into.

use longrun_core::{State, Timestamp};
use serde_json::Value;

use super::EventType;
use crate::shared::{Ending, UpdateChange};
use crate::{Id, Operation, Result};

/// An operation past its deadline whose task waits in the queue (a first
/// attempt, or a retry waiting for its backoff).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverdueWaiting {
    pub id: String,
    pub state: State,
}

/// Running work the server asked to stop, with the reason it gave.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StopRequested {
    pub id: String,
    pub reason: Option<String>,
}

/// Running work asked to pause, and since when.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PauseRequested {
    pub id: String,
    pub requested_at: Timestamp,
}

/// A backend as the plan layer's use cases see it: one transaction (or one
/// writer job) in which rows are fetched and changes applied. Fetches that
/// hand out shared work lock what they return and skip what another node
/// holds (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer).
///
/// Every method is a statement or two; none decides anything.
pub(crate) trait Driver {
    // Fetch primitives.

    /// Up to `limit` operations past their deadline at `now` whose task is
    /// ready (not leased), soonest deadline first.
    async fn overdue_waiting(&mut self, now: Timestamp, limit: u32) -> Result<Vec<OverdueWaiting>>;

    /// Up to `limit` ids of cancellable operations past their deadline at
    /// `now` whose task a worker holds and that nobody asked to stop yet.
    async fn overdue_running(&mut self, now: Timestamp, limit: u32) -> Result<Vec<String>>;

    /// Up to `limit` running operations the server asked to stop at or
    /// before `cutoff`, oldest request first.
    async fn stops_unacknowledged(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<StopRequested>>;

    /// Up to `limit` running operations asked to pause at or before
    /// `cutoff`, oldest request first.
    async fn pauses_unanswered(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<PauseRequested>>;

    /// The tenant's operation, locked for the rest of the transaction.
    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>>;

    // Writes, as `apply` calls them.

    /// Ends each non-terminal operation as its `Ending` says, at `now`
    /// (dispatch record, results, pieces, event and webhook included).
    /// `LeaseLost` if one of them had ended already.
    async fn operations_end(&mut self, ends: &[(&str, &Ending)], now: Timestamp) -> Result<()>;

    /// Asks the worker holding running work to stop (its `cancel_requested`
    /// event included).
    async fn cancel_request(&mut self, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<()>;

    /// Clears a running operation's pause request, one version on.
    async fn pause_request_clear(&mut self, id: &str, now: Timestamp) -> Result<Operation>;

    /// Sets a live operation's deadline and labels, one version on.
    async fn deadline_and_labels_set(&mut self, id: &str, change: &UpdateChange, now: Timestamp) -> Result<Operation>;

    /// Records the event `event_type` of `op`'s current version.
    async fn event_insert(&mut self, op: &Operation, event_type: EventType, data: &Value) -> Result<()>;
}

/// What a use case decided to write, for [`apply`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// End a non-terminal operation.
    End { id: String, ending: Ending },
    /// Ask the worker holding running work to stop.
    RequestCancel {
        id: String,
        by: &'static str,
        reason: Option<&'static str>,
    },
    /// Withdraw a pause request, recording why.
    ClearPauseRequest { id: String, event: EventType, data: Value },
    /// Change a live operation's deadline and labels.
    SetDeadlineAndLabels { id: String, change: UpdateChange },
}

/// Applies `effects` in order through `driver`, at `now`: the endings in
/// one call (set-based where the driver can), the rest one by one. Returns
/// the operations the effects left at a new version, where the write
/// returns one.
pub(crate) async fn apply<D: Driver>(driver: &mut D, effects: &[Effect], now: Timestamp) -> Result<Vec<Operation>> {
    let ends: Vec<(&str, &Ending)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::End { id, ending } => Some((id.as_str(), ending)),
            _ => None,
        })
        .collect();
    if !ends.is_empty() {
        driver.operations_end(&ends, now).await?;
    }
    let mut changed = Vec::new();
    for effect in effects {
        match effect {
            Effect::End { .. } => {}
            Effect::RequestCancel { id, by, reason } => driver.cancel_request(id, by, *reason, now).await?,
            Effect::ClearPauseRequest { id, event, data } => {
                let op = driver.pause_request_clear(id, now).await?;
                driver.event_insert(&op, *event, data).await?;
                changed.push(op);
            }
            Effect::SetDeadlineAndLabels { id, change } => {
                let op = driver.deadline_and_labels_set(id, change, now).await?;
                driver.event_insert(&op, EventType::Updated, &change.data).await?;
                changed.push(op);
            }
        }
    }
    Ok(changed)
}
