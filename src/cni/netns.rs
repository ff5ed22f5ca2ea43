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
//!              rule 512:  to <ip> lookup main               (only for secondary-ENI IPs)
//!              rule 1536: from <ip> lookup <route_table>    (only for secondary-ENI IPs)
//! ```
//!
//! Netlink sockets are bound to the network namespace they are created in, so a socket for the pod
//! is opened after `setns(2)` into the pod's namespace and the thread switches straight back
//! ([`Netlink::in_netns`]). `nix` wraps `setns` safely, so this module needs no `unsafe`.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use nix::sched::CloneFlags;
use rtnetlink::{Handle, IpVersion, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha1::{Digest, Sha1};

use super::cache::HostVeth;
use crate::model::{AttachmentKey, PodRef};

/// The pod's gateway: link-local, answered by the host veth through a static neighbour entry.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Priority of `to <pod ip> lookup main` (before any ENI table).
pub const TO_POD_RULE_PRIORITY: u32 = 512;

/// Priority of `from <pod ip> lookup <eni table>`.
pub const FROM_POD_RULE_PRIORITY: u32 = 1536;

/// The main routing table.
pub const MAIN_TABLE: u32 = 254;

const ENODEV: i32 = 19;
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ESRCH: i32 = 3;

/// The host veth name: `prefix` + the first 11 hex digits of SHA-1 over `namespace/name` (plus
/// `/ifname` for interfaces other than `eth0`, so a pod with several eniipam interfaces gets distinct
/// names). Without a pod identity the container id stands in for `namespace/name`. At most 15 bytes
/// for prefixes of up to 4.
pub fn host_veth_name(prefix: &str, pod: Option<&PodRef>, key: &AttachmentKey) -> String {
    let mut seed = match pod {
        Some(pod) => pod.sticky_key(),
        None => key.container_id.clone(),
    };
    if key.ifname != "eth0" {
        seed.push('/');
        seed.push_str(&key.ifname);
    }
    let digest = Sha1::digest(seed.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{}", &hex[..11])
}

/// Why plumbing failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The netns path could not be opened.
    #[error("network namespace {path}: {source}")]
    Open {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Switching namespaces or opening a netlink socket failed.
    #[error("netlink socket in {path}: {reason}")]
    Socket {
        /// The namespace path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A netlink request failed.
    #[error("{what}: {source}")]
    Netlink {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: rtnetlink::Error,
    },
    /// Something is in the way (an interface of that name exists, ...).
    #[error("{0}")]
    Conflict(String),
    /// CHECK found something missing or different.
    #[error("{0}")]
    Mismatch(String),
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetnsError {
    let what = what.into();
    move |source| NetnsError::Netlink { what, source }
}

/// The errno of a netlink error reply, if it is one.
pub(crate) fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => Some(msg.raw_code().abs()),
        _ => None,
    }
}

/// The kernel says the object (link, route, address, netns) is not there.
pub(crate) fn is_not_found(err: &rtnetlink::Error) -> bool {
    matches!(errno(err), Some(ENODEV | ENOENT | ESRCH))
}

/// The kernel says the object already exists.
pub(crate) fn is_exists(err: &rtnetlink::Error) -> bool {
    errno(err) == Some(EEXIST)
}

/// Formats a hardware address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An open network namespace (the file keeps it alive while we work in it).
#[derive(Debug)]
pub struct NetnsFile {
    path: String,
    file: File,
}

impl NetnsFile {
    /// Opens the namespace at `path` (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub fn open(path: &str) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// A netlink connection bound to one network namespace.
#[derive(Debug)]
pub struct Netlink {
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Facts about one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkFacts {
    /// Interface index.
    pub index: u32,
    /// Hardware address.
    pub mac: String,
    /// Whether it is a veth.
    pub is_veth: bool,
}

impl Netlink {
    /// A connection in the calling thread's current namespace (the host's, for the plugin).
    pub fn current() -> Result<Self, NetnsError> {
        Self::spawn("the current namespace")
    }

    fn spawn(path: &str) -> Result<Self, NetnsError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| NetnsError::Socket {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            handle,
            task: tokio::spawn(conn),
        })
    }

    /// A connection inside `ns`: enter it, open the socket, and return to the original namespace
    /// before anything else runs on this thread.
    pub fn in_netns(ns: &NetnsFile) -> Result<Self, NetnsError> {
        let fail = |reason: String| NetnsError::Socket {
            path: ns.path.clone(),
            reason,
        };
        let original = File::open("/proc/thread-self/ns/net")
            .map_err(|e| fail(format!("opening this thread's netns: {e}")))?;
        nix::sched::setns(&ns.file, CloneFlags::CLONE_NEWNET)
            .map_err(|e| fail(format!("setns: {e}")))?;
        let conn = Self::spawn(&ns.path);
        nix::sched::setns(&original, CloneFlags::CLONE_NEWNET)
            .map_err(|e| fail(format!("returning to the original netns: {e}")))?;
        conn
    }

    /// The link named `name`, if any.
    pub async fn link(&self, name: &str) -> Result<Option<LinkFacts>, NetnsError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(link_facts(&msg))),
            Ok(None) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(nl(format!("looking up link {name}"))(e)),
        }
    }

    async fn set_up(&self, index: u32, name: &str) -> Result<(), NetnsError> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(nl(format!("setting {name} up")))
    }

    async fn delete_link(&self, index: u32, name: &str) -> Result<(), NetnsError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(nl(format!("deleting link {name}"))(e)),
        }
    }

    async fn routes_v4(&self) -> Result<Vec<RouteMessage>, NetnsError> {
        self.handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing routes"))
    }

    async fn rules_v4(&self) -> Result<Vec<RuleMessage>, NetnsError> {
        self.handle
            .rule()
            .get(IpVersion::V4)
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing rules"))
    }

    async fn add_rule(&self, rule: PodRule) -> Result<(), NetnsError> {
        let req = self
            .handle
            .rule()
            .add()
            .v4()
            .table_id(rule.table)
            .priority(rule.priority)
            .action(RuleAction::ToTable);
        let req = match rule.direction {
            RuleDirection::From => req.source_prefix(rule.ip, 32),
            RuleDirection::To => req.destination_prefix(rule.ip, 32),
        };
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_exists(&e) => Ok(()),
            Err(e) => Err(nl(format!("adding rule {rule}"))(e)),
        }
    }
}

fn link_facts(msg: &LinkMessage) -> LinkFacts {
    let mut facts = LinkFacts {
        index: msg.header.index,
        mac: String::new(),
        is_veth: false,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::Address(bytes) => facts.mac = format_mac(bytes),
            LinkAttribute::LinkInfo(infos) => {
                facts.is_veth = infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth)));
            }
            _ => {}
        }
    }
    facts
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RuleDirection {
    From,
    To,
}

/// One policy rule of a pod IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PodRule {
    direction: RuleDirection,
    ip: Ipv4Addr,
    table: u32,
    priority: u32,
}

impl std::fmt::Display for PodRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = match self.direction {
            RuleDirection::From => "from",
            RuleDirection::To => "to",
        };
        write!(
            f,
            "{}: {dir} {} lookup {}",
            self.priority, self.ip, self.table
        )
    }
}

/// The rules a pod IP on `route_table` needs (none for the primary ENI, table 0).
fn pod_rules(ip: Ipv4Addr, route_table: u32) -> Vec<PodRule> {
    if route_table == 0 {
        return Vec::new();
    }
    vec![
        PodRule {
            direction: RuleDirection::To,
            ip,
            table: MAIN_TABLE,
            priority: TO_POD_RULE_PRIORITY,
        },
        PodRule {
            direction: RuleDirection::From,
            ip,
            table: route_table,
            priority: FROM_POD_RULE_PRIORITY,
        },
    ]
}

fn rule_matches(msg: &RuleMessage, ip: Ipv4Addr, direction: RuleDirection, priority: u32) -> bool {
    let mut prio = None;
    let mut addr = None;
    for attr in &msg.attributes {
        match (attr, direction) {
            (RuleAttribute::Priority(p), _) => prio = Some(*p),
            (RuleAttribute::Source(a), RuleDirection::From) if msg.header.src_len == 32 => {
                addr = Some(*a)
            }
            (RuleAttribute::Destination(a), RuleDirection::To) if msg.header.dst_len == 32 => {
                addr = Some(*a)
            }
            _ => {}
        }
    }
    prio == Some(priority) && addr == Some(IpAddr::V4(ip))
}

fn rule_table(msg: &RuleMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

fn route_table(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

fn route_oif(msg: &RouteMessage) -> Option<u32> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })
}

fn route_dst(msg: &RouteMessage) -> Option<(Ipv4Addr, u8)> {
    let len = msg.header.destination_prefix_length;
    if len == 0 {
        return Some((Ipv4Addr::UNSPECIFIED, 0));
    }
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some((*ip, len)),
        _ => None,
    })
}

fn route_gateway(msg: &RouteMessage) -> Option<Ipv4Addr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })
}

/// What to wire for one attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WiringPlan {
    /// Interface name inside the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// Host veth name ([`host_veth_name`]).
    pub host_veth: String,
    /// The pod's IP.
    pub ip: Ipv4Addr,
    /// Policy-routing table of the IP's ENI (0: primary ENI, no rules).
    pub route_table: u32,
    /// MTU of both ends.
    pub mtu: u32,
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
            ns.path
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
        if !stale.is_veth {
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
        .setns_by_fd(pod_ns.file.as_raw_fd())
        .build();
    let veth = LinkVeth::new(&plan.host_veth, &plan.ifname)
        .mtu(plan.mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    host.handle
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
    host.set_up(host_link.index, &plan.host_veth).await?;
    pod.set_up(pod_link.index, &plan.ifname).await?;

    // Inside the pod: the /32, the static neighbour for the gateway, the default route.
    pod.handle
        .address()
        .add(pod_link.index, IpAddr::V4(plan.ip), 32)
        .execute()
        .await
        .map_err(nl(format!("adding {}/32 to {}", plan.ip, plan.ifname)))?;
    let host_mac = parse_mac(&host_link.mac)?;
    pod.handle
        .neighbours()
        .add(pod_link.index, IpAddr::V4(GATEWAY))
        .link_layer_address(&host_mac)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("adding neighbour {GATEWAY} on {}", plan.ifname)))?;
    let default = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
        .gateway(GATEWAY)
        .output_interface(pod_link.index)
        .onlink()
        .build();
    pod.handle
        .route()
        .add(default)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("adding default route via {GATEWAY}")))?;

    // On the host: the /32 route to the veth and, for secondary ENIs, the policy rules.
    let to_pod = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(plan.ip, 32)
        .output_interface(host_link.index)
        .scope(RouteScope::Link)
        .build();
    host.handle
        .route()
        .add(to_pod)
        .replace()
        .execute()
        .await
        .map_err(nl(format!(
            "adding host route {}/32 dev {}",
            plan.ip, plan.host_veth
        )))?;
    for rule in pod_rules(plan.ip, plan.route_table) {
        host.add_rule(rule).await?;
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

fn parse_mac(mac: &str) -> Result<Vec<u8>, NetnsError> {
    mac.split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|b| b.len() == 6)
        .ok_or_else(|| NetnsError::Mismatch(format!("unexpected hardware address {mac:?}")))
}

/// What [`unwire`] should remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Teardown {
    /// The pod interface to delete (a veth; deleting it deletes the host end too).
    pub ifname: String,
    /// The pod IP, whose policy rules go.
    pub ip: Option<Ipv4Addr>,
    /// The host veth ADD created: deleted only while its name and MAC still match.
    pub host_veth: Option<HostVeth>,
    /// A host veth name to delete unconditionally (cleanup of a failed ADD of our own).
    pub created_host_veth: Option<String>,
}

/// Tears an attachment down, best effort: every step is tried, and the errors are returned.
pub async fn unwire(host: &Netlink, pod: Option<&Netlink>, what: &Teardown) -> Vec<NetnsError> {
    let mut errors = Vec::new();
    if let Some(pod) = pod {
        match pod.link(&what.ifname).await {
            Ok(Some(link)) if link.is_veth => {
                if let Err(e) = pod.delete_link(link.index, &what.ifname).await {
                    errors.push(e);
                }
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    let mut host_names: Vec<(String, Option<String>)> = Vec::new();
    if let Some(v) = &what.host_veth {
        host_names.push((v.name.clone(), Some(v.mac.clone())));
    }
    if let Some(name) = &what.created_host_veth {
        host_names.push((name.clone(), None));
    }
    for (name, mac) in host_names {
        match host.link(&name).await {
            Ok(Some(link)) if link.is_veth && mac.as_ref().is_none_or(|m| *m == link.mac) => {
                if let Err(e) = host.delete_link(link.index, &name).await {
                    errors.push(e);
                }
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    if let Some(ip) = what.ip {
        match host.rules_v4().await {
            Ok(rules) => {
                for rule in rules {
                    let ours = rule_matches(&rule, ip, RuleDirection::From, FROM_POD_RULE_PRIORITY)
                        || rule_matches(&rule, ip, RuleDirection::To, TO_POD_RULE_PRIORITY);
                    if ours {
                        match host.handle.rule().del(rule).execute().await {
                            Ok(()) => {}
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => errors.push(nl(format!("deleting rules of {ip}"))(e)),
                        }
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }
    errors
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

    let addrs: Vec<_> = pod
        .handle
        .address()
        .get()
        .set_link_index_filter(pod_link.index)
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing pod addresses"))?;
    let has_addr = addrs.iter().any(|a| {
        a.header.prefix_len == 32
            && a.attributes.iter().any(|attr| {
                matches!(attr, netlink_packet_route::address::AddressAttribute::Address(IpAddr::V4(ip)) if *ip == plan.ip)
            })
    });
    if !has_addr {
        return Err(missing(format!(
            "{}/32 is not on pod interface {}",
            plan.ip, plan.ifname
        )));
    }

    let pod_routes = pod.routes_v4().await?;
    let has_default = pod_routes.iter().any(|r| {
        route_table(r) == MAIN_TABLE
            && route_dst(r) == Some((Ipv4Addr::UNSPECIFIED, 0))
            && route_gateway(r) == Some(GATEWAY)
            && route_oif(r) == Some(pod_link.index)
    });
    if !has_default {
        return Err(missing(format!(
            "pod default route via {GATEWAY} dev {} is missing",
            plan.ifname
        )));
    }

    let neighbours: Vec<_> = pod
        .handle
        .neighbours()
        .get()
        .set_address_family(netlink_packet_route::AddressFamily::Inet)
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing pod neighbours"))?;
    let has_neighbour = neighbours.iter().any(|n| {
        n.header.ifindex == pod_link.index
            && n.header.state == NeighbourState::Permanent
            && n.attributes.iter().any(|a| {
                matches!(a, NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) if *ip == GATEWAY)
            })
            && n.attributes.iter().any(|a| {
                matches!(a, NeighbourAttribute::LinkLayerAddress(mac) if format_mac(mac) == host_link.mac)
            })
    });
    if !has_neighbour {
        return Err(missing(format!(
            "pod neighbour {GATEWAY} -> {} (permanent) is missing",
            host_link.mac
        )));
    }

    let host_routes = host.routes_v4().await?;
    let has_host_route = host_routes.iter().any(|r| {
        route_table(r) == MAIN_TABLE
            && route_dst(r) == Some((plan.ip, 32))
            && route_oif(r) == Some(host_link.index)
    });
    if !has_host_route {
        return Err(missing(format!(
            "host route {}/32 dev {} is missing",
            plan.ip, plan.host_veth
        )));
    }

    let wanted = pod_rules(plan.ip, plan.route_table);
    if !wanted.is_empty() {
        let rules = host.rules_v4().await?;
        for rule in wanted {
            let present = rules.iter().any(|r| {
                rule_matches(r, rule.ip, rule.direction, rule.priority)
                    && rule_table(r) == rule.table
            });
            if !present {
                return Err(missing(format!("host rule {rule} is missing")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn rules_only_for_secondary_enis() {
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        assert!(pod_rules(ip, 0).is_empty());
        let rules = pod_rules(ip, 3);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].to_string(), "512: to 10.0.0.5 lookup 254");
        assert_eq!(rules[1].to_string(), "1536: from 10.0.0.5 lookup 3");
    }

    #[test]
    fn macs_format_and_parse() {
        let bytes = [0x02, 0xab, 0, 1, 2, 0xff];
        let s = format_mac(&bytes);
        assert_eq!(s, "02:ab:00:01:02:ff");
        assert_eq!(parse_mac(&s).unwrap(), bytes);
        assert!(parse_mac("02:ab").is_err());
        assert!(parse_mac("zz:ab:00:01:02:ff").is_err());
    }
}
