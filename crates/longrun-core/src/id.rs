//! Opaque, prefixed, unguessable identifiers: `op_…`, `res_…`, `evt_…`.
//!
//! 128 random bits from a cryptographically secure generator (rand's
//! `ThreadRng`: ChaCha12 seeded and periodically reseeded from the operating
//! system, so no syscall per id), written in lowercase RFC 4648 base32
//! without padding (26 characters). Ids are never derived from anything a
//! client could guess or enumerate.

use std::fmt;

use data_encoding::BASE32_NOPAD;
use rand::RngCore;

/// Characters after the prefix and underscore.
const BODY_LEN: usize = 26;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdKind {
    Operation,
    Result,
    Event,
    ApiKey,
    Request,
}

impl IdKind {
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Operation => "op",
            IdKind::Result => "res",
            IdKind::Event => "evt",
            IdKind::ApiKey => "key",
            IdKind::Request => "req",
        }
    }
}

/// A validated id of some [`IdKind`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(String);

impl Id {
    pub fn generate(kind: IdKind) -> Self {
        let body = random_base32::<16>();
        Self(format!("{}_{}", kind.prefix(), body))
    }

    /// Accepts only what [`Id::generate`] could have produced for `kind`,
    /// so malformed ids are rejected before any lookup.
    pub fn parse(kind: IdKind, s: &str) -> Option<Self> {
        let body = s.strip_prefix(kind.prefix())?.strip_prefix('_')?;
        let well_formed = body.len() == BODY_LEN
            && body
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b));
        well_formed.then(|| Self(s.to_owned()))
    }

    /// Wraps a value read back from our own storage.
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `N` random bytes, base32 lowercase without padding.
pub fn random_base32<const N: usize>() -> String {
    BASE32_NOPAD.encode(&random_bytes::<N>()).to_ascii_lowercase()
}

/// `N` random bytes from a CSPRNG seeded by the operating system.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_back_and_differ() {
        let a = Id::generate(IdKind::Operation);
        let b = Id::generate(IdKind::Operation);
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("op_"));
        assert_eq!(a.as_str().len(), 3 + BODY_LEN);
        assert_eq!(Id::parse(IdKind::Operation, a.as_str()), Some(a.clone()));
        assert_eq!(Id::parse(IdKind::Result, a.as_str()), None);
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "op_",
            "op_abc",
            "op_ABCDEFGHIJKLMNOPQRSTUVWXYZ",
            "op-aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "op_aaaaaaaaaaaaaaaaaaaaaaaaa1",
        ] {
            assert_eq!(Id::parse(IdKind::Operation, bad), None, "{bad}");
        }
        assert!(Id::parse(IdKind::Operation, "op_aaaaaaaaaaaaaaaaaaaaaaaaaa").is_some());
    }
}
