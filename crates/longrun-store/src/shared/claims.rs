//! The pure rules of a claim, decided once for every backend: how many
//! tasks a tenant may be given under its cap, which tasks a claim takes
//! (one of each tenant in turn), whether it records the order it served
//! tenants in, and what it does to the operations it starts.

use super::*;

/// Whether a claim records the tenants it served (`tenant_dispatch`, the
/// "least recently served first" order of the next claims): only when more
/// than one tenant had ready work, so the order decided something. A lone
/// tenant's claims write nothing there; concurrent claims would otherwise
/// queue on its one row until each other's commit (on PostgreSQL its upsert
/// averaged 1 ms under a drain, claims taking turns), and the order the
/// next competing claim reads is off by at most who goes first in it.
pub(crate) fn records_served_order(tenants_with_ready_work: usize) -> bool {
    tenants_with_ready_work > 1
}

/// How many more tasks a claim wanting `want` may lease for a tenant that
/// runs `running` of its `max_running` (no cap: all it wants).
pub(crate) fn claim_allowance(want: usize, max_running: Option<i64>, running: i64) -> usize {
    match max_running {
        None => want,
        Some(cap) => usize::try_from(cap - running).unwrap_or(0).min(want),
    }
}

/// Up to `want` of the tenants' picked tasks, fairly: one from each tenant
/// in turn (`queues` least recently served first), each tenant's in its
/// own order, until `want` are taken or none is left.
pub(crate) fn round_robin<T>(mut queues: Vec<std::collections::VecDeque<T>>, want: usize) -> Vec<T> {
    let mut picked = Vec::with_capacity(want);
    while picked.len() < want && !queues.is_empty() {
        queues.retain_mut(|queue| {
            if picked.len() < want
                && let Some(task) = queue.pop_front()
            {
                picked.push(task);
            }
            !queue.is_empty()
        });
    }
    picked
}

pub(crate) fn deadline_error_before_start() -> OperationError {
    OperationError {
        code: "deadline_exceeded".into(),
        message: "the deadline passed before the operation could start".into(),
        retryable: false,
    }
}

/// A queued (or retrying) operation as a claim leaves it at `now`: running,
/// one version on, in at least its first attempt, started at its first claim.
pub(crate) fn started(mut op: Operation, now: Timestamp) -> Operation {
    op.state = State::Running;
    op.attempt = op.attempt.max(1);
    op.started_at = op.started_at.or(Some(now));
    op.version += 1;
    op.updated_at = now;
    op
}

/// The data of the `started` event of `op` (as [`started`] left it),
/// started by `worker_id`.
pub(crate) fn started_data(op: &Operation, worker_id: &str) -> Value {
    json!({"attempt": op.attempt, "worker_id": worker_id})
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn a_claim_takes_one_task_of_each_tenant_in_turn_and_no_more_than_a_cap_allows() {
        let queues = vec![
            VecDeque::from(["a1", "a2", "a3"]),
            VecDeque::from(["b1"]),
            VecDeque::from(["c1", "c2"]),
        ];
        assert_eq!(round_robin(queues.clone(), 10), ["a1", "b1", "c1", "a2", "c2", "a3"]);
        assert_eq!(round_robin(queues, 4), ["a1", "b1", "c1", "a2"]);
        assert!(round_robin::<&str>(Vec::new(), 5).is_empty());

        assert_eq!(claim_allowance(64, None, 1_000), 64);
        assert_eq!(claim_allowance(64, Some(10), 3), 7);
        assert_eq!(claim_allowance(2, Some(10), 3), 2);
        assert_eq!(claim_allowance(64, Some(10), 10), 0);
        // Over the cap (lowered while work ran): nothing, not a wrap-around.
        assert_eq!(claim_allowance(64, Some(2), 5), 0);
    }
}
