//! Background services of Longrun and the worker SDK they share.
//!
//! - [`worker`]: the one handler trait and task context used by built-in
//!   in-process workers (and, through another [`worker::TaskLink`], by remote
//!   workers over HTTP).
//! - [`dispatcher`]: claims tasks of built-in kinds and runs their handlers.
//! - [`reaper`]: handles leases that were not renewed in time.
//! - [`enforcer`]: deadlines, and stops the server asked for that were ignored.
//! - [`kinds`]: the built-in kinds and their registry.
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
pub mod retention;
pub mod service;
pub mod signals;
pub mod uploads;
pub mod webhooks;
pub mod worker;

pub use kinds::Registry;
pub use signals::Signals;
pub use tokio_util::sync::CancellationToken;
