//! The nftables rulesets of the lab: EC2's source/destination check and the unassigned-address sink
//! in the vpc namespace (one `inet` table for both families, so an ENI has one drop counter), the
//! IGW's public-address filter, the egress-only internet gateway's conntrack filter, the NAT
//! gateway's masquerade. Scripts are generated here and loaded with `nft -f -` (one transaction
//! each); counters are read back as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::{Ipv4Net, Ipv6Net};

use crate::error::LabError;

pub(crate) const VPC_TABLE: &str = "vpclab";
pub(crate) const IGW_TABLE: &str = "vpclab_igw";
pub(crate) const NAT_TABLE: &str = "vpclab_nat";
pub(crate) const EIGW_TABLE: &str = "vpclab_eigw";
/// Counter of packets from the internet that belong to no connection started inside the VPC.
pub(crate) const EIGW_INGRESS_COUNTER: &str = "ingress_unsolicited";
/// Counter of packets routed to a VPC address no ENI holds.
pub(crate) const UNASSIGNED_COUNTER: &str = "unassigned";
pub(crate) const IGW_EGRESS_COUNTER: &str = "egress_not_public";
pub(crate) const IGW_INGRESS_COUNTER: &str = "ingress_not_public";

/// The set of addresses an ENI's veth may send from.
pub(crate) fn addr_set(vif: &str) -> String {
    format!("a_{vif}")
}

/// The set of IPv6 addresses and /80 prefixes an ENI's veth may send from.
pub(crate) fn addr_set_v6(vif: &str) -> String {
    format!("a6_{vif}")
}

/// The per-ENI drop counter of the source/destination check.
pub(crate) fn drop_counter(vif: &str) -> String {
    format!("d_{vif}")
}

/// The vpc namespace's table: an (empty) source/destination check chain and the sink drop.
pub(crate) fn vpc_base(sink: &str) -> String {
    format!(
        "table inet {VPC_TABLE} {{
  counter {UNASSIGNED_COUNTER} {{}}
  chain srcdst {{
    type filter hook prerouting priority raw; policy accept;
  }}
  chain unassigned {{
    type filter hook forward priority filter; policy accept;
    oifname \"{sink}\" counter name \"{UNASSIGNED_COUNTER}\" drop
  }}
}}
"
    )
}

fn elements<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one ENI veth may send from: its IPv4 addresses and prefixes, its IPv6 addresses and /80s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub v4: BTreeSet<Ipv4Net>,
    pub v6: BTreeSet<Ipv6Net>,
}

/// Brings the source/destination check in step: two sets (one per family), a counter and two rules
/// per ENI veth. Counters of ENIs that stay are kept (they are named objects the chain flush does
/// not touch). IPv6 packets from a link-local source (neighbour discovery towards the router) or
/// from `::` (duplicate address detection) pass: they never leave the link, as on EC2.
pub(crate) fn vpc_srcdst_update(
    current: &BTreeMap<String, Held>,
    added: &BTreeSet<String>,
    removed: &BTreeSet<String>,
) -> String {
    let mut s = String::new();
    let t = VPC_TABLE;
    let _ = writeln!(s, "flush chain inet {t} srcdst");
    for vif in removed {
        let _ = writeln!(s, "delete set inet {t} {}", addr_set(vif));
        let _ = writeln!(s, "delete set inet {t} {}", addr_set_v6(vif));
        let _ = writeln!(s, "delete counter inet {t} {}", drop_counter(vif));
    }
    for vif in added {
        let _ = writeln!(
            s,
            "add set inet {t} {} {{ type ipv4_addr; flags interval; }}",
            addr_set(vif)
        );
        let _ = writeln!(
            s,
            "add set inet {t} {} {{ type ipv6_addr; flags interval; }}",
            addr_set_v6(vif)
        );
        let _ = writeln!(s, "add counter inet {t} {}", drop_counter(vif));
    }
    for (vif, held) in current {
        for (set, items) in [
            (addr_set(vif), elements(&held.v4)),
            (addr_set_v6(vif), elements(&held.v6)),
        ] {
            let _ = writeln!(s, "flush set inet {t} {set}");
            if !items.is_empty() {
                let _ = writeln!(s, "add element inet {t} {set} {{ {items} }}");
            }
        }
        let _ = writeln!(
            s,
            "add rule inet {t} srcdst iifname \"{vif}\" ip saddr != @{} counter name \"{}\" drop",
            addr_set(vif),
            drop_counter(vif)
        );
        let _ = writeln!(
            s,
            "add rule inet {t} srcdst iifname \"{vif}\" ip6 saddr != {{ fe80::/10, :: }} ip6 saddr != @{} counter name \"{}\" drop",
            addr_set_v6(vif),
            drop_counter(vif)
        );
    }
    s
}

/// The IGW: forwards only what leaves from, or comes back to, an address with a public IP.
pub(crate) fn igw_base(internet_if: &str) -> String {
    format!(
        "table ip {IGW_TABLE} {{
  set public {{ type ipv4_addr; }}
  counter {IGW_EGRESS_COUNTER} {{}}
  counter {IGW_INGRESS_COUNTER} {{}}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname \"{internet_if}\" ip daddr != @public counter name \"{IGW_INGRESS_COUNTER}\" drop
    iifname != \"{internet_if}\" ip saddr != @public counter name \"{IGW_EGRESS_COUNTER}\" drop
  }}
}}
"
    )
}

pub(crate) fn igw_public_update(public: &BTreeSet<Ipv4Addr>) -> String {
    let mut s = format!("flush set ip {IGW_TABLE} public\n");
    if !public.is_empty() {
        let _ = writeln!(
            s,
            "add element ip {IGW_TABLE} public {{ {} }}",
            elements(public)
        );
    }
    s
}

/// The egress-only internet gateway (IPv6), in the igw namespace: forwards what the VPC sends out
/// and, from the internet, only packets of connections started inside (conntrack), as EC2's
/// egress-only internet gateway does; the rest is dropped and counted.
pub(crate) fn eigw(internet_if: &str) -> String {
    format!(
        "table ip6 {EIGW_TABLE} {{
  counter {EIGW_INGRESS_COUNTER} {{}}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname \"{internet_if}\" ct state established,related accept
    iifname \"{internet_if}\" counter name \"{EIGW_INGRESS_COUNTER}\" drop
  }}
}}
"
    )
}

/// The NAT gateway: masquerades every VPC source (any of the VPC's blocks) leaving towards the IGW.
pub(crate) fn natgw(vpc_cidrs: &[Ipv4Net], upstream_if: &str) -> String {
    let vpc_cidr = format!(
        "{{ {} }}",
        vpc_cidrs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    format!(
        "table ip {NAT_TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{upstream_if}\" ip saddr {vpc_cidr} masquerade
  }}
}}
"
    )
}

/// Packet counts of every named counter in `nft -j list counters table ip <table>` output.
pub(crate) fn counters(json: &serde_json::Value) -> Result<BTreeMap<String, u64>, LabError> {
    let bad = |reason: &str| LabError::Output {
        command: "nft -j list counters".into(),
        reason: reason.into(),
    };
    let items = json
        .get("nftables")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("no `nftables` array"))?;
    let mut out = BTreeMap::new();
    for c in items.iter().filter_map(|i| i.get("counter")) {
        let name = c
            .get("name")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("a counter without a name"))?;
        let packets = c
            .get("packets")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("a counter without packets"))?;
        out.insert(name.to_owned(), packets);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srcdst_update_keeps_counters_of_enis_that_stay() {
        let current: BTreeMap<String, Held> = [
            (
                "e1".to_owned(),
                Held {
                    v4: ["10.0.0.4/32", "10.0.1.16/28"]
                        .iter()
                        .map(|s| s.parse().expect("cidr"))
                        .collect(),
                    v6: ["2600:1f18:6d00::5/128", "2600:1f18:6d00:0:1::/80"]
                        .iter()
                        .map(|s| s.parse().expect("cidr"))
                        .collect(),
                },
            ),
            ("e2".to_owned(), Held::default()),
        ]
        .into_iter()
        .collect();
        let added: BTreeSet<String> = ["e2".to_owned()].into_iter().collect();
        let removed: BTreeSet<String> = ["e0".to_owned()].into_iter().collect();
        let s = vpc_srcdst_update(&current, &added, &removed);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "flush chain inet vpclab srcdst");
        assert!(lines.contains(&"delete counter inet vpclab d_e0"));
        assert!(lines.contains(&"delete set inet vpclab a6_e0"));
        assert!(lines.contains(&"add counter inet vpclab d_e2"));
        assert!(lines.contains(&"add set inet vpclab a6_e2 { type ipv6_addr; flags interval; }"));
        assert!(!lines.contains(&"add counter inet vpclab d_e1"));
        assert!(lines.contains(&"add element inet vpclab a_e1 { 10.0.0.4/32, 10.0.1.16/28 }"));
        assert!(lines.contains(
            &"add element inet vpclab a6_e1 { 2600:1f18:6d00::5/128, 2600:1f18:6d00:0:1::/80 }"
        ));
        assert!(lines.contains(
            &"add rule inet vpclab srcdst iifname \"e2\" ip saddr != @a_e2 counter name \"d_e2\" drop"
        ));
        // Both families count on the ENI's one counter; link-local and DAD sources pass.
        assert!(lines.contains(
            &"add rule inet vpclab srcdst iifname \"e2\" ip6 saddr != { fe80::/10, :: } ip6 saddr != @a6_e2 counter name \"d_e2\" drop"
        ));
        // An ENI with no address is not given an empty element list (a syntax error).
        assert!(!s.contains("a_e2 { }") && !s.contains("a6_e2 { }"));
    }

    #[test]
    fn counters_are_read_from_nft_json() {
        let json = serde_json::json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"counter": {"family": "ip", "name": "d_e1", "table": "vpclab", "handle": 4, "packets": 3, "bytes": 180}},
            {"counter": {"family": "ip", "name": "unassigned", "table": "vpclab", "handle": 3, "packets": 0, "bytes": 0}}
        ]});
        let c = counters(&json).expect("parses");
        assert_eq!(c["d_e1"], 3);
        assert_eq!(c["unassigned"], 0);
        assert!(counters(&serde_json::json!({"x": 1})).is_err());
    }
}
