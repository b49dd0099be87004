//! Which addresses an image URL may reach.
//!
//! A client-supplied URL is fetched from inside the operator's network, so by default only
//! public unicast addresses are allowed (no server-side request forgery against loopback
//! services, cloud metadata endpoints or the private network). Refused, for IPv4:
//! `0.0.0.0/8` (unspecified, "this network"), `10/8`, `172.16/12`, `192.168/16` (private),
//! `100.64/10` (carrier-grade NAT), `127/8` (loopback), `169.254/16` (link-local, cloud
//! metadata), `192.0.0/24` (protocol assignments), `198.18/15` (benchmarking), documentation
//! ranges, multicast, reserved `240/4` and broadcast. For IPv6: `::` and `::1`, `fc00::/7`
//! (unique local), `fe80::/10` (link-local), `fec0::/10` (old site-local), multicast,
//! documentation `2001:db8::/32`, and every form that embeds an IPv4 address (v4-mapped
//! `::ffff:a.b.c.d`, v4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is
//! judged by that IPv4 address.
//!
//! The check applies to every address a host name resolves to and to IP literals, on every
//! redirect hop, and the connection is made to the checked address itself (no second lookup a
//! rebinding DNS server could answer differently).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = a == 0
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b))
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 0 && c == 2)
        || (a == 198 && (b == 18 || b == 19))
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || a >= 224;
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded_v4 =
        || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
        // v4-mapped, or v4-compatible; `::` and `::1` land here as 0.0.0.0 and 0.0.0.1.
        return is_public_v4(embedded_v4());
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded_v4());
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return is_public_v4(v4);
    }
    let refused = (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] & 0xff00) == 0xff00
        || (s[0] == 0x2001 && s[1] == 0x0db8);
    !refused
}

/// Which addresses a fetch may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPolicy {
    /// Public unicast addresses only (the default).
    PublicOnly,
    /// Any address (`--allow-private-image-urls`).
    Any,
    /// Exactly these addresses; lets tests stand a loopback server in for a public one.
    #[cfg(test)]
    Only(Vec<IpAddr>),
}

impl AddressPolicy {
    /// The policy the flag asks for.
    pub fn from_flag(allow_private: bool) -> Self {
        if allow_private {
            AddressPolicy::Any
        } else {
            AddressPolicy::PublicOnly
        }
    }

    /// Whether a connection to `ip` is allowed.
    pub fn allows(&self, ip: IpAddr) -> bool {
        match self {
            AddressPolicy::PublicOnly => is_public(ip),
            AddressPolicy::Any => true,
            #[cfg(test)]
            AddressPolicy::Only(list) => list.contains(&ip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn non_public_addresses_are_refused_in_every_spelling() {
        for refused in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:101::1",
        ] {
            assert!(!is_public(ip(refused)), "{refused} must be refused");
            assert!(!AddressPolicy::PublicOnly.allows(ip(refused)), "{refused}");
            assert!(AddressPolicy::Any.allows(ip(refused)), "{refused}");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "192.169.0.1",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip(public)), "{public} must be allowed");
        }
    }
}
