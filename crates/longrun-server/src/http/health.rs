//! `GET /healthz` (the process is up) and `GET /readyz` (the database answers).

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::app::ApiError;
use crate::app::AppState;
use crate::http::error::Problem;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

#[utoipa::path(get, path = "/healthz", tag = "operating", responses((status = 200, description = "The process is up", body = Object)))]
async fn healthz() -> impl IntoResponse {
    // Probed often, by many: its constant answer is not rendered each time.
    ([(header::CONTENT_TYPE, "application/json")], r#"{"status":"ok"}"#)
}

#[utoipa::path(get, path = "/readyz", tag = "operating",
    responses((status = 200, description = "The database answers", body = Object), (status = "default", description = "A problem (RFC 9457) with a stable `code`", body = Problem, content_type = "application/problem+json")))]
async fn readyz(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    match tokio::time::timeout(Duration::from_secs(2), app.store.ping()).await {
        Ok(Ok(())) => Ok(Json(json!({"status": "ready"}))),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness check failed");
            Err(unavailable())
        }
        Err(_) => Err(unavailable()),
    }
}

fn unavailable() -> ApiError {
    ApiError::TemporarilyUnavailable {
        detail: "the database is not reachable".into(),
        retry_after: Duration::from_secs(5),
    }
}
