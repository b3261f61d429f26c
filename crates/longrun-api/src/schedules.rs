//! Schedules (docs/schedules.md): the definition a client posts and
//! patches, the schedule as read, and its firing records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::de::{object, present, present_whole_number, whole_number};
use crate::operations::labels_schema;
use crate::{BudgetRequest, CallbackRequest};

/// What a schedule does with a firing while the previous firing's
/// operation has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverlapBody {
    /// Skip it (recorded as `skipped`).
    #[default]
    Skip,
    /// Start the first such firing once the running one ends; skip the rest.
    BufferOne,
    /// Start it anyway.
    Allow,
}

/// `POST /v1/schedules`: what to submit, and when. Each firing submits
/// `kind`, `input`, `labels`, `callback`, `deadline_seconds`, `budget` and
/// `priority` as `POST /v1/operations` would, with the idempotency key
/// `schedule:{id}:{fire_time}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// The kind of work each firing submits.
    #[schema(pattern = "^[a-z0-9][a-z0-9_.-]{0,63}$", example = "report")]
    pub kind: String,
    /// The input of each firing; `null` is the same as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// 5-field cron (`minute hour day-of-month month day-of-week`), a
    /// shorthand (`@daily`, `@hourly`, …) or `@every 15m`.
    #[schema(example = "0 2 * * *")]
    pub cron: String,
    /// The IANA time zone the cron is read in; `UTC` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "Europe/Berlin")]
    pub time_zone: Option<String>,
    /// `skip` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<OverlapBody>,
    /// Seconds: a firing missed while no node ran still starts if it is
    /// at most this old; 3600 when left out.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2_592_000)]
    pub catchup_window: Option<u64>,
    /// Labels of each firing's operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Where each firing's operation sends its webhooks.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRequest>,
    /// Each firing's deadline, in seconds from its creation.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<u64>,
    /// Each firing's budget.
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRequest>,
    /// Each firing's priority, 1–9; 5 when left out.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<u64>,
    /// Created paused (no firing until resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// `PATCH /v1/schedules/{id}` under `If-Match`: each field given replaces
/// the schedule's; `null` removes `callback`, `deadline_seconds`, `budget`
/// and `time_zone` (back to UTC). A new `cron` or `time_zone`, or a resume,
/// counts the next firing from now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulePatch {
    /// `true` pauses (no firing), `false` resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// A new cadence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// A new time zone; `null`: UTC.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub time_zone: Option<Option<String>>,
    /// A new overlap policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<OverlapBody>,
    /// A new catch-up window, in seconds.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 2_592_000)]
    pub catchup_window: Option<u64>,
    /// A new input for later firings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// New labels, replaced whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// A new callback; `null` removes it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<CallbackRequest>)]
    pub callback: Option<Option<CallbackRequest>>,
    /// A new deadline; `null` removes it.
    #[serde(
        default,
        deserialize_with = "present_whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000)]
    pub deadline_seconds: Option<Option<u64>>,
    /// A new budget; `null` removes it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BudgetRequest>)]
    pub budget: Option<Option<BudgetRequest>>,
    /// A new priority, 1–9.
    #[serde(default, deserialize_with = "whole_number", skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9)]
    pub priority: Option<u64>,
}

/// A schedule as clients read it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleBody {
    /// `sch_…`, opaque.
    pub id: String,
    /// Moves by one with every change (each firing's too); the ETag.
    pub version: i64,
    /// Whether it is paused.
    pub paused: bool,
    /// The kind each firing submits.
    pub kind: String,
    /// Each firing's input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The cadence, as given.
    pub cron: String,
    /// The time zone the cron is read in.
    pub time_zone: String,
    /// The overlap policy.
    pub overlap: OverlapBody,
    /// The catch-up window, in seconds.
    pub catchup_window: u64,
    /// Each firing's labels.
    pub labels: BTreeMap<String, String>,
    /// Each firing's callback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRequest>,
    /// Each firing's deadline, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    /// Each firing's budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRequest>,
    /// Each firing's priority.
    pub priority: u64,
    /// The next five firing times (RFC 3339); empty while paused.
    pub next_fire_times: Vec<String>,
    /// The operation of the latest firing that started one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_operation_id: Option<String>,
    /// When it was created.
    pub created_at: String,
    /// When it last changed.
    pub updated_at: String,
}

/// `GET /v1/schedules`: a keyset page in id order (creation order to the millisecond).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleList {
    /// The page.
    pub schedules: Vec<ScheduleBody>,
    /// The next page's `page_token`, when there may be one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// `POST /v1/schedules/{id}/backfill`: fire every time of the cadence in
/// `[start, end]` (RFC 3339; at most 1,000 times, none in the future).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first instant of the range.
    #[schema(format = DateTime, example = "2026-12-01T00:00:00Z")]
    pub start: String,
    /// The last instant of the range (not after now).
    #[schema(format = DateTime, example = "2026-12-05T00:00:00Z")]
    pub end: String,
}

/// What one firing time became.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleFireBody {
    /// The firing time (a trigger's: when it was asked), RFC 3339.
    pub fire_time: String,
    /// The operation it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// `started`, `triggered`, `backfilled`, `buffered`, `skipped`, `missed` or `refused`.
    pub decision: String,
}

/// `GET /v1/schedules/{id}/fires`: recent firing records, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleFires {
    /// The records.
    pub fires: Vec<ScheduleFireBody>,
}
