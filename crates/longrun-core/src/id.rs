//! Opaque, prefixed, unguessable identifiers: `op_…`, `res_…`, `evt_…`.
//!
//! 144 bits written in lowercase base32 without padding (29 characters):
//! the creation time in milliseconds since the Unix epoch (48 bits, as in a
//! ULID) then 96 random bits from a cryptographically secure generator
//! (rand's `ThreadRng`: ChaCha12 seeded and periodically reseeded from the
//! operating system, so no syscall per id). The alphabet is RFC 4648's
//! letters and digits in ASCII order, so ids sort by creation millisecond:
//! new rows land together at the right-hand end of every index keyed by an
//! id (operations, tasks, events, idempotency records, deliveries) instead
//! of on a random page of each. Nothing reads the time back, and the 96
//! random bits keep ids unguessable (docs/api.md §1); PostgreSQL relies on
//! the order alone to place webhook deliveries in a partition per day of
//! their ids ([`Id::lowest_at`] bounds the days).
//!
//! Two older shapes still parse (26 characters, 128 bits): the creation
//! second (32 bits) then 96 random bits, and before that 128 random bits.
//! Whole seconds left the ids of one second in random order: a batch of
//! submissions or claims touched as many index pages as it had ids.

use std::fmt;

use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use data_encoding::{BASE32_NOPAD, Encoding, Specification};
use rand::RngCore;

/// Characters after the prefix and underscore.
const BODY_LEN: usize = 29;

/// Characters after the prefix of ids made before millisecond ids.
const OLD_BODY_LEN: usize = 26;

/// What an id names; each kind has its own prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdKind {
    /// `op_`: an operation.
    Operation,
    /// `res_`: a result artifact.
    Result,
    /// `evt_`: a webhook event.
    Event,
    /// `key_`: an API key.
    ApiKey,
    /// `req_`: a request (`X-Request-Id`).
    Request,
    /// `upl_`: an upload.
    Upload,
    /// `sch_`: a schedule.
    Schedule,
}

impl IdKind {
    /// The prefix, without its underscore (`op`, `res`, …).
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Operation => "op",
            IdKind::Result => "res",
            IdKind::Event => "evt",
            IdKind::ApiKey => "key",
            IdKind::Request => "req",
            IdKind::Upload => "upl",
            IdKind::Schedule => "sch",
        }
    }
}

/// A validated id of some [`IdKind`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(String);

impl Id {
    /// A new id of `kind`: a millisecond prefix, then random bits.
    pub fn generate(kind: IdKind) -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Self::generate_at(kind, u64::try_from(millis).unwrap_or(u64::MAX))
    }

    /// An id created at `unix_millis` (see the module documentation).
    pub fn generate_at(kind: IdKind, unix_millis: u64) -> Self {
        Self::of_bytes(kind, unix_millis, random_bytes::<12>())
    }

    /// The id of `kind` whose first 48 bits are `unix_millis` and the rest
    /// `random`.
    fn of_bytes(kind: IdKind, unix_millis: u64, random: [u8; 12]) -> Self {
        let mut bytes = [0u8; 18];
        bytes[..6].copy_from_slice(&unix_millis.to_be_bytes()[2..]);
        bytes[6..].copy_from_slice(&random);
        let mut id = String::with_capacity(kind.prefix().len() + 1 + BODY_LEN);
        id.push_str(kind.prefix());
        id.push('_');
        SORTED_BASE32.encode_append(&bytes, &mut id);
        Self(id)
    }

    /// The least id of `kind` that [`Id::generate_at`] makes at
    /// `unix_millis` (its random bits all zero): every id made at that
    /// millisecond or later sorts at or after it, every one made before
    /// sorts before it. PostgreSQL bounds its partitions of webhook
    /// deliveries with it (docs/scaling.md).
    pub fn lowest_at(kind: IdKind, unix_millis: u64) -> Self {
        Self::of_bytes(kind, unix_millis, [0; 12])
    }

    /// Accepts only what [`Id::generate`] could have produced for `kind`,
    /// so malformed ids are rejected before any lookup.
    pub fn parse(kind: IdKind, s: &str) -> Option<Self> {
        Self::well_formed(kind, s).then(|| Self(s.to_owned()))
    }

    /// [`Id::parse`] of text the caller owns, kept without a copy.
    pub fn parse_owned(kind: IdKind, s: String) -> Option<Self> {
        Self::well_formed(kind, &s).then_some(Self(s))
    }

    fn well_formed(kind: IdKind, s: &str) -> bool {
        let Some(body) = s.strip_prefix(kind.prefix()).and_then(|s| s.strip_prefix('_')) else {
            return false;
        };
        (body.len() == BODY_LEN || body.len() == OLD_BODY_LEN)
            && body
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    }

    /// Wraps a value read back from our own storage.
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's text, without copying it.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Base32 over RFC 4648's characters (lowercase) in ASCII order, so the
/// encoded text sorts as the bytes do.
static SORTED_BASE32: LazyLock<Encoding> = LazyLock::new(|| {
    let mut spec = Specification::new();
    spec.symbols.push_str("234567abcdefghijklmnopqrstuvwxyz");
    spec.encoding().expect("a valid base32 alphabet")
});

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
        assert_eq!(
            Id::parse_owned(IdKind::Operation, a.as_str().to_owned()),
            Some(a.clone())
        );
        assert_eq!(Id::parse_owned(IdKind::Result, a.into_string()), None);
    }

    #[test]
    fn the_lowest_id_of_a_millisecond_bounds_the_ids_made_then() {
        for ms in [0, 31, 32, 1_800_000_000_000, (1 << 48) - 2] {
            let lowest = Id::lowest_at(IdKind::Event, ms);
            assert_eq!(Id::parse(IdKind::Event, lowest.as_str()).as_ref(), Some(&lowest));
            for _ in 0..100 {
                let made = Id::generate_at(IdKind::Event, ms);
                assert!(lowest <= made && made < Id::lowest_at(IdKind::Event, ms + 1), "{made}");
                assert!(Id::generate_at(IdKind::Event, ms + 1) >= Id::lowest_at(IdKind::Event, ms + 1));
            }
        }
    }

    #[test]
    fn ids_sort_by_creation_millisecond_and_stay_unguessable() {
        let millis = [
            0,
            1,
            31,
            32,
            1_700_000_000_000,
            1_800_000_000_000,
            1_800_000_000_001,
            1_800_000_000_002,
            (1 << 48) - 1,
        ];
        let ids: Vec<Id> = millis
            .iter()
            .map(|&ms| Id::generate_at(IdKind::Operation, ms))
            .collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        for id in &ids {
            assert_eq!(Id::parse(IdKind::Operation, id.as_str()).as_ref(), Some(id));
        }
        // One millisecond, many ids: the same 48-bit prefix (9 characters
        // and 3 bits of the tenth), 96 random bits after it.
        let same: std::collections::HashSet<String> = (0..1000)
            .map(|_| Id::generate_at(IdKind::Operation, 1_800_000_000_000).into_string())
            .collect();
        assert_eq!(same.len(), 1000);
        assert_eq!(
            same.iter()
                .map(|id| &id[..3 + 9])
                .collect::<std::collections::HashSet<_>>()
                .len(),
            1
        );
        // Ids from before, second-prefixed or 128 random bits, still parse.
        let old = format!("op_{}", random_base32::<16>());
        assert!(Id::parse(IdKind::Operation, &old).is_some());
        let second = format!(
            "op_{}",
            SORTED_BASE32.encode(&[0x65, 0x5f, 0x0c, 0x00, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        );
        assert!(Id::parse(IdKind::Operation, &second).is_some());
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
