//! Which events of a history are kept as rows, and how a read gives back
//! the ones that are not.
//!
//! Two events of nearly every operation say nothing its row does not: the
//! `created` event of work submitted with nothing but defaults (version 1,
//! `queued`, at `created_at`, data `{}`, a snapshot of `{}`), and the
//! terminal event (the last version, its state, at `updated_at`, the row's
//! error as its data, and the row itself as its representation: a terminal
//! operation never changes again). They made two of the three rows a
//! one-step job wrote into the largest table the job path writes, with
//! their key entries (docs/scaling.md, bytes per operation). They are not
//! written; a read that finds them missing derives them from the row it
//! reads anyway ([`with_derived`]). Any other event, and these two when
//! they carry more than the row can say, are kept as rows; a row written
//! before reads back as written.
//!
//! The `started` event of a first attempt keeps its row, but not its
//! snapshot when that says only what the event's own columns do (the
//! attempt of its data, and `started_at` at its time): the column is
//! `NULL` and `shared::implied_snapshot` gives it back ([`event_row`]).

use longrun_core::{State, Timestamp};
use serde_json::{Value, json};

use super::EventType;
use crate::shared::{event_snapshot, snapshot_from_json};
use crate::{Event, Operation};

/// The data of an operation's terminal event: its error, if it has one.
pub(crate) fn ended_data(op: &Operation) -> Value {
    match &op.error {
        Some(e) => json!({"error": {"code": e.code, "message": e.message, "retryable": e.retryable}}),
        None => json!({}),
    }
}

/// How an event is written as a row: the row's snapshot column.
#[derive(Debug, PartialEq)]
pub(crate) struct EventRow {
    /// `None` for a terminal event (the row is its representation, see
    /// `shared::event_snapshot`) and where `shared::implied_snapshot` gives it back.
    pub snapshot: Option<String>,
}

/// Whether and how the event `event_type` with `data`, recorded as `op`
/// became (its version, state and `updated_at`), is written: `None` when
/// the row says all of it and [`with_derived`] gives it back. Decided once
/// for every store and statement that records events; the snapshot is
/// made once.
pub(crate) fn event_row(op: &Operation, event_type: EventType, data: &Value) -> Option<EventRow> {
    if let EventType::Ended(state) = event_type
        && state == op.state
        && state.is_terminal()
        && *data == ended_data(op)
    {
        return None;
    }
    let snapshot = event_snapshot(op);
    // What the event's own columns and the row say of the snapshot.
    let said_by_columns = |s: &str| match event_type {
        EventType::Created => {
            s == "{}"
                && op.version == 1
                && op.state == State::Queued
                && op.updated_at == op.created_at
                && is_empty_object(data)
        }
        EventType::Started => {
            op.started_at == Some(op.updated_at)
                && data.get("attempt").and_then(Value::as_i64) == Some(op.attempt)
                && s == format!("{{\"attempt\":{},\"started_at\":{}}}", op.attempt, op.updated_at.0)
        }
        _ => false,
    };
    match (event_type, snapshot.as_deref().is_some_and(said_by_columns)) {
        (EventType::Created, true) => None,
        (_, true) => Some(EventRow { snapshot: None }),
        _ => Some(EventRow { snapshot }),
    }
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(serde_json::Map::is_empty)
}

/// The kept events of an operation (by its `seq`, `?1`, read with its
/// row by `shared::OPERATION_FOR_HISTORY`) after version `?2`, at most
/// `?3`, in version order: what [`with_derived`] completes. One statement
/// for both stores (PostgreSQL's spelling by `shared::pg`).
pub(crate) const EVENTS_AFTER: &str = "SELECT version, type, state, at, data, snapshot FROM operation_events
      WHERE op_seq = ?1 AND version > ?2 ORDER BY version LIMIT ?3";

/// `stored`, the kept events of `row` after version `after` (at most
/// `limit`, in version order; [`EVENTS_AFTER`]), with the events that were
/// not kept put back in their places, at most `limit` in all. `replay`
/// gives each its snapshot as the stored ones have theirs.
///
/// The `created` event is missing when the first kept event after
/// `after < 1` is not version 1; the terminal one when `row` has ended
/// and nothing kept reaches its version, which is known only when fewer
/// than `limit` were found (else the page is full before it anyway).
pub(crate) fn with_derived(
    mut stored: Vec<Event>,
    row: &Operation,
    after: i64,
    limit: i64,
    replay: bool,
) -> Vec<Event> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let all_found = stored.len() < limit;
    if after < 1 && stored.first().is_none_or(|e| e.version > 1) {
        let created = derived(
            row,
            1,
            EventType::Created,
            State::Queued,
            row.created_at,
            json!({}),
            replay,
        );
        stored.insert(0, created);
    }
    let last = stored.last().map_or(after, |e| e.version.max(after));
    if all_found && row.state.is_terminal() && row.version > last {
        let ended = derived(
            row,
            row.version,
            EventType::Ended(row.state),
            row.state,
            row.updated_at,
            ended_data(row),
            replay,
        );
        stored.push(ended);
    }
    stored.truncate(limit);
    stored
}

fn derived(
    row: &Operation,
    version: i64,
    event_type: EventType,
    state: State,
    at: Timestamp,
    data: Value,
    replay: bool,
) -> Event {
    // What the kept row would have held as its snapshot: `{}` for a
    // created event, none (the row is the representation) for an ending.
    let kept = (event_type == EventType::Created).then(|| json!({}));
    Event {
        operation_id: row.id.clone(),
        version,
        event_type: event_type.as_str().to_owned(),
        state,
        at,
        data,
        snapshot: replay
            .then(|| snapshot_from_json(kept.as_ref(), row, version, state, at))
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::snapshot_text;

    fn kept(op: &Operation, event_type: EventType, data: &Value) -> bool {
        event_row(op, event_type, data).is_some()
    }

    fn snapshot_column(op: &Operation, event_type: EventType, data: &Value) -> Option<String> {
        event_row(op, event_type, data).and_then(|row| row.snapshot)
    }
    use longrun_core::task::OperationError;

    fn fresh() -> Operation {
        let params = crate::conformance::accept_params("t1", "k", Some("key-1"), json!({"n": 1}));
        crate::shared::created_operation(&params)
    }

    fn stored(op: &Operation, event_type: EventType, data: Value) -> Event {
        Event {
            operation_id: op.id.clone(),
            version: op.version,
            event_type: event_type.as_str().to_owned(),
            state: op.state,
            at: op.updated_at,
            data,
            snapshot: snapshot_from_json(
                event_snapshot(op).map(|s| serde_json::from_str(&s).unwrap()).as_ref(),
                op,
                op.version,
                op.state,
                op.updated_at,
            ),
        }
    }

    /// The one-step job: created (not kept), started (kept), succeeded
    /// (not kept); and the history read back is the one a store that kept
    /// all three gives, snapshots included, page by page.
    #[test]
    fn a_read_gives_back_what_was_not_kept_as_if_it_had_been() {
        let created = fresh();
        assert!(!kept(&created, EventType::Created, &json!({})));
        let mut started = created.clone();
        (started.version, started.state, started.attempt) = (2, State::Running, 1);
        let t = started.created_at.0;
        (started.started_at, started.updated_at) = (Some(Timestamp(t + 1)), Timestamp(t + 1));
        let start_data = json!({"attempt": 1, "worker": "w"});
        assert!(kept(&started, EventType::Started, &start_data));
        let mut ended = started.clone();
        (ended.version, ended.state, ended.updated_at) = (3, State::Failed, Timestamp(t + 2));
        ended.completed_at = Some(Timestamp(t + 2));
        ended.error = Some(OperationError {
            code: "boom".into(),
            message: "it broke".into(),
            retryable: false,
        });
        assert!(!kept(&ended, EventType::Ended(State::Failed), &ended_data(&ended)));
        assert!(kept(&ended, EventType::Ended(State::Failed), &json!({"other": 1})));

        let all = [
            stored(&created, EventType::Created, json!({})),
            stored(&started, EventType::Started, start_data.clone()),
            stored(&ended, EventType::Ended(State::Failed), ended_data(&ended)),
        ];
        let kept = vec![all[1].clone()];
        for after in 0..=3 {
            for limit in 1..=4 {
                let want: Vec<Event> = all.iter().filter(|e| e.version > after).take(limit).cloned().collect();
                let found: Vec<Event> = kept.iter().filter(|e| e.version > after).take(limit).cloned().collect();
                assert_eq!(
                    with_derived(found, &ended, after, limit as i64, true),
                    want,
                    "after {after}, limit {limit}"
                );
            }
        }
        // Without snapshots, the same events.
        let plain: Vec<Event> = all.iter().cloned().map(|e| Event { snapshot: None, ..e }).collect();
        let kept_plain = vec![plain[1].clone()];
        assert_eq!(with_derived(kept_plain, &ended, 0, i64::MAX, false), plain);
        // A row still running has no terminal event to give back.
        assert_eq!(with_derived(kept, &started, 0, 10, true), all[..2].to_vec());
    }

    /// A first start's snapshot is left out and given back the same; one
    /// that says more (a retry's, labelled work's) is kept.
    #[test]
    fn a_first_starts_snapshot_is_implied_by_its_columns() {
        let mut started = fresh();
        let t = started.created_at.0 + 1;
        (started.version, started.state, started.attempt) = (2, State::Running, 1);
        (started.started_at, started.updated_at) = (Some(Timestamp(t)), Timestamp(t));
        let data = json!({"attempt": 1, "worker_id": "w"});
        assert_eq!(snapshot_column(&started, EventType::Started, &data), None);
        let full: Value = serde_json::from_str(&snapshot_text(&started)).unwrap();
        let implied = crate::shared::implied_snapshot("started", &data, started.updated_at);
        assert_eq!(implied.as_ref(), Some(&full));
        let read = |v: Option<&Value>| snapshot_from_json(v, &started, 2, State::Running, started.updated_at);
        assert_eq!(read(implied.as_ref()), read(Some(&full)));
        assert_eq!(
            crate::shared::implied_snapshot("progress", &data, started.updated_at),
            None
        );

        let mut retry = started.clone();
        (retry.version, retry.attempt, retry.updated_at) = (4, 2, Timestamp(t + 5));
        let retry_data = json!({"attempt": 2, "worker_id": "w"});
        assert!(snapshot_column(&retry, EventType::Started, &retry_data).is_some());
        let mut labelled = started.clone();
        labelled.labels.insert("team".into(), "a".into());
        assert!(snapshot_column(&labelled, EventType::Started, &data).is_some());
        assert!(snapshot_column(&started, EventType::Progress, &data).is_some());
    }

    #[test]
    fn what_the_row_cannot_say_is_kept() {
        let mut labelled = fresh();
        labelled.labels.insert("team".into(), "a".into());
        assert!(kept(&labelled, EventType::Created, &json!({})));
        assert!(kept(&fresh(), EventType::Created, &json!({"rerun_of": "x"})));
        let mut later = fresh();
        later.version = 2;
        assert!(kept(&later, EventType::Created, &json!({})));
        for t in [
            EventType::Started,
            EventType::Progress,
            EventType::Updated,
            EventType::Paused,
        ] {
            assert!(kept(&fresh(), t, &json!({})));
        }
        // Stored rows read back as stored: nothing is derived over them.
        let op = fresh();
        let kept = stored(&op, EventType::Created, json!({"note": 1}));
        assert_eq!(
            with_derived(vec![kept.clone()], &op, 0, 10, false)[0].data,
            json!({"note": 1})
        );
    }
}
