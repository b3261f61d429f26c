//! What a worker sends about its task and what it hears back: progress,
//! the outcome, and what a heartbeat answers. Shared by the store, which
//! keeps them, and by workers, which send them in process or over HTTP.

use serde_json::Value;

use crate::Timestamp;

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationError {
    /// A stable code (`deadline_exceeded`, `outcome_unknown`, or the worker's own).
    pub code: String,
    /// For people.
    pub message: String,
    /// Whether another attempt (or a re-run) may succeed.
    pub retryable: bool,
}

/// Largest checkpoint a worker may save, as JSON text.
pub const MAX_CHECKPOINT_BYTES: usize = 64 * 1024;

/// A progress report: each field set replaces the stored one.
#[derive(Debug, Clone, Default)]
pub struct ProgressUpdate {
    /// Units done.
    pub completed_units: Option<f64>,
    /// Units in all, when known.
    pub total_units: Option<f64>,
    /// What a unit is (`rows`, `bytes`).
    pub unit: Option<String>,
    /// The step the work is in.
    pub phase: Option<String>,
    /// Kind-specific JSON.
    pub details: Option<Value>,
}

/// What a heartbeat answers: the lease, and whether to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatAck {
    /// The renewed lease's end.
    pub lease_expires_at: Timestamp,
    /// A client (or the enforcer) asked to cancel: stop and report `cancelled`.
    pub cancel_requested: bool,
    /// The reason given.
    pub cancel_reason: Option<String>,
    /// A client asked to pause: save a checkpoint and report `paused`.
    pub pause_requested: bool,
    /// The operation's version after the heartbeat.
    pub version: i64,
}

/// How a worker ends its attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The work succeeded.
    Succeeded {
        /// The inline result.
        result: Option<Value>,
    },
    /// The work failed.
    Failed {
        /// Why it failed; `retryable` asks for another attempt.
        error: OperationError,
    },
    /// The worker acknowledged a cancellation.
    Cancelled,
    /// The worker stopped as a pause asked, leaving where to resume from
    /// (or keeping the last checkpoint it saved when `None`).
    Paused {
        /// Where to resume from.
        checkpoint: Option<Value>,
    },
}

/// The name of an operation's default artifact (`result.artifact`).
pub const DEFAULT_ARTIFACT: &str = "default";
