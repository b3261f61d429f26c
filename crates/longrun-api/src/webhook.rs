//! The body of a webhook (Standard Webhooks; docs/api.md §7): sent once per
//! state change of an operation that named a callback.

use serde::{Deserialize, Serialize};

/// A webhook body, as signed and delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookEvent {
    /// `operation.{state}` (`operation.running`, `operation.succeeded`, …),
    /// or `operation.resumed` for a paused operation queued again.
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the change happened (RFC 3339).
    pub timestamp: String,
    /// Which operation changed, and to what.
    pub data: WebhookData,
}

/// What a webhook says about its operation: read the operation for the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookData {
    /// The operation.
    pub operation_id: String,
    /// Its version after the change (deliveries may arrive out of order:
    /// the highest version is the latest).
    pub version: i64,
    /// Its state after the change.
    pub state: String,
    /// Its kind.
    pub kind: String,
    /// The schedule it is a firing of, if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
}
