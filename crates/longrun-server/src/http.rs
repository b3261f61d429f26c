//! The HTTP edge: routers per resource, the problem+json renderer, request
//! ids, and request logging.

pub mod admin;
pub mod auth;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod openapi;
pub mod operations;
pub mod results;
pub mod schedules;
pub mod uploads;
pub mod wire;
pub mod workers;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use longrun_core::{Id, IdKind};
use tracing::Instrument;

use crate::app::ApiError;
use crate::app::AppState;
use error::Problem;

/// The id of the request being handled, as an extension: the value of its
/// `X-Request-Id` header, shared with it rather than copied.
#[derive(Debug, Clone)]
pub struct RequestId(HeaderValue);

impl RequestId {
    fn generate() -> Self {
        let id = axum::body::Bytes::from(Id::generate(IdKind::Request).into_string());
        Self(HeaderValue::from_maybe_shared(id).expect("request ids are header-safe"))
    }

    pub fn as_str(&self) -> &str {
        self.0.to_str().expect("request ids are ASCII")
    }
}

const PROBLEM_JSON: &str = "application/problem+json";

/// The response header every answer carries (a name parsed once, not per
/// response).
const X_REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");

/// Outermost middleware: gives every request an id, logs it, sheds it when
/// the server is full, and makes every error response a problem+json body
/// carrying that id.
///
/// Shedding: past `max_in_flight` requests being handled, one more is
/// answered `503` with `Retry-After` at once rather than queued, so the
/// requests already in keep their latency and memory stays bounded.
async fn edge<S>(app: AppState, mut req: Request, inner: S) -> Response
where
    S: tower::Service<Request, Error = Infallible>,
    S::Response: IntoResponse,
{
    let request_id = RequestId::generate();
    // The request's span is for following a request through the server
    // (`--log longrun_server=debug`, or any subscriber that records debug
    // spans): at the default level no event inside a request needs it, and
    // the fmt layer formats every field of an enabled span as it is
    // recorded, a tenth of a request that does little. What an operator
    // needs at INFO — the request id, method, path and operation of a
    // request that failed — is written on the error line itself, below.
    let span = tracing::debug_span!(
        "http",
        method = %req.method(),
        path = %req.uri().path(),
        request_id = request_id.as_str(),
        source = tracing::field::Empty,
        tenant = tracing::field::Empty,
        op.id = tracing::field::Empty,
    );
    if !span.is_disabled() {
        // Requests about one operation carry its id from the start;
        // submissions record it once the id is known.
        if let Some(id) = operation_in_path(req.uri().path()) {
            span.record("op.id", id);
        }
        if let Some(source) =
            crate::source::of_request(req.extensions(), req.headers(), &app.config.limits.trusted_proxies)
        {
            span.record("source", tracing::field::display(source));
        }
    }
    // Cheap to keep (shared bytes), for the error line.
    let (method, uri) = (req.method().clone(), req.uri().clone());
    req.extensions_mut().insert(request_id.clone());
    let metrics = EdgeMetrics::get();
    let started = Instant::now();
    let mut response = match app.in_flight.try_enter() {
        // A disabled span is not entered at every poll.
        Some(_place) if span.is_disabled() => answer(inner, req).await,
        Some(_place) => answer(inner, req).instrument(span.clone()).await,
        None => {
            metrics.shed.increment(1);
            ApiError::TemporarilyUnavailable {
                detail: "the server is handling as many requests as it can; try again shortly".into(),
                retry_after: SHED_RETRY_AFTER,
            }
            .into_response()
        }
    };

    let status = response.status();
    let internal = response.extensions_mut().remove::<error::InternalError>();
    let problem = match response.extensions_mut().remove::<Problem>() {
        Some(problem) => Some(problem),
        // Console pages render their own refusals, as HTML.
        None if (status.is_client_error() || status.is_server_error())
            && !is_problem(&response)
            && !is_html(&response) =>
        {
            // Not from an ApiError: a framework rejection or a caught panic.
            let mut problem = ApiError::for_status(status).problem();
            problem.status = status.as_u16();
            Some(problem)
        }
        None => None,
    };
    if let Some(mut problem) = problem {
        problem.request_id = request_id.as_str().to_owned();
        let body = serde_json::to_vec(&problem).expect("a problem serializes");
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.remove(header::CONTENT_LENGTH);
        *response.body_mut() = Body::from(body);
    }
    response.headers_mut().insert(X_REQUEST_ID, request_id.0.clone());

    let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
    metrics.responses[class].increment(1);
    let elapsed = started.elapsed();
    metrics.duration.record(elapsed.as_secs_f64());
    let _entered = span.enter();
    let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
    // A 503 is a deliberate refusal (load shed, acceptance paused, database
    // unavailable — the cause is logged where it is found): logging each as
    // an error would make overload write a line per refused request. Any
    // other 5xx is one line, with what went wrong inside when it is known.
    if status.is_server_error() && status != axum::http::StatusCode::SERVICE_UNAVAILABLE {
        let path = uri.path();
        tracing::error!(
            request_id = request_id.as_str(),
            %method,
            path,
            op.id = operation_in_path(path),
            status = status.as_u16(),
            elapsed_ms,
            error = internal.as_ref().map(|e| e.0.as_str()),
            "request failed"
        );
    } else {
        tracing::debug!(status = status.as_u16(), elapsed_ms, "request handled");
    }
    response
}

/// `inner`'s answer to `req`.
async fn answer<S>(inner: S, req: Request) -> Response
where
    S: tower::Service<Request, Error = Infallible>,
    S::Response: IntoResponse,
{
    match tower::ServiceExt::oneshot(inner, req).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// [`edge`] as the outermost service of the stack (see `crate::router`).
///
/// A service of its own rather than `axum::middleware::from_fn`, which
/// boxes the inner stack again for every request (`Next`) and clones it
/// through a box: the edge is on the path of every request, `/healthz`
/// included.
#[derive(Clone)]
pub struct Edge<S> {
    app: AppState,
    inner: S,
}

impl<S> Edge<S> {
    pub fn new(app: AppState, inner: S) -> Self {
        Self { app, inner }
    }
}

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // `answer` waits for the inner stack's readiness itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let (app, inner) = (self.app.clone(), self.inner.clone());
        Box::pin(async move { Ok(edge(app, req, inner).await) })
    }
}

/// The edge's metrics, resolved once (a lookup by name and labels per
/// request cost more than the increment).
struct EdgeMetrics {
    /// `longrun_http_responses_total` by class, `1xx` to `5xx`.
    responses: [metrics::Counter; 5],
    duration: metrics::Histogram,
    shed: metrics::Counter,
}

impl EdgeMetrics {
    fn get() -> &'static EdgeMetrics {
        static METRICS: std::sync::OnceLock<EdgeMetrics> = std::sync::OnceLock::new();
        METRICS.get_or_init(|| {
            // Handles taken before the process's recorder is installed
            // would record nowhere.
            crate::metrics::handle();
            EdgeMetrics {
                responses: ["1xx", "2xx", "3xx", "4xx", "5xx"]
                    .map(|class| metrics::counter!("longrun_http_responses_total", "class" => class)),
                duration: metrics::histogram!("longrun_http_request_duration_seconds"),
                shed: metrics::counter!("longrun_http_shed_total"),
            }
        })
    }
}

/// The operation a path names: `/v1/operations/{id}…` or
/// `/v1/worker/tasks/{id}…`.
fn operation_in_path(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/v1/operations/")
        .or_else(|| path.strip_prefix("/v1/worker/tasks/"))?;
    let id = rest.split('/').next()?;
    Id::parse(IdKind::Operation, id).map(|_| id)
}

/// What a shed request is told to wait.
const SHED_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

fn is_html(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"))
}

fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()))
}

pub async fn not_found() -> ApiError {
    ApiError::NotFound
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
