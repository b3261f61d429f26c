//! The whole HTTP API as one router: the two edges (`http`, `console`)
//! under the edge middleware (request ids, problems, logs, the in-flight
//! shed), body limits and panic catching.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::app::AppState;
use crate::{console, http};

/// The whole HTTP API as one router.
///
/// The middleware wraps the routes once, as one service, rather than each
/// route (what `Router::layer` does): a request then clones one boxed
/// stack, not one per layer.
pub fn app(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let body_stall = state.config.limits.body_stall_timeout;
    let routes = Router::new()
        .merge(http::operations::router())
        .merge(http::workers::router())
        .merge(http::events::router())
        .merge(http::results::router())
        .merge(http::uploads::router())
        .merge(http::schedules::router())
        .merge(http::openapi::router())
        .merge(http::admin::router())
        .merge(http::health::router())
        .merge(console::router())
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .with_state(state.clone());
    let stack = ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(state, http::edge))
        .layer(CatchPanicLayer::new())
        .layer(RequestBodyTimeoutLayer::new(body_stall))
        .layer(DefaultBodyLimit::max(max_body))
        .service(routes);
    Router::new().fallback_service(stack)
}
