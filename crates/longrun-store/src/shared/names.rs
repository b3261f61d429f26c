//! The names a use case records: history event types and webhook types.
//!
//! Both are public contract (`docs/api.md` lists them; clients switch on
//! them), so they are spelled here once and a backend never writes one as a
//! string literal (`tests/one_plan.rs` keeps it so).

use longrun_core::State;

/// The type of an event in an operation's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// Accepted (version 1).
    Created,
    /// A worker leased it (each attempt).
    Started,
    /// A worker reported progress, cost or a checkpoint.
    Progress,
    /// Cancellation was requested of running work.
    CancelRequested,
    /// Pausing was requested of running work.
    PauseRequested,
    /// A pause request was withdrawn before the worker acted on it.
    PauseWithdrawn,
    /// Paused: out of the queue until resumed.
    Paused,
    /// Back in the queue after a pause.
    Resumed,
    /// An attempt failed and another is scheduled.
    RetryScheduled,
    /// Deadline or labels changed (`PATCH`).
    Updated,
    /// Asked to pause, the worker did not within the grace period.
    PauseNotHonoured,
    /// Ended: the terminal state names the event.
    Ended(State),
}

impl EventType {
    /// The name the history and the change feed carry.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Started => "started",
            Self::Progress => "progress",
            Self::CancelRequested => "cancel_requested",
            Self::PauseRequested => "pause_requested",
            Self::PauseWithdrawn => "pause_withdrawn",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::RetryScheduled => "retry_scheduled",
            Self::Updated => "updated",
            Self::PauseNotHonoured => "pause_not_honoured",
            Self::Ended(state) => state.as_str(),
        }
    }
}

/// The type of a webhook event (Standard Webhooks' `type`): an operation
/// reached a state, or was paused or resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WebhookType {
    /// `operation.<state>`: started running, or ended.
    Reached(State),
    /// `operation.paused`.
    Paused,
    /// `operation.resumed`.
    Resumed,
}

impl WebhookType {
    /// The webhook `type`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Reached(State::Queued) => "operation.queued",
            Self::Reached(State::Running) => "operation.running",
            Self::Reached(State::Succeeded) => "operation.succeeded",
            Self::Reached(State::Failed) => "operation.failed",
            Self::Reached(State::Cancelled) => "operation.cancelled",
            Self::Reached(State::Paused) | Self::Paused => "operation.paused",
            Self::Resumed => "operation.resumed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_webhook_is_the_state_after_operation() {
        for state in [
            State::Queued,
            State::Running,
            State::Succeeded,
            State::Failed,
            State::Cancelled,
            State::Paused,
        ] {
            assert_eq!(
                WebhookType::Reached(state).as_str(),
                format!("operation.{}", state.as_str())
            );
        }
    }
}
