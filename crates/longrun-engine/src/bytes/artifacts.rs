//! Where result bytes live: an [`ArtifactStore`]. Results can be gigabytes,
//! so everything streams: uploads are hashed (SHA-256) and counted while they
//! are written, never held whole in memory, and an object appears whole or
//! not at all — a partial upload (an error, a size limit, a cancelled
//! export, a dropped connection) leaves nothing behind.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// A stream of bytes to store or serve.
pub use longrun_worker::ByteReader;

/// What a finished write stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Bytes written.
    pub size_bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// Why an artifact store call failed.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Larger than allowed: nothing is kept.
    #[error("the artifact is larger than {max_bytes} bytes")]
    TooLarge {
        /// The limit it broke.
        max_bytes: u64,
    },
    /// No object under that key.
    #[error("no such artifact")]
    NotFound,
    /// The storage failed (disk, network, the object store's answer).
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

/// Where result artifacts and upload pieces live: a directory or an S3 bucket.
#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Streams `body` into `key` (at most `max_bytes`); the object becomes
    /// visible only once complete.
    async fn put(&self, key: &str, body: ByteReader, max_bytes: u64) -> Result<Stored, ArtifactError>;

    /// `len` bytes of `key` from `offset`.
    async fn open(&self, key: &str, offset: u64, len: u64) -> Result<ByteReader, ArtifactError>;

    /// Removes `key`; removing what is not there is fine.
    async fn delete(&self, key: &str) -> Result<(), ArtifactError>;

    /// Every object, finished or not, with when it was last written (the
    /// store's own wall-clock time): what the orphan sweep of retention
    /// reads.
    async fn list_modified(&self) -> Result<Vec<ListedObject>, ArtifactError>;

    /// `pieces` (keys and sizes, in order) as one new object at `key`, with
    /// its size and SHA-256, made by the store itself; `None` where it
    /// cannot (the caller then streams them through [`ArtifactStore::put`]).
    /// The pieces stay.
    async fn compose(&self, key: &str, pieces: &[(String, u64)]) -> Result<Option<Stored>, ArtifactError> {
        let _ = (key, pieces);
        Ok(None)
    }

    /// Every object's key, sorted (operators and tests count what is left).
    async fn list(&self) -> Result<Vec<String>, ArtifactError> {
        let mut keys: Vec<String> = self.list_modified().await?.into_iter().map(|o| o.key).collect();
        keys.sort();
        Ok(keys)
    }
}

/// An object as [`ArtifactStore::list_modified`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    /// Its key.
    pub key: String,
    /// When it was last written.
    pub modified: std::time::SystemTime,
}

/// Artifacts as files under a directory (`--data-dir/artifacts`). Uploads go
/// to `.tmp/` and are renamed into place when complete; an interrupted one is
/// removed when its upload is dropped.
pub struct FileArtifacts {
    root: PathBuf,
}

impl FileArtifacts {
    /// Artifacts under `root` (made on first write).
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

    /// A new file under `.tmp/`, deleted unless [`place`]d. Created on this
    /// thread, not through `tokio::fs`, which runs it on the blocking pool:
    /// dropped while one was under way there (a cancelled task stops its
    /// upload), the guard would run first and the file appear after it,
    /// left behind.
    async fn temp_file(&self) -> Result<(std::fs::File, TempFile), ArtifactError> {
        let tmp_dir = self.root.join(".tmp");
        tokio::fs::create_dir_all(&tmp_dir).await?;
        let tmp_path = tmp_dir.join(longrun_core::id::random_base32::<16>());
        let guard = TempFile(Some(tmp_path.clone()));
        Ok((std::fs::File::create(&tmp_path)?, guard))
    }
}

/// Renames a finished, synced temporary file to `target`: the object
/// appears whole, at once.
async fn place(mut guard: TempFile, target: &Path) -> Result<(), ArtifactError> {
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    let tmp_path = guard.0.take().expect("an armed temporary file");
    if let Err(e) = std::fs::rename(&tmp_path, target) {
        guard.0 = Some(tmp_path);
        return Err(e.into());
    }
    Ok(())
}

/// The answer of a blocking file task.
fn finished<T>(task: Result<std::io::Result<T>, tokio::task::JoinError>) -> Result<T, ArtifactError> {
    task.map_err(|e| ArtifactError::Io(e.to_string()))?
        .map_err(ArtifactError::from)
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
        let (file, guard) = self.temp_file().await?;
        let mut file = tokio::fs::File::from_std(file);
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
        place(guard, &target).await?;
        Ok(Stored {
            size_bytes: size,
            sha256: data_encoding::HEXLOWER.encode(&hasher.finalize()),
        })
    }

    /// The pieces copied into one file by the kernel (`copy_file_range`:
    /// no byte passes through this process) while another thread hashes
    /// them from the page cache they were just written to, then synced and
    /// renamed into place like a `put`.
    async fn compose(&self, key: &str, pieces: &[(String, u64)]) -> Result<Option<Stored>, ArtifactError> {
        let target = self.path(key)?;
        let pieces = pieces
            .iter()
            .map(|(key, size)| Ok((self.path(key)?, *size)))
            .collect::<Result<Vec<(PathBuf, u64)>, ArtifactError>>()?;
        // If this future is dropped the guard unlinks the file, and the copy
        // still under way writes into a file no name points at.
        let (mut file, guard) = self.temp_file().await?;
        let to_copy = pieces.clone();
        let copying = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            let mut size = 0;
            for (path, len) in to_copy {
                let copied = std::io::copy(&mut std::io::Read::take(std::fs::File::open(path)?, len), &mut file)?;
                if copied != len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "a piece is shorter than recorded",
                    ));
                }
                size += copied;
            }
            file.sync_all()?;
            Ok(size)
        });
        let hashing = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut hasher = Sha256::new();
            let mut buffer = vec![0u8; 1024 * 1024];
            for (path, len) in pieces {
                let mut piece = std::io::Read::take(std::fs::File::open(path)?, len);
                loop {
                    let n = std::io::Read::read(&mut piece, &mut buffer)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buffer[..n]);
                }
            }
            Ok(data_encoding::HEXLOWER.encode(&hasher.finalize()))
        });
        let (copied, hashed) = tokio::join!(copying, hashing);
        let (size_bytes, sha256) = (finished(copied)?, finished(hashed)?);
        place(guard, &target).await?;
        Ok(Some(Stored { size_bytes, sha256 }))
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

    async fn list_modified(&self) -> Result<Vec<ListedObject>, ArtifactError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            let mut objects = Vec::new();
            walk(&root, &root, &mut objects)?;
            Ok(objects)
        })
        .await
        .map_err(|e| ArtifactError::Io(e.to_string()))?
    }
}

fn walk(root: &Path, dir: &Path, objects: &mut Vec<ListedObject>) -> Result<(), ArtifactError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, objects)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            // A file removed since it was listed (a finished upload's
            // temporary file) is not an object any more.
            let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            objects.push(ListedObject {
                key: relative.to_string_lossy().into_owned(),
                modified,
            });
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
    async fn composed_pieces_are_their_bytes_in_order_with_the_hash_of_the_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileArtifacts::new(dir.path());
        store.put("pieces/a", reader(b"hello "), 1024).await.unwrap();
        // Longer than recorded: only the recorded bytes count (what a piece
        // row says is what was acknowledged).
        store.put("pieces/b", reader(b"world!!"), 1024).await.unwrap();
        let pieces = [("pieces/a".to_owned(), 6), ("pieces/b".to_owned(), 5)];
        let composed = store.compose("results/res_c", &pieces).await.unwrap().unwrap();
        let whole = store.put("results/res_w", reader(b"hello world"), 1024).await.unwrap();
        assert_eq!(composed, whole, "the same size and SHA-256 as the bytes written whole");
        let mut text = String::new();
        store
            .open("results/res_c", 0, 11)
            .await
            .unwrap()
            .read_to_string(&mut text)
            .await
            .unwrap();
        assert_eq!(text, "hello world");

        let short = [("pieces/a".to_owned(), 6), ("pieces/b".to_owned(), 50)];
        assert!(
            store.compose("results/res_s", &short).await.is_err(),
            "a short piece is refused"
        );
        let missing = [("pieces/a".to_owned(), 6), ("pieces/gone".to_owned(), 1)];
        assert!(matches!(
            store.compose("results/res_m", &missing).await,
            Err(ArtifactError::NotFound)
        ));
        assert_eq!(
            store.list().await.unwrap(),
            ["pieces/a", "pieces/b", "results/res_c", "results/res_w"],
            "neither refusal leaves a file; the pieces stay"
        );
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

    /// An upload dropped after any number of polls leaves no file behind,
    /// whatever the blocking pool was doing for it then: a cancelled task
    /// stops its upload wherever it is. (A file created on the blocking pool
    /// after the drop outlived the guard that should have removed it: an
    /// export cancelled as it began a piece left a `.tmp/` file.)
    #[test]
    fn an_upload_dropped_at_any_point_leaves_no_file() {
        // One blocking thread: what was handed to it before the drop has run
        // once a later blocking task has.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = FileArtifacts::new(dir.path());
            for polls in 1.. {
                let mut upload = store.put("results/res_d", reader(b"every byte of it"), 1024);
                let mut finished = false;
                for _ in 0..polls {
                    if futures_util::poll!(upload.as_mut()).is_ready() {
                        finished = true;
                        break;
                    }
                }
                drop(upload);
                tokio::task::spawn_blocking(|| ()).await.unwrap();
                let left = store.list().await.unwrap();
                if finished {
                    assert_eq!(left, vec!["results/res_d".to_owned()]);
                    break;
                }
                assert!(left.is_empty(), "dropped after {polls} polls: {left:?} left");
            }
        });
    }
}

/// Explicit S3 settings.
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// The bucket.
    pub bucket: String,
    /// Prefixed to every key (`longrun/`, say); may be empty.
    pub prefix: String,
    /// An S3-compatible endpoint (MinIO, say) instead of AWS.
    pub endpoint: Option<String>,
    /// The access key's id.
    pub access_key_id: String,
    /// The access key's secret.
    pub secret_access_key: String,
    /// The bucket's region.
    pub region: String,
}

/// Artifacts in S3-compatible object storage (`--artifact-store
/// s3://bucket/prefix`), credentials, region and endpoint from the standard
/// AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL`). Uploads are multipart: an object
/// exists only once its upload completes. (An interrupted multipart upload is
/// no object, but its parts are billed until aborted: give the bucket a
/// lifecycle rule that aborts incomplete uploads.)
pub struct S3Artifacts {
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    prefix: String,
}

impl S3Artifacts {
    /// `s3://bucket` or `s3://bucket/prefix`, configured from the AWS
    /// environment variables.
    pub fn from_url(url: &str) -> Result<Self, ArtifactError> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| ArtifactError::Io(format!("not an s3:// URL: {url}")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ArtifactError::Io("the s3:// URL names no bucket".into()));
        }
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let builder = object_store::aws::AmazonS3Builder::from_env();
        Self::build(builder, bucket, prefix, env("AWS_ENDPOINT_URL"))
    }

    /// Explicit settings, for embedding and tests.
    pub fn new(settings: S3Settings) -> Result<Self, ArtifactError> {
        let builder = object_store::aws::AmazonS3Builder::new()
            .with_access_key_id(settings.access_key_id)
            .with_secret_access_key(settings.secret_access_key)
            .with_region(settings.region);
        Self::build(builder, &settings.bucket, &settings.prefix, settings.endpoint)
    }

    fn build(
        builder: object_store::aws::AmazonS3Builder,
        bucket: &str,
        prefix: &str,
        endpoint: Option<String>,
    ) -> Result<Self, ArtifactError> {
        let mut builder = builder.with_bucket_name(bucket);
        if let Some(endpoint) = endpoint {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        let store = builder.build().map_err(|e| ArtifactError::Io(e.to_string()))?;
        Ok(Self {
            store: std::sync::Arc::new(store),
            prefix: prefix.trim_matches('/').to_owned(),
        })
    }

    fn path(&self, key: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(key)
        } else {
            object_store::path::Path::from(format!("{}/{key}", self.prefix))
        }
    }
}

fn s3_error(e: object_store::Error) -> ArtifactError {
    match e {
        object_store::Error::NotFound { .. } => ArtifactError::NotFound,
        other => ArtifactError::Io(other.to_string()),
    }
}

#[async_trait]
impl ArtifactStore for S3Artifacts {
    async fn put(&self, key: &str, mut body: ByteReader, max_bytes: u64) -> Result<Stored, ArtifactError> {
        let upload = self.store.put_multipart(&self.path(key)).await.map_err(s3_error)?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, 8 * 1024 * 1024);
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            let n = match body.read(&mut buffer).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e.into());
                }
            };
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > max_bytes {
                let _ = writer.abort().await;
                return Err(ArtifactError::TooLarge { max_bytes });
            }
            hasher.update(&buffer[..n]);
            writer.wait_for_capacity(4).await.map_err(s3_error)?;
            writer.write(&buffer[..n]);
        }
        writer.finish().await.map_err(s3_error)?;
        Ok(Stored {
            size_bytes: size,
            sha256: data_encoding::HEXLOWER.encode(&hasher.finalize()),
        })
    }

    async fn open(&self, key: &str, offset: u64, len: u64) -> Result<ByteReader, ArtifactError> {
        use futures_util::TryStreamExt;
        if len == 0 {
            return Ok(Box::pin(tokio::io::empty()));
        }
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(offset..offset + len)),
            ..Default::default()
        };
        let result = self.store.get_opts(&self.path(key), options).await.map_err(s3_error)?;
        let stream = result.into_stream().map_err(std::io::Error::other);
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream)))
    }

    async fn delete(&self, key: &str) -> Result<(), ArtifactError> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s3_error(e)),
        }
    }

    async fn list_modified(&self) -> Result<Vec<ListedObject>, ArtifactError> {
        use futures_util::TryStreamExt;
        let prefix = (!self.prefix.is_empty()).then(|| object_store::path::Path::from(self.prefix.as_str()));
        let objects: Vec<object_store::ObjectMeta> =
            self.store.list(prefix.as_ref()).try_collect().await.map_err(s3_error)?;
        Ok(objects
            .into_iter()
            .map(|o| {
                let full = o.location.to_string();
                ListedObject {
                    key: full
                        .strip_prefix(&format!("{}/", self.prefix))
                        .map(str::to_owned)
                        .unwrap_or(full),
                    modified: o.last_modified.into(),
                }
            })
            .collect())
    }
}

/// The store an `--artifact-store` URL names: `file:///path` (or a plain
/// path) or `s3://bucket/prefix`.
pub fn from_url(url: &str) -> Result<std::sync::Arc<dyn ArtifactStore>, ArtifactError> {
    if url.starts_with("s3://") {
        return Ok(std::sync::Arc::new(S3Artifacts::from_url(url)?));
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    Ok(std::sync::Arc::new(FileArtifacts::new(path)))
}
