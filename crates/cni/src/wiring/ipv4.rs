//! The IPv4 half of a pod's wiring (`ip_family` `ipv4` and `dual`), and the pieces of it an
//! IPv6-only pod's egress address reuses ([`super::egress`]):
//!
//! ```text
//! pod netns:   eth0  <ip>/32, default via 169.254.1.1 dev eth0 onlink,
//!                    neighbour 169.254.1.1 lladdr <host veth MAC> PERMANENT
//! host netns:  <ip> dev <host veth> scope link                  (main table)
//!              the policy rules of the pod IP (see the parent module)
//! ```

use std::net::{IpAddr, Ipv4Addr};

use eniipam_netlink::{MAIN_TABLE, Netlink, TableRoute};
use netlink_packet_route::route::RouteScope;
use rtnetlink::RouteMessageBuilder;

use super::{GATEWAY, NetnsError, WiringPlan, from_rule, gateway, nl, pod_rules, to_rule};

/// The IPv4 half inside the pod: the /32, the static neighbour for the gateway, the default route.
pub(super) async fn wire_pod(
    pod: &Netlink,
    pod_index: u32,
    ifname: &str,
    ip: Ipv4Addr,
    host_mac: &[u8],
) -> Result<(), NetnsError> {
    // Inside the pod: the /32, the static neighbour for the gateway, the default route.
    pod.handle()
        .address()
        .add(pod_index, IpAddr::V4(ip), 32)
        .execute()
        .await
        .map_err(nl(format!("adding {}/32 to {}", ip, ifname)))?;
    gateway::add_neighbour(pod, (pod_index, ifname), IpAddr::V4(GATEWAY), host_mac).await?;
    let default = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
        .gateway(GATEWAY)
        .output_interface(pod_index)
        .onlink()
        .build();
    pod.handle()
        .route()
        .add(default)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("adding default route via {GATEWAY}")))?;
    Ok(())
}

/// The host's `/32` route to `ip` through the pod's host veth (main table, scope link).
pub(super) async fn add_host_route(
    host: &Netlink,
    (host_index, host_veth): (u32, &str),
    ip: Ipv4Addr,
) -> Result<(), NetnsError> {
    let to_pod = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(ip, 32)
        .output_interface(host_index)
        .scope(RouteScope::Link)
        .build();
    host.handle()
        .route()
        .add(to_pod)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("adding host route {ip}/32 dev {host_veth}")))
}

/// The IPv4 half on the host: the /32 route to the veth, the `to` rule and, for secondary ENIs, the
/// `from` rule.
pub(super) async fn wire_host(
    host: &Netlink,
    host_index: u32,
    plan: &WiringPlan,
    ip: Ipv4Addr,
) -> Result<(), NetnsError> {
    // On the host: the /32 route to the veth, the `to` rule and, for secondary ENIs, the `from` rule.
    add_host_route(host, (host_index, &plan.host_veth), ip).await?;
    // The daemon gave this pod the IP, so any other rule of ours for it is stale (left by an earlier
    // owner whose DEL could not remove it, or from an ENI at another device index): replace them.
    let wanted = pod_rules(ip, plan.route_table, &plan.host_veth);
    let any_from = from_rule(ip, None, 0);
    let any_to = to_rule(ip);
    host.remove_rules(
        |m| {
            (any_from.same_address_as(m) || any_to.same_address_as(m))
                && !wanted.iter().any(|r| r.matches(m))
        },
        &format!("stale rules of {}", ip),
    )
    .await?;
    for rule in &wanted {
        host.add_rule(rule).await?;
    }
    Ok(())
}

/// CHECK's IPv4 part: the pod's `/32`, default route and gateway neighbour, the host route, the rules.
pub(super) async fn check(
    host: &Netlink,
    pod: &Netlink,
    (pod_index, ifname): (u32, &str),
    (host_index, host_veth, host_mac): (u32, &str, &str),
    ip: Ipv4Addr,
    route_table: u32,
) -> Result<(), NetnsError> {
    check_pod(pod, (pod_index, ifname), host_mac, ip).await?;
    check_host_route(host, (host_index, host_veth), ip).await?;
    let rules = host.rules_v4().await?;
    for rule in pod_rules(ip, route_table, host_veth) {
        let present = rules.iter().any(|r| rule.matches(r));
        if !present {
            return Err(NetnsError::Mismatch(format!("host rule {rule} is missing")));
        }
    }
    Ok(())
}

/// The pod's `/32` on `ifname`, its default route via the gateway and the gateway's permanent
/// neighbour (the host veth's MAC).
pub(super) async fn check_pod(
    pod: &Netlink,
    (pod_index, ifname): (u32, &str),
    host_mac: &str,
    ip: Ipv4Addr,
) -> Result<(), NetnsError> {
    let missing = NetnsError::Mismatch;
    let addrs = pod.addresses(pod_index).await?;
    let has_addr = addrs.iter().any(|a| {
        a.header.prefix_len == 32
            && a.attributes.iter().any(|attr| {
                matches!(attr, netlink_packet_route::address::AddressAttribute::Address(IpAddr::V4(a)) if *a == ip)
            })
    });
    if !has_addr {
        return Err(missing(format!(
            "{}/32 is not on pod interface {}",
            ip, ifname
        )));
    }

    let pod_routes = pod.routes_v4().await?;
    let has_default = pod_routes.iter().filter_map(TableRoute::of).any(|r| {
        r.table == MAIN_TABLE
            && r.destination.prefix_len() == 0
            && r.gateway == Some(GATEWAY)
            && r.oif == Some(pod_index)
    });
    if !has_default {
        return Err(missing(format!(
            "pod default route via {GATEWAY} dev {} is missing",
            ifname
        )));
    }

    gateway::check_neighbour(pod, pod_index, IpAddr::V4(GATEWAY), host_mac).await
}

/// The host's `/32` route to `ip` through the pod's host veth (main table).
pub(super) async fn check_host_route(
    host: &Netlink,
    (host_index, host_veth): (u32, &str),
    ip: Ipv4Addr,
) -> Result<(), NetnsError> {
    let missing = NetnsError::Mismatch;
    let host_routes = host.routes_v4().await?;
    let has_host_route = host_routes.iter().filter_map(TableRoute::of).any(|r| {
        r.table == MAIN_TABLE
            && r.destination == ipnet::Ipv4Net::from(ip)
            && r.oif == Some(host_index)
    });
    if !has_host_route {
        return Err(missing(format!(
            "host route {}/32 dev {} is missing",
            ip, host_veth
        )));
    }

    Ok(())
}
