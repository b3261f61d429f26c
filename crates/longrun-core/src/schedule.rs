//! When a schedule fires: a 5-field cron expression read in a time zone, or
//! a fixed interval (`@every 15m`), and the idempotency key that makes each
//! firing exactly one operation however many nodes try it.
//!
//! Cron follows Vixie cron, DST included:
//!
//! - fields `minute hour day-of-month month day-of-week`, each `*`, a
//!   number, a range `a-b`, a step `*/n` or `a-b/n`, or a list of these;
//!   months and weekdays also by name (`jan`, `mon`); Sunday is 0 or 7;
//! - when both day fields are restricted, a day matches either (as cron);
//! - `@hourly`, `@daily` (`@midnight`), `@weekly`, `@monthly`, `@yearly`
//!   (`@annually`);
//! - a local time the clocks skip (spring forward) fires once, at the first
//!   instant after the change; a local time that happens twice (fall back)
//!   fires once, the first time.
//!
//! `@every D` (`30s`, `15m`, `2h`, `1d`, at least one second) fires at the
//! multiples of D since the Unix epoch, so every node computes the same
//! times; it ignores the time zone.

use std::str::FromStr;
use std::time::Duration;

use chrono::{Datelike, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Timelike};
use chrono_tz::Tz;

use crate::clock::Timestamp;

/// How many years ahead a search for the next cron time looks before it
/// says there is none (`0 0 30 2 *`, the 30th of February, never comes).
const SEARCH_YEARS: i32 = 5;

/// A schedule's cadence, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cadence {
    /// A cron expression in a time zone.
    Cron(Box<Cron>),
    /// A fixed interval, in milliseconds, from the epoch.
    Every(i64),
}

/// A 5-field cron expression and the zone it is read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    days_restricted: bool,
    weekdays_restricted: bool,
    zone: Tz,
}

/// Why a cadence is refused; the text names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidCadence(String);

impl Cadence {
    /// Parses `cron` (5 fields, a `@` shorthand, or `@every D`) read in
    /// `time_zone` (an IANA name; `UTC` when absent).
    pub fn parse(cron: &str, time_zone: Option<&str>) -> Result<Cadence, InvalidCadence> {
        let zone = match time_zone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name)
                .map_err(|_| InvalidCadence(format!("time_zone {name:?} is not an IANA time zone name")))?,
        };
        let text = cron.trim();
        if let Some(every) = text.strip_prefix("@every") {
            let d = crate::duration::parse_duration(every.trim())
                .map_err(|e| InvalidCadence(format!("cron {text:?}: the interval: {e}")))?;
            if d < Duration::from_secs(1) {
                return Err(InvalidCadence(format!(
                    "cron {text:?}: the interval is shorter than 1s"
                )));
            }
            return Ok(Cadence::Every(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
        }
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(InvalidCadence(format!("cron {other:?}: no such shorthand")));
            }
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(InvalidCadence(format!(
                "cron {text:?} has {} fields; it needs 5 (minute hour day-of-month month day-of-week)",
                fields.len()
            )));
        }
        let minutes = field(fields[0], "minute", 0, 59, &[])?;
        let hours = field(fields[1], "hour", 0, 23, &[])?;
        let days = field(fields[2], "day-of-month", 1, 31, &[])?;
        let months = field(fields[3], "month", 1, 12, &MONTHS)?;
        let mut weekdays = field(fields[4], "day-of-week", 0, 7, &WEEKDAYS)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        Ok(Cadence::Cron(Box::new(Cron {
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: weekdays as u8,
            days_restricted: !fields[2].starts_with('*'),
            weekdays_restricted: !fields[4].starts_with('*'),
            zone,
        })))
    }

    /// The first firing strictly after `after`, if there is one within the
    /// search horizon.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        match self {
            Cadence::Every(step) => Some(Timestamp((after.0.div_euclid(*step) + 1) * step)),
            Cadence::Cron(cron) => cron.next_after(after),
        }
    }

    /// Up to `n` firings after `after`, in order.
    pub fn next_n(&self, after: Timestamp, n: usize) -> Vec<Timestamp> {
        let mut times = Vec::with_capacity(n);
        let mut at = after;
        while times.len() < n {
            let Some(next) = self.next_after(at) else { break };
            times.push(next);
            at = next;
        }
        times
    }
}

impl Cron {
    fn day_matches(&self, date: NaiveDate) -> bool {
        let day = self.days & (1 << date.day()) != 0;
        let weekday = self.weekdays & (1 << date.weekday().num_days_from_sunday()) != 0;
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day || weekday,
            _ => day && weekday,
        }
    }

    fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let after_utc = chrono::DateTime::from_timestamp_millis(after.0)?;
        let local = after_utc.with_timezone(&self.zone).naive_local();
        let mut date = local.date();
        let last = date.with_year(date.year() + SEARCH_YEARS).unwrap_or(NaiveDate::MAX);
        while date <= last {
            if self.day_matches(date) {
                for hour in (0..24).filter(|h| self.hours & (1 << h) != 0) {
                    for minute in (0..60).filter(|m| self.minutes & (1 << m) != 0) {
                        let naive = date.and_hms_opt(hour, minute, 0)?;
                        // A candidate before the start's wall-clock minute
                        // can still be later than `after` only across a
                        // fall-back; `resolve` maps it and the check below
                        // decides, so nothing is skipped or repeated.
                        if naive.date() == local.date() && naive < local.with_second(0)?.with_nanosecond(0)? {
                            continue;
                        }
                        let at = self.resolve(naive)?;
                        if at > after {
                            return Some(at);
                        }
                    }
                }
            }
            date = date.succ_opt()?;
        }
        None
    }

    /// The instant a local wall-clock minute names: the first of two in a
    /// fall-back, the first instant after the change in a spring-forward gap.
    fn resolve(&self, naive: NaiveDateTime) -> Option<Timestamp> {
        let mut probe = naive;
        for _ in 0..(26 * 60) {
            match self.zone.from_local_datetime(&probe) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                    return Some(Timestamp(t.timestamp_millis()));
                }
                LocalResult::None => probe += chrono::Duration::minutes(1),
            }
        }
        None
    }
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field as a bit set of the values it allows.
fn field(text: &str, name: &str, min: u32, max: u32, names: &[&str]) -> Result<u64, InvalidCadence> {
    let bad = |why: &str| InvalidCadence(format!("cron field {name} {text:?}: {why}"));
    let value = |v: &str| -> Result<u32, InvalidCadence> {
        let lower = v.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            // Months are named from 1, weekdays from 0.
            return Ok(i as u32 + min);
        }
        let n: u32 = v.parse().map_err(|_| bad(&format!("{v:?} is not a number")))?;
        if n < min || n > max {
            return Err(bad(&format!("{n} is outside {min}-{max}")));
        }
        Ok(n)
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| bad("the step is not a number"))?;
                if step == 0 {
                    return Err(bad("the step is 0"));
                }
                (range, step)
            }
            None => (part, 1),
        };
        let (low, high) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                None if step > 1 => (value(r)?, max),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if low > high {
            return Err(bad(&format!("the range {low}-{high} runs backwards")));
        }
        bits |= (low..=high).step_by(step as usize).fold(0u64, |b, v| b | (1 << v));
    }
    Ok(bits)
}

/// The idempotency key of a schedule's firing at `fire_time`: the same on
/// every node, so trying a firing twice makes one operation.
pub fn firing_key(schedule_id: &str, fire_time: Timestamp) -> String {
    format!("schedule:{schedule_id}:{}", fire_time.to_rfc3339())
}

/// The schedule whose firing an operation with this idempotency key is
/// (the one rule that says an operation came from a schedule).
pub fn schedule_id_of_key(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("schedule:")?;
    let (id, _) = rest.split_once(':')?;
    id.starts_with("sch_").then_some(id)
}

/// What a schedule does with a firing while its previous firing's
/// operation has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Skip the firing (recorded as `skipped`).
    Skip,
    /// Keep the first such firing and start it once the running one ends;
    /// skip the rest.
    BufferOne,
    /// Start it anyway.
    Allow,
}

/// What the firing service knows of a schedule that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// Its next firing time (`None`: no further firing).
    pub next_fire_at: Option<Timestamp>,
    /// A firing held back by `buffer_one`.
    pub buffered: Option<Timestamp>,
    /// Whether its latest firing's operation has not ended yet.
    pub previous_live: bool,
}

/// One firing time, as the plan decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firing {
    /// Start an operation for it.
    Start(Timestamp),
    /// Start none; record why.
    Record(Timestamp, FireDecision),
}

/// What to do with a due schedule, and where it stands afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiringPlan {
    /// The firing times dealt with, in order.
    pub firings: Vec<Firing>,
    /// The next firing time after them.
    pub next_fire_at: Option<Timestamp>,
    /// The firing held back after them.
    pub buffered: Option<Timestamp>,
}

/// Decides a due schedule's firings at `now`, at most `max` of them (the
/// rest are due again next round):
///
/// - a firing held back by `buffer_one` starts once the previous ended;
/// - firing times older than `catchup` before `now` (every node was down)
///   are not started: the run of them is recorded as one `missed` at its
///   first time, and the schedule moves on to the first time inside the
///   window;
/// - each time inside the window starts an operation unless the previous
///   firing's operation is live (one started in this plan is): then `skip`
///   records `skipped`, `buffer_one` holds back the first such time and
///   skips the rest, and `allow` starts it anyway.
pub fn plan_firings(
    cadence: &Cadence,
    overlap: Overlap,
    catchup: Duration,
    due: Due,
    now: Timestamp,
    max: usize,
) -> FiringPlan {
    let mut firings = Vec::new();
    let mut live = due.previous_live;
    let mut buffered = due.buffered;
    if let Some(held) = buffered
        && !live
    {
        firings.push(Firing::Start(held));
        buffered = None;
        live = true;
    }
    let mut next = due.next_fire_at;
    let window_opens = now.minus(catchup);
    if let Some(first) = next.filter(|t| *t < window_opens) {
        firings.push(Firing::Record(first, FireDecision::Missed));
        // The first time inside the window (or after it, if none is due).
        next = cadence.next_after(Timestamp(window_opens.0 - 1));
    }
    while let Some(t) = next.filter(|t| *t <= now) {
        if firings.len() >= max {
            break;
        }
        let firing = match overlap {
            _ if !live => Firing::Start(t),
            Overlap::Allow => Firing::Start(t),
            Overlap::Skip => Firing::Record(t, FireDecision::Skipped),
            Overlap::BufferOne if buffered.is_none() => {
                buffered = Some(t);
                Firing::Record(t, FireDecision::Buffered)
            }
            Overlap::BufferOne => Firing::Record(t, FireDecision::Skipped),
        };
        live |= matches!(firing, Firing::Start(_));
        firings.push(firing);
        next = cadence.next_after(t);
    }
    FiringPlan {
        firings,
        next_fire_at: next,
        buffered,
    }
}

/// What became of one firing time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireDecision {
    /// It started an operation.
    Started,
    /// `POST /v1/schedules/{id}/trigger` started an operation.
    Triggered,
    /// `POST /v1/schedules/{id}/backfill` started an operation for a time
    /// that had none.
    Backfilled,
    /// Held back (`buffer_one`) until the running firing ends.
    Buffered,
    /// Skipped: the previous firing's operation had not ended.
    Skipped,
    /// Due while no node was running, and older than the catch-up window.
    Missed,
    /// The submission was refused for good (its kind is no longer
    /// declared, its input no longer valid, …); the server logs why.
    Refused,
}

impl FireDecision {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FireDecision::Started => "started",
            FireDecision::Triggered => "triggered",
            FireDecision::Backfilled => "backfilled",
            FireDecision::Buffered => "buffered",
            FireDecision::Skipped => "skipped",
            FireDecision::Missed => "missed",
            FireDecision::Refused => "refused",
        }
    }

    /// From the wire name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            FireDecision::Started,
            FireDecision::Triggered,
            FireDecision::Backfilled,
            FireDecision::Buffered,
            FireDecision::Skipped,
            FireDecision::Missed,
        ]
        .into_iter()
        .find(|d| d.as_str() == text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    fn times(cadence: &Cadence, after: &str, n: usize) -> Vec<String> {
        cadence
            .next_n(at(after), n)
            .into_iter()
            .map(Timestamp::to_rfc3339)
            .collect()
    }

    #[test]
    fn cron_fields_and_shorthands() {
        let c = Cadence::parse("*/15 9-10 * * mon-fri", None).unwrap();
        assert_eq!(
            times(&c, "2026-12-04T10:40:00Z", 3),
            [
                "2026-12-04T10:45:00.000Z",
                "2026-12-07T09:00:00.000Z",
                "2026-12-07T09:15:00.000Z"
            ]
        );
        let daily = Cadence::parse("@daily", None).unwrap();
        assert_eq!(times(&daily, "2026-12-05T00:00:00Z", 1), ["2026-12-06T00:00:00.000Z"]);
        // Sunday is 0 or 7.
        assert_eq!(Cadence::parse("0 0 * * 7", None), Cadence::parse("0 0 * * sun", None));
        // Both day fields restricted: either matches (the 13th, or a Friday).
        let c = Cadence::parse("0 12 13 * fri", None).unwrap();
        assert_eq!(
            times(&c, "2026-12-10T00:00:00Z", 3),
            [
                "2026-12-11T12:00:00.000Z",
                "2026-12-13T12:00:00.000Z",
                "2026-12-18T12:00:00.000Z"
            ]
        );
        // The 30th of February never comes.
        assert_eq!(
            Cadence::parse("0 0 30 2 *", None)
                .unwrap()
                .next_after(at("2026-01-01T00:00:00Z")),
            None
        );
    }

    #[test]
    fn every_counts_from_the_epoch() {
        let c = Cadence::parse("@every 15m", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            times(&c, "2026-12-05T10:07:12Z", 2),
            ["2026-12-05T10:15:00.000Z", "2026-12-05T10:30:00.000Z"]
        );
        assert_eq!(times(&c, "2026-12-05T10:15:00Z", 1), ["2026-12-05T10:30:00.000Z"]);
    }

    #[test]
    fn refusals_name_the_field() {
        for (cron, zone, says) in [
            ("* * * *", None, "has 4 fields"),
            ("60 * * * *", None, "minute"),
            ("* * 0 * *", None, "day-of-month"),
            ("* * * foo *", None, "month"),
            ("*/0 * * * *", None, "step is 0"),
            ("5-1 * * * *", None, "backwards"),
            ("@every 0s", None, "shorter than 1s"),
            ("@every soon", None, "interval"),
            ("@fortnightly", None, "shorthand"),
            ("* * * * *", Some("Mars/Olympus"), "time_zone"),
        ] {
            let e = Cadence::parse(cron, zone).unwrap_err().to_string();
            assert!(e.contains(says), "{cron}: {e}");
        }
    }

    #[test]
    fn a_time_the_clocks_skip_fires_once_just_after_the_change() {
        // Europe/Berlin springs from 02:00 to 03:00 on 2026-03-29.
        let c = Cadence::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            times(&c, "2026-03-28T00:00:00Z", 3),
            // 02:30 CET on the 28th; 03:00 CEST (01:00Z) on the 29th; 02:30 CEST after.
            [
                "2026-03-28T01:30:00.000Z",
                "2026-03-29T01:00:00.000Z",
                "2026-03-30T00:30:00.000Z"
            ]
        );
        // Every minute of the skipped hour lands on the same instant: once.
        let c = Cadence::parse("*/20 2-3 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            times(&c, "2026-03-29T00:30:00Z", 4),
            [
                "2026-03-29T01:00:00.000Z",
                "2026-03-29T01:20:00.000Z",
                "2026-03-29T01:40:00.000Z",
                "2026-03-30T00:00:00.000Z"
            ]
        );
    }

    #[test]
    fn a_time_that_happens_twice_fires_once() {
        // Europe/Berlin falls from 03:00 back to 02:00 on 2026-10-25.
        let c = Cadence::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            times(&c, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]
        );
        // Asked from inside the second pass of the hour, the next is the next day's.
        assert_eq!(times(&c, "2026-10-25T01:10:00Z", 1), ["2026-10-26T01:30:00.000Z"]);
        // An hourly schedule keeps its hourly firings through the change.
        let hourly = Cadence::parse("0 * * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            times(&hourly, "2026-10-24T23:30:00Z", 3),
            [
                "2026-10-25T00:00:00.000Z",
                "2026-10-25T02:00:00.000Z",
                "2026-10-25T03:00:00.000Z"
            ]
        );
    }

    fn minute() -> Cadence {
        Cadence::parse("* * * * *", None).unwrap()
    }

    fn due(next: &str, previous_live: bool) -> Due {
        Due {
            next_fire_at: Some(at(next)),
            buffered: None,
            previous_live,
        }
    }

    #[test]
    fn due_times_start_in_order_and_the_schedule_moves_on() {
        let plan = plan_firings(
            &minute(),
            Overlap::Allow,
            Duration::from_secs(3600),
            due("2026-12-05T10:00:00Z", true),
            at("2026-12-05T10:02:30Z"),
            100,
        );
        assert_eq!(
            plan.firings,
            [
                Firing::Start(at("2026-12-05T10:00:00Z")),
                Firing::Start(at("2026-12-05T10:01:00Z")),
                Firing::Start(at("2026-12-05T10:02:00Z"))
            ]
        );
        assert_eq!(plan.next_fire_at, Some(at("2026-12-05T10:03:00Z")));
        // At most `max`; the rest stay due.
        let plan = plan_firings(
            &minute(),
            Overlap::Allow,
            Duration::from_secs(3600),
            due("2026-12-05T10:00:00Z", false),
            at("2026-12-05T10:02:30Z"),
            2,
        );
        assert_eq!(plan.firings.len(), 2);
        assert_eq!(plan.next_fire_at, Some(at("2026-12-05T10:02:00Z")));
    }

    #[test]
    fn overlap_policies_decide_what_a_live_firing_does_to_the_next() {
        let now = at("2026-12-05T10:02:30Z");
        let window = Duration::from_secs(3600);
        let skip = plan_firings(
            &minute(),
            Overlap::Skip,
            window,
            due("2026-12-05T10:00:00Z", false),
            now,
            100,
        );
        assert_eq!(
            skip.firings,
            [
                Firing::Start(at("2026-12-05T10:00:00Z")),
                Firing::Record(at("2026-12-05T10:01:00Z"), FireDecision::Skipped),
                Firing::Record(at("2026-12-05T10:02:00Z"), FireDecision::Skipped)
            ]
        );
        let buffer = plan_firings(
            &minute(),
            Overlap::BufferOne,
            window,
            due("2026-12-05T10:00:00Z", true),
            now,
            100,
        );
        assert_eq!(
            buffer.firings,
            [
                Firing::Record(at("2026-12-05T10:00:00Z"), FireDecision::Buffered),
                Firing::Record(at("2026-12-05T10:01:00Z"), FireDecision::Skipped),
                Firing::Record(at("2026-12-05T10:02:00Z"), FireDecision::Skipped)
            ]
        );
        assert_eq!(buffer.buffered, Some(at("2026-12-05T10:00:00Z")));
        // Once the running one ends, the held-back firing starts first.
        let later = Due {
            next_fire_at: buffer.next_fire_at,
            buffered: buffer.buffered,
            previous_live: false,
        };
        let resumed = plan_firings(
            &minute(),
            Overlap::BufferOne,
            window,
            later,
            at("2026-12-05T10:03:10Z"),
            100,
        );
        assert_eq!(
            resumed.firings,
            [
                Firing::Start(at("2026-12-05T10:00:00Z")),
                Firing::Record(at("2026-12-05T10:03:00Z"), FireDecision::Buffered)
            ]
        );
        assert_eq!(resumed.buffered, Some(at("2026-12-05T10:03:00Z")));
    }

    #[test]
    fn times_missed_past_the_catchup_window_are_recorded_once_and_skipped() {
        // Down from 09:00 to 10:02:30; the window is 90 s.
        let plan = plan_firings(
            &minute(),
            Overlap::Allow,
            Duration::from_secs(90),
            due("2026-12-05T09:00:00Z", false),
            at("2026-12-05T10:02:30Z"),
            100,
        );
        assert_eq!(
            plan.firings,
            [
                Firing::Record(at("2026-12-05T09:00:00Z"), FireDecision::Missed),
                Firing::Start(at("2026-12-05T10:01:00Z")),
                Firing::Start(at("2026-12-05T10:02:00Z"))
            ]
        );
        // A window of none: only what is due this instant.
        let plan = plan_firings(
            &minute(),
            Overlap::Allow,
            Duration::ZERO,
            due("2026-12-05T09:00:00Z", false),
            at("2026-12-05T10:02:00Z"),
            100,
        );
        assert_eq!(
            plan.firings,
            [
                Firing::Record(at("2026-12-05T09:00:00Z"), FireDecision::Missed),
                Firing::Start(at("2026-12-05T10:02:00Z"))
            ]
        );
    }

    #[test]
    fn firing_keys_name_their_schedule() {
        let key = firing_key("sch_abc", at("2026-12-06T02:00:00Z"));
        assert_eq!(key, "schedule:sch_abc:2026-12-06T02:00:00.000Z");
        assert_eq!(schedule_id_of_key(&key), Some("sch_abc"));
        assert_eq!(schedule_id_of_key("nightly-2026-12-06"), None);
        assert_eq!(schedule_id_of_key("schedule:abc:x"), None);
    }
}
