//! The HTTP listener: accepts connections and serves each with hyper, bounded
//! against hostile and careless clients.
//!
//! - A client must send a request's head within `header_read_timeout`, and an
//!   idle keep-alive connection is closed after the same time (slow-loris).
//! - A request body that stalls for `body_stall_timeout` between chunks ends
//!   with `400 invalid_request` (see [`crate::app`]).
//! - A response the client stops reading for `send_stall_timeout` ends the
//!   connection, so a client that never reads holds its connection, its
//!   response and its buffers for that long at most.
//! - At most `max_connections` are open at once; one more is answered `503
//!   temporarily_unavailable` with `Retry-After` and closed, never queued.
//! - Every request carries its peer address ([`ConnectInfo`]), which the
//!   authentication limits per source.
//!
//! Shutdown is graceful: the listener stops accepting, in-flight requests
//! finish, idle connections close.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::app::Limits;

/// How long a refused connection is given to take its `503`.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves `stack` on `listener` until `stop`, then drains.
pub async fn serve(
    listener: TcpListener,
    stack: impl crate::router::Served,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors or a connection reset before accept:
                // neither ends the server.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("longrun_http_connections_refused_total").increment(1);
            tokio::spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = stack
            .clone()
            .map_request(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req.map(axum::body::Body::new)
            });
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.send_stall_timeout));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(Box::pin(stream)), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                if stalled(&e) {
                    metrics::counter!("longrun_http_send_stalls_total").increment(1);
                }
                tracing::trace!(error = %e, %peer, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Whether a connection ended because its client stopped reading.
fn stalled(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// The answer to a connection over the cap: a problem, then close. Like
/// every response it carries a request id (docs/api.md §6), though no request
/// was read.
async fn refuse(mut stream: TcpStream) {
    let mut problem = crate::app::ApiError::TemporarilyUnavailable {
        detail: "the server has as many connections open as it allows".into(),
        retry_after: Duration::from_secs(1),
    }
    .problem();
    problem.request_id = longrun_core::Id::generate(longrun_core::IdKind::Request).into_string();
    let body = serde_json::to_string(&problem).expect("a problem serializes");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\n\
         x-request-id: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        problem.request_id,
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}
