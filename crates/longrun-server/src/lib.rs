//! The HTTP edge of Longrun and the process that serves it.
//!
//! [`app()`] builds the axum router from an [`AppState`] (tests may call it
//! without a socket); [`start`] opens the store, bootstraps keys on first
//! start, declares the built-in kinds, binds the listener and runs the
//! background services until shutdown.
//!
//! # Layout
//!
//! Three layers, each importing only from the ones below it:
//!
//! - The process: `server` (store, bootstrap keys, services, graceful
//!   shutdown; its `start` and `ServeOptions` are re-exported), `router`
//!   (the two edges under one middleware stack) and `listen` (the
//!   listener; every bound against hostile clients is applied there).
//! - Two edges that render the application: `http` (the routes, one module
//!   per resource, the bodies of `longrun-api`, problem+json) and `console`
//!   (the web console at `/ui/`, server-rendered pages).
//! - The application, `app` (public, as the CLI and tests name its
//!   [`Config`], [`Limits`] and [`ApiError`]): what a submission is, what a
//!   change to an operation means, schedules, the callback policy, the
//!   limits, the refusals, and [`AppState`]. It holds no HTTP type.
//!
//! Below them: `cache`, `ratelimit`, `changes`, `handoff`, `keys`,
//! `metrics`, `stats`, `source` — TTL caches, token buckets and in-flight
//! counts, the hub that wakes long-polls and streams on committed changes
//! (nothing is published before it is durable), the claims a submission
//! may be handed to, the set of existing key ids, the `/metrics` scrape,
//! the console's per-minute counts, where a request comes from.

pub mod app;
mod cache;
mod changes;
mod console;
mod handoff;
mod http;
mod keys;
mod listen;
mod metrics;
mod ratelimit;
mod router;
mod server;
pub mod source;
mod stats;

pub use app::{ApiError, AppState, CallbackPolicy, Config, Limits};
pub use router::app;
pub use server::{BootstrapKeys, HARD_STOP_AFTER, RunningServer, ServeOptions, add_link_key, shutdown_signal, start};
