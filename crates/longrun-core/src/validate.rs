//! Bounds and syntax for what clients submit, checked before anything is
//! accepted. Each rule names the field it is about, so the HTTP edge can say
//! exactly what was wrong.

use std::collections::BTreeMap;

use serde_json::Value;

/// The longest kind name.
pub const MAX_KIND_LEN: usize = 64;
/// The most labels one operation may carry.
pub const MAX_LABELS: usize = 32;
/// The longest label key.
pub const MAX_LABEL_KEY_LEN: usize = 63;
/// The longest label value, in characters.
pub const MAX_LABEL_VALUE_LEN: usize = 256;
/// The serialized `input` may not exceed this, whatever the body limit is.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// The longest deadline any kind may be given: 30 days.
pub const MAX_DEADLINE_SECONDS: u64 = 30 * 24 * 3600;

/// A field that breaks its rule: answered `400 invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    /// The field, as the request names it.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        field,
        message: message.into(),
    }
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
}

/// A kind name: 1–64 of `a-z 0-9 _ . -`, starting with a letter or digit.
pub fn kind_name(kind: &str) -> Result<(), Invalid> {
    let ok = !kind.is_empty()
        && kind.len() <= MAX_KIND_LEN
        && kind.bytes().all(is_name_char)
        && kind.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "kind",
            format!("must be 1–{MAX_KIND_LEN} characters of a-z, 0-9, '_', '.', '-'"),
        ))
    }
}

/// Labels: at most 32; keys like kind names (plus '/') up to 63 characters;
/// string values up to 256 characters.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if labels.len() > MAX_LABELS {
        return Err(invalid("labels", format!("at most {MAX_LABELS} labels")));
    }
    for (key, value) in labels {
        let key_ok =
            !key.is_empty() && key.len() <= MAX_LABEL_KEY_LEN && key.bytes().all(|b| is_name_char(b) || b == b'/');
        if !key_ok {
            return Err(invalid(
                "labels",
                format!("label key {key:?} must be 1–{MAX_LABEL_KEY_LEN} characters of a-z, 0-9, '_', '.', '-', '/'"),
            ));
        }
        if value.chars().count() > MAX_LABEL_VALUE_LEN {
            return Err(invalid(
                "labels",
                format!("label {key:?} is longer than {MAX_LABEL_VALUE_LEN} characters"),
            ));
        }
    }
    Ok(())
}

/// A label selector of `GET /v1/operations?label=k:v`.
pub fn label_selector(selector: &str) -> Result<(String, String), Invalid> {
    let (k, v) = selector
        .split_once(':')
        .ok_or_else(|| invalid("label", "must be key:value"))?;
    let mut one = BTreeMap::new();
    one.insert(k.to_owned(), v.to_owned());
    labels(&one).map_err(|e| invalid("label", e.message))?;
    Ok((k.to_owned(), v.to_owned()))
}

/// An input within [`MAX_INPUT_BYTES`] as compact JSON.
pub fn input_size(input: &Value) -> Result<(), Invalid> {
    let len = serde_json::to_string(input).map(|s| s.len()).unwrap_or(usize::MAX);
    if len > MAX_INPUT_BYTES {
        return Err(invalid(
            "input",
            format!("serialized input is {len} bytes, more than {MAX_INPUT_BYTES}"),
        ));
    }
    Ok(())
}

/// Uploads one submission may name.
pub const MAX_NAMED_UPLOADS: usize = 16;

/// The uploads an input names: every string in it that is an upload id
/// (`upl_…`), each once, in id order. The one rule for the server (which
/// keeps them with the operation) and the workers (which read them).
pub fn named_uploads(input: &Value) -> Vec<crate::Id> {
    fn collect(value: &Value, ids: &mut Vec<crate::Id>) {
        match value {
            Value::String(s) => ids.extend(crate::Id::parse(crate::IdKind::Upload, s)),
            Value::Array(items) => items.iter().for_each(|v| collect(v, ids)),
            Value::Object(members) => members.values().for_each(|v| collect(v, ids)),
            _ => {}
        }
    }
    let mut ids = Vec::new();
    collect(input, &mut ids);
    ids.sort();
    ids.dedup();
    ids
}

/// A deadline of 1 to `max` seconds.
pub fn deadline_seconds(seconds: u64, max: u64) -> Result<(), Invalid> {
    if seconds == 0 || seconds > max {
        return Err(invalid("deadline_seconds", format!("must be between 1 and {max}")));
    }
    Ok(())
}

/// A budget that is a finite number above zero.
pub fn max_cost_units(units: f64) -> Result<(), Invalid> {
    if !(units.is_finite() && units > 0.0) {
        return Err(invalid("budget.max_cost_units", "must be a positive number"));
    }
    Ok(())
}

/// The longest `start_after_seconds` a submission may ask for: a year.
pub const MAX_START_DELAY_SECONDS: u64 = 365 * 24 * 3600;

/// The start of work that starts later, from `not_before` (RFC 3339, any
/// instant: one already past starts at once) or `start_after_seconds` (at
/// most [`MAX_START_DELAY_SECONDS`]), at most one of them.
pub fn not_before(
    not_before: Option<&str>,
    start_after_seconds: Option<u64>,
    now: crate::Timestamp,
) -> Result<Option<crate::Timestamp>, Invalid> {
    match (not_before, start_after_seconds) {
        (Some(_), Some(_)) => Err(invalid(
            "not_before",
            "give not_before or start_after_seconds, not both",
        )),
        (None, None) => Ok(None),
        (Some(text), None) => crate::Timestamp::parse_rfc3339(text).map(Some).ok_or_else(|| {
            invalid(
                "not_before",
                format!("must be an RFC 3339 date-time with an offset, e.g. 2026-12-06T02:00:00Z; got {text:?}"),
            )
        }),
        (None, Some(seconds)) if seconds > MAX_START_DELAY_SECONDS => Err(invalid(
            "start_after_seconds",
            format!("must be at most {MAX_START_DELAY_SECONDS} (a year)"),
        )),
        (None, Some(seconds)) => Ok(Some(now.plus(std::time::Duration::from_secs(seconds)))),
    }
}

/// The priorities a submission may ask for: 1–9, higher first.
pub fn priority(priority: Option<u64>, default: i16) -> Result<i16, Invalid> {
    match priority {
        None => Ok(default),
        Some(p @ 1..=9) => Ok(p as i16),
        Some(p) => Err(invalid("priority", format!("must be between 1 and 9; got {p}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names() {
        for good in ["sleep", "export", "media.transcode-v2", "a", "9x"] {
            assert!(kind_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Sleep", "-x", "has space", "ü", &"x".repeat(65)] {
            assert!(kind_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_bounds() {
        let mut l = BTreeMap::new();
        l.insert("team".to_owned(), "billing".to_owned());
        l.insert("app.kubernetes.io/name".to_owned(), "x".to_owned());
        assert!(labels(&l).is_ok());
        l.insert("Team".to_owned(), "x".to_owned());
        assert!(labels(&l).is_err());
        let long: BTreeMap<_, _> = [("k".to_owned(), "v".repeat(257))].into();
        assert!(labels(&long).is_err());
        let many: BTreeMap<_, _> = (0..33).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(labels(&many).is_err());
        assert_eq!(
            label_selector("team:billing").unwrap(),
            ("team".into(), "billing".into())
        );
        assert!(label_selector("team").is_err());
    }

    #[test]
    fn numeric_bounds() {
        assert!(deadline_seconds(0, 100).is_err());
        assert!(deadline_seconds(100, 100).is_ok());
        assert!(deadline_seconds(101, 100).is_err());
        assert!(max_cost_units(0.0).is_err());
        assert!(max_cost_units(0.5).is_ok());
        assert!(input_size(&Value::String("x".repeat(MAX_INPUT_BYTES))).is_err());
    }

    #[test]
    fn starts_and_priorities() {
        let now = crate::Timestamp(1_800_000_000_000);
        assert_eq!(not_before(None, None, now), Ok(None));
        assert_eq!(
            not_before(None, Some(60), now),
            Ok(Some(now.plus(std::time::Duration::from_secs(60))))
        );
        let parsed = not_before(Some("2027-01-15T08:00:00+01:00"), None, now)
            .unwrap()
            .unwrap();
        assert_eq!(parsed.to_rfc3339(), "2027-01-15T07:00:00.000Z");
        assert!(not_before(Some("2027-01-15T08:00:00"), None, now).is_err());
        assert!(not_before(Some("2027-01-15T08:00:00Z"), Some(1), now).is_err());
        assert!(not_before(None, Some(MAX_START_DELAY_SECONDS + 1), now).is_err());
        // Every RFC 3339 date-time JSON Schema's `date-time` admits.
        for text in [
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999+14:00",
            "2026-12-06t02:00:00z",
            "2026-12-06T02:00:00.5-00:00",
        ] {
            assert!(not_before(Some(text), None, now).unwrap().is_some(), "{text}");
        }
        assert_eq!(priority(None, 5), Ok(5));
        assert_eq!(priority(Some(9), 5), Ok(9));
        assert!(priority(Some(0), 5).is_err() && priority(Some(10), 5).is_err());
    }
}
