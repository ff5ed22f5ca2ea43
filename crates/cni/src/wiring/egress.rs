//! An IPv6-only pod's IPv4 egress (`ip_family = ipv6` with `ipv4_egress`): its node-local address
//! from 169.254.172.0/22, wired as an IPv4 pod address is, on the same veth:
//!
//! ```text
//! pod netns:   eth0  <egress>/32, default via 169.254.1.1 dev eth0 onlink,
//!                    neighbour 169.254.1.1 lladdr <host veth MAC> PERMANENT
//! host netns:  <egress> dev <host veth> scope link              (main table)
//! ```
//!
//! No policy rules: an IPv6-only node has no secondary ENI, so the main table's default route (out
//! of the primary interface, where the daemon's `pod-snat` chain translates the address to the
//! node's primary IPv4) is the way out, and the `/32` host route brings the replies back. Nothing
//! extra is torn down: the host route goes with the veth, the address with the daemon's release.
//!
//! The address is not in the CNI result's `ips`: containerd reports every address there to the
//! kubelet as a pod IP, and a 169.254 address that means nothing beyond the node would then show
//! as the IPv4 pod IP in Kubernetes. CHECK gets it from the daemon instead.

use std::net::Ipv4Addr;

use eniipam_netlink::Netlink;

use super::{NetnsError, WiringPlan, ipv4};

/// The egress address inside the pod (its `/32`, gateway neighbour, IPv4 default route) and its
/// host route.
pub(super) async fn wire(
    pod: &Netlink,
    host: &Netlink,
    (pod_index, host_index): (u32, u32),
    plan: &WiringPlan,
    egress: Ipv4Addr,
    host_mac: &[u8],
) -> Result<(), NetnsError> {
    ipv4::wire_pod(pod, pod_index, &plan.ifname, egress, host_mac).await?;
    ipv4::add_host_route(host, (host_index, &plan.host_veth), egress).await
}

/// CHECK's egress part: what [`wire`] set up.
pub(super) async fn check(
    host: &Netlink,
    pod: &Netlink,
    (pod_index, ifname): (u32, &str),
    (host_index, host_veth, host_mac): (u32, &str, &str),
    egress: Ipv4Addr,
) -> Result<(), NetnsError> {
    ipv4::check_pod(pod, (pod_index, ifname), host_mac, egress).await?;
    ipv4::check_host_route(host, (host_index, host_veth), egress).await
}
