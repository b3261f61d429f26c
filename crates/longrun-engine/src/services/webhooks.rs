//! The webhook deliverer: sends the outbox's due events (docs/api.md §5,
//! Standard Webhooks) and records every attempt. At least once: an event is
//! leased while it is being sent, so a crashed deliverer's events are sent
//! again; receivers dedupe by `webhook-id`.
//!
//! Each attempt has a timeout, follows no redirect, counts only 2xx as
//! success and reads at most a bounded part of the answer. Destinations must
//! be `https` and public unless the development flags say otherwise: the URL's
//! host is resolved by [`GuardedResolver`], which hands the connector only the
//! addresses that passed the policy, so the connection goes to a checked
//! address (no DNS rebinding between check and connect).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longrun_core::Clock;
use longrun_core::webhook::{WebhookSecret, is_public, retry_delay, signature_header};
use longrun_store::{AttemptOutcome, AttemptParams, Change, Delivery, Store, StoreError};
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

/// What destinations are allowed (`--webhook-allow-http`, `--webhook-allow-private`).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeliveryPolicy {
    /// Allow `http://` receivers (not only `https://`).
    pub allow_http: bool,
    /// Allow receivers at private, loopback and link-local addresses.
    pub allow_private: bool,
}

/// How the webhook deliverer runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Delays before each attempt; the first attempt is immediate whatever
    /// the first entry says, and there are as many attempts as entries.
    pub schedule: Vec<Duration>,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// Longest an attempt may take.
    pub attempt_timeout: Duration,
    /// Most bytes of a receiver's answer read.
    pub max_response_bytes: usize,
    /// Most events taken per round.
    pub batch: u32,
    /// How long an event is reserved for the deliverer working on it.
    pub lease: Duration,
    /// Longest wait between looks for due events.
    pub interval: Duration,
    /// Which destinations are allowed.
    pub policy: DeliveryPolicy,
    /// Keep connections to receivers open between deliveries.
    pub reuse_connections: bool,
    /// How long a tenant's signing secrets are reused before they are read again.
    pub secret_cache: Duration,
}

/// `0s,5s,5m,30m,2h,5h,10h,10h`: 8 attempts over about a day.
pub fn default_schedule() -> Vec<Duration> {
    longrun_core::webhook::parse_schedule("0s,5s,5m,30m,2h,5h,10h,10h").expect("the default schedule parses")
}

impl Default for Config {
    fn default() -> Self {
        Self {
            schedule: default_schedule(),
            concurrency: 32,
            attempt_timeout: Duration::from_secs(10),
            max_response_bytes: 64 * 1024,
            batch: 200,
            lease: Duration::from_secs(60),
            interval: Duration::from_secs(1),
            policy: DeliveryPolicy::default(),
            reuse_connections: true,
            secret_cache: Duration::from_secs(5),
        }
    }
}

/// Name resolution, injectable so tests can make a name resolve to a private
/// address without touching the machine's DNS.
pub trait HostLookup: Send + Sync + 'static {
    /// The addresses `host` resolves to.
    fn lookup(&self, host: String) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
}

/// The operating system's resolver.
pub struct SystemLookup;

impl HostLookup for SystemLookup {
    fn lookup(&self, host: String) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("refused: {0} resolves only to addresses that are not public")]
struct RefusedAddress(String);

/// Resolves with `lookup` and keeps only the addresses the policy allows.
pub struct GuardedResolver {
    lookup: Arc<dyn HostLookup>,
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let lookup = self.lookup.clone();
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let ips = lookup.lookup(host.clone()).await?;
            let allowed: Vec<SocketAddr> = ips
                .into_iter()
                .filter(|ip| allow_private || is_public(*ip))
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            if allowed.is_empty() {
                return Err(Box::new(RefusedAddress(host)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Checks a URL against the policy before anything is resolved; IP literals
/// never reach the resolver, so they are checked here.
pub fn check_destination(url: &str, policy: DeliveryPolicy) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(url).map_err(|e| format!("refused: not a URL ({e})"))?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        other => return Err(format!("refused: scheme {other} is not allowed")),
    }
    let literal = match url.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        Some(url::Host::Domain(_)) => None,
        None => return Err("refused: no host".into()),
    };
    if let Some(ip) = literal
        && !policy.allow_private
        && !is_public(ip)
    {
        return Err(format!("refused: {ip} is not a public address"));
    }
    Ok(url)
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    /// Events acknowledged with a 2xx.
    pub delivered: u64,
    /// Attempts that failed with attempts left.
    pub retrying: u64,
    /// Events whose last attempt failed.
    pub given_up: u64,
}

/// Delivers due webhooks: signed (Standard Webhooks), retried on its schedule, to allowed destinations only.
pub struct Deliverer {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: Config,
    http: reqwest::Client,
    secrets: Mutex<HashMap<String, (Vec<WebhookSecret>, Instant)>>,
}

impl Deliverer {
    /// A deliverer resolving names with the operating system.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Self {
        Self::with_lookup(store, clock, config, Arc::new(SystemLookup))
    }

    /// A deliverer resolving names with `lookup`.
    pub fn with_lookup(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: Config,
        lookup: Arc<dyn HostLookup>,
    ) -> Self {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.attempt_timeout)
            .connect_timeout(config.attempt_timeout)
            .user_agent(concat!("Longrun-Webhooks/", env!("CARGO_PKG_VERSION")))
            .https_only(!config.policy.allow_http)
            .dns_resolver(Arc::new(GuardedResolver {
                lookup,
                allow_private: config.policy.allow_private,
            }));
        if !config.reuse_connections {
            builder = builder.pool_max_idle_per_host(0);
        }
        let http = builder.build().expect("an HTTP client");
        Self {
            store,
            clock,
            config,
            http,
            secrets: Mutex::new(HashMap::new()),
        }
    }

    async fn signing_secrets(&self, tenant: &str) -> Result<Vec<WebhookSecret>, StoreError> {
        if let Some((secrets, at)) = self.secrets.lock().expect("secret cache poisoned").get(tenant)
            && at.elapsed() < self.config.secret_cache
        {
            return Ok(secrets.clone());
        }
        let stored = self
            .store
            .webhook_secrets(tenant, WebhookSecret::generate().expose(), self.clock.now())
            .await?;
        let secrets: Vec<WebhookSecret> = stored.iter().filter_map(|s| WebhookSecret::parse(s)).collect();
        self.secrets
            .lock()
            .expect("secret cache poisoned")
            .insert(tenant.to_owned(), (secrets.clone(), Instant::now()));
        Ok(secrets)
    }

    /// Sends every event due now (up to the batch size), `concurrency` at a time.
    pub async fn run_once(self: &Arc<Self>) -> Result<(DeliveryCounts, usize), StoreError> {
        let due = self
            .store
            .webhook_due(self.clock.now(), self.config.batch, self.config.lease)
            .await?;
        let found = due.len();
        let slots = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        for delivery in due {
            let (this, permit) = (
                self.clone(),
                slots.clone().acquire_owned().await.expect("semaphore open"),
            );
            running.spawn(async move {
                let _permit = permit;
                this.deliver(delivery).await
            });
        }
        let mut counts = DeliveryCounts::default();
        let count = |outcome: &'static str| {
            metrics::counter!("longrun_webhook_deliveries_total", "outcome" => outcome).increment(1)
        };
        while let Some(joined) = running.join_next().await {
            match joined {
                Ok(Ok(AttemptOutcome::Delivered { .. })) => {
                    counts.delivered += 1;
                    count("delivered");
                }
                Ok(Ok(AttemptOutcome::Failed {
                    next_attempt_at: Some(_),
                    ..
                })) => {
                    counts.retrying += 1;
                    count("failed_will_retry");
                }
                Ok(Ok(AttemptOutcome::Failed {
                    next_attempt_at: None, ..
                })) => {
                    counts.given_up += 1;
                    count("given_up");
                }
                Ok(Err(e)) => tracing::error!(error = %e, "recording a delivery attempt failed"),
                Err(e) => tracing::error!(error = %e, "a delivery task failed"),
            }
        }
        Ok((counts, found))
    }

    #[tracing::instrument(name = "deliver", skip_all, fields(
        op.id = %delivery.operation_id, event.id = %delivery.event_id, attempt = delivery.attempts + 1,
    ))]
    async fn deliver(&self, delivery: Delivery) -> Result<AttemptOutcome, StoreError> {
        let attempt = delivery.attempts + 1;
        let started = std::time::Instant::now();
        let sent = self.send(&delivery).await;
        let latency_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let outcome = match sent {
            Ok(status) if (200..300).contains(&status) => AttemptOutcome::Delivered { status_code: status },
            failed => {
                let (status_code, error) = match failed {
                    Ok(status) => (Some(status), format!("the receiver answered {status}")),
                    Err(error) => (None, error),
                };
                let jitter = rand::random::<f64>();
                let next_attempt_at = retry_delay(&self.config.schedule, (attempt + 1) as usize, jitter)
                    .map(|delay| self.clock.now().plus(delay));
                if next_attempt_at.is_none() {
                    tracing::warn!(event = %delivery.event_id, op.id = %delivery.operation_id, attempts = attempt, "webhook given up");
                }
                AttemptOutcome::Failed {
                    status_code,
                    error,
                    next_attempt_at,
                }
            }
        };
        self.store
            .webhook_attempt(AttemptParams {
                event_id: delivery.event_id.clone(),
                attempt,
                outcome: outcome.clone(),
                now: self.clock.now(),
                latency_ms: Some(latency_ms),
            })
            .await?;
        Ok(outcome)
    }

    /// One attempt: the status code, or why there was none.
    async fn send(&self, delivery: &Delivery) -> Result<u16, String> {
        let url = check_destination(&delivery.url, self.config.policy)?;
        let secrets = self
            .signing_secrets(&delivery.tenant)
            .await
            .map_err(|e| format!("no signing secret: {e}"))?;
        let timestamp = self.clock.now().as_millis() / 1000;
        let body = delivery.payload.as_bytes();
        let signature = signature_header(&secrets, delivery.event_id.as_str(), timestamp, body);
        let response = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", delivery.event_id.as_str())
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(delivery.payload.clone())
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status().as_u16();
        // Read a bounded part of the answer, then let the connection go.
        let mut response = response;
        let mut read = 0;
        while read < self.config.max_response_bytes {
            match response.chunk().await {
                Ok(Some(chunk)) => read += chunk.len(),
                _ => break,
            }
        }
        Ok(status)
    }

    /// Sends due events until `shutdown`, looking again when anything
    /// changes (new events are written with the changes) or every interval.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut changes = self.store.subscribe_changes();
        let mut failures = crate::services::run::Failures::default();
        loop {
            let found = match self.run_once().await {
                Ok((counts, found)) => {
                    failures.succeeded("reading due webhooks");
                    if counts != DeliveryCounts::default() {
                        tracing::debug!(?counts, "webhook deliveries");
                    }
                    found
                }
                Err(e) => {
                    failures.failed("reading due webhooks", &e);
                    0
                }
            };
            if found >= self.config.batch as usize {
                continue;
            }
            tokio::select! {
                () = webhook_queued(&mut changes) => {
                    // Let a burst of changes settle into one look.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                () = tokio::time::sleep(self.config.interval) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

/// Resolves once a change may have queued a webhook: a change of an
/// operation with a callback, a resync, or changes missed (lagged). Other
/// changes (most of them, in a drain of work without callbacks) wake
/// nothing: looking for due webhooks after each had cost a transaction every
/// 5 ms under load.
async fn webhook_queued(changes: &mut broadcast::Receiver<Change>) {
    loop {
        match changes.recv().await {
            Ok(change) if !(change.callback || change.is_resync()) => {}
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return,
            // No more changes: only the interval wakes the deliverer.
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// The whole error chain, so a refused address or a timeout is named.
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_checked_before_any_lookup() {
        let strict = DeliveryPolicy::default();
        assert!(check_destination("https://client.example/hook", strict).is_ok());
        for refused in [
            "http://client.example/hook",
            "ftp://client.example/hook",
            "https://127.0.0.1/hook",
            "https://[::1]/hook",
            "https://[::ffff:169.254.169.254]/latest",
            "https://2130706433/hook",
            "https://10.0.0.8/hook",
            "not a url",
        ] {
            assert!(check_destination(refused, strict).is_err(), "{refused}");
        }
        let development = DeliveryPolicy {
            allow_http: true,
            allow_private: true,
        };
        assert!(check_destination("http://127.0.0.1:9000/hook", development).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_change_that_may_queue_a_webhook_wakes_the_deliverer() {
        let (feed, mut changes) = broadcast::channel(16);
        let plain = Change {
            operation_id: longrun_core::Id::generate(longrun_core::IdKind::Operation),
            event_type: "started".into(),
            ..Change::resync()
        };
        let wait = Duration::from_secs(5);
        feed.send(plain.clone()).unwrap();
        assert!(
            tokio::time::timeout(wait, webhook_queued(&mut changes)).await.is_err(),
            "a change of an operation without a callback wakes nothing"
        );
        feed.send(plain.clone()).unwrap();
        feed.send(Change {
            callback: true,
            ..plain
        })
        .unwrap();
        tokio::time::timeout(wait, webhook_queued(&mut changes))
            .await
            .expect("a change of an operation with a callback wakes it");
        feed.send(Change::resync()).unwrap();
        tokio::time::timeout(wait, webhook_queued(&mut changes))
            .await
            .expect("so does a resync");
        drop(feed);
        assert!(
            tokio::time::timeout(wait, webhook_queued(&mut changes)).await.is_err(),
            "a closed feed leaves the deliverer to its interval"
        );
    }
}
