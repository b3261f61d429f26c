//! A claim, once: the tenants with ready work, least recently served
//! first; each one's ready heads up to what its `max_running` allows; one
//! task of each tenant in turn until the claim has what it asked for; the
//! lease of what was taken, the end of what may no longer start, and the
//! order the tenants were served in.
//!
//! How the heads are found and leased is the driver's: PostgreSQL picks
//! the heads of every uncapped tenant with the tenants, in one statement,
//! and leases them all in one more (`postgres/claim.rs`); SQLite reads a
//! range of its ready index per kind and priority and leases task by task
//! (`sqlite/claim.rs`). Neither decides who is served, how many, or in
//! which order: that is here and in `shared/claims.rs`.

use std::collections::VecDeque;

use longrun_core::Timestamp;

use super::{Driver, Effect, EndRow, apply};
use crate::shared::{Ending, claim_allowance, deadline_error_before_start, records_served_order, round_robin};
use crate::{ClaimParams, Result, Task};

/// A tenant with ready work, as [`Driver::tenants_with_ready_work`] lists
/// it: least recently served first, with its ready heads when the driver
/// picked them already (a driver may for a tenant without a cap).
pub(crate) struct ReadyTenant<P> {
    pub tenant: String,
    pub max_running: Option<i64>,
    pub picked: Option<VecDeque<P>>,
}

/// What a lease did with the tasks handed to it: the tasks leased, in the
/// order they were handed over, and the operations that were not started
/// because their deadline had passed (with the version they were read at,
/// where the driver read it), which the claim ends.
pub(crate) struct Leased {
    pub tasks: Vec<Task>,
    pub expired: Vec<(String, Option<i64>)>,
}

/// Whether work due by `deadline_at` is too late to start at `now`: a
/// queued operation whose deadline passed is failed, never started. A
/// driver's [`Driver::lease`] asks this of each task it is handed, where it
/// first knows the deadline (with the pick on PostgreSQL, with the
/// operation's row on SQLite), and hands such work back instead.
pub(crate) fn too_late_to_start(deadline_at: Option<Timestamp>, now: Timestamp) -> bool {
    deadline_at.is_some_and(|deadline| deadline <= now)
}

/// Leases up to `p.max_tasks` ready tasks of `p.kinds`, fairly across
/// tenants: tenants are served round-robin, least recently served first,
/// one task at a time; a tenant at its `max_running` is skipped. Within a
/// tenant, highest priority first, then earliest available. A queued
/// operation whose deadline passed is failed, never started.
pub(crate) async fn task_claim<D: Driver>(d: &mut D, p: &ClaimParams) -> Result<Vec<Task>> {
    if p.kinds.is_empty() || p.max_tasks == 0 {
        return Ok(Vec::new());
    }
    let want = p.max_tasks as usize;
    let tenants = d.tenants_with_ready_work(p).await?;
    let record_order = records_served_order(tenants.len());
    let mut queues = Vec::with_capacity(tenants.len());
    for ReadyTenant {
        tenant,
        max_running,
        picked,
    } in tenants
    {
        let heads = match picked {
            Some(heads) => heads,
            None => {
                let running = match max_running {
                    Some(_) => d.tasks_running(&tenant).await?,
                    None => 0,
                };
                match claim_allowance(want, max_running, running) {
                    0 => continue,
                    allowance => d.ready_heads(p, &tenant, allowance).await?,
                }
            }
        };
        if !heads.is_empty() {
            queues.push(heads);
        }
    }
    let Leased { tasks, expired } = d.lease(p, round_robin(queues, want)).await?;
    let expired: Vec<Effect> = expired
        .into_iter()
        .map(|(id, guard)| {
            Effect::End(EndRow {
                id,
                ending: Ending::failed(deadline_error_before_start()),
                now: p.now,
                guard,
            })
        })
        .collect();
    apply(d, &expired, p.now).await?;
    if record_order && !tasks.is_empty() {
        let mut served: Vec<&str> = Vec::new();
        for task in &tasks {
            if !served.contains(&task.tenant.as_str()) {
                served.push(&task.tenant);
            }
        }
        d.tenants_served(&served).await?;
    }
    Ok(tasks)
}
