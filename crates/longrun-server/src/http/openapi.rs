//! The API reference: an OpenAPI 3.1 document generated from the handlers'
//! annotations and the wire types (utoipa), served at `GET /openapi.json`.

use std::sync::OnceLock;

use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::AppState;
use crate::http::{admin, error, events, health, operations, results, wire, workers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Longrun",
        description = "A durable server for HTTP work that finishes later: submit, observe, cancel, and the worker protocol. \
                       Every error is application/problem+json with a stable `code`; every response carries X-Request-Id.",
    ),
    paths(
        operations::submit, operations::list, operations::read, operations::update, operations::cancel_alias,
        operations::history, operations::cancel, operations::cancellation, operations::deliveries, events::events,
        results::result, results::content, results::upload, workers::claim, workers::heartbeat, workers::complete,
        workers::fail, workers::cancelled, workers::outcomes, operations::submit_batch, health::healthz, health::readyz, admin::metrics,
    ),
    components(schemas(error::Problem, error::ProblemCode, wire::OperationBody, wire::SubmitRequest)),
    modifiers(&BearerAuth),
    tags(
        (name = "operations", description = "Submit, observe and cancel operations (role client)"),
        (name = "results", description = "Result artifacts and their download links"),
        (name = "webhooks", description = "Webhook delivery logs"),
        (name = "workers", description = "The worker protocol (role worker)"),
        (name = "operating", description = "Health and readiness"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(|| async { Json(document().clone()) }))
}
