//! Why a task's bytes were not stored or read.

use longrun_store::StoreError;

use super::artifacts::ArtifactError;

/// Why a task's bytes were not stored or read: the store refused or
/// failed (a lost lease, an offset that is not where the pieces end), or
/// the object storage did (too large, gone, an IO failure).
#[derive(Debug, thiserror::Error)]
pub enum BytesError {
    /// The store's refusal or failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The object storage's.
    #[error(transparent)]
    Objects(#[from] ArtifactError),
}
