//! The Longrun client SDK: the safe way to call a Longrun server.
//!
//! - [`Client::submit`] makes one idempotency key per logical submission and
//!   reuses it on every retry (connection errors, `429`/`503` honouring
//!   `Retry-After`, other `5xx`), with bounded attempts and exponential
//!   backoff with full jitter — so a retry can never create a second operation.
//! - [`Client::wait`] long-polls (`Prefer: wait` with `If-None-Match`) and
//!   falls back to the server's `Retry-After` pacing.
//! - [`Client::download_result`] streams the result, resumes with `Range`
//!   after a broken connection and checks the published SHA-256.
//! - [`webhooks`] verifies Standard Webhooks signatures and dedupes deliveries.
//!
//! Errors are typed by the problem `code`; nothing parses English text.
//!
//! # Layout
//!
//! - this file: [`Client`] and its retry policy; a retried submission always
//!   carries the same idempotency key. The bodies it writes and reads are
//!   the server's own wire types ([`api`], from `longrun-api`), so the SDK
//!   cannot drift from the server.
//! - `webhooks`: receiving Longrun webhooks — signature check over several
//!   secrets during a rotation, timestamp tolerance, and a bounded dedupe of
//!   delivery ids, so each event is applied once.

pub mod webhooks;

/// The wire types the client reads and writes, shared with the server.
pub use longrun_api as api;
pub use longrun_api::{
    BatchSubmitItem as Submission, BudgetRequest, CallbackRequest, ErrorBody as OperationError,
    OperationBody as Operation, Problem, ProgressBody as Progress, RerunRequest, ScheduleBody as Schedule,
    ScheduleFires, ScheduleList, SchedulePatch, ScheduleRequest, UploadBody as Upload,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use longrun_api::{ArtifactBody, BatchSubmitRequest, BatchSubmitResponse, OperationList, ResultBody};
use rand::Rng;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// How submissions are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The backoff cap grows from this, doubling per attempt…
    pub base_delay: Duration,
    /// …up to this.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// Full jitter: a random delay between zero and the capped exponential.
    pub fn delay(&self, attempt: u32) -> Duration {
        let cap = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_delay);
        cap.mul_f64(rand::rng().random::<f64>())
    }
}

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused; decide on `problem.code`.
    #[error("{} ({}): {}", .problem.code, .problem.status, .problem.detail)]
    Api {
        /// The server's problem body.
        problem: Problem,
        /// How long the server asked to wait (`Retry-After`), if it did.
        retry_after: Option<Duration>,
    },
    /// The request did not get an answer (after the retries it was allowed).
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    /// An answer the client cannot use (a body that is not the promised shape).
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    /// A download's bytes do not match the published SHA-256.
    #[error("the download does not match its SHA-256 (expected {expected}, got {actual})")]
    Integrity {
        /// The published SHA-256.
        expected: String,
        /// The SHA-256 of the bytes received.
        actual: String,
    },
    /// Writing the download (or reading the upload) failed.
    #[error("writing the download failed: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The problem code, if the server answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { problem, .. } => Some(&problem.code),
            _ => None,
        }
    }
}

/// A call's result, failing with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A re-run of an operation (`Client::rerun`): each field of `request`
/// left out is the original's.
#[derive(Debug, Clone, Default)]
pub struct Rerun {
    /// The body sent.
    pub request: RerunRequest,
    /// Reuse the key of an earlier attempt of this same re-run.
    pub idempotency_key: Option<String>,
}

/// What a submission came back with.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The operation, as the server answered it.
    pub operation: Operation,
    /// The server had seen this key: this is the original operation.
    pub replayed: bool,
    /// Keep it to retry the same logical submission later.
    pub idempotency_key: String,
}

/// A result download that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// Bytes written.
    pub bytes: u64,
    /// Lowercase hex SHA-256 of them (the published one).
    pub sha256: String,
    /// Connections that broke and were resumed with `Range`.
    pub resumed: u32,
}

/// The artifact `name` of the result resource (the default one for `None`).
fn artifact(mut resource: ResultBody, name: Option<&str>) -> Result<ArtifactBody, String> {
    match name {
        None => resource.artifact.take(),
        Some(name) => resource.artifacts.remove(name),
    }
    .ok_or_else(|| {
        let names: Vec<&str> = resource.artifacts.keys().map(String::as_str).collect();
        format!(
            "the result has no artifact {}; its named artifacts: {names:?}",
            name.unwrap_or("(default)")
        )
    })
}

/// How [`Client::upload_file`] went.
#[derive(Debug, Clone, PartialEq)]
pub struct Uploaded {
    /// The upload, as the server answered it at the end.
    pub upload: Upload,
    /// How many times it resumed after a broken connection.
    pub resumed: u32,
}

/// Filters of [`Client::list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only operations in this state.
    pub state: Option<String>,
    /// Only operations of this kind.
    pub kind: Option<String>,
    /// `key:value`
    pub label: Option<String>,
    /// Operations per page (the server bounds it).
    pub page_size: Option<u32>,
}

/// A Longrun client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    retry: RetryPolicy,
    requests: Arc<AtomicU64>,
}

impl Client {
    /// A client of the server at `base` (`http://host:port`) with API key `token`.
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .pool_idle_timeout(longrun_api::CLIENT_POOL_IDLE)
            .build()
            .expect("an HTTP client");
        Self::with_http(http, base, token)
    }

    /// With your own `reqwest::Client` (proxies, TLS roots, pooling).
    pub fn with_http(http: reqwest::Client, base: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            http,
            base: base.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            retry: RetryPolicy::default(),
            requests: Arc::default(),
        }
    }

    /// With another retry policy for submissions.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// HTTP requests sent so far (all methods), for measuring polling cost.
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let url = if path.starts_with("http") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        };
        self.http.request(method, url).bearer_auth(&self.token)
    }

    /// A fresh idempotency key, unless the submission names one.
    fn key_for(submission: &Submission) -> String {
        submission
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("lrc-{}", longrun_core::id::random_base32::<16>()))
    }

    /// Sends the request `build` makes until `read` has the body of a 2xx
    /// answer, a refusal is not worth retrying, or the attempts run out. Only
    /// for requests whose idempotency keys make every retry safe: an attempt
    /// with no answer (or an answer cut off mid-body) may or may not have been
    /// applied, and the same keys settle it either way. Waits `Retry-After`
    /// when the server says, else the jittered backoff.
    async fn send_with_retries<T>(
        &self,
        build: impl Fn() -> RequestBuilder,
        read: impl AsyncFn(Response) -> reqwest::Result<T>,
    ) -> Result<T> {
        let mut attempt = 0;
        loop {
            let retry_in = match build().send().await {
                Ok(response) if response.status().is_success() => match read(response).await {
                    Ok(answer) => return Ok(answer),
                    Err(e) if attempt + 1 >= self.retry.max_attempts => return Err(e.into()),
                    Err(_) => self.retry.delay(attempt),
                },
                Ok(response) => {
                    let status = response.status();
                    let error = problem(response).await;
                    let retryable = status == StatusCode::TOO_MANY_REQUESTS
                        || status == StatusCode::SERVICE_UNAVAILABLE
                        || status.is_server_error();
                    if !retryable || attempt + 1 >= self.retry.max_attempts {
                        return Err(error);
                    }
                    match &error {
                        Error::Api {
                            retry_after: Some(hint),
                            ..
                        } => *hint,
                        _ => self.retry.delay(attempt),
                    }
                }
                Err(e) => {
                    if attempt + 1 >= self.retry.max_attempts {
                        return Err(e.into());
                    }
                    self.retry.delay(attempt)
                }
            };
            attempt += 1;
            tracing::debug!(attempt, ?retry_in, "retrying with the same idempotency key");
            tokio::time::sleep(retry_in).await;
        }
    }

    /// Submits once, logically: one idempotency key for every attempt.
    pub async fn submit(&self, submission: &Submission) -> Result<Submitted> {
        let body = submission.clone().into_request();
        self.post_keyed("/v1/operations", Self::key_for(submission), &body)
            .await
    }

    /// POSTs `body` to `path` with idempotency key `key` until answered
    /// (see `send_with_retries`): a submission or a re-run.
    async fn post_keyed(&self, path: &str, key: String, body: &impl Serialize) -> Result<Submitted> {
        let (replayed, operation) = self
            .send_with_retries(
                || {
                    self.request(Method::POST, path)
                        .header("Idempotency-Key", &key)
                        .json(body)
                },
                async |response| {
                    let replayed = response
                        .headers()
                        .get("idempotent-replayed")
                        .is_some_and(|v| v == "true");
                    Ok((replayed, response.json::<Operation>().await?))
                },
            )
            .await?;
        Ok(Submitted {
            operation,
            replayed,
            idempotency_key: key,
        })
    }

    /// Re-runs operation `id`: a new operation of its kind and input, linked
    /// to it (`rerun_of`), sent with one idempotency key however often it is
    /// retried. A success without kept inputs is `input_not_kept`.
    pub async fn rerun(&self, id: &str, rerun: &Rerun) -> Result<Submitted> {
        let key = rerun
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("lrc-{}", longrun_core::id::random_base32::<16>()));
        self.post_keyed(&format!("/v1/operations/{id}/reruns"), key, &rerun.request)
            .await
    }

    /// Submits up to 1,000 logical submissions in one request
    /// (`POST /v1/operations/batch`), each with its own idempotency key, so
    /// a retried batch (after a lost answer, a 5xx or a 429) replays what
    /// was accepted and creates only what was not. Answers item by item, in
    /// order; an item the server refused is an `Err` of its own.
    // Each item keeps the server's whole problem, as `submit` does.
    #[allow(clippy::result_large_err)]
    pub async fn submit_batch(&self, submissions: &[Submission]) -> Result<Vec<Result<Submitted>>> {
        let keys: Vec<String> = submissions.iter().map(Self::key_for).collect();
        let body = BatchSubmitRequest {
            operations: submissions
                .iter()
                .zip(&keys)
                .map(|(s, key)| Submission {
                    idempotency_key: Some(key.clone()),
                    ..s.clone()
                })
                .collect(),
        };
        let answer: BatchSubmitResponse = self
            .send_with_retries(
                || self.request(Method::POST, "/v1/operations/batch").json(&body),
                async |response| response.json().await,
            )
            .await?;
        if answer.results.len() != keys.len() {
            return Err(Error::Unexpected("the batch answer does not match the request".into()));
        }
        Ok(answer
            .results
            .into_iter()
            .zip(keys)
            .map(|(item, idempotency_key)| match (item.operation, item.problem) {
                (Some(operation), _) if item.status < 300 => Ok(Submitted {
                    operation,
                    replayed: item.replayed,
                    idempotency_key,
                }),
                (_, Some(problem)) => Err(Error::Api {
                    problem,
                    retry_after: None,
                }),
                _ => Err(Error::Unexpected(format!(
                    "item answered {} without a body",
                    item.status
                ))),
            })
            .collect())
    }

    /// Reads the operation once.
    pub async fn get(&self, id: &str) -> Result<Operation> {
        let response = self
            .request(Method::GET, &format!("/v1/operations/{id}"))
            .send()
            .await?;
        ok_json(response).await
    }

    /// Waits until the operation is terminal: long-polls with the ETag it
    /// has (each answer is a change), or sleeps the server's `Retry-After`
    /// when long-polls are not applied. `on_change` sees every new version.
    pub async fn wait(&self, id: &str, mut on_change: impl FnMut(&Operation)) -> Result<Operation> {
        let mut etag: Option<String> = None;
        loop {
            let mut request = self
                .request(Method::GET, &format!("/v1/operations/{id}"))
                .header("Prefer", "wait=60");
            if let Some(tag) = &etag {
                request = request.header("If-None-Match", tag);
            }
            let response = request.send().await?;
            let long_polled = response.headers().contains_key("preference-applied");
            let retry_after = header_seconds(&response, "retry-after");
            if response.status() != StatusCode::NOT_MODIFIED {
                etag = response
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let operation: Operation = ok_json(response).await?;
                on_change(&operation);
                if operation.terminal {
                    return Ok(operation);
                }
            }
            if !long_polled {
                tokio::time::sleep(retry_after.unwrap_or(Duration::from_secs(1))).await;
            }
        }
    }

    /// Requests cancellation (idempotent); the answer is the operation now.
    pub async fn cancel(&self, id: &str, reason: Option<&str>) -> Result<Operation> {
        let mut request = self.request(Method::PUT, &format!("/v1/operations/{id}/cancellation"));
        if let Some(reason) = reason {
            request = request.json(&serde_json::json!({"reason": reason}));
        }
        ok_json(request.send().await?).await
    }

    /// Pauses the operation: queued work is held back from claims until
    /// resumed; running work of a pausable kind is asked of its worker (the
    /// answer then has `state` `running` and `desired_state` `paused` until
    /// the worker saves a checkpoint and stops). Sent with `If-Match` of the
    /// version just read; if it moved meanwhile, read and ask again (a few
    /// times). Refusals are typed: `intent_conflict` (cancelled or ended),
    /// `not_pausable` (running work of a kind that cannot pause).
    pub async fn pause(&self, id: &str) -> Result<Operation> {
        self.set_desired_state(id, "paused").await
    }

    /// Resumes a paused operation: it goes back to the queue.
    pub async fn resume(&self, id: &str) -> Result<Operation> {
        self.set_desired_state(id, "running").await
    }

    async fn set_desired_state(&self, id: &str, desired: &str) -> Result<Operation> {
        let mut attempt = 0;
        loop {
            let current = self.get(id).await?;
            let response = self
                .request(Method::PATCH, &format!("/v1/operations/{id}"))
                .header("If-Match", format!("\"{}\"", current.version))
                .json(&serde_json::json!({"desired_state": desired}))
                .send()
                .await?;
            match ok_json(response).await {
                Err(e) if e.code() == Some("precondition_failed") && attempt + 1 < self.retry.max_attempts => {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Creates a schedule. Sent once: a retry of a creation whose answer
    /// was lost would make a second schedule (list them to check).
    pub async fn create_schedule(&self, request: &ScheduleRequest) -> Result<Schedule> {
        let response = self.request(Method::POST, "/v1/schedules").json(request).send().await?;
        ok_json(response).await
    }

    /// Reads a schedule.
    pub async fn get_schedule(&self, id: &str) -> Result<Schedule> {
        let response = self.request(Method::GET, &format!("/v1/schedules/{id}")).send().await?;
        ok_json(response).await
    }

    /// One page of the tenant's schedules, oldest first.
    pub async fn list_schedules(&self, page_token: Option<&str>) -> Result<ScheduleList> {
        let path = match page_token {
            Some(token) => format!("/v1/schedules?page_token={token}"),
            None => "/v1/schedules".to_owned(),
        };
        ok_json(self.request(Method::GET, &path).send().await?).await
    }

    /// Changes a schedule under `If-Match`, read first; a firing that moves
    /// its version in between is read again (up to the retry policy's attempts).
    pub async fn patch_schedule(&self, id: &str, patch: &SchedulePatch) -> Result<Schedule> {
        let mut attempt = 0;
        loop {
            let current = self.get_schedule(id).await?;
            let response = self
                .request(Method::PATCH, &format!("/v1/schedules/{id}"))
                .header("If-Match", format!("\"{}\"", current.version))
                .json(patch)
                .send()
                .await?;
            match ok_json(response).await {
                Err(e) if e.code() == Some("precondition_failed") && attempt + 1 < self.retry.max_attempts => {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Deletes a schedule (its operations stay).
    pub async fn delete_schedule(&self, id: &str) -> Result<()> {
        let response = self
            .request(Method::DELETE, &format!("/v1/schedules/{id}"))
            .send()
            .await?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(problem(response).await)
        }
    }

    /// Fires a schedule now; the firing's operation.
    pub async fn trigger_schedule(&self, id: &str) -> Result<Operation> {
        let response = self
            .request(Method::POST, &format!("/v1/schedules/{id}/trigger"))
            .send()
            .await?;
        ok_json(response).await
    }

    /// A schedule's recent firing records, newest first.
    pub async fn schedule_fires(&self, id: &str) -> Result<ScheduleFires> {
        ok_json(
            self.request(Method::GET, &format!("/v1/schedules/{id}/fires"))
                .send()
                .await?,
        )
        .await
    }

    /// Pages through the tenant's operations, newest first.
    pub fn list(&self, filter: ListFilter) -> Pager {
        Pager {
            client: self.clone(),
            filter,
            token: None,
            done: false,
        }
    }

    /// Streams the operation's result artifact into `out`, resuming with
    /// `Range` when a connection breaks (up to the retry policy's attempts),
    /// and checks the bytes against the published SHA-256.
    pub async fn download_result<W: AsyncWrite + Unpin>(
        &self,
        id: &str,
        out: &mut W,
        on_bytes: impl FnMut(u64, u64),
    ) -> Result<Downloaded> {
        self.download_artifact(id, None, out, on_bytes).await
    }

    /// As [`Client::download_result`], for the named artifact `name`
    /// (`result.artifacts.{name}`), or the default one for `None`.
    pub async fn download_artifact<W: AsyncWrite + Unpin>(
        &self,
        id: &str,
        name: Option<&str>,
        out: &mut W,
        mut on_bytes: impl FnMut(u64, u64),
    ) -> Result<Downloaded> {
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        let mut resumed = 0;
        let mut expected: Option<ArtifactBody> = None;
        loop {
            // A fresh link each time: links are short-lived.
            let response = self
                .request(Method::GET, &format!("/v1/operations/{id}/result"))
                .send()
                .await?;
            let resource = artifact(ok_json::<ResultBody>(response).await?, name).map_err(Error::Unexpected)?;
            let total = u64::try_from(resource.size_bytes).unwrap_or(0);
            if expected.as_ref().is_some_and(|e| e.sha256 != resource.sha256) {
                return Err(Error::Unexpected("the result changed during the download".into()));
            }
            expected = Some(resource.clone());
            if written >= total {
                break;
            }
            let mut request = self.request(Method::GET, &resource.download.url);
            if written > 0 {
                request = request.header("Range", format!("bytes={written}-"));
            }
            let mut response = request.send().await?;
            let status = response.status();
            if !(status == StatusCode::OK && written == 0 || status == StatusCode::PARTIAL_CONTENT) {
                return Err(problem(response).await);
            }
            let broke = loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        hasher.update(&chunk);
                        out.write_all(&chunk).await?;
                        written += chunk.len() as u64;
                        on_bytes(written, total);
                    }
                    Ok(None) => break false,
                    Err(e) => {
                        tracing::debug!(error = %e, written, "download broke; resuming");
                        break true;
                    }
                }
            };
            if !broke && written >= total {
                break;
            }
            resumed += 1;
            if resumed >= self.retry.max_attempts {
                return Err(Error::Unexpected(format!("the download broke {resumed} times")));
            }
            tokio::time::sleep(self.retry.delay(resumed)).await;
        }
        out.flush().await?;
        let actual = data_encoding::HEXLOWER.encode(&hasher.finalize());
        let expected = expected.map(|e| e.sha256).unwrap_or_default();
        if actual != expected {
            return Err(Error::Integrity { expected, actual });
        }
        Ok(Downloaded {
            bytes: written,
            sha256: actual,
            resumed,
        })
    }
}

impl Client {
    /// Uploads the file at `path` as an input (`POST /v1/uploads`), resuming
    /// after a broken connection from the offset the server kept (the IETF
    /// resumable-uploads draft: `HEAD` for `Upload-Offset`, `PATCH` from
    /// there), up to the retry policy's attempts. The file's SHA-256 is sent
    /// as `Repr-Digest`, so the server refuses a file that changed while it
    /// was sent. `on_bytes(sent, total)` reports progress.
    pub async fn upload_file(
        &self,
        path: &std::path::Path,
        content_type: &str,
        on_bytes: impl FnMut(u64, u64) + Send + 'static,
    ) -> Result<Uploaded> {
        let total = tokio::fs::metadata(path).await?.len();
        let digest = file_sha256(path).await?;
        let repr_digest = format!("sha-256=:{}:", data_encoding::BASE64.encode(&digest));
        // An empty creation first: the upload's URL is known before any byte
        // is sent, so a cut connection can resume.
        let created: Upload = self
            .send_with_retries(
                || {
                    self.request(Method::POST, "/v1/uploads")
                        .header("upload-complete", "?0")
                        .header("content-type", content_type)
                        .header("repr-digest", &repr_digest)
                        .body(Vec::new())
                },
                async |response| response.json::<Upload>().await,
            )
            .await?;
        let url = format!("/v1/uploads/{}", created.id);
        let progress = Arc::new(std::sync::Mutex::new(on_bytes));
        let mut offset = 0u64;
        let mut resumed = 0u32;
        loop {
            let mut file = tokio::fs::File::open(path).await?;
            tokio::io::AsyncSeekExt::seek(&mut file, std::io::SeekFrom::Start(offset)).await?;
            let sent = Arc::new(AtomicU64::new(offset));
            let counted = {
                let (sent, progress) = (sent.clone(), progress.clone());
                futures_util::StreamExt::map(
                    tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024),
                    move |chunk| {
                        if let Ok(bytes) = &chunk {
                            let now = sent.fetch_add(bytes.len() as u64, Ordering::Relaxed) + bytes.len() as u64;
                            (progress.lock().expect("progress"))(now, total);
                        }
                        chunk
                    },
                )
            };
            let attempt = self
                .request(Method::PATCH, &url)
                .timeout(Duration::from_secs(24 * 3600))
                .header("upload-offset", offset)
                .header("upload-complete", "?1")
                .header("content-type", "application/partial-upload")
                .header("content-length", total - offset)
                .body(reqwest::Body::wrap_stream(counted))
                .send()
                .await;
            match attempt {
                Ok(response) if response.status().is_success() => {
                    let upload: Upload = response.json().await?;
                    return Ok(Uploaded { upload, resumed });
                }
                Ok(response)
                    if response.status() != StatusCode::CONFLICT
                        && !response.status().is_server_error()
                        && response.status() != StatusCode::TOO_MANY_REQUESTS =>
                {
                    return Err(problem(response).await);
                }
                Ok(_) | Err(_) => {}
            }
            resumed += 1;
            if resumed >= self.retry.max_attempts {
                return Err(Error::Unexpected(format!("the upload broke {resumed} times")));
            }
            tokio::time::sleep(self.retry.delay(resumed)).await;
            // Where the server stands now.
            let head = self.request(Method::HEAD, &url).send().await?;
            if !head.status().is_success() {
                return Err(Error::Unexpected(format!(
                    "HEAD of the upload answered {}",
                    head.status()
                )));
            }
            offset = header_u64(&head, "upload-offset")
                .ok_or_else(|| Error::Unexpected("HEAD of the upload has no Upload-Offset".into()))?;
            if head.headers().get("upload-complete").is_some_and(|v| v == "?1") {
                let upload: Upload = ok_json(self.request(Method::GET, &url).send().await?).await?;
                return Ok(Uploaded { upload, resumed });
            }
            tracing::debug!(offset, resumed, "resuming the upload");
        }
    }
}

fn header_u64(response: &Response, name: &str) -> Option<u64> {
    response.headers().get(name)?.to_str().ok()?.parse().ok()
}

async fn file_sha256(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher.finalize().to_vec())
}

/// Pages of [`Client::list`].
pub struct Pager {
    client: Client,
    filter: ListFilter,
    token: Option<String>,
    done: bool,
}

impl Pager {
    /// The next page, or `None` after the last.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Operation>>> {
        if self.done {
            return Ok(None);
        }
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(s) = &self.filter.state {
            query.push(("state", s.clone()));
        }
        if let Some(k) = &self.filter.kind {
            query.push(("kind", k.clone()));
        }
        if let Some(l) = &self.filter.label {
            query.push(("label", l.clone()));
        }
        if let Some(n) = self.filter.page_size {
            query.push(("page_size", n.to_string()));
        }
        if let Some(t) = &self.token {
            query.push(("page_token", t.clone()));
        }
        let response = self
            .client
            .request(Method::GET, "/v1/operations")
            .query(&query)
            .send()
            .await?;
        let page: OperationList = ok_json(response).await?;
        self.token = page.next_page_token;
        self.done = self.token.is_none();
        Ok(Some(page.operations))
    }

    /// Every remaining operation.
    pub async fn collect_all(mut self) -> Result<Vec<Operation>> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page().await? {
            all.extend(page);
        }
        Ok(all)
    }
}

fn header_seconds(response: &Response, name: &str) -> Option<Duration> {
    response
        .headers()
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

async fn problem(response: Response) -> Error {
    let status = response.status();
    let retry_after = header_seconds(&response, "retry-after");
    match response.json::<Problem>().await {
        Ok(problem) => Error::Api { problem, retry_after },
        Err(_) => Error::Unexpected(format!("{status} without a problem body")),
    }
}

async fn ok_json<T: serde::de::DeserializeOwned>(response: Response) -> Result<T> {
    if response.status().is_success() {
        Ok(response.json().await?)
    } else {
        Err(problem(response).await)
    }
}
