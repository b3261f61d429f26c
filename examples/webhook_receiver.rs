//! A webhook receiver that verifies Standard Webhooks signatures and applies
//! each event once (deliveries are at least once).
//!
//! ```sh
//! LONGRUN_WEBHOOK_SECRET=$(longrun tenants webhook-secret default) \
//!   cargo run -p longrun-client --example webhook_receiver
//! ```

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use longrun_client::webhooks::{DEFAULT_TOLERANCE, Dedupe, verify_webhook};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = Arc::new(std::env::var("LONGRUN_WEBHOOK_SECRET")?);
    let dedupe = Arc::new(Dedupe::new(100_000));
    let app = Router::new().route(
        "/hooks/longrun",
        post(move |headers: HeaderMap, body: Bytes| {
            let (secret, dedupe) = (secret.clone(), dedupe.clone());
            async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
                match verify_webhook(&secret, header, &body, DEFAULT_TOLERANCE) {
                    Ok((id, event)) => {
                        if dedupe.first_time(&id) {
                            // A hint: fetch the operation for its result.
                            println!(
                                "{} {} -> {}",
                                event.event_type, event.data.operation_id, event.data.state
                            );
                        }
                        StatusCode::NO_CONTENT
                    }
                    Err(e) => {
                        eprintln!("refused a delivery: {e}");
                        StatusCode::UNAUTHORIZED
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
    println!("listening on http://127.0.0.1:9000/hooks/longrun");
    axum::serve(listener, app).await?;
    Ok(())
}
