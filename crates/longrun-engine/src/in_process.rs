//! The worker side in the server's process: the [`dispatcher`] claims
//! tasks of built-in kinds and runs their handlers (`longrun-worker`'s
//! trait) with a link straight to the store; [`signals`] wakes it and
//! carries cancel and pause flags to running tasks.

pub mod dispatcher;
pub mod signals;
