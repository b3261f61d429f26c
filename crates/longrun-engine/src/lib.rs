//! Background services of Longrun: the in-process workers and the
//! maintenance every node runs.
//!
//! The handler trait, the task context and the remote worker live in
//! `longrun-worker`, which this crate builds on; what it adds is the store
//! behind them.
//!
//! # Layout
//!
//! - [`in_process`]: the worker side in this process — the dispatcher that
//!   claims built-in kinds and runs their handlers with a link to the
//!   store, and the signals that wake it and stop running tasks.
//! - [`services`]: the maintenance every node runs — the reaper, the
//!   deadline enforcer, retention (expiry and garbage, object first, then
//!   its row; `collect_garbage` is the one garbage loop, also run by
//!   `longrun tenants delete`), the webhook deliverer — each on one loop.
//! - [`bytes`]: where bytes live (`artifacts`: an object appears whole or
//!   not at all), clients' uploads (a cut body keeps what arrived, joined
//!   once; read for a task only if its operation names the upload), and a
//!   task's result artifacts, stored and recorded under its lease (in
//!   process and over HTTP alike).
//! - [`kinds`]: the built-in kinds (`sleep`, `export`, `import`).
//!
//! Every service has the same shape: a `Config` with defaults, `run_once()`
//! that tests call directly, a loop that stops on a shutdown token, and an
//! injected clock.

pub mod bytes;
pub mod in_process;
pub mod kinds;
pub mod services;
#[cfg(feature = "test-support")]
pub mod testing;

pub use in_process::signals::Signals;
pub use longrun_worker::Registry;
pub use tokio_util::sync::CancellationToken;
