//! Longrun's wire types: the JSON bodies of the public protocol (docs/api.md
//! §3, §9) and of the worker protocol (§4), each with its serde and OpenAPI
//! derives. The server renders and reads them, the SDK and remote workers
//! write and read them: one definition, so the three cannot drift, and what
//! the OpenAPI document states is what the server checks.
//!
//! Requests read strictly (unknown fields are refused, a nested object must
//! be an object) and write compactly (an absent optional field is left
//! out). Responses are built by the server from its records; mapping a
//! record to a body is the server's, because only it knows the records.
//!
//! # Layout
//!
//! - `de`: the readers the request bodies share — a whole number also
//!   spelled `326.0`, a nested field that must be an object (never an
//!   array in field order), "present but null" told from "absent".
//! - `operations`: submissions (single and batch), re-runs, `PATCH`,
//!   cancellation, and the operation, its history and its delivery log.
//! - `worker`: claims, heartbeats, outcomes (single and batch) and the
//!   artifact bodies of the worker protocol, each outcome fenced by its
//!   lease token.
//! - `results`: the result resource with its download links, and uploads.
//! - `schedules`: the schedule resource, its patch and firing records.
//! - `problem`: the problem+json body and every stable problem code.
//! - `webhook`: the body of a webhook, as the store queues it and a
//!   receiver reads it.

pub mod de;
mod operations;
mod problem;
mod results;
mod schedules;
mod webhook;
mod worker;

pub use operations::*;
pub use problem::{Problem, ProblemCode};
pub use results::*;
pub use schedules::*;
pub use webhook::{WebhookData, WebhookEvent};
pub use worker::*;

/// How long a client keeps an idle pooled connection to Longrun: less than
/// the 10 s after which the server closes an idle keep-alive connection
/// (`--header-read-timeout`). A client that kept it longer could send a
/// request on a connection the server is closing at that moment, and see
/// the request cut (`IncompleteMessage`) instead of answered.
pub const CLIENT_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(5);
