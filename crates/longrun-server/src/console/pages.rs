//! The console's pages, rendered on the server with `maud` (every value
//! escaped). Each page reads through bounded store calls: one page of
//! operations by its keyset, one operation with its history and deliveries,
//! live leases, tenants, and counts the change feed keeps in memory — none
//! scans stored history, and none reads per row.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use longrun_core::apikey::Role;
use longrun_core::{Id, IdKind, State as OpState, Timestamp};
use longrun_store::{ListParams, Operation, Progress};
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;

use super::{OrPage, PageResult, Viewer, error_page, page, span, when};
use crate::app::ApiError;
use crate::app::AppState;
use crate::app::reads::{DEFAULT_PAGE_SIZE, decode_page_token, encode_page_token, idempotency_expires};
use crate::stats::{Counts, MINUTES};

/// The frame of every page: navigation, who is signed in, sign-out.
pub(crate) fn layout(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Longrun" }
                link rel="stylesheet" href="/ui/assets/console.css";
                script src="/ui/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/ui/" { "Longrun" }
                    @if let Some(v) = viewer {
                        nav {
                            a href="/ui/" { "Overview" }
                            a href="/ui/operations" { "Operations" }
                            a href="/ui/schedules" { "Schedules" }
                            a href="/ui/workers" { "Workers" }
                            @if v.is_admin() { a href="/ui/tenants" { "Tenants" } }
                        }
                        div.who {
                            span title="The key this session was opened with (its id, never its secret)" {
                                (v.role.as_str()) " · " (v.tenant) " · " code { (v.key_id) }
                            }
                            form method="post" action="/ui/sign-out" {
                                input type="hidden" name="csrf" value=(v.csrf);
                                button.link type="submit" id="sign-out" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub(crate) fn sign_in(next: &str, refusal: Option<&str>) -> Markup {
    let body = html! {
        section.sign-in {
            h1 { "Sign in" }
            p.muted { "With a client key (your tenant's work) or an admin key (every tenant). The key is checked and forgotten: the console keeps only a session." }
            @if let Some(why) = refusal { p.alert role="alert" { (why) } }
            form method="post" action="/ui/sign-in" {
                input type="hidden" name="next" value=(next);
                label for="key" { "API key" }
                input type="password" id="key" name="key" autocomplete="off" required;
                button type="submit" id="sign-in" { "Sign in" }
            }
        }
    };
    layout("Sign in", None, body)
}

fn state_badge(state: OpState) -> Markup {
    html! { span class={"state state-" (state.as_str())} data-field="state" { (state.as_str()) } }
}

fn progress_bar(progress: Option<&Progress>, state: OpState) -> Markup {
    let known = progress.and_then(|p| Some((p.completed_units?, p.total_units.filter(|t| *t > 0.0)?)));
    html! {
        @match known {
            Some((done, total)) => {
                progress value=(done) max=(total) {}
                span.muted { " " (done) " / " (total) " " (progress.and_then(|p| p.unit.clone()).unwrap_or_default()) }
            }
            None if state.is_terminal() => {}
            None => {
                // No total: an honest indeterminate bar, with what is known.
                progress {}
                span.muted {
                    " total unknown"
                    @if let Some(done) = progress.and_then(|p| p.completed_units) { " · " (done) " done" }
                }
            }
        }
        @if let Some(phase) = progress.and_then(|p| p.phase.clone()) { span.phase { " " (phase) } }
    }
}

// ---- overview ----------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(crate) struct TenantQuery {
    tenant: Option<String>,
}

pub(crate) async fn overview(State(app): State<AppState>, viewer: Viewer, Query(q): Query<TenantQuery>) -> PageResult {
    let scope = viewer.scope(q.tenant.as_deref());
    let now = app.clock.now();
    let active = app.store.active_summary(scope.clone()).await.or_page(&viewer)?;
    let pauses = app.acceptance_pauses().await.or_page(&viewer)?;
    let mut typical = BTreeMap::new();
    for group in &active {
        if !typical.contains_key(&group.kind) {
            typical.insert(
                group.kind.clone(),
                app.typical_duration(&group.kind).await.or_page(&viewer)?,
            );
        }
    }
    let backlog = if viewer.is_admin() {
        Some(app.store.backlog(now).await.or_page(&viewer)?)
    } else {
        None
    };
    let hour = app.stats.last_hour(scope.as_deref());
    let total = app.stats.hour_total(scope.as_deref());
    let body = html! {
        @if !pauses.is_empty() {
            section.banner role="alert" id="acceptance-paused" {
                strong { "Acceptance is paused" }
                @for pause in &pauses {
                    div {
                        @match pause { Some(kind) => { "for kind " code { (kind) } }, None => { "for every kind" } }
                        ": new submissions get 503 temporarily_unavailable. "
                        @if viewer.is_admin() {
                            form.inline method="post" action="/ui/accepting/resume" {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                input type="hidden" name="kind" value=(pause.clone().unwrap_or_default());
                                button type="submit" { "Resume accepting" }
                            }
                        }
                    }
                }
            }
        }
        h1 { "Overview" @if let Some(t) = &scope { " · " (t) } }
        (tenant_filter(&viewer, "/ui/", scope.as_deref()))
        section {
            h2 { "Work not yet ended" }
            @if active.is_empty() { p.muted { "Nothing is queued or running." } }
            @else {
                table {
                    thead { tr { th { "kind" } th { "state" } th.num { "count" } th { "oldest waiting" } th { "typical duration" } th {} } }
                    tbody {
                        @for group in &active {
                            @let age = now.since(group.oldest_created_at);
                            @let usual = typical.get(&group.kind).copied().flatten();
                            tr {
                                td { a href={"/ui/operations?kind=" (group.kind) "&state=" (group.state.as_str())} { (group.kind) } }
                                td { (state_badge(group.state)) }
                                td.num { (group.count) }
                                td { (span(age)) }
                                td { @match usual { Some(d) => (span(d)), None => span.muted { "not known yet" } } }
                                td {
                                    // The stuck-work alert of docs/operations.md: older than the kind usually takes.
                                    @if usual.is_some_and(|d| age > d.max(Duration::from_secs(1))) {
                                        span.warning title="The oldest is older than this kind usually takes to finish: see docs/operations.md, LongrunOldestOperationTooOld" { "older than usual" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        section {
            h2 { "The last hour" }
            p.muted { "Per minute, counted by this server from the change feed since it started." }
            div.charts {
                (chart("accepted", &hour, |c| c.accepted, total.accepted))
                (chart("succeeded", &hour, |c| c.succeeded, total.succeeded))
                (chart("failed", &hour, |c| c.failed, total.failed))
            }
            p {
                "Pickup latency (submit → first claim): "
                @match (total.pickup_quantile_ms(0.5), total.pickup_quantile_ms(0.99)) {
                    (Some(p50), Some(p99)) => { "p50 ≤ " (p50) " ms, p99 ≤ " (p99) " ms over " (total.pickups()) " pickups" }
                    _ => span.muted { "nothing picked up this hour" }
                }
            }
        }
        @if let Some(backlog) = backlog {
            section {
                h2 { "Webhooks and retention" }
                table.facts {
                    tr { th { "webhook events due now" } td id="webhooks-due" { (backlog.webhooks_due) } }
                    tr { th { "webhook events failing (retrying)" } td id="webhooks-failing" {
                        (backlog.webhooks_failing)
                        @if backlog.webhooks_failing > 0 { " " span.warning { "receivers are failing" } }
                    } }
                    tr { th { "records past retention, not yet removed" } td { (backlog.retention_due) } }
                    tr { th { "artifact objects waiting to be deleted" } td { (backlog.garbage_objects) } }
                }
            }
        }
    };
    Ok(page(StatusCode::OK, layout("Overview", Some(&viewer), body)))
}

/// A bar per minute, as SVG drawn here (no script needed).
fn chart(name: &str, hour: &[(Timestamp, Counts)], value: fn(&Counts) -> u64, total: u64) -> Markup {
    let (width, height) = (300u64, 60u64);
    let bar = width / MINUTES as u64;
    let max = hour.iter().map(|(_, c)| value(c)).max().unwrap_or(0).max(1);
    html! {
        figure.chart {
            figcaption { (name) " " strong { (total) } }
            svg class={"bars bars-" (name)} viewBox={"0 0 " (width) " " (height)} role="img" aria-label={(name) " per minute, last hour"} {
                @for (i, (start, counts)) in hour.iter().enumerate() {
                    @let v = value(counts);
                    @let h = if v == 0 { 0 } else { (v * height / max).max(1) };
                    rect x=(i as u64 * bar) y=(height - h) width=(bar.saturating_sub(1).max(1)) height=(h) {
                        title { (when(*start)) ": " (v) }
                    }
                }
            }
        }
    }
}

fn tenant_filter(viewer: &Viewer, action: &str, scope: Option<&str>) -> Markup {
    html! {
        @if viewer.is_admin() {
            form.filters method="get" action=(action) {
                label for="tenant" { "Tenant" }
                input id="tenant" name="tenant" value=(scope.unwrap_or("")) placeholder="every tenant";
                button type="submit" { "Show" }
            }
        }
    }
}

// ---- operations --------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    kind: Option<String>,
    label: Option<String>,
    created_from: Option<String>,
    created_to: Option<String>,
    tenant: Option<String>,
    /// An operation id or an idempotency key.
    q: Option<String>,
    page_token: Option<String>,
}

fn nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// `2026-12-01T07:30` (a `datetime-local` field), read as UTC.
fn parse_local(text: &str) -> Result<Timestamp, ApiError> {
    let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]");
    let format_seconds = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    let at = time::PrimitiveDateTime::parse(text, &format)
        .or_else(|_| time::PrimitiveDateTime::parse(text, &format_seconds))
        .map_err(|_| ApiError::InvalidRequest(format!("{text:?} is not a date and time like 2026-12-01T07:30")))?;
    Ok(Timestamp((at.assume_utc().unix_timestamp_nanos() / 1_000_000) as i64))
}

pub(crate) async fn operations(State(app): State<AppState>, viewer: Viewer, Query(q): Query<ListQuery>) -> PageResult {
    let scope = viewer.scope(nonempty(&q.tenant));
    // Lookup: an id goes to its page; anything else is an idempotency key.
    if let Some(needle) = nonempty(&q.q) {
        if let Some(id) = Id::parse(IdKind::Operation, needle) {
            return Ok(Redirect::to(&format!("/ui/operations/{id}")).into_response());
        }
        let Some(tenant) = scope.clone() else {
            let why = ApiError::InvalidRequest("choose a tenant to look up an idempotency key".into());
            return Err(error_page(Some(&viewer), why));
        };
        let kinds = app
            .store
            .kind_list()
            .await
            .or_page(&viewer)?
            .into_iter()
            .map(|k| k.name)
            .collect();
        return match app
            .store
            .operation_by_key(&tenant, kinds, needle)
            .await
            .or_page(&viewer)?
        {
            Some(id) => Ok(Redirect::to(&format!("/ui/operations/{id}")).into_response()),
            None => Err(error_page(Some(&viewer), ApiError::NotFound)),
        };
    }
    let state = nonempty(&q.state)
        .map(|s| {
            s.parse::<OpState>()
                .map_err(|e| ApiError::InvalidRequest(e.to_string()))
        })
        .transpose()
        .or_page(&viewer)?;
    let label = nonempty(&q.label)
        .map(|l| longrun_core::validate::label_selector(l).map_err(|e| ApiError::InvalidRequest(e.to_string())))
        .transpose()
        .or_page(&viewer)?;
    let created_from = nonempty(&q.created_from)
        .map(parse_local)
        .transpose()
        .or_page(&viewer)?;
    let created_before = nonempty(&q.created_to).map(parse_local).transpose().or_page(&viewer)?;
    let before_seq = nonempty(&q.page_token)
        .map(decode_page_token)
        .transpose()
        .or_page(&viewer)?;
    let kinds = app.store.kind_list().await.or_page(&viewer)?;
    let listed = app
        .store
        .operation_list(ListParams {
            tenant: scope.clone(),
            state,
            kind: nonempty(&q.kind).map(str::to_owned),
            label,
            page_size: DEFAULT_PAGE_SIZE,
            before_seq,
            visible_at: Some(app.clock.now()),
            created_from,
            created_before,
        })
        .await
        .or_page(&viewer)?;
    let next = listed.next_before_seq.map(|seq| {
        let mut query: Vec<(&str, String)> = Vec::new();
        for (name, value) in [
            ("state", &q.state),
            ("kind", &q.kind),
            ("label", &q.label),
            ("created_from", &q.created_from),
            ("created_to", &q.created_to),
            ("tenant", &q.tenant),
        ] {
            if let Some(v) = nonempty(value) {
                query.push((name, v.to_owned()));
            }
        }
        query.push(("page_token", encode_page_token(seq)));
        format!(
            "/ui/operations?{}",
            serde_urlencoded::to_string(&query).unwrap_or_default()
        )
    });
    let selected = |value: &str, current: &Option<String>| nonempty(current) == Some(value);
    let body = html! {
        h1 { "Operations" @if let Some(t) = &scope { " · " (t) } }
        form.filters method="get" action="/ui/operations" id="filters" {
            label { "State " select name="state" {
                option value="" { "any" }
                @for s in ["queued", "running", "paused", "succeeded", "failed", "cancelled"] {
                    option value=(s) selected[selected(s, &q.state)] { (s) }
                }
            } }
            label { "Kind " select name="kind" {
                option value="" { "any" }
                @for k in &kinds { option value=(k.name) selected[selected(&k.name, &q.kind)] { (k.name) } }
            } }
            label { "Label " input name="label" value=(nonempty(&q.label).unwrap_or("")) placeholder="key:value"; }
            label { "Created from " input type="datetime-local" name="created_from" value=(nonempty(&q.created_from).unwrap_or("")); }
            label { "to " input type="datetime-local" name="created_to" value=(nonempty(&q.created_to).unwrap_or("")); }
            @if viewer.is_admin() {
                label { "Tenant " input name="tenant" value=(nonempty(&q.tenant).unwrap_or("")) placeholder="every tenant"; }
            }
            button type="submit" { "Filter" }
            a href="/ui/operations" { "Clear" }
        }
        form.filters method="get" action="/ui/operations" id="lookup" {
            @if let Some(t) = &scope { @if viewer.is_admin() { input type="hidden" name="tenant" value=(t); } }
            label { "Find " input name="q" placeholder="op_… or an idempotency key" size="40"; }
            button type="submit" { "Go" }
        }
        @if listed.operations.is_empty() { p.muted id="empty" { "No operations match." } }
        @else {
            table.operations data-live="rows" {
                thead { tr {
                    th { "operation" } @if viewer.is_admin() { th { "tenant" } } th { "kind" } th { "state" }
                    th { "progress" } th { "created" } th { "updated" } th { "labels" }
                } }
                tbody {
                    @for op in &listed.operations {
                        tr data-id=(op.id) data-version=(op.version) {
                            td { a href={"/ui/operations/" (op.id)} { code { (op.id) } } }
                            @if viewer.is_admin() { td { (op.tenant) } }
                            td { (op.kind) }
                            td { (state_badge(op.state)) }
                            td { (progress_bar(op.progress.as_ref(), op.state)) }
                            td { (when(op.created_at)) }
                            td { (when(op.updated_at)) }
                            td { @for (k, v) in &op.labels { span.label { (k) "=" (v) } " " } }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next { p { a href=(next) id="next-page" rel="next" { "Older →" } } }
    };
    Ok(page(StatusCode::OK, layout("Operations", Some(&viewer), body)))
}

// ---- one operation -----------------------------------------------------------

pub(crate) async fn operation(State(app): State<AppState>, viewer: Viewer, Path(id): Path<String>) -> PageResult {
    let id = Id::parse(IdKind::Operation, &id)
        .ok_or(ApiError::NotFound)
        .or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    Ok(operation_page(&app, &viewer, &tenant, &id, None).await)
}

/// The operation page; with `conflict`, a refused change shown against
/// the operation as it is now.
pub(crate) async fn operation_page(
    app: &AppState,
    viewer: &Viewer,
    tenant: &str,
    id: &Id,
    conflict: Option<ApiError>,
) -> Response {
    match render_operation(app, viewer, tenant, id, conflict).await {
        Ok(response) | Err(response) => response,
    }
}

async fn render_operation(
    app: &AppState,
    viewer: &Viewer,
    tenant: &str,
    id: &Id,
    conflict: Option<ApiError>,
) -> PageResult {
    let op = app.operation(tenant, id).await.or_page(viewer)?;
    let history = app
        .store
        .operation_history(tenant, id)
        .await
        .or_page(viewer)?
        .unwrap_or_default();
    let deliveries = app
        .store
        .webhook_log(tenant, id)
        .await
        .or_page(viewer)?
        .unwrap_or_default();
    let record = match &op.idempotency_key {
        Some(_) => app.store.idempotency_record(tenant, id).await.or_page(viewer)?,
        None => None,
    };
    let spec = app.kind_spec(&op.kind).await.or_page(viewer)?;
    let now = app.clock.now();
    let status = if conflict.is_some() {
        StatusCode::PRECONDITION_FAILED
    } else {
        StatusCode::OK
    };
    let deadline_seconds = op.deadline_at.map(|at| (at.0 - op.created_at.0) / 1000);
    let labels_text: String = op.labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let pausable = spec.as_ref().is_some_and(|s| s.pausable);
    let body = html! {
        @if let Some(conflict) = &conflict {
            section.alert role="alert" id="conflict" {
                strong { "Not applied: " }
                (conflict.problem().detail.trim_end_matches('.')) "."
                " The page now shows the operation as it is; review it and try again."
                span.muted { " (" code { (conflict.code()) } ")" }
            }
        }
        h1 { code { (op.id) } " " (state_badge(op.state)) }
        div data-live="operation" data-id=(op.id) data-version=(op.version) {
            p.live-note hidden { "This operation has changed. " a href={"/ui/operations/" (op.id)} { "Reload" } }
        }
        p.muted {
            (op.kind)
            @if viewer.is_admin() { " · tenant " (op.tenant) }
            " · version " (op.version)
            @if op.pause_requested() { " · pause asked of its worker" }
            @if op.cancel.is_some() && !op.state.is_terminal() { " · cancel asked of its worker" }
        }
        section { (progress_bar(op.progress.as_ref(), op.state)) }
        section.columns {
            table.facts {
                tr { th { "attempts" } td { (op.attempt) @if let Some(s) = &spec { " of at most " (s.max_attempts) } } }
                tr { th { "created" } td { (when(op.created_at)) } }
                @if let Some(at) = op.not_before { tr { th { "starts no earlier than" } td id="not-before" { (when(at)) } } }
                tr { th { "priority" } td id="priority" { (op.priority) " of 1–9" } }
                tr { th { "started" } td { (op.started_at.map(when).unwrap_or_default()) } }
                tr { th { "ended" } td { (op.completed_at.map(when).unwrap_or_default()) } }
                tr { th { "updated" } td { (when(op.updated_at)) } }
                tr { th { "deadline" } td id="deadline" {
                    @match op.deadline_at {
                        Some(at) => { (when(at)) " (" (deadline_seconds.unwrap_or(0)) " s after creation)" }
                        None => span.muted { "none" }
                    }
                } }
                tr { th { "cost" } td {
                    (op.cost_units)
                    @if let Some(max) = op.budget_max_cost { " of a budget of " (max) " units" } @else { " units (no budget)" }
                } }
                @if let Some(at) = op.expires_at { tr { th { "removed after" } td { (when(at)) } } }
                @if let Some(of) = &op.rerun_of { tr { th { "re-run of" } td { a href={"/ui/operations/" (of)} { code { (of) } } } } }
                @if let Some(reruns) = &op.reruns { @if !reruns.is_empty() {
                    tr { th { "re-runs" } td { @for r in reruns { a href={"/ui/operations/" (r)} { code { (r) } } " " } } }
                } }
                @if let Some(url) = &op.callback_url { tr { th { "webhook" } td { code { (url) } } } }
            }
            div {
                h3 { "Labels" }
                @if op.labels.is_empty() { p.muted { "none" } }
                @for (k, v) in &op.labels { span.label { (k) "=" (v) } " " }
                h3 { "Idempotency" }
                @match (&op.idempotency_key, &record) {
                    (Some(key), Some(record)) => {
                        table.facts id="idempotency" {
                            tr { th { "key" } td { code { (key) } } }
                            tr { th { "scope" } td { "tenant " (op.tenant) ", kind " (record.kind) } }
                            tr { th { "recorded" } td { (when(record.created_at)) } }
                            tr { th { "replays answered" } td id="replays" { (record.replays) } }
                            tr { th { "replays answered until" } td { (when(idempotency_expires(app, &op, now))) } }
                        }
                    }
                    (Some(key), None) => { p { code { (key) } } }
                    _ => p.muted { "submitted without a key" }
                }
            }
        }
        section {
            h2 { "Input" }
            @match &op.input {
                Some(input) => pre.json { (pretty(input)) },
                None => p.muted { "Not kept: inputs are dropped once an operation ends." }
            }
        }
        @if op.state.is_terminal() {
            section id="result" {
                h2 { "Result" }
                @if let Some(error) = &op.error {
                    p.alert { strong { code { (error.code) } } " " (error.message)
                        @if error.retryable { span.muted { " (retryable)" } } }
                }
                @if let Some(result) = &op.result { pre.json { (pretty(result)) } }
                @let artifacts: Vec<(&str, &longrun_store::ArtifactRef)> = op.artifact.iter()
                    .map(|a| (longrun_store::DEFAULT_ARTIFACT, a))
                    .chain(op.artifacts.iter().map(|(n, a)| (n.as_str(), a)))
                    .collect();
                @if !artifacts.is_empty() {
                    table {
                        thead { tr { th { "artifact" } th { "type" } th.num { "size" } th { "SHA-256" } th { "expires" } th {} } }
                        tbody { @for (name, a) in &artifacts {
                            tr {
                                td { (name) } td { (a.content_type) } td.num { (a.size_bytes) " bytes" }
                                td { code.hash { (a.sha256) } } td { (when(a.expires_at)) }
                                td { @if a.expires_at > now {
                                    a.button href={"/ui/operations/" (op.id) "/artifacts/" (name)} download id={"download-" (name)} { "Download" }
                                } @else { span.muted { "expired" } } }
                            }
                        } }
                    }
                }
                @if let Some(cancel) = &op.cancel {
                    p.muted { "Cancellation asked " (when(cancel.requested_at)) " by " code { (cancel.requested_by) }
                        @if let Some(r) = &cancel.reason { ": " (r) } }
                }
            }
        }
        section.actions {
            h2 { "Actions" }
            @if !op.state.is_terminal() {
                form method="post" action={"/ui/operations/" (op.id) "/cancel"} id="cancel" {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input name="reason" placeholder="reason (optional)" maxlength="1024";
                    button.danger type="submit" { "Cancel operation" }
                }
                form method="post" action={"/ui/operations/" (op.id) "/edit"} id="edit" {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="version" value=(op.version);
                    label { "Deadline, seconds after creation " input type="number" min="1" name="deadline_seconds"
                        value=(deadline_seconds.map(|s| s.to_string()).unwrap_or_default()) placeholder="none"; }
                    label { "Labels (key=value per line)" textarea name="labels" rows="3" { (labels_text) } }
                    button type="submit" { "Save (at version " (op.version) ")" }
                }
                @if matches!(op.state, OpState::Queued) || (op.state == OpState::Running && pausable && !op.pause_requested()) {
                    (intent_form(viewer, &op, "paused", "Pause"))
                }
                @if op.state == OpState::Paused || op.pause_requested() {
                    (intent_form(viewer, &op, "running", "Resume"))
                }
            } @else {
                @if op.input.is_some() {
                    form method="post" action={"/ui/operations/" (op.id) "/rerun"} id="rerun" {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        input type="hidden" name="idempotency_key" value={"console-rerun-" (longrun_core::id::random_base32::<16>())};
                        label { input type="checkbox" name="from_checkpoint" value="1"; " from its last checkpoint" }
                        button type="submit" { "Re-run" }
                    }
                } @else { p.muted { "Its input is no longer kept, so it cannot be re-run." } }
            }
        }
        section {
            h2 { "History" }
            ol.timeline id="history" {
                @for event in &history {
                    li {
                        span.when { (when(event.at)) }
                        " v" (event.version) " "
                        strong { (event.event_type) } " "
                        (state_badge(event.state))
                        @if !event.data.is_null() && event.data != serde_json::json!({}) { " " code.data { (event.data) } }
                    }
                }
            }
        }
        section {
            h2 { "Webhook deliveries" }
            @if deliveries.is_empty() { p.muted { "None." } }
            @else {
                table id="deliveries" {
                    thead { tr { th { "event" } th { "attempt" } th { "at" } th { "answer" } th { "latency" } th { "next attempt" } } }
                    tbody { @for d in &deliveries {
                        tr {
                            td { (d.event_type) } td { (d.attempt) } td { (when(d.at)) }
                            td { @match (d.status_code, &d.error) {
                                (Some(code), _) => { "HTTP " (code) }
                                (None, Some(e)) => span.alert { (e) }
                                _ => {}
                            } }
                            td { @match d.latency_ms { Some(ms) => { (ms) " ms" } None => {} } }
                            td { (d.next_attempt_at.map(when).unwrap_or_default()) }
                        }
                    } }
                }
            }
        }
    };
    Ok(page(status, layout(op.id.as_str(), Some(viewer), body)))
}

fn intent_form(viewer: &Viewer, op: &Operation, desired: &str, label: &str) -> Markup {
    html! {
        form method="post" action={"/ui/operations/" (op.id) "/intent"} id={"intent-" (desired)} {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="version" value=(op.version);
            input type="hidden" name="desired_state" value=(desired);
            button type="submit" { (label) }
        }
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

// ---- workers -----------------------------------------------------------------

/// Most leases one page lists.
const MAX_LEASES_SHOWN: u32 = 200;

pub(crate) async fn workers(State(app): State<AppState>, viewer: Viewer, Query(q): Query<TenantQuery>) -> PageResult {
    let scope = viewer.scope(q.tenant.as_deref());
    let leases = app
        .store
        .lease_list(scope.clone(), MAX_LEASES_SHOWN)
        .await
        .or_page(&viewer)?;
    let kinds = app.store.kind_list().await.or_page(&viewer)?;
    let mut typical = Vec::with_capacity(kinds.len());
    for kind in &kinds {
        typical.push(app.typical_duration(&kind.name).await.or_page(&viewer)?);
    }
    let now = app.clock.now();
    let body = html! {
        h1 { "Workers" }
        (tenant_filter(&viewer, "/ui/workers", scope.as_deref()))
        section {
            h2 { "Live leases" }
            @if leases.is_empty() { p.muted { "No worker holds any work." } }
            @else {
                table id="leases" {
                    thead { tr { th { "worker" } th { "kind" } th { "operation" } @if viewer.is_admin() { th { "tenant" } }
                        th { "attempt" } th { "last heartbeat" } th { "lease expires" } th { "progress" } } }
                    tbody { @for l in &leases {
                        tr {
                            td { code { (l.worker_id.clone().unwrap_or_default()) } }
                            td { (l.kind) }
                            td { a href={"/ui/operations/" (l.operation_id)} { code { (l.operation_id) } } }
                            @if viewer.is_admin() { td { (l.tenant) } }
                            td { (l.attempt) }
                            td { @if let Some(at) = l.last_heartbeat_at { (span(now.since(at))) " ago" } }
                            td {
                                @if l.lease_expires_at > now { "in " (span(l.lease_expires_at.since(now))) }
                                @else { span.warning { "lapsed " (span(now.since(l.lease_expires_at))) " ago" } }
                            }
                            td { (progress_bar(l.progress.as_ref(), OpState::Running)) }
                        }
                    } }
                }
                @if leases.len() as u32 == MAX_LEASES_SHOWN { p.muted { "The " (MAX_LEASES_SHOWN) " leases expiring soonest." } }
            }
        }
        section {
            h2 { "Declared kinds" }
            table id="kinds" {
                thead { tr { th { "kind" } th { "built in" } th.num { "max attempts" } th { "safe to re-run" } th { "pausable" }
                    th { "default / max deadline" } th { "typical duration" } } }
                tbody { @for (k, usual) in kinds.iter().zip(typical.iter()) {
                    tr {
                        td { (k.name) } td { (yes(k.builtin)) } td.num { (k.max_attempts) } td { (yes(k.rerun_safe)) } td { (yes(k.pausable)) }
                        td { (seconds(k.default_deadline_seconds)) " / " (seconds(k.max_deadline_seconds)) }
                        td { @match usual { Some(d) => (span(*d)), None => span.muted { "not known yet" } } }
                    }
                } }
            }
        }
    };
    Ok(page(StatusCode::OK, layout("Workers", Some(&viewer), body)))
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn seconds(s: Option<i64>) -> String {
    s.map_or_else(
        || "–".to_owned(),
        |s| span(Duration::from_secs(u64::try_from(s).unwrap_or(0))),
    )
}

// ---- tenants -----------------------------------------------------------------

/// A secret shown once, on the response that made it.
pub(crate) struct Secret {
    pub what: String,
    pub value: String,
}

pub(crate) async fn tenants(State(app): State<AppState>, viewer: Viewer) -> PageResult {
    if !viewer.is_admin() {
        return Err(error_page(Some(&viewer), ApiError::Forbidden));
    }
    Ok(tenants_page(&app, &viewer, None, None).await)
}

pub(crate) async fn tenants_page(
    app: &AppState,
    viewer: &Viewer,
    secret: Option<Secret>,
    refusal: Option<String>,
) -> Response {
    let usage = match app.store.tenant_usage().await {
        Ok(u) => u,
        Err(e) => return error_page(Some(viewer), e.into()),
    };
    let keys = match app.store.api_key_list().await {
        Ok(k) => k,
        Err(e) => return error_page(Some(viewer), e.into()),
    };
    let status = if refusal.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    let body = html! {
        h1 { "Tenants" }
        @if let Some(secret) = &secret {
            section.secret role="alert" {
                strong { (secret.what) }
                p { "Copy it now: it is shown this once and cannot be read again." }
                input.secret-value readonly id="new-secret" value=(secret.value) size="60";
            }
        }
        @if let Some(why) = &refusal { p.alert role="alert" id="refusal" { (why) } }
        @for u in &usage {
            @let name = &u.limits.name;
            section.tenant id={"tenant-" (name)} {
                h2 { (name) }
                table.facts {
                    tr { th { "operations not ended" } td { (u.active) @if let Some(max) = u.limits.max_active { " of at most " (max) (over(u.active, max)) } @else { " (no limit)" } } }
                    tr { th { "running" } td { (u.running) @if let Some(max) = u.limits.max_running { " of at most " (max) (over(u.running, max)) } @else { " (no limit)" } } }
                    tr { th { "request rate" } td { @match u.limits.rate { Some(r) => { (r) " per second" } None => "no limit" } } }
                }
                h3 { "API keys" }
                table.keys {
                    thead { tr { th { "key id" } th { "role" } th { "created" } th { "state" } th {} } }
                    tbody { @for k in keys.iter().filter(|k| &k.tenant == name) {
                        tr data-key=(k.id) {
                            td { code { (k.id) } } td { (k.role.as_str()) } td { (when(k.created_at)) }
                            td { @match k.revoked_at { Some(at) => span.muted { "revoked " (when(at)) }, None => "active" } }
                            td { @if k.revoked_at.is_none() {
                                form.inline method="post" action={"/ui/keys/" (k.id) "/revoke"} {
                                    input type="hidden" name="csrf" value=(viewer.csrf);
                                    button.danger type="submit" disabled[k.id == viewer.key_id] { "Revoke" }
                                }
                            } }
                        }
                    } }
                }
                div.row {
                    form.inline method="post" action={"/ui/tenants/" (name) "/keys"} {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        select name="role" {
                            @for r in [Role::Client, Role::Worker, Role::Admin] { option value=(r.as_str()) { (r.as_str()) } }
                        }
                        button type="submit" { "Create key" }
                    }
                    form.inline method="post" action={"/ui/tenants/" (name) "/webhook-secret"} {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        button type="submit" { "Rotate webhook secret" }
                    }
                }
                @if name != &viewer.tenant {
                    details {
                        summary { "Delete this tenant" }
                        form method="post" action={"/ui/tenants/" (name) "/delete"} {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            p { "Removes its operations, results, uploads, keys and webhook deliveries. This cannot be undone. Type " code { (name) } " to confirm." }
                            input name="confirm" autocomplete="off" required;
                            button.danger type="submit" { "Delete " (name) }
                        }
                    }
                }
            }
        }
    };
    page(status, layout("Tenants", Some(viewer), body))
}

fn over(used: u64, max: i64) -> Markup {
    html! { @if i64::try_from(used).unwrap_or(i64::MAX) >= max { " " span.warning { "at its limit" } } }
}
