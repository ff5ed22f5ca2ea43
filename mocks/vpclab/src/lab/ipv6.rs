//! The IPv6 side of the fabric, as EC2 has it:
//!
//! - **The VPC router** answers on every ENI veth at [`VPC_ROUTER_V6`], a link-local address (EC2's
//!   router answers at a link-local address too, and nodes learn it from router advertisements;
//!   the lab sends none and installs the node's routes `via fe80::1 dev eth0` directly, as the OS
//!   would have them after an RA). The subnet's /64 is routed the same way rather than on-link:
//!   EC2 answers neighbour solicitations for any address of the subnet, but Linux answers them by
//!   proxy only address by address (`ip neigh add proxy`), which cannot cover a /80. The packets
//!   take the same path either way: node → VPC router → the ENI that holds the destination.
//! - Every IPv6 address (/128) and /80 prefix an ENI holds is routed to the ENI's veth through a
//!   link-local next hop whose permanent neighbour is the ENI's MAC (as for IPv4: EC2 delivers to
//!   the ENI's MAC; no node answers neighbour solicitations for a pod's address).
//! - The node's eth0 gets the primary ENI's first IPv6 address as a `/128`, as a DHCPv6 lease
//!   gives it (mockcloud assigns none at launch: a node has one once `AssignIpv6Addresses` gave
//!   it one). A node with only a /80 still reaches the router from its link-local address.
//! - The source/destination check and the unassigned-address sink cover IPv6 in the same nftables
//!   table as IPv4 (see `nft`); the VPC's /56 is sunk like its IPv4 CIDR.
//! - **An egress-only internet gateway** in the igw namespace: the VPC's IPv6 default route leads
//!   there (also in a NAT-gateway lab: EC2's NAT gateways do not carry IPv6, private subnets use
//!   an egress-only gateway), it forwards everything going out and, coming in, only packets of
//!   connections started inside. [`INTERNET_SERVER_V6`] sits behind it.

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

use super::{Inner, Lab, SINK, SyncReport, random_mac};
use crate::error::LabError;
use crate::netns::NetNs;
use crate::plan::LinkPlan;

/// The VPC router's address on every ENI link (link-local), the node's IPv6 default gateway.
pub const VPC_ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The pod gateway the CNI plugin gives IPv6 pods (link-local on each host veth), as
/// [`super::POD_GATEWAY`] for IPv4.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The next hop of every IPv6 route to an ENI, with a permanent neighbour entry for its MAC.
const ENI_NEXT_HOP_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0xffff, 1);
/// The internet server's IPv6 address: a unique local range the lab owns (`fd65:6e69:6970::/48`,
/// "eni p"), never a VPC address; reachable only through the egress-only gateway, and only from
/// namespaces the lab made (nothing routes it elsewhere).
pub const INTERNET_SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd65, 0x6e69, 0x6970, 1, 0, 0, 0, 0x10);
/// The gateway's address on the internet side.
const EIGW_INTERNET_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd65, 0x6e69, 0x6970, 1, 0, 0, 0, 1);
/// Link-local ends of the vpc ↔ igw transit link.
const VPC_TO_IGW_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa);
const IGW_TO_VPC_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb);

/// A pod plumbed by hand with an IPv6 address, as the CNI plugin wires one: its own namespace, a
/// veth whose node end is `host_if` with `fe80::1/64`, the pod's `/128`, a default route via
/// `fe80::1` with a permanent neighbour for the host end's MAC, and a `/128` route to `host_if` in
/// the node. The node needs `net.ipv6.conf.all.forwarding=1` (a node sysctl of the lab config).
#[derive(Clone, Debug)]
pub struct Pod6 {
    pub instance_id: String,
    pub ns: NetNs,
    pub ip: Ipv6Addr,
    pub host_if: String,
}

/// The transit link's addresses and the routes of the VPC's /56: sunk in the vpc namespace (more
/// specific routes to ENIs win), routed back from the igw; the VPC's IPv6 default route, and the
/// internet server.
pub(super) async fn wire_gateways(
    vpc: &NetNs,
    igw: &NetNs,
    internet: &NetNs,
    block: Ipv6Net,
) -> Result<(), LabError> {
    vpc.ip_batch(&[
        format!("addr add {VPC_TO_IGW_V6}/64 dev to-igw nodad"),
        format!("route add {block} dev {SINK}"),
        format!("route add ::/0 via {IGW_TO_VPC_V6} dev to-igw"),
    ])
    .await?;
    igw.ip_batch(&[
        format!("addr add {IGW_TO_VPC_V6}/64 dev to-vpc nodad"),
        format!("addr add {EIGW_INTERNET_IP_V6}/64 dev to-inet nodad"),
        format!("route add {block} via {VPC_TO_IGW_V6} dev to-vpc"),
    ])
    .await?;
    internet
        .ip_batch(&[
            format!("addr add {INTERNET_SERVER_V6}/64 dev eth0 nodad"),
            format!("route add ::/0 via {EIGW_INTERNET_IP_V6} dev eth0"),
        ])
        .await
}

/// The vpc side of a new ENI veth: the router's link-local address and the next hop's neighbour.
pub(super) fn vif_lines(vif: &str, mac: &str) -> [String; 2] {
    [
        format!("addr add {VPC_ROUTER_V6}/64 dev {vif} nodad"),
        format!("neigh replace {ENI_NEXT_HOP_V6} lladdr {mac} dev {vif} nud permanent"),
    ]
}

/// A primary ENI's IPv6 routes in its node, when its subnet has IPv6 (as a router advertisement
/// would leave them): the subnet's /64 and the default, both via the router's link-local address.
pub(super) fn eth0_route_lines(plan: &LinkPlan, ifname: &str) -> Vec<String> {
    plan.subnet_v6
        .map(|subnet| {
            vec![
                format!("route add {subnet} via {VPC_ROUTER_V6} dev {ifname}"),
                format!("route add ::/0 via {VPC_ROUTER_V6} dev {ifname}"),
            ]
        })
        .unwrap_or_default()
}

impl Inner {
    /// Routes every IPv6 address and /80 an ENI holds to its veth, diffed against the kernel's
    /// table (routes inside the VPC's block only: each veth's own `fe80::/64` is not ours).
    pub(super) async fn apply_routes_v6(&self, report: &mut SyncReport) -> Result<(), LabError> {
        let kernel = self.vpc.routes_v6().await?;
        let (desired, vifs) = {
            let a = self.applied.lock().expect("applied lock");
            let desired: std::collections::BTreeMap<Ipv6Net, String> = a
                .links
                .values()
                .flat_map(|l| l.plan.addresses_v6.iter().map(|n| (*n, l.vif.clone())))
                .collect();
            let vifs: std::collections::BTreeSet<String> =
                a.links.values().map(|l| l.vif.clone()).collect();
            (desired, vifs)
        };
        let current: std::collections::BTreeMap<Ipv6Net, String> = kernel
            .into_iter()
            .filter_map(|r| match (r.dst, r.dev) {
                (Some(n), Some(dev))
                    if vifs.contains(&dev) && !n.network().is_unicast_link_local() =>
                {
                    Some((n, dev))
                }
                _ => None,
            })
            .collect();
        let mut lines = Vec::new();
        for (net, dev) in &current {
            if desired.get(net) != Some(dev) {
                lines.push(format!("route del {net} dev {dev}"));
                report.routes_removed_v6.push(*net);
            }
        }
        for (net, vif) in &desired {
            if current.get(net) != Some(vif) {
                lines.push(format!(
                    "route replace {net} via {ENI_NEXT_HOP_V6} dev {vif}"
                ));
                report.routes_added_v6.push(*net);
            }
        }
        self.vpc.ip_batch(&lines).await?;
        let mut a = self.applied.lock().expect("applied lock");
        for l in a.links.values_mut() {
            l.routes_v6 = l.plan.addresses_v6.clone();
        }
        Ok(())
    }

    /// Puts each primary ENI's first IPv6 address on its node's eth0 (`/128`, as DHCPv6 leases
    /// it), and takes the old one off when it changed: the node's DHCPv6 client following EC2.
    pub(super) async fn apply_eth0_v6(&self) -> Result<(), LabError> {
        /// One eth0 whose IPv6 address changed: ENI, node, link name, old and new address.
        type Change = (String, NetNs, String, Option<Ipv6Addr>, Option<Ipv6Addr>);
        let changes: Vec<Change> = {
            let a = self.applied.lock().expect("applied lock");
            a.links
                .iter()
                .filter(|(_, l)| l.plan.is_primary() && l.plan.primary_v6 != l.eth0_v6)
                .filter_map(|(eni, l)| {
                    let ns = a.nodes.get(&l.plan.instance_id)?.ns.clone();
                    Some((
                        eni.clone(),
                        ns,
                        l.plan.node_ifname(),
                        l.eth0_v6,
                        l.plan.primary_v6,
                    ))
                })
                .collect()
        };
        for (eni, ns, ifname, old, new) in changes {
            let mut lines = Vec::new();
            if let Some(old) = old {
                lines.push(format!("addr del {old}/128 dev {ifname}"));
            }
            if let Some(new) = new {
                lines.push(format!("addr add {new}/128 dev {ifname} nodad"));
            }
            ns.ip_batch(&lines).await?;
            if let Some(l) = self
                .applied
                .lock()
                .expect("applied lock")
                .links
                .get_mut(&eni)
            {
                l.eth0_v6 = new;
            }
        }
        Ok(())
    }
}

impl Lab {
    /// Plumbs an IPv6 pod with address `ip` on node `instance_id` (see [`Pod6`]). The address is
    /// not assigned in mockcloud: that is the caller's choice.
    pub async fn add_pod_v6(&self, instance_id: &str, ip: Ipv6Addr) -> Result<Pod6, LabError> {
        let (node_ns, ns, host_if) = self.pod_namespace(instance_id).await?;
        let host_mac = random_mac();
        node_ns
            .ip_batch(&[
                format!(
                    "link add {host_if} address {host_mac} type veth peer name eth0 address {} netns {}",
                    random_mac(),
                    ns.name()
                ),
                format!("link set {host_if} up"),
                format!("addr add {POD_GATEWAY_V6}/64 dev {host_if} nodad"),
            ])
            .await?;
        ns.ip_batch(&[
            "link set lo up".into(),
            "link set eth0 up".into(),
            format!("addr add {ip}/128 dev eth0 nodad"),
            format!("neigh add {POD_GATEWAY_V6} lladdr {host_mac} dev eth0 nud permanent"),
            format!("route add ::/0 via {POD_GATEWAY_V6} dev eth0"),
        ])
        .await?;
        node_ns
            .ip_batch(&[format!("route add {ip}/128 dev {host_if}")])
            .await?;
        Ok(Pod6 {
            instance_id: instance_id.to_owned(),
            ns,
            ip,
            host_if,
        })
    }

    /// Removes a pod made by [`Lab::add_pod_v6`]: its veth, node route and namespace.
    pub async fn remove_pod_v6(&self, pod: &Pod6) -> Result<(), LabError> {
        self.remove_plumbed(&pod.instance_id, &pod.host_if, &pod.ns)
            .await
    }
}
