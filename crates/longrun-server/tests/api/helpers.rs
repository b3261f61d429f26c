//! `spawn_app()` and friends: one server per test on port 0 with its own data
//! directory, keys for two tenants, and request helpers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::{Clock, ManualClock, SystemClock};
use longrun_server::{RunningServer, ServeOptions};
use longrun_store::{ApiKeyCreateParams, SqliteConfig, Store};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Arc<dyn Store>,
    pub state: longrun_server::AppState,
    /// Client key of tenant `acme`.
    pub client_key: String,
    /// Client key of tenant `globex`, to prove tenants cannot see each other.
    pub other_tenant_key: String,
    pub worker_key: String,
    server: Option<RunningServer>,
    pub dir: tempfile::TempDir,
}

#[derive(Clone)]
pub struct Options {
    pub builtin_workers: bool,
    pub max_body_bytes: usize,
    pub require_idempotency_key: bool,
    /// Drive leases and deadlines with this clock instead of the wall clock.
    pub clock: Option<ManualClock>,
    pub max_waiters_per_tenant: usize,
    /// Allow http:// and loopback callbacks, as local receivers need.
    pub webhooks_to_loopback: bool,
    pub webhook_schedule: Option<Vec<Duration>>,
    pub webhook_reuse_connections: bool,
    pub deliver_webhooks: bool,
    pub max_artifact_bytes: u64,
    pub artifact_store: Option<Arc<dyn longrun_engine::bytes::artifacts::ArtifactStore>>,
    /// How often the retention sweep runs (wall clock); 20 ms by default.
    pub retention_interval: Duration,
    /// The edge's connection, timeout and in-flight bounds.
    pub limits: longrun_server::Limits,
    /// How long verified keys are trusted; zero (revocation bites at once) by default.
    pub key_cache_ttl: Duration,
    /// Cap the SQLite file at this many pages (a full disk, for drills).
    pub max_page_count: Option<u32>,
    pub max_upload_bytes: u64,
    /// How often a waiting worker claim looks again unwoken (500 ms).
    pub claim_poll: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            builtin_workers: true,
            max_body_bytes: 1024 * 1024,
            require_idempotency_key: true,
            clock: None,
            max_waiters_per_tenant: 1000,
            webhooks_to_loopback: false,
            webhook_schedule: None,
            webhook_reuse_connections: true,
            deliver_webhooks: true,
            max_artifact_bytes: 1 << 30,
            artifact_store: None,
            retention_interval: Duration::from_millis(20),
            limits: longrun_server::Limits::default(),
            key_cache_ttl: Duration::ZERO,
            max_page_count: None,
            max_upload_bytes: 1 << 30,
            claim_poll: Duration::from_millis(500),
        }
    }
}

/// A manual clock starting now, for tests that move time.
pub fn manual_clock() -> ManualClock {
    ManualClock::new(SystemClock.now())
}

/// Logs only when `TEST_LOG` is set, e.g. `TEST_LOG=debug cargo test`.
fn init_tracing() {
    if let Ok(filter) = std::env::var("TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

pub async fn spawn_app_with(options: Options) -> TestApp {
    init_tracing();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut serve = ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        SqliteConfig::new(dir.path().join("longrun.db")),
    );
    serve.builtin_workers = options.builtin_workers;
    serve.sqlite.max_page_count = options.max_page_count;
    serve.http.max_body_bytes = options.max_body_bytes;
    serve.http.require_idempotency_key = options.require_idempotency_key;
    serve.http.max_waiters_per_tenant = options.max_waiters_per_tenant;
    if options.webhooks_to_loopback {
        serve.http.callback_policy = longrun_server::CallbackPolicy {
            allow_http: true,
            allow_private: true,
        };
    }
    if let Some(schedule) = &options.webhook_schedule {
        serve.webhooks.schedule = schedule.clone();
    }
    serve.webhooks.reuse_connections = options.webhook_reuse_connections;
    serve.deliver_webhooks = options.deliver_webhooks;
    serve.retention.interval = options.retention_interval;
    serve.http.max_artifact_bytes = options.max_artifact_bytes;
    serve.dispatcher.max_artifact_bytes = options.max_artifact_bytes;
    serve.http.max_upload_bytes = options.max_upload_bytes;
    serve.artifact_store = options.artifact_store.clone();
    serve.webhooks.interval = Duration::from_millis(20);
    serve.webhooks.secret_cache = Duration::ZERO;
    // Revocation must bite at once in tests, unless a test says otherwise.
    serve.http.key_cache_ttl = options.key_cache_ttl;
    serve.http.limits = options.limits.clone();
    serve.http.claim_poll = options.claim_poll;
    serve.dispatcher.poll_interval = Duration::from_millis(50);
    // Tests end with work still running; shutdown need not wait for it.
    serve.dispatcher.shutdown_grace = Duration::from_millis(100);
    // Maintenance runs often so that moving the manual clock takes effect fast.
    serve.reaper.interval = Duration::from_millis(20);
    serve.enforcer.interval = Duration::from_millis(20);
    serve.schedules.interval = Duration::from_millis(20);
    if let Some(clock) = &options.clock {
        serve.clock = Arc::new(clock.clone());
    }
    let server = longrun_server::start(serve).await.expect("server starts");
    let store = server.store.clone();
    let state = server.state.clone();
    assert!(server.bootstrap.is_some(), "first start bootstraps keys");
    let client_key = create_key(store.as_ref(), "acme", Role::Client).await;
    let other_tenant_key = create_key(store.as_ref(), "globex", Role::Client).await;
    let worker_key = create_key(store.as_ref(), "acme", Role::Worker).await;
    TestApp {
        base: format!("http://{}", server.addr),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        store,
        state,
        client_key,
        other_tenant_key,
        worker_key,
        server: Some(server),
        dir,
    }
}

pub async fn create_key(store: &dyn Store, tenant: &str, role: Role) -> String {
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id,
            tenant: tenant.into(),
            role,
            secret_hash: key.secret_hash,
            now: SystemClock.now(),
        })
        .await
        .unwrap();
    key.token
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A console session for `key` over plain HTTP (no browser): a client
    /// that follows no redirect, and the session's `cookie` header.
    pub async fn console_session(&self, key: &str) -> (reqwest::Client, String) {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let signed_in = http
            .post(self.url("/ui/sign-in"))
            .form(&[("key", key), ("next", "/ui/")])
            .send()
            .await
            .unwrap();
        assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
        let cookie = signed_in.headers()["set-cookie"].to_str().unwrap();
        let session = cookie.split(';').next().unwrap().to_owned();
        (http, session)
    }

    pub fn request(&self, method: Method, path: &str, key: &str) -> RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(key)
    }

    /// `POST /v1/operations` as tenant `acme` with `key` as Idempotency-Key.
    pub async fn submit(&self, idempotency_key: &str, body: &Value) -> Response {
        self.request(Method::POST, "/v1/operations", &self.client_key)
            .header("Idempotency-Key", idempotency_key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn submit_ok(&self, idempotency_key: &str, body: &Value) -> Value {
        let response = self.submit(idempotency_key, body).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "submission accepted");
        response.json().await.unwrap()
    }

    /// `GET path` with the client key, as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.request(Method::GET, path, &self.client_key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn get_operation(&self, id: &str) -> Value {
        let response = self
            .request(Method::GET, &format!("/v1/operations/{id}"), &self.client_key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// Polls until `done(operation)` holds: waiting on a condition, bounded.
    pub async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let op = self.get_operation(id).await;
            if done(&op) {
                return op;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {op}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn wait_for_state(&self, id: &str, state: &str) -> Value {
        self.wait_for(id, state, |op| op["state"] == state).await
    }

    pub async fn operation_count(&self, tenant: &str) -> usize {
        let mut count = 0;
        let mut before = None;
        loop {
            let page = self
                .store
                .operation_list(longrun_store::ListParams {
                    tenant: Some(tenant.into()),
                    page_size: 100,
                    before_seq: before,
                    ..Default::default()
                })
                .await
                .unwrap();
            count += page.operations.len();
            match page.next_before_seq {
                Some(next) => before = Some(next),
                None => return count,
            }
        }
    }

    /// Declares a kind served by remote workers.
    pub async fn declare_kind(&self, name: &str, rerun_safe: bool, max_attempts: i64) {
        self.store
            .kind_upsert(longrun_store::KindSpec {
                name: name.into(),
                builtin: false,
                rerun_safe,
                max_attempts,
                default_deadline_seconds: None,
                max_deadline_seconds: None,
                pausable: false,
            })
            .await
            .unwrap();
    }

    /// `POST` a worker protocol call with the worker key.
    pub async fn worker_post(&self, path: &str, body: &Value) -> Response {
        self.request(Method::POST, path, &self.worker_key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Claims (no waiting) and returns the tasks.
    pub async fn claim(&self, kind: &str, max_tasks: u32) -> Vec<Value> {
        let response = self
            .worker_post(
                "/v1/worker/claims",
                &serde_json::json!({"kinds": [kind], "max_tasks": max_tasks, "lease_seconds": 30}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.unwrap();
        body["tasks"].as_array().unwrap().clone()
    }

    /// Polls the history until an event of `event_type` is recorded.
    pub async fn wait_for_event(&self, id: &str, event_type: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let history: Value = self
                .request(Method::GET, &format!("/v1/operations/{id}/history"), &self.client_key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if let Some(event) = history["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["type"] == event_type)
            {
                return event.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for event {event_type}: {history}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Files under the artifact store, finished or temporary.
    pub fn artifact_files(&self) -> Vec<String> {
        fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path.display().to_string());
                }
            }
        }
        let mut files = Vec::new();
        walk(&self.dir.path().join("artifacts"), &mut files);
        files
    }

    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await.unwrap();
        }
    }
}

/// Reads a problem+json error and checks the parts every error must have.
/// The SDK's remote worker, running one handler against a test server over
/// real HTTP; [`RemoteWorkerRun::stop`] ends it as SIGTERM would.
pub struct RemoteWorkerRun {
    shutdown: tokio_util::sync::CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl RemoteWorkerRun {
    /// Stops claiming, lets running tasks finish (100 ms grace), and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.handle.await.unwrap();
    }
}

impl TestApp {
    /// Starts a remote worker with `concurrency` slots running `handler`
    /// against this server with the worker key. Its claims wait 200 ms
    /// (the protocol's whole seconds make that 0: they do not long-poll).
    pub fn remote_worker(
        &self,
        handler: Arc<dyn longrun_worker::task::Handler>,
        concurrency: usize,
    ) -> RemoteWorkerRun {
        let mut registry = longrun_worker::Registry::default();
        registry.register(handler);
        let mut config = longrun_worker::remote::RemoteConfig::new(self.base.clone(), self.worker_key.clone());
        config.concurrency = concurrency;
        config.claim_wait = Duration::from_millis(200);
        config.shutdown_grace = Duration::from_millis(100);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let handle = tokio::spawn(longrun_worker::remote::RemoteWorker::new(config, registry).run(shutdown.clone()));
        RemoteWorkerRun { shutdown, handle }
    }
}

pub async fn problem(response: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(response.status(), status, "status for {code}");
    let request_id = response
        .headers()
        .get("x-request-id")
        .expect("X-Request-Id")
        .to_str()
        .unwrap()
        .to_owned();
    let content_type = response
        .headers()
        .get("content-type")
        .expect("content type")
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status.as_u16());
    assert_eq!(body["request_id"], request_id);
    assert!(body["title"].is_string() && body["detail"].is_string() && body["type"].is_string());
    assert!(body["retryable"].is_boolean());
    body
}

pub fn sleep_body(duration_ms: u64) -> Value {
    serde_json::json!({"kind": "sleep", "input": {"duration_ms": duration_ms, "steps": 2}})
}

/// A loopback proxy that forwards each request to `upstream` and then cuts
/// the connection instead of relaying the response: the server has answered
/// — so it has committed — but the client never hears it.
pub async fn response_dropping_proxy(upstream: SocketAddr) -> SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let (mut client_read, client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let forward = tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
                let mut first_byte = [0u8; 1];
                let _ = server_read.read(&mut first_byte).await;
                forward.abort();
                drop(client_write);
            });
        }
    });
    addr
}

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Received {
    pub webhook_id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: String,
}

/// A webhook receiver on loopback: records every request, answers with the
/// next status of its plan (then 200), and applies each `webhook-id` once.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    pub addr: SocketAddr,
    pub received: Arc<std::sync::Mutex<Vec<Received>>>,
    pub applied: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Receiver {
    pub async fn start(plan: Vec<u16>) -> Receiver {
        use axum::http::{HeaderMap, StatusCode as AxumStatus};
        let received: Arc<std::sync::Mutex<Vec<Received>>> = Arc::default();
        let applied: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
        let plan = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(plan)));
        let (r, a) = (received.clone(), applied.clone());
        let handler = move |headers: HeaderMap, body: String| {
            let (r, a, plan) = (r.clone(), a.clone(), plan.clone());
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                let webhook_id = header("webhook-id");
                r.lock().unwrap().push(Received {
                    webhook_id: webhook_id.clone(),
                    timestamp: header("webhook-timestamp"),
                    signature: header("webhook-signature"),
                    body,
                });
                let status = plan.lock().unwrap().pop_front().unwrap_or(200);
                if (200..300).contains(&status) {
                    // Deduplicate by webhook-id: apply each event once.
                    a.lock().unwrap().insert(webhook_id);
                }
                AxumStatus::from_u16(status).unwrap()
            }
        };
        let app = axum::Router::new().route("/hook", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            url: format!("http://{addr}/hook"),
            addr,
            received,
            applied,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Whether interop tests must not skip (set by `.ci/run`).
pub fn peers_required() -> bool {
    std::env::var_os("LONGRUN_REQUIRE_PEERS").is_some_and(|v| v != "0")
}
