//! `longrun supervise` (hidden): the process between a `longrun worker
//! --exec` and each command it runs, so that the command and everything it
//! started end when the worker itself dies — `kill -9`, the OOM killer, a
//! crash — instead of running on unfenced while the lease expires and
//! another worker runs the same operation.
//!
//! The worker starts the supervisor as the leader of a new process group;
//! the supervisor starts the command in that same group. So the worker's
//! own signals still reach the whole group (SIGTERM on cancel and pause,
//! SIGKILL after the grace period), and the supervisor, which catches
//! SIGTERM and lets the command answer it, is killed by SIGKILL with the
//! rest. The supervisor watches its parent: when the worker is gone (the
//! supervisor was re-parented), it sends SIGTERM to the group, waits up to
//! the grace period for the command to end, then sends SIGKILL to the
//! group, itself included. Grandchildren are covered as long as they stay
//! in the group; a program that moves its children to a session or group of
//! their own (`setsid`) takes them out of reach (docs/workers.md).
//!
//! Its exit code is the command's (128 + the signal for a command killed by
//! one), and its standard streams are the command's: the worker's pipes.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

/// How often the supervisor looks for its parent.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Runs `command` (program and arguments) under supervision; returns its
/// exit code.
pub async fn supervise(grace: Duration, command: Vec<OsString>) -> anyhow::Result<u8> {
    let parent = std::os::unix::process::parent_id();
    // Caught, so that the worker's SIGTERM to the group reaches the command
    // and leaves the supervisor watching.
    let mut terms = signal(SignalKind::terminate())?;
    let (program, args) = command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no command to run"))?;
    let mut child = tokio::process::Command::new(program).args(args).spawn()?;
    let mut watch = tokio::time::interval(WATCH_EVERY);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(exit_code(status?)),
            _ = terms.recv() => {}
            _ = watch.tick() => {
                if std::os::unix::process::parent_id() != parent {
                    break;
                }
            }
        }
    }
    // The worker is gone: end the group, the command first, gracefully.
    signal_own_group(libc::SIGTERM);
    let _ = tokio::time::timeout(grace, child.wait()).await;
    signal_own_group(libc::SIGKILL);
    unreachable!("SIGKILL to its own group ends the supervisor too")
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

#[allow(unsafe_code)]
fn signal_own_group(signal: libc::c_int) {
    // SAFETY: kill(2) with pid 0 signals every process of the caller's
    // process group; it takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(0, signal);
    }
}
