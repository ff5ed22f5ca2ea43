//! Security groups in the vpc namespace, as a VPC applies them at each ENI: a packet delivered to an
//! ENI passes only if one of the ENI's groups has an ingress rule matching it (protocol, port range,
//! and a source CIDR or a source address held by an ENI that is a member of the referenced group);
//! a packet leaving an ENI passes only if one of its groups has a matching egress rule. Groups are
//! stateful: packets of a flow that was let through (its replies, its ICMP errors) pass without
//! rules (conntrack `established,related`, first in the chain). Traffic that comes in from the
//! IGW or the NAT gateway is judged by its real source address.
//!
//! One `inet` table (`vpclab_sg`) holds it: a `forward` chain that jumps, per ENI veth, to its
//! egress chain (`o_<vif>`, packets in from the veth) and its ingress chain (`i_<vif>`, packets out
//! to it); each ends in a drop counted on the ENI (`sg_<vif>`). A referenced group is a pair of
//! interval sets of its members' addresses (`g4_…`, `g6_…`: primary, secondary and prefix IPv4,
//! IPv6 addresses and /80s). Updates flush the rules and rebuild them in one transaction; the
//! counters of ENIs that stay keep their counts. IPv6 rules (`Ipv6Ranges`) are enforced too.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use ipnet::{Ipv4Net, Ipv6Net};

use super::{Inner, Lab};
use crate::error::LabError;
use crate::nft;
use crate::state::{CloudState, PermissionState};

pub(crate) const SG_TABLE: &str = "vpclab_sg";

/// The security-group drop counter of an ENI veth.
pub(crate) fn sg_counter(vif: &str) -> String {
    format!("sg_{vif}")
}

fn set_name(family: u8, group: &str) -> String {
    format!("g{family}_{}", group.replace('-', "_"))
}

/// What the table is loaded with: per veth its ingress and egress rule lines, and the members'
/// addresses of every referenced group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SgLoaded {
    /// veth → (ingress matches, egress matches), each a list of nft match expressions.
    pub vifs: BTreeMap<String, (Vec<String>, Vec<String>)>,
    /// group id → (IPv4 members, IPv6 members).
    pub sets: BTreeMap<String, (BTreeSet<Ipv4Net>, BTreeSet<Ipv6Net>)>,
}

/// The protocol and port part of a rule as nft matches; `None`: a rule nft cannot express for
/// this family (never the case for EC2's protocols).
fn proto_match(p: &PermissionState) -> String {
    let ports = |from: i32, to: i32| match (from, to) {
        (0, 65535) => String::new(),
        (f, t) if f == t => format!(" th dport {f}"),
        (f, t) => format!(" th dport {f}-{t}"),
    };
    let (from, to) = (p.from_port.unwrap_or(-1), p.to_port.unwrap_or(-1));
    match p.ip_protocol.as_str() {
        "-1" => String::new(),
        "tcp" | "udp" => format!("meta l4proto {}{}", p.ip_protocol, ports(from, to)),
        "icmp" | "icmpv6" => {
            let (l4, kw) = if p.ip_protocol == "icmp" {
                ("icmp", "icmp")
            } else {
                ("ipv6-icmp", "icmpv6")
            };
            let mut m = format!("meta l4proto {l4}");
            if from >= 0 {
                let _ = write!(m, " {kw} type {from}");
            }
            if to >= 0 {
                let _ = write!(m, " {kw} code {to}");
            }
            m
        }
        n => format!("meta l4proto {n}"),
    }
}

/// The nft matches of a permission for a packet whose peer is `saddr` (ingress) or `daddr`
/// (egress).
fn permission_matches(p: &PermissionState, dir: &str) -> Vec<String> {
    let proto = proto_match(p);
    let join = |peer: String| {
        if proto.is_empty() {
            peer
        } else {
            format!("{proto} {peer}")
        }
    };
    let mut out = Vec::new();
    for c in &p.ip_ranges {
        out.push(join(if c.prefix_len() == 0 {
            "meta nfproto ipv4".into()
        } else {
            format!("ip {dir} {c}")
        }));
    }
    for c in &p.ipv6_ranges {
        out.push(join(if c.prefix_len() == 0 {
            "meta nfproto ipv6".into()
        } else {
            format!("ip6 {dir} {c}")
        }));
    }
    for g in &p.groups {
        out.push(join(format!("ip {dir} @{}", set_name(4, g))));
        out.push(join(format!("ip6 {dir} @{}", set_name(6, g))));
    }
    out
}

/// What the table should hold for the ENIs the lab plugged (`vifs`: ENI id → veth) in `vpc_id`.
pub(crate) fn desired(
    state: &CloudState,
    vpc_id: &str,
    vifs: &BTreeMap<String, String>,
) -> SgLoaded {
    if state.security_groups.is_empty() {
        // A mockcloud built before security groups: nothing to enforce (every VPC has a default
        // group once they exist, so an empty list means none are modelled).
        return SgLoaded::default();
    }
    let groups: BTreeMap<&str, _> = state
        .security_groups
        .iter()
        .filter(|g| g.vpc_id == vpc_id)
        .map(|g| (g.id.as_str(), g))
        .collect();
    let mut out = SgLoaded::default();
    let mut referenced = BTreeSet::new();
    for eni in &state.network_interfaces {
        let Some(vif) = vifs.get(&eni.id) else {
            continue;
        };
        let (mut ingress, mut egress) = (Vec::new(), Vec::new());
        for g in eni
            .security_groups
            .iter()
            .filter_map(|g| groups.get(g.as_str()))
        {
            for (perms, lines, dir) in [
                (&g.ingress, &mut ingress, "saddr"),
                (&g.egress, &mut egress, "daddr"),
            ] {
                for p in perms {
                    referenced.extend(p.groups.iter().cloned());
                    for m in permission_matches(p, dir) {
                        if !lines.contains(&m) {
                            lines.push(m);
                        }
                    }
                }
            }
        }
        out.vifs.insert(vif.clone(), (ingress, egress));
    }
    for g in referenced {
        let (mut v4, mut v6) = (BTreeSet::new(), BTreeSet::new());
        for eni in state
            .network_interfaces
            .iter()
            .filter(|e| e.vpc_id == vpc_id && e.security_groups.contains(&g))
        {
            v4.insert(Ipv4Net::from(eni.primary_ip));
            v4.extend(eni.secondary_ips.iter().map(|ip| Ipv4Net::from(*ip)));
            v4.extend(eni.ipv4_prefixes.iter().copied());
            v6.extend(eni.ipv6_addresses.iter().map(|ip| Ipv6Net::from(*ip)));
            v6.extend(eni.ipv6_prefixes.iter().copied());
        }
        out.sets.insert(g, (v4, v6));
    }
    out
}

fn elements<T: std::fmt::Display>(items: &BTreeSet<T>) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The script that takes the table from `loaded` to `want` (the table itself is created by the
/// first one; `add` of an existing chain, set or counter is a no-op).
pub(crate) fn update_script(loaded: &SgLoaded, want: &SgLoaded) -> String {
    let t = SG_TABLE;
    let mut s = String::new();
    let _ = writeln!(s, "add table inet {t}");
    let _ = writeln!(
        s,
        "add chain inet {t} forward {{ type filter hook forward priority filter - 10; policy accept; }}"
    );
    let _ = writeln!(s, "flush chain inet {t} forward");
    for vif in loaded.vifs.keys() {
        let _ = writeln!(s, "flush chain inet {t} i_{vif}");
        let _ = writeln!(s, "flush chain inet {t} o_{vif}");
    }
    for vif in loaded.vifs.keys().filter(|v| !want.vifs.contains_key(*v)) {
        let _ = writeln!(s, "delete chain inet {t} i_{vif}");
        let _ = writeln!(s, "delete chain inet {t} o_{vif}");
        let _ = writeln!(s, "delete counter inet {t} {}", sg_counter(vif));
    }
    for g in loaded.sets.keys().filter(|g| !want.sets.contains_key(*g)) {
        let _ = writeln!(s, "delete set inet {t} {}", set_name(4, g));
        let _ = writeln!(s, "delete set inet {t} {}", set_name(6, g));
    }
    for (g, (v4, v6)) in &want.sets {
        for (family, kind, items) in [
            (4, "ipv4_addr", elements(v4)),
            (6, "ipv6_addr", elements(v6)),
        ] {
            let set = set_name(family, g);
            let _ = writeln!(
                s,
                "add set inet {t} {set} {{ type {kind}; flags interval; auto-merge; }}"
            );
            let _ = writeln!(s, "flush set inet {t} {set}");
            if !items.is_empty() {
                let _ = writeln!(s, "add element inet {t} {set} {{ {items} }}");
            }
        }
    }
    let _ = writeln!(
        s,
        "add rule inet {t} forward ct state established,related accept"
    );
    for (vif, (ingress, egress)) in &want.vifs {
        let counter = sg_counter(vif);
        let _ = writeln!(s, "add counter inet {t} {counter}");
        for (chain, lines) in [(format!("i_{vif}"), ingress), (format!("o_{vif}"), egress)] {
            let _ = writeln!(s, "add chain inet {t} {chain}");
            for m in lines {
                let _ = writeln!(s, "add rule inet {t} {chain} {m} return");
            }
            let _ = writeln!(
                s,
                "add rule inet {t} {chain} counter name \"{counter}\" drop"
            );
        }
    }
    // Every egress check before any ingress check: a packet from one ENI to another passes both.
    for vif in want.vifs.keys() {
        let _ = writeln!(
            s,
            "add rule inet {t} forward iifname \"{vif}\" jump o_{vif}"
        );
    }
    for vif in want.vifs.keys() {
        let _ = writeln!(
            s,
            "add rule inet {t} forward oifname \"{vif}\" jump i_{vif}"
        );
    }
    s
}

impl Lab {
    /// Packets the security groups dropped at this ENI (ingress to it and egress from it), since it
    /// was plugged.
    pub async fn sg_drops(&self, eni: &str) -> Result<u64, LabError> {
        let vif = {
            let a = self.inner.applied.lock().expect("applied lock");
            a.links
                .get(eni)
                .map(|rec| rec.vif.clone())
                .ok_or_else(|| LabError::NotFound(format!("ENI {eni} is not plugged in the lab")))?
        };
        let json = self
            .inner
            .vpc
            .nft_json(&["list", "counters", "table", "inet", SG_TABLE])
            .await?;
        nft::counters(&json)?
            .get(&sg_counter(&vif))
            .copied()
            .ok_or_else(|| LabError::NotFound(format!("no security-group counter for {eni}")))
    }
}

impl Inner {
    /// Loads the groups of the ENIs the lab has plugged, when they changed.
    pub(super) async fn apply_security_groups(&self, state: &CloudState) -> Result<(), LabError> {
        let (want, loaded) = {
            let a = self.applied.lock().expect("applied lock");
            let vifs: BTreeMap<String, String> = a
                .links
                .iter()
                .map(|(eni, rec)| (eni.clone(), rec.vif.clone()))
                .collect();
            (desired(state, &self.vpc_id, &vifs), a.sg.clone())
        };
        if loaded.as_ref() == Some(&want) {
            return Ok(());
        }
        let script = update_script(&loaded.unwrap_or_default(), &want);
        self.vpc.nft(&script).await?;
        self.applied.lock().expect("applied lock").sg = Some(want);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> CloudState {
        CloudState::from_json(serde_json::json!({
            "vpcs": [], "subnets": [], "instances": [],
            "network_interfaces": [
                {"id": "eni-1", "mac": "02:00:00:00:00:01", "subnet_id": "s", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.4", "secondary_ips": ["10.0.0.5"], "ipv4_prefixes": ["10.0.1.16/28"],
                 "ipv6_addresses": ["2600::4"], "security_groups": ["sg-app"], "attachment": null},
                {"id": "eni-2", "mac": "02:00:00:00:00:02", "subnet_id": "s", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.6", "security_groups": ["sg-db"], "attachment": null}
            ],
            "security_groups": [
                {"id": "sg-app", "vpc_id": "vpc-1", "name": "app", "ingress": [],
                 "egress": [{"ip_protocol": "-1", "ip_ranges": ["0.0.0.0/0"], "ipv6_ranges": ["::/0"]}]},
                {"id": "sg-db", "vpc_id": "vpc-1", "name": "db",
                 "ingress": [{"ip_protocol": "tcp", "from_port": 5432, "to_port": 5432, "groups": ["sg-app"],
                              "ip_ranges": ["192.168.0.0/24"]},
                             {"ip_protocol": "icmp", "from_port": 8, "to_port": -1, "ip_ranges": ["10.0.0.0/16"]}],
                 "egress": []}
            ]
        }))
        .expect("parses")
    }

    #[test]
    fn rules_become_matches_and_groups_become_sets_of_their_members_addresses() {
        let vifs = [("eni-1".into(), "e1".into()), ("eni-2".into(), "e2".into())].into();
        let d = desired(&state(), "vpc-1", &vifs);
        assert_eq!(
            d.vifs["e1"],
            (
                vec![],
                vec![
                    "meta nfproto ipv4".to_owned(),
                    "meta nfproto ipv6".to_owned()
                ]
            )
        );
        assert_eq!(
            d.vifs["e2"].0,
            vec![
                "meta l4proto tcp th dport 5432 ip saddr 192.168.0.0/24",
                "meta l4proto tcp th dport 5432 ip saddr @g4_sg_app",
                "meta l4proto tcp th dport 5432 ip6 saddr @g6_sg_app",
                "meta l4proto icmp icmp type 8 ip saddr 10.0.0.0/16",
            ]
        );
        assert!(
            d.vifs["e2"].1.is_empty(),
            "no egress rule: all out is dropped"
        );
        let (v4, v6) = &d.sets["sg-app"];
        let v4: Vec<String> = v4.iter().map(ToString::to_string).collect();
        assert_eq!(v4, ["10.0.0.4/32", "10.0.0.5/32", "10.0.1.16/28"]);
        assert_eq!(v6.len(), 1);
        // A dump without groups (an older mockcloud) filters nothing.
        let mut old = state();
        old.security_groups.clear();
        assert_eq!(desired(&old, "vpc-1", &vifs), SgLoaded::default());
        // Another VPC's groups are not this lab's.
        assert!(desired(&state(), "vpc-2", &vifs).vifs["e2"].0.is_empty());

        let script = update_script(&SgLoaded::default(), &d);
        assert!(
            script.contains("add rule inet vpclab_sg i_e2 counter name \"sg_e2\" drop"),
            "{script}"
        );
        assert!(
            script.contains(
                "add element inet vpclab_sg g4_sg_app { 10.0.0.4/32, 10.0.0.5/32, 10.0.1.16/28 }"
            ),
            "{script}"
        );
        let established = script.find("ct state established,related accept").unwrap();
        assert!(established < script.find("jump").unwrap(), "{script}");
        // An ENI that goes away takes its chains and counter with it.
        let gone = update_script(&d, &SgLoaded::default());
        assert!(gone.contains("delete chain inet vpclab_sg i_e1"), "{gone}");
        assert!(
            gone.contains("delete counter inet vpclab_sg sg_e2"),
            "{gone}"
        );
        assert!(
            gone.contains("delete set inet vpclab_sg g4_sg_app"),
            "{gone}"
        );
    }
}
