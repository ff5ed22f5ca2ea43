//! The IPv6 half of a pod's wiring (`ip_family` `ipv6` and `dual`), on the same veth pair as IPv4:
//!
//! ```text
//! pod netns:   eth0  <ipv6>/128 nodad, default via fe80::1 dev eth0,
//!                    neighbour fe80::1 lladdr <host veth MAC> PERMANENT
//! host netns:  <host veth>  fe80::1/64 nodad
//!              <ipv6> dev <host veth>                          (main table)
//! ```
//!
//! No policy rules and no per-ENI table: the node's `/80` is delegated to the primary ENI, so the
//! main table's default route (out of eth0) is already the right way out for every pod address, and
//! the `/128` host route brings replies and pod-to-pod traffic back to the pod's veth.
//!
//! `fe80::1` is the same on every host veth, as `169.254.1.1` is for IPv4: a link-local address is
//! only meaningful with its interface, so the pods never see each other's gateway. Both addresses are
//! added `nodad`: duplicate address detection would hold them tentative for about a second (the pod's
//! first packets would leave without a usable source), and there is nothing to collide with on a
//! point-to-point veth whose addresses the daemon hands out once.

use std::net::{IpAddr, Ipv6Addr};

use eniipam_netlink::{MAIN_TABLE, Netlink, NetnsFile, TableRoute6, write_sysctl};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use rtnetlink::RouteMessageBuilder;

use super::{NetnsError, gateway, nl};

/// The pod's IPv6 gateway: link-local on the host veth, answered through a static neighbour entry.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Sysctls of the pod's interface (`{if}` is its name):
/// - `disable_ipv6=0`: a runtime may create sandboxes with IPv6 disabled (Docker does for networks
///   without IPv6), and then the kernel refuses the address;
/// - `accept_dad=0`: no DAD for any address of the interface, including the kernel's own link-local;
/// - `accept_ra=0`: the pod's routes are the ones the plugin sets; nothing on a veth sends router
///   advertisements, and none should be obeyed if something did.
const POD_SYSCTLS: [(&str, &str); 3] = [
    ("net.ipv6.conf.{if}.disable_ipv6", "0"),
    ("net.ipv6.conf.{if}.accept_dad", "0"),
    ("net.ipv6.conf.{if}.accept_ra", "0"),
];

/// Sysctls of the host veth:
/// - `disable_ipv6=0` and `accept_dad=0` as on the pod side;
/// - `accept_ra=0`: a pod must not be able to give the node routes with a forged router
///   advertisement (with `all.forwarding=1` the kernel already ignores RAs at the default `1`; this
///   holds whatever the node's setting);
/// - `forwarding=1`: the host veth acts as a router toward the pod (neighbour advertisements carry
///   the router flag, redirects are not obeyed). Forwarding between interfaces is the host-wide
///   `net.ipv6.conf.all.forwarding`, which eniipamd sets, not the plugin: one switch for the whole
///   node belongs to the daemon that owns the node's routing.
const HOST_SYSCTLS: [(&str, &str); 4] = [
    ("net.ipv6.conf.{if}.disable_ipv6", "0"),
    ("net.ipv6.conf.{if}.accept_dad", "0"),
    ("net.ipv6.conf.{if}.accept_ra", "0"),
    ("net.ipv6.conf.{if}.forwarding", "1"),
];

fn sysctls(ns: Option<&NetnsFile>, ifname: &str, list: &[(&str, &str)]) -> Result<(), NetnsError> {
    for (key, value) in list {
        write_sysctl(ns, key, ifname, value)?;
    }
    Ok(())
}

/// Adds `addr/len` with `nodad` to link `index`.
async fn add_nodad(
    nl_conn: &Netlink,
    index: u32,
    addr: Ipv6Addr,
    len: u8,
    on: &str,
) -> Result<(), NetnsError> {
    let mut req = nl_conn
        .handle()
        .address()
        .add(index, IpAddr::V6(addr), len)
        .replace();
    let msg = req.message_mut();
    msg.header.flags |= AddressHeaderFlags::Nodad;
    msg.attributes
        .push(AddressAttribute::Flags(AddressFlags::Nodad));
    req.execute()
        .await
        .map_err(nl(format!("adding {addr}/{len} nodad to {on}")))
}

/// The pod side: sysctls, the `/128`, the gateway's permanent neighbour, the default route.
pub(super) async fn wire_pod(
    pod: &Netlink,
    pod_ns: &NetnsFile,
    pod_index: u32,
    ifname: &str,
    ipv6: Ipv6Addr,
    host_mac: &[u8],
) -> Result<(), NetnsError> {
    sysctls(Some(pod_ns), ifname, &POD_SYSCTLS)?;
    add_nodad(pod, pod_index, ipv6, 128, ifname).await?;
    gateway::add_neighbour(pod, (pod_index, ifname), IpAddr::V6(GATEWAY_V6), host_mac).await?;
    let default = RouteMessageBuilder::<Ipv6Addr>::new()
        .destination_prefix(Ipv6Addr::UNSPECIFIED, 0)
        .gateway(GATEWAY_V6)
        .output_interface(pod_index)
        .build();
    pod.replace_route(default, &format!("default via {GATEWAY_V6} dev {ifname}"))
        .await?;
    Ok(())
}

/// The host side: sysctls, `fe80::1/64` on the host veth, the `/128` host route in the main table.
pub(super) async fn wire_host(
    host: &Netlink,
    host_index: u32,
    host_veth: &str,
    ipv6: Ipv6Addr,
) -> Result<(), NetnsError> {
    sysctls(None, host_veth, &HOST_SYSCTLS)?;
    add_nodad(host, host_index, GATEWAY_V6, 64, host_veth).await?;
    let to_pod = RouteMessageBuilder::<Ipv6Addr>::new()
        .destination_prefix(ipv6, 128)
        .output_interface(host_index)
        .build();
    host.replace_route(to_pod, &format!("{ipv6}/128 dev {host_veth}"))
        .await?;
    Ok(())
}

/// Removes every main-table route to `ipv6/128` left on the host: called once the daemon confirmed no
/// live attachment holds the address (this attachment's own route went with its veth; one still
/// there is stale, or the route of the new owner when the daemon says the address is held by
/// another, which is why this is never called then).
pub(super) async fn remove_host_routes(host: &Netlink, ipv6: Ipv6Addr) -> Result<(), NetnsError> {
    for route in host.routes_v6().await? {
        let is_ours = TableRoute6::of(&route).is_some_and(|r| {
            r.table == MAIN_TABLE
                && r.destination.prefix_len() == 128
                && r.destination.addr() == ipv6
        });
        if is_ours {
            host.delete_route(route, &format!("{ipv6}/128")).await?;
        }
    }
    Ok(())
}

/// CHECK's IPv6 part: the pod's `/128`, its default route and gateway neighbour, the host route.
pub(super) async fn check(
    host: &Netlink,
    pod: &Netlink,
    (pod_index, ifname): (u32, &str),
    (host_index, host_veth, host_mac): (u32, &str, &str),
    ipv6: Ipv6Addr,
) -> Result<(), NetnsError> {
    let missing = NetnsError::Mismatch;
    let has_addr = pod.addresses(pod_index).await?.iter().any(|a| {
        a.header.prefix_len == 128
            && a.attributes.iter().any(
                |attr| matches!(attr, AddressAttribute::Address(IpAddr::V6(ip)) if *ip == ipv6),
            )
    });
    if !has_addr {
        return Err(missing(format!(
            "{ipv6}/128 is not on pod interface {ifname}"
        )));
    }
    let has_default = pod
        .routes_v6()
        .await?
        .iter()
        .filter_map(TableRoute6::of)
        .any(|r| {
            r.table == MAIN_TABLE
                && r.destination.prefix_len() == 0
                && r.gateway == Some(GATEWAY_V6)
                && r.oif == Some(pod_index)
        });
    if !has_default {
        return Err(missing(format!(
            "pod default route via {GATEWAY_V6} dev {ifname} is missing"
        )));
    }
    gateway::check_neighbour(pod, pod_index, IpAddr::V6(GATEWAY_V6), host_mac).await?;
    let has_host_route = host
        .routes_v6()
        .await?
        .iter()
        .filter_map(TableRoute6::of)
        .any(|r| {
            r.table == MAIN_TABLE
                && r.destination.prefix_len() == 128
                && r.destination.addr() == ipv6
                && r.oif == Some(host_index)
        });
    if !has_host_route {
        return Err(missing(format!(
            "host route {ipv6}/128 dev {host_veth} is missing"
        )));
    }
    Ok(())
}
