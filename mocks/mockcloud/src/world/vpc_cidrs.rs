//! A VPC's secondary IPv4 CIDR blocks (EC2's `AssociateVpcCidrBlock`), as custom networking uses
//! them: pods in a subnet of, say, 100.64.0.0/16 while the nodes stay in the primary 10.x block.
//!
//! EC2's rules, from the VPC user guide ("Adding IPv4 CIDR blocks to a VPC" and its table "IPv4
//! CIDR block association restrictions"):
//! - a block is /16 to /28 (canonicalised, as EC2 does) and overlaps none of the VPC's others;
//! - a VPC holds at most [`VPC_IPV4_CIDR_LIMIT`] IPv4 blocks, the primary included (the default
//!   quota), beyond which EC2 answers `CidrLimitExceeded`;
//! - what may be added depends on the range the *primary* block lies in ([`restriction`]): a VPC
//!   in 10.0.0.0/8 cannot add 172.16.0.0/12 or 192.168.0.0/16 space, but may add 100.64.0.0/10 or
//!   publicly routable space.
//!
//! Every other rule (subnets, IMDS, the state dump) reads a VPC's blocks through
//! [`World::vpc_ipv4_cidrs`], primary first.

use ipnet::Ipv4Net;
use serde::Serialize;

use super::{Ec2Error, Ec2Result, World, malformed, not_found, well_formed};

/// EC2's default quota of IPv4 CIDR blocks per VPC (the primary and four secondaries).
pub const VPC_IPV4_CIDR_LIMIT: usize = 5;

/// One IPv4 block of a VPC as `AssociateVpcCidrBlock` answers it (`cidrBlockAssociation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VpcCidrAssociation {
    pub association_id: String,
    pub vpc_id: String,
    pub cidr: Ipv4Net,
}

fn net(s: &str) -> Ipv4Net {
    s.parse().expect("literal CIDR")
}

/// The ranges EC2's restriction table is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Range {
    Ten,
    OneSevenTwo,
    OneNineTwo,
    /// 198.19.0.0/16.
    OneNineEight,
    /// Publicly routable (non-RFC 1918) space and 100.64.0.0/10, which the table treats alike.
    Public,
}

fn range_of(c: Ipv4Net) -> Range {
    if net("10.0.0.0/8").contains(&c) {
        Range::Ten
    } else if net("172.16.0.0/12").contains(&c) {
        Range::OneSevenTwo
    } else if net("192.168.0.0/16").contains(&c) {
        Range::OneNineTwo
    } else if net("198.19.0.0/16").contains(&c) {
        Range::OneNineEight
    } else {
        Range::Public
    }
}

/// Why EC2 refuses to add `new` to a VPC whose primary block is `primary` (the user guide's table
/// "IPv4 CIDR block association restrictions"); `None` when the table permits it.
pub(crate) fn restriction(primary: Ipv4Net, new: Ipv4Net) -> Option<String> {
    let (p, n) = (range_of(primary), range_of(new));
    let rfc1918 = matches!(n, Range::Ten | Range::OneSevenTwo | Range::OneNineTwo);
    let refused = match p {
        // Another RFC 1918 range, 198.19.0.0/16, and 10.0.0.0/16 when the primary is in 10.0.0.0/15.
        Range::Ten => {
            (rfc1918 && n != Range::Ten)
                || n == Range::OneNineEight
                || (net("10.0.0.0/15").contains(&primary) && net("10.0.0.0/16").contains(&new))
        }
        // Another RFC 1918 range, 172.31.0.0/16 (the default VPCs'), 198.19.0.0/16.
        Range::OneSevenTwo => {
            (rfc1918 && n != Range::OneSevenTwo)
                || n == Range::OneNineEight
                || net("172.31.0.0/16").contains(&new)
        }
        Range::OneNineTwo => (rfc1918 && n != Range::OneNineTwo) || n == Range::OneNineEight,
        // Only publicly routable space or 100.64.0.0/10 is permitted.
        Range::OneNineEight | Range::Public => n != Range::Public,
    };
    refused.then(|| {
        format!(
            "The CIDR '{new}' is restricted for a VPC whose primary CIDR is {primary}. Use a CIDR from the same private address range as the current VPC CIDR, or use a publicly-routable CIDR (or one from 100.64.0.0/10)."
        )
    })
}

impl World {
    fn vpc_checked(&self, vpc_id: &str) -> Ec2Result<&super::Vpc> {
        if !well_formed(vpc_id, "vpc") {
            return Err(malformed("InvalidVpcID.Malformed", "vpc", vpc_id));
        }
        self.vpcs
            .get(vpc_id)
            .ok_or_else(|| not_found("InvalidVpcID.NotFound", "vpc", vpc_id))
    }

    /// The VPC's IPv4 blocks, primary first (empty for an unknown VPC).
    pub fn vpc_ipv4_cidrs(&self, vpc_id: &str) -> Vec<Ipv4Net> {
        self.vpcs
            .get(vpc_id)
            .map(|v| {
                std::iter::once(v.cidr)
                    .chain(v.secondary_cidrs.iter().map(|(_, c)| *c))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `AssociateVpcCidrBlock` with `CidrBlock`: adds a secondary IPv4 block under EC2's rules.
    pub fn associate_vpc_cidr_block(
        &mut self,
        vpc_id: &str,
        cidr: Ipv4Net,
    ) -> Ec2Result<VpcCidrAssociation> {
        let primary = self.vpc_checked(vpc_id)?.cidr;
        let cidr = cidr.trunc();
        if !(16..=28).contains(&cidr.prefix_len()) {
            return Err(Ec2Error::client(
                "InvalidVpc.Range",
                format!("The CIDR '{cidr}' is invalid: the prefix must be between /16 and /28."),
            ));
        }
        let blocks = self.vpc_ipv4_cidrs(vpc_id);
        if blocks.len() >= VPC_IPV4_CIDR_LIMIT {
            return Err(Ec2Error::client(
                "CidrLimitExceeded",
                format!(
                    "This network '{vpc_id}' has met its maximum number of allowed CIDRs: {VPC_IPV4_CIDR_LIMIT}"
                ),
            ));
        }
        if let Some(b) = blocks
            .iter()
            .find(|b| b.contains(&cidr) || cidr.contains(*b))
        {
            return Err(Ec2Error::client(
                "InvalidVpc.Range",
                format!("The CIDR '{cidr}' conflicts with another CIDR of {vpc_id} ({b})."),
            ));
        }
        if let Some(why) = restriction(primary, cidr) {
            return Err(Ec2Error::client("InvalidVpc.Range", why));
        }
        let association_id = self.new_id("vpc-cidr-assoc");
        self.vpcs
            .get_mut(vpc_id)
            .expect("checked")
            .secondary_cidrs
            .push((association_id.clone(), cidr));
        Ok(VpcCidrAssociation {
            association_id,
            vpc_id: vpc_id.to_owned(),
            cidr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_guide_table() {
        let refused = |p: &str, n: &str| restriction(net(p), net(n)).is_some();
        // Primary in 10.0.0.0/8.
        assert!(!refused("10.0.0.0/16", "100.64.0.0/16"));
        assert!(!refused("10.0.0.0/16", "10.2.0.0/16"));
        assert!(!refused("10.0.0.0/16", "54.10.0.0/16"), "publicly routable");
        assert!(refused("10.0.0.0/16", "172.20.0.0/16"));
        assert!(refused("10.0.0.0/16", "192.168.0.0/16"));
        assert!(refused("10.0.0.0/16", "198.19.0.0/16"));
        assert!(refused("10.1.0.0/16", "10.0.4.0/24"), "10.0.0.0/15 primary");
        assert!(!refused("10.4.0.0/16", "10.0.4.0/24"));
        // Primary in 172.16.0.0/12.
        assert!(refused("172.20.0.0/16", "172.31.0.0/16"));
        assert!(!refused("172.20.0.0/16", "172.21.0.0/16"));
        assert!(refused("172.20.0.0/16", "10.0.0.0/16"));
        // Primary in 192.168.0.0/16.
        assert!(!refused("192.168.0.0/20", "192.168.16.0/20"));
        assert!(refused("192.168.0.0/20", "172.16.0.0/16"));
        // Primary in 198.19.0.0/16, publicly routable or 100.64.0.0/10.
        assert!(refused("198.19.0.0/20", "10.0.0.0/16"));
        assert!(!refused("198.19.0.0/20", "100.64.0.0/16"));
        assert!(refused("100.64.0.0/16", "10.0.0.0/16"));
        assert!(refused("100.64.0.0/16", "198.19.0.0/16"));
        assert!(!refused("100.64.0.0/16", "54.0.0.0/16"));
    }
}
