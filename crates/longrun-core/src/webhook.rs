//! Standard Webhooks signing (<https://www.standardwebhooks.com>) and the
//! address policy for webhook destinations.
//!
//! A secret is `whsec_` + base64 of 32 random bytes; the signature of a
//! message is `v1,` + base64(HMAC-SHA256(secret bytes, "{id}.{timestamp}.{body}")).
//! During a rotation both secrets sign, space-separated, so receivers holding
//! either verify.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use data_encoding::BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::id::random_bytes;

const SECRET_PREFIX: &str = "whsec_";

/// A webhook signing secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(…)")
    }
}

impl WebhookSecret {
    /// A new secret of 256 random bits.
    pub fn generate() -> Self {
        Self {
            key: random_bytes::<32>().to_vec(),
        }
    }

    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Option<Self> {
        let key = BASE64.decode(text.strip_prefix(SECRET_PREFIX)?.as_bytes()).ok()?;
        (!key.is_empty()).then_some(Self { key })
    }

    /// The `whsec_…` form, as shown to tenants.
    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", BASE64.encode(&self.key))
    }

    /// `v1,<base64 signature>` of one message.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", BASE64.encode(&self.mac(msg_id, timestamp, body)))
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }
}

/// The `webhook-signature` header: one signature per active secret.
pub fn signature_header(secrets: &[WebhookSecret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a webhook does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// `webhook-timestamp` is not a number.
    #[error("the webhook-timestamp is not a number")]
    BadTimestamp,
    /// `webhook-timestamp` is outside the tolerance (a replay, or clock skew).
    #[error("the webhook-timestamp is outside the tolerance")]
    StaleTimestamp,
    /// No signature matches any of the secrets.
    #[error("no signature matches")]
    NoMatch,
}

/// Verifies a received webhook: the timestamp within `tolerance` of `now`
/// (seconds since the epoch) and at least one `v1` signature made with `secret`.
pub fn verify(
    secret: &WebhookSecret,
    msg_id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp.trim().parse().map_err(|_| VerifyError::BadTimestamp)?;
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if (now - ts).abs() > tolerance {
        return Err(VerifyError::StaleTimestamp);
    }
    let expected = secret.mac(msg_id, ts, body);
    let matched = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b64| BASE64.decode(b64.as_bytes()).ok())
        .any(|given| bool::from(given.as_slice().ct_eq(&expected)));
    if matched { Ok(()) } else { Err(VerifyError::NoMatch) }
}

/// Whether `ip` is a public unicast address a webhook may be sent to. Refused:
/// loopback, private (RFC 1918), CGNAT, link-local (cloud metadata included),
/// multicast, unspecified, broadcast, reserved and documentation ranges, IPv6
/// loopback/ULA/link-local/multicast, and the IPv4-mapped, -compatible and
/// NAT64 forms of refused IPv4 addresses.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..=127).contains(&b)) // CGNAT 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240; // reserved
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let first = ip.segments()[0];
    let refused = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (first == 0x2001 && ip.segments()[1] == 0x0db8); // documentation
    !refused
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`) or NAT64 (`64:ff9b::a.b.c.d`) IPv6 address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let compatible = s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1);
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0];
    (mapped || compatible || nat64).then_some(tail)
}

/// Parses a retry schedule like `0s,5s,5m,30m,2h`: the delay before each attempt.
pub fn parse_schedule(text: &str) -> Result<Vec<Duration>, crate::duration::InvalidDuration> {
    text.split(',')
        .map(|part| crate::duration::parse_duration(part.trim()))
        .collect()
}

/// The delay before attempt `attempt` (1-based) from the schedule, stretched
/// by `jitter` (a fraction in `[0, 1)`, e.g. random) of up to 10 %; `None`
/// once the schedule is used up.
pub fn retry_delay(schedule: &[Duration], attempt: usize, jitter: f64) -> Option<Duration> {
    let base = *schedule.get(attempt.checked_sub(1)?)?;
    Some(base + base.mul_f64(jitter.clamp(0.0, 1.0) * 0.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_standard_webhooks_example() {
        // From the Standard Webhooks specification's test vectors.
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn verification_accepts_any_listed_signature_and_nothing_else() {
        let old = WebhookSecret::generate();
        let new = WebhookSecret::generate();
        let body = b"{\"type\":\"operation.succeeded\"}";
        let header = signature_header(&[new.clone(), old.clone()], "evt_1", 1000, body);
        let tolerance = Duration::from_secs(300);
        assert_eq!(verify(&old, "evt_1", "1000", &header, body, 1000, tolerance), Ok(()));
        assert_eq!(verify(&new, "evt_1", "1000", &header, body, 1100, tolerance), Ok(()));
        assert_eq!(
            verify(&old, "evt_1", "1000", &header, b"{}", 1000, tolerance),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&old, "evt_2", "1000", &header, body, 1000, tolerance),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&old, "evt_1", "1000", &header, body, 2000, tolerance),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            verify(&old, "evt_1", "soon", &header, body, 1000, tolerance),
            Err(VerifyError::BadTimestamp)
        );
        let stranger = WebhookSecret::generate();
        assert_eq!(
            verify(&stranger, "evt_1", "1000", &header, body, 1000, tolerance),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn secrets_round_trip_and_never_print() {
        let s = WebhookSecret::generate();
        assert!(s.expose().starts_with("whsec_"));
        assert_eq!(WebhookSecret::parse(&s.expose()), Some(s.clone()));
        assert_eq!(format!("{s:?}"), "WebhookSecret(…)");
        assert!(WebhookSecret::parse("whsec_").is_none() && WebhookSecret::parse("nope").is_none());
    }

    #[test]
    fn only_public_unicast_addresses_pass() {
        for refused in [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "198.18.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(refused.parse().unwrap()), "{refused} must be refused");
        }
        for allowed in [
            "93.184.216.34",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::101:101",
        ] {
            assert!(is_public(allowed.parse().unwrap()), "{allowed} is public");
        }
    }

    #[test]
    fn schedules_and_jitter() {
        let schedule = parse_schedule("0s,5s,5m,30m,2h,5h,10h,10h").unwrap();
        assert_eq!(schedule.len(), 8);
        assert_eq!(retry_delay(&schedule, 1, 0.5), Some(Duration::ZERO));
        assert_eq!(retry_delay(&schedule, 2, 0.0), Some(Duration::from_secs(5)));
        assert_eq!(
            retry_delay(&schedule, 2, 0.999),
            Some(Duration::from_secs(5) + Duration::from_secs(5).mul_f64(0.0999))
        );
        assert_eq!(retry_delay(&schedule, 9, 0.0), None);
        assert_eq!(retry_delay(&schedule, 0, 0.0), None);
        assert!(parse_schedule("0s,soon").is_err());
    }
}
