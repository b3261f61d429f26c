//! The pure rules of the store, decided once for every backend: how an
//! outcome, a lapsed lease or a server's stop ends an operation, what a
//! heartbeat changes, which changes of intent and `PATCH`es are allowed.
//! The plan layer's use cases call them; a claim's rules are in
//! `claims.rs`, where pieces go in `pieces.rs`.

use super::*;

/// Who a cancellation by the server itself is attributed to.
pub(crate) const SYSTEM: &str = "system";

/// Cancel reasons that end the operation `failed` with the reason as its code.
pub(crate) const FAILING_CANCEL_REASONS: [&str; 2] = ["deadline_exceeded", "budget_exhausted"];

/// Merges a worker's report into the stored progress. Completed units never
/// go backwards; fields the worker leaves out keep their value.
pub(crate) fn merge_progress(old: Option<&Progress>, update: &ProgressUpdate) -> Progress {
    let old = old.cloned().unwrap_or_default();
    let completed_units = match (old.completed_units, update.completed_units) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => b.or(a),
    };
    Progress {
        completed_units,
        total_units: update.total_units.or(old.total_units),
        unit: update.unit.clone().or(old.unit),
        phase: update.phase.clone().or(old.phase),
        details: update.details.clone().or(old.details),
        updated_at: old.updated_at,
    }
}

/// The error a cancellation by the server itself ends with, if it was one.
pub(crate) fn failing_cancel(requested_by: Option<&str>, reason: Option<&str>) -> Option<OperationError> {
    let reason = reason.filter(|r| requested_by == Some(SYSTEM) && FAILING_CANCEL_REASONS.contains(r))?;
    Some(OperationError {
        code: reason.to_owned(),
        message: match reason {
            "deadline_exceeded" => "the operation's deadline passed".to_owned(),
            _ => "the operation's cost budget was exhausted".to_owned(),
        },
        retryable: false,
    })
}

/// When the result of an operation that ended at `ended` expires: after the
/// result retention, but never after the operation itself (its record and
/// everything reachable through it go at its own expiry). So a result's
/// `expires_at` alone says whether it may still be served.
pub(crate) fn result_expires_at(
    ended: Timestamp,
    result_retention: Duration,
    operation_retention: Duration,
) -> Timestamp {
    ended.plus(result_retention.min(operation_retention))
}

/// The fenced view of a running task: present only for the current lease holder.
pub(crate) struct Fenced {
    pub version: i64,
    pub attempt: i64,
    pub max_attempts: i64,
    pub budget_max_cost: Option<f64>,
    pub lease_ms: i64,
    pub progress: Option<Progress>,
    pub cost_units: f64,
    pub cancellable: bool,
    pub cancel_requested: bool,
    pub cancel_reason: Option<String>,
    pub cancel_requested_by: Option<String>,
    /// A client asked to pause and the worker has not answered yet.
    pub pause_requested: bool,
}

impl Fenced {
    /// The fenced view of `op`, held under a lease of `lease_ms`, of a kind
    /// allowing `max_attempts`.
    pub fn of(op: &Operation, max_attempts: i64, lease_ms: i64) -> Self {
        Self {
            version: op.version,
            attempt: op.attempt,
            max_attempts,
            budget_max_cost: op.budget_max_cost,
            lease_ms,
            progress: op.progress.clone(),
            cost_units: op.cost_units,
            cancellable: op.cancellable,
            cancel_requested: op.cancel.is_some(),
            cancel_reason: op.cancel.as_ref().and_then(|c| c.reason.clone()),
            cancel_requested_by: op.cancel.as_ref().map(|c| c.requested_by.clone()),
            pause_requested: op.pause_requested(),
        }
    }
}

/// What a heartbeat does to its operation; every backend applies the same.
pub(crate) struct HeartbeatEffect {
    pub progress: Option<Progress>,
    pub cost_units: f64,
    pub cancellable: bool,
    /// The `progress` event's data when something visible changed (a new
    /// version); `None` for an idle heartbeat, which keeps the version.
    pub event: Option<Value>,
    /// The budget is exceeded now and no stop was asked for yet.
    pub over_budget: bool,
}

pub(crate) fn heartbeat_effect(current: &Fenced, p: &HeartbeatParams) -> HeartbeatEffect {
    let progress = final_progress(current, p.progress.as_ref(), p.now).or_else(|| current.progress.clone());
    // Cost only grows; once past the commit point, an operation stays uncancellable.
    let cost_units = p.cost_units.map_or(current.cost_units, |c| c.max(current.cost_units));
    let cancellable = current.cancellable && p.cancellable.unwrap_or(true);
    let changed =
        progress != current.progress || cost_units != current.cost_units || cancellable != current.cancellable;
    let event = changed.then(|| {
        // The event's own `at` says when; the record's internal timestamp stays out.
        let public_progress = progress.as_ref().map(|p| {
            let mut v = progress_to_json(p);
            if let Some(fields) = v.as_object_mut() {
                fields.remove("updated_at");
            }
            v
        });
        json!({"progress": public_progress, "cost_units": cost_units, "cancellable": cancellable})
    });
    let over_budget =
        !current.cancel_requested && cancellable && current.budget_max_cost.is_some_and(|max| cost_units > max);
    HeartbeatEffect {
        progress,
        cost_units,
        cancellable,
        event,
        over_budget,
    }
}

/// How an operation ends: its terminal state and what it carries. Every
/// way to end goes through a named constructor, and every backend applies
/// an `Ending` the same way (`operation_end`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ending {
    pub to: State,
    pub result: Option<Value>,
    pub error: Option<OperationError>,
    /// The worker's last progress, stored with the change (same version).
    pub progress: Option<Progress>,
    /// Publish what the worker uploaded (a success, or a failure the worker
    /// reported itself: partial outputs and error reports); any other end
    /// discards it.
    pub publishes: bool,
}

impl Ending {
    pub fn succeeded(result: Option<Value>) -> Self {
        Self {
            to: State::Succeeded,
            result: Some(result.unwrap_or(Value::Null)),
            error: None,
            progress: None,
            publishes: true,
        }
    }

    pub fn failed(error: OperationError) -> Self {
        Self {
            to: State::Failed,
            result: None,
            error: Some(error),
            progress: None,
            publishes: false,
        }
    }

    /// A failure the worker reported: what it uploaded is published.
    pub fn failed_by_worker(error: OperationError) -> Self {
        Self {
            publishes: true,
            ..Self::failed(error)
        }
    }

    pub fn cancelled() -> Self {
        Self {
            to: State::Cancelled,
            result: None,
            error: None,
            progress: None,
            publishes: false,
        }
    }

    /// How work whose cancellation was requested ends: a stop the server
    /// asked for (deadline, budget) fails with its code, a client's cancel
    /// ends `cancelled`.
    pub fn after_cancel(requested_by: Option<&str>, reason: Option<&str>) -> Self {
        match failing_cancel(requested_by, reason) {
            Some(error) => Self::failed(error),
            None => Self::cancelled(),
        }
    }

    pub fn with_progress(self, progress: Option<Progress>) -> Self {
        Self { progress, ..self }
    }

    /// Whether ending this way drops the operation's input (a success,
    /// unless inputs are kept).
    pub fn drops_input(&self, keep_inputs: bool) -> bool {
        !keep_inputs && self.to == State::Succeeded
    }

    /// Whether the operation's artifact pieces go with it: cancelled work
    /// leaves nothing behind; a failed one keeps its pieces for a
    /// `from_checkpoint` re-run.
    pub fn drops_pieces(&self) -> bool {
        self.to == State::Cancelled
    }

    /// `op`, a non-terminal operation, as this ending leaves it at `now`
    /// (before anything is published): one version on, terminal, expiring
    /// after `retention`, with the ending's progress if it has one.
    pub fn apply(&self, mut op: Operation, now: Timestamp, retention: Duration, keep_inputs: bool) -> Operation {
        debug_assert!(self.to.is_terminal() && !op.state.is_terminal());
        op.state = self.to;
        op.version += 1;
        op.result.clone_from(&self.result);
        op.error.clone_from(&self.error);
        op.completed_at = Some(now);
        op.updated_at = now;
        op.expires_at = Some(now.plus(retention));
        if self.drops_input(keep_inputs) {
            op.input = None;
        }
        if let Some(progress) = &self.progress {
            op.progress = Some(progress.clone());
        }
        op
    }

    /// The progress column's new JSON, if the ending changes it.
    pub fn progress_json(&self) -> Option<String> {
        self.progress.as_ref().map(progress_text)
    }

    /// The data of the terminal event.
    pub fn event_data(&self) -> Value {
        match &self.error {
            Some(e) => json!({"error": {"code": e.code, "message": e.message, "retryable": e.retryable}}),
            None => json!({}),
        }
    }
}

/// What a worker's outcome or a lapsed lease does to its operation, decided
/// once for every backend: end it, or put it back in the queue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    End(Ending),
    Retry {
        next_attempt: i64,
        /// The `retry_scheduled` event's data (the backoff is added by the applier).
        data: Value,
    },
    /// Out of the queue as `paused` (a client asked), keeping the last
    /// checkpoint unless a newer one is given; the next claim after a
    /// resume runs attempt `attempt`.
    Pause {
        attempt: i64,
        checkpoint: Option<Value>,
        /// The `paused` event's data.
        data: Value,
    },
}

impl Decision {
    /// A retry, unless a pause was asked for: then the work pauses instead
    /// (still counting the attempt that ended) and waits for a resume.
    pub(super) fn retry_unless_pausing(pause_requested: bool, next_attempt: i64, data: Value) -> Self {
        if pause_requested {
            Decision::Pause {
                attempt: next_attempt,
                checkpoint: None,
                data,
            }
        } else {
            Decision::Retry { next_attempt, data }
        }
    }
}

/// What a worker's outcome does to its operation. A `paused` report
/// nobody asked for is refused (`IntentConflict`), and after a cancel
/// request it ends the work as the cancel says: terminal intent dominates.
pub(crate) fn decide_finish(current: &Fenced, outcome: &Outcome) -> Result<Decision> {
    Ok(match outcome {
        Outcome::Succeeded { result } => Decision::End(Ending::succeeded(result.clone())),
        // The worker says another attempt may succeed and attempts are left:
        // retry after a backoff; the public state stays running.
        Outcome::Failed { error }
            if error.retryable && !current.cancel_requested && current.attempt < current.max_attempts =>
        {
            Decision::retry_unless_pausing(
                current.pause_requested,
                current.attempt + 1,
                json!({
                    "reason": "worker_error",
                    "error": {"code": error.code, "message": error.message, "retryable": true},
                }),
            )
        }
        Outcome::Failed { error } => Decision::End(Ending::failed_by_worker(error.clone())),
        Outcome::Paused { checkpoint } if current.pause_requested && !current.cancel_requested => Decision::Pause {
            attempt: current.attempt,
            checkpoint: checkpoint.clone(),
            data: json!({"reason": "requested", "attempt": current.attempt}),
        },
        Outcome::Paused { .. } if !current.cancel_requested => {
            return Err(StoreError::IntentConflict {
                current_version: current.version,
            });
        }
        // A cancel acknowledged, or a pause reported after a cancel request.
        Outcome::Cancelled | Outcome::Paused { .. } => Decision::End(Ending::after_cancel(
            current.cancel_requested_by.as_deref(),
            current.cancel_reason.as_deref(),
        )),
    })
}

/// A task whose lease lapsed, as the reaper reads it.
pub(crate) struct Lapsed {
    pub attempt: i64,
    pub max_attempts: i64,
    pub rerun_safe: bool,
    pub cancel_requested: bool,
    pub cancel_requested_by: Option<String>,
    pub cancel_reason: Option<String>,
    pub pause_requested: bool,
}

/// What the reaper does with a lapsed lease: work asked to stop ends as its
/// stop says; a kind safe to re-run with attempts left goes back to the
/// queue (or, asked to pause, pauses), and its next attempt gets the last
/// checkpoint; anything else may have had external effects, so it fails
/// with `outcome_unknown` for a human or a reconciler to look at.
pub(crate) fn decide_reap(task: &Lapsed) -> Decision {
    if task.cancel_requested {
        Decision::End(Ending::after_cancel(
            task.cancel_requested_by.as_deref(),
            task.cancel_reason.as_deref(),
        ))
    } else if task.rerun_safe && task.attempt < task.max_attempts {
        Decision::retry_unless_pausing(
            task.pause_requested,
            task.attempt + 1,
            json!({"reason": "lease_expired"}),
        )
    } else {
        Decision::End(Ending::failed(OperationError {
            code: "outcome_unknown".into(),
            message: "the worker stopped renewing its lease after starting work that is not safe to re-run; \
                      external effects may have happened"
                .into(),
            retryable: false,
        }))
    }
}

impl ReapCounts {
    /// Counts what the reaper did with `task`.
    pub(crate) fn count(&mut self, task: &Lapsed, decision: &Decision) {
        match decision {
            Decision::Retry { .. } => self.requeued += 1,
            Decision::Pause { .. } => self.paused += 1,
            Decision::End(_) if task.cancel_requested => self.ended_cancel_requested += 1,
            Decision::End(_) => self.failed_outcome_unknown += 1,
        }
    }
}

/// What a change of desired state does to an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntentChange {
    /// Out of the queue at once (no worker holds it).
    Pause,
    /// Ask the worker holding it to pause (`pause_requested`).
    RequestPause,
    /// Withdraw a pause the worker has not answered yet.
    WithdrawPause,
    Resume,
    Unchanged,
}

impl IntentChange {
    /// For a pause asked of (or withdrawn from) running work: the new
    /// `pause_requested_at` and the event that records the change.
    pub fn pause_request(self, now: Timestamp) -> (Option<Timestamp>, EventType) {
        match self {
            IntentChange::RequestPause => (Some(now), EventType::PauseRequested),
            _ => (None, EventType::PauseWithdrawn),
        }
    }
}

/// The data of the event recording a pause its worker did not honour.
pub(crate) fn pause_not_honoured_data(requested_at: Timestamp, grace: Duration) -> Value {
    json!({
        "requested_at": requested_at.to_rfc3339(),
        "grace_seconds": grace.as_secs(),
        "message": "the worker did not pause within the grace period; the work goes on",
    })
}

/// What the operation's workers can do, as `decide_intent` needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder {
    /// A worker holds the lease now.
    pub leased: bool,
    /// Its kind is declared pausable.
    pub pausable: bool,
}

/// The rules a cancel request meets before it changes anything, for every
/// backend: an ended operation answers as it is (nothing would change, so
/// a stale `If-Match` cannot lose an update); then `If-Match`, when given,
/// must name the current version; a second request changes nothing; work
/// past its commit point refuses. `Continue`: go on and cancel it.
pub(crate) fn cancel_checks(op: Operation, p: &CancelParams) -> Result<ControlFlow<CancelOutcome>> {
    if op.state.is_terminal() {
        return Ok(ControlFlow::Break(CancelOutcome::AlreadyTerminal(op)));
    }
    if let Some(expected) = p.if_match
        && expected != op.version
    {
        return Err(StoreError::PreconditionFailed {
            current_version: op.version,
        });
    }
    if op.cancel.is_some() {
        return Ok(ControlFlow::Break(CancelOutcome::AlreadyRequested(op)));
    }
    if !op.cancellable {
        return Err(StoreError::NotCancellable);
    }
    Ok(ControlFlow::Continue(()))
}

/// What a `PATCH` of deadline and labels writes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpdateChange {
    pub deadline_at: Option<Timestamp>,
    pub labels: BTreeMap<String, String>,
    pub not_before: Option<Timestamp>,
    /// When its ready task becomes claimable, if the start moved.
    pub available_at: Option<Timestamp>,
    /// The `updated` event's data.
    pub data: Value,
}

/// The rules of `PATCH` of deadline and labels, for every backend:
/// terminal intent wins over any change, stale or not; then the version
/// must be the current one; asking for what holds changes nothing (`None`).
pub(crate) fn decide_update(op: &Operation, p: &UpdateParams) -> Result<Option<UpdateChange>> {
    if op.state.is_terminal() {
        return Err(StoreError::Terminal {
            current_version: op.version,
        });
    }
    if p.if_match != op.version {
        return Err(StoreError::PreconditionFailed {
            current_version: op.version,
        });
    }
    let deadline_at = p.deadline_at.unwrap_or(op.deadline_at);
    let labels = p.labels.as_ref().unwrap_or(&op.labels);
    let not_before = p.not_before.unwrap_or(op.not_before);
    let moves_start = not_before != op.not_before;
    if moves_start && op.state != State::Queued {
        // Work that started (or is paused, holding its place) keeps its start.
        return Err(StoreError::Started {
            current_version: op.version,
        });
    }
    if deadline_at == op.deadline_at && labels == &op.labels && !moves_start {
        return Ok(None);
    }
    let mut data = json!({"deadline_at": deadline_at.map(|t| t.to_rfc3339()), "labels": labels});
    if moves_start {
        data["not_before"] = json!(not_before.map(|t| t.to_rfc3339()));
    }
    Ok(Some(UpdateChange {
        deadline_at,
        labels: labels.clone(),
        not_before,
        available_at: moves_start.then(|| crate::available_at(not_before, p.now)),
        data,
    }))
}

/// The rules of `PATCH {"desired_state"}`, for every backend: terminal
/// intent dominates (an ended operation, or one asked to cancel, refuses
/// whatever the version), then work a worker holds can pause only if its
/// kind is pausable (the worker is asked), then the version must be the
/// current one; asking for what holds changes nothing.
pub(crate) fn decide_intent(op: &Operation, holder: Holder, p: &IntentParams) -> Result<IntentChange> {
    let current_version = op.version;
    if op.state.is_terminal() || op.cancel.is_some() {
        return Err(StoreError::IntentConflict { current_version });
    }
    let pause_requested = op.pause_requested();
    let change = match (p.desired, op.state) {
        (DesiredState::Paused, State::Paused) => IntentChange::Unchanged,
        (DesiredState::Paused, _) if pause_requested => IntentChange::Unchanged,
        (DesiredState::Running, State::Queued | State::Running) if pause_requested => IntentChange::WithdrawPause,
        (DesiredState::Running, State::Queued | State::Running) => IntentChange::Unchanged,
        (DesiredState::Paused, _) if holder.leased && holder.pausable => IntentChange::RequestPause,
        (DesiredState::Paused, _) if holder.leased => return Err(StoreError::NotPausable { current_version }),
        (DesiredState::Paused, _) => IntentChange::Pause,
        (DesiredState::Running, _) => IntentChange::Resume,
    };
    if let Some(expected) = p.if_match
        && expected != current_version
    {
        return Err(StoreError::PreconditionFailed { current_version });
    }
    Ok(change)
}

/// The operation an accepted submission creates, as the store returns it.
pub(crate) fn created_operation(p: &AcceptParams) -> Operation {
    Operation {
        id: p.id.clone(),
        tenant: p.tenant.clone(),
        kind: p.kind.clone(),
        state: State::Queued,
        version: 1,
        attempt: 0,
        input: Some(p.input.clone()),
        callback_url: p.callback_url.clone(),
        deadline_at: p.deadline_at,
        budget_max_cost: p.budget_max_cost,
        cost_units: 0.0,
        labels: p.labels.clone(),
        progress: None,
        result: None,
        error: None,
        cancel: None,
        cancellable: true,
        idempotency_key: p.idempotency.as_ref().map(|(k, _)| k.as_str().to_owned()),
        created_at: p.now,
        started_at: None,
        completed_at: None,
        updated_at: p.now,
        expires_at: None,
        artifact: None,
        artifacts: BTreeMap::new(),
        rerun_of: p.rerun_of.clone(),
        reruns: None,
        pause_requested_at: None,
        not_before: p.not_before,
        priority: p.priority,
    }
}

/// The progress to store with an outcome: the worker's last, coalesced
/// report merged into the stored one; `None` when it changes nothing.
pub(crate) fn final_progress(current: &Fenced, update: Option<&ProgressUpdate>, now: Timestamp) -> Option<Progress> {
    let update = update?;
    let mut merged = merge_progress(current.progress.as_ref(), update);
    let unchanged = current.progress.as_ref().is_some_and(|old| {
        let mut old = old.clone();
        old.updated_at = merged.updated_at;
        old == merged
    });
    (!unchanged).then(|| {
        merged.updated_at = Some(now);
        merged
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_never_outlives_its_operation() {
        let ended = Timestamp(1_000_000);
        let (day, month) = (Duration::from_secs(86_400), Duration::from_secs(30 * 86_400));
        assert_eq!(result_expires_at(ended, day, month), ended.plus(day));
        assert_eq!(
            result_expires_at(ended, month, day),
            ended.plus(day),
            "capped at the operation's own expiry"
        );
    }

    fn running(attempt: i64, max_attempts: i64) -> Fenced {
        Fenced {
            version: 2,
            attempt,
            max_attempts,
            budget_max_cost: None,
            lease_ms: 30_000,
            progress: None,
            cost_units: 0.0,
            cancellable: true,
            cancel_requested: false,
            cancel_reason: None,
            cancel_requested_by: None,
            pause_requested: false,
        }
    }

    fn error(retryable: bool) -> OperationError {
        OperationError {
            code: "boom".into(),
            message: "it broke".into(),
            retryable,
        }
    }

    #[test]
    fn a_retryable_failure_retries_only_with_attempts_left_and_no_stop_asked() {
        let failed = Outcome::Failed { error: error(true) };
        assert!(matches!(
            decide_finish(&running(1, 3), &failed).unwrap(),
            Decision::Retry { next_attempt: 2, .. }
        ));
        assert_eq!(
            decide_finish(&running(3, 3), &failed).unwrap(),
            Decision::End(Ending::failed_by_worker(error(true)))
        );
        let mut stopping = running(1, 3);
        stopping.cancel_requested = true;
        assert_eq!(
            decide_finish(&stopping, &failed).unwrap(),
            Decision::End(Ending::failed_by_worker(error(true)))
        );
        assert_eq!(
            decide_finish(&running(1, 3), &Outcome::Failed { error: error(false) }).unwrap(),
            Decision::End(Ending::failed_by_worker(error(false)))
        );
    }

    #[test]
    fn a_stop_the_server_asked_for_ends_failed_with_its_code() {
        let mut stopped = running(1, 1);
        stopped.cancel_requested = true;
        stopped.cancel_requested_by = Some(SYSTEM.into());
        stopped.cancel_reason = Some("budget_exhausted".into());
        let Decision::End(ending) = decide_finish(&stopped, &Outcome::Cancelled).unwrap() else {
            panic!("a cancel acknowledgement ends the operation")
        };
        assert_eq!(ending.to, State::Failed);
        assert_eq!(ending.error.unwrap().code, "budget_exhausted");
        // A client's cancel (even one giving that reason) ends cancelled.
        stopped.cancel_requested_by = Some("key_123".into());
        assert_eq!(
            decide_finish(&stopped, &Outcome::Cancelled).unwrap(),
            Decision::End(Ending::cancelled())
        );
        assert_eq!(
            decide_finish(&running(1, 1), &Outcome::Succeeded { result: None }).unwrap(),
            Decision::End(Ending::succeeded(Some(Value::Null)))
        );
    }

    #[test]
    fn the_reaper_retries_rerun_safe_work_and_fails_the_rest_as_outcome_unknown() {
        let lapsed = |rerun_safe, attempt, cancel_requested| Lapsed {
            attempt,
            max_attempts: 3,
            rerun_safe,
            cancel_requested,
            cancel_requested_by: None,
            cancel_reason: None,
            pause_requested: false,
        };
        let mut counts = ReapCounts::default();
        for (task, expected) in [
            (lapsed(true, 1, false), "retry"),
            (lapsed(true, 3, false), "outcome_unknown"),
            (lapsed(false, 1, false), "outcome_unknown"),
            (lapsed(true, 1, true), "cancelled"),
        ] {
            let decision = decide_reap(&task);
            let got = match &decision {
                Decision::Retry { .. } => "retry",
                Decision::Pause { .. } => "paused",
                Decision::End(e) if e.to == State::Cancelled => "cancelled",
                Decision::End(e) => e.error.as_ref().unwrap().code.as_str(),
            };
            assert_eq!(got, expected);
            counts.count(&task, &decision);
        }
        assert_eq!(
            (
                counts.requeued,
                counts.failed_outcome_unknown,
                counts.ended_cancel_requested
            ),
            (1, 2, 1)
        );
    }

    #[test]
    fn a_paused_report_pauses_only_when_asked_and_never_after_a_cancel() {
        let paused = Outcome::Paused {
            checkpoint: Some(json!({"step": 3})),
        };
        assert!(matches!(
            decide_finish(&running(1, 3), &paused),
            Err(StoreError::IntentConflict { current_version: 2 })
        ));
        let mut asked = running(2, 3);
        asked.pause_requested = true;
        let Decision::Pause {
            attempt, checkpoint, ..
        } = decide_finish(&asked, &paused).unwrap()
        else {
            panic!("a requested pause pauses")
        };
        assert_eq!((attempt, checkpoint), (2, Some(json!({"step": 3}))), "not an attempt");
        // A retryable failure while a pause is asked for pauses too.
        assert!(matches!(
            decide_finish(&asked, &Outcome::Failed { error: error(true) }).unwrap(),
            Decision::Pause { attempt: 3, .. }
        ));
        asked.cancel_requested = true;
        assert_eq!(
            decide_finish(&asked, &paused).unwrap(),
            Decision::End(Ending::cancelled()),
            "terminal intent dominates"
        );
    }

    fn op_in(state: State) -> Operation {
        let mut op = created_operation(&AcceptParams {
            id: Id::generate(longrun_core::IdKind::Operation),
            tenant: "t".into(),
            kind: "k".into(),
            input: Value::Null,
            callback_url: None,
            deadline_at: None,
            budget_max_cost: None,
            labels: BTreeMap::new(),
            idempotency: None,
            uploads: Vec::new(),
            rerun_of: None,
            from_checkpoint: false,
            not_before: None,
            priority: crate::PRIORITY_DEFAULT,
            now: Timestamp(0),
        });
        op.state = state;
        op
    }

    #[test]
    fn intent_rules_for_work_a_worker_holds() {
        let intent = |desired| IntentParams {
            tenant: "t".into(),
            id: Id::generate(longrun_core::IdKind::Operation),
            desired,
            if_match: None,
            now: Timestamp(0),
        };
        let held = |pausable| Holder { leased: true, pausable };
        let mut op = op_in(State::Running);
        assert_eq!(
            decide_intent(&op, held(true), &intent(DesiredState::Paused)).unwrap(),
            IntentChange::RequestPause
        );
        assert!(matches!(
            decide_intent(&op, held(false), &intent(DesiredState::Paused)),
            Err(StoreError::NotPausable { .. })
        ));
        op.pause_requested_at = Some(Timestamp(1));
        assert_eq!(
            decide_intent(&op, held(true), &intent(DesiredState::Paused)).unwrap(),
            IntentChange::Unchanged
        );
        assert_eq!(
            decide_intent(&op, held(true), &intent(DesiredState::Running)).unwrap(),
            IntentChange::WithdrawPause
        );
        op.cancel = Some(CancelRequest {
            requested_at: Timestamp(2),
            requested_by: "k".into(),
            reason: None,
        });
        assert!(matches!(
            decide_intent(&op, held(true), &intent(DesiredState::Running)),
            Err(StoreError::IntentConflict { .. })
        ));
    }

    #[test]
    fn final_progress_is_none_when_nothing_changes() {
        let mut current = running(1, 1);
        let update = ProgressUpdate {
            completed_units: Some(5.0),
            ..ProgressUpdate::default()
        };
        let now = Timestamp(1_000);
        let stored = final_progress(&current, Some(&update), now).expect("a change");
        assert_eq!(stored.updated_at, Some(now));
        current.progress = Some(stored);
        assert_eq!(final_progress(&current, Some(&update), Timestamp(2_000)), None);
        assert_eq!(final_progress(&current, None, now), None);
    }
}
