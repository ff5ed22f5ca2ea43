//! NodePort, hostPort and instance-target load balancers for pods on secondary ENIs, as the AWS VPC
//! CNI does it (`AWS_VPC_CNI_NODE_PORT_SUPPORT`).
//!
//! A connection that arrives on eth0 for a node address is DNATed (kube-proxy, portmap) to a pod. If
//! the pod's address belongs to a secondary ENI, its reply would follow `from <pod ip> lookup <ENI
//! table>` and leave by that ENI with eth0's address once un-DNATed: EC2's source/destination check
//! drops it. So the connection is marked when it arrives, the mark is copied onto the pod's reply
//! packets, and a policy rule sends marked packets through the main table, out of eth0:
//!
//! ```text
//! chain mark-primary  filter prerouting, priority mangle (before any DNAT: the destination is still
//!                     the node's own address)
//!   iifname "<primary>" fib daddr . iif type local ct mark set ct mark | 0x80
//! chain mark-pods     filter prerouting, priority dstnat + 10
//!   iifname "eni*" ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80
//! ip rule             1024: fwmark 0x80/0x80 lookup main      (before the pods' 1536 rules)
//! sysctl              net.ipv4.conf.<primary>.rp_filter = 2 when it was 1 (strict)
//! ```
//!
//! The primary interface is the link with eth0's MAC (from IMDS), whatever its name (`ens5` on
//! AL2023). Strict reverse-path filtering on it would drop the DNATed SYN (its reverse route, for the
//! pod's source, goes out of the pod's ENI) and the replies of SNATed connections of such pods; loose
//! mode (2) only asks that the source be routable at all. The kernel uses the higher of `conf/all`
//! and the interface's value, so setting the interface to 2 makes it loose even when `all` is 1.

use eniipam_netlink::{MAIN_TABLE, PolicyRule, RuleSelector};

use super::netfilter::{Action, Chain, ChainType, Hook, Match, Priority, Rule};

/// The chain that marks connections arriving on the primary interface.
pub const MARK_PRIMARY_CHAIN: &str = "mark-primary";
/// The chain that marks pods' egress and restores marks on their packets.
pub const MARK_PODS_CHAIN: &str = "mark-pods";
/// Priority of the `fwmark` rule (the VPC CNI's): after the pods' `to` rules (512), before their
/// `from` rules (1536).
pub const FWMARK_RULE_PRIORITY: u32 = 1024;

/// The chain marking connections that arrive on `primary_ifname` for one of its addresses.
pub fn mark_primary_chain(primary_ifname: &str, mark: u32) -> Chain {
    Chain {
        name: MARK_PRIMARY_CHAIN.into(),
        kind: ChainType::Filter,
        hook: Hook::Prerouting,
        priority: Priority::Mangle(0),
        rules: vec![Rule {
            matches: vec![
                Match::IifName(primary_ifname.to_owned()),
                Match::DaddrLocal {
                    on_iif: true,
                    negate: false,
                },
            ],
            action: Action::CtMarkSet(mark),
            comment: Some(
                "eniipam: NodePort, hostPort: connections arriving on the primary ENI".into(),
            ),
        }],
    }
}

/// Copies the connection's mark onto packets coming from pods (their replies, and their SNATed
/// egress after the first packet).
pub fn restore_rule(veth_prefix: &str, mark: u32) -> Rule {
    Rule {
        matches: vec![
            Match::IifNamePrefix(veth_prefix.to_owned()),
            Match::CtMarkHas(mark),
        ],
        action: Action::MetaMarkSet(mark),
        comment: Some("eniipam: marked connections of pods are routed by the main table".into()),
    }
}

/// `1024: fwmark <mark>/<mark> lookup main`.
pub fn fwmark_rule(mark: u32) -> PolicyRule {
    PolicyRule {
        priority: FWMARK_RULE_PRIORITY,
        selector: RuleSelector::FwMark { mark, mask: mark },
        iif: None,
        table: MAIN_TABLE,
    }
}

/// `/proc/sys/net/ipv4/conf/<ifname>/rp_filter`.
fn rp_filter_path(ifname: &str) -> Result<String, std::io::Error> {
    if ifname.is_empty() || ifname == "." || ifname == ".." || ifname.contains('/') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{ifname:?} is not an interface name"),
        ));
    }
    Ok(format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter"))
}

/// Reads the interface's `rp_filter` (0 off, 1 strict, 2 loose).
pub fn rp_filter(ifname: &str) -> Result<u8, std::io::Error> {
    let path = rp_filter_path(ifname)?;
    let text = std::fs::read_to_string(&path)?;
    text.trim().parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{path} holds {text:?}"),
        )
    })
}

/// Sets the interface's `rp_filter` to 2 (loose) when it is 1 (strict); off (0) and loose stay.
/// Returns whether it changed.
pub fn loosen_rp_filter(ifname: &str) -> Result<bool, std::io::Error> {
    if rp_filter(ifname)? != 1 {
        return Ok(false);
    }
    std::fs::write(rp_filter_path(ifname)?, "2")?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_the_vpc_cni() {
        let c = mark_primary_chain("ens5", 0x80);
        assert_eq!(c.priority.value(), -150);
        assert!(
            c.rules[0].to_string().starts_with(
                "iifname \"ens5\" fib daddr . iif type local ct mark set ct mark | 0x80"
            )
        );
        assert!(
            restore_rule("eni", 0x80).to_string().starts_with(
                "iifname \"eni*\" ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80"
            )
        );
        assert_eq!(
            fwmark_rule(0x80).to_string(),
            "1024: fwmark 0x80/0x80 lookup 254"
        );
    }

    #[test]
    fn rp_filter_paths_refuse_what_is_not_a_name() {
        for bad in ["", ".", "..", "a/b"] {
            assert!(rp_filter_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            rp_filter_path("ens5").unwrap(),
            "/proc/sys/net/ipv4/conf/ens5/rp_filter"
        );
    }
}
