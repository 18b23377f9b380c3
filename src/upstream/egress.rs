//! Where org-supplied upstream URLs may point. Custom deployments' base URLs, BYOK
//! base URLs and Vertex token endpoints come from orgs, and the gateway calls them
//! from inside the operator's network: unless `[network] allow_private_upstreams` is
//! set they must be https and must reach public addresses only, never loopback,
//! private, CGNAT, link-local (the cloud metadata address included), unique-local,
//! multicast or reserved ones, nor the IPv6 forms that carry such an IPv4 address.
//!
//! Checked twice: when the URL is written (its text, every spelling of a numeric
//! host, and what the name resolves to then) and on every connection (every address
//! the name resolves to then, since a DNS answer can change after the write). The
//! operator's provider tables are trusted and never checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The `Failure::Connect` detail of a connection refused by this guard.
pub const REFUSED: &str = "address not allowed for an org URL";

/// How long a write waits for a name to resolve; a name that does not resolve in
/// time is stored and checked again on every connection.
const WRITE_DNS_TIMEOUT: Duration = Duration::from_secs(2);

/// Splits `http(s)://host[:port][/prefix]`: every upstream URL, org or operator,
/// is read here.
pub fn parse_base(url: &str) -> Option<(bool, String, u16, String)> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        (false, url.strip_prefix("http://")?)
    };
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.trim_matches(['[', ']']).to_string(), p.parse().ok()?)
        }
        _ => (authority.to_string(), if tls { 443 } else { 80 }),
    };
    if host.is_empty() {
        return None;
    }
    Some((tls, host, port, prefix.to_string()))
}

/// Whether an org URL may connect to this address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let special = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        // "This network": connecting to 0.x reaches the host itself on Linux.
        || a == 0
        // Shared address space (CGNAT), 100.64/10.
        || (a == 100 && (b & 0xc0) == 64)
        // IETF protocol assignments, 192.0.0/24.
        || (a == 192 && b == 0 && c == 0)
        // Benchmarking, 198.18/15.
        || (a == 198 && (b & 0xfe) == 18)
        // Reserved, 240/4.
        || a >= 240;
    !special
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let special = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unique_local()
        || ip.is_unicast_link_local()
        // Site-local (deprecated, still routed inside some networks), fec0::/10.
        || (s[0] & 0xffc0) == 0xfec0
        // Local-use NAT64, 64:ff9b:1::/48: translates to the operator's own space.
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        // Discard-only, 100::/64.
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0])
        // Documentation, 2001:db8::/32.
        || (s[0] == 0x2001 && s[1] == 0xdb8);
    !special
}

/// The IPv4 address an IPv6 address carries: mapped (`::ffff:a.b.c.d`),
/// compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback() {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// A host in one of the numeric IPv4 spellings resolvers accept besides the dotted
/// quad (`inet_aton`): one to four parts, each decimal, octal (`0` prefix) or hex
/// (`0x`), the last filling the bytes left (`2130706433`, `0x7f.1`, `127.1`,
/// `0177.0.0.1`). `None` when the host is not of that shape.
pub fn numeric_v4(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(4);
    for p in &parts {
        let n = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            if h.is_empty() {
                0
            } else if h.bytes().all(|b| b.is_ascii_hexdigit()) {
                u32::from_str_radix(h, 16).ok()?
            } else {
                return None;
            }
        } else if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
            if p.len() > 1 && p.starts_with('0') {
                u32::from_str_radix(&p[1..], 8).ok()?
            } else {
                p.parse::<u32>().ok()?
            }
        } else {
            return None;
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    if head.iter().any(|&n| n > 255) {
        return None;
    }
    let free_bits = 32 - 8 * head.len() as u32;
    if free_bits < 32 && (last >> free_bits) != 0 {
        return None;
    }
    let mut v = *last;
    for (i, &n) in head.iter().enumerate() {
        v |= n << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(v))
}

/// A URL host that is an address, in any spelling a resolver would take as one;
/// `Err` for a host that is neither an address nor a well-formed name.
fn host_address(host: &str) -> Result<Option<IpAddr>, &'static str> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Some(ip));
    }
    if let Some(v4) = numeric_v4(host) {
        return Ok(Some(IpAddr::V4(v4)));
    }
    // A name's last label never starts with a digit; such a host is a numeric form
    // this gateway does not read (an overflowing part, say).
    let last = host.trim_end_matches('.').rsplit('.').next().unwrap_or("");
    let name_ok = host.len() <= 253
        && !last.is_empty()
        && !last.starts_with(|c: char| c.is_ascii_digit())
        && host
            .trim_end_matches('.')
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if name_ok {
        Ok(None)
    } else {
        Err("its host is not a valid host name or address")
    }
}

/// Checks an org-supplied base URL before it is stored; `Err` says why it may not
/// be used (never what a name resolved to: that would map the operator's DNS).
pub async fn check_org_url(url: &str, allow_private: bool) -> Result<(), String> {
    let Some((tls, host, port, _)) = parse_base(url) else {
        return Err("must be an http(s) URL like https://host[:port][/path]".into());
    };
    let literal = host_address(&host).map_err(String::from)?;
    if allow_private {
        return Ok(());
    }
    if !tls {
        return Err(
            "must be https (plain http needs [network] allow_private_upstreams on this gateway)"
                .into(),
        );
    }
    let blocked = || {
        Err(format!(
            "host {host:?} is or resolves to a loopback, private, link-local or other non-public address; org URLs must reach public addresses"
        ))
    };
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return blocked();
    }
    let addrs: Vec<IpAddr> = match literal {
        Some(ip) => vec![ip],
        None => match tokio::time::timeout(
            WRITE_DNS_TIMEOUT,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
            // Not resolvable now: every connection checks it.
            _ => Vec::new(),
        },
    };
    if addrs.iter().any(|ip| !is_public(*ip)) {
        return blocked();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_public_addresses_are_told_apart() {
        for a in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.0.170",
            "198.18.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "100::1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a} must be refused");
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "169.253.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(a.parse().unwrap()), "{a} is public");
        }
    }

    #[test]
    fn every_numeric_spelling_of_an_address_is_read() {
        let lo = Ipv4Addr::LOCALHOST;
        for h in [
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "127.1",
            "127.0.1",
            "0177.0.0.1",
            "0177.1",
            "0x7F.0.0.0x1",
        ] {
            assert_eq!(numeric_v4(h), Some(lo), "{h}");
        }
        assert_eq!(
            numeric_v4("0xa9fea9fe"),
            Some(Ipv4Addr::new(169, 254, 169, 254))
        );
        for h in [
            "api.openai.com",
            "256.1.1.1",
            "1.2.3.4.5",
            "0x",
            "08.1",
            "1..2",
            "",
        ] {
            assert_ne!(numeric_v4(h), Some(lo), "{h}");
        }
        assert_eq!(numeric_v4("api.openai.com"), None);
        assert_eq!(numeric_v4("4294967296"), None, "overflow is not an address");
    }

    #[tokio::test]
    async fn org_urls_are_checked_when_written() {
        for url in [
            "https://127.0.0.1/v1",
            "https://2130706433/",
            "https://0x7f.1/",
            "https://127.1/",
            "https://0177.0.0.1/",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::ffff:a9fe:a9fe]/",
            "https://169.254.169.254/latest",
            "https://10.0.0.5:6379",
            "https://100.64.1.1",
            "https://[fd00::1]",
            "https://[fe80::1]",
            "https://localhost/v1",
            "https://LOCALHOST./v1",
            "https://a.localhost/v1",
            "http://api.example.com/v1",
            "https://4294967296/",
            "https://user@169.254.169.254/",
            "https://evil.example#@127.0.0.1/",
            "ftp://api.example.com",
            "https://",
        ] {
            assert!(check_org_url(url, false).await.is_err(), "{url}");
        }
        // A name that does not resolve now is stored; every connection checks it.
        for url in ["https://api.example.invalid/v1", "https://8.8.8.8/v1"] {
            assert!(check_org_url(url, false).await.is_ok(), "{url}");
        }
        // The flag lets private addresses and plain http through, not garbage.
        assert!(check_org_url("http://127.0.0.1:9000/v1", true)
            .await
            .is_ok());
        assert!(check_org_url("https://user@127.0.0.1/", true)
            .await
            .is_err());
    }
}
