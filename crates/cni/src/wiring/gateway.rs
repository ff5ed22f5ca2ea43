//! The pod's gateway neighbour, the same for both families: `169.254.1.1` (IPv4) and `fe80::1`
//! (IPv6) resolve to the host veth's MAC through a permanent neighbour entry in the pod, so the pod
//! never sends ARP or neighbour solicitations for a gateway no one answers for.

use std::net::IpAddr;

use eniipam_netlink::{Netlink, format_mac};
use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};

use super::{NetnsError, nl};

/// Adds (or replaces) the permanent neighbour `gateway` → `host_mac` on the pod's `ifname`.
pub(super) async fn add_neighbour(
    pod: &Netlink,
    (pod_index, ifname): (u32, &str),
    gateway: IpAddr,
    host_mac: &[u8],
) -> Result<(), NetnsError> {
    pod.handle()
        .neighbours()
        .add(pod_index, gateway)
        .link_layer_address(host_mac)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("adding neighbour {gateway} on {ifname}")))
}

/// CHECK: the pod's interface has the permanent neighbour `gateway` → `host_mac`.
pub(super) async fn check_neighbour(
    pod: &Netlink,
    pod_index: u32,
    gateway: IpAddr,
    host_mac: &str,
) -> Result<(), NetnsError> {
    let family = match gateway {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    let neighbours: Vec<_> = pod
        .handle()
        .neighbours()
        .get()
        .set_address_family(family)
        .execute()
        .try_collect()
        .await
        .map_err(nl(format!("listing pod neighbours ({gateway})")))?;
    let is_gateway = |a: &NeighbourAddress| match (a, gateway) {
        (NeighbourAddress::Inet(ip), IpAddr::V4(g)) => *ip == g,
        (NeighbourAddress::Inet6(ip), IpAddr::V6(g)) => *ip == g,
        _ => false,
    };
    let found = neighbours.iter().any(|n| {
        n.header.ifindex == pod_index
            && n.header.state == NeighbourState::Permanent
            && n.attributes
                .iter()
                .any(|a| matches!(a, NeighbourAttribute::Destination(d) if is_gateway(d)))
            && n.attributes.iter().any(|a| {
                matches!(a, NeighbourAttribute::LinkLayerAddress(mac) if format_mac(mac) == host_mac)
            })
    });
    if found {
        Ok(())
    } else {
        Err(NetnsError::Mismatch(format!(
            "pod neighbour {gateway} -> {host_mac} (permanent) is missing"
        )))
    }
}
