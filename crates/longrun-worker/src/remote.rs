//! Remote workers: the same [`Handler`](crate::Handler)s, driven over the HTTP worker
//! protocol (docs/api.md §4) instead of straight through the store.
//!
//! [`RemoteWorker`] long-polls for batches, runs each task with an
//! [`HttpLink`] (heartbeats carry progress and cost and bring back cancel
//! requests; outcomes are fenced by the lease token), and on shutdown stops
//! claiming, lets running tasks finish within a grace period, then gives back
//! what is left as a retryable failure.

use std::sync::Arc;
use std::time::Duration;

use crate::slots::{Reserved, Slots};
use async_trait::async_trait;
use longrun_api::{
    ArtifactUploadBody, ClaimRequest, ClaimResponse, HeartbeatRequest, HeartbeatResponse, JoinRequest, OutcomeItem,
    OutcomeKind, OutcomesBody, OutcomesResponse, PieceStoredBody, Problem, TaskBody,
};
use longrun_core::task::{DEFAULT_ARTIFACT, HeartbeatAck, OperationError, Outcome, ProgressUpdate};
use longrun_core::{Id, IdKind, Timestamp};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::WorkerError;
use crate::registry::Registry;
use crate::reports;
use crate::task::{ByteReader, StopFlags, TaskContext, TaskLink, UploadedArtifact, send_and_log, task_span};

/// How a remote worker connects and runs.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// e.g. `http://127.0.0.1:8080`
    pub server: String,
    /// A key of role `worker`.
    pub token: String,
    /// Names the worker in leases and logs.
    pub worker_id: String,
    /// Tasks run at once.
    pub concurrency: usize,
    /// How long each lease lasts without a heartbeat (heartbeats go every third of it).
    pub lease: Duration,
    /// How long one claim request long-polls.
    pub claim_wait: Duration,
    /// How long shutdown waits for running tasks before giving them back.
    pub shutdown_grace: Duration,
    /// At most one progress report per task per interval; the last one
    /// goes with the outcome.
    pub progress_interval: Duration,
}

impl RemoteConfig {
    /// Defaults for the server at `server` with key `token`.
    pub fn new(server: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            server: server.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            worker_id: format!("worker-{}", std::process::id()),
            concurrency: 4,
            lease: Duration::from_secs(30),
            claim_wait: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(30),
            progress_interval: crate::task::DEFAULT_PROGRESS_INTERVAL,
        }
    }
}

/// A task's link to the server over HTTP.
pub struct HttpLink {
    http: reqwest::Client,
    base: String,
    token: String,
    operation_id: Id,
    lease_token: String,
    outcomes: OutcomeBatcher,
}

/// The most outcomes one `POST /v1/worker/outcomes` carries.
const OUTCOME_BATCH: usize = 100;
/// How long an outcome waits for others to share its request.
const OUTCOME_LINGER: Duration = Duration::from_millis(2);

type OutcomeJob = (OutcomeItem, tokio::sync::oneshot::Sender<Result<(), WorkerError>>);

/// Coalesces the outcomes of a worker's tasks: whatever finishes within a
/// couple of milliseconds (up to 100) goes to the server in one
/// `POST /v1/worker/outcomes`, each item fenced by its own lease token and
/// answered alone.
#[derive(Clone)]
struct OutcomeBatcher {
    queue: tokio::sync::mpsc::Sender<OutcomeJob>,
}

impl OutcomeBatcher {
    fn spawn(http: reqwest::Client, base: String, token: String) -> Self {
        let (queue, mut rx) = tokio::sync::mpsc::channel::<OutcomeJob>(4 * OUTCOME_BATCH);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let until = tokio::time::Instant::now() + OUTCOME_LINGER;
                while batch.len() < OUTCOME_BATCH {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(job)) => batch.push(job),
                        _ => break,
                    }
                }
                let (items, replies): (Vec<OutcomeItem>, Vec<_>) = batch.into_iter().unzip();
                let answers = post_outcomes(&http, &base, &token, items).await;
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            }
        });
        Self { queue }
    }

    async fn send(&self, item: OutcomeItem) -> Result<(), WorkerError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.queue
            .send((item, reply))
            .await
            .map_err(|_| WorkerError::Transport("the outcome sender has stopped".into()))?;
        answer
            .await
            .map_err(|_| WorkerError::Transport("the outcome sender dropped an outcome".into()))?
    }
}

async fn post_outcomes(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    items: Vec<OutcomeItem>,
) -> Vec<Result<(), WorkerError>> {
    let count = items.len();
    let all_failed = |why: String| (0..count).map(|_| Err(WorkerError::Transport(why.clone()))).collect();
    let response = match http
        .post(format!("{base}/v1/worker/outcomes"))
        .bearer_auth(token)
        .json(&OutcomesBody { outcomes: &items })
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return all_failed(format!("outcomes request failed: {e}")),
    };
    if !response.status().is_success() {
        let why = refusal("outcomes", response).await;
        return (0..count).map(|_| Err(why.clone())).collect();
    }
    match response.json::<OutcomesResponse>().await {
        Ok(answer) if answer.results.len() == count => answer
            .results
            .into_iter()
            .map(|r| match (r.status, r.problem) {
                (200, _) => Ok(()),
                (status, Some(p)) => Err(refused(status, p.code.into_owned(), p.detail, None)),
                (status, None) => Err(WorkerError::Transport(format!(
                    "outcome answered {status} without a problem"
                ))),
            })
            .collect(),
        Ok(_) => all_failed("the outcomes answer does not match the request".into()),
        Err(e) => all_failed(format!("bad outcomes answer: {e}")),
    }
}

/// What a refused worker request means to the task: `lease_lost` fences
/// it out; `503` and `429` say when to come back; any other problem is a
/// refusal with its code.
async fn refusal(what: &str, response: reqwest::Response) -> WorkerError {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    match response.json::<Problem>().await {
        Ok(p) => refused(status, p.code.into_owned(), p.detail, retry_after),
        Err(_) => WorkerError::Transport(format!("{what} answered {status} without a problem")),
    }
}

/// The [`WorkerError`] a problem answer means.
fn refused(status: u16, code: String, message: String, retry_after: Option<Duration>) -> WorkerError {
    match (status, code.as_str()) {
        (_, "lease_lost") => WorkerError::LeaseLost,
        (404, _) => WorkerError::NotFound,
        (429 | 503, _) => WorkerError::Unavailable { retry_after, message },
        _ => WorkerError::Refused { code, message },
    }
}

/// The artifact an upload or a join answered with.
async fn uploaded_artifact(response: reqwest::Response) -> Result<UploadedArtifact, WorkerError> {
    let uploaded: ArtifactUploadBody = response
        .json()
        .await
        .map_err(|e| WorkerError::Transport(format!("bad upload answer: {e}")))?;
    Ok(UploadedArtifact {
        id: uploaded.id,
        size_bytes: uploaded.size_bytes,
        sha256: uploaded.sha256,
    })
}

impl HttpLink {
    /// Streams `body` to `url` with the task's lease token.
    async fn put_stream(
        &self,
        url: String,
        content_type: Option<&str>,
        body: ByteReader,
        what: &str,
    ) -> Result<reqwest::Response, WorkerError> {
        let stream = tokio_util::io::ReaderStream::with_capacity(body, 256 * 1024);
        let mut request = self
            .http
            .put(url)
            .bearer_auth(&self.token)
            .header("lease-token", &self.lease_token);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request
            .body(reqwest::Body::wrap_stream(stream))
            .send()
            .await
            .map_err(|e| WorkerError::Transport(format!("{what} failed: {e}")))
    }

    async fn post(&self, action: &str, body: &impl serde::Serialize) -> Result<reqwest::Response, WorkerError> {
        let url = format!("{}/v1/worker/tasks/{}/{action}", self.base, self.operation_id);
        let response = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| WorkerError::Transport(format!("{action} request failed: {e}")))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(action, response).await)
    }
}

#[async_trait]
impl TaskLink for HttpLink {
    async fn heartbeat(
        &self,
        progress: Option<ProgressUpdate>,
        cost_units: Option<f64>,
        cancellable: Option<bool>,
        checkpoint: Option<Value>,
    ) -> Result<HeartbeatAck, WorkerError> {
        let body = HeartbeatRequest {
            lease_token: self.lease_token.clone(),
            progress: progress.map(reports::progress_to_wire),
            cost_units,
            cancellable,
            checkpoint,
        };
        let ack: HeartbeatResponse = self
            .post("heartbeat", &body)
            .await?
            .json()
            .await
            .map_err(|e| WorkerError::Transport(format!("bad heartbeat response: {e}")))?;
        Ok(HeartbeatAck {
            // The server's clock decides when the lease ends; a worker only
            // needs to know whether to stop.
            lease_expires_at: Timestamp(0),
            cancel_requested: ack.cancel_requested,
            cancel_reason: ack.cancel_reason,
            pause_requested: ack.pause_requested,
            version: 0,
        })
    }

    async fn upload(&self, name: &str, content_type: &str, body: ByteReader) -> Result<UploadedArtifact, WorkerError> {
        let url = if name == DEFAULT_ARTIFACT {
            format!("{}/v1/worker/tasks/{}/artifact", self.base, self.operation_id)
        } else {
            format!("{}/v1/worker/tasks/{}/artifacts/{name}", self.base, self.operation_id)
        };
        let response = self.put_stream(url, Some(content_type), body, "upload").await?;
        if !response.status().is_success() {
            return Err(refusal("upload", response).await);
        }
        uploaded_artifact(response).await
    }

    async fn upload_piece(&self, name: &str, offset: u64, body: ByteReader) -> Result<u64, WorkerError> {
        let url = format!(
            "{}/v1/worker/tasks/{}/artifacts/{name}/pieces/{offset}",
            self.base, self.operation_id
        );
        let response = self.put_stream(url, None, body, "piece upload").await?;
        // A mismatch says where the stored pieces end.
        let offset = response
            .headers()
            .get("upload-offset")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let (reqwest::StatusCode::CONFLICT, Some(offset)) = (response.status(), offset) {
            return Err(WorkerError::OffsetMismatch { offset });
        }
        if !response.status().is_success() {
            return Err(refusal("piece upload", response).await);
        }
        let stored: PieceStoredBody = response
            .json()
            .await
            .map_err(|e| WorkerError::Transport(format!("bad piece answer: {e}")))?;
        Ok(stored.upload_offset)
    }

    async fn join_pieces(
        &self,
        name: &str,
        content_type: &str,
        size_bytes: u64,
    ) -> Result<UploadedArtifact, WorkerError> {
        let url = format!(
            "{}/v1/worker/tasks/{}/artifacts/{name}/join",
            self.base, self.operation_id
        );
        let body = JoinRequest {
            lease_token: self.lease_token.clone(),
            content_type: Some(content_type.to_owned()),
            size_bytes,
        };
        let response = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| WorkerError::Transport(format!("joining the pieces failed: {e}")))?;
        if !response.status().is_success() {
            return Err(refusal("join", response).await);
        }
        uploaded_artifact(response).await
    }

    async fn open_upload(&self, upload_id: &Id) -> Result<ByteReader, WorkerError> {
        use futures_util::TryStreamExt;
        let url = format!(
            "{}/v1/worker/tasks/{}/uploads/{upload_id}",
            self.base, self.operation_id
        );
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .header("lease-token", &self.lease_token)
            .send()
            .await
            .map_err(|e| WorkerError::Transport(format!("reading the upload failed: {e}")))?;
        if !response.status().is_success() {
            return Err(refusal("upload read", response).await);
        }
        let stream = response.bytes_stream().map_err(std::io::Error::other);
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream)))
    }

    async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError> {
        let item = |kind| OutcomeItem::new(self.operation_id.as_str(), self.lease_token.clone(), kind);
        let mut item = match outcome {
            Outcome::Succeeded { result } => OutcomeItem {
                result,
                ..item(OutcomeKind::Complete)
            },
            Outcome::Failed { error } => OutcomeItem {
                error: Some(reports::error_to_wire(error)),
                ..item(OutcomeKind::Fail)
            },
            Outcome::Cancelled => item(OutcomeKind::Cancelled),
            Outcome::Paused { checkpoint } => OutcomeItem {
                checkpoint,
                ..item(OutcomeKind::Paused)
            },
        };
        item.progress = progress.map(reports::progress_to_wire);
        self.outcomes.send(item).await
    }
}

/// Most tasks one claim request asks for (the protocol's bound).
const MAX_CLAIM: usize = 100;

/// Claims tasks of its handlers' kinds over HTTP and runs them.
pub struct RemoteWorker {
    http: reqwest::Client,
    config: RemoteConfig,
    registry: Registry,
}

impl RemoteWorker {
    /// A worker running `registry`'s handlers.
    pub fn new(config: RemoteConfig, registry: Registry) -> Self {
        let http = reqwest::Client::builder()
            .timeout(config.claim_wait + Duration::from_secs(30))
            .pool_idle_timeout(longrun_api::CLIENT_POOL_IDLE)
            .build()
            .expect("an HTTP client");
        Self { http, config, registry }
    }

    /// Runs until `shutdown`, then drains (see the module docs).
    pub async fn run(self, shutdown: CancellationToken) {
        let slots = Slots::new(self.config.concurrency);
        let tracker = TaskTracker::new();
        let abandon = CancellationToken::new();
        // One batcher for every task of this worker, so their outcomes share requests.
        let outcomes = OutcomeBatcher::spawn(self.http.clone(), self.config.server.clone(), self.config.token.clone());
        while !shutdown.is_cancelled() {
            // Wait for room (or shutdown) before asking for work: a free
            // slot, or quick work's room to claim ahead (see `Slots`).
            let reserved = tokio::select! {
                reserved = slots.reserve_some(MAX_CLAIM) => reserved,
                () = shutdown.cancelled() => break,
            };
            // The claim itself is not cancelled by shutdown: tasks the server
            // leased to us must be run or given back, never dropped.
            let tasks = match self.claim(reserved.len()).await {
                Ok(tasks) => tasks,
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed; retrying");
                    drop(reserved);
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = shutdown.cancelled() => {}
                    }
                    continue;
                }
            };
            let mut reserved = reserved.into_iter();
            for task in tasks {
                let link = self.link(&task, &outcomes);
                let Some(reserved) = reserved.next() else {
                    give_back(&link, "the claim brought more tasks than the worker asked for").await;
                    continue;
                };
                if shutdown.is_cancelled() {
                    give_back(&link, "the worker is shutting down").await;
                    continue;
                }
                self.start(task, link, reserved, &tracker, abandon.clone());
            }
        }
        tracker.close();
        if tokio::time::timeout(self.config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = tracker.len(),
                "shutdown grace ended; giving back running tasks"
            );
            abandon.cancel();
            tracker.wait().await;
        }
    }

    async fn claim(&self, max_tasks: usize) -> Result<Vec<TaskBody>, reqwest::Error> {
        let request = ClaimRequest {
            kinds: self.registry.kinds(),
            max_tasks: max_tasks.min(MAX_CLAIM) as u32,
            lease_seconds: self.config.lease.as_secs(),
            wait_seconds: self.config.claim_wait.as_secs(),
            worker_id: Some(self.config.worker_id.clone()),
        };
        let response = self
            .http
            .post(format!("{}/v1/worker/claims", self.config.server))
            .bearer_auth(&self.config.token)
            .json(&request)
            .send()
            .await?
            .error_for_status()?;
        Ok(response.json::<ClaimResponse>().await?.tasks)
    }

    fn link(&self, task: &TaskBody, outcomes: &OutcomeBatcher) -> Arc<HttpLink> {
        Arc::new(HttpLink {
            http: self.http.clone(),
            base: self.config.server.clone(),
            token: self.config.token.clone(),
            operation_id: Id::parse(IdKind::Operation, &task.operation_id)
                .unwrap_or_else(|| Id::from_trusted(task.operation_id.clone())),
            lease_token: task.lease_token.clone(),
            outcomes: outcomes.clone(),
        })
    }

    fn start(
        &self,
        task: TaskBody,
        link: Arc<HttpLink>,
        mut reserved: Reserved,
        tracker: &TaskTracker,
        abandon: CancellationToken,
    ) {
        let Some(handler) = self.registry.get(&task.kind).cloned() else {
            tracing::error!(kind = %task.kind, "claimed a kind this worker has no handler for");
            return;
        };
        let heartbeat_every = self.config.lease / 3;
        let progress_interval = self.config.progress_interval;
        let span = task_span(&link.operation_id, &task.kind, task.attempt, &self.config.worker_id);
        let run = async move {
            let flags = Arc::new(StopFlags::default());
            let id = link.operation_id.clone();
            let ctx = TaskContext::new(id.clone(), task.attempt, task.input, link.clone(), flags)
                .with_progress_interval(progress_interval)
                .with_checkpoint(task.checkpoint);
            let report = tokio::select! {
                report = reserved.run(handler, ctx, heartbeat_every) => report,
                () = abandon.cancelled() => {
                    give_back(&link, "the worker shut down before the task finished").await;
                    return;
                }
            };
            // The handler is done (its slot already takes the next task)
            // while the outcome is sent.
            send_and_log(&id, report).await;
            drop(reserved);
        };
        tracker.spawn(tracing::Instrument::instrument(run, span));
    }
}

/// Hands a task back: a retryable failure, so it runs again if attempts are left.
async fn give_back(link: &HttpLink, why: &str) {
    let error = OperationError {
        code: "worker_shutdown".into(),
        message: why.into(),
        retryable: true,
    };
    if let Err(e) = link.finish(Outcome::Failed { error }, None).await {
        tracing::warn!(op.id = %link.operation_id, error = %e, "could not give a task back");
    }
}
