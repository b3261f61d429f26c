//! Receiving Longrun webhooks: verify the Standard Webhooks signature (any of
//! several during a secret rotation, a timestamp tolerance, constant-time
//! comparison) and apply each event once ([`Dedupe`]).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use longrun_core::webhook::{self, WebhookSecret};

pub use longrun_api::{WebhookData, WebhookEvent};
pub use longrun_core::webhook::VerifyError;

/// The default tolerance between the `webhook-timestamp` and now.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Why a delivery is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The receiver's secret is not a `whsec_…` secret (a setup mistake).
    #[error("the secret is not a whsec_ secret")]
    BadSecret,
    /// A Standard Webhooks header is missing.
    #[error("a webhook header is missing: {0}")]
    MissingHeader(&'static str),
    /// The signature or timestamp does not verify: refuse the delivery.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// Signed, but not a Longrun event body.
    #[error("the body is not a Longrun event: {0}")]
    Body(String),
}

/// Verifies a delivery and parses its body. `header` looks a header up by
/// (lowercase) name, whatever HTTP library the receiver uses.
pub fn verify_webhook<'a>(
    secret: &str,
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
    tolerance: Duration,
) -> Result<(String, WebhookEvent), WebhookError> {
    let secret = WebhookSecret::parse(secret).ok_or(WebhookError::BadSecret)?;
    let id = header("webhook-id").ok_or(WebhookError::MissingHeader("webhook-id"))?;
    let timestamp = header("webhook-timestamp").ok_or(WebhookError::MissingHeader("webhook-timestamp"))?;
    let signatures = header("webhook-signature").ok_or(WebhookError::MissingHeader("webhook-signature"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    webhook::verify(&secret, id, timestamp, signatures, body, now, tolerance)?;
    let event = serde_json::from_slice(body).map_err(|e| WebhookError::Body(e.to_string()))?;
    Ok((id.to_owned(), event))
}

/// Remembers the last `capacity` webhook ids: deliveries are at least once,
/// so a receiver applies an id only the first time it sees it.
pub struct Dedupe {
    capacity: usize,
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl Dedupe {
    /// Remembers up to `capacity` delivery ids (the oldest are forgotten first).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            seen: Mutex::default(),
        }
    }

    /// `true` the first time `id` is seen: apply the event then.
    pub fn first_time(&self, id: &str) -> bool {
        let mut guard = self.seen.lock().expect("dedupe poisoned");
        let (set, order) = &mut *guard;
        if set.contains(id) {
            return false;
        }
        set.insert(id.to_owned());
        order.push_back(id.to_owned());
        if order.len() > self.capacity
            && let Some(old) = order.pop_front()
        {
            set.remove(&old);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_delivery_verifies_and_dedupes() {
        let secret = WebhookSecret::generate();
        let body = br#"{"type":"operation.succeeded","timestamp":"2026-11-29T00:00:00.000Z","data":{"operation_id":"op_x","version":3,"state":"succeeded","kind":"export"}}"#;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let other = WebhookSecret::generate();
        let signature = longrun_core::webhook::signature_header(&[other, secret.clone()], "evt_1", now, body);
        let headers = [
            ("webhook-id", "evt_1".to_owned()),
            ("webhook-timestamp", now.to_string()),
            ("webhook-signature", signature),
        ];
        let lookup = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        let (id, event) = verify_webhook(&secret.expose(), lookup, body, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(
            (id.as_str(), event.data.version, event.event_type.as_str()),
            ("evt_1", 3, "operation.succeeded")
        );
        assert!(matches!(
            verify_webhook(&secret.expose(), lookup, b"{}", DEFAULT_TOLERANCE),
            Err(WebhookError::Verify(_))
        ));
        assert!(matches!(
            verify_webhook("nope", lookup, body, DEFAULT_TOLERANCE),
            Err(WebhookError::BadSecret)
        ));
        let missing = |_: &str| None;
        assert!(matches!(
            verify_webhook(&secret.expose(), missing, body, DEFAULT_TOLERANCE),
            Err(WebhookError::MissingHeader(_))
        ));

        let dedupe = Dedupe::new(2);
        assert!(dedupe.first_time("evt_1"));
        assert!(!dedupe.first_time("evt_1"));
        assert!(dedupe.first_time("evt_2") && dedupe.first_time("evt_3"));
        assert!(dedupe.first_time("evt_1"), "forgotten past the capacity");
    }
}
