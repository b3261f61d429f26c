//! The maintenance every node runs, each on the loop of [`run`]: the
//! [`reaper`] (leases not renewed), the [`enforcer`] (deadlines, ignored
//! stops), [`retention`] (expiry and garbage, object first, then its row)
//! and the [`webhooks`] deliverer.

pub mod enforcer;
pub mod reaper;
pub mod retention;
pub mod run;
pub mod webhooks;
