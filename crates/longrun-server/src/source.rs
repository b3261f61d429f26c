//! Where a request comes from, for the per-source limits, the logs and the
//! console: the peer's address, unless the peer is a proxy the operator
//! trusts (`--trusted-proxies`). Then it is the rightmost address of
//! `Forwarded` (its `for=` parameters) or, without that header,
//! `X-Forwarded-For`, that is not itself a trusted proxy: each trusted hop
//! appends the address it saw, so the first untrusted one from the right is
//! the last address nobody could forge. Headers from a peer that is not
//! trusted are ignored, so a client cannot choose its own source.

use std::net::IpAddr;
use std::str::FromStr;

use axum::http::HeaderMap;
use axum::http::header::FORWARDED;
use ipnet::IpNet;

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `10.0.0.0/8,192.168.1.7`: networks or single addresses,
    /// comma-separated (empty: none).
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let net = match IpNet::from_str(item) {
                Ok(net) => net,
                Err(_) => IpAddr::from_str(item)
                    .map(IpNet::from)
                    .map_err(|_| format!("{item:?} is neither an address nor a network (CIDR)"))?,
            };
            nets.push(net.trunc());
        }
        Ok(Self(nets))
    }

    /// Whether `addr` is one of the trusted proxies.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        self.0.iter().any(|net| net.contains(&addr))
    }
}

/// The peer of a request served by `listen::serve`; `None` for requests from
/// elsewhere (tests calling the router directly).
pub fn peer(extensions: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0)
}

/// The source of a request served by `listen::serve` (see the module);
/// `None` for a request that came from elsewhere (tests calling the router).
pub fn of_request(
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Option<IpAddr> {
    peer(extensions).map(|peer| client_address(peer.ip(), headers, trusted))
}

/// The source of a request from `peer` with `headers` (see the module).
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = peer.to_canonical();
    if !trusted.contains(peer) {
        return peer;
    }
    let hops = forwarded_for(headers).unwrap_or_else(|| x_forwarded_for(headers));
    let mut source = peer;
    for hop in hops.iter().rev() {
        match hop {
            // A hop that is no address (`unknown`, an obfuscated name)
            // ends the walk at the last proxy that was believed.
            None => break,
            Some(addr) => {
                source = *addr;
                if !trusted.contains(*addr) {
                    break;
                }
            }
        }
    }
    source
}

/// The `for=` addresses of every `Forwarded` header, in order; `None` when
/// there is no such header.
fn forwarded_for(headers: &HeaderMap) -> Option<Vec<Option<IpAddr>>> {
    let mut found = false;
    let mut hops = Vec::new();
    for value in headers.get_all(FORWARDED) {
        found = true;
        let Ok(value) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for element in value.split(',') {
            let node = element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim().eq_ignore_ascii_case("for").then(|| value.trim())
            });
            if let Some(node) = node {
                hops.push(parse_node(node));
            }
        }
    }
    found.then_some(hops)
}

/// The addresses of every `X-Forwarded-For` header, in order.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|value| match value.to_str() {
            Ok(value) => value.split(',').map(parse_node).collect::<Vec<_>>(),
            Err(_) => vec![None],
        })
        .collect()
}

/// An address as a hop names it: `203.0.113.7`, `"[2001:db8::1]:4711"`,
/// `198.51.100.2:80`; `None` for anything else.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim().trim_matches('"');
    if let Some(v6) = node.strip_prefix('[') {
        return v6.split(']').next()?.parse().ok().map(|a: IpAddr| a.to_canonical());
    }
    if let Ok(addr) = node.parse::<IpAddr>() {
        return Some(addr.to_canonical());
    }
    // An IPv4 address with a port.
    let (host, _port) = node.rsplit_once(':')?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn an_untrusted_peer_is_the_source_whatever_it_forwards() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let h = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8")]);
        assert_eq!(client_address(ip("203.0.113.9"), &h, &trusted), ip("203.0.113.9"));
        assert_eq!(
            client_address(ip("203.0.113.9"), &h, &TrustedProxies::default()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_source() {
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.168.1.7").unwrap();
        // The client forged the first entry; the trusted proxies appended
        // what they saw.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.20, 192.168.1.7")]);
        assert_eq!(client_address(ip("10.1.2.3"), &h, &trusted), ip("198.51.100.20"));
        // Several header lines are one list, in order.
        let h = headers(&[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.20")]);
        assert_eq!(client_address(ip("10.1.2.3"), &h, &trusted), ip("198.51.100.20"));
    }

    #[test]
    fn forwarded_wins_over_x_forwarded_for_and_speaks_ports_and_ipv6() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let h = headers(&[
            (
                "forwarded",
                r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711""#,
            ),
            ("x-forwarded-for", "6.6.6.6"),
        ]);
        assert_eq!(client_address(ip("10.0.0.1"), &h, &trusted), ip("2001:db8:cafe::17"));
        let h = headers(&[("forwarded", "for=198.51.100.2:80")]);
        assert_eq!(client_address(ip("10.0.0.1"), &h, &trusted), ip("198.51.100.2"));
    }

    #[test]
    fn a_hop_that_is_no_address_stops_at_the_last_believed_proxy() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let h = headers(&[("forwarded", "for=unknown, for=10.0.0.9")]);
        assert_eq!(client_address(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.9"));
        // No header: the proxy itself.
        assert_eq!(
            client_address(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn mapped_ipv4_peers_match_ipv4_networks() {
        let trusted = TrustedProxies::parse("127.0.0.1").unwrap();
        assert!(trusted.contains(ip("::ffff:127.0.0.1")));
        assert!(TrustedProxies::parse("nonsense").is_err());
        assert_eq!(TrustedProxies::parse("").unwrap(), TrustedProxies::default());
    }
}
