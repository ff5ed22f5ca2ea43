//! Pod plumbing over rtnetlink (no `ip` commands): the veth pair, the pod's `/32`, its default route
//! through the link-local gateway, the host route and the policy rules of secondary-ENI IPs.
//!
//! What one attachment looks like once wired:
//!
//! ```text
//! pod netns:   eth0  <ip>/32, default via 169.254.1.1 dev eth0 onlink,
//!                    neighbour 169.254.1.1 lladdr <host veth MAC> PERMANENT
//! host netns:  <prefix><11 hex>  (the veth's other end, created directly in the host netns)
//!              <ip> dev <host veth> scope link              (main table)
//!              rule 512:  to <ip> lookup main                          (every pod IP)
//!              rule 1536: from <ip> iif <host veth> lookup <route_table>  (secondary-ENI IPs only)
//! ```
//!
//! Every pod gets the `to` rule (as the VPC CNI's priority-512 rule), whichever ENI holds its
//! address: it sends traffic to the pod through the main table (its `/32` host route) before any
//! `from` rule of another pod of this node sends it out of an ENI. Without it, a pod on a secondary
//! ENI reaching a pod on eth0 of the same node left by its ENI, crossed the VPC (meeting both ENIs'
//! security groups) and came back through eth0, where a strict `rp_filter` dropped it.
//!
//! The `from` rule names the pod's own host veth, so it belongs to one attachment: a late DEL of an
//! earlier owner of the IP (a retried DEL, a stale cache entry, the daemon unreachable) removes its
//! own rule and never the new owner's. The `to` rule is the same whoever holds the IP; it goes only
//! when the daemon confirms the IP is free, or when nothing of another attachment of the IP is left
//! on the host (no `from` rule of the IP, no `/32` host route of it through a veth). Pods wired by an
//! earlier version (no `to` rule for eth0 pods) are torn down the same way: removing a rule that is
//! not there is not an error.
//!
//! IPv6 (`ip_family` `ipv6` or `dual`) rides on the same veth pair: the pod's `/128`, the gateway
//! `fe80::1` and the `/128` host route, without policy rules (see [`ipv6`]). An IPv6-only pod has
//! none of the IPv4 part above, except, with `ipv4_egress`, its node-local IPv4 for egress: a `/32`
//! from 169.254.172.0/22 with the same gateway and default route and a host route, but no policy
//! rules (see [`egress`]). The IPv4 half itself is in [`ipv4`].
//!
//! The netlink primitives (connections per namespace, messages read back, rules) are the
//! `eniipam-netlink` crate's, shared with the daemon's host routing.

use std::net::{Ipv4Addr, Ipv6Addr};

use eniipam_api::cache::HostVeth;
use eniipam_netlink::{
    MAIN_TABLE, Netlink, NetnsFile, PolicyRule, RuleSelector, TableRoute, parse_mac,
};
use netlink_packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};

mod egress;
mod gateway;
mod ipv4;
mod ipv6;

pub use ipv6::GATEWAY_V6;

/// The pod's gateway: link-local, answered by the host veth through a static neighbour entry.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Priority of `to <pod ip> lookup main` (before any ENI table).
pub const TO_POD_RULE_PRIORITY: u32 = 512;

/// Priority of `from <pod ip> lookup <eni table>`.
pub const FROM_POD_RULE_PRIORITY: u32 = 1536;

pub use eniipam_api::host_veth_name;

/// Why plumbing failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Opening a namespace or a netlink socket, or a netlink request, failed.
    #[error(transparent)]
    Netlink(#[from] eniipam_netlink::Error),
    /// Something is in the way (an interface of that name exists, ...).
    #[error("{0}")]
    Conflict(String),
    /// CHECK found something missing or different.
    #[error("{0}")]
    Mismatch(String),
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetnsError {
    let f = eniipam_netlink::Error::request(what);
    move |source| NetnsError::Netlink(f(source))
}

/// The `to <ip> lookup main` rule of a pod IP.
fn to_rule(ip: Ipv4Addr) -> PolicyRule {
    PolicyRule {
        priority: TO_POD_RULE_PRIORITY,
        selector: RuleSelector::To(ip),
        iif: None,
        table: MAIN_TABLE,
    }
}

/// The `from <ip> iif <host veth> lookup <table>` rule of a secondary-ENI pod IP (`iif` `None`: any
/// such rule, whatever its link).
fn from_rule(ip: Ipv4Addr, host_veth: Option<&str>, route_table: u32) -> PolicyRule {
    PolicyRule {
        priority: FROM_POD_RULE_PRIORITY,
        selector: RuleSelector::From(ip),
        iif: host_veth.map(str::to_owned),
        table: route_table,
    }
}

/// The rules a pod IP on `route_table` needs: the `to` rule always, the `from` rule for secondary
/// ENIs (the primary ENI, table 0, routes through the main table).
fn pod_rules(ip: Ipv4Addr, route_table: u32, host_veth: &str) -> Vec<PolicyRule> {
    if route_table == 0 {
        return vec![to_rule(ip)];
    }
    vec![to_rule(ip), from_rule(ip, Some(host_veth), route_table)]
}

/// What to wire for one attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WiringPlan {
    /// Interface name inside the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// Host veth name ([`host_veth_name`]).
    pub host_veth: String,
    /// The pod's IPv4 (`None` for an IPv6-only pod).
    pub ip: Option<Ipv4Addr>,
    /// The pod's IPv6 (`ip_family` `ipv6` and `dual`).
    pub ipv6: Option<Ipv6Addr>,
    /// An IPv6-only pod's node-local IPv4 for egress (`ipv4_egress`; see [`egress`]).
    pub egress_ipv4: Option<Ipv4Addr>,
    /// Policy-routing table of the IP's ENI (0: primary ENI, only the `to` rule).
    pub route_table: u32,
    /// MTU of both ends.
    pub mtu: u32,
    /// The host veth goes in link group [`eniipam_api::OWN_ENI_EGRESS_LINK_GROUP`]: the pod's egress
    /// leaves by its own ENI, unSNATed (a network profile's strict egress mode).
    pub own_eni_egress: bool,
}

/// What wiring created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wired {
    /// The host end.
    pub host: HostVeth,
    /// MAC of the pod end.
    pub pod_mac: String,
}

/// Fails when the pod already has an interface named `ifname` (the spec requires ADD to refuse).
pub async fn ensure_absent(pod: &Netlink, ifname: &str, ns: &NetnsFile) -> Result<(), NetnsError> {
    match pod.link(ifname).await? {
        Some(_) => Err(NetnsError::Conflict(format!(
            "interface {ifname} already exists in {}",
            ns.path()
        ))),
        None => Ok(()),
    }
}

/// Wires the pod. On error, some of the plan may be in place: call [`unwire`] to clean up.
pub async fn wire(
    host: &Netlink,
    pod: &Netlink,
    pod_ns: &NetnsFile,
    plan: &WiringPlan,
) -> Result<Wired, NetnsError> {
    // A host veth of the same name is a leftover of an earlier sandbox of the same pod.
    if let Some(stale) = host.link(&plan.host_veth).await? {
        if !stale.is_veth() {
            return Err(NetnsError::Conflict(format!(
                "host interface {} exists and is not a veth",
                plan.host_veth
            )));
        }
        host.delete_link(stale.index, &plan.host_veth).await?;
    }

    // Create the pair with its peer directly in the pod netns (no move between namespaces).
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(plan.ifname.clone())
        .mtu(plan.mtu)
        .setns_by_fd(pod_ns.raw_fd())
        .build();
    let mut veth = LinkVeth::new(&plan.host_veth, &plan.ifname).mtu(plan.mtu);
    if plan.own_eni_egress {
        // In the group from its creation: no packet of the pod ever meets the egress mark first.
        veth = veth.link_group(eniipam_api::OWN_ENI_EGRESS_LINK_GROUP);
    }
    let veth = veth
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    host.handle()
        .link()
        .add(veth)
        .execute()
        .await
        .map_err(nl(format!(
            "creating veth {} <-> {}",
            plan.host_veth, plan.ifname
        )))?;

    let host_link = host.link(&plan.host_veth).await?.ok_or_else(|| {
        NetnsError::Conflict(format!(
            "host veth {} vanished after creation",
            plan.host_veth
        ))
    })?;
    let pod_link = pod.link(&plan.ifname).await?.ok_or_else(|| {
        NetnsError::Conflict(format!(
            "pod interface {} vanished after creation",
            plan.ifname
        ))
    })?;
    host.set_up(host_link.index, &plan.host_veth, None).await?;
    pod.set_up(pod_link.index, &plan.ifname, None).await?;

    let host_mac = parse_mac(&host_link.mac).ok_or_else(|| {
        NetnsError::Mismatch(format!("unexpected hardware address {:?}", host_link.mac))
    })?;
    if let Some(ip) = plan.ip {
        ipv4::wire_pod(pod, pod_link.index, &plan.ifname, ip, &host_mac).await?;
    }
    if let Some(ipv6) = plan.ipv6 {
        ipv6::wire_pod(pod, pod_ns, pod_link.index, &plan.ifname, ipv6, &host_mac).await?;
    }
    if let Some(ip) = plan.ip {
        ipv4::wire_host(host, host_link.index, plan, ip).await?;
    }
    if let Some(ipv6) = plan.ipv6 {
        ipv6::wire_host(host, host_link.index, &plan.host_veth, ipv6).await?;
    }
    if let Some(egress) = plan.egress_ipv4 {
        egress::wire(
            pod,
            host,
            (pod_link.index, host_link.index),
            plan,
            egress,
            &host_mac,
        )
        .await?;
    }

    Ok(Wired {
        host: HostVeth {
            name: plan.host_veth.clone(),
            index: host_link.index,
            mac: host_link.mac,
        },
        pod_mac: pod_link.mac,
    })
}

/// What [`unwire`] should remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Teardown {
    /// The pod interface to delete (a veth; deleting it deletes the host end too).
    pub ifname: String,
    /// The pod IP, whose policy rules of this attachment go.
    pub ip: Option<Ipv4Addr>,
    /// The daemon confirmed no other live attachment holds `ip` now: every rule of the IP may go.
    pub ip_free: bool,
    /// The pod's IPv6, whose host route goes with the veth.
    pub ipv6: Option<Ipv6Addr>,
    /// The daemon confirmed no other live attachment holds `ipv6` now: any `/128` route to it left
    /// on the host is stale and goes too (otherwise it may be the new owner's, and stays).
    pub ipv6_free: bool,
    /// The host veth ADD created: deleted only while its name and MAC still match.
    pub host_veth: Option<HostVeth>,
    /// A host veth name to delete unconditionally (cleanup of a failed ADD of our own).
    pub created_host_veth: Option<String>,
}

/// Tears an attachment down, best effort: every step is tried, and the errors are returned. The pod
/// end first ([`unwire_pod`]), then the host side ([`unwire_host`]).
pub async fn unwire(host: &Netlink, pod: Option<&Netlink>, what: &Teardown) -> Vec<NetnsError> {
    let mut errors = match pod {
        Some(pod) => unwire_pod(pod, &what.ifname).await,
        None => Vec::new(),
    };
    errors.extend(unwire_host(host, what).await);
    errors
}

/// Deletes the pod's interface `ifname` when it is a veth (deleting either end deletes the pair, with
/// the host route through it). This is the slow step of a teardown: the kernel waits for RCU grace
/// periods while it unregisters the two devices.
pub async fn unwire_pod(pod: &Netlink, ifname: &str) -> Vec<NetnsError> {
    match pod.link(ifname).await {
        Ok(Some(link)) if link.is_veth() => match pod.delete_link(link.index, ifname).await {
            Ok(()) => Vec::new(),
            Err(e) => vec![e.into()],
        },
        Ok(_) => Vec::new(),
        Err(e) => vec![e.into()],
    }
}

/// The host side of a teardown, once the pod end is gone (or was never reachable): the host veth if it
/// is still there and still ours, then the IP's policy rules this attachment may remove.
pub async fn unwire_host(host: &Netlink, what: &Teardown) -> Vec<NetnsError> {
    let mut errors = Vec::new();
    let mut host_names: Vec<(String, Option<String>)> = Vec::new();
    if let Some(v) = &what.host_veth {
        host_names.push((v.name.clone(), Some(v.mac.clone())));
    }
    if let Some(name) = &what.created_host_veth {
        host_names.push((name.clone(), None));
    }
    // Host veth names that were this attachment's: gone now, or removed here. A veth of the same name
    // with another MAC is a newer sandbox of the same pod: neither it nor its rules are ours.
    let mut ours: Vec<String> = Vec::new();
    for (name, mac) in host_names {
        match host.link(&name).await {
            Ok(Some(link)) if link.is_veth() && mac.as_ref().is_none_or(|m| *m == link.mac) => {
                match host.delete_link(link.index, &name).await {
                    Ok(()) => ours.push(name),
                    Err(e) => errors.push(e.into()),
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => ours.push(name),
            Err(e) => errors.push(e.into()),
        }
    }
    if let Some(ip) = what.ip {
        let mine: Vec<PolicyRule> = ours
            .iter()
            .map(|name| from_rule(ip, Some(name), 0))
            .collect();
        let any_from = from_rule(ip, None, 0);
        let any_to = to_rule(ip);
        let remove = |m: &netlink_packet_route::rule::RuleMessage| {
            mine.iter().any(|r| r.selects_like(m))
                || (what.ip_free && (any_from.same_address_as(m) || any_to.same_address_as(m)))
        };
        if let Err(e) = host.remove_rules(remove, &format!("rules of {ip}")).await {
            errors.push(e.into());
        }
        // The `to` rule is everyone's: it goes once no other attachment of the IP is left (no
        // `from` rule, no host route: an eth0 pod has only the route).
        if !what.ip_free {
            match ip_still_wired(host, ip, &any_from).await {
                Ok(false) => {
                    if let Err(e) = host
                        .remove_rules(|m| any_to.same_address_as(m), &format!("to-rule of {ip}"))
                        .await
                    {
                        errors.push(e.into());
                    }
                }
                Ok(true) => {}
                Err(e) => errors.push(e),
            }
        }
    }
    if let Some(ipv6) = what.ipv6
        && what.ipv6_free
        && let Err(e) = ipv6::remove_host_routes(host, ipv6).await
    {
        errors.push(e);
    }
    errors
}

/// Whether another attachment of `ip` is still wired on the host: a `from` rule of the IP, or its
/// `/32` route in the main table (through that attachment's veth; ours went with our veth).
async fn ip_still_wired(
    host: &Netlink,
    ip: Ipv4Addr,
    any_from: &PolicyRule,
) -> Result<bool, NetnsError> {
    let rules = host.rules_v4().await?;
    if rules.iter().any(|m| any_from.same_address_as(m)) {
        return Ok(true);
    }
    let routes = host.routes_v4().await?;
    Ok(routes.iter().filter_map(TableRoute::of).any(|r| {
        r.table == MAIN_TABLE && r.destination == ipnet::Ipv4Net::from(ip) && r.oif.is_some()
    }))
}

/// Verifies that everything [`wire`] set up is still there (CHECK).
pub async fn check(
    host: &Netlink,
    pod: &Netlink,
    plan: &WiringPlan,
    expected_host_mac: Option<&str>,
) -> Result<(), NetnsError> {
    let missing = |what: String| NetnsError::Mismatch(what);
    let host_link = host
        .link(&plan.host_veth)
        .await?
        .ok_or_else(|| missing(format!("host veth {} is missing", plan.host_veth)))?;
    if let Some(mac) = expected_host_mac
        && mac != host_link.mac
    {
        return Err(missing(format!(
            "host veth {} has MAC {}, ADD created {mac}",
            plan.host_veth, host_link.mac
        )));
    }
    let pod_link = pod
        .link(&plan.ifname)
        .await?
        .ok_or_else(|| missing(format!("pod interface {} is missing", plan.ifname)))?;

    if let Some(ip) = plan.ip {
        ipv4::check(
            host,
            pod,
            (pod_link.index, &plan.ifname),
            (host_link.index, &plan.host_veth, &host_link.mac),
            ip,
            plan.route_table,
        )
        .await?;
    }
    if let Some(ipv6) = plan.ipv6 {
        ipv6::check(
            host,
            pod,
            (pod_link.index, &plan.ifname),
            (host_link.index, &plan.host_veth, &host_link.mac),
            ipv6,
        )
        .await?;
    }
    if let Some(egress) = plan.egress_ipv4 {
        egress::check(
            host,
            pod,
            (pod_link.index, &plan.ifname),
            (host_link.index, &plan.host_veth, &host_link.mac),
            egress,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eniipam_api::{AttachmentKey, PodRef};
    use eniipam_netlink::format_mac;
    use sha1::{Digest, Sha1};

    #[test]
    fn host_veth_names_fit_and_are_stable() {
        let pod = PodRef {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: "u".into(),
        };
        let key = AttachmentKey::new("c1", "eth0");
        let a = host_veth_name("eni", Some(&pod), &key);
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("eni"));
        assert!(a[3..].bytes().all(|b| b.is_ascii_hexdigit()));
        // Same pod, new sandbox: same name (so a stale veth is found and replaced).
        assert_eq!(
            a,
            host_veth_name("eni", Some(&pod), &AttachmentKey::new("c2", "eth0"))
        );
        // Another interface of the same pod: another name.
        assert_ne!(
            a,
            host_veth_name("eni", Some(&pod), &AttachmentKey::new("c1", "net1"))
        );
        // Four-character prefixes still fit IFNAMSIZ.
        assert_eq!(host_veth_name("abcd", None, &key).len(), 15);
        // sha1("default/web-0")
        let digest = Sha1::digest(b"default/web-0");
        assert_eq!(&a[3..], &format_mac(&digest).replace(':', "")[..11]);
    }

    #[test]
    fn every_pod_gets_the_to_rule_and_secondary_enis_the_from_rule() {
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        let eth0 = pod_rules(ip, 0, "eni0123");
        assert_eq!(eth0.len(), 1, "eth0: the `to` rule only");
        assert_eq!(eth0[0].to_string(), "512: to 10.0.0.5 lookup 254");
        let rules = pod_rules(ip, 3, "eni0123");
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].to_string(), "512: to 10.0.0.5 lookup 254");
        assert_eq!(
            rules[1].to_string(),
            "1536: from 10.0.0.5 iif eni0123 lookup 3"
        );
    }
}
