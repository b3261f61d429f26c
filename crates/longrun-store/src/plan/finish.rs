//! Workers' outcomes, the reaper of lapsed leases, and heartbeats: the job
//! path after a claim, written once for every backend.

use std::time::Duration;

use longrun_core::Timestamp;

use super::driver::{EndRow, Lock};
use super::{Driver, Effect, apply};
use crate::shared::{
    Decision, Fenced, HeartbeatEffect, SYSTEM, decide_finish, decide_reap, final_progress, heartbeat_effect,
};
use crate::{FinishParams, HeartbeatAck, HeartbeatParams, Id, Operation, ReapCounts, ReapParams, Result, StoreError};

/// The reason a budget gives the stop it asks for.
const BUDGET_EXHAUSTED: &str = "budget_exhausted";

/// Applies a batch of outcomes, each fenced by its own lease and answered
/// in order; a stale lease refuses only its own item, before anything is
/// written, and a second outcome for one operation in the batch finds the
/// lease already gone, as it would one batch later.
///
/// Where writers can run side by side (PostgreSQL), the fenced rows are
/// first read without row locks and each ending applied only while its
/// operation is still at the version read; an ending whose operation
/// changed in between, and every outcome that is not an ending (a retry, a
/// pause, a refusal), go through a second pass that reads again under row
/// locks. Locking every row first had cost each job two WAL records and
/// two more writes of its heap pages (`pg_walinspect` over an in-process
/// drain: 6.9 `Heap/LOCK` records per job). A serial driver (SQLite) reads
/// once and decides everything in the first pass.
pub(crate) async fn task_finish_many<D: Driver>(d: &mut D, batch: &[&FinishParams]) -> Result<Vec<Result<Operation>>> {
    let leases: Vec<(&str, &str)> = batch
        .iter()
        .map(|p| (p.operation_id.as_str(), p.lease_token.as_str()))
        .collect();
    let lock = if D::SERIAL { Lock::ForUpdate } else { Lock::None };
    let seen = fenced_once(d, &leases, lock).await?;
    let mut answers: Vec<Option<Result<Operation>>> = (0..batch.len()).map(|_| None).collect();
    let mut again: Vec<usize> = Vec::new();
    if D::SERIAL {
        decide_all(d, batch, &(0..batch.len()).collect::<Vec<_>>(), seen, &mut answers).await?;
        return Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect());
    }
    let mut ends: Vec<(usize, Effect)> = Vec::new();
    for (i, (p, fenced)) in batch.iter().zip(seen).enumerate() {
        let Some(fenced) = fenced else {
            // A lease, once gone, never comes back.
            answers[i] = Some(Err(StoreError::LeaseLost));
            continue;
        };
        match decide_finish(&fenced, &p.outcome) {
            Ok(Decision::End(ending)) => {
                // The worker's last progress rides the outcome's own change.
                let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
                ends.push((
                    i,
                    Effect::End(EndRow {
                        id: p.operation_id.as_str().to_owned(),
                        ending: ending.with_progress(progress),
                        now: p.now,
                        guard: Some(fenced.version),
                    }),
                ));
            }
            _ => again.push(i),
        }
    }
    // In id order, as the locked pass locks: two batches ending the same
    // operations cannot wait for each other.
    ends.sort_by(|(a, _), (b, _)| batch[*a].operation_id.as_str().cmp(batch[*b].operation_id.as_str()));
    let (which, effects): (Vec<usize>, Vec<Effect>) = ends.into_iter().unzip();
    // Endings carry their own `now`; apply's is for other effects.
    let now = batch.first().map_or(Timestamp(0), |p| p.now);
    for (i, ended) in which.into_iter().zip(apply(d, &effects, now).await?) {
        match ended {
            Some(op) => answers[i] = Some(Ok(op)),
            None => again.push(i),
        }
    }
    if !again.is_empty() {
        again.sort_unstable();
        let leases: Vec<(&str, &str)> = again.iter().map(|&i| leases[i]).collect();
        let current = d.fenced(&leases, Lock::ForUpdate).await?;
        decide_all(d, batch, &again, current, &mut answers).await?;
    }
    Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect())
}

/// The fenced rows of `leases`, in order, each lease fetched once: a second
/// outcome with one lease in a batch finds it used, as it would one batch
/// later (`None`, answered `lease_lost`).
async fn fenced_once<D: Driver>(d: &mut D, leases: &[(&str, &str)], lock: Lock) -> Result<Vec<Option<Fenced>>> {
    let mut seen = std::collections::HashSet::with_capacity(leases.len());
    let first: Vec<bool> = leases.iter().map(|lease| seen.insert(*lease)).collect();
    if first.iter().all(|f| *f) {
        return d.fenced(leases, lock).await;
    }
    let unique: Vec<(&str, &str)> = leases
        .iter()
        .zip(&first)
        .filter(|(_, f)| **f)
        .map(|(l, _)| *l)
        .collect();
    let mut found = d.fenced(&unique, lock).await?.into_iter();
    Ok(first
        .into_iter()
        .map(|f| if f { found.next().flatten() } else { None })
        .collect())
}

/// Decides and applies the outcomes `which` of `batch` on fenced rows that
/// stay as read (locked, or read by a serial driver).
async fn decide_all<D: Driver>(
    d: &mut D,
    batch: &[&FinishParams],
    which: &[usize],
    current: Vec<Option<Fenced>>,
    answers: &mut [Option<Result<Operation>>],
) -> Result<()> {
    let mut decided: Vec<(usize, Effect)> = Vec::with_capacity(which.len());
    for (&i, fenced) in which.iter().zip(current) {
        let p = batch[i];
        let Some(fenced) = fenced else {
            answers[i] = Some(Err(StoreError::LeaseLost));
            continue;
        };
        match decide_finish(&fenced, &p.outcome) {
            Ok(decision) => {
                // The worker's last progress rides the outcome's own change.
                let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
                decided.push((i, effect_of(p.operation_id.as_str(), decision, progress, p.now)));
            }
            Err(refused) => answers[i] = Some(Err(refused)),
        }
    }
    // Each outcome at its own `now`: the endings together (each row
    // carries its own), the rest one by one.
    let (ends, rest): (Vec<_>, Vec<_>) = decided.into_iter().partition(|(_, e)| matches!(e, Effect::End(_)));
    for (i, effect) in rest {
        let changed = apply(d, std::slice::from_ref(&effect), batch[i].now)
            .await?
            .pop()
            .flatten();
        answers[i] = Some(changed.ok_or(StoreError::NotFound));
    }
    let (which, effects): (Vec<usize>, Vec<Effect>) = ends.into_iter().unzip();
    let now = batch.first().map_or(Timestamp(0), |p| p.now);
    for (i, ended) in which.into_iter().zip(apply(d, &effects, now).await?) {
        answers[i] = Some(ended.ok_or(StoreError::LeaseLost));
    }
    Ok(())
}

/// The effect of a decision on the operation `id`, carrying `progress`.
fn effect_of(id: &str, decision: Decision, progress: Option<crate::Progress>, now: Timestamp) -> Effect {
    let id = id.to_owned();
    match decision {
        Decision::End(ending) => Effect::End(EndRow {
            id,
            ending: ending.with_progress(progress),
            now,
            guard: None,
        }),
        Decision::Retry { next_attempt, data } => Effect::Retry {
            id,
            next_attempt,
            progress,
            data,
        },
        Decision::Pause {
            attempt,
            checkpoint,
            data,
        } => Effect::Pause {
            id,
            attempt: Some(attempt),
            progress,
            checkpoint,
            data,
        },
    }
}

/// Handles leases that were not renewed in time (see `Store::task_reap`).
pub(crate) async fn task_reap<D: Driver>(d: &mut D, p: &ReapParams) -> Result<ReapCounts> {
    let lapsed = d.leases_lapsed(p.now, p.limit).await?;
    let mut counts = ReapCounts::default();
    let mut effects = Vec::with_capacity(lapsed.len());
    for (id, task) in &lapsed {
        let decision = decide_reap(task);
        counts.count(task, &decision);
        // A lapsed lease reported nothing: what the operation has stays.
        effects.push(effect_of(id, decision, None, p.now));
    }
    apply(d, &effects, p.now).await?;
    Ok(counts)
}

/// The fenced row of one lease, locked for the rest of the transaction;
/// `LeaseLost` unless `lease_token` holds the operation's task.
pub(crate) async fn fenced_lease<D: Driver>(d: &mut D, operation_id: &Id, lease_token: &str) -> Result<Fenced> {
    d.fenced(&[(operation_id.as_str(), lease_token)], Lock::ForUpdate)
        .await?
        .pop()
        .flatten()
        .ok_or(StoreError::LeaseLost)
}

/// Renews a lease and records progress, fenced by the lease token (see
/// `Store::task_heartbeat`).
pub(crate) async fn task_heartbeat<D: Driver>(d: &mut D, p: &HeartbeatParams) -> Result<HeartbeatAck> {
    let current = fenced_lease(d, &p.operation_id, &p.lease_token).await?;
    let id = p.operation_id.as_str().to_owned();
    let lease_expires_at = p
        .now
        .plus(Duration::from_millis(u64::try_from(current.lease_ms).unwrap_or(0)));
    let mut effects = vec![Effect::RenewLease {
        id: id.clone(),
        until: lease_expires_at,
    }];
    if let Some(checkpoint) = &p.checkpoint {
        // Kept with the operation, not a change of its representation.
        effects.push(Effect::SaveCheckpoint {
            id: id.clone(),
            checkpoint: checkpoint.clone(),
        });
    }
    let HeartbeatEffect {
        progress,
        cost_units,
        cancellable,
        event,
        over_budget,
    } = heartbeat_effect(&current, p);
    if let Some(data) = event {
        effects.push(Effect::ReportProgress {
            id: id.clone(),
            progress,
            cost_units,
            cancellable,
            data,
        });
    }
    let (mut cancel_requested, mut cancel_reason) = (current.cancel_requested, current.cancel_reason);
    if over_budget {
        // Over budget: the server asks the worker to stop; it ends `failed`
        // with `budget_exhausted` when it acknowledges (or is fenced out).
        effects.push(Effect::RequestCancel {
            id,
            by: SYSTEM.to_owned(),
            reason: Some(BUDGET_EXHAUSTED.to_owned()),
        });
        (cancel_requested, cancel_reason) = (true, Some(BUDGET_EXHAUSTED.to_owned()));
    }
    let changed = apply(d, &effects, p.now).await?;
    let version = changed
        .into_iter()
        .flatten()
        .last()
        .map_or(current.version, |op| op.version);
    Ok(HeartbeatAck {
        lease_expires_at,
        cancel_requested,
        cancel_reason,
        pause_requested: current.pause_requested && !cancel_requested,
        version,
    })
}
