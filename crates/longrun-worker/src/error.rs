//! What a task's link to the server can answer instead of doing what was
//! asked. The same for a worker in the server's process (whose link is the
//! store) and a remote one (whose link is HTTP): handlers see one error.

use std::time::Duration;

/// Why a call through a [`TaskLink`](crate::TaskLink) did not happen.
/// Workers decide on the variant, never on the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkerError {
    /// The lease is no longer this worker's: the task is someone else's
    /// now, and nothing it reports will count.
    #[error("the lease was lost")]
    LeaseLost,
    /// What the call named is not there for this task (an upload the
    /// operation's input does not name, or one that was removed).
    #[error("not found")]
    NotFound,
    /// An artifact larger than the server keeps.
    #[error("larger than {max_bytes} bytes")]
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// A piece named another offset than where the stored pieces end.
    #[error("the stored pieces end at byte {offset}")]
    OffsetMismatch {
        /// Where they end.
        offset: u64,
    },
    /// The server refused the call with a problem code it will give again.
    #[error("refused: {code}: {message}")]
    Refused {
        /// The problem's stable code.
        code: String,
        /// For people.
        message: String,
    },
    /// The server (or its database) cannot take the call now; nothing was
    /// applied. Retry, after `retry_after` when it says.
    #[error("unavailable: {message}")]
    Unavailable {
        /// How long the server asked to wait (`Retry-After`).
        retry_after: Option<Duration>,
        /// For people.
        message: String,
    },
    /// No answer, or one the worker cannot read; whether it was applied is
    /// unknown (outcomes are fenced, so sending again is safe).
    #[error("transport: {0}")]
    Transport(String),
}
