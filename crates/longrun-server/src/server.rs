//! Running Longrun as a process: store, bootstrap, services, listener, and a
//! graceful shutdown that lets in-flight requests finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::fingerprint::Fingerprinter;
use longrun_core::id::random_bytes;
use longrun_core::{Clock, SystemClock};
use longrun_engine::bytes::artifacts::{ArtifactStore, FileArtifacts};
use longrun_engine::in_process::dispatcher::{self, Dispatcher};
use longrun_engine::services::enforcer::{self, Enforcer};
use longrun_engine::services::reaper::{self, Reaper};
use longrun_engine::services::retention::{self, Retention};
use longrun_engine::services::webhooks::{self, Deliverer, DeliveryPolicy};
use longrun_engine::{CancellationToken, Signals};
use longrun_store::postgres::{PostgresConfig, PostgresStore};
use longrun_store::{ApiKeyCreateParams, SqliteConfig, SqliteStore, Store};
use tokio::task::JoinHandle;

use crate::app::{AppState, Config};

/// How `longrun serve` runs: every flag, as the CLI parsed it.
pub struct ServeOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The embedded database (used unless `postgres` is set).
    pub sqlite: SqliteConfig,
    /// The HTTP edge's settings.
    pub http: Config,
    /// Run the built-in kinds in this process.
    pub builtin_workers: bool,
    /// The in-process workers.
    pub dispatcher: dispatcher::Config,
    /// The reaper of lapsed leases.
    pub reaper: reaper::Config,
    /// The deadline enforcer.
    pub enforcer: enforcer::Config,
    /// The firing of schedules.
    pub schedules: crate::app::schedules::Config,
    /// The webhook deliverer.
    pub webhooks: webhooks::Config,
    /// Retention.
    pub retention: retention::Config,
    /// Where result artifacts are stored (`--data-dir/artifacts`) unless
    /// `artifact_store` names another store.
    pub artifacts_dir: PathBuf,
    /// Another artifact store (`--artifact-store file://…|s3://bucket/prefix`).
    pub artifact_store: Option<Arc<dyn ArtifactStore>>,
    /// Serve `/metrics` without a key on this address too.
    pub metrics_listen: Option<SocketAddr>,
    /// Use PostgreSQL (many `serve` processes may share it) instead of SQLite.
    pub postgres: Option<PostgresConfig>,
    /// Run the webhook deliverer in this process.
    pub deliver_webhooks: bool,
    /// Where time comes from (a `ManualClock` in tests).
    pub clock: Arc<dyn Clock>,
}

impl ServeOptions {
    /// The defaults, listening on `listen` over the SQLite database `sqlite`.
    pub fn new(listen: SocketAddr, sqlite: SqliteConfig) -> Self {
        let artifacts_dir = sqlite
            .path
            .parent()
            .map(|d| d.join("artifacts"))
            .unwrap_or_else(|| "artifacts".into());
        Self {
            artifacts_dir,
            artifact_store: None,
            retention: retention::Config::default(),
            listen,
            sqlite,
            http: Config::default(),
            builtin_workers: true,
            dispatcher: dispatcher::Config::default(),
            reaper: reaper::Config::default(),
            enforcer: enforcer::Config::default(),
            schedules: crate::app::schedules::Config::default(),
            webhooks: webhooks::Config::default(),
            deliver_webhooks: true,
            postgres: None,
            metrics_listen: None,
            clock: Arc::new(SystemClock),
        }
    }
}

/// The keys created on first start, shown once.
#[derive(Debug, Clone)]
pub struct BootstrapKeys {
    /// The tenant made for them.
    pub tenant: String,
    /// A key of role `admin`.
    pub admin: String,
    /// A key of role `client`.
    pub client: String,
}

/// A server started by [`start`].
pub struct RunningServer {
    /// The address it listens on (the port chosen, for port 0).
    pub addr: SocketAddr,
    /// The keys made on first start; `None` on later starts.
    pub bootstrap: Option<BootstrapKeys>,
    /// The store it serves.
    pub store: Arc<dyn Store>,
    /// The handlers' state, for tests and embedding.
    pub state: AppState,
    shutdown: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
    /// Held while serving an SQLite database: a second `serve` on the same
    /// file is refused rather than sharing it (SQLite serves one node).
    _serving: Option<std::fs::File>,
}

impl RunningServer {
    /// Stops accepting, lets in-flight requests and tasks finish (within the
    /// grace periods) and waits for everything to stop.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.handle.await.context("the server task panicked")?
    }

    /// Resolves when the server stops on its own (or after `shutdown`).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.handle.await.context("the server task panicked")?
    }

    /// Cancelling it starts the shutdown (as a signal would).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Takes `<database>.serve-lock`; the OS lets it go when the process ends,
/// however it ends.
fn lock_for_serving(database: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut path = database.as_os_str().to_owned();
    path.push(".serve-lock");
    if let Some(dir) = database.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("failed to open {}", std::path::Path::new(&path).display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `longrun serve` is using {}: an SQLite database serves one node \
             (run many nodes on PostgreSQL with --database postgres://…)",
            database.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("failed to lock {}", std::path::Path::new(&path).display()))
        }
    }
}

/// Opens the store, prepares it, binds the listener and starts serving.
pub async fn start(options: ServeOptions) -> anyhow::Result<RunningServer> {
    let mut sqlite = options.sqlite.clone();
    sqlite.operation_retention = options.http.operation_retention;
    let serving = match &options.postgres {
        Some(_) => None,
        None => Some(lock_for_serving(&sqlite.path)?),
    };
    let store: Arc<dyn Store> = match &options.postgres {
        Some(pg) => {
            let mut pg = pg.clone();
            pg.operation_retention = options.http.operation_retention;
            pg.result_retention = sqlite.result_retention;
            pg.keep_inputs = sqlite.keep_inputs;
            Arc::new(
                PostgresStore::open(pg)
                    .await
                    .context("failed to open the PostgreSQL database")?,
            )
        }
        None => Arc::new(
            SqliteStore::open(sqlite.clone()).with_context(|| format!("failed to open {}", sqlite.path.display()))?,
        ),
    };
    let clock = options.clock.clone();

    let registry = longrun_engine::kinds::builtin();
    for spec in longrun_engine::kinds::specs(&registry) {
        store
            .kind_upsert(spec)
            .await
            .context("failed to declare built-in kinds")?;
    }
    let secret = store
        .server_secret("fingerprint", random_bytes::<32>().to_vec(), clock.now())
        .await
        .context("failed to load the fingerprint secret")?;
    let bootstrap = bootstrap_keys(store.as_ref(), clock.as_ref()).await?;
    if store.server_secret_list(crate::app::LINK_KEY_PREFIX).await?.is_empty() {
        add_link_key(store.as_ref(), clock.as_ref()).await?;
    }
    let artifacts: Arc<dyn ArtifactStore> = match &options.artifact_store {
        Some(store) => store.clone(),
        None => Arc::new(FileArtifacts::new(&options.artifacts_dir)),
    };
    // The in-process workers of this node's previous run are gone (a crash or
    // a kill): hand their leases to the reaper now rather than after the
    // lease time. One SQLite database has one serving process, so the id is
    // this node's.
    let orphaned = store
        .task_expire_worker(&options.dispatcher.worker_id, clock.now())
        .await?;
    if orphaned > 0 {
        tracing::warn!(
            orphaned,
            "tasks of the previous run's in-process workers are being reaped"
        );
    }

    let signals = Signals::default();
    let state = AppState::new(
        store.clone(),
        artifacts.clone(),
        clock.clone(),
        registry.clone(),
        signals.clone(),
        Fingerprinter::new(&secret),
        options.http.clone(),
    );
    tokio::spawn(state.changes.clone().forward(store.subscribe_changes()));
    tokio::spawn(state.stats.clone().follow(store.subscribe_changes()));
    // Work queued or re-queued anywhere (another node, too) wakes this node's claimers.
    tokio::spawn(wake_claimers(store.subscribe_changes(), state.clone()));
    crate::metrics::handle();
    tokio::spawn(crate::metrics::follow(store.subscribe_changes()));
    if let Some(addr) = options.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr} for metrics"))?;
        let router = crate::http::admin::metrics_only().with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("failed to listen on {}", options.listen))?;
    let addr = listener.local_addr()?;
    // Never log a database URL: it may carry a password.
    let database = if options.postgres.is_some() {
        "postgresql".to_owned()
    } else {
        sqlite.path.display().to_string()
    };
    tracing::info!(%addr, %database, "longrun is serving");

    let shutdown = CancellationToken::new();
    let services_stop = CancellationToken::new();
    let mut services = Vec::new();
    if options.builtin_workers {
        let dispatcher = Dispatcher::new(
            store.clone(),
            artifacts.clone(),
            registry.clone(),
            signals.clone(),
            clock.clone(),
            options.dispatcher.clone(),
        );
        services.push(tokio::spawn(dispatcher.run(services_stop.clone())));
    }
    let reaper = Reaper::new(store.clone(), signals.clone(), clock.clone(), options.reaper.clone());
    services.push(tokio::spawn(reaper.run(services_stop.clone())));
    let enforcer = Enforcer::new(store.clone(), clock.clone(), options.enforcer.clone());
    services.push(tokio::spawn(enforcer.run(services_stop.clone())));
    let mut webhook_config = options.webhooks.clone();
    let policy = &options.http.callback_policy;
    webhook_config.policy = DeliveryPolicy {
        allow_http: policy.allow_http,
        allow_private: policy.allow_private,
    };
    let retention = Retention::new(
        store.clone(),
        artifacts.clone(),
        clock.clone(),
        options.retention.clone(),
    );
    services.push(tokio::spawn(retention.run(services_stop.clone())));
    services.push(tokio::spawn(crate::app::schedules::run(
        state.clone(),
        options.schedules.clone(),
        services_stop.clone(),
    )));
    if options.deliver_webhooks {
        let deliverer = Arc::new(Deliverer::new(store.clone(), clock.clone(), webhook_config));
        services.push(tokio::spawn(deliverer.run(services_stop.clone())));
    }

    let stack = crate::router::stack(state.clone());
    let limits = options.http.limits.clone();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move {
        let served = crate::listen::serve(listener, stack, limits, stop).await;
        // Requests are done: nothing more can be accepted. Now stop claiming
        // and let running tasks finish within their grace period.
        services_stop.cancel();
        for service in services {
            let _ = service.await;
        }
        served.context("the HTTP server failed")
    });
    Ok(RunningServer {
        addr,
        bootstrap,
        store,
        state,
        shutdown,
        handle,
        _serving: serving,
    })
}

/// On first start with no keys: tenant `default`, one admin and one client key.
async fn bootstrap_keys(store: &dyn Store, clock: &dyn Clock) -> anyhow::Result<Option<BootstrapKeys>> {
    if store.api_key_count().await? > 0 {
        return Ok(None);
    }
    // Several processes may start at once on one database: only the one whose
    // marker is stored creates the keys.
    let marker = random_bytes::<16>().to_vec();
    if store.server_secret("bootstrap", marker.clone(), clock.now()).await? != marker {
        return Ok(None);
    }
    let tenant = "default".to_owned();
    let mut tokens = Vec::new();
    for role in [Role::Admin, Role::Client] {
        let key = NewApiKey::generate();
        store
            .api_key_create(ApiKeyCreateParams {
                id: key.id,
                tenant: tenant.clone(),
                role,
                secret_hash: key.secret_hash,
                now: clock.now(),
            })
            .await?;
        tokens.push(key.token);
    }
    let client = tokens.pop().expect("two keys");
    let admin = tokens.pop().expect("two keys");
    Ok(Some(BootstrapKeys { tenant, admin, client }))
}

/// Adds a new download-link key; it signs new links from now on, and older
/// keys keep verifying the links they signed. Returns its id.
pub async fn add_link_key(store: &dyn Store, clock: &dyn Clock) -> anyhow::Result<String> {
    let kid = longrun_core::id::random_base32::<5>();
    let name = format!("{}{kid}", crate::app::LINK_KEY_PREFIX);
    store
        .server_secret(&name, random_bytes::<32>().to_vec(), clock.now())
        .await?;
    Ok(kid)
}

async fn wake_claimers(mut feed: tokio::sync::broadcast::Receiver<longrun_store::Change>, app: AppState) {
    let signals = &app.signals;
    loop {
        match feed.recv().await {
            Ok(change) if change.is_resync() => signals.work_available(),
            // A unit of work heard here already (from the request that
            // made it on this node) wakes nobody again.
            Ok(change) if matches!(change.event_type.as_str(), "created" | "retry_scheduled" | "resumed") => {
                signals.work_available_for(&change.kind, change.operation_id.as_str(), change.version)
            }
            // An operation that stopped running, wherever its worker
            // reported: a capped tenant's next task may be claimed. (Not
            // one that never started: work cancelled or expired while
            // queued held no place. Asked only while a claimer of its kind
            // waits: the tenant's limits may be a store read.)
            Ok(change)
                if (change.state.is_terminal() || change.state == longrun_core::State::Paused)
                    && change.started_at.is_some()
                    && signals.waiting_for(&change.kind) =>
            {
                app.slot_freed(
                    &change.tenant,
                    &change.kind,
                    change.operation_id.as_str(),
                    change.version,
                )
                .await
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => signals.work_available(),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Bounded wait used by the CLI after the signal: a second signal or this
/// timeout ends the process even if something hangs.
pub const HARD_STOP_AFTER: Duration = Duration::from_secs(30);
