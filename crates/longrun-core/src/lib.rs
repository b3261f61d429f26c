//! The pure domain of Longrun.
//!
//! Everything here is deterministic and free of IO: identifiers, the operation
//! state machine and its legal-transition table, the idempotency fingerprint
//! (RFC 8785 canonical JSON under a keyed HMAC), API key material, timing maths
//! such as `Retry-After`, and the validation rules for what clients submit.
//! Storage, HTTP and background services build on these types; none of them
//! may redefine a rule that lives here.

pub mod apikey;
pub mod clock;
pub mod duration;
pub mod fingerprint;
pub mod id;
pub mod idempotency;
pub mod lease;
pub mod links;
pub mod retry_after;
pub mod state;
pub mod validate;
pub mod webhook;

pub use clock::{Clock, ManualClock, ScaledClock, SystemClock, Timestamp};
pub use id::{Id, IdKind};
pub use idempotency::IdempotencyKey;
pub use state::{State, Transition};
