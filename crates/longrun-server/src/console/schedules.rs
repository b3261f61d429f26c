//! The console's schedule pages: the tenant's schedules with their next
//! firing times, and a schedule with its definition, its recent firings
//! (each linked to its operation) and pause/resume (a form under the
//! session's CSRF token, sent with the version the page showed).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use longrun_api::SchedulePatch;
use longrun_core::{Id, IdKind};
use maud::html;
use serde::Deserialize;

use super::pages::layout;
use super::{OrPage, PageResult, Posted, Viewer, check_form, error_page, page};
use crate::app::ApiError;
use crate::app::AppState;
use crate::app::schedules;

/// Schedules a page shows, and firings of one.
const SHOWN: u32 = 100;

#[derive(Debug, Deserialize)]
pub(crate) struct TenantQuery {
    tenant: Option<String>,
}

/// The tenant a schedule page is about: a client's own; for an admin, the
/// one asked for (`?tenant=`), else its own.
fn tenant(viewer: &Viewer, requested: Option<&str>) -> String {
    viewer.scope(requested).unwrap_or_else(|| viewer.tenant.clone())
}

fn schedule_id(raw: &str) -> Result<Id, ApiError> {
    Id::parse(IdKind::Schedule, raw).ok_or(ApiError::NotFound)
}

fn link(id: &str, tenant: &str, viewer: &Viewer) -> String {
    if viewer.is_admin() {
        format!("/ui/schedules/{id}?tenant={tenant}")
    } else {
        format!("/ui/schedules/{id}")
    }
}

pub(crate) async fn list(State(app): State<AppState>, viewer: Viewer, Query(q): Query<TenantQuery>) -> PageResult {
    let tenant = tenant(&viewer, q.tenant.as_deref());
    let records = app.store.schedule_list(&tenant, None, SHOWN).await.or_page(&viewer)?;
    let mut bodies = Vec::with_capacity(records.len());
    for record in &records {
        bodies.push(schedules::body(record).or_page(&viewer)?);
    }
    let body = html! {
        h1 { "Schedules" }
        @if viewer.is_admin() { p.muted { "Tenant " code { (tenant) } " (add ?tenant=NAME for another)." } }
        @if bodies.is_empty() {
            p.muted { "No schedules. Create one with " code { "POST /v1/schedules" } " or " code { "longrun schedules create" } "." }
        } @else {
            table id="schedules" {
                thead { tr { th { "schedule" } th { "kind" } th { "cron" } th { "overlap" } th { "next firing" } th { "latest firing" } } }
                tbody { @for s in &bodies {
                    tr data-id=(s.id) {
                        td { a href=(link(&s.id, &tenant, &viewer)) { code { (s.id) } } }
                        td { (s.kind) }
                        td { code { (s.cron) } " " span.muted { (s.time_zone) } }
                        td { (format!("{:?}", s.overlap).to_lowercase()) }
                        td data-field="next" {
                            @if s.paused { span.warning { "paused" } }
                            @else { (s.next_fire_times.first().map_or("none", String::as_str)) }
                        }
                        td { @if let Some(op) = &s.last_operation_id { a href={"/ui/operations/" (op)} { code { (op) } } } }
                    }
                } }
            }
            @if bodies.len() as u32 == SHOWN { p.muted { "The first " (SHOWN) " schedules." } }
        }
    };
    Ok(page(StatusCode::OK, layout("Schedules", Some(&viewer), body)))
}

pub(crate) async fn show(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(q): Query<TenantQuery>,
) -> PageResult {
    let tenant = tenant(&viewer, q.tenant.as_deref());
    let id = schedule_id(&id).or_page(&viewer)?;
    Ok(schedule_page(&app, &viewer, &tenant, &id, None).await)
}

/// A schedule's page; with `conflict`, above it the change that was refused.
async fn schedule_page(app: &AppState, viewer: &Viewer, tenant: &str, id: &Id, conflict: Option<ApiError>) -> Response {
    let record = match app.store.schedule_get(tenant, id).await {
        Ok(Some(record)) => record,
        Ok(None) => return error_page(Some(viewer), ApiError::NotFound),
        Err(e) => return error_page(Some(viewer), e.into()),
    };
    let (s, fires) = match (schedules::body(&record), app.store.schedule_fires(id, SHOWN).await) {
        (Ok(s), Ok(fires)) => (s, fires),
        (Err(e), _) => return error_page(Some(viewer), e),
        (_, Err(e)) => return error_page(Some(viewer), e.into()),
    };
    let body = html! {
        h1 { "Schedule " code { (s.id) } " " span data-field="paused" { @if s.paused { "paused" } @else { "active" } } }
        @if let Some(e) = &conflict {
            p.alert id="conflict" role="alert" { "Not applied: " (e.code()) " — " (e.to_string()) }
        }
        table.fields {
            tr { th { "kind" } td { (s.kind) } }
            tr { th { "cron" } td id="cron" { code { (s.cron) } " in " (s.time_zone) } }
            tr { th { "overlap" } td { (format!("{:?}", s.overlap).to_lowercase()) } }
            tr { th { "catch-up window" } td { (s.catchup_window) " s" } }
            tr { th { "priority" } td { (s.priority) " of 1–9" } }
            @if let Some(input) = &s.input { tr { th { "input" } td { code { (input) } } } }
            tr { th { "version" } td { (s.version) } }
        }
        section {
            h2 { "Next firings" }
            @if s.next_fire_times.is_empty() { p.muted id="next" { "None while paused." } }
            @else { ol id="next" { @for t in &s.next_fire_times { li { (t) } } } }
            form method="post" action={"/ui/schedules/" (s.id) "/paused" @if viewer.is_admin() { "?tenant=" (tenant) }} id="toggle" {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="version" value=(s.version);
                input type="hidden" name="paused" value=(if s.paused { "false" } else { "true" });
                button type="submit" { @if s.paused { "Resume" } @else { "Pause" } " (at version " (s.version) ")" }
            }
        }
        section {
            h2 { "Recent firings" }
            @if fires.is_empty() { p.muted { "None yet." } }
            @else {
                table id="fires" {
                    thead { tr { th { "firing time" } th { "decision" } th { "operation" } } }
                    tbody { @for f in &fires {
                        tr {
                            td { (f.fire_time.to_rfc3339()) }
                            td data-field="decision" { (f.decision.as_str()) }
                            td { @if let Some(op) = &f.operation_id { a href={"/ui/operations/" (op)} { code { (op) } } } }
                        }
                    } }
                }
            }
        }
    };
    let status = if conflict.is_some() {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    page(status, layout("Schedule", Some(viewer), body))
}

#[derive(Debug, Deserialize)]
pub(crate) struct PausedForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    /// The version the page showed: the change's `If-Match`.
    version: i64,
    paused: bool,
}

pub(crate) async fn set_paused(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<TenantQuery>,
    Posted(form): Posted<PausedForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    let tenant = tenant(&viewer, q.tenant.as_deref());
    let id = schedule_id(&id).or_page(&viewer)?;
    let patch = SchedulePatch {
        paused: Some(form.paused),
        ..Default::default()
    };
    match schedules::update(&app, &tenant, &id, form.version, patch).await {
        Ok(_) => Ok(Redirect::to(&link(id.as_str(), &tenant, &viewer)).into_response()),
        // A stale page is shown against what the schedule is now.
        Err(e @ ApiError::PreconditionFailed { .. }) => Err(schedule_page(&app, &viewer, &tenant, &id, Some(e)).await),
        Err(e) => Err(error_page(Some(&viewer), e)),
    }
}
