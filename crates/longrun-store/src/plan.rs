//! The plan layer: write use cases written once, as fetch → plan → apply.
//!
//! A use case asks its [`Driver`] for the rows it needs (a fetch primitive
//! each, which on PostgreSQL also locks them), decides in a pure function
//! what those rows become ([`Effect`]s, with event and webhook names from
//! [`EventType`] and [`WebhookType`]), and hands the effects back to the
//! driver ([`apply`]). A backend is then a driver: statements that fetch,
//! statements that write, and nothing that decides.
//!
//! The use case is an `async fn` generic over the driver. PostgreSQL's
//! driver awaits its statements inside one transaction; SQLite's runs each
//! statement synchronously inside its writer's group commit and never
//! waits, so the writer drives the same function to completion with one
//! poll (`block` in `sqlite/driver.rs`).
//!
//! Written here: workers' outcomes, the reaper and heartbeats ([`finish`]),
//! cancel, pause and resume ([`control`]), the deadline enforcer
//! ([`deadline`]), `PATCH` of deadline and labels ([`update`]), and
//! retention and tenant deletion ([`retention`]), uploads, a task's
//! artifact pieces and uploaded results ([`uploads`]), and webhook
//! delivery ([`webhooks`]), and claims ([`claim`]: who is served, how
//! many, in which order; the pick and the lease are the driver's). Accepts
//! write their rows per dialect (see `docs/ARCHITECTURE.md`, "One plan,
//! two drivers"), but answer a taken key and a full quota as [`accept`]
//! says.

pub(crate) mod accept;
pub(crate) mod claim;
pub(crate) mod control;
pub(crate) mod deadline;
mod driver;
mod effects;
pub(crate) mod fetches;
pub(crate) mod finish;
mod history;
pub(crate) mod retention;
pub(crate) mod store;
pub(crate) mod update;
pub(crate) mod uploads;
pub(crate) mod webhooks;
mod writes;

pub(crate) use crate::shared::{EventType, WebhookType};
pub(crate) use driver::{Driver, EndRow, Lock};
pub(crate) use effects::{Effect, apply};
pub(crate) use history::{EVENTS_AFTER, EventRow, event_row, with_derived};
pub(crate) use retention::Tombstone;

use std::time::Duration;

/// Settings a use case needs when it writes: how long ended operations and
/// their results are kept, and whether inputs outlive their operation's end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub operation_retention: Duration,
    pub result_retention: Duration,
    pub keep_inputs: bool,
}
