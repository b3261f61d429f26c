//! `GET /v1/operations/{id}/events`: the operation as a server-sent event
//! stream. One event per version (`id:` = version, `event:
//! operation.updated`, `data:` = the representation at that version), read
//! from the stored history, so a client resuming with `Last-Event-ID` gets
//! every later version exactly once. Keep-alive comments every 15 s; the
//! stream ends after the terminal event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures_util::Stream;
use longrun_core::{Id, IdKind};

use crate::app::ApiError;
use crate::app::AppState;
use crate::changes::Waiter;
use crate::http::auth::Caller;
use crate::http::error::Problem;
use crate::http::wire;

const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events read from the store at a time.
const PAGE: u32 = 100;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/operations/{id}/events", get(events))
}

struct Cursor {
    app: AppState,
    tenant: String,
    id: Id,
    last: i64,
    buffered: VecDeque<longrun_store::Event>,
    waiter: Waiter,
    finished: bool,
}

/// `Last-Event-ID`: the version to resume after; absent or empty is 0.
fn last_event_id(headers: &HeaderMap) -> Result<i64, ApiError> {
    match headers
        .get("last-event-id")
        .filter(|v| !v.as_bytes().trim_ascii().is_empty())
    {
        None => Ok(0),
        Some(v) => v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| ApiError::InvalidRequest("Last-Event-ID must be a version number".into())),
    }
}

#[utoipa::path(get, path = "/v1/operations/{id}/events", tag = "operations", security(("bearer" = [])),
    params(("id" = String, Path, description = "The operation id (op_…)"), ("Last-Event-ID" = Option<String>, Header, description = "Resume after this version (empty: from the start)", pattern = "^([0-9]{1,18})?$")),
    responses((status = 200, description = "text/event-stream: one `operation.updated` event per version", content_type = "text/event-stream", body = String),
              (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn events(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    caller.require_client()?;
    let id = Id::parse(IdKind::Operation, &id).ok_or(ApiError::NotFound)?;
    let last = last_event_id(&headers)?;
    let waiter = app
        .changes
        .watch(&caller.tenant, &id)
        .map_err(|_| ApiError::RateLimited {
            detail: "the tenant has too many long-polls and event streams open".into(),
            retry_after: Duration::from_secs(1),
        })?;
    // Ownership and expiry are checked before the stream starts, so a foreign
    // id is a 404 and an expired one a 410.
    app.operation(&caller.tenant, &id).await?;
    let first = app
        .store
        .operation_events_after(&caller.tenant, &id, last, PAGE)
        .await?;
    let first = app.found(&caller.tenant, &id, first).await?;
    let cursor = Cursor {
        app,
        tenant: caller.tenant,
        id,
        last,
        buffered: first.into(),
        waiter,
        finished: false,
    };
    let stream = futures_util::stream::unfold(cursor, |mut cursor| async move {
        loop {
            if let Some(event) = cursor.buffered.pop_front() {
                cursor.last = event.version;
                let Some(snapshot) = event.snapshot else { continue };
                cursor.finished = snapshot.state.is_terminal();
                let body = serde_json::to_string(&wire::operation(&snapshot)).unwrap_or_default();
                let sse = Event::default()
                    .id(event.version.to_string())
                    .event("operation.updated")
                    .data(body);
                return Some((Ok(sse), cursor));
            }
            if cursor.finished {
                return None;
            }
            match cursor
                .app
                .store
                .operation_events_after(&cursor.tenant, &cursor.id, cursor.last, PAGE)
                .await
            {
                Ok(Some(events)) if !events.is_empty() => cursor.buffered = events.into(),
                Ok(Some(_)) => {
                    // Nothing newer. Already over (a resume after the end)? Then end.
                    match cursor.app.store.operation_shared(&cursor.tenant, &cursor.id).await {
                        Ok(Some(op)) if !op.state.is_terminal() => cursor.waiter.changed().await,
                        // It ended between the two reads: send its last events first.
                        Ok(Some(op)) if op.version > cursor.last => {}
                        _ => return None,
                    }
                }
                // Gone (removed) or unreadable: end the stream; the client may reconnect.
                Ok(None) | Err(_) => return None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

#[cfg(test)]
mod fuzz {
    use axum::http::HeaderValue;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any Last-Event-ID: a version to resume after, or `400
        /// invalid_request`; every version reads back.
        #[test]
        fn any_last_event_id_is_a_version_or_invalid_request(raw in any::<String>(), version in 0i64..i64::MAX) {
            if let Ok(value) = HeaderValue::from_str(&raw) {
                let mut headers = HeaderMap::new();
                headers.insert("last-event-id", value);
                match last_event_id(&headers) {
                    Ok(v) => prop_assert!(v >= 0),
                    Err(e) => prop_assert_eq!(e.code(), "invalid_request"),
                }
            }
            let mut headers = HeaderMap::new();
            headers.insert("last-event-id", HeaderValue::from(version));
            prop_assert_eq!(last_event_id(&headers).unwrap(), version);
        }
    }
}
