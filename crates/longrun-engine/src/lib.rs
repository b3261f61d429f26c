//! Background services of Longrun and the worker SDK they share.
//!
//! # Layout
//!
//! - [`worker`]: the one handler trait and task context used by built-in
//!   in-process workers (and, through another [`worker::TaskLink`], by remote
//!   workers over HTTP). A handler's outcome is reported once, fenced by
//!   its lease.
//! - [`dispatcher`]: claims tasks of built-in kinds and runs their handlers,
//!   never more than its slots.
//! - [`remote`]: the same handlers over the worker protocol; [`exec`]: a
//!   command per task (`longrun worker --exec`).
//! - [`reports`]: the limits on what a worker reports (progress, cost,
//!   checkpoints, outcomes), kept by the HTTP endpoints and the worker SDK
//!   alike.
//! - [`reaper`]: handles leases that were not renewed in time.
//! - [`enforcer`]: deadlines, and stops the server asked for that were ignored.
//! - [`retention`]: expiry and garbage, object first, then its row
//!   ([`retention::collect_garbage`] is the one garbage loop, also run by
//!   `longrun tenants delete`).
//! - [`results`]: a task's result artifacts, whole or in resumable pieces,
//!   stored and recorded under its lease (in process and over HTTP alike).
//! - [`webhooks`]: the deliverer (signing, retries, private addresses refused).
//! - [`artifacts`]: where bytes live; an object appears whole or not at all.
//! - [`uploads`]: an upload's pieces (a cut body keeps what arrived), joined
//!   once; read for a task only if its operation names the upload.
//! - [`kinds`]: the built-in kinds (`sleep`, `export`, `import`) and their registry.
//! - [`signals`]: in-process wake-ups and cancel flags; [`service`]: the
//!   loop and the failure logging every service shares.
//!
//! Every service has the same shape: a `Config` with defaults, `run_once()`
//! that tests call directly, a loop that stops on a shutdown token, and an
//! injected clock.

pub mod artifacts;
pub mod dispatcher;
pub mod enforcer;
pub mod exec;
pub mod kinds;
pub mod reaper;
pub mod remote;
pub mod reports;
pub mod results;
pub mod retention;
pub mod service;
pub mod signals;
mod slots;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod uploads;
pub mod webhooks;
pub mod worker;

pub use kinds::Registry;
pub use signals::Signals;
pub use tokio_util::sync::CancellationToken;
