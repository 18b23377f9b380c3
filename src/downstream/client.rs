//! Who sent a request: the address a trusted edge header carries
//! (`server.client_ip_header`), else the socket's peer. The gateway's access line
//! and request span and the web app's per-origin limits all name the client so.

use http::HeaderMap;
use std::net::{IpAddr, SocketAddr};

/// A request's client: its IP address, and the port when the address is the
/// socket's own (an edge header carries none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    pub(crate) ip: IpAddr,
    pub(crate) port: Option<u16>,
}

impl Client {
    /// The edge header's address when `ip_header` is set and the request has it,
    /// else `peer`.
    pub(crate) fn of(
        headers: &HeaderMap,
        ip_header: &str,
        peer: Option<SocketAddr>,
    ) -> Option<Client> {
        match edge_ip(headers, ip_header) {
            Some(ip) => Some(Client { ip, port: None }),
            None => peer.map(|p| Client {
                ip: p.ip(),
                port: Some(p.port()),
            }),
        }
    }

    /// What per-origin limits count the client as: its IPv4 address, or the /64
    /// network of its IPv6 address (one subscriber line is given a whole /64 and
    /// can pick any address in it). An IPv4 address mapped into IPv6 counts as
    /// itself.
    pub(crate) fn origin(&self) -> String {
        match self.ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => {
                    let s = v6.segments();
                    let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                    format!("{net}/64")
                }
            },
        }
    }

    /// The client of a gateway request, by [`Client::of`]: the peer is the one
    /// our connection or Pingora's socket digest holds.
    pub(crate) fn of_session(session: &pingora::proxy::Session, ip_header: &str) -> Option<Client> {
        let peer = super::listener::peer(session);
        Client::of(&session.req_header().headers, ip_header, peer)
    }
}

/// The client address in the trusted edge header `name`: its one address, or of
/// a list (`x-forwarded-for`) the last, which the edge appended; the addresses
/// before it are the client's own word.
fn edge_ip(headers: &HeaderMap, name: &str) -> Option<IpAddr> {
    if name.is_empty() {
        return None;
    }
    let last = headers.get_all(name).iter().next_back()?.to_str().ok()?;
    last.rsplit(',').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L1 of the 2026-12-01 security review: an IPv6 client counts as its /64.
    #[test]
    fn origins_count_an_ipv6_client_by_its_64() {
        let at = |ip: &str| {
            Client {
                ip: ip.parse().unwrap(),
                port: None,
            }
            .origin()
        };
        assert_eq!(at("2001:db8:1:2::1"), at("2001:db8:1:2:ffff:1:2:3"));
        assert_eq!(at("2001:db8:1:2::1"), "2001:db8:1:2::/64");
        assert_ne!(at("2001:db8:1:2::1"), at("2001:db8:1:3::1"));
        assert_eq!(at("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(at("192.0.2.7"), "192.0.2.7");
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_edge_header_names_the_client_only_when_configured() {
        let peer: SocketAddr = "10.0.0.9:41000".parse().unwrap();
        let h = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.7")]);
        let edge = Client::of(&h, "x-forwarded-for", Some(peer)).unwrap();
        assert_eq!(
            edge,
            Client {
                ip: "203.0.113.7".parse().unwrap(),
                port: None
            }
        );
        // Not configured: the header is the client's own word, and the peer counts.
        let own = Client::of(&h, "", Some(peer)).unwrap();
        assert_eq!(
            own,
            Client {
                ip: peer.ip(),
                port: Some(41000)
            }
        );
        // Configured but absent, or not an address: the peer.
        assert_eq!(
            Client::of(&headers(&[]), "x-real-ip", Some(peer)),
            Some(own)
        );
        let junk = headers(&[("x-real-ip", "somewhere")]);
        assert_eq!(Client::of(&junk, "x-real-ip", Some(peer)), Some(own));
        assert_eq!(Client::of(&junk, "x-real-ip", None), None);
    }
}
