//! Where a task's bytes live: the object storage ([`artifacts`]), clients'
//! resumable uploads ([`uploads`]) and a task's result artifacts
//! ([`results`]), each stored before the row that names it.

pub mod artifacts;
mod error;
pub mod results;
pub mod uploads;

pub use error::BytesError;
