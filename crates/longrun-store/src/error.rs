//! What a store call can refuse, besides failing on IO.

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// The lease token is not the current one, or the task is no longer running.
    #[error("lease lost")]
    LeaseLost,
    /// The worker passed its commit point; cancellation is refused.
    #[error("operation is not cancellable")]
    NotCancellable,
    /// `If-Match` named a version that is not the current one.
    #[error("precondition failed: current version is {current_version}")]
    PreconditionFailed { current_version: i64 },
    /// The tenant is at its `max_active` quota (the submission is rolled back).
    #[error("quota exceeded: {active} of {max_active} active operations")]
    QuotaExceeded { active: i64, max_active: i64 },
    /// An upload was larger than allowed.
    #[error("larger than {max_bytes} bytes")]
    TooLarge { max_bytes: u64 },
    /// An upload's append named another offset than the current one, or the
    /// upload is already complete.
    #[error("the upload's offset is {offset}")]
    UploadOffsetMismatch { offset: i64, complete: bool },
    /// The operation was removed by retention; its tombstone still answers.
    #[error("the operation was removed")]
    Gone,
    /// The operation is terminal: its intent can no longer change.
    #[error("the operation is terminal")]
    Terminal { current_version: i64 },
    /// The schema refused a state change (a bug in the caller if ever seen).
    #[error("illegal state transition: {0}")]
    IllegalTransition(String),
    /// The database cannot take this now but may soon: unreachable, shutting
    /// down, out of space or read-only. Nothing was applied; retry later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Backend(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let text = e.to_string();
        if text.contains("illegal state transition") || text.contains("terminal operation") {
            return StoreError::IllegalTransition(text);
        }
        match e.sqlite_error_code() {
            Some(
                ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::CannotOpen,
            ) => StoreError::Unavailable(text),
            _ => StoreError::Backend(text),
        }
    }
}
