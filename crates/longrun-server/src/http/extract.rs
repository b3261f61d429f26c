//! Extractors whose rejections are [`ApiError`]s, so malformed JSON, a wrong
//! content type, an oversized body or a bad query string all get a stable
//! problem code instead of the framework's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::app::ApiError;

/// A JSON body: `application/json` (or `…+json`) required, size bounded by
/// the router's body limit, unknown fields refused by the target type.
pub struct JsonBody<T>(pub T);

/// Like [`JsonBody`] but an empty body (no content type needed) is `None`.
pub struct OptionalJsonBody<T>(pub Option<T>);

fn is_json(req: &Request) -> bool {
    let Some(value) = req.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge("the request body is larger than the server's limit".into())
        } else {
            ApiError::InvalidRequest(format!("could not read the request body: {}", rejection.body_text()))
        }
    })
}

/// Every body of this API is a JSON object. Checking that first also stops
/// serde from reading an array as a struct's fields in order.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidRequest(format!("invalid JSON body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::InvalidRequest(
            "the request body must be a JSON object".into(),
        ));
    }
    serde_json::from_value(value).map_err(|e| ApiError::InvalidRequest(format!("invalid request body: {e}")))
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(&req) {
            return Err(ApiError::UnsupportedMediaType(
                "the request body must be application/json".into(),
            ));
        }
        let bytes = body_bytes(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(&req);
        let bytes = body_bytes(req, state).await?;
        // No body, or JSON `null`: none.
        if bytes.is_empty() || (json && bytes.trim_ascii() == b"null") {
            return Ok(OptionalJsonBody(None));
        }
        if !json {
            return Err(ApiError::UnsupportedMediaType(
                "the request body must be application/json".into(),
            ));
        }
        parse_json(&bytes).map(|v| OptionalJsonBody(Some(v)))
    }
}

/// A query string; unknown parameters and bad values are `400 invalid_request`.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(query)
            .map(QueryParams)
            .map_err(|e| ApiError::InvalidRequest(format!("invalid query string: {e}")))
    }
}
