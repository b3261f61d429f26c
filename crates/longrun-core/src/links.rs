//! Short-lived download links: `…/content?expires=…&kid=…&signature=…`, an
//! HMAC-SHA-256 over the result id and the expiry under a server key named by
//! `kid`. Links are minted per request and never stored; keys can be added
//! (rotated) while older ones still verify the links they signed.

use data_encoding::BASE64URL_NOPAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

fn mac(key: &[u8], result_id: &str, expires: i64) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(b"longrun-download-v1\n");
    mac.update(result_id.as_bytes());
    mac.update(b"\n");
    mac.update(expires.to_string().as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// The `signature` of a link to `result_id` valid until `expires` (seconds).
pub fn sign(key: &[u8], result_id: &str, expires: i64) -> String {
    BASE64URL_NOPAD.encode(&mac(key, result_id, expires))
}

/// Why a download link is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The signature does not match the id and expiry (or the key is unknown).
    #[error("the link's signature does not match")]
    Tampered,
    /// The link's expiry has passed.
    #[error("the link has expired")]
    Expired,
}

/// Checks a presented link in constant time; `now` in seconds.
pub fn verify(key: &[u8], result_id: &str, expires: i64, signature: &str, now: i64) -> Result<(), LinkError> {
    let given = BASE64URL_NOPAD
        .decode(signature.as_bytes())
        .map_err(|_| LinkError::Tampered)?;
    if !bool::from(given.as_slice().ct_eq(&mac(key, result_id, expires))) {
        return Err(LinkError::Tampered);
    }
    if now > expires {
        return Err(LinkError::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_verifies_only_unchanged_and_in_time() {
        let key = b"k1";
        let sig = sign(key, "res_a", 1000);
        assert_eq!(verify(key, "res_a", 1000, &sig, 999), Ok(()));
        assert_eq!(verify(key, "res_a", 1000, &sig, 1001), Err(LinkError::Expired));
        assert_eq!(
            verify(key, "res_b", 1000, &sig, 999),
            Err(LinkError::Tampered),
            "another result"
        );
        assert_eq!(
            verify(key, "res_a", 2000, &sig, 999),
            Err(LinkError::Tampered),
            "a longer life"
        );
        assert_eq!(
            verify(b"k2", "res_a", 1000, &sig, 999),
            Err(LinkError::Tampered),
            "another key"
        );
        assert_eq!(verify(key, "res_a", 1000, "!!", 999), Err(LinkError::Tampered));
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever a client puts in the query, only the signature minted
        /// for that result and expiry verifies.
        #[test]
        fn only_the_minted_signature_verifies(
            expires in any::<i64>(),
            other_expires in any::<i64>(),
            signature in any::<String>(),
            id in "[a-z0-9_]{0,30}",
        ) {
            let key = b"fuzz";
            let minted = sign(key, &id, expires);
            prop_assert_eq!(verify(key, &id, expires, &minted, i64::MIN), Ok(()));
            if signature != minted {
                prop_assert_eq!(verify(key, &id, expires, &signature, i64::MIN), Err(LinkError::Tampered));
            }
            if other_expires != expires {
                prop_assert_eq!(verify(key, &id, other_expires, &minted, i64::MIN), Err(LinkError::Tampered));
            }
        }
    }
}
