//! The submission-time policy for webhook callback URLs (docs/api.md §5): what
//! can never pass is refused before anything is accepted. `https` only and no
//! IP literals or local names by default; development flags lift that.
//!
//! The URL parser (WHATWG) normalises every IPv4 spelling it accepts —
//! decimal `2130706433`, hex `0x7f.1`, octal `0177.0.0.1`, short `127.1` — to
//! an IPv4 host, so checking the parsed host catches them all.

use url::{Host, Url};

use super::ApiError;

/// The longest callback URL, in bytes.
pub const MAX_CALLBACK_URL_LEN: usize = 2048;

/// Which callback URLs a submission may name (checked when it is accepted;
/// the deliverer checks the resolved address again).
#[derive(Debug, Clone, Default)]
pub struct CallbackPolicy {
    /// `--webhook-allow-http`
    pub allow_http: bool,
    /// `--webhook-allow-private`: IP literals and local names are allowed.
    pub allow_private: bool,
}

/// The normalised URL, or `422 invalid_callback_url`.
pub fn check_url(raw: &str, policy: &CallbackPolicy) -> Result<String, ApiError> {
    let refuse = |why: &str| Err(ApiError::InvalidCallbackUrl(format!("callback.url {why}")));
    if raw.len() > MAX_CALLBACK_URL_LEN {
        return refuse(&format!("is longer than {MAX_CALLBACK_URL_LEN} characters"));
    }
    let Ok(url) = Url::parse(raw) else {
        return refuse("is not an absolute URL");
    };
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        "http" => {
            return refuse("must use https (the server was not started with --webhook-allow-http)");
        }
        _ => return refuse("must be an https URL"),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return refuse("must not carry credentials");
    }
    if url.fragment().is_some() {
        return refuse("must not have a fragment");
    }
    let Some(host) = url.host() else {
        return refuse("has no host");
    };
    if !policy.allow_private {
        match host {
            Host::Ipv4(_) | Host::Ipv6(_) => return refuse("must name a host, not an IP address"),
            Host::Domain(name) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let local = name == "localhost"
                    || name.ends_with(".localhost")
                    || name.ends_with(".local")
                    || name.ends_with(".internal")
                    || !name.contains('.');
                if local {
                    return refuse("must name a public host");
                }
            }
        }
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_https_names_pass() {
        let policy = CallbackPolicy::default();
        assert_eq!(
            check_url("https://client.example/hooks/longrun", &policy).unwrap(),
            "https://client.example/hooks/longrun"
        );
    }

    #[test]
    fn what_can_never_pass_is_refused() {
        let policy = CallbackPolicy::default();
        for bad in [
            "not a url",
            "/relative",
            "http://client.example/",
            "ftp://client.example/",
            "https://user:pw@client.example/",
            "https://127.0.0.1/",
            "https://2130706433/",
            "https://0x7f.0.0.1/",
            "https://0177.0.0.1/",
            "https://127.1/",
            "https://[::1]/",
            "https://[::ffff:10.0.0.1]/",
            "https://169.254.169.254/latest/meta-data",
            "https://localhost/",
            "https://api.localhost/",
            "https://intranet/",
        ] {
            assert!(check_url(bad, &policy).is_err(), "{bad}");
        }
    }

    #[test]
    fn development_flags_lift_the_policy() {
        let policy = CallbackPolicy {
            allow_http: true,
            allow_private: true,
        };
        assert!(check_url("http://127.0.0.1:9000/hook", &policy).is_ok());
    }
}

#[cfg(test)]
mod fuzz {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;

    /// Ways the WHATWG parser accepts to write one IPv4 address.
    fn spellings(ip: Ipv4Addr) -> Vec<String> {
        let [a, b, c, d] = ip.octets();
        let n = u32::from(ip);
        vec![
            ip.to_string(),
            n.to_string(),
            format!("0x{n:x}"),
            format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
            format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
            format!("{a}.{}", u32::from_be_bytes([0, b, c, d])),
            format!("{a}.{b}.{}", u16::from_be_bytes([c, d])),
            format!("[::ffff:{ip}]"),
            format!("{ip}."),
        ]
    }

    proptest! {
        /// No IP address gets through the default policy, however it is written.
        #[test]
        fn no_ip_address_passes_in_any_spelling(v4 in any::<u32>(), v6 in any::<u128>(), path in "[a-z/]{0,10}") {
            let policy = CallbackPolicy::default();
            for host in spellings(Ipv4Addr::from(v4)) {
                let url = format!("https://{host}/{path}");
                prop_assert!(check_url(&url, &policy).is_err(), "{url}");
            }
            let url = format!("https://[{}]/{path}", Ipv6Addr::from(v6));
            prop_assert!(check_url(&url, &policy).is_err(), "{url}");
        }

        /// Any text: a normalised public https URL, or `invalid_callback_url`.
        #[test]
        fn any_text_is_a_public_https_url_or_refused_with_one_code(raw in any::<String>()) {
            match check_url(&raw, &CallbackPolicy::default()) {
                Ok(url) => {
                    let parsed = Url::parse(&url).unwrap();
                    prop_assert_eq!(parsed.scheme(), "https");
                    prop_assert!(matches!(parsed.host(), Some(Host::Domain(_))));
                }
                Err(e) => prop_assert_eq!(e.code(), "invalid_callback_url"),
            }
        }
    }
}
