//! The deadline enforcer's pass, written once for every backend (the
//! worked example of `docs/ARCHITECTURE.md`): four phases, each a fetch, a
//! pure plan and an apply. Phases run in order, so a stop asked for in the
//! second is seen by the third when the grace period is zero.

use longrun_core::{State, Timestamp};

use super::driver::EndRow;
use super::fetches::{OverdueWaiting, PauseRequested, StopRequested};
use super::{Driver, Effect, EventType, apply};
use crate::shared::{Ending, SYSTEM, deadline_error_before_start, failing_cancel, pause_not_honoured_data};
use crate::{EnforceCounts, EnforceParams, OperationError, Result};

/// The reason a deadline gives the stop it asks for.
const DEADLINE_EXCEEDED: &str = "deadline_exceeded";

/// One pass of the enforcer (see `Store::deadline_enforce`).
pub(crate) async fn deadline_enforce<D: Driver>(d: &mut D, p: &EnforceParams) -> Result<EnforceCounts> {
    let mut counts = EnforceCounts::default();

    let waiting = d.overdue_waiting(p.now, p.limit).await?;
    let effects = plan_overdue_waiting(&waiting, p.now);
    apply(d, &effects, p.now).await?;
    counts.expired_before_start = effects.len() as u64;

    let running = d.overdue_running(p.now, p.limit).await?;
    let effects = plan_overdue_running(&running);
    apply(d, &effects, p.now).await?;
    counts.cancel_requested = effects.len() as u64;

    let cutoff = p.now.minus(p.grace);
    let ignored = d.stops_unacknowledged(cutoff, p.limit).await?;
    let effects = plan_stops_unacknowledged(&ignored, p.now);
    apply(d, &effects, p.now).await?;
    counts.ended_without_ack = effects.len() as u64;

    let unanswered = d.pauses_unanswered(cutoff, p.limit).await?;
    let effects = plan_pauses_unanswered(&unanswered, p);
    apply(d, &effects, p.now).await?;
    counts.pause_not_honoured = effects.len() as u64;
    Ok(counts)
}

/// Not started (or waiting for a retry) and past the deadline: never start
/// it. A first attempt fails as "never started"; a retry fails as a stop the
/// server asked for would have ended it.
fn plan_overdue_waiting(rows: &[OverdueWaiting], now: Timestamp) -> Vec<Effect> {
    rows.iter()
        .map(|row| {
            let error = if row.state == State::Queued {
                deadline_error_before_start()
            } else {
                failing_cancel(Some(SYSTEM), Some(DEADLINE_EXCEEDED)).expect("a failing reason")
            };
            Effect::End(EndRow {
                id: row.id.clone(),
                ending: Ending::failed(error),
                now,
                guard: None,
            })
        })
        .collect()
}

/// Running past the deadline: ask the worker to stop.
fn plan_overdue_running(ids: &[String]) -> Vec<Effect> {
    ids.iter()
        .map(|id| Effect::RequestCancel {
            id: id.clone(),
            by: SYSTEM.to_owned(),
            reason: Some(DEADLINE_EXCEEDED.to_owned()),
        })
        .collect()
}

/// Asked to stop by the server and not acknowledged within the grace
/// period: end it as the server decided. The worker's lease goes with its
/// task row, so its later writes get `lease_lost`.
fn plan_stops_unacknowledged(rows: &[StopRequested], now: Timestamp) -> Vec<Effect> {
    rows.iter()
        .map(|row| {
            let error = failing_cancel(Some(SYSTEM), row.reason.as_deref()).unwrap_or_else(|| OperationError {
                code: DEADLINE_EXCEEDED.into(),
                message: "the operation's deadline passed".into(),
                retryable: false,
            });
            Effect::End(EndRow {
                id: row.id.clone(),
                ending: Ending::failed(error),
                now,
                guard: None,
            })
        })
        .collect()
}

/// Asked to pause and not paused within the grace period: the work goes on,
/// and the history says the request was not honoured.
fn plan_pauses_unanswered(rows: &[PauseRequested], p: &EnforceParams) -> Vec<Effect> {
    rows.iter()
        .map(|row| Effect::SetPauseRequest {
            id: row.id.clone(),
            at: None,
            event: EventType::PauseNotHonoured,
            data: pause_not_honoured_data(row.requested_at, p.grace),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ending_code(effect: &Effect) -> &str {
        match effect {
            Effect::End(row) => &row.ending.error.as_ref().expect("a failure").code,
            other => panic!("not an ending: {other:?}"),
        }
    }

    #[test]
    fn a_first_attempt_past_its_deadline_fails_as_never_started() {
        let rows = [
            OverdueWaiting {
                id: "op_a".into(),
                state: State::Queued,
            },
            OverdueWaiting {
                id: "op_b".into(),
                state: State::Running,
            },
        ];
        let effects = plan_overdue_waiting(&rows, Timestamp(0));
        assert_eq!(effects.len(), 2);
        let Effect::End(row) = &effects[0] else { unreachable!() };
        assert_eq!(row.ending, Ending::failed(deadline_error_before_start()));
        // A retry waiting for its backoff ends as the stop would have.
        assert_eq!(ending_code(&effects[1]), DEADLINE_EXCEEDED);
    }

    #[test]
    fn an_unacknowledged_budget_stop_ends_with_its_own_code() {
        let rows = [
            StopRequested {
                id: "op_a".into(),
                reason: Some("budget_exhausted".into()),
            },
            StopRequested {
                id: "op_b".into(),
                reason: None,
            },
        ];
        let effects = plan_stops_unacknowledged(&rows, Timestamp(0));
        assert_eq!(ending_code(&effects[0]), "budget_exhausted");
        assert_eq!(ending_code(&effects[1]), DEADLINE_EXCEEDED);
    }

    #[test]
    fn running_work_past_its_deadline_is_asked_to_stop_by_the_system() {
        assert_eq!(
            plan_overdue_running(&["op_a".into()]),
            [Effect::RequestCancel {
                id: "op_a".into(),
                by: SYSTEM.into(),
                reason: Some(DEADLINE_EXCEEDED.into()),
            }]
        );
    }

    #[test]
    fn an_unanswered_pause_is_withdrawn_as_not_honoured() {
        let p = EnforceParams {
            now: Timestamp(10_000),
            grace: Duration::from_secs(5),
            limit: 10,
        };
        let rows = [PauseRequested {
            id: "op_a".into(),
            requested_at: Timestamp(1_000),
        }];
        let [Effect::SetPauseRequest { event, data, .. }] = &plan_pauses_unanswered(&rows, &p)[..] else {
            panic!("one withdrawal");
        };
        assert_eq!(*event, EventType::PauseNotHonoured);
        assert_eq!(data["grace_seconds"], 5);
    }
}
