//! Where upload bytes live: inputs a client streams (and may resume) before
//! a submission names them (docs/api.md §9 "Uploads and artifacts").
//!
//! Each request's body is stored as one *piece* under `uploads/{id}/`, as an
//! object of the [`ArtifactStore`]. A body cut short keeps what arrived (the
//! piece is stored up to the cut), so a client that lost its connection
//! learns the offset with `HEAD` and sends only the rest. When the upload
//! completes, its pieces are joined into one object (hashed on the way) and
//! the pieces become garbage; a single piece needs no copy. Nothing here
//! decides: the store compares offsets (`upload_append`) and completes once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use longrun_core::Id;
use longrun_store::{Store, StoreError, UploadChunk, UploadRecord};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::BytesError;
use super::artifacts::{ArtifactError, ArtifactStore, ByteReader};

/// One request's body, stored.
#[derive(Debug, Clone)]
pub struct Piece {
    /// Where the piece is stored and how long it is.
    pub chunk: UploadChunk,
    /// Lowercase hex SHA-256 of the piece.
    pub sha256: String,
    /// The body ended with an error (a dropped connection): the piece holds
    /// what arrived before it, and the upload cannot complete with it.
    pub cut: bool,
}

/// Turns a read error into the end of the stream, and remembers it: what
/// arrived before a connection dropped is kept.
struct KeepWhatArrived {
    inner: ByteReader,
    cut: Arc<AtomicBool>,
}

impl AsyncRead for KeepWhatArrived {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut().poll_read(cx, buf) {
            Poll::Ready(Err(_)) => {
                self.cut.store(true, Ordering::Relaxed);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

/// Stores `body` as the piece of upload `upload_id` that starts at `offset`
/// (at most `max_bytes`). A piece of zero bytes is not kept (its chunk has
/// size 0 and nothing to read).
pub async fn store_piece(
    artifacts: &dyn ArtifactStore,
    upload_id: &Id,
    offset: i64,
    body: ByteReader,
    max_bytes: u64,
) -> Result<Piece, ArtifactError> {
    let key = format!(
        "uploads/{upload_id}/{offset:020}-{}",
        longrun_core::id::random_base32::<8>()
    );
    let cut = Arc::new(AtomicBool::new(false));
    let reader = KeepWhatArrived {
        inner: body,
        cut: cut.clone(),
    };
    let stored = artifacts.put(&key, Box::pin(reader), max_bytes).await?;
    let cut = cut.load(Ordering::Relaxed);
    Ok(Piece {
        chunk: UploadChunk {
            storage_key: key,
            size_bytes: i64::try_from(stored.size_bytes).unwrap_or(i64::MAX),
        },
        sha256: stored.sha256,
        cut,
    })
}

/// The bytes of `pieces`, in order, as one stream.
pub async fn open_pieces(artifacts: &dyn ArtifactStore, pieces: &[UploadChunk]) -> Result<ByteReader, ArtifactError> {
    let mut reader: ByteReader = Box::pin(tokio::io::empty());
    for piece in pieces.iter().filter(|p| p.size_bytes > 0) {
        let next = artifacts
            .open(&piece.storage_key, 0, u64::try_from(piece.size_bytes).unwrap_or(0))
            .await?;
        reader = Box::pin(reader.chain(next));
    }
    Ok(reader)
}

/// The upload's pieces as one object, with the SHA-256 of the whole: the
/// single piece itself (only hashed), or a new object they are copied into.
pub async fn join(
    artifacts: &dyn ArtifactStore,
    upload: &UploadRecord,
) -> Result<(UploadChunk, String), ArtifactError> {
    let key = format!("uploads/{}/whole-{}", upload.id, longrun_core::id::random_base32::<8>());
    join_pieces(artifacts, &upload.chunks, key).await
}

/// `pieces` as one object, with the SHA-256 of the whole: the single piece
/// itself (only hashed), or a new object at `key` they are copied into.
pub async fn join_pieces(
    artifacts: &dyn ArtifactStore,
    pieces: &[UploadChunk],
    key: String,
) -> Result<(UploadChunk, String), ArtifactError> {
    let pieces: Vec<UploadChunk> = pieces.iter().filter(|p| p.size_bytes > 0).cloned().collect();
    if let [only] = pieces.as_slice() {
        let mut reader = open_pieces(artifacts, &pieces).await?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            let n = reader.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
        return Ok((only.clone(), data_encoding::HEXLOWER.encode(&hasher.finalize())));
    }
    let listed: Vec<(String, u64)> = pieces
        .iter()
        .map(|p| (p.storage_key.clone(), u64::try_from(p.size_bytes).unwrap_or(0)))
        .collect();
    let stored = match artifacts.compose(&key, &listed).await? {
        Some(stored) => stored,
        None => {
            artifacts
                .put(&key, open_pieces(artifacts, &pieces).await?, u64::MAX)
                .await?
        }
    };
    Ok((
        UploadChunk {
            storage_key: key,
            size_bytes: i64::try_from(stored.size_bytes).unwrap_or(i64::MAX),
        },
        stored.sha256,
    ))
}

/// Streams the upload `upload_id` for the worker holding `lease_token` on
/// `operation_id`: `NotFound` unless that operation's input names it and it
/// is complete; `LeaseLost` for a stale lease.
pub async fn open_for_task(
    store: &dyn Store,
    artifacts: &dyn ArtifactStore,
    operation_id: &Id,
    lease_token: &str,
    upload_id: &Id,
) -> Result<ByteReader, BytesError> {
    let upload = store
        .upload_for_task(operation_id, lease_token, upload_id)
        .await?
        .filter(|u| u.complete)
        .ok_or(StoreError::NotFound)?;
    open_pieces(artifacts, &upload.chunks).await.map_err(|e| match e {
        ArtifactError::NotFound => BytesError::Store(StoreError::NotFound),
        other => BytesError::Objects(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::artifacts::FileArtifacts;

    /// A body that yields `bytes`, then fails like a dropped connection.
    struct Cut(Option<&'static [u8]>);

    impl AsyncRead for Cut {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.0.take() {
                Some(bytes) => {
                    buf.put_slice(bytes);
                    Poll::Ready(Ok(()))
                }
                None => Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into())),
            }
        }
    }

    #[tokio::test]
    async fn a_cut_body_keeps_what_arrived_and_pieces_join_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let artifacts = FileArtifacts::new(dir.path());
        let id = Id::generate(longrun_core::IdKind::Upload);
        let first = store_piece(&artifacts, &id, 0, Box::pin(Cut(Some(b"hello "))), 1 << 20)
            .await
            .unwrap();
        assert!(first.cut);
        assert_eq!(first.chunk.size_bytes, 6);
        let second = store_piece(&artifacts, &id, 6, Box::pin(&b"world"[..]), 1 << 20)
            .await
            .unwrap();
        assert!(!second.cut);
        let upload = UploadRecord {
            id: id.clone(),
            tenant: "t".into(),
            content_type: "text/plain".into(),
            offset: 11,
            complete: false,
            sha256: None,
            expected_sha256: None,
            chunks: vec![first.chunk.clone(), second.chunk.clone()],
            created_at: longrun_core::Timestamp(0),
            expires_at: longrun_core::Timestamp(1),
            referenced: false,
        };
        let (whole, sha256) = join(&artifacts, &upload).await.unwrap();
        assert_eq!(
            sha256, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9",
            "sha256(hello world)"
        );
        let mut text = String::new();
        open_pieces(&artifacts, &[whole])
            .await
            .unwrap()
            .read_to_string(&mut text)
            .await
            .unwrap();
        assert_eq!(text, "hello world");
    }
}
