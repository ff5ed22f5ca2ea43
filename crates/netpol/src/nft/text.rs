//! The text pieces of the ruleset: names and comments made safe for `nft`, and address and
//! port ranges cut and merged (an interval set refuses overlapping elements), the same code for
//! IPv4 and IPv6 addresses and ports ([`Point`]).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::compile::Protocol;

/// The protocol's keyword in `nft` syntax.
pub(super) fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// Linux interface names: 1-15 bytes, no `/`, whitespace, quotes or wildcard.
pub(super) fn is_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b':'))
}

/// A veth name as part of a chain or set name (which take `[A-Za-z0-9_]` safely).
pub(super) fn ident(veth: &str) -> String {
    veth.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A comment `nft` takes: at most 128 bytes, no quotes, backslashes or control characters
/// (Kubernetes names have none; a long one is cut, since a comment only informs).
pub(super) fn comment(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if s.len() > 128 {
        let mut cut = 125;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// A point of a line that ranges are cut from and merged on: an IPv4 address (`u32`), an IPv6
/// address (`u128`), or a port (`u32`).
pub(super) trait Point: Copy + Ord {
    /// The next point, or this one at the line's end.
    fn next(self) -> Self;
    /// The point before (never asked of the line's start: a hole above `a` has `lo > a`).
    fn before(self) -> Self;
    /// The point as an address in `nft` syntax.
    fn address(self) -> String;
}

impl Point for u32 {
    fn next(self) -> Self {
        self.saturating_add(1)
    }
    fn before(self) -> Self {
        self - 1
    }
    fn address(self) -> String {
        Ipv4Addr::from(self).to_string()
    }
}

impl Point for u128 {
    fn next(self) -> Self {
        self.saturating_add(1)
    }
    fn before(self) -> Self {
        self - 1
    }
    fn address(self) -> String {
        Ipv6Addr::from(self).to_string()
    }
}

/// A CIDR as the inclusive range of its addresses, on the line of its family.
pub(super) fn span4(net: Ipv4Net) -> (u32, u32) {
    (u32::from(net.network()), u32::from(net.broadcast()))
}

/// An IPv6 CIDR as the inclusive range of its addresses.
pub(super) fn span6(net: Ipv6Net) -> (u128, u128) {
    (u128::from(net.network()), u128::from(net.broadcast()))
}

/// `whole` less every range of `holes` (inclusive ranges of addresses).
pub(super) fn subtract<T: Point>(
    whole: (T, T),
    holes: impl Iterator<Item = (T, T)>,
) -> Vec<(T, T)> {
    let mut left = vec![whole];
    for (lo, hi) in holes {
        left = left
            .into_iter()
            .flat_map(|(a, b)| {
                if hi < a || lo > b {
                    return vec![(a, b)];
                }
                let mut parts = Vec::new();
                if lo > a {
                    parts.push((a, lo.before()));
                }
                if hi < b {
                    parts.push((hi.next(), b));
                }
                parts
            })
            .collect();
    }
    left
}

/// Sorted, overlapping and adjacent ranges joined: an interval set refuses overlaps.
pub(super) fn merge<T: Point>(mut ranges: Vec<(T, T)>) -> Vec<(T, T)> {
    ranges.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::new();
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1.next() => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// An address range as an interval set's element: one address, or `first-last`.
pub(super) fn range<T: Point>((a, b): (T, T)) -> String {
    if a == b {
        a.address()
    } else {
        format!("{}-{}", a.address(), b.address())
    }
}
