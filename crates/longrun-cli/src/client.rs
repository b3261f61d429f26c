//! The client commands (`submit`, `get`, `wait`, `cancel`, `list`, `result`),
//! on top of the SDK. Their exit codes are part of their interface.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use longrun_client::{Client, Error, ListFilter, Operation, Submission};
use serde_json::Value;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_CANCELLED: i32 = 3;
pub const EXIT_REFUSED: i32 = 4;
pub const EXIT_TRANSPORT: i32 = 5;

pub const EXIT_CODES_HELP: &str = "Exit codes of the client commands:
  0  success (for submit --wait, wait and result: the operation succeeded)
  1  the operation failed
  2  usage error (bad flags or input)
  3  the operation was cancelled
  4  the server refused the request (the problem code is printed)
  5  the server could not be reached";

/// Where the server is and the key to call it with (client commands and
/// `longrun worker`; not `serve`).
#[derive(Args, Clone)]
pub struct ServerArgs {
    /// The Longrun server.
    #[arg(long, env = "LONGRUN_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// An API key (role client; role worker for `longrun worker`).
    #[arg(long, env = "LONGRUN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The flags every client command takes.
#[derive(Args, Clone)]
pub struct ClientArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `longrun schedules …`.
#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule; prints its id and next firing times.
    Create {
        /// The kind each firing submits.
        kind: String,
        /// 5-field cron, a shorthand (@daily) or `@every 15m`.
        #[arg(long)]
        cron: String,
        /// Each firing's input (JSON).
        #[arg(long)]
        input: Option<String>,
        /// The IANA time zone the cron is read in (default UTC).
        #[arg(long)]
        time_zone: Option<String>,
        /// skip (default), buffer_one or allow.
        #[arg(long)]
        overlap: Option<String>,
        /// Seconds a missed firing may be late and still start (default 3600).
        #[arg(long)]
        catchup_window: Option<u64>,
        /// Each firing's priority, 1–9.
        #[arg(long)]
        priority: Option<u64>,
        /// Each firing's labels, key=value (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the tenant's schedules.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a schedule and its recent firings.
    Get {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause a schedule (no firing until resumed).
    Pause {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a schedule; its next firing counts from now.
    Resume {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a schedule (its operations stay).
    Delete {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fire a schedule now; prints the firing's operation id.
    Trigger {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

impl ScheduleCommand {
    fn args(&self) -> &ClientArgs {
        match self {
            ScheduleCommand::Create { client, .. }
            | ScheduleCommand::List { client }
            | ScheduleCommand::Get { client, .. }
            | ScheduleCommand::Pause { client, .. }
            | ScheduleCommand::Resume { client, .. }
            | ScheduleCommand::Delete { client, .. }
            | ScheduleCommand::Trigger { client, .. } => client,
        }
    }
}

fn print_schedule(schedule: &longrun_client::Schedule, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string(schedule).unwrap_or_default()),
        Output::Text => {
            println!("id         {}", schedule.id);
            println!("kind       {}", schedule.kind);
            println!("cron       {} ({})", schedule.cron, schedule.time_zone);
            println!(
                "version    {}{}",
                schedule.version,
                if schedule.paused { "  paused" } else { "" }
            );
            for (n, at) in schedule.next_fire_times.iter().enumerate() {
                println!("{}{at}", if n == 0 { "next       " } else { "           " });
            }
            if let Some(op) = &schedule.last_operation_id {
                println!("last       {op}");
            }
        }
    }
}

async fn schedules(client: &Client, output: Output, command: ScheduleCommand) -> Result<i32, Error> {
    match command {
        ScheduleCommand::Create {
            kind,
            cron,
            input,
            time_zone,
            overlap,
            catchup_window,
            priority,
            labels,
            ..
        } => {
            let (input, labels) = match (input.as_deref().map(read_input).transpose(), parse_labels(&labels)) {
                (Ok(input), Ok(labels)) => (input, labels),
                (Err(message), _) | (_, Err(message)) => {
                    eprintln!("error: {message}");
                    return Ok(EXIT_USAGE);
                }
            };
            let overlap = match overlap.as_deref() {
                None => None,
                Some(text) => match serde_json::from_value(Value::String(text.to_owned())) {
                    Ok(overlap) => Some(overlap),
                    Err(_) => {
                        eprintln!("error: --overlap is skip, buffer_one or allow");
                        return Ok(EXIT_USAGE);
                    }
                },
            };
            let request = longrun_client::ScheduleRequest {
                kind,
                input,
                cron,
                time_zone,
                overlap,
                catchup_window,
                labels: (!labels.is_empty()).then_some(labels),
                priority,
                ..Default::default()
            };
            let schedule = client.create_schedule(&request).await?;
            match output {
                Output::Json => print_schedule(&schedule, output),
                Output::Text => println!("{}", schedule.id),
            }
        }
        ScheduleCommand::List { .. } => {
            let mut token: Option<String> = None;
            loop {
                let page = client.list_schedules(token.as_deref()).await?;
                for schedule in &page.schedules {
                    match output {
                        Output::Json => print_schedule(schedule, output),
                        Output::Text => println!(
                            "{}  {:<20} {:<16} {}{}",
                            schedule.id,
                            schedule.kind,
                            schedule.cron,
                            schedule.next_fire_times.first().map_or("-", String::as_str),
                            if schedule.paused { "  paused" } else { "" }
                        ),
                    }
                }
                match page.next_page_token {
                    Some(next) => token = Some(next),
                    None => break,
                }
            }
        }
        ScheduleCommand::Get { id, .. } => {
            let schedule = client.get_schedule(&id).await?;
            print_schedule(&schedule, output);
            if output == Output::Text {
                for fire in client.schedule_fires(&id).await?.fires.iter().take(10) {
                    println!(
                        "fired      {}  {}{}",
                        fire.fire_time,
                        fire.decision,
                        fire.operation_id
                            .as_deref()
                            .map(|op| format!("  {op}"))
                            .unwrap_or_default()
                    );
                }
            }
        }
        ScheduleCommand::Pause { id, .. } => {
            let patch = longrun_client::SchedulePatch {
                paused: Some(true),
                ..Default::default()
            };
            print_schedule(&client.patch_schedule(&id, &patch).await?, output);
        }
        ScheduleCommand::Resume { id, .. } => {
            let patch = longrun_client::SchedulePatch {
                paused: Some(false),
                ..Default::default()
            };
            print_schedule(&client.patch_schedule(&id, &patch).await?, output);
        }
        ScheduleCommand::Delete { id, .. } => client.delete_schedule(&id).await?,
        ScheduleCommand::Trigger { id, .. } => {
            let operation = client.trigger_schedule(&id).await?;
            match output {
                Output::Json => print_operation(&operation, output),
                Output::Text => println!("{}", operation.id),
            }
        }
    }
    Ok(EXIT_OK)
}

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Submit an operation; prints its id (and the idempotency key to retry with).
    Submit {
        /// The kind (not with --batch, whose lines name their own).
        #[arg(required_unless_present = "batch", conflicts_with = "batch")]
        kind: Option<String>,
        /// Submit many at once: a file of JSON lines, each a submission
        /// (`{"kind", "input", "labels", "deadline_seconds", "callback",
        /// "budget", "idempotency_key"}`; a missing key is made up). Sent
        /// 1,000 per request; prints one line per submission, in order.
        #[arg(long, conflicts_with_all = ["input", "idempotency_key", "wait", "labels", "deadline_seconds", "callback", "not_before", "start_after_seconds", "priority"])]
        batch: Option<std::path::PathBuf>,
        /// The input: JSON, or @file.json.
        #[arg(long)]
        input: Option<String>,
        /// Reuse the key of an earlier attempt of this same submission.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait until it ends (progress bar on a terminal).
        #[arg(long)]
        wait: bool,
        /// key=value, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        #[arg(long)]
        deadline_seconds: Option<u64>,
        /// A webhook URL for its state transitions.
        #[arg(long)]
        callback: Option<String>,
        /// Start no earlier than this RFC 3339 time (e.g. 2026-12-06T02:00:00Z).
        #[arg(long, conflicts_with = "start_after_seconds")]
        not_before: Option<String>,
        /// Start no earlier than this many seconds from now.
        #[arg(long)]
        start_after_seconds: Option<u64>,
        /// 1–9, higher claimed first within the tenant (default 5).
        #[arg(long)]
        priority: Option<u64>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show an operation.
    Get {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Wait until an operation ends, showing its progress.
    Wait {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Request cancellation.
    Cancel {
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List operations, newest first.
    List {
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        /// key:value
        #[arg(long)]
        label: Option<String>,
        #[arg(long, default_value_t = 20)]
        page_size: u32,
        /// Every page, not just the first.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Download an operation's result artifact (resumable, SHA-256 checked).
    Result {
        id: String,
        /// Where to write it; `-` for standard output. Default: <id>.<ext>.
        #[arg(long)]
        output_file: Option<String>,
        /// A named artifact (`result.artifacts.NAME`, e.g. an import's
        /// `errors`) instead of the default one.
        #[arg(long)]
        artifact: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause an operation: queued work is held back until resumed; running
    /// work of a kind declared --pausable is asked of its worker, which
    /// stops at a checkpoint (other kinds: not_pausable).
    Pause {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused operation: it goes back to the queue.
    Resume {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Re-run an operation: a new one of its kind and input, linked to it
    /// (`rerun_of`); prints the new id. Its input must still be kept (failed,
    /// cancelled and outcome_unknown operations keep theirs).
    Rerun {
        id: String,
        /// Start from the original's last checkpoint (where a failed export
        /// stopped, say); from the beginning if it saved none.
        #[arg(long)]
        from_checkpoint: bool,
        /// Reuse the key of an earlier attempt of this same re-run.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait until it ends (progress bar on a terminal).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Schedules: work submitted on a cadence (docs/schedules.md).
    Schedules {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// Upload a file as an input (resumable: a broken connection resumes
    /// where the server stopped); prints the upload id to name in a submission.
    Upload {
        file: std::path::PathBuf,
        /// The upload's media type (e.g. text/csv). Default: from the file's extension.
        #[arg(long)]
        content_type: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

impl ClientCommand {
    fn args(&self) -> &ClientArgs {
        match self {
            ClientCommand::Submit { client, .. }
            | ClientCommand::Get { client, .. }
            | ClientCommand::Wait { client, .. }
            | ClientCommand::Cancel { client, .. }
            | ClientCommand::List { client, .. }
            | ClientCommand::Result { client, .. }
            | ClientCommand::Rerun { client, .. }
            | ClientCommand::Pause { client, .. }
            | ClientCommand::Resume { client, .. }
            | ClientCommand::Upload { client, .. } => client,
            ClientCommand::Schedules { command } => command.args(),
        }
    }
}

/// What `submit` and `rerun` print: the new id (or the operation as it
/// ended, with `--wait`), and the exit code for it.
async fn answer_submitted(
    client: &Client,
    submitted: &longrun_client::Submitted,
    wait: bool,
    output: Output,
) -> Result<i32, Error> {
    if wait {
        let operation = wait_with_bar(client, &submitted.operation.id, output).await?;
        print_operation(&operation, output);
        return Ok(exit_for(&operation));
    }
    match output {
        Output::Json => print_operation(&submitted.operation, output),
        Output::Text => println!("{}", submitted.operation.id),
    }
    Ok(EXIT_OK)
}

/// Runs a client command; returns the exit code.
pub async fn run(command: ClientCommand) -> i32 {
    let args = command.args().clone();
    let Some(token) = args.server.token.clone() else {
        eprintln!("error: no API key: pass --token or set LONGRUN_TOKEN");
        return EXIT_USAGE;
    };
    let client = Client::new(args.server.server.clone(), token);
    match execute(&client, args.output, command).await {
        Ok(code) => code,
        Err(e) => report(&e, args.output),
    }
}

fn report(e: &Error, output: Output) -> i32 {
    match e {
        Error::Api { problem, .. } => {
            if output == Output::Json {
                println!(
                    "{}",
                    serde_json::json!({"code": problem.code, "status": problem.status, "detail": problem.detail,
                                       "request_id": problem.request_id, "operation_id": problem.operation_id})
                );
            } else {
                eprintln!(
                    "refused: {} ({}): {} [request {}]",
                    problem.code, problem.status, problem.detail, problem.request_id
                );
            }
            EXIT_REFUSED
        }
        Error::Transport(inner) => {
            eprintln!("error: could not reach the server: {inner}");
            EXIT_TRANSPORT
        }
        other => {
            eprintln!("error: {other}");
            EXIT_REFUSED
        }
    }
}

/// An input given as JSON or `@file`.
/// `--label key=value` flags as a map.
fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>, String> {
    labels
        .iter()
        .map(|label| match label.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
            None => Err(format!("--label takes key=value, not {label:?}")),
        })
        .collect()
}

fn read_input(input: &str) -> Result<Value, String> {
    let text = match input.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?,
        None => input.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| format!("the input is not JSON: {e}"))
}

fn exit_for(operation: &Operation) -> i32 {
    match &*operation.state {
        "succeeded" => EXIT_OK,
        "cancelled" => EXIT_CANCELLED,
        "failed" => EXIT_FAILED,
        _ => EXIT_OK,
    }
}

fn print_operation(operation: &Operation, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string(operation).unwrap_or_default()),
        Output::Text => {
            println!("id         {}", operation.id);
            println!("kind       {}", operation.kind);
            println!(
                "state      {}{}",
                operation.state,
                if operation.cancel_requested {
                    " (cancel requested)"
                } else {
                    ""
                }
            );
            println!("version    {}  attempt {}", operation.version, operation.attempt);
            println!("created    {}", operation.created_at);
            if let Some(p) = &operation.progress {
                println!("progress   {}", progress_text(p));
            }
            if let Some(result) = &operation.result {
                println!("result     {result}");
            }
            if let Some(error) = &operation.error {
                println!("error      {}: {}", error.code, error.message);
            }
        }
    }
}

fn progress_text(p: &longrun_client::Progress) -> String {
    let units = p.unit.clone().unwrap_or_default();
    let done = p.completed_units.map(|c| format!("{c}")).unwrap_or_else(|| "?".into());
    let total = p.total_units.map(|t| format!("/{t}")).unwrap_or_default();
    let phase = p.phase.clone().map(|ph| format!(" {ph}")).unwrap_or_default();
    format!("{done}{total} {units}{phase}")
}

/// Waits with a progress bar fed by the operation's progress.
async fn wait_with_bar(client: &Client, id: &str, output: Output) -> Result<Operation, Error> {
    let bar = if output == Output::Text {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:20} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let operation = client
        .wait(id, |op| {
            if let Some(p) = &op.progress {
                if let Some(total) = p.total_units {
                    bar.set_length(total as u64);
                }
                if let Some(done) = p.completed_units {
                    bar.set_position(done as u64);
                }
                bar.set_message(format!("{} {}", op.state, p.phase.clone().unwrap_or_default()));
            } else {
                bar.set_message(op.state.clone());
            }
        })
        .await;
    bar.finish_and_clear();
    operation
}

/// The most submissions one batch request carries.
const BATCH_SIZE: usize = 1000;

/// `longrun submit --batch FILE`: every line is checked before anything is
/// sent, then 1,000 per request. Exit 0 when every submission was accepted
/// (or replayed), 4 when the server refused any.
async fn submit_batch(client: &Client, output: Output, path: &std::path::Path) -> Result<i32, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return Ok(EXIT_USAGE);
        }
    };
    let mut submissions = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Submission>(line) {
            Ok(s) => submissions.push(s),
            Err(why) => {
                eprintln!("error: {}:{}: {why}", path.display(), n + 1);
                return Ok(EXIT_USAGE);
            }
        }
    }
    let mut refused = 0;
    for chunk in submissions.chunks(BATCH_SIZE) {
        for answer in client.submit_batch(chunk).await? {
            match (answer, output) {
                (Ok(s), Output::Text) => println!("{}", s.operation.id),
                (Ok(s), Output::Json) => println!(
                    "{}",
                    serde_json::json!({"operation": s.operation, "replayed": s.replayed, "idempotency_key": s.idempotency_key})
                ),
                (Err(e), _) => {
                    refused += 1;
                    match output {
                        Output::Text => println!("error: {e}"),
                        Output::Json => println!("{}", serde_json::json!({"error": e.to_string(), "code": e.code()})),
                    }
                }
            }
        }
    }
    if refused > 0 {
        eprintln!("{refused} of {} submissions were refused", submissions.len());
        return Ok(EXIT_REFUSED);
    }
    Ok(EXIT_OK)
}

async fn execute(client: &Client, output: Output, command: ClientCommand) -> Result<i32, Error> {
    match command {
        ClientCommand::Submit { batch: Some(path), .. } => submit_batch(client, output, &path).await,
        ClientCommand::Submit {
            kind,
            batch: None,
            input,
            idempotency_key,
            wait,
            labels,
            deadline_seconds,
            callback,
            not_before,
            start_after_seconds,
            priority,
            ..
        } => {
            let input = match input.as_deref().map(read_input).transpose() {
                Ok(input) => input,
                Err(message) => {
                    eprintln!("error: {message}");
                    return Ok(EXIT_USAGE);
                }
            };
            let parsed_labels = match parse_labels(&labels) {
                Ok(labels) => labels,
                Err(message) => {
                    eprintln!("error: {message}");
                    return Ok(EXIT_USAGE);
                }
            };
            let submission = Submission {
                kind: kind.unwrap_or_default(),
                input,
                callback: callback.map(|url| longrun_client::CallbackRequest { url }),
                deadline_seconds,
                budget: None,
                labels: (!parsed_labels.is_empty()).then_some(parsed_labels),
                idempotency_key,
                not_before,
                start_after_seconds,
                priority,
            };
            let submitted = client.submit(&submission).await?;
            if output == Output::Text {
                eprintln!(
                    "{} {} (idempotency key {}; reuse it with --idempotency-key to retry safely)",
                    if submitted.replayed {
                        "already submitted:"
                    } else {
                        "submitted"
                    },
                    submitted.operation.id,
                    submitted.idempotency_key
                );
            }
            answer_submitted(client, &submitted, wait, output).await
        }
        ClientCommand::Get { id, .. } => {
            print_operation(&client.get(&id).await?, output);
            Ok(EXIT_OK)
        }
        ClientCommand::Schedules { command } => schedules(client, output, command).await,
        ClientCommand::Pause { id, .. } => {
            print_operation(&client.pause(&id).await?, output);
            Ok(EXIT_OK)
        }
        ClientCommand::Resume { id, .. } => {
            print_operation(&client.resume(&id).await?, output);
            Ok(EXIT_OK)
        }
        ClientCommand::Rerun {
            id,
            from_checkpoint,
            idempotency_key,
            wait,
            ..
        } => {
            let rerun = longrun_client::Rerun {
                request: longrun_client::RerunRequest {
                    from_checkpoint,
                    ..Default::default()
                },
                idempotency_key,
            };
            let submitted = client.rerun(&id, &rerun).await?;
            if output == Output::Text {
                eprintln!(
                    "{} {} as {} (idempotency key {}; reuse it with --idempotency-key to retry safely)",
                    if submitted.replayed { "already re-ran" } else { "re-ran" },
                    id,
                    submitted.operation.id,
                    submitted.idempotency_key
                );
            }
            answer_submitted(client, &submitted, wait, output).await
        }
        ClientCommand::Wait { id, .. } => {
            let operation = wait_with_bar(client, &id, output).await?;
            print_operation(&operation, output);
            Ok(exit_for(&operation))
        }
        ClientCommand::Cancel { id, reason, .. } => {
            let operation = client.cancel(&id, reason.as_deref()).await?;
            print_operation(&operation, output);
            Ok(EXIT_OK)
        }
        ClientCommand::List {
            state,
            kind,
            label,
            page_size,
            all,
            ..
        } => {
            let mut pager = client.list(ListFilter {
                state,
                kind,
                label,
                page_size: Some(page_size),
            });
            let operations = if all {
                pager.collect_all().await?
            } else {
                pager.next_page().await?.unwrap_or_default()
            };
            match output {
                Output::Json => println!("{}", serde_json::to_string(&operations).unwrap_or_default()),
                Output::Text => {
                    println!("{:<30} {:<16} {:<10} {:<26} PROGRESS", "ID", "KIND", "STATE", "CREATED");
                    for op in &operations {
                        let progress = op.progress.as_ref().map(progress_text).unwrap_or_default();
                        println!(
                            "{:<30} {:<16} {:<10} {:<26} {progress}",
                            op.id, op.kind, op.state, op.created_at
                        );
                    }
                }
            }
            Ok(EXIT_OK)
        }
        ClientCommand::Upload { file, content_type, .. } => {
            let content_type = content_type.unwrap_or_else(|| {
                match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
                    "csv" => "text/csv",
                    "jsonl" | "ndjson" => "application/jsonl",
                    "json" => "application/json",
                    _ => "application/octet-stream",
                }
                .to_owned()
            });
            let bar = if output == Output::Text {
                ProgressBar::new(0)
            } else {
                ProgressBar::hidden()
            };
            bar.set_style(
                ProgressStyle::with_template("{bytes}/{total_bytes} [{bar:30}] {bytes_per_sec} ETA {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let on_bytes = {
                let bar = bar.clone();
                move |done: u64, total: u64| {
                    bar.set_length(total);
                    bar.set_position(done);
                }
            };
            let uploaded = client.upload_file(&file, &content_type, on_bytes).await?;
            bar.finish_and_clear();
            let upload = &uploaded.upload;
            if output == Output::Json {
                println!(
                    "{}",
                    serde_json::json!({"id": upload.id, "size_bytes": upload.size_bytes, "sha256": upload.sha256,
                                       "content_type": upload.content_type, "expires_at": upload.expires_at,
                                       "resumed": uploaded.resumed})
                );
            } else {
                println!("{}", upload.id);
                eprintln!(
                    "{} bytes, sha256 {} (verified by the server), kept until {} unless an operation names it",
                    upload.size_bytes,
                    upload.sha256.as_deref().unwrap_or("-"),
                    upload.expires_at
                );
            }
            Ok(EXIT_OK)
        }
        ClientCommand::Result {
            id,
            output_file,
            artifact,
            ..
        } => {
            let bar = if output == Output::Text && output_file.as_deref() != Some("-") {
                ProgressBar::new(0)
            } else {
                ProgressBar::hidden()
            };
            bar.set_style(
                ProgressStyle::with_template("{bytes}/{total_bytes} [{bar:30}] {bytes_per_sec} ETA {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let on_bytes = |done: u64, total: u64| {
                bar.set_length(total);
                bar.set_position(done);
            };
            let downloaded = match output_file.as_deref() {
                Some("-") => {
                    client
                        .download_artifact(&id, artifact.as_deref(), &mut tokio::io::stdout(), on_bytes)
                        .await?
                }
                other => {
                    let path = other.map(str::to_owned).unwrap_or_else(|| match &artifact {
                        Some(name) => format!("{id}.{name}.out"),
                        None => format!("{id}.out"),
                    });
                    let mut file = tokio::fs::File::create(&path).await?;
                    let downloaded = client
                        .download_artifact(&id, artifact.as_deref(), &mut file, on_bytes)
                        .await?;
                    if output == Output::Text {
                        eprintln!("wrote {path}");
                    }
                    downloaded
                }
            };
            bar.finish_and_clear();
            if output == Output::Json {
                println!(
                    "{}",
                    serde_json::json!({"bytes": downloaded.bytes, "sha256": downloaded.sha256, "resumed": downloaded.resumed})
                );
            } else if output_file.as_deref() != Some("-") {
                eprintln!("{} bytes, sha256 {} (verified)", downloaded.bytes, downloaded.sha256);
            }
            Ok(EXIT_OK)
        }
    }
}
