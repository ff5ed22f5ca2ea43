//! A subnet's IPv6 block and the `/80`s ENIs hold in it: the data the state ([`crate::state`])
//! keeps per subnet and the IPv6 calls ([`crate::ipv6`]) change. Apart from both, so the state does
//! not import the calls that import it.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

/// The length of the prefixes EC2 delegates from a subnet's /64.
pub const IPV6_PREFIX_LEN: u8 = 80;

/// The subnet's IPv6 block and the `/80`s ENIs hold in it.
#[derive(Clone, Debug)]
pub(crate) struct MemIpv6 {
    pub(crate) cidr: Ipv6Net,
    pub(crate) held: BTreeSet<Ipv6Net>,
}

impl MemIpv6 {
    /// The lowest `count` free `/80`s, none covering the block's reserved addresses (the first four
    /// and the last, as EC2 reserves them: the first and the last `/80` are never delegated), or
    /// none.
    pub(crate) fn allocate(&mut self, count: u32) -> Option<Vec<Ipv6Net>> {
        let free: Vec<Ipv6Net> = self
            .cidr
            .subnets(IPV6_PREFIX_LEN)
            .ok()?
            .filter(|p| {
                p.network() != self.cidr.network() && p.broadcast() != self.cidr.broadcast()
            })
            .filter(|p| !self.held.contains(p))
            .take(count as usize)
            .collect();
        if free.len() < count as usize {
            return None;
        }
        self.held.extend(free.iter().copied());
        Some(free)
    }
}

/// The default VPC's /56 and the default subnet's /64 of it (mockcloud's first VPC and first subnet).
pub(crate) fn default_blocks() -> (Ipv6Net, Ipv6Net) {
    let vpc: Ipv6Net = "2600:1f18:6d00::/56".parse().expect("valid /56");
    let subnet = Ipv6Net::new(
        Ipv6Addr::from(u128::from(vpc.network()) | (1u128 << 64)),
        64,
    )
    .expect("valid /64");
    (vpc, subnet)
}
