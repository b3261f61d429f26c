//! API key material.
//!
//! A key looks like `lr_<key id body>_<secret>`: the id part lets the server
//! find the one row to check without scanning, the secret (256 random bits)
//! is stored only as its SHA-256 and compared in constant time. A fast hash is
//! the right tool here: the secret is random, not a password, so there is
//! nothing to brute-force.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::id::{Id, IdKind, random_base32};

const PREFIX: &str = "lr_";

/// Roles of docs/api.md §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Submits, reads and cancels its tenant's operations.
    Client,
    /// Claims tasks and reports on them (the operator's fleet).
    Worker,
    /// Everything, including keys, tenants and the console.
    Admin,
}

impl Role {
    /// Every role, in the order the CLI lists them.
    pub const ALL: [Role; 3] = [Role::Client, Role::Worker, Role::Admin];

    /// The role as stored and shown (`client`, `worker`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    /// The role named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A freshly minted key: the full token is shown once, only the hash is kept.
pub struct NewApiKey {
    /// The key's id (`key_…`), stored in the clear.
    pub id: Id,
    /// The whole token (`lr_…`): shown once, never stored.
    pub token: String,
    /// SHA-256 of the secret part: what is stored.
    pub secret_hash: [u8; 32],
}

impl NewApiKey {
    /// A new key with a fresh id and 160 random bits of secret.
    pub fn generate() -> Self {
        let id = Id::generate(IdKind::ApiKey);
        let secret = random_base32::<32>();
        let body = id.as_str().strip_prefix("key_").expect("key ids start with key_");
        let token = format!("{PREFIX}{body}_{secret}");
        let secret_hash = hash_secret(&secret);
        Self { id, token, secret_hash }
    }
}

/// A presented token split into the id to look up and the secret to check
/// (borrowed from the request: the secret is never copied, and never
/// printed: `Debug` shows the id alone).
pub struct PresentedKey<'a> {
    /// The id to look the key up by.
    pub id: Id,
    secret: &'a str,
}

impl std::fmt::Debug for PresentedKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PresentedKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<'a> PresentedKey<'a> {
    /// Splits a bearer token; `None` if it is not shaped like a key.
    pub fn parse(token: &'a str) -> Option<Self> {
        let rest = token.strip_prefix(PREFIX)?;
        let (body, secret) = rest.split_once('_')?;
        if secret.is_empty() || secret.len() > 128 {
            return None;
        }
        let mut id = String::with_capacity("key_".len() + body.len());
        id.push_str("key_");
        id.push_str(body);
        let id = Id::parse_owned(IdKind::ApiKey, id)?;
        Some(Self { id, secret })
    }

    /// Constant-time check against a stored hash.
    pub fn verify(&self, stored_hash: &[u8]) -> bool {
        hash_secret(self.secret).as_slice().ct_eq(stored_hash).into()
    }
}

fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_verifies_and_a_changed_one_does_not() {
        let key = NewApiKey::generate();
        let presented = PresentedKey::parse(&key.token).unwrap();
        assert_eq!(presented.id, key.id);
        assert!(presented.verify(&key.secret_hash));

        let mut tampered = key.token.clone();
        let last = tampered.pop().unwrap();
        tampered.push(if last == 'a' { 'b' } else { 'a' });
        assert!(!PresentedKey::parse(&tampered).unwrap().verify(&key.secret_hash));
    }

    #[test]
    fn a_presented_key_never_prints_its_secret() {
        let key = NewApiKey::generate();
        let secret = key.token.rsplit('_').next().unwrap();
        let printed = format!("{:?}", PresentedKey::parse(&key.token).unwrap());
        assert!(printed.contains(key.id.as_str()), "{printed}");
        assert!(!printed.contains(secret), "{printed}");
    }

    #[test]
    fn malformed_tokens_do_not_parse() {
        for bad in ["", "lr_", "lr_abc_def", "Bearer x", "lr_aaaaaaaaaaaaaaaaaaaaaaaaaa_"] {
            assert!(PresentedKey::parse(bad).is_none(), "{bad}");
        }
    }
}
