//! A task's result artifacts, in one place for in-process workers and the
//! HTTP upload endpoints alike: streamed whole into the artifact store, or
//! in resumable pieces joined at the end, and recorded for the task fenced
//! by its lease. An object whose record is refused (a lost lease) is
//! deleted at once; nothing is published until the task's outcome.

use longrun_core::{Id, IdKind};
use longrun_store::{ResultUploadParams, Store, StoreError};

use super::BytesError;
use super::artifacts::{ArtifactStore, ByteReader};
use longrun_worker::UploadedArtifact;

/// Which artifact of which task an upload is.
pub struct TaskArtifact<'a> {
    /// The task's operation.
    pub operation_id: &'a Id,
    /// The task's lease token: a stale one stores nothing.
    pub lease_token: &'a str,
    /// `default` or the artifact's name.
    pub name: &'a str,
    /// The artifact's content type, kept with it.
    pub content_type: &'a str,
}

/// Streams an artifact into the artifact store and records it for the task,
/// fenced by its lease. Used in process and by the HTTP upload endpoint.
pub async fn store_upload(
    store: &dyn Store,
    artifacts: &dyn ArtifactStore,
    target: TaskArtifact<'_>,
    body: ByteReader,
    max_bytes: u64,
    now: longrun_core::Timestamp,
) -> Result<UploadedArtifact, BytesError> {
    let result_id = Id::generate(IdKind::Result);
    let key = format!("results/{result_id}");
    let stored = artifacts
        .put(&key, body, max_bytes)
        .await
        .map_err(BytesError::Objects)?;
    let recorded = store
        .result_upload(ResultUploadParams {
            operation_id: target.operation_id.clone(),
            lease_token: target.lease_token.to_owned(),
            name: target.name.to_owned(),
            result_id: result_id.clone(),
            storage_key: key.clone(),
            content_type: target.content_type.to_owned(),
            size_bytes: i64::try_from(stored.size_bytes).unwrap_or(i64::MAX),
            sha256: stored.sha256.clone(),
            joins_pieces: false,
            now,
        })
        .await;
    if let Err(e) = recorded {
        // Not recorded (a lost lease): the object must not linger.
        let _ = artifacts.delete(&key).await;
        return Err(e.into());
    }
    Ok(UploadedArtifact {
        id: result_id.to_string(),
        size_bytes: stored.size_bytes,
        sha256: stored.sha256,
    })
}

/// Stores `body` as the piece of the task's resumable artifact that starts
/// at `offset` (fenced by its lease); returns where the pieces now end.
/// Used in process and by the HTTP piece endpoint.
pub async fn store_artifact_piece(
    store: &dyn Store,
    artifacts: &dyn ArtifactStore,
    target: TaskArtifact<'_>,
    offset: u64,
    body: ByteReader,
    max_bytes: u64,
    now: longrun_core::Timestamp,
) -> Result<u64, BytesError> {
    // Fenced and placed before any byte is stored: a stale lease or an
    // offset past the pieces is refused without reading the body.
    let held: i64 = store
        .artifact_pieces(target.operation_id, target.lease_token, target.name)
        .await?
        .iter()
        .map(|p| p.size_bytes)
        .sum();
    if i64::try_from(offset).map_or(true, |o| o > held) {
        return Err(BytesError::Store(StoreError::UploadOffsetMismatch {
            offset: held,
            complete: false,
        }));
    }
    let key = format!(
        "pieces/{}/{}/{offset:020}-{}",
        target.operation_id,
        target.name,
        longrun_core::id::random_base32::<8>()
    );
    let stored = artifacts
        .put(&key, body, max_bytes.saturating_sub(offset))
        .await
        .map_err(BytesError::Objects)?;
    let piece = longrun_store::UploadChunk {
        storage_key: key.clone(),
        size_bytes: i64::try_from(stored.size_bytes).unwrap_or(i64::MAX),
    };
    let recorded = store
        .artifact_piece_add(longrun_store::ArtifactPieceParams {
            operation_id: target.operation_id.clone(),
            lease_token: target.lease_token.to_owned(),
            name: target.name.to_owned(),
            offset: i64::try_from(offset).unwrap_or(i64::MAX),
            piece,
            now,
        })
        .await;
    match recorded {
        Ok(pieces) => Ok(pieces.iter().map(|p| u64::try_from(p.size_bytes).unwrap_or(0)).sum()),
        Err(e) => {
            // Not recorded: the object must not linger.
            let _ = artifacts.delete(&key).await;
            Err(e.into())
        }
    }
}

/// Joins the pieces of the task's resumable artifact into its artifact
/// `target.name` (what `complete` publishes), refused with
/// `UploadOffsetMismatch` unless they hold exactly `size_bytes`.
pub async fn join_artifact_pieces(
    store: &dyn Store,
    artifacts: &dyn ArtifactStore,
    target: TaskArtifact<'_>,
    size_bytes: u64,
    now: longrun_core::Timestamp,
) -> Result<UploadedArtifact, BytesError> {
    let pieces = store
        .artifact_pieces(target.operation_id, target.lease_token, target.name)
        .await?;
    let held: i64 = pieces.iter().map(|p| p.size_bytes).sum();
    if u64::try_from(held).ok() != Some(size_bytes) {
        return Err(BytesError::Store(StoreError::UploadOffsetMismatch {
            offset: held,
            complete: false,
        }));
    }
    let result_id = Id::generate(IdKind::Result);
    let (object, sha256) = super::uploads::join_pieces(artifacts, &pieces, format!("results/{result_id}"))
        .await
        .map_err(BytesError::Objects)?;
    let copied = pieces.iter().all(|p| p.storage_key != object.storage_key);
    let recorded = store
        .result_upload(ResultUploadParams {
            operation_id: target.operation_id.clone(),
            lease_token: target.lease_token.to_owned(),
            name: target.name.to_owned(),
            result_id: result_id.clone(),
            storage_key: object.storage_key.clone(),
            content_type: target.content_type.to_owned(),
            size_bytes: object.size_bytes,
            sha256: sha256.clone(),
            joins_pieces: true,
            now,
        })
        .await;
    if let Err(e) = recorded {
        if copied {
            let _ = artifacts.delete(&object.storage_key).await;
        }
        return Err(e.into());
    }
    Ok(UploadedArtifact {
        id: result_id.to_string(),
        size_bytes,
        sha256,
    })
}
