//! Human durations for flags: `90s`, `5m`, `12h`, `30d`, `250ms`.

use std::time::Duration;

/// A duration flag that does not parse; the text says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration like 90s, 5m, 12h or 30d")]
pub struct InvalidDuration(pub String);

/// Parses a whole number with its unit: `250ms`, `90s`, `5m`, `12h` or `30d`.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(text.to_owned());
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| invalid())?;
    let seconds = |factor: u64| n.checked_mul(factor).map(Duration::from_secs).ok_or_else(invalid);
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3600),
        "d" => seconds(86_400),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse_duration("30d").unwrap(), Duration::from_secs(2_592_000));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        for bad in ["", "s", "10", "1.5h", "-1s", "3w", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any text: a duration or a refusal naming it, never a panic.
        #[test]
        fn any_text_parses_or_is_refused(text in any::<String>()) {
            if let Err(e) = parse_duration(&text) {
                prop_assert_eq!(e.0, text);
            }
        }

        #[test]
        fn every_spelled_duration_round_trips(n in 0u64..10_000_000, unit in prop::sample::select(vec!["ms", "s", "m", "h", "d"])) {
            let factor = match unit { "s" => 1, "m" => 60, "h" => 3600, "d" => 86_400, _ => 0 };
            let expected = if unit == "ms" { Duration::from_millis(n) } else { Duration::from_secs(n * factor) };
            prop_assert_eq!(parse_duration(&format!(" {n}{unit} ")).unwrap(), expected);
        }
    }
}
