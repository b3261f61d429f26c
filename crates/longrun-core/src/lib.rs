//! The pure domain of Longrun.
//!
//! Everything here is deterministic and free of IO: identifiers, the operation
//! state machine and its legal-transition table, the idempotency fingerprint
//! (RFC 8785 canonical JSON under a keyed HMAC), API key material, timing maths
//! such as `Retry-After`, and the validation rules for what clients submit.
//! Storage, HTTP and background services build on these types; none of them
//! may redefine a rule that lives here.
//!
//! # Layout
//!
//! - `state`: the six states and `State::can_become`, the one table every
//!   store's schema guard is tested against, pair by pair.
//! - `id`: prefixed ids, 48 bits of the creation millisecond then 96 random
//!   bits; `parse` accepts only what `generate` (or an older shape) made.
//! - `idempotency` and `fingerprint`: the key newtype, and the keyed hash of
//!   what a submission means (omitted optional fields equal their defaults).
//! - `apikey`: tokens `lr_<id>_<secret>`; only a secret's SHA-256 is kept,
//!   compared in constant time.
//! - `clock`: `now` as a parameter (`ManualClock` in tests, never a sleep).
//! - `retry_after` and `lease`: the server's poll pacing and the lease and
//!   retry maths, pure functions of plain values.
//! - `validate`: bounds and syntax of client input, each naming its field.
//! - `webhook` and `links`: Standard Webhooks signing and the destination
//!   policy; signed, expiring result links, never stored.
//! - `duration`: human durations for flags.
//! - `schedule`: when a schedule fires (5-field cron in a time zone, or
//!   `@every`), and the idempotency key that makes each firing one operation.
//! - `task`: what a worker reports (progress, the outcome) and what a
//!   heartbeat answers, the same in process and over HTTP.

pub mod apikey;
pub mod clock;
pub mod duration;
pub mod fingerprint;
pub mod id;
pub mod idempotency;
pub mod lease;
pub mod links;
pub mod retry_after;
pub mod schedule;
pub mod state;
pub mod task;
pub mod validate;
pub mod webhook;

pub use clock::{Clock, ManualClock, ScaledClock, SystemClock, Timestamp};
pub use id::{Id, IdKind};
pub use idempotency::IdempotencyKey;
pub use state::{State, Transition};
