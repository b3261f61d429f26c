//! The submission-time policy for webhook callback URLs (CONTRACT §5): what
//! can never pass is refused before anything is accepted. `https` only and no
//! IP literals or local names by default; development flags lift that.
//!
//! The URL parser (WHATWG) normalises every IPv4 spelling it accepts —
//! decimal `2130706433`, hex `0x7f.1`, octal `0177.0.0.1`, short `127.1` — to
//! an IPv4 host, so checking the parsed host catches them all.

use url::{Host, Url};

use crate::http::error::ApiError;
use crate::http::operations::MAX_CALLBACK_URL_LEN;

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
