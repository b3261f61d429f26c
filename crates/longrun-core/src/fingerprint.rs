//! The idempotency fingerprint of a submission.
//!
//! HMAC-SHA-256, keyed with a server secret, over the RFC 8785 (JCS) canonical
//! JSON of the semantic request. Canonical JSON makes key order, whitespace and
//! number spelling (`100`, `100.0`, `1e2`) irrelevant; every other difference
//! changes the fingerprint. The key matters because inputs can be small and
//! sensitive: a plain hash of `{"ssn": "…"}` could be reversed by guessing.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A 32-byte request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Compares without leaking, through timing, where two fingerprints differ.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({}…)", data_encoding::HEXLOWER.encode(&self.0[..4]))
    }
}

/// Computes fingerprints under one server secret.
#[derive(Clone)]
pub struct Fingerprinter {
    mac: Hmac<Sha256>,
}

impl Fingerprinter {
    /// A fingerprinter keyed with the server's fingerprint secret.
    pub fn new(secret: &[u8]) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC accepts keys of any length"),
        }
    }

    /// The fingerprint of a submission's semantic request (canonical JSON, HMAC-SHA-256).
    pub fn fingerprint(&self, semantic_request: &Value) -> Fingerprint {
        let mut mac = self.mac.clone();
        mac.update(canonical_json(semantic_request).as_bytes());
        Fingerprint(mac.finalize().into_bytes().into())
    }
}

/// RFC 8785 canonical JSON: members sorted by their UTF-16 code units, no
/// insignificant whitespace, numbers in the ECMAScript shortest round-trip
/// form, strings with the minimal JSON escapes.
///
/// Numbers are treated as IEEE-754 doubles, as RFC 8785 (I-JSON) requires:
/// integers beyond 2^53 are not distinguishable from their nearest double.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n.as_f64().unwrap_or(f64::NAN), out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
    }
}

fn write_number(n: f64, out: &mut String) {
    if n == 0.0 {
        // Both +0 and -0 are written "0".
        out.push('0');
    } else if n.is_finite() {
        out.push_str(ryu_js::Buffer::new().format_finite(n));
    } else {
        // serde_json cannot hold NaN or infinities; keep the output total anyway.
        out.push_str("null");
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{09}' => out.push_str("\\t"),
            '\u{0a}' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\u{0d}' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    fn fp(s: &str) -> Fingerprint {
        Fingerprinter::new(b"test secret").fingerprint(&parse(s))
    }

    #[test]
    fn rfc8785_examples() {
        // From RFC 8785 §3.2.2 and Appendix B.
        let input = r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                        "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                        "literals": [null, true, false]}"#;
        assert_eq!(
            canonical_json(&parse(input)),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn members_sort_by_utf16_code_units() {
        // "\u{10000}" (a surrogate pair, 0xD800…) sorts before "\u{ff61}" in UTF-16
        // although it sorts after it in UTF-8 / code point order.
        let v = json!({"\u{ff61}": 1, "\u{10000}": 2, "a": 3, "": 4});
        assert_eq!(canonical_json(&v), "{\"\":4,\"a\":3,\"\u{10000}\":2,\"\u{ff61}\":1}");
    }

    #[test]
    fn equivalent_spellings_agree() {
        let base = fp(r#"{"kind":"export","input":{"rows":100,"format":"csv"}}"#);
        for same in [
            r#"{"input":{"format":"csv","rows":100},"kind":"export"}"#,
            r#"{"kind":"export","input":{"rows":100.0,"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":1e2,"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":1.00E+2,"format":"csv"}}"#,
            "{ \"kind\" : \"export\",\n \"input\" : { \"format\" : \"c\\u0073v\", \"rows\" : 100 } }",
        ] {
            assert_eq!(fp(same), base, "{same}");
        }
        assert_eq!(fp(r#"{"x":-0.0}"#), fp(r#"{"x":0}"#));
    }

    #[test]
    fn semantic_differences_disagree() {
        let base = fp(r#"{"kind":"export","input":{"rows":100,"format":"csv"}}"#);
        for other in [
            r#"{"kind":"export","input":{"rows":101,"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":100.5,"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":"100","format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":100,"format":"CSV"}}"#,
            r#"{"kind":"exports","input":{"rows":100,"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":100}}"#,
            r#"{"kind":"export","input":{"rows":100,"format":"csv","extra":null}}"#,
            r#"{"kind":"export","input":{"rows":[100],"format":"csv"}}"#,
            r#"{"kind":"export","input":{"rows":100,"format":"csv "}}"#,
        ] {
            assert_ne!(fp(other), base, "{other}");
        }
        assert_ne!(fp(r#"[1,2]"#), fp(r#"[2,1]"#), "array order is semantic");
    }

    #[test]
    fn the_secret_keys_the_fingerprint() {
        let v = parse(r#"{"kind":"sleep"}"#);
        assert_ne!(
            Fingerprinter::new(b"a").fingerprint(&v),
            Fingerprinter::new(b"b").fingerprint(&v)
        );
        let f = fp(r#"{"kind":"sleep"}"#);
        assert!(f.matches(&fp(r#"{"kind":"sleep"}"#)));
    }

    proptest::proptest! {
        #[test]
        fn canonical_json_is_a_fixed_point(v in arb_json()) {
            let once = canonical_json(&v);
            let reparsed: Value = serde_json::from_str(&once).unwrap();
            proptest::prop_assert_eq!(canonical_json(&reparsed), once);
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|i| json!(i)),
            (-1e300f64..1e300).prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::hash_map(".*", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
