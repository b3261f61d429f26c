//! Where result bytes live: an [`ArtifactStore`]. Results can be gigabytes,
//! so everything streams: uploads are hashed (SHA-256) and counted while they
//! are written, never held whole in memory, and an object appears whole or
//! not at all — a partial upload (an error, a size limit, a cancelled
//! export, a dropped connection) leaves nothing behind.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// A stream of bytes to store or serve.
pub type ByteReader = Pin<Box<dyn AsyncRead + Send>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub size_bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("the artifact is larger than {max_bytes} bytes")]
    TooLarge { max_bytes: u64 },
    #[error("no such artifact")]
    NotFound,
    #[error("artifact storage failed: {0}")]
    Io(String),
}

impl From<std::io::Error> for ArtifactError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound {
            ArtifactError::NotFound
        } else {
            ArtifactError::Io(e.to_string())
        }
    }
}

#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Streams `body` into `key` (at most `max_bytes`); the object becomes
    /// visible only once complete.
    async fn put(&self, key: &str, body: ByteReader, max_bytes: u64) -> Result<Stored, ArtifactError>;

    /// `len` bytes of `key` from `offset`.
    async fn open(&self, key: &str, offset: u64, len: u64) -> Result<ByteReader, ArtifactError>;

    /// Removes `key`; removing what is not there is fine.
    async fn delete(&self, key: &str) -> Result<(), ArtifactError>;

    /// Every object, finished or not (operators and tests count what is left).
    async fn list(&self) -> Result<Vec<String>, ArtifactError>;
}

/// Artifacts as files under a directory (`--data-dir/artifacts`). Uploads go
/// to `.tmp/` and are renamed into place when complete; an interrupted one is
/// removed when its upload is dropped.
pub struct FileArtifacts {
    root: PathBuf,
}

impl FileArtifacts {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, key: &str) -> Result<PathBuf, ArtifactError> {
        let safe = !key.is_empty()
            && key
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.'));
        if !safe {
            return Err(ArtifactError::Io(format!("invalid artifact key {key:?}")));
        }
        Ok(self.root.join(key))
    }
}

/// Deletes a temporary file unless disarmed: runs when an upload fails or
/// its future is dropped half-way.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[async_trait]
impl ArtifactStore for FileArtifacts {
    async fn put(&self, key: &str, mut body: ByteReader, max_bytes: u64) -> Result<Stored, ArtifactError> {
        let target = self.path(key)?;
        let tmp_dir = self.root.join(".tmp");
        tokio::fs::create_dir_all(&tmp_dir).await?;
        let tmp_path = tmp_dir.join(longrun_core::id::random_base32::<16>());
        let mut guard = TempFile(Some(tmp_path.clone()));
        let mut file = tokio::fs::File::create(&tmp_path).await?;
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            let n = body.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > max_bytes {
                return Err(ArtifactError::TooLarge { max_bytes });
            }
            hasher.update(&buffer[..n]);
            file.write_all(&buffer[..n]).await?;
        }
        file.sync_all().await?;
        drop(file);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        tokio::fs::rename(&tmp_path, &target).await?;
        guard.0 = None;
        Ok(Stored {
            size_bytes: size,
            sha256: data_encoding::HEXLOWER.encode(&hasher.finalize()),
        })
    }

    async fn open(&self, key: &str, offset: u64, len: u64) -> Result<ByteReader, ArtifactError> {
        let mut file = tokio::fs::File::open(self.path(key)?).await?;
        file.seek(std::io::SeekFrom::Start(offset)).await?;
        Ok(Box::pin(file.take(len)))
    }

    async fn delete(&self, key: &str) -> Result<(), ArtifactError> {
        match tokio::fs::remove_file(self.path(key)?).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn list(&self) -> Result<Vec<String>, ArtifactError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            let mut keys = Vec::new();
            walk(&root, &root, &mut keys)?;
            keys.sort();
            Ok(keys)
        })
        .await
        .map_err(|e| ArtifactError::Io(e.to_string()))?
    }
}

fn walk(root: &Path, dir: &Path, keys: &mut Vec<String>) -> Result<(), ArtifactError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            walk(root, &path, keys)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            keys.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &'static [u8]) -> ByteReader {
        Box::pin(bytes)
    }

    #[tokio::test]
    async fn objects_appear_whole_and_partial_uploads_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileArtifacts::new(dir.path());
        let stored = store.put("results/res_a", reader(b"hello world"), 1024).await.unwrap();
        assert_eq!(stored.size_bytes, 11);
        assert_eq!(
            stored.sha256,
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        let mut part = String::new();
        store
            .open("results/res_a", 6, 5)
            .await
            .unwrap()
            .read_to_string(&mut part)
            .await
            .unwrap();
        assert_eq!(part, "world");

        assert!(matches!(
            store.put("results/res_b", reader(b"too long"), 4).await,
            Err(ArtifactError::TooLarge { .. })
        ));
        assert_eq!(
            store.list().await.unwrap(),
            vec!["results/res_a".to_owned()],
            "no temporary file is left"
        );

        store.delete("results/res_a").await.unwrap();
        store.delete("results/res_a").await.unwrap();
        assert!(store.list().await.unwrap().is_empty());
        assert!(matches!(
            store.open("results/res_a", 0, 1).await,
            Err(ArtifactError::NotFound)
        ));
        assert!(store.put("../escape", reader(b"x"), 10).await.is_err());
    }

    #[tokio::test]
    async fn a_dropped_upload_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileArtifacts::new(dir.path());
        let (mut writer, reader) = tokio::io::duplex(16);
        let upload = store.put("results/res_c", Box::pin(reader), 1 << 20);
        let feed = async {
            writer.write_all(b"some of it").await.unwrap();
        };
        // The upload waits for more bytes; stop it half-way.
        tokio::select! {
            _ = upload => panic!("the upload cannot finish: the writer is still open"),
            () = async { feed.await; tokio::task::yield_now().await; } => {}
        }
        assert!(
            store.list().await.unwrap().is_empty(),
            "dropped upload left {:?}",
            store.list().await.unwrap()
        );
    }
}
