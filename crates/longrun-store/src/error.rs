//! What a store call can refuse, besides failing on IO.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use std::sync::Arc;

/// What a store call can refuse, besides failing on IO. Callers decide on
/// the variant, never on the message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No such record (or another tenant's).
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
    PreconditionFailed {
        /// The current version.
        current_version: i64,
    },
    /// The tenant is at its `max_active` quota (the submission is rolled back).
    #[error("quota exceeded: {active} of {max_active} active operations")]
    QuotaExceeded {
        /// Operations of the tenant not yet ended.
        active: i64,
        /// The quota.
        max_active: i64,
    },
    /// An upload was larger than allowed.
    #[error("larger than {max_bytes} bytes")]
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// An upload's append named another offset than the current one, or the
    /// upload is already complete.
    #[error("the upload's offset is {offset}")]
    UploadOffsetMismatch {
        /// Where the stored bytes end.
        offset: i64,
        /// Whether the upload is complete.
        complete: bool,
    },
    /// The operation was removed by retention; its tombstone still answers.
    #[error("the operation was removed")]
    Gone,
    /// Cancellation was requested or the operation ended: no pause or
    /// resume is applied (terminal intent dominates).
    #[error("the operation's terminal intent is already set (version {current_version})")]
    IntentConflict {
        /// The current version.
        current_version: i64,
    },
    /// A change only work still queued may take (moving its start) asked of
    /// work that started.
    #[error("the operation has started (version {current_version}); only a queued one's start can move")]
    Started {
        /// The current version.
        current_version: i64,
    },
    /// Running work whose kind cannot pause.
    #[error("the running operation cannot pause (version {current_version})")]
    NotPausable {
        /// The current version.
        current_version: i64,
    },
    /// The operation is terminal: its intent can no longer change.
    #[error("the operation is terminal")]
    Terminal {
        /// The current version.
        current_version: i64,
    },
    /// The schema's guard refused a change (a state change outside the
    /// transition table, a change to a terminal operation, a version that
    /// does not move by one): a bug in the caller if ever seen.
    #[error("the schema refused the change: {0}")]
    IllegalTransition(String),
    /// The database cannot take this now but may soon: unreachable, shutting
    /// down, out of space or read-only. Nothing was applied; retry later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// SQLite failed (not a refusal, not an outage).
    #[cfg(feature = "sqlite")]
    #[error("SQLite: {0}")]
    Sqlite(#[source] Arc<rusqlite::Error>),
    /// PostgreSQL failed (not a refusal, not an outage).
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL: {0}")]
    Postgres(#[source] Arc<sqlx::Error>),
    /// Stored data this version cannot read, or a statement that broke its
    /// own promise: a bug or a schema from another version.
    #[error("unreadable stored data: {0}")]
    Corrupt(String),
    /// A background part the call depends on stopped (the SQLite writer, a
    /// transaction task): the process is shutting down or broken.
    #[error("{0} stopped")]
    Stopped(&'static str),
}

/// `RAISE(ABORT, …)` of the schema's guard triggers.
#[cfg(feature = "sqlite")]
const SQLITE_GUARD: std::ffi::c_int = rusqlite::ffi::SQLITE_CONSTRAINT_TRIGGER;
/// `RAISE EXCEPTION` of the PostgreSQL guard (`raise_exception`).
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES_GUARD: &str = "P0001";

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let text = e.to_string();
        if e.sqlite_error().is_some_and(|f| f.extended_code == SQLITE_GUARD) {
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
            _ => StoreError::Sqlite(Arc::new(e)),
        }
    }
}
