//! Schedules (docs/schedules.md): a definition checked as a submission of
//! it would be, the schedule as clients read it, and the firing service.
//!
//! Every node runs the firing service; none leads. A round reads the
//! schedules that are due, decides each one's firings with
//! [`plan_firings`] (the previous firing's operation tells whether one is
//! live), submits each firing as an ordinary operation under the key
//! `schedule:{id}:{fire_time}`, then moves the schedule on by
//! compare-and-set on its version. Two nodes firing the same time submit
//! the same key, so one operation results; the one whose compare-and-set
//! loses records only the firings it started. A node killed between the
//! submission and the compare-and-set leaves the time due, and the next
//! round (on any node) submits the same key again: the operation is
//! found, not made twice.

use std::time::Duration;

use futures_util::StreamExt;
use longrun_api::{OverlapBody, ScheduleBody, ScheduleFireBody, SchedulePatch, ScheduleRequest, SubmitRequest};
use longrun_core::schedule::{Cadence, Due, FireDecision, Firing, Overlap, plan_firings};
use longrun_core::{Id, IdempotencyKey, Timestamp};
use longrun_store::{Operation, ScheduleFire, ScheduleRecord, StoreError};
use tokio_util::sync::CancellationToken;

use super::ApiError;
use super::AppState;
use super::submissions::{accept, prepare_submission};

/// The catch-up window when a definition leaves it out.
pub(crate) const DEFAULT_CATCHUP_SECONDS: u64 = 3600;
/// The longest catch-up window.
const MAX_CATCHUP_SECONDS: u64 = 30 * 24 * 3600;
/// How many firing times a schedule shows ahead.
const NEXT_SHOWN: usize = 5;
/// Firings one schedule deals with in one round (the rest stay due).
const FIRINGS_PER_ROUND: usize = 100;
/// Due schedules read at a time, and fired concurrently (so that the
/// store's group commit batches their writes).
const DUE_PAGE: u32 = 500;
const CONCURRENCY: usize = 32;
/// Pages of due schedules one round reads at most.
const PAGES_PER_ROUND: usize = 20;

/// How the firing service runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often it looks for due schedules.
    pub interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
        }
    }
}

/// A checked definition.
pub(crate) struct Definition {
    pub request: ScheduleRequest,
    pub cadence: Cadence,
}

/// Checks a definition: its cadence, its catch-up window, and everything
/// a submission of its operation is checked for (kind, input, labels,
/// callback, deadline, budget, priority), so that firings are not refused
/// for what could be said now.
pub(crate) async fn check(
    app: &AppState,
    tenant: &str,
    mut request: ScheduleRequest,
    now: Timestamp,
) -> Result<Definition, ApiError> {
    // What the schema cannot state (cron syntax, zone names) is 422, as a
    // kind's own check of an input is.
    let cadence = Cadence::parse(&request.cron, request.time_zone.as_deref())
        .map_err(|e| ApiError::InvalidInput(e.to_string()))?;
    if let Some(seconds) = request.catchup_window
        && seconds > MAX_CATCHUP_SECONDS
    {
        return Err(ApiError::InvalidRequest(format!(
            "catchup_window {seconds} is more than {MAX_CATCHUP_SECONDS} seconds (30 days)"
        )));
    }
    if request.input.as_ref().is_some_and(serde_json::Value::is_null) {
        request.input = None;
    }
    let probe = IdempotencyKey::for_firing("sch_check", now);
    prepare_submission(app, tenant, Some(probe), submission(&request), now, None).await?;
    // `paused` is the record's, not the definition's.
    request.paused = None;
    Ok(Definition { request, cadence })
}

/// The submission each firing makes.
fn submission(r: &ScheduleRequest) -> SubmitRequest {
    SubmitRequest {
        kind: r.kind.clone(),
        input: r.input.clone(),
        callback: r.callback.clone(),
        deadline_seconds: r.deadline_seconds,
        budget: r.budget,
        labels: r.labels.clone(),
        not_before: None,
        start_after_seconds: None,
        priority: r.priority,
    }
}

/// The definition a record keeps.
pub(crate) fn definition_of(record: &ScheduleRecord) -> Result<Definition, ApiError> {
    let request: ScheduleRequest = serde_json::from_value(record.spec.clone())
        .map_err(|e| ApiError::Internal(format!("schedule {} keeps an unreadable definition: {e}", record.id)))?;
    let cadence = Cadence::parse(&request.cron, request.time_zone.as_deref())
        .map_err(|e| ApiError::Internal(format!("schedule {} keeps an unreadable cadence: {e}", record.id)))?;
    Ok(Definition { request, cadence })
}

fn overlap_of(r: &ScheduleRequest) -> Overlap {
    match r.overlap.unwrap_or_default() {
        OverlapBody::Skip => Overlap::Skip,
        OverlapBody::BufferOne => Overlap::BufferOne,
        OverlapBody::Allow => Overlap::Allow,
    }
}

fn catchup_of(r: &ScheduleRequest) -> Duration {
    Duration::from_secs(r.catchup_window.unwrap_or(DEFAULT_CATCHUP_SECONDS))
}

/// The schedule as clients read it.
pub(crate) fn body(record: &ScheduleRecord) -> Result<ScheduleBody, ApiError> {
    let Definition { request, cadence } = definition_of(record)?;
    let next_fire_times = match record.next_fire_at.filter(|_| !record.paused) {
        Some(next) => std::iter::once(next)
            .chain(cadence.next_n(next, NEXT_SHOWN - 1))
            .map(Timestamp::to_rfc3339)
            .collect(),
        None => Vec::new(),
    };
    Ok(ScheduleBody {
        id: record.id.to_string(),
        version: record.version,
        paused: record.paused,
        overlap: request.overlap.unwrap_or_default(),
        catchup_window: request.catchup_window.unwrap_or(DEFAULT_CATCHUP_SECONDS),
        time_zone: request.time_zone.clone().unwrap_or_else(|| "UTC".to_owned()),
        labels: request.labels.clone().unwrap_or_default(),
        priority: request
            .priority
            .unwrap_or(u64::from(longrun_store::PRIORITY_DEFAULT.unsigned_abs())),
        kind: request.kind,
        input: request.input,
        cron: request.cron,
        callback: request.callback,
        deadline_seconds: request.deadline_seconds,
        budget: request.budget,
        next_fire_times,
        last_operation_id: record.last_operation_id.clone(),
        created_at: record.created_at.to_rfc3339(),
        updated_at: record.updated_at.to_rfc3339(),
    })
}

/// `PATCH` under `If-Match` (`given`): the definition merged with `patch`
/// and checked as at creation; the schedule as changed.
pub(crate) async fn update(
    app: &AppState,
    tenant: &str,
    id: &Id,
    given: i64,
    patch: SchedulePatch,
) -> Result<ScheduleRecord, ApiError> {
    let now = app.clock.now();
    let current = app.store.schedule_get(tenant, id).await?.ok_or(ApiError::NotFound)?;
    if current.version != given {
        return Err(ApiError::PreconditionFailed {
            given,
            current: current.version,
        });
    }
    let Definition { request: mut r, .. } = definition_of(&current)?;
    let recount = patch.cron.is_some() || patch.time_zone.is_some() || (current.paused && patch.paused == Some(false));
    if let Some(cron) = patch.cron {
        r.cron = cron;
    }
    if let Some(zone) = patch.time_zone {
        r.time_zone = zone;
    }
    if let Some(overlap) = patch.overlap {
        r.overlap = Some(overlap);
    }
    if let Some(window) = patch.catchup_window {
        r.catchup_window = Some(window);
    }
    if let Some(input) = patch.input {
        r.input = Some(input);
    }
    if let Some(labels) = patch.labels {
        r.labels = Some(labels);
    }
    if let Some(callback) = patch.callback {
        r.callback = callback;
    }
    if let Some(deadline) = patch.deadline_seconds {
        r.deadline_seconds = deadline;
    }
    if let Some(budget) = patch.budget {
        r.budget = budget;
    }
    if let Some(priority) = patch.priority {
        r.priority = Some(priority);
    }
    let Definition { request, cadence } = check(app, tenant, r, now).await?;
    let mut next = current.clone();
    next.version += 1;
    next.paused = patch.paused.unwrap_or(current.paused);
    next.spec = serde_json::to_value(&request).map_err(|e| ApiError::Internal(e.to_string()))?;
    if recount {
        next.next_fire_at = cadence.next_after(now);
    }
    next.updated_at = now;
    if !app.store.schedule_update(next.clone(), current.version).await? {
        // A firing (or another change) moved it since it was read.
        let latest = app.store.schedule_get(tenant, id).await?.ok_or(ApiError::NotFound)?;
        return Err(ApiError::PreconditionFailed {
            given,
            current: latest.version,
        });
    }
    Ok(next)
}

/// A firing record as clients read it.
pub(crate) fn fire_body(f: &ScheduleFire) -> ScheduleFireBody {
    ScheduleFireBody {
        fire_time: f.fire_time.to_rfc3339(),
        operation_id: f.operation_id.clone(),
        decision: f.decision.as_str().to_owned(),
    }
}

/// How long firing records are kept: as long as the operations they name.
fn fires_kept(app: &AppState, now: Timestamp) -> Timestamp {
    now.minus(app.config.operation_retention)
}

/// Submits the firing of `record` at `fire_time`: the operation, new or
/// found (the same key from another node, or a retry).
async fn submit(
    app: &AppState,
    record: &ScheduleRecord,
    d: &Definition,
    fire_time: Timestamp,
    now: Timestamp,
) -> Result<Operation, ApiError> {
    submit_found(app, record, d, fire_time, now).await.map(|(op, _)| op)
}

/// As [`submit`], and whether the firing's operation existed already.
async fn submit_found(
    app: &AppState,
    record: &ScheduleRecord,
    d: &Definition,
    fire_time: Timestamp,
    now: Timestamp,
) -> Result<(Operation, bool), ApiError> {
    let key = IdempotencyKey::for_firing(record.id.as_str(), fire_time);
    let params = prepare_submission(app, &record.tenant, Some(key), submission(&d.request), now, None).await?;
    match accept(app, params).await {
        Ok(answer) => Ok(answer),
        // The definition changed between two tries of this firing: the
        // first try's operation is the firing.
        Err(ApiError::IdempotencyKeyReused { operation_id }) => app
            .store
            .operation_get(&record.tenant, &operation_id)
            .await?
            .map(|op| (op, true))
            .ok_or(ApiError::NotFound),
        Err(e) => Err(e),
    }
}

/// Firing times one backfill may cover.
pub(crate) const MAX_BACKFILL: usize = 1000;

/// `POST /v1/schedules/{id}/backfill`: fires every time of the cadence in
/// `[start, end]` (at most [`MAX_BACKFILL`], none after now), whatever the
/// overlap policy, each under its own firing key: a time that fired already
/// keeps its operation, a missed one gets one. The schedule itself does not
/// move. The firing records of the times that got a new operation.
pub(crate) async fn backfill(
    app: &AppState,
    tenant: &str,
    id: &Id,
    start: Timestamp,
    end: Timestamp,
) -> Result<Vec<ScheduleFire>, ApiError> {
    let now = app.clock.now();
    if end < start {
        return Err(ApiError::InvalidRequest("end is before start".into()));
    }
    if end > now {
        return Err(ApiError::InvalidRequest(
            "end is in the future: a backfill fires times that have passed".into(),
        ));
    }
    let record = app.store.schedule_get(tenant, id).await?.ok_or(ApiError::NotFound)?;
    let d = definition_of(&record)?;
    let mut times = Vec::new();
    let mut at = Timestamp(start.0 - 1);
    while let Some(t) = d.cadence.next_after(at).filter(|t| *t <= end) {
        if times.len() == MAX_BACKFILL {
            return Err(ApiError::InvalidRequest(format!(
                "the range holds more than {MAX_BACKFILL} firing times; backfill it in parts"
            )));
        }
        times.push(t);
        at = t;
    }
    let started: Vec<Result<(Timestamp, Operation, bool), ApiError>> = futures_util::stream::iter(times)
        .map(|t| {
            let (record, d) = (&record, &d);
            async move {
                submit_found(app, record, d, t, now)
                    .await
                    .map(|(op, found)| (t, op, found))
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let mut fires = Vec::new();
    for outcome in started {
        let (t, op, found) = outcome?;
        if !found {
            fires.push(ScheduleFire {
                schedule_id: record.id.clone(),
                tenant: record.tenant.clone(),
                fire_time: t,
                operation_id: Some(op.id.to_string()),
                decision: FireDecision::Backfilled,
                recorded_at: now,
            });
        }
    }
    app.store
        .schedule_fires_record(fires.clone(), fires_kept(app, now))
        .await?;
    Ok(fires)
}

/// Whether a refusal may pass (quota, the database, acceptance paused):
/// the firing is tried again next round instead of recorded `refused`.
fn passes(e: &ApiError) -> bool {
    e.retryable()
}

/// `POST /v1/schedules/{id}/trigger`: fires the schedule now, whatever its
/// overlap policy says, and makes the operation its latest firing.
pub(crate) async fn trigger(app: &AppState, tenant: &str, id: &Id) -> Result<Operation, ApiError> {
    let now = app.clock.now();
    let record = app.store.schedule_get(tenant, id).await?.ok_or(ApiError::NotFound)?;
    let d = definition_of(&record)?;
    let op = submit(app, &record, &d, now, now).await?;
    let fire = ScheduleFire {
        schedule_id: record.id.clone(),
        tenant: record.tenant.clone(),
        fire_time: now,
        operation_id: Some(op.id.to_string()),
        decision: FireDecision::Triggered,
        recorded_at: now,
    };
    app.store
        .schedule_fires_record(vec![fire], fires_kept(app, now))
        .await?;
    // The trigger's operation becomes the latest firing (retried on a race
    // with a firing round or a PATCH: both leave it to be set again).
    let mut current = record;
    for _ in 0..5 {
        let mut next = current.clone();
        next.version += 1;
        next.last_operation_id = Some(op.id.to_string());
        next.updated_at = now;
        if app.store.schedule_update(next, current.version).await? {
            break;
        }
        match app.store.schedule_get(tenant, id).await? {
            Some(again) => current = again,
            None => break,
        }
    }
    Ok(op)
}

/// What one due schedule's firing left to write: the schedule moved on
/// (`None` when a firing is held back and it stays where it was) and the
/// firing records.
struct Fired {
    advance: Option<(ScheduleRecord, i64)>,
    fires: Vec<ScheduleFire>,
}

/// Decides and submits one due schedule's firings; the writes that record
/// them are left to the round, which makes them for a page at once.
async fn fire_due(app: &AppState, record: ScheduleRecord, now: Timestamp) -> Result<Fired, ApiError> {
    let d = definition_of(&record)?;
    let overlap = overlap_of(&d.request);
    // Only `skip` and `buffer_one` (and a firing held back) look at the
    // previous firing: `allow` starts every time without reading it.
    let previous_live = match &record.last_operation_id {
        Some(op) if overlap != Overlap::Allow || record.buffered_fire_at.is_some() => app
            .store
            .operation_get(&record.tenant, &Id::from_trusted(op.clone()))
            .await?
            .is_some_and(|op| !op.state.is_terminal()),
        _ => false,
    };
    let due = Due {
        next_fire_at: record.next_fire_at,
        buffered: record.buffered_fire_at,
        previous_live,
    };
    let plan = plan_firings(&d.cadence, overlap, catchup_of(&d.request), due, now, FIRINGS_PER_ROUND);
    let mut fires = Vec::with_capacity(plan.firings.len());
    let mut last_operation_id = record.last_operation_id.clone();
    let fire = |fire_time, operation_id: Option<String>, decision| ScheduleFire {
        schedule_id: record.id.clone(),
        tenant: record.tenant.clone(),
        fire_time,
        operation_id,
        decision,
        recorded_at: now,
    };
    for firing in &plan.firings {
        match *firing {
            Firing::Start(t) => match submit(app, &record, &d, t, now).await {
                Ok(op) => {
                    last_operation_id = Some(op.id.to_string());
                    fires.push(fire(t, last_operation_id.clone(), FireDecision::Started));
                }
                Err(e) if passes(&e) => {
                    // Tried again next round: the schedule stays where it
                    // was, so the rest is decided again (times already
                    // started are found by their keys).
                    tracing::warn!(schedule.id = %record.id, code = e.code(), error = %e, "a firing is held back");
                    fires.retain(|f| f.operation_id.is_some());
                    return Ok(Fired { advance: None, fires });
                }
                Err(e) => {
                    tracing::warn!(schedule.id = %record.id, code = e.code(), error = %e, "a firing was refused");
                    fires.push(fire(t, None, FireDecision::Refused));
                }
            },
            Firing::Record(t, decision) => fires.push(fire(t, None, decision)),
        }
    }
    let mut next = record.clone();
    next.version += 1;
    next.next_fire_at = plan.next_fire_at;
    next.buffered_fire_at = plan.buffered;
    next.last_operation_id = last_operation_id;
    next.updated_at = now;
    Ok(Fired {
        advance: Some((next, record.version)),
        fires,
    })
}

/// One round: every schedule due now, a page at a time. A page's
/// schedules are fired concurrently (their submissions share the store's
/// group commit), then moved on in one transaction and their firings
/// recorded in another.
pub(crate) async fn round(app: &AppState) -> Result<u64, StoreError> {
    let now = app.clock.now();
    let mut dealt = 0u64;
    for _ in 0..PAGES_PER_ROUND {
        let due = app.store.schedule_due(now, DUE_PAGE).await?;
        let full = due.len() as u32 >= DUE_PAGE;
        let outcomes: Vec<_> = futures_util::stream::iter(due)
            .map(|record| fire_due(app, record, now))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut fired = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            match outcome {
                Ok(f) => fired.push(f),
                Err(e) => tracing::warn!(code = e.code(), error = %e, "a schedule could not be fired"),
            }
        }
        let advances: Vec<_> = fired.iter().filter_map(|f| f.advance.clone()).collect();
        let mut won = app.store.schedule_update_many(advances).await?.into_iter();
        let mut fires = Vec::new();
        for mut f in fired {
            if f.advance.is_some() && !won.next().unwrap_or(false) {
                // Another node (or a PATCH) moved it first: keep only the
                // truth this node made, the operations it started.
                f.fires.retain(|fire| fire.operation_id.is_some());
            } else if f.advance.is_some() {
                dealt += 1;
            }
            fires.extend(f.fires);
        }
        app.store.schedule_fires_record(fires, fires_kept(app, now)).await?;
        if !full {
            break;
        }
    }
    if dealt > 0 {
        metrics::counter!("longrun_schedules_fired_total").increment(dealt);
    }
    Ok(dealt)
}

/// Fires due schedules every `config.interval` until `shutdown`.
pub(crate) async fn run(app: AppState, config: Config, shutdown: CancellationToken) {
    longrun_engine::services::run::run_every("firing schedules", config.interval, shutdown, || round(&app)).await;
}
