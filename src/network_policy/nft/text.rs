//! The text pieces of the ruleset: names and comments made safe for `nft`, and address and
//! port ranges cut and merged (an interval set refuses overlapping elements).

use std::net::Ipv4Addr;

use crate::network_policy::compile::Protocol;

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

/// `whole` less every range of `holes` (inclusive ranges of addresses).
pub(super) fn subtract(
    whole: (u32, u32),
    holes: impl Iterator<Item = (u32, u32)>,
) -> Vec<(u32, u32)> {
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
                    parts.push((a, lo - 1));
                }
                if hi < b {
                    parts.push((hi + 1, b));
                }
                parts
            })
            .collect();
    }
    left
}

/// Sorted, overlapping and adjacent ranges joined: an interval set refuses overlaps.
pub(super) fn merge(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

pub(super) fn range((a, b): (u32, u32)) -> String {
    if a == b {
        Ipv4Addr::from(a).to_string()
    } else {
        format!("{}-{}", Ipv4Addr::from(a), Ipv4Addr::from(b))
    }
}
