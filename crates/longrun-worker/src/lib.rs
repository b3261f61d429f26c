//! Write Longrun workers.
//!
//! A worker runs a [`Handler`] per kind: it gets a [`TaskContext`] (input,
//! progress, cost, checkpoints, the commit point, cancellation and pause,
//! result artifacts) and returns a result or a [`TaskError`]. The same
//! handler runs in the server's process (the engine's link is the store)
//! or in a process of its own over the HTTP worker protocol
//! ([`RemoteWorker`], whose link is [`remote::HttpLink`]).
//!
//! ```no_run
//! use longrun_worker::{Registry, RemoteConfig, RemoteWorker, CancellationToken};
//! # async fn run(registry: Registry) {
//! let config = RemoteConfig::new("http://127.0.0.1:8080", "lr_…");
//! RemoteWorker::new(config, registry).run(CancellationToken::new()).await;
//! # }
//! ```
//!
//! # Layout
//!
//! - [`task`]: the handler trait, the task context, the [`TaskLink`] a
//!   context talks through, and how a run becomes one fenced report.
//! - [`remote`]: the link over HTTP and the remote worker's loop.
//! - [`slots`]: how many tasks a worker claims, holds and runs at once.
//! - [`reports`]: the limits on what a worker reports, kept by the server's
//!   endpoints and by every worker before anything is sent.
//! - [`exec`]: a command per task (`longrun worker --exec`).
//! - [`error`]: [`WorkerError`], what a link answers instead.
//!
//! It depends on the wire types (`longrun-api`) and the pure domain
//! (`longrun-core`) only: a worker build links no database driver, no
//! object storage and none of the server's services.

pub mod error;
pub mod exec;
pub mod registry;
pub mod remote;
pub mod reports;
pub mod slots;
pub mod task;

pub use async_trait::async_trait;
pub use error::WorkerError;
pub use longrun_core::task::{
    DEFAULT_ARTIFACT, HeartbeatAck, MAX_CHECKPOINT_BYTES, OperationError, Outcome, ProgressUpdate,
};
pub use longrun_core::validate::Invalid;
pub use longrun_core::{Id, IdKind};
pub use registry::Registry;
pub use remote::{RemoteConfig, RemoteWorker};
pub use task::{ByteReader, Handler, KindInfo, StopFlags, TaskContext, TaskError, TaskLink, UploadedArtifact};
pub use tokio_util::sync::CancellationToken;
