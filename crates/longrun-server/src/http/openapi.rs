//! The API reference: an OpenAPI 3.1 document generated from the handlers'
//! annotations and the wire types (utoipa), served at `GET /openapi.json`.

use std::sync::OnceLock;

use axum::Router;
use axum::routing::get;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::app::AppState;
use crate::http::{admin, events, health, operations, results, schedules, uploads, workers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Longrun",
        description = "A durable server for HTTP work that finishes later: submit, observe, cancel, and the worker protocol. \
                       Every error is application/problem+json with a stable `code`; every response carries X-Request-Id.",
    ),
    paths(
        operations::submit, operations::list, operations::read, operations::update, operations::cancel_alias,
        operations::history, operations::cancel, operations::cancellation, operations::deliveries, operations::rerun, events::events,
        results::result, results::content, results::upload, results::upload_named, results::upload_piece,
        results::join_pieces, results::read_upload,
        uploads::create, uploads::append, uploads::offset, uploads::show, workers::claim, workers::heartbeat, workers::complete,
        workers::fail, workers::cancelled, workers::paused, workers::outcomes, operations::submit_batch, health::healthz, health::readyz, admin::metrics,
        schedules::create, schedules::list, schedules::read, schedules::update, schedules::remove, schedules::fires, schedules::trigger, schedules::backfill,
    ),
    components(schemas(longrun_api::Problem, longrun_api::ProblemCode, longrun_api::OperationBody, longrun_api::SubmitRequest, longrun_api::OutcomeItem)),
    modifiers(&BearerAuth),
    tags(
        (name = "operations", description = "Submit, observe and cancel operations (role client)"),
        (name = "results", description = "Result artifacts and their download links"),
        (name = "uploads", description = "Inputs streamed (and resumed) before a submission names them"),
        (name = "schedules", description = "Work that recurs: each firing is an ordinary operation (role client)"),
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

/// The document, built once, as served.
pub fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        link_operations(&mut doc);
        describe_event_stream(&mut doc);
        desired_state_stands_alone(&mut doc);
        one_start_at_most(&mut doc);
        headers_are_never_null(&mut doc);
        doc
    })
}

/// utoipa marks every optional header parameter nullable, but a header is
/// present or absent, never `null`.
fn headers_are_never_null(doc: &mut serde_json::Value) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for operation in item.values_mut() {
            let Some(parameters) = operation.get_mut("parameters").and_then(|p| p.as_array_mut()) else {
                continue;
            };
            for parameter in parameters.iter_mut().filter(|p| p["in"] == "header") {
                let schema_type = &mut parameter["schema"]["type"];
                if let Some(types) = schema_type.as_array() {
                    let types: Vec<_> = types.iter().filter(|t| *t != "null").cloned().collect();
                    *schema_type = match <[_; 1]>::try_from(types) {
                        Ok([one]) => one,
                        Err(many) => serde_json::Value::Array(many),
                    };
                }
            }
        }
    }
}

/// `PATCH` changes `desired_state` on its own: a body giving it with
/// `deadline_seconds` (whose `null` removes the deadline, so counts) or
/// with `labels` is `400`, and the document says so. A `null`
/// `desired_state` or `labels` is absent, as the server reads it.
fn desired_state_stands_alone(doc: &mut serde_json::Value) {
    let schema = &mut doc["components"]["schemas"]["UpdateRequest"];
    if schema.is_object() {
        let given = serde_json::json!({"type": "string"});
        schema["not"] = serde_json::json!({"anyOf": [
            {"required": ["desired_state", "deadline_seconds"], "properties": {"desired_state": given}},
            {"required": ["desired_state", "labels"], "properties": {"desired_state": given, "labels": {"type": "object"}}},
            {"required": ["desired_state", "not_before"], "properties": {"desired_state": given}},
        ]});
    }
}

/// A submission (or re-run) names its start once: `not_before` or
/// `start_after_seconds`, not both (`400`); a `null` is absent. (Batch
/// items are checked item by item, so their schema leaves it out.)
fn one_start_at_most(doc: &mut serde_json::Value) {
    for name in ["SubmitRequest", "RerunRequest"] {
        let schema = &mut doc["components"]["schemas"][name];
        if schema.is_object() {
            schema["not"] = serde_json::json!({
                "required": ["not_before", "start_after_seconds"],
                "properties": {"not_before": {"type": "string"}, "start_after_seconds": {"type": "number"}},
            });
        }
    }
}

/// Each event of `GET /v1/operations/{id}/events`: its `data` is the
/// operation's JSON representation at the event's version (`id`). Stated in
/// the JSON Schema 2020-12 way (`contentMediaType` / `contentSchema`), which
/// utoipa cannot write.
fn describe_event_stream(doc: &mut serde_json::Value) {
    let content =
        &mut doc["paths"]["/v1/operations/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"];
    if content.is_object() {
        content["schema"] = serde_json::json!({
            "type": "object",
            "required": ["id", "event", "data"],
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The version"},
                "event": {"const": "operation.updated"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": "#/components/schemas/OperationBody"},
                },
            },
        });
    }
}

/// OpenAPI links from a submission's answers to every operation on
/// `/v1/operations/{id}…`, with `id` taken from the response body: the
/// document says how to follow an accepted operation (and lets generated
/// clients and schemathesis's stateful phase reach real ids). Written into
/// the JSON because utoipa 5 serializes a link's `operationId` in snake case.
fn link_operations(doc: &mut serde_json::Value) {
    let mut targets = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            if !path.starts_with("/v1/operations/{id}") {
                continue;
            }
            for method in ["get", "put", "patch", "delete"] {
                if let Some(id) = item[method]["operationId"].as_str() {
                    targets.push(id.to_owned());
                }
            }
        }
    }
    for status in ["200", "202"] {
        let response = &mut doc["paths"]["/v1/operations"]["post"]["responses"][status];
        if !response.is_object() {
            continue;
        }
        let links: serde_json::Map<String, serde_json::Value> = targets
            .iter()
            .map(|target| {
                let link = serde_json::json!({
                    "operationId": target,
                    "parameters": {"id": "$response.body#/id"},
                    "description": format!("`{target}` of the accepted operation"),
                });
                (target.clone(), link)
            })
            .collect();
        response["links"] = serde_json::Value::Object(links);
    }
}

/// The document as served: serialized once, like the document itself, so a
/// public endpoint costs a copy of a reference per request.
fn document_bytes() -> axum::body::Bytes {
    static BYTES: OnceLock<axum::body::Bytes> = OnceLock::new();
    BYTES
        .get_or_init(|| serde_json::to_vec(document()).expect("the document serializes").into())
        .clone()
}

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/openapi.json",
        get(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                document_bytes(),
            )
        }),
    )
}
