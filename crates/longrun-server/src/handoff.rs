//! Hand-offs: a submission accepted while a worker waits in a claim for its
//! kind is leased to that worker in the same commit
//! (`Store::operation_accept_leased`), and the claim answers with it.
//!
//! Idle, a task otherwise costs two commits and a claim's round trips after
//! its submission's (PostgreSQL: the submission's statement, then BEGIN,
//! pick, lease, events, COMMIT); handed off, one statement. The claimer
//! only waits here after a look found nothing to claim, so handing it the
//! newest submission takes nothing from older work.
//!
//! A claimer taken by a submitter is answered by it: with the task, or by
//! its sender being dropped when the submission had to queue (then the
//! claim looks again). A claim whose request goes away after it was taken
//! leaves its task leased to nobody until the lease runs out, as a claim
//! answer lost on its way back does.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use longrun_store::{LeaseTo, Task};
use tokio::sync::oneshot;

/// The claims waiting on this node, oldest first.
#[derive(Default)]
pub(crate) struct HandOffs {
    waiting: Mutex<Vec<Waiting>>,
    next: AtomicU64,
}

struct Waiting {
    id: u64,
    kinds: Vec<String>,
    to: LeaseTo,
    answer: oneshot::Sender<Task>,
}

/// A claim registered as waiting; dropping it withdraws the claim.
struct Registered<'a> {
    handoffs: &'a HandOffs,
    id: u64,
    /// What a submitter that took this claim sends (or drops).
    handed: oneshot::Receiver<Task>,
}

/// A waiting claim a submitter took: hand it a task with [`Taken::hand`],
/// or drop it to let the claim look again.
pub(crate) struct Taken {
    pub(crate) to: LeaseTo,
    answer: oneshot::Sender<Task>,
}

impl HandOffs {
    /// Waits as a claim for `kinds` (leasing as `worker_id` for `lease`)
    /// until `woken` or until a submitter hands it a task: the task, or
    /// `None` when woken (then the claim looks again).
    pub(crate) async fn wait(
        &self,
        kinds: &[String],
        worker_id: &str,
        lease: Duration,
        woken: impl Future<Output = ()>,
    ) -> Option<Task> {
        let mut waiting = self.register(kinds, worker_id, lease);
        tokio::select! {
            () = woken => {}
            handed = &mut waiting.handed => return handed.ok(),
        }
        // Taken by a submitter just as it woke: its answer is close.
        if waiting.withdraw() {
            return (&mut waiting.handed).await.ok();
        }
        None
    }

    /// Registers a claim for `kinds`, leasing as `worker_id` for `lease`.
    fn register(&self, kinds: &[String], worker_id: &str, lease: Duration) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (answer, handed) = oneshot::channel();
        let mut waiting = self.lock();
        waiting.push(Waiting {
            id,
            kinds: kinds.to_vec(),
            to: LeaseTo {
                worker_id: worker_id.to_owned(),
                lease,
            },
            answer,
        });
        counted(&waiting);
        drop(waiting);
        Registered {
            handoffs: self,
            id,
            handed,
        }
    }

    /// The oldest claim still waiting for `kind`, taken off the list.
    pub(crate) fn take(&self, kind: &str) -> Option<Taken> {
        let mut waiting = self.lock();
        // A claim whose request went away is withdrawn by its drop; one
        // closed meanwhile is skipped.
        waiting.retain(|w| !w.answer.is_closed());
        let at = waiting.iter().position(|w| w.kinds.iter().any(|k| k == kind))?;
        let w = waiting.remove(at);
        counted(&waiting);
        Some(Taken {
            to: w.to,
            answer: w.answer,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `longrun_claims_waiting`: the claims this node could hand work to now.
fn counted(waiting: &[Waiting]) {
    metrics::gauge!("longrun_claims_waiting").set(waiting.len() as f64);
}

impl Registered<'_> {
    /// Withdraws the claim; `true` when a submitter had taken it first (its
    /// answer is then on its way through `handed`).
    fn withdraw(&self) -> bool {
        let mut waiting = self.handoffs.lock();
        match waiting.iter().position(|w| w.id == self.id) {
            Some(at) => {
                waiting.remove(at);
                counted(&waiting);
                false
            }
            None => true,
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

impl Taken {
    /// Answers the claim with `task`; `false` when its request went away.
    pub(crate) fn hand(self, task: Task) -> bool {
        self.answer.send(task).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longrun_core::{Id, IdKind, Timestamp};

    fn task() -> Task {
        Task {
            operation_id: Id::generate(IdKind::Operation),
            tenant: "t".into(),
            kind: "a".into(),
            input: serde_json::Value::Null,
            attempt: 1,
            lease_token: "x".into(),
            lease_expires_at: Timestamp(0),
            deadline_at: None,
            budget_max_cost: None,
            checkpoint: None,
        }
    }

    #[tokio::test]
    async fn the_oldest_claim_for_the_kind_is_taken_and_answered() {
        let handoffs = HandOffs::default();
        let first = handoffs.register(&["a".into(), "b".into()], "w1", Duration::from_secs(30));
        let second = handoffs.register(&["a".into()], "w2", Duration::from_secs(30));
        assert!(handoffs.take("c").is_none());
        let taken = handoffs.take("a").expect("a claim for a");
        assert_eq!(taken.to.worker_id, "w1");
        assert!(taken.hand(task()));
        let mut first = first;
        assert!(first.withdraw(), "the first claim was taken");
        assert_eq!((&mut first.handed).await.unwrap().kind, "a");
        assert!(!second.withdraw(), "the second was still waiting");
        assert!(handoffs.take("a").is_none(), "a withdrawn claim is not taken");
    }

    #[tokio::test]
    async fn a_withdrawn_claim_is_not_taken_and_a_dropped_taker_lets_the_claim_look_again() {
        let handoffs = HandOffs::default();
        drop(handoffs.register(&["a".into()], "gone", Duration::from_secs(30)));
        let mut waiting = handoffs.register(&["a".into()], "here", Duration::from_secs(30));
        let taken = handoffs.take("a").expect("the claim still waiting");
        assert_eq!(taken.to.worker_id, "here");
        drop(taken);
        assert!(waiting.withdraw());
        assert!((&mut waiting.handed).await.is_err(), "the claim learns it got nothing");
    }

    #[tokio::test]
    async fn a_woken_claim_is_withdrawn_and_one_taken_as_it_woke_gets_the_takers_answer() {
        let handoffs = HandOffs::default();
        let lease = Duration::from_secs(30);
        assert!(handoffs.wait(&["a".into()], "w", lease, async {}).await.is_none());
        assert!(handoffs.take("a").is_none(), "a woken claim is withdrawn");

        // The submitter takes the claim just as it is woken, and answers
        // after the claim has woken: the claim waits for that answer.
        let (taken_tx, taken_rx) = oneshot::channel();
        let woken = async {
            taken_tx.send(handoffs.take("a").expect("the claim waits")).ok();
        };
        let submitter = async {
            let taken: Taken = taken_rx.await.unwrap();
            assert!(taken.hand(task()));
        };
        let kinds = ["a".to_owned()];
        let (handed, ()) = tokio::join!(handoffs.wait(&kinds, "w", lease, woken), submitter);
        assert_eq!(handed.expect("handed").kind, "a");
        assert!(handoffs.take("a").is_none());
    }
}
