//! The nftables rulesets of the lab: EC2's source/destination check and the unassigned-address sink
//! in the vpc namespace, the IGW's public-address filter, the NAT gateway's masquerade. Scripts are
//! generated here and loaded with `nft -f -` (one transaction each); counters are read back as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::LabError;

pub(crate) const VPC_TABLE: &str = "vpclab";
pub(crate) const IGW_TABLE: &str = "vpclab_igw";
pub(crate) const NAT_TABLE: &str = "vpclab_nat";
/// Counter of packets routed to a VPC address no ENI holds.
pub(crate) const UNASSIGNED_COUNTER: &str = "unassigned";
pub(crate) const IGW_EGRESS_COUNTER: &str = "egress_not_public";
pub(crate) const IGW_INGRESS_COUNTER: &str = "ingress_not_public";

/// The set of addresses an ENI's veth may send from.
pub(crate) fn addr_set(vif: &str) -> String {
    format!("a_{vif}")
}

/// The per-ENI drop counter of the source/destination check.
pub(crate) fn drop_counter(vif: &str) -> String {
    format!("d_{vif}")
}

/// The vpc namespace's table: an (empty) source/destination check chain and the sink drop.
pub(crate) fn vpc_base(sink: &str) -> String {
    format!(
        "table ip {VPC_TABLE} {{
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

/// Brings the source/destination check in step: one set + counter + rule per ENI veth. Counters of
/// ENIs that stay are kept (they are named objects the chain flush does not touch).
pub(crate) fn vpc_srcdst_update(
    current: &BTreeMap<String, BTreeSet<Ipv4Net>>,
    added: &BTreeSet<String>,
    removed: &BTreeSet<String>,
) -> String {
    let mut s = String::new();
    let t = VPC_TABLE;
    let _ = writeln!(s, "flush chain ip {t} srcdst");
    for vif in removed {
        let _ = writeln!(s, "delete set ip {t} {}", addr_set(vif));
        let _ = writeln!(s, "delete counter ip {t} {}", drop_counter(vif));
    }
    for vif in added {
        let _ = writeln!(
            s,
            "add set ip {t} {} {{ type ipv4_addr; flags interval; }}",
            addr_set(vif)
        );
        let _ = writeln!(s, "add counter ip {t} {}", drop_counter(vif));
    }
    for (vif, addrs) in current {
        let _ = writeln!(s, "flush set ip {t} {}", addr_set(vif));
        if !addrs.is_empty() {
            let _ = writeln!(
                s,
                "add element ip {t} {} {{ {} }}",
                addr_set(vif),
                elements(addrs)
            );
        }
        let _ = writeln!(
            s,
            "add rule ip {t} srcdst iifname \"{vif}\" ip saddr != @{} counter name \"{}\" drop",
            addr_set(vif),
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

/// The NAT gateway: masquerades every VPC source leaving towards the IGW.
pub(crate) fn natgw(vpc_cidr: Ipv4Net, upstream_if: &str) -> String {
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
        let current: BTreeMap<String, BTreeSet<Ipv4Net>> = [
            (
                "e1".to_owned(),
                ["10.0.0.4/32", "10.0.1.16/28"]
                    .iter()
                    .map(|s| s.parse().expect("cidr"))
                    .collect(),
            ),
            ("e2".to_owned(), BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        let added: BTreeSet<String> = ["e2".to_owned()].into_iter().collect();
        let removed: BTreeSet<String> = ["e0".to_owned()].into_iter().collect();
        let s = vpc_srcdst_update(&current, &added, &removed);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "flush chain ip vpclab srcdst");
        assert!(lines.contains(&"delete counter ip vpclab d_e0"));
        assert!(lines.contains(&"add counter ip vpclab d_e2"));
        assert!(!lines.contains(&"add counter ip vpclab d_e1"));
        assert!(lines.contains(&"add element ip vpclab a_e1 { 10.0.0.4/32, 10.0.1.16/28 }"));
        assert!(lines.contains(
            &"add rule ip vpclab srcdst iifname \"e2\" ip saddr != @a_e2 counter name \"d_e2\" drop"
        ));
        // An ENI with no address is not given an empty element list (a syntax error).
        assert!(!s.contains("a_e2 { }"));
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
