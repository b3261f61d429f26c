//! What reads answer, for both edges: list pages and their tokens, how
//! long an idempotency record is kept, and a result's download links.

use std::time::Duration;

use longrun_api::{ArtifactBody, Download, ResultBody};
use longrun_core::{Id, Timestamp, links};
use longrun_store::{DEFAULT_ARTIFACT, Operation, ResultRecord};

use super::{ApiError, AppState};

/// A list's page when `page_size` is 0 or absent.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
/// The largest `page_size`.
pub const MAX_PAGE_SIZE: u32 = 100;
/// Idempotency records never live less than this after an operation ends.
pub const MIN_IDEMPOTENCY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// A list's `page_size`: 0 or absent is [`DEFAULT_PAGE_SIZE`], more than
/// [`MAX_PAGE_SIZE`] is refused.
pub fn page_size(asked: Option<u32>) -> Result<u32, ApiError> {
    match asked {
        None | Some(0) => Ok(DEFAULT_PAGE_SIZE),
        Some(n) if n <= MAX_PAGE_SIZE => Ok(n),
        Some(n) => Err(ApiError::InvalidRequest(format!(
            "page_size {n} is more than {MAX_PAGE_SIZE}"
        ))),
    }
}

/// Page tokens are the keyset position in base 36: opaque to clients, and
/// every string of the documented pattern is one (a position past the end
/// gives an empty page).
const PAGE_TOKEN_PATTERN_MAX: usize = 12;

/// The token of the page that starts before `before_seq`.
pub fn encode_page_token(before_seq: i64) -> String {
    let mut n = u64::try_from(before_seq).unwrap_or(0);
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((n % 36) as u32, 36).expect("a base-36 digit"));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
}

/// The position a token names; a token this server cannot have issued is refused.
pub fn decode_page_token(token: &str) -> Result<i64, ApiError> {
    let invalid = || ApiError::InvalidRequest("page_token is not a token this server issued".into());
    let well_formed = !token.is_empty()
        && token.len() <= PAGE_TOKEN_PATTERN_MAX
        && token.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    if !well_formed {
        return Err(invalid());
    }
    i64::from_str_radix(token, 36).map_err(|_| invalid())
}

/// Until when the idempotency record is kept: as long as the operation's
/// record. For an operation still running that is at least the retention
/// period from now, which is what we promise.
pub fn idempotency_expires(app: &AppState, op: &Operation, now: Timestamp) -> Timestamp {
    let retention = app.config.operation_retention.max(MIN_IDEMPOTENCY_LIFETIME);
    op.expires_at.unwrap_or_else(|| now.plus(retention))
}

/// The result artifacts of `id`, each with a download link minted now
/// (HMAC-signed, short-lived). The API and the console's download button
/// mint links through here.
pub async fn result_links(app: &AppState, tenant: &str, id: Id) -> Result<ResultBody, ApiError> {
    let records = app.store.result_for_operation(tenant, &id).await?;
    if records.is_empty() {
        // No artifact: unknown, removed, not finished, or an inline result.
        return Err(app.missing(tenant, &id).await);
    }
    app.operation(tenant, &id).await?;
    let now = app.clock.now();
    let live: Vec<ResultRecord> = records.into_iter().filter(|r| !r.is_expired(now)).collect();
    if live.is_empty() {
        return Err(ApiError::ResultExpired { operation_id: id });
    }
    let expires = now.plus(app.config.link_ttl);
    let expires_secs = expires.as_millis() / 1000;
    let (kid, key) = app.link_key_current().await?;
    let mut body = ResultBody {
        operation_id: id.to_string(),
        artifact: None,
        artifacts: Default::default(),
    };
    for record in live {
        let signature = links::sign(&key, record.id.as_str(), expires_secs);
        let url = format!(
            "/v1/results/{}/content?expires={expires_secs}&kid={kid}&signature={signature}",
            record.id
        );
        let artifact = ArtifactBody {
            id: record.id.to_string(),
            content_type: record.content_type,
            size_bytes: record.size_bytes,
            sha256: record.sha256,
            created_at: record.created_at.to_rfc3339(),
            expires_at: record.expires_at.map(|t| t.to_rfc3339()),
            download: Download {
                url,
                expires_at: longrun_core::Timestamp(expires_secs * 1000).to_rfc3339(),
            },
        };
        if record.name == DEFAULT_ARTIFACT {
            body.artifact = Some(artifact);
        } else {
            body.artifacts.insert(record.name, artifact);
        }
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        for seq in [0, 1, 35, 36, 42, 1 << 40, 4_000_000_000_000_000_000] {
            let token = encode_page_token(seq);
            assert!(token.len() <= PAGE_TOKEN_PATTERN_MAX, "{token}");
            assert_eq!(decode_page_token(&token).unwrap(), seq);
        }
        for bad in ["", "!!", "djE6", "ABC", "zzzzzzzzzzzzz", "-1"] {
            assert!(decode_page_token(bad).is_err(), "{bad}");
        }
    }
}
