//! The whole HTTP API as one router: the two edges (`http`, `console`)
//! under the edge middleware (request ids, problems, logs, the in-flight
//! shed), body limits and panic catching.

use std::convert::Infallible;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::app::AppState;
use crate::{console, http};

/// The whole HTTP API as one router (what tests and embedders drive): the
/// [`stack`] the listener serves, behind a router of one fallback.
pub fn app(state: AppState) -> Router {
    Router::new().fallback_service(stack(state))
}

/// The stack [`app`] serves, as the listener serves it: the edge outermost,
/// then panic catching, body limits, the routes. The layers wrap the routes
/// once, as one service, rather than each route (what `Router::layer`
/// does); served as it is, not through a router of its own, a request is
/// routed once.
pub fn stack(state: AppState) -> impl Served {
    http::Edge::new(state.clone(), inner(state))
}

/// What the listener serves: the stack, cloned per connection and per
/// request as it is (its routes are a `Router`, a pointer), not boxed.
pub trait Served:
    tower::Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + Sync + 'static
{
}

impl<S> Served for S where
    S: tower::Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + Sync + 'static
{
}

/// The routes under panic catching and body limits.
fn inner(
    state: AppState,
) -> impl tower::Service<Request, Response = impl IntoResponse, Error = Infallible, Future: Send>
+ Clone
+ Send
+ Sync
+ 'static {
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
    ServiceBuilder::new()
        .layer(CatchPanicLayer::new())
        .layer(RequestBodyTimeoutLayer::new(body_stall))
        .layer(DefaultBodyLimit::max(max_body))
        .service(routes)
}
