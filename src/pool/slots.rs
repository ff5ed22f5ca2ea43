//! Slots: what an ENI's IPv4 capacity holds — single secondary IPs, or with prefix delegation `/28`
//! prefixes of 16 addresses — and the dense packing of single addresses when a subnet has no `/28`
//! left for prefixes.
//!
//! Packing: EC2 picks automatically assigned addresses spread over the subnet, which breaks every
//! `/28` a prefix could use (the AWS VPC CNI then fails with `InsufficientCidrBlocks`; Cilium falls
//! back to such random addresses and rarely gets back to prefixes). eniipam asks for specific
//! addresses instead, inside the blocks that are already broken, densest first, so whole `/28`s stay
//! free for prefixes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::cloud::{Cloud, CloudError, EniFilter, Subnet};

/// Every address of a prefix (the cloud crate's, which the fakes share).
pub use crate::cloud::prefix_addresses;

/// The single addresses among `ips`: those in none of `prefixes` (EC2's calls name a `/28` by the
/// prefix, not by its addresses).
pub fn singles(ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) -> Vec<Ipv4Addr> {
    let in_prefixes: BTreeSet<Ipv4Addr> =
        prefixes.iter().flat_map(|p| prefix_addresses(*p)).collect();
    ips.iter()
        .copied()
        .filter(|ip| !in_prefixes.contains(ip))
        .collect()
}

/// How many addresses EC2 keeps in every subnet: the network address, the VPC router, the DNS
/// server, one reserved for future use, and the broadcast address.
pub fn subnet_reserved(subnet: Ipv4Net) -> BTreeSet<Ipv4Addr> {
    let net = u32::from(subnet.network());
    [
        net,
        net + 1,
        net + 2,
        net + 3,
        u32::from(subnet.broadcast()),
    ]
    .into_iter()
    .map(Ipv4Addr::from)
    .collect()
}

/// The aligned `/28` blocks of `subnet` with no used address and outside every excluded range: what
/// a prefix could still take.
pub fn free_blocks(subnet: Ipv4Net, used: &BTreeSet<Ipv4Addr>, excluded: &[Ipv4Net]) -> usize {
    blocks(subnet, used, excluded)
        .values()
        .filter(|b| b.used == 0)
        .count()
}

struct Block {
    used: u32,
    free: Vec<Ipv4Addr>,
}

fn blocks(
    subnet: Ipv4Net,
    used: &BTreeSet<Ipv4Addr>,
    excluded: &[Ipv4Net],
) -> BTreeMap<u32, Block> {
    let reserved = subnet_reserved(subnet);
    let mut out: BTreeMap<u32, Block> = BTreeMap::new();
    let Ok(sub28) = subnet.subnets(28.max(subnet.prefix_len())) else {
        return out;
    };
    for block in sub28 {
        if excluded
            .iter()
            .any(|e| e.contains(&block) || block.contains(e))
        {
            continue;
        }
        let mut b = Block {
            used: 0,
            free: Vec::new(),
        };
        for a in prefix_addresses(block) {
            if used.contains(&a) || reserved.contains(&a) {
                b.used += 1;
            } else {
                b.free.push(a);
            }
        }
        out.insert(u32::from(block.network()), b);
    }
    out
}

/// `n` free addresses of `subnet` packed densest-first: from the blocks that already hold the most
/// used addresses (they can never serve a prefix anyway), and only then from whole free blocks.
/// Addresses in `excluded` ranges (prefix-type CIDR reservations) are never picked. Returns fewer than
/// `n` when the subnet has fewer free addresses.
pub fn pack(
    subnet: Ipv4Net,
    used: &BTreeSet<Ipv4Addr>,
    excluded: &[Ipv4Net],
    n: usize,
) -> Vec<Ipv4Addr> {
    let mut candidates: Vec<Block> = blocks(subnet, used, excluded)
        .into_values()
        .filter(|b| !b.free.is_empty())
        .collect();
    // Most used first; among equals the lowest address (the order `blocks` gives is stable).
    candidates.sort_by_key(|b| std::cmp::Reverse(b.used));
    candidates
        .into_iter()
        .flat_map(|b| b.free)
        .take(n)
        .collect()
}

/// `n` free addresses of `subnet` picked by [`pack`] against EC2's view now: every ENI in the
/// subnet (any owner) and its `prefix`-type CIDR reservations, never one of `avoid` (picks that
/// collided before). Fails with `SubnetFull` when none is left.
pub async fn pack_in_subnet(
    cloud: &dyn Cloud,
    subnet: &Subnet,
    n: u32,
    avoid: &BTreeSet<Ipv4Addr>,
) -> Result<Vec<Ipv4Addr>, CloudError> {
    let enis = cloud
        .describe_enis(&EniFilter {
            subnet_id: Some(subnet.id.clone()),
            vpc_id: (!subnet.vpc_id.is_empty()).then(|| subnet.vpc_id.clone()),
            ..EniFilter::default()
        })
        .await?;
    let used: BTreeSet<Ipv4Addr> = enis
        .iter()
        .flat_map(|e| std::iter::once(e.primary_ip).chain(e.pod_addresses()))
        .chain(avoid.iter().copied())
        .collect();
    let reserved = cloud.subnet_prefix_reservations(&subnet.id).await?;
    let picked = pack(subnet.cidr, &used, &reserved, n as usize);
    if picked.is_empty() {
        return Err(CloudError::SubnetFull {
            api: "AssignPrivateIpAddresses".into(),
            message: format!(
                "no free address left in {} outside its prefix reservations",
                subnet.id
            ),
        });
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn a_prefix_routes_all_sixteen_addresses() {
        let p: Ipv4Net = "10.0.0.16/28".parse().unwrap();
        let all: Vec<Ipv4Addr> = prefix_addresses(p).collect();
        assert_eq!(all.len(), 16);
        assert_eq!(all[0], ip("10.0.0.16"));
        assert_eq!(all[15], ip("10.0.0.31"));
    }

    #[test]
    fn packing_fills_broken_blocks_and_keeps_whole_ones_free() {
        let subnet: Ipv4Net = "10.0.0.0/25".parse().unwrap(); // 8 blocks
        // Block 0 holds the 4 reserved addresses, block 7 the broadcast, block 1 one used
        // address; blocks 2 to 6 are whole.
        let used: BTreeSet<Ipv4Addr> = [ip("10.0.0.20")].into_iter().collect();
        assert_eq!(free_blocks(subnet, &used, &[]), 5);
        let picked = pack(subnet, &used, &[], 20);
        // Block 0 (4 used) first: 12 free; then block 1 (1 used, lower than block 7): 8 more.
        assert_eq!(picked.len(), 20);
        assert!(
            picked
                .iter()
                .all(|a| u32::from(*a) < u32::from(ip("10.0.0.32")))
        );
        let mut after = used.clone();
        after.extend(picked);
        assert_eq!(
            free_blocks(subnet, &after, &[]),
            5,
            "whole blocks stay free"
        );
        // Two addresses where EC2 might put them break two whole blocks.
        let spread: BTreeSet<Ipv4Addr> = [ip("10.0.0.40"), ip("10.0.0.90")].into_iter().collect();
        assert_eq!(free_blocks(subnet, &spread, &[]), 4);
    }

    #[test]
    fn reserved_ranges_are_never_packed_into() {
        let subnet: Ipv4Net = "10.0.0.0/26".parse().unwrap();
        let reserved: Ipv4Net = "10.0.0.0/27".parse().unwrap();
        let picked = pack(subnet, &BTreeSet::new(), &[reserved], 64);
        assert!(picked.iter().all(|a| !reserved.contains(a)));
        // The broadcast of the subnet is never picked either.
        assert!(!picked.contains(&ip("10.0.0.63")));
        assert_eq!(picked.len(), 31);
    }
}
