//! The `Idempotency-Key` newtype: 1–255 visible ASCII characters (0x21–0x7E),
//! not beginning `schedule:` (the keys of schedules' firings, which only
//! the server makes).

use std::fmt;

/// The prefix of the keys of schedules' firings.
const FIRING_PREFIX: &str = "schedule:";

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// A checked `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why an `Idempotency-Key` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdempotencyKey {
    /// No characters.
    #[error("the Idempotency-Key header is empty")]
    Empty,
    /// More than [`MAX_KEY_LEN`] characters.
    #[error("the Idempotency-Key header is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    /// A character outside 0x21–0x7E.
    #[error("the Idempotency-Key header may contain only visible ASCII characters")]
    NotVisibleAscii,
    /// The prefix of the keys of schedules' firings.
    #[error("an Idempotency-Key may not begin with \"schedule:\" (the server's keys for schedules' firings)")]
    Reserved,
}

impl IdempotencyKey {
    /// Checks a header's raw bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, InvalidIdempotencyKey> {
        if raw.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(InvalidIdempotencyKey::TooLong);
        }
        if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(InvalidIdempotencyKey::NotVisibleAscii);
        }
        if raw.starts_with(FIRING_PREFIX.as_bytes()) {
            return Err(InvalidIdempotencyKey::Reserved);
        }
        // Every byte is ASCII, so this cannot fail.
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The key of a schedule's firing at `fire_time` (see
    /// [`crate::schedule::firing_key`]): made by the server, never parsed
    /// from a client.
    pub fn for_firing(schedule_id: &str, fire_time: crate::Timestamp) -> Self {
        Self(crate::schedule::firing_key(schedule_id, fire_time))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_syntax() {
        assert!(IdempotencyKey::parse(b"a").is_ok());
        assert!(IdempotencyKey::parse(b"0f8fad5b-d9cb-469f-a165-70867728950e").is_ok());
        assert!(IdempotencyKey::parse(&[b'x'; 255]).is_ok());
        assert_eq!(IdempotencyKey::parse(b""), Err(InvalidIdempotencyKey::Empty));
        assert_eq!(IdempotencyKey::parse(&[b'x'; 256]), Err(InvalidIdempotencyKey::TooLong));
        assert_eq!(
            IdempotencyKey::parse(b"has space"),
            Err(InvalidIdempotencyKey::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse("é".as_bytes()),
            Err(InvalidIdempotencyKey::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"tab\t"),
            Err(InvalidIdempotencyKey::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"schedule:sch_x:2026-12-06T02:00:00.000Z"),
            Err(InvalidIdempotencyKey::Reserved)
        );
        assert!(IdempotencyKey::parse(b"schedules-nightly").is_ok());
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any bytes: accepted exactly when 1–255 visible ASCII characters.
        #[test]
        fn any_bytes_are_a_key_exactly_when_visible_ascii(raw in prop::collection::vec(any::<u8>(), 0..300)) {
            let visible = !raw.is_empty() && raw.len() <= MAX_KEY_LEN && raw.iter().all(|b| (0x21..=0x7e).contains(b))
                && !raw.starts_with(b"schedule:");
            match IdempotencyKey::parse(&raw) {
                Ok(key) => {
                    prop_assert!(visible);
                    prop_assert_eq!(key.as_str().as_bytes(), &raw[..]);
                }
                Err(_) => prop_assert!(!visible),
            }
        }
    }
}
