//! `longrun`: the one binary (docs/api.md §1). A thin clap layer over the server,
//! the store and the client SDK.
//!
//! # Layout
//!
//! - this file: the commands and their flags (`serve`, `migrate`, `keys`,
//!   `kinds`, `tenants`, `admin`, `worker`), opening the store a `--database`
//!   names, and one clear line (with the problem code) for a failed
//!   command, never a backtrace.
//! - `client`: the client commands (`submit`, `get`, `wait`, `cancel`,
//!   `list`, `result`) over the SDK; their exit codes are their interface.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::duration::parse_duration;
use longrun_core::webhook::WebhookSecret;
use longrun_core::{Clock, Id, IdKind, SystemClock};
use longrun_engine::bytes::artifacts::{ArtifactStore, FileArtifacts};
use longrun_engine::{CancellationToken, Registry};
use longrun_server::{CallbackPolicy, Config, ServeOptions};
use longrun_store::postgres::{PostgresConfig, PostgresStore};
use longrun_store::{ApiKeyCreateParams, KindSpec, SqliteConfig, SqliteStore, Store, TenantLimits};
use longrun_worker::exec::ExecHandler;
use longrun_worker::remote::{RemoteConfig, RemoteWorker};

mod client;
mod supervise;

#[derive(Parser)]
#[command(
    name = "longrun",
    version,
    about = "A durable server for HTTP work that finishes later.",
    after_help = client::EXIT_CODES_HELP
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Global {
    /// Where the embedded database (longrun.db) and artifacts live.
    #[arg(long, env = "LONGRUN_DATA_DIR", default_value = "./longrun-data", global = true)]
    data_dir: PathBuf,
    /// Where result artifacts live: file:///path or s3://bucket/prefix (AWS_*
    /// environment variables give credentials, region and endpoint). Default:
    /// the data dir's artifacts/.
    #[arg(long, env = "LONGRUN_ARTIFACT_STORE", global = true)]
    artifact_store: Option<String>,
    /// A postgres:// URL to use PostgreSQL instead of the embedded SQLite.
    #[arg(long, env = "LONGRUN_DATABASE", hide_env_values = true, global = true)]
    database: Option<String>,
    /// Connections in the PostgreSQL pool of this process (besides one to
    /// listen for changes and one for each of its 4 group-commit writers).
    #[arg(long, env = "LONGRUN_DB_POOL_SIZE", default_value_t = 16, global = true)]
    db_pool_size: u32,
    /// Log format.
    #[arg(long, env = "LONGRUN_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `longrun=debug`.
    #[arg(long, env = "LONGRUN_LOG", default_value = "info", global = true)]
    log: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API with built-in workers and maintenance loops.
    Serve(ServeArgs),
    /// Apply schema migrations and exit (serve also applies them at start).
    Migrate,
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Declare the operation kinds that remote workers serve.
    #[command(subcommand)]
    Kinds(KindsCommand),
    /// Quotas and limits per tenant.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// Operator actions.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Run a remote worker that serves kind K by running CMD per task.
    ///
    /// The input JSON arrives on stdin; LONGRUN_OPERATION_ID and LONGRUN_ATTEMPT
    /// are set, and each upload the input names is a file named by its id in
    /// LONGRUN_UPLOADS_DIR. Print JSON lines on stdout: {"progress": {"completed_units": 5,
    /// "total_units": 10, "unit": "rows", "phase": "WRITING"}} updates progress,
    /// {"result": …} gives the result. Exit 0 succeeds, anything else fails with
    /// worker_error. Cancellation sends SIGTERM, then SIGKILL after --grace.
    Worker(WorkerArgs),
    /// Run one `worker --exec` command so that it ends when its worker dies
    /// (started by the worker itself; see `supervise.rs`).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
}

#[derive(Args)]
struct SuperviseArgs {
    /// Between SIGTERM and SIGKILL once the worker is gone.
    #[arg(long, value_parser = parse_duration)]
    grace: Duration,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<std::ffi::OsString>,
}

#[derive(Args)]
struct WorkerArgs {
    #[command(flatten)]
    connection: client::ServerArgs,
    /// The kind to serve (declare it first with `longrun kinds set`).
    #[arg(long)]
    kind: String,
    /// The command to run per task, through `sh -c`.
    #[arg(long)]
    exec: String,
    /// Tasks run at once (quick work may be claimed ahead of free slots, up
    /// to 15× this many more; see docs/workers.md).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Lease length; heartbeats renew it every third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    /// Between SIGTERM and SIGKILL when a task is cancelled.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// On SIGTERM/Ctrl-C, how long running tasks may finish before they are given back.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_grace: Duration,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Refuse new submissions (503 temporarily_unavailable) globally or for
    /// one kind; observation, workers and cancellation go on.
    PauseAccepting {
        #[arg(long)]
        kind: Option<String>,
    },
    /// Accept submissions again (globally, or for one kind).
    ResumeAccepting {
        #[arg(long)]
        kind: Option<String>,
    },
    /// Add a new download-link signing key. New links use it; links signed
    /// by older keys keep working until they expire.
    RotateLinkKey,
}

#[derive(Subcommand)]
enum TenantsCommand {
    /// Set a tenant's limits (omitted limits are removed).
    Set {
        tenant: String,
        /// Most operations not yet ended; more are refused with quota_exceeded.
        #[arg(long)]
        max_active: Option<i64>,
        /// Most operations running at once.
        #[arg(long)]
        max_running: Option<i64>,
        /// Requests per second.
        #[arg(long)]
        rate: Option<f64>,
    },
    /// Show a tenant's limits.
    Get { tenant: String },
    /// Delete every operation, result, event, delivery, secret and key of a tenant.
    Delete {
        tenant: String,
        /// Required: this cannot be undone.
        #[arg(long)]
        yes: bool,
    },
    /// Print the tenant's webhook signing secret (whsec_…), creating it if needed;
    /// with --rotate, make a new one. The old one keeps signing during the overlap.
    WebhookSecret {
        tenant: String,
        #[arg(long)]
        rotate: bool,
        /// How long the previous secret keeps signing after a rotation.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        overlap: Duration,
    },
}

#[derive(Args)]
struct ServeArgs {
    #[arg(long, env = "LONGRUN_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// This node's name among many on one PostgreSQL database (default host:port).
    #[arg(long, env = "LONGRUN_NODE_ID")]
    node_id: Option<String>,
    /// Also serve /metrics without a key on this address (for a scraper).
    #[arg(long, env = "LONGRUN_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "LONGRUN_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    max_body_bytes: usize,
    /// Run the built-in kinds (sleep) in this process.
    #[arg(long, env = "LONGRUN_BUILTIN_WORKERS", default_value_t = true, action = clap::ArgAction::Set)]
    builtin_workers: bool,
    /// Built-in tasks run at once in this process (quick work may be claimed
    /// ahead of free slots, up to 15× this many more; see docs/workers.md).
    #[arg(long, env = "LONGRUN_WORKER_CONCURRENCY", default_value_t = 64)]
    worker_concurrency: usize,
    /// Refuse submissions without an Idempotency-Key header.
    #[arg(long, env = "LONGRUN_REQUIRE_IDEMPOTENCY_KEY", default_value_t = true, action = clap::ArgAction::Set)]
    require_idempotency_key: bool,
    /// How long a finished operation (and its idempotency record) is kept.
    #[arg(long, env = "LONGRUN_OPERATION_RETENTION", default_value = "30d", value_parser = parse_duration)]
    operation_retention: Duration,
    /// Keep each operation's input after it ends.
    #[arg(long, env = "LONGRUN_KEEP_INPUTS")]
    keep_inputs: bool,
    /// How long a result artifact is kept after the operation succeeded.
    #[arg(long, env = "LONGRUN_RESULT_RETENTION", default_value = "24h", value_parser = parse_duration)]
    result_retention: Duration,
    /// How long a removed operation answers 410 gone (and keeps its idempotency key).
    #[arg(long, env = "LONGRUN_TOMBSTONE_RETENTION", default_value = "30d", value_parser = parse_duration)]
    tombstone_retention: Duration,
    /// How old an artifact object no row names must be before retention
    /// deletes it as a crash's leftover.
    #[arg(long, env = "LONGRUN_ORPHAN_GRACE", default_value = "1h", value_parser = parse_duration)]
    orphan_grace: Duration,
    /// How long a minted download link works.
    #[arg(long, env = "LONGRUN_LINK_TTL", default_value = "5m", value_parser = parse_duration)]
    link_ttl: Duration,
    /// How long finished webhook deliveries and their log are kept.
    #[arg(long, env = "LONGRUN_DELIVERY_RETENTION", default_value = "7d", value_parser = parse_duration)]
    delivery_retention: Duration,
    /// At most one stored progress change per operation per interval for
    /// the built-in workers (reports between are coalesced; the last one is
    /// stored with the outcome). `0s` stores every report.
    #[arg(long, env = "LONGRUN_PROGRESS_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    progress_interval: Duration,
    /// Largest result artifact a worker may upload, in bytes.
    #[arg(long, env = "LONGRUN_MAX_ARTIFACT_BYTES", default_value_t = 64 * 1024 * 1024 * 1024)]
    max_artifact_bytes: u64,
    /// Largest upload (`POST /v1/uploads`, resumed or not) a client may stream, in bytes.
    #[arg(long, env = "LONGRUN_MAX_UPLOAD_BYTES", default_value_t = 64 * 1024 * 1024 * 1024)]
    max_upload_bytes: u64,
    /// How long an upload no operation names is kept (one an operation names lives as long as it).
    #[arg(long, env = "LONGRUN_UPLOAD_RETENTION", default_value = "24h", value_parser = parse_duration)]
    upload_retention: Duration,
    /// Connections open at once; one more is answered 503 and closed.
    #[arg(long, env = "LONGRUN_MAX_CONNECTIONS", default_value_t = 10_000)]
    max_connections: usize,
    /// Requests handled at once; more are shed with 503 and Retry-After.
    #[arg(long, env = "LONGRUN_MAX_IN_FLIGHT", default_value_t = 4096)]
    max_in_flight: usize,
    /// Requests of one tenant handled at once (long-polls included); more are 429.
    #[arg(long, env = "LONGRUN_MAX_IN_FLIGHT_PER_TENANT", default_value_t = 1024)]
    max_in_flight_per_tenant: usize,
    /// Proxies whose Forwarded / X-Forwarded-For headers name the client
    /// (comma-separated addresses or CIDR networks; none by default). The
    /// source of a request is then the rightmost forwarded address that is
    /// not a trusted proxy; from any other peer, the peer.
    #[arg(long, env = "LONGRUN_TRUSTED_PROXIES", default_value = "", value_parser = longrun_server::source::TrustedProxies::parse)]
    trusted_proxies: longrun_server::source::TrustedProxies,
    /// How often a worker's waiting claim looks again without being woken:
    /// what finds work whose start time or retry backoff arrived. Each
    /// waiting claim costs a store claim this often.
    #[arg(long, env = "LONGRUN_CLAIM_POLL", default_value = "500ms", value_parser = parse_duration)]
    claim_poll: Duration,
    /// Long-polls and event streams one tenant may hold open at once; more
    /// are 429 rate_limited.
    #[arg(long, env = "LONGRUN_MAX_WAITERS_PER_TENANT", default_value_t = 1000)]
    max_waiters_per_tenant: usize,
    /// Time a client has to send a request's head (and an idle connection is kept).
    #[arg(long, env = "LONGRUN_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_read_timeout: Duration,
    /// Longest pause between two chunks of a request body.
    #[arg(long, env = "LONGRUN_BODY_STALL_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    body_stall_timeout: Duration,
    /// Longest a response may wait for a client that stopped reading; then the connection is closed.
    #[arg(long, env = "LONGRUN_SEND_STALL_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    send_stall_timeout: Duration,
    /// Allow http:// callback URLs (development only).
    #[arg(long, env = "LONGRUN_WEBHOOK_ALLOW_HTTP")]
    webhook_allow_http: bool,
    /// Allow callback URLs naming private or loopback addresses (development only).
    #[arg(long, env = "LONGRUN_WEBHOOK_ALLOW_PRIVATE")]
    webhook_allow_private: bool,
    /// Delays before each webhook attempt (the first attempt is immediate); then given up.
    #[arg(long, env = "LONGRUN_WEBHOOK_RETRY_SCHEDULE", default_value = "0s,5s,5m,30m,2h,5h,10h,10h",
          value_parser = parse_schedule)]
    webhook_retry_schedule: Schedule,
}

/// A parsed `--webhook-retry-schedule`.
#[derive(Clone, Debug)]
struct Schedule(Vec<Duration>);

fn parse_schedule(text: &str) -> Result<Schedule, String> {
    let schedule = longrun_core::webhook::parse_schedule(text).map_err(|e| e.to_string())?;
    if schedule.is_empty() {
        return Err("the schedule needs at least one entry".into());
    }
    Ok(Schedule(schedule))
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key and print it once (only its hash is stored).
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long, value_parser = parse_role)]
        role: Role,
    },
    /// List keys (ids, tenants, roles; never secrets).
    List,
    /// Revoke a key by id.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum KindsCommand {
    /// Declare or update a kind.
    Set {
        name: String,
        /// Re-running an attempt whose worker vanished is safe.
        #[arg(long)]
        rerun_safe: bool,
        /// Running work may be paused: its workers save checkpoints and
        /// honour `pause_requested` (report `paused`).
        #[arg(long)]
        pausable: bool,
        #[arg(long, default_value_t = 3)]
        max_attempts: i64,
        /// Deadline given when a submission names none, in seconds.
        #[arg(long)]
        default_deadline: Option<i64>,
        /// Longest deadline a submission may ask for, in seconds.
        #[arg(long)]
        max_deadline: Option<i64>,
    },
    /// List declared kinds.
    List,
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| "role must be client, worker or admin".to_owned())
}

fn init_logging(global: &Global) {
    let filter = tracing_subscriber::EnvFilter::try_new(&global.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file or collector
    // would store the escape codes, and writing them costs a tenth of a
    // request that does little (every span field is coloured as it is
    // recorded).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match global.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
    }
}

fn sqlite_config(global: &Global) -> SqliteConfig {
    SqliteConfig::new(global.data_dir.join("longrun.db"))
}

fn postgres_config(global: &Global) -> anyhow::Result<Option<PostgresConfig>> {
    match &global.database {
        None => Ok(None),
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let mut config = PostgresConfig::new(url.clone());
            config.max_connections = global.db_pool_size;
            Ok(Some(config))
        }
        Some(_) => bail!("--database must be a postgres:// URL (the embedded SQLite needs no URL)"),
    }
}

async fn open_store(global: &Global) -> anyhow::Result<Arc<dyn Store>> {
    if let Some(config) = postgres_config(global)? {
        return Ok(Arc::new(
            PostgresStore::open(config)
                .await
                .context("failed to open the PostgreSQL database")?,
        ));
    }
    let config = sqlite_config(global);
    let store =
        SqliteStore::open(config.clone()).with_context(|| format!("failed to open {}", config.path.display()))?;
    Ok(Arc::new(store))
}

/// mimalloc, not glibc's malloc: a profile of the in-process drain on
/// PostgreSQL had the server spend a quarter of its time in glibc's
/// `malloc`/`free` (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`
/// around sqlx's message buffers and the batches' JSON).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// No transparent huge pages for this process. mimalloc asks for them on
/// the memory it maps, and memory it has given back (after a second
/// unused) comes back as a 2 MiB page the kernel zeroes on first touch: a
/// profile of the in-process drain on PostgreSQL had the server spend a
/// fifth of its time in `clear_page_erms` under mimalloc's page faults.
/// With them off (`MIMALLOC_ALLOW_THP=0` did the same) `scripts/drain` took
/// 117–129 µs of CPU a job instead of 136–155 (three alternating runs).
/// PostgreSQL's own documentation and most databases' say the same of THP.
#[allow(unsafe_code)]
fn without_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_THP_DISABLE takes plain integers and only
    // sets a flag of this process; its result is ignored (an older kernel
    // without it leaves things as they were).
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// A failed command prints one line, `error: ` and its causes, and exits 1:
/// never a backtrace, whatever `RUST_BACKTRACE` says (a bug is reported the
/// same way, as `error: internal: …`). `serve` keeps the default panic
/// report for its logs.
fn main() -> std::process::ExitCode {
    without_transparent_huge_pages();
    let cli = Cli::parse();
    init_logging(&cli.global);
    if !matches!(cli.command, Command::Serve(_)) {
        std::panic::set_hook(Box::new(|info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            eprintln!("error: internal: {message}");
        }));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e.into()),
    };
    if let Command::Supervise(args) = cli.command {
        // Light: one thread, and no logging of its own (its streams are the
        // command's).
        let code = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(supervise::supervise(args.grace, args.command)));
        return match code {
            Ok(code) => std::process::ExitCode::from(code),
            Err(e) => fail(&e),
        };
    }
    if let Command::Client(command) = cli.command {
        let code = runtime.block_on(client::run(command));
        return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// One line: the error and its causes, joined by `: `, and for a store's
/// refusal the problem code the API would answer with it.
fn fail(e: &anyhow::Error) -> std::process::ExitCode {
    let line = format!("{e:#}").replace('\n', " ");
    match e.downcast_ref::<longrun_store::StoreError>() {
        Some(store) => {
            let code = longrun_server::ApiError::of_store(store.clone()).code();
            eprintln!("error: {line} [{code}]");
        }
        None => eprintln!("error: {line}"),
    }
    std::process::ExitCode::FAILURE
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let global = cli.global;
    match cli.command {
        Command::Serve(args) => serve(&global, args).await,
        Command::Migrate => {
            if let Some(pg) = postgres_config(&global)? {
                let applied = longrun_store::postgres::migrate(&pg.url).await?;
                println!("applied {applied} migration(s) to the PostgreSQL database");
                return Ok(());
            }
            let config = sqlite_config(&global);
            if let Some(dir) = config.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let applied = longrun_store::sqlite::migrate(&config.path)?;
            println!("applied {applied} migration(s) to {}", config.path.display());
            Ok(())
        }
        Command::Keys(command) => keys(&global, command).await,
        Command::Kinds(command) => kinds(&global, command).await,
        Command::Tenants(command) => tenants(&global, command).await,
        Command::Admin(AdminCommand::PauseAccepting { kind }) => {
            open_store(&global).await?.accepting_pause(kind.clone(), true).await?;
            println!(
                "paused acceptance of {} (servers apply it within seconds)",
                kind.as_deref().unwrap_or("every kind")
            );
            Ok(())
        }
        Command::Admin(AdminCommand::ResumeAccepting { kind }) => {
            open_store(&global).await?.accepting_pause(kind.clone(), false).await?;
            println!("resumed acceptance of {}", kind.as_deref().unwrap_or("every kind"));
            Ok(())
        }
        Command::Admin(AdminCommand::RotateLinkKey) => {
            let store = open_store(&global).await?;
            let kid = longrun_server::add_link_key(store.as_ref(), &SystemClock).await?;
            println!("new download-link key {kid}; servers use it within a few seconds");
            Ok(())
        }
        Command::Worker(args) => worker(args).await,
        Command::Client(_) | Command::Supervise(_) => unreachable!("run in main"),
    }
}

async fn serve(global: &Global, args: ServeArgs) -> anyhow::Result<()> {
    let mut sqlite = sqlite_config(global);
    sqlite.keep_inputs = args.keep_inputs;
    sqlite.result_retention = args.result_retention;
    let mut options = ServeOptions::new(args.listen, sqlite);
    options.builtin_workers = args.builtin_workers;
    options.postgres = postgres_config(global)?;
    if options.postgres.is_some() {
        // Many nodes share the database: in-process leases carry this node's id,
        // so a restart of this node hands exactly its own leases to the reaper.
        let node = args
            .node_id
            .clone()
            .unwrap_or_else(|| format!("{}:{}", hostname(), args.listen.port()));
        options.dispatcher.worker_id = format!("in-process@{node}");
    }
    options.metrics_listen = args.metrics_listen;
    options.webhooks.schedule = args.webhook_retry_schedule.0.clone();
    options.retention.tombstone_retention = args.tombstone_retention;
    options.retention.orphan_grace = args.orphan_grace;
    if let Some(url) = &global.artifact_store {
        options.artifact_store = Some(longrun_engine::bytes::artifacts::from_url(url)?);
    }
    options.retention.delivery_retention = args.delivery_retention;
    options.dispatcher.max_artifact_bytes = args.max_artifact_bytes;
    options.dispatcher.concurrency = args.worker_concurrency;
    options.dispatcher.progress_interval = args.progress_interval;
    options.http = Config {
        max_body_bytes: args.max_body_bytes,
        require_idempotency_key: args.require_idempotency_key,
        operation_retention: args.operation_retention,
        callback_policy: CallbackPolicy {
            allow_http: args.webhook_allow_http,
            allow_private: args.webhook_allow_private,
        },
        link_ttl: args.link_ttl,
        max_artifact_bytes: args.max_artifact_bytes,
        max_upload_bytes: args.max_upload_bytes,
        upload_retention: args.upload_retention,
        max_waiters_per_tenant: args.max_waiters_per_tenant.max(1),
        claim_poll: args.claim_poll.max(Duration::from_millis(10)),
        limits: longrun_server::Limits {
            max_connections: args.max_connections,
            max_in_flight: args.max_in_flight,
            max_in_flight_per_tenant: args.max_in_flight_per_tenant,
            header_read_timeout: args.header_read_timeout,
            body_stall_timeout: args.body_stall_timeout,
            send_stall_timeout: args.send_stall_timeout,
            trusted_proxies: args.trusted_proxies.clone(),
            ..Default::default()
        },
        ..Config::default()
    };
    let server = longrun_server::start(options).await?;
    if let Some(keys) = &server.bootstrap {
        println!(
            "First start: created tenant {:?} with these API keys. They are shown once; store them now.",
            keys.tenant
        );
        println!("  admin key:  {}", keys.admin);
        println!("  client key: {}", keys.client);
    }
    println!("longrun listening on http://{}", server.addr);
    let token = server.shutdown_token();
    tokio::spawn(async move {
        longrun_server::shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        token.cancel();
        // A second signal, or a hang past the hard limit, ends the process.
        tokio::select! {
            () = longrun_server::shutdown_signal() => {}
            () = tokio::time::sleep(longrun_server::HARD_STOP_AFTER) => {}
        }
        tracing::warn!("forced exit");
        std::process::exit(1);
    });
    server.wait().await
}

async fn keys(global: &Global, command: KeysCommand) -> anyhow::Result<()> {
    let store = open_store(global).await?;
    let now = SystemClock.now();
    match command {
        KeysCommand::Create { tenant, role } => {
            longrun_core::validate::kind_name(&tenant)
                .map_err(|_| anyhow::anyhow!("tenant names are 1–64 characters of a-z, 0-9, '_', '.', '-'"))?;
            let key = NewApiKey::generate();
            store
                .api_key_create(ApiKeyCreateParams {
                    id: key.id.clone(),
                    tenant: tenant.clone(),
                    role,
                    secret_hash: key.secret_hash,
                    now,
                })
                .await?;
            eprintln!(
                "created {} key {} for tenant {tenant:?}; it is shown once:",
                role.as_str(),
                key.id
            );
            println!("{}", key.token);
        }
        KeysCommand::List => {
            println!("{:<32} {:<16} {:<8} {:<26} REVOKED", "ID", "TENANT", "ROLE", "CREATED");
            for key in store.api_key_list().await? {
                println!(
                    "{:<32} {:<16} {:<8} {:<26} {}",
                    key.id,
                    key.tenant,
                    key.role.as_str(),
                    key.created_at.to_rfc3339(),
                    key.revoked_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
                );
            }
        }
        KeysCommand::Revoke { id } => {
            let id = Id::parse(IdKind::ApiKey, &id).context("key ids look like key_…")?;
            if store.api_key_revoke(&id, now).await? {
                println!("revoked {id} (servers stop accepting it within a few seconds)");
            } else {
                bail!("no active key {id}");
            }
        }
    }
    Ok(())
}

async fn kinds(global: &Global, command: KindsCommand) -> anyhow::Result<()> {
    let store = open_store(global).await?;
    match command {
        KindsCommand::Set {
            name,
            rerun_safe,
            pausable,
            max_attempts,
            default_deadline,
            max_deadline,
        } => {
            longrun_core::validate::kind_name(&name)?;
            if max_attempts < 1 {
                bail!("--max-attempts must be at least 1");
            }
            if store.kind_get(&name).await?.is_some_and(|existing| existing.builtin) {
                bail!("{name} is a built-in kind; it cannot be redeclared");
            }
            store
                .kind_upsert(KindSpec {
                    name: name.clone(),
                    builtin: false,
                    rerun_safe,
                    max_attempts,
                    default_deadline_seconds: default_deadline,
                    max_deadline_seconds: max_deadline,
                    pausable,
                })
                .await?;
            println!("declared kind {name}");
        }
        KindsCommand::List => {
            println!(
                "{:<24} {:<8} {:<10} {:<9} {:<12} {:<16} MAX_DEADLINE",
                "KIND", "BUILTIN", "RERUN_SAFE", "PAUSABLE", "MAX_ATTEMPTS", "DEFAULT_DEADLINE"
            );
            for k in store.kind_list().await? {
                let secs = |s: Option<i64>| s.map(|s| format!("{s}s")).unwrap_or_else(|| "-".into());
                println!(
                    "{:<24} {:<8} {:<10} {:<9} {:<12} {:<16} {}",
                    k.name,
                    k.builtin,
                    k.rerun_safe,
                    k.pausable,
                    k.max_attempts,
                    secs(k.default_deadline_seconds),
                    secs(k.max_deadline_seconds)
                );
            }
        }
    }
    Ok(())
}

async fn tenants(global: &Global, command: TenantsCommand) -> anyhow::Result<()> {
    let store = open_store(global).await?;
    match command {
        TenantsCommand::Set {
            tenant,
            max_active,
            max_running,
            rate,
        } => {
            longrun_core::validate::kind_name(&tenant)
                .map_err(|_| anyhow::anyhow!("tenant names are 1–64 characters of a-z, 0-9, '_', '.', '-'"))?;
            if max_active.is_some_and(|n| n < 0) || max_running.is_some_and(|n| n < 0) {
                bail!("limits must not be negative");
            }
            if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
                bail!("--rate must be a positive number of requests per second");
            }
            store
                .tenant_set(TenantLimits {
                    name: tenant.clone(),
                    max_active,
                    max_running,
                    rate,
                })
                .await?;
            println!("set limits of tenant {tenant} (servers apply them within a few seconds)");
        }
        TenantsCommand::Get { tenant } => match store.tenant_get(&tenant).await? {
            Some(t) => {
                let show = |v: Option<String>| v.unwrap_or_else(|| "unlimited".into());
                println!("tenant       {}", t.name);
                println!("max_active   {}", show(t.max_active.map(|n| n.to_string())));
                println!("max_running  {}", show(t.max_running.map(|n| n.to_string())));
                println!("rate         {}", show(t.rate.map(|r| format!("{r}/s"))));
            }
            None => bail!("no tenant {tenant}"),
        },
        TenantsCommand::Delete { tenant, yes } => {
            if !yes {
                bail!("this deletes everything of tenant {tenant}; run again with --yes");
            }
            let counts = store.tenant_delete(&tenant, SystemClock.now()).await?;
            let artifacts: std::sync::Arc<dyn ArtifactStore> = match &global.artifact_store {
                Some(url) => longrun_engine::bytes::artifacts::from_url(url)?,
                None => std::sync::Arc::new(FileArtifacts::new(global.data_dir.join("artifacts"))),
            };
            let objects =
                longrun_engine::services::retention::collect_garbage(store.as_ref(), artifacts.as_ref(), 500).await?;
            println!(
                "deleted tenant {tenant}: {} operations, {} results ({objects} objects), {} keys, {} webhook deliveries",
                counts.operations, counts.results, counts.keys, counts.deliveries
            );
            // An object the artifact store refused stays queued as garbage:
            // say so, since the command will not retry it (retention will).
            let left = store.backlog(SystemClock.now()).await?.garbage_objects;
            if left > 0 {
                eprintln!(
                    "warning: {left} stored objects could not be deleted now; the server's retention pass retries them"
                );
            }
        }
        TenantsCommand::WebhookSecret {
            tenant,
            rotate,
            overlap,
        } => {
            let now = SystemClock.now();
            if rotate {
                let fresh = WebhookSecret::generate().expose();
                store
                    .webhook_secret_rotate(&tenant, fresh.clone(), now, overlap)
                    .await?;
                eprintln!("rotated; the previous secret keeps signing for {}s", overlap.as_secs());
                println!("{fresh}");
            } else {
                let secrets = store
                    .webhook_secrets(&tenant, WebhookSecret::generate().expose(), now)
                    .await?;
                println!(
                    "{}",
                    secrets.first().expect("a tenant always has a secret after this call")
                );
            }
        }
    }
    Ok(())
}

async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let Some(token) = args.connection.token.clone() else {
        bail!("no API key: pass --token (a key of role worker) or set LONGRUN_TOKEN");
    };
    longrun_core::validate::kind_name(&args.kind)?;
    let mut registry = Registry::default();
    registry.register(Arc::new(ExecHandler {
        kind: args.kind.clone(),
        command: args.exec,
        grace: args.grace,
        // This binary, as each command's supervisor: a dead worker's
        // commands end with it.
        supervisor: std::env::current_exe().ok(),
    }));
    let mut config = RemoteConfig::new(args.connection.server.clone(), token);
    config.concurrency = args.concurrency.max(1);
    config.lease = args.lease;
    config.shutdown_grace = args.shutdown_grace;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        longrun_server::shutdown_signal().await;
        tracing::info!("worker shutting down: finishing running tasks");
        stop.cancel();
    });
    eprintln!(
        "longrun worker serving kind {} with concurrency {}",
        args.kind, config.concurrency
    );
    RemoteWorker::new(config, registry).run(shutdown).await;
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "node".into())
}
