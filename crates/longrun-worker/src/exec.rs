//! `longrun worker --exec CMD`: any program becomes an operation kind.
//!
//! Per task, `sh -c CMD` runs in its own process group with the input JSON on
//! stdin and `LONGRUN_OPERATION_ID` / `LONGRUN_ATTEMPT` in its environment;
//! under a supervisor (`longrun supervise`, the group's leader) when one is
//! given, so that the group ends when the worker dies.
//! Each stdout line that is a JSON object with `progress` reports progress;
//! one with `result` gives the result. Exit 0 succeeds; any other exit fails
//! with `worker_error` and the end of stderr. On cancellation the group gets
//! SIGTERM, then SIGKILL after the grace period.
//!
//! Checkpoints: the checkpoint to resume from (an earlier attempt's, one
//! saved before a pause, or a `from_checkpoint` re-run's) is in the file
//! `$LONGRUN_CHECKPOINT_FILE` (absent for a fresh start) and, as JSON text,
//! in `$LONGRUN_CHECKPOINT`. A stdout line `{"checkpoint": …}` saves a new
//! one at once; the command may also write the file, which is read when it
//! exits. When a pause is requested (a kind declared `--pausable`) the group
//! gets SIGTERM as for a cancel: the command saves where it is and exits, and
//! the task reports `paused` with the last checkpoint.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use longrun_core::task::ProgressUpdate;
use longrun_core::validate::Invalid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::task::{Handler, KindInfo, TaskContext, TaskError};

/// How much of stderr a failure message keeps (the end of it).
const STDERR_TAIL: usize = 2048;

/// A kind run by a shell command (`longrun worker --exec`).
pub struct ExecHandler {
    /// The kind it runs.
    pub kind: String,
    /// The command, run by `sh -c` with the input on stdin.
    pub command: String,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// A `longrun` binary to run each command under (`longrun supervise`),
    /// so that the command's process group ends when this worker dies;
    /// `None` runs `sh` directly, and a dead worker's command runs on.
    pub supervisor: Option<std::path::PathBuf>,
}

fn progress_from(v: &Value) -> ProgressUpdate {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    ProgressUpdate {
        completed_units: v.get("completed_units").and_then(Value::as_f64),
        total_units: v.get("total_units").and_then(Value::as_f64),
        unit: text("unit"),
        phase: text("phase"),
        details: v.get("details").filter(|d| !d.is_null()).cloned(),
    }
}

/// The uploads the task's input names, each copied (streamed) into a file
/// named by its id in a directory the command gets as `LONGRUN_UPLOADS_DIR`;
/// the directory goes when the task ends.
async fn fetch_uploads(ctx: &TaskContext) -> Result<Option<UploadsDir>, TaskError> {
    let named = longrun_core::validate::named_uploads(ctx.input());
    if named.is_empty() {
        // Most tasks name none: no directory to make and remove.
        return Ok(None);
    }
    let dir =
        UploadsDir(std::env::temp_dir().join(format!("longrun-uploads-{}", longrun_core::id::random_base32::<16>())));
    tokio::fs::create_dir(&dir.0)
        .await
        .map_err(|e| TaskError::Retryable(format!("could not make a directory for the uploads: {e}")))?;
    for id in named {
        let mut reader = ctx.open_upload(&id).await?;
        let mut file = tokio::fs::File::create(dir.0.join(id.as_str()))
            .await
            .map_err(|e| TaskError::Retryable(format!("could not write upload {id}: {e}")))?;
        tokio::io::copy(&mut reader, &mut file)
            .await
            .map_err(|e| TaskError::Retryable(format!("could not copy upload {id}: {e}")))?;
        file.sync_all()
            .await
            .map_err(|e| TaskError::Retryable(format!("could not write upload {id}: {e}")))?;
    }
    Ok(Some(dir))
}

/// The file a command reads its checkpoint from and may write new ones to;
/// removed when dropped.
struct CheckpointFile {
    path: std::path::PathBuf,
}

impl CheckpointFile {
    async fn new(checkpoint: Option<Value>) -> Result<Self, TaskError> {
        let path = std::env::temp_dir().join(format!(
            "longrun-checkpoint-{}.json",
            longrun_core::id::random_base32::<16>()
        ));
        if let Some(checkpoint) = checkpoint {
            tokio::fs::write(&path, checkpoint.to_string())
                .await
                .map_err(|e| TaskError::Retryable(format!("could not write the checkpoint file: {e}")))?;
        }
        Ok(Self { path })
    }

    /// The checkpoint in the file, if it is JSON and not `current`.
    async fn read_new(&self, current: Option<&Value>) -> Option<Value> {
        let text = tokio::fs::read(&self.path).await.ok()?;
        let checkpoint: Value = serde_json::from_slice(&text).ok()?;
        (Some(&checkpoint) != current).then_some(checkpoint)
    }
}

impl Drop for CheckpointFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A directory removed, with what is in it, when dropped.
struct UploadsDir(std::path::PathBuf);

impl UploadsDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for UploadsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ends the command's whole process group if the task ends while it still
/// runs — an error, a lost lease, a worker giving its tasks back at
/// shutdown drops the task — where `kill_on_drop` would end only the
/// group's leader (the supervisor, or `sh`) and leave the command and its
/// children running. Disarmed once the leader has been waited for.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.0.is_some() {
            signal_group(self.0.take(), libc::SIGKILL);
        }
    }
}

#[allow(unsafe_code)]
fn signal_group(pid: Option<u32>, signal: libc::c_int) {
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) with a negative pid signals the process group we
        // created for this child; it touches no memory of ours.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

#[async_trait]
impl Handler for ExecHandler {
    fn info(&self) -> KindInfo {
        // Declared by `longrun kinds set`; the worker does not decide retries.
        KindInfo {
            name: self.kind.clone(),
            rerun_safe: false,
            max_attempts: 1,
            pausable: false,
        }
    }

    fn validate(&self, _input: &Value) -> Result<(), Invalid> {
        Ok(())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let uploads = fetch_uploads(&ctx).await?;
        let checkpoints = CheckpointFile::new(ctx.checkpoint()).await?;
        let mut command = match &self.supervisor {
            Some(supervisor) => {
                let mut command = Command::new(supervisor);
                command
                    .arg("supervise")
                    .arg("--grace")
                    .arg(format!("{}ms", self.grace.as_millis()))
                    .arg("--")
                    .arg("sh");
                command
            }
            None => Command::new("sh"),
        };
        if let Some(dir) = &uploads {
            command.env("LONGRUN_UPLOADS_DIR", dir.path());
        }
        command.env("LONGRUN_CHECKPOINT_FILE", &checkpoints.path);
        if let Some(checkpoint) = ctx.checkpoint() {
            command.env("LONGRUN_CHECKPOINT", checkpoint.to_string());
        }
        let mut child = command
            .arg("-c")
            .arg(&self.command)
            .env("LONGRUN_OPERATION_ID", ctx.operation_id().as_str())
            .env("LONGRUN_ATTEMPT", ctx.attempt().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| TaskError::fatal("worker_error", format!("could not start the command: {e}")))?;
        let pid = child.id();
        let mut group = GroupGuard(pid);

        let mut stdin = child.stdin.take().expect("piped stdin");
        let input = serde_json::to_vec(ctx.input()).unwrap_or_default();
        tokio::spawn(async move {
            // A program that does not read its input is fine.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stderr_tail = tokio::spawn(async move {
            let mut all = Vec::new();
            let _ = stderr.read_to_end(&mut all).await;
            let start = all.len().saturating_sub(STDERR_TAIL);
            String::from_utf8_lossy(&all[start..]).into_owned()
        });

        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut result = None;
        let (mut cancelled, mut pausing) = (false, false);
        let stop = |pid, grace: Duration| {
            signal_group(pid, libc::SIGTERM);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                signal_group(pid, libc::SIGKILL);
            });
        };
        loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        let Ok(Value::Object(message)) = serde_json::from_str::<Value>(&line) else { continue };
                        if let Some(progress) = message.get("progress") {
                            ctx.progress(progress_from(progress)).await?;
                        }
                        if let Some(value) = message.get("result") {
                            result = Some(value.clone());
                        }
                        if let Some(checkpoint) = message.get("checkpoint") {
                            ctx.save_checkpoint(checkpoint.clone()).await?;
                        }
                    }
                    _ => break,
                },
                () = ctx.cancelled(), if !cancelled => {
                    cancelled = true;
                    if !pausing {
                        stop(pid, self.grace);
                    }
                }
                () = ctx.pause_requested(), if !pausing => {
                    pausing = true;
                    if !cancelled {
                        stop(pid, self.grace);
                    }
                }
            }
        }
        let status = child
            .wait()
            .await
            .map_err(|e| TaskError::fatal("worker_error", format!("could not wait for the command: {e}")))?;
        group.0 = None;
        if cancelled || ctx.is_cancelled() && !status.success() {
            return Err(TaskError::Cancelled);
        }
        if pausing {
            // Whatever the command left in the file is where it stopped.
            if let Some(checkpoint) = checkpoints.read_new(ctx.checkpoint().as_ref()).await {
                ctx.save_checkpoint(checkpoint).await?;
            }
            return Err(TaskError::Paused);
        }
        if status.success() {
            return Ok(result);
        }
        let tail = stderr_tail.await.unwrap_or_default();
        Err(TaskError::fatal(
            "worker_error",
            format!("the command exited with {status}: {}", tail.trim()),
        ))
    }
}
