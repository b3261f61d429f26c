//! The operator's endpoints: `GET /metrics` (Prometheus text; role admin, or
//! without a key on the separate `--metrics-listen` address).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use longrun_core::apikey::Role;

use crate::app::ApiError;
use crate::app::AppState;
use crate::http::auth::Caller;

pub fn router() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

/// The router of `--metrics-listen`: `/metrics` only, no key (bind it where
/// only the scraper can reach it).
pub fn metrics_only() -> Router<AppState> {
    Router::new().route("/metrics", get(render))
}

#[utoipa::path(get, path = "/metrics", tag = "operating", security(("bearer" = [])),
    responses((status = 200, description = "Prometheus text exposition (role admin)", content_type = "text/plain", body = String),
              (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = crate::http::error::Problem,
               content_type = "application/problem+json")))]
async fn metrics(State(app): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    if caller.role != Role::Admin {
        return Err(ApiError::Forbidden);
    }
    Ok(render(State(app)).await)
}

async fn render(State(app): State<AppState>) -> Response {
    let mut response = app.scrape.render().await.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
