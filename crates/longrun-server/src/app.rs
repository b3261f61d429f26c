//! The application: what the API and the console mean, decided once for
//! both edges, with no HTTP type in it.
//!
//! - [`submissions`]: what a submission is — every check of docs/api.md §3,
//!   deadline caps, the callback policy, the idempotency fingerprint, the
//!   uploads its input names, what an acceptance answers — for the single,
//!   batch and re-run endpoints and the console alike.
//! - [`commands`]: what a change to an existing operation means — cancel,
//!   deadline and label updates, pause and resume.
//! - [`schedules`]: a schedule checked as a submission of it would be, its
//!   updates, triggers and backfills, and the firing service every node runs.
//! - [`auth`]: a presented key checked (the API's bearer keys and the
//!   console's sign-in alike).
//! - [`reads`]: list pages and their tokens, the idempotency record's
//!   life, a result's download links.
//! - [`callback`]: which callback URLs a submission may name.
//! - [`limits`]: every bound against hostile and careless clients.
//! - [`error`]: [`ApiError`], every refusal, one variant per problem code;
//!   the edges render it (`http/error.rs` as problem+json).
//! - `state`: [`AppState`], what every request shares, and [`Config`].

pub mod auth;
pub mod callback;
pub mod commands;
pub mod error;
pub mod limits;
pub mod reads;
pub mod schedules;
mod state;
pub mod submissions;

pub use callback::CallbackPolicy;
pub use error::ApiError;
pub use limits::Limits;
pub use state::{AppState, Config, Inner, KEY_CACHE_TTL, LINK_KEY_PREFIX, PAUSED_RETRY_AFTER};
