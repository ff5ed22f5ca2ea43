//! What the fabric should look like for one mockcloud state: nodes, ENI links with their addresses,
//! subnet routers. Pure, so the diffing in [`crate::lab`] rests on something unit-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::error::LabError;
use crate::state::CloudState;

/// The fabric wanted for one VPC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub vpc_cidr: Ipv4Net,
    /// Every IPv4 block of the VPC, primary first: routed, sunk and NATed alike.
    pub vpc_cidrs: Vec<Ipv4Net>,
    /// The VPC's IPv6 /56, when it has one.
    pub vpc_ipv6: Option<Ipv6Net>,
    /// The VPC router address of every subnet (first address + 1), answered by the vpc namespace.
    pub routers: BTreeSet<Ipv4Addr>,
    /// Running instances of the VPC, by instance id.
    pub nodes: BTreeMap<String, NodePlan>,
    /// Attached ENIs of those instances, by ENI id.
    pub links: BTreeMap<String, LinkPlan>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodePlan {
    pub primary_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub router: Ipv4Addr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LinkPlan {
    pub instance_id: String,
    pub device_index: u32,
    pub network_card_index: u32,
    pub mac: String,
    pub primary_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    /// Primary and secondary IPs as /32s, delegated prefixes as they are.
    pub addresses: BTreeSet<Ipv4Net>,
    /// The subnet's IPv6 /64, when it has one.
    pub subnet_v6: Option<Ipv6Net>,
    /// IPv6 addresses as /128s, delegated /80 prefixes as they are.
    pub addresses_v6: BTreeSet<Ipv6Net>,
    /// The first IPv6 address: what the node's DHCPv6 client would put on the link (only the
    /// primary ENI's is configured by the lab; the daemon configures secondary ENIs).
    pub primary_v6: Option<Ipv6Addr>,
}

impl LinkPlan {
    /// Two plans for the same ENI with different identities need the link recreated.
    pub fn same_device(&self, other: &LinkPlan) -> bool {
        self.instance_id == other.instance_id
            && self.device_index == other.device_index
            && self.network_card_index == other.network_card_index
            && self.mac.eq_ignore_ascii_case(&other.mac)
    }

    /// The node-side name: `eth<device index>` on card 0, `eth<card>d<device index>` elsewhere.
    pub fn node_ifname(&self) -> String {
        node_ifname(self.network_card_index, self.device_index)
    }

    /// The instance's primary ENI (eth0), which the lab configures as the OS would.
    pub fn is_primary(&self) -> bool {
        self.network_card_index == 0 && self.device_index == 0
    }
}

/// `eth<device index>` on card 0 (EC2 names them `ens5`, `ens6`… on AL2023; the lab uses the
/// kernel's classic names), `eth<card>d<device index>` on other network cards.
pub fn node_ifname(card: u32, device_index: u32) -> String {
    if card == 0 {
        format!("eth{device_index}")
    } else {
        format!("eth{card}d{device_index}")
    }
}

/// The /56 holding a /64 (EC2 gives every VPC a /56 and subnets /64s of it).
fn vpc_block_of(subnet: Ipv6Net) -> Ipv6Net {
    Ipv6Net::new(subnet.network(), 56)
        .expect("56 is a valid length")
        .trunc()
}

/// The VPC's IPv6 /56: the one mockcloud names, or the one holding every subnet's /64 (all must
/// agree), `None` when no subnet has IPv6.
fn vpc_ipv6(
    named: Option<Ipv6Net>,
    vpc_id: &str,
    subnets: &[(String, Ipv6Net)],
) -> Result<Option<Ipv6Net>, LabError> {
    let block = named.or_else(|| subnets.first().map(|(_, c)| vpc_block_of(*c)));
    if let Some(block) = block {
        for (id, c) in subnets {
            if !block.contains(c) {
                return Err(LabError::CloudState(format!(
                    "subnet {id}'s IPv6 block {c} is outside VPC {vpc_id}'s {block}"
                )));
            }
        }
    }
    Ok(block)
}

/// The VPC router of a subnet: its network address + 1, as in EC2.
pub fn subnet_router(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()) + 1)
}

pub(crate) fn plan(state: &CloudState, vpc_id: &str) -> Result<Plan, LabError> {
    let vpc = state.pick_vpc(Some(vpc_id))?;
    let blocks = vpc.blocks();
    let subnets: BTreeMap<&str, Ipv4Net> = state
        .subnets
        .iter()
        .filter(|s| s.vpc_id == vpc.id)
        .map(|s| (s.id.as_str(), s.cidr))
        .collect();
    let subnets_v6: BTreeMap<&str, Ipv6Net> = state
        .subnets
        .iter()
        .filter(|s| s.vpc_id == vpc.id)
        .filter_map(|s| s.ipv6_cidr.map(|c| (s.id.as_str(), c)))
        .collect();
    let vpc_ipv6 = vpc_ipv6(
        vpc.ipv6_cidr,
        &vpc.id,
        &subnets_v6
            .iter()
            .map(|(id, c)| ((*id).to_owned(), *c))
            .collect::<Vec<_>>(),
    )?;
    let routers = subnets.values().map(|c| subnet_router(*c)).collect();
    let subnet_of = |id: &str, what: &str| {
        subnets.get(id).copied().ok_or_else(|| {
            LabError::CloudState(format!(
                "{what} is in subnet {id}, not a subnet of {}",
                vpc.id
            ))
        })
    };
    let mut nodes = BTreeMap::new();
    for i in state
        .instances
        .iter()
        .filter(|i| i.vpc_id == vpc.id && i.state == "running")
    {
        let subnet = subnet_of(&i.subnet_id, &format!("instance {}", i.id))?;
        nodes.insert(
            i.id.clone(),
            NodePlan {
                primary_ip: i.private_ip,
                subnet,
                router: subnet_router(subnet),
            },
        );
    }
    let mut links = BTreeMap::new();
    let mut owner: BTreeMap<Ipv4Net, &str> = BTreeMap::new();
    let mut owner_v6: BTreeMap<Ipv6Net, &str> = BTreeMap::new();
    for eni in state
        .network_interfaces
        .iter()
        .filter(|e| e.vpc_id == vpc.id)
    {
        let Some(att) = eni
            .attachment
            .as_ref()
            .filter(|a| a.status == "attached" && nodes.contains_key(&a.instance_id))
        else {
            continue;
        };
        let subnet = subnet_of(&eni.subnet_id, &format!("ENI {}", eni.id))?;
        let mut addresses: BTreeSet<Ipv4Net> = std::iter::once(eni.primary_ip)
            .chain(eni.secondary_ips.iter().copied())
            .map(Ipv4Net::from)
            .collect();
        addresses.extend(eni.ipv4_prefixes.iter().map(|p| p.trunc()));
        for a in &addresses {
            if !blocks.iter().any(|b| b.contains(a)) {
                let blocks: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
                return Err(LabError::CloudState(format!(
                    "ENI {} holds {a}, outside VPC {} ({})",
                    eni.id,
                    vpc.id,
                    blocks.join(", ")
                )));
            }
            if let Some(other) = owner.insert(*a, &eni.id) {
                return Err(LabError::CloudState(format!(
                    "{a} is held by both {other} and {}",
                    eni.id
                )));
            }
        }
        let subnet_v6 = subnets_v6.get(eni.subnet_id.as_str()).copied();
        let mut addresses_v6: BTreeSet<Ipv6Net> = eni
            .ipv6_addresses
            .iter()
            .copied()
            .map(Ipv6Net::from)
            .collect();
        addresses_v6.extend(eni.ipv6_prefixes.iter().map(|p| p.trunc()));
        for a in &addresses_v6 {
            if !subnet_v6.is_some_and(|s| s.contains(a)) {
                return Err(LabError::CloudState(format!(
                    "ENI {} holds {a}, outside its subnet {}'s IPv6 block ({})",
                    eni.id,
                    eni.subnet_id,
                    subnet_v6.map_or("none".to_owned(), |s| s.to_string())
                )));
            }
            if let Some(other) = owner_v6.insert(*a, &eni.id) {
                return Err(LabError::CloudState(format!(
                    "{a} is held by both {other} and {}",
                    eni.id
                )));
            }
        }
        links.insert(
            eni.id.clone(),
            LinkPlan {
                instance_id: att.instance_id.clone(),
                device_index: att.device_index,
                network_card_index: att.network_card_index,
                mac: eni.mac.to_ascii_lowercase(),
                primary_ip: eni.primary_ip,
                subnet,
                addresses,
                subnet_v6,
                addresses_v6,
                primary_v6: eni.ipv6_addresses.first().copied(),
            },
        );
    }
    Ok(Plan {
        vpc_cidr: vpc.cidr,
        vpc_cidrs: blocks,
        vpc_ipv6,
        routers,
        nodes,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SubnetState;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("cidr")
    }

    fn state() -> CloudState {
        CloudState::from_json(serde_json::json!({
            "vpcs": [{"id": "vpc-1", "cidr": "10.0.0.0/16"}, {"id": "vpc-2", "cidr": "10.1.0.0/16"}],
            "subnets": [
                {"id": "subnet-a", "vpc_id": "vpc-1", "cidr": "10.0.0.0/20"},
                {"id": "subnet-b", "vpc_id": "vpc-1", "cidr": "10.0.16.0/20"},
                {"id": "subnet-x", "vpc_id": "vpc-2", "cidr": "10.1.0.0/20"}
            ],
            "instances": [
                {"id": "i-1", "vpc_id": "vpc-1", "subnet_id": "subnet-a", "private_ip": "10.0.0.4", "state": "running"},
                {"id": "i-2", "vpc_id": "vpc-1", "subnet_id": "subnet-b", "private_ip": "10.0.16.4", "state": "running"},
                {"id": "i-3", "vpc_id": "vpc-1", "subnet_id": "subnet-a", "private_ip": "10.0.0.9", "state": "terminated"},
                {"id": "i-4", "vpc_id": "vpc-2", "subnet_id": "subnet-x", "private_ip": "10.1.0.4", "state": "running"}
            ],
            "network_interfaces": [
                {"id": "eni-1", "mac": "02:00:00:00:00:01", "subnet_id": "subnet-a", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.4", "secondary_ips": ["10.0.0.5", "10.0.0.6"],
                 "attachment": {"instance_id": "i-1", "device_index": 0, "status": "attached"}},
                {"id": "eni-2", "mac": "02:00:00:00:00:02", "subnet_id": "subnet-a", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.7", "secondary_ips": [], "ipv4_prefixes": ["10.0.1.16/28"],
                 "attachment": {"instance_id": "i-1", "device_index": 1, "status": "attached"}},
                {"id": "eni-3", "mac": "02:00:00:00:00:03", "subnet_id": "subnet-a", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.8", "secondary_ips": [],
                 "attachment": {"instance_id": "i-1", "device_index": 2, "status": "attaching"}},
                {"id": "eni-4", "mac": "02:00:00:00:00:04", "subnet_id": "subnet-a", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.0.10", "secondary_ips": [], "attachment": null},
                {"id": "eni-5", "mac": "02:00:00:00:00:05", "subnet_id": "subnet-b", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.16.4", "secondary_ips": [],
                 "attachment": {"instance_id": "i-2", "device_index": 0, "status": "attached"}},
                {"id": "eni-6", "mac": "02:00:00:00:00:06", "subnet_id": "subnet-b", "vpc_id": "vpc-1",
                 "primary_ip": "10.0.16.5", "secondary_ips": [],
                 "attachment": {"instance_id": "i-2", "device_index": 1, "status": "attached", "network_card_index": 1}},
                {"id": "eni-7", "mac": "02:00:00:00:00:07", "subnet_id": "subnet-x", "vpc_id": "vpc-2",
                 "primary_ip": "10.1.0.4", "secondary_ips": [],
                 "attachment": {"instance_id": "i-4", "device_index": 0, "status": "attached"}}
            ]
        }))
        .expect("state parses")
    }

    #[test]
    fn running_instances_and_attached_enis_of_the_vpc_only() {
        let p = plan(&state(), "vpc-1").expect("plan");
        assert_eq!(p.vpc_cidr, net("10.0.0.0/16"));
        assert_eq!(
            p.nodes.keys().map(String::as_str).collect::<Vec<_>>(),
            ["i-1", "i-2"]
        );
        assert_eq!(
            p.nodes["i-2"],
            NodePlan {
                primary_ip: "10.0.16.4".parse().expect("ip"),
                subnet: net("10.0.16.0/20"),
                router: "10.0.16.1".parse().expect("ip"),
            }
        );
        assert_eq!(
            p.links.keys().map(String::as_str).collect::<Vec<_>>(),
            ["eni-1", "eni-2", "eni-5", "eni-6"]
        );
        assert_eq!(
            p.routers,
            ["10.0.0.1", "10.0.16.1"]
                .iter()
                .map(|s| s.parse().expect("ip"))
                .collect()
        );
    }

    #[test]
    fn addresses_cover_primary_secondaries_and_prefixes() {
        let p = plan(&state(), "vpc-1").expect("plan");
        assert_eq!(
            p.links["eni-1"].addresses,
            [net("10.0.0.4/32"), net("10.0.0.5/32"), net("10.0.0.6/32")]
                .into_iter()
                .collect()
        );
        assert_eq!(
            p.links["eni-2"].addresses,
            [net("10.0.0.7/32"), net("10.0.1.16/28")]
                .into_iter()
                .collect()
        );
        assert_eq!(p.links["eni-2"].node_ifname(), "eth1");
        assert_eq!(p.links["eni-6"].node_ifname(), "eth1d1");
    }

    #[test]
    fn an_address_held_twice_is_refused() {
        let mut s = state();
        s.network_interfaces[1]
            .secondary_ips
            .push("10.0.0.5".parse().expect("ip"));
        let err = plan(&s, "vpc-1").expect_err("duplicate");
        assert!(
            err.to_string().contains("held by both eni-1 and eni-2"),
            "{err}"
        );
    }

    #[test]
    fn a_secondary_block_is_routed_like_the_primary() {
        let mut s = state();
        // A pod subnet in 100.64.0.0/16 (custom networking) and an ENI of i-1 in it.
        s.vpcs[0].cidrs = vec![net("10.0.0.0/16"), net("100.64.0.0/16")];
        s.subnets.push(SubnetState {
            id: "subnet-p".into(),
            vpc_id: "vpc-1".into(),
            cidr: net("100.64.0.0/19"),
            ipv6_cidr: None,
        });
        s.network_interfaces[2].subnet_id = "subnet-p".into();
        s.network_interfaces[2].primary_ip = "100.64.0.9".parse().expect("ip");
        s.network_interfaces[2].secondary_ips = vec!["100.64.3.7".parse().expect("ip")];
        s.network_interfaces[2]
            .attachment
            .as_mut()
            .expect("att")
            .status = "attached".into();
        let p = plan(&s, "vpc-1").expect("plan");
        assert_eq!(p.vpc_cidrs, [net("10.0.0.0/16"), net("100.64.0.0/16")]);
        assert!(p.routers.contains(&"100.64.0.1".parse().expect("ip")));
        let l = &p.links["eni-3"];
        assert_eq!(l.subnet, net("100.64.0.0/19"));
        assert!(l.addresses.contains(&net("100.64.3.7/32")));
        // Without the block (an old dump, or another VPC's address) the address is refused.
        s.vpcs[0].cidrs.clear();
        let err = plan(&s, "vpc-1").expect_err("outside");
        assert!(
            err.to_string().contains("outside VPC vpc-1 (10.0.0.0/16)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_vpc_is_a_clear_error() {
        let err = plan(&state(), "vpc-9").expect_err("unknown");
        assert!(err.to_string().contains("no VPC vpc-9"), "{err}");
    }

    fn net6(s: &str) -> Ipv6Net {
        s.parse().expect("cidr")
    }

    #[test]
    fn ipv6_addresses_and_prefixes_are_planned_inside_the_derived_block() {
        let mut s = state();
        s.subnets[0].ipv6_cidr = Some(net6("2600:1f18:6d00::/64"));
        s.subnets[1].ipv6_cidr = Some(net6("2600:1f18:6d00:1::/64"));
        s.network_interfaces[0].ipv6_addresses = vec![
            "2600:1f18:6d00::a".parse().expect("ip"),
            "2600:1f18:6d00::b".parse().expect("ip"),
        ];
        s.network_interfaces[0].ipv6_prefixes = vec![net6("2600:1f18:6d00:0:7::/80")];
        let p = plan(&s, "vpc-1").expect("plan");
        // mockcloud's dump names no /56: the one holding the subnets' /64s.
        assert_eq!(p.vpc_ipv6, Some(net6("2600:1f18:6d00::/56")));
        let eni1 = &p.links["eni-1"];
        assert_eq!(eni1.subnet_v6, Some(net6("2600:1f18:6d00::/64")));
        assert_eq!(
            eni1.addresses_v6,
            [
                net6("2600:1f18:6d00::a/128"),
                net6("2600:1f18:6d00::b/128"),
                net6("2600:1f18:6d00:0:7::/80")
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(
            eni1.primary_v6,
            Some("2600:1f18:6d00::a".parse().expect("ip"))
        );
        assert!(p.links["eni-5"].addresses_v6.is_empty());
        assert_eq!(p.links["eni-5"].primary_v6, None);

        // No IPv6 anywhere: no block.
        assert_eq!(plan(&state(), "vpc-1").expect("plan").vpc_ipv6, None);
    }

    #[test]
    fn ipv6_outside_the_subnet_or_the_vpc_block_is_a_clear_error() {
        let mut s = state();
        s.network_interfaces[0].ipv6_addresses = vec!["2600:1f18:6d00::a".parse().expect("ip")];
        let err = plan(&s, "vpc-1").expect_err("subnet without /64");
        assert!(
            err.to_string()
                .contains("ENI eni-1 holds 2600:1f18:6d00::a/128, outside its subnet subnet-a's IPv6 block (none)"),
            "{err}"
        );

        let mut s = state();
        s.subnets[0].ipv6_cidr = Some(net6("2600:1f18:6d00::/64"));
        s.subnets[1].ipv6_cidr = Some(net6("2600:1f18:6d01::/64"));
        let err = plan(&s, "vpc-1").expect_err("two /56s");
        assert!(err.to_string().contains("outside VPC vpc-1's"), "{err}");
    }
}
