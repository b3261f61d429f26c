//! HTTP API tests: a real server on a loopback port, a real SQLite file per
//! test, real HTTP through reqwest.

mod auth;
mod batches;
mod cancel;
mod console;
mod docs;
mod errors;
mod fuzz;
mod helpers;
mod hostile;
mod idempotency;
mod imports;
mod longpoll;
mod observe;
mod operating;
mod outage;
mod pausing;
mod reruns;
mod results;
mod s3;
mod schedules;
mod scheduling;
mod schema;
mod submit;
mod webhooks;
mod workers;
