//! The route table of every secondary ENI, kept by the daemon over rtnetlink (no `ip` commands).
//!
//! Pod IPs on a secondary ENI at device index `N` get `from <ip> lookup N+1` rules from the CNI plugin
//! ([`crate::cni::netns`]); this module makes table `N+1` exist and lead out of that ENI:
//!
//! ```text
//! ethN:           up, MTU as configured, <ENI primary ip>/<subnet prefix> (noprefixroute)
//! table N+1:      <subnet cidr> dev ethN scope link
//!                 default via <subnet gateway> dev ethN onlink
//! main table:     no <subnet cidr> dev ethN route (the node's own traffic keeps leaving by eth0)
//! ```
//!
//! The ENI's link is found by its MAC: it shows up a moment after EC2 reports the attachment, so
//! [`EniRouting::ensure`] fails with [`HostError::LinkNotFound`] until then and the caller retries
//! ([`RouteKeeper`] does, on its next round). Everything is idempotent: routes are written with
//! `NLM_F_REPLACE`, the address only when missing, and anything else found in table `N+1` is removed,
//! so the table converges to exactly the two routes above. The primary ENI (device index 0) has no
//! table: its pod IPs route through the main table, which this module never writes to.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use ipnet::Ipv4Net;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteScope,
};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cni::netns::{MAIN_TABLE, format_mac, is_exists, is_not_found as is_gone};
use crate::pool::{EniRole, EniSnapshot, PoolSnapshot};

/// The policy-routing table of the ENI at `device_index`: `device_index + 1`, or `None` for the
/// primary ENI (its pod IPs use the main table). The same convention as
/// [`crate::rpc::server::route_table`], which reports 0 for "none".
pub fn table_of(device_index: u32) -> Option<u32> {
    (device_index > 0).then(|| device_index + 1)
}

/// The VPC router of a subnet: its network address plus one.
pub fn subnet_gateway(cidr: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(cidr.network()).wrapping_add(1))
}

/// Why the host's routing could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The netlink socket could not be opened.
    #[error("opening a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// No link has the ENI's MAC (yet: the link appears a moment after the attachment; retry).
    #[error("no host link has MAC {mac} (yet)")]
    LinkNotFound {
        /// The ENI's MAC, lower case.
        mac: String,
    },
    /// Device index 0 is the primary ENI, whose pod IPs route through the main table.
    #[error("device index 0 is the primary ENI: it has no route table of its own")]
    PrimaryEni,
    /// The ENI's description does not hold together.
    #[error("ENI {mac} (device index {device_index}): {reason}")]
    Invalid {
        /// The ENI's MAC as given.
        mac: String,
        /// Its device index.
        device_index: u32,
        /// What is wrong.
        reason: String,
    },
    /// A netlink request failed.
    #[error("{op} ({target}): {source}")]
    Netlink {
        /// The operation ("adding route", "listing links", ...).
        op: &'static str,
        /// What it was about: the route, link and table.
        target: String,
        /// The error.
        #[source]
        source: rtnetlink::Error,
    },
}

fn nl(op: &'static str, target: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> HostError {
    let target = target.into();
    move |source| HostError::Netlink { op, target, source }
}

/// What the host needs to know about one secondary ENI to route through it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EniRoute {
    /// Its MAC (any case); the host link is found by it.
    pub mac: String,
    /// Its device index (the table is `device_index + 1`; 0 is refused).
    pub device_index: u32,
    /// Its subnet.
    pub subnet_cidr: Ipv4Net,
    /// The subnet's VPC router ([`subnet_gateway`]).
    pub gateway: Ipv4Addr,
    /// The ENI's primary private IP, put on the link so the kernel has a source address there.
    pub primary_ip: Ipv4Addr,
    /// MTU to set on the link; `None` leaves it alone.
    pub mtu: Option<u32>,
}

impl EniRoute {
    /// The route table (`device_index + 1`), `None` for the primary ENI.
    pub fn table(&self) -> Option<u32> {
        table_of(self.device_index)
    }

    /// The route of a pool ENI: only ENIs that serve pods ([`EniRole::Pods`]), are not the primary
    /// and whose subnet is known get one.
    pub fn from_snapshot(eni: &EniSnapshot, mtu: Option<u32>) -> Option<Self> {
        if eni.role != EniRole::Pods || eni.device_index == 0 {
            return None;
        }
        let cidr = eni.subnet_cidr?.trunc();
        Some(Self {
            mac: eni.mac.to_ascii_lowercase(),
            device_index: eni.device_index,
            subnet_cidr: cidr,
            gateway: subnet_gateway(cidr),
            primary_ip: eni.primary_ip,
            mtu,
        })
    }

    fn validate(&self) -> Result<(u32, String), HostError> {
        let table = self.table().ok_or(HostError::PrimaryEni)?;
        let invalid = |reason: String| HostError::Invalid {
            mac: self.mac.clone(),
            device_index: self.device_index,
            reason,
        };
        let mac = self.mac.to_ascii_lowercase();
        let well_formed = mac.len() == 17
            && mac.split(':').count() == 6
            && mac
                .split(':')
                .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()));
        if !well_formed {
            return Err(invalid("malformed MAC".into()));
        }
        if !self.subnet_cidr.contains(&self.primary_ip) {
            return Err(invalid(format!(
                "primary IP {} is outside subnet {}",
                self.primary_ip, self.subnet_cidr
            )));
        }
        if self.mtu == Some(0) {
            return Err(invalid("MTU 0".into()));
        }
        Ok((table, mac))
    }
}

/// The routes of every pod ENI in `snapshot` ([`EniRoute::from_snapshot`]).
pub fn pod_eni_routes(snapshot: &PoolSnapshot, mtu: Option<u32>) -> Vec<EniRoute> {
    snapshot
        .enis
        .iter()
        .filter_map(|e| EniRoute::from_snapshot(e, mtu))
        .collect()
}

/// One IPv4 route of a table, as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRoute {
    /// Destination (`0.0.0.0/0` for the default route).
    pub destination: Ipv4Net,
    /// Next hop, if any.
    pub gateway: Option<Ipv4Addr>,
    /// Output interface index.
    pub oif: Option<u32>,
    /// Whether the route has link scope (a directly connected destination).
    pub link_scope: bool,
    /// Whether the next hop is marked on-link.
    pub onlink: bool,
}

impl std::fmt::Display for TableRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.destination.prefix_len() == 0 {
            write!(f, "default")?;
        } else {
            write!(f, "{}", self.destination)?;
        }
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev #{oif}")?;
        }
        if self.link_scope {
            write!(f, " scope link")?;
        }
        if self.onlink {
            write!(f, " onlink")?;
        }
        Ok(())
    }
}

fn table_route(msg: &RouteMessage) -> Option<TableRoute> {
    let len = msg.header.destination_prefix_length;
    let dst = if len == 0 {
        Ipv4Addr::UNSPECIFIED
    } else {
        msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        })?
    };
    Some(TableRoute {
        destination: Ipv4Net::new(dst, len).ok()?,
        gateway: msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        }),
        oif: msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        }),
        link_scope: msg.header.scope == RouteScope::Link,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
    })
}

fn message_table(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

/// The host link of an ENI.
#[derive(Clone, Debug)]
struct EniLink {
    index: u32,
    name: String,
    up: bool,
    mtu: Option<u32>,
}

fn eni_link(msg: &LinkMessage) -> EniLink {
    let mut link = EniLink {
        index: msg.header.index,
        name: format!("#{}", msg.header.index),
        up: msg.header.flags.contains(LinkFlags::Up),
        mtu: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            _ => {}
        }
    }
    link
}

fn link_mac(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(bytes) => Some(format_mac(bytes)),
        _ => None,
    })
}

fn has_kind(msg: &LinkMessage) -> bool {
    msg.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().any(|i| matches!(i, LinkInfo::Kind(_))),
        _ => false,
    })
}

/// Aborts the netlink connection task when the last [`EniRouting`] clone goes.
#[derive(Debug)]
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps the route tables of secondary ENIs, over one rtnetlink socket bound to the network namespace
/// it was opened in. Cheap to clone; safe to use from several tasks.
#[derive(Clone, Debug)]
pub struct EniRouting {
    handle: Handle,
    _connection: Arc<Connection>,
}

impl EniRouting {
    /// Opens an rtnetlink socket in the calling thread's current network namespace (the host's, for
    /// the daemon). Must be called inside a tokio runtime: the connection runs as a task.
    pub async fn new() -> Result<Self, HostError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(HostError::Socket)?;
        Ok(Self {
            handle,
            _connection: Arc::new(Connection(tokio::spawn(conn))),
        })
    }

    /// Makes the ENI's link and table `device_index + 1` what the module docs describe: the link up
    /// (with `mtu`, if given) and holding `primary_ip/prefix`, the subnet route and the default route
    /// via `gateway` in the table, nothing else in the table, and no subnet route on that link in the
    /// main table. Idempotent.
    ///
    /// Fails with [`HostError::LinkNotFound`] while no link has the MAC (retry a moment later), and
    /// with [`HostError::PrimaryEni`] for device index 0.
    pub async fn ensure(&self, eni: &EniRoute) -> Result<(), HostError> {
        let (table, mac) = eni.validate()?;
        let link = self.find_link(&mac).await?;
        let subnet = eni.subnet_cidr.trunc();

        let wants_mtu = eni.mtu.filter(|m| link.mtu != Some(*m));
        if !link.up || wants_mtu.is_some() {
            let mut msg = LinkUnspec::new_with_index(link.index).up();
            if let Some(mtu) = wants_mtu {
                msg = msg.mtu(mtu);
            }
            self.handle
                .link()
                .set(msg.build())
                .execute()
                .await
                .map_err(nl(
                    "setting link up",
                    match wants_mtu {
                        Some(mtu) => format!("{} mtu {mtu}", link.name),
                        None => link.name.clone(),
                    },
                ))?;
        }

        self.ensure_address(&link, eni.primary_ip, subnet.prefix_len())
            .await?;

        let subnet_route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(subnet.network(), subnet.prefix_len())
            .output_interface(link.index)
            .scope(RouteScope::Link)
            .table_id(table)
            .build();
        self.handle
            .route()
            .add(subnet_route)
            .replace()
            .execute()
            .await
            .map_err(nl(
                "adding route",
                format!("{subnet} dev {} scope link table {table}", link.name),
            ))?;
        let default = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
            .gateway(eni.gateway)
            .output_interface(link.index)
            .onlink()
            .table_id(table)
            .build();
        self.handle
            .route()
            .add(default)
            .replace()
            .execute()
            .await
            .map_err(nl(
                "adding route",
                format!(
                    "default via {} dev {} onlink table {table}",
                    eni.gateway, link.name
                ),
            ))?;

        // Converge: only our two routes in the table, and no subnet route of this link in main.
        let ours = |r: &TableRoute| {
            r.oif == Some(link.index)
                && ((r.destination == subnet && r.gateway.is_none() && r.link_scope)
                    || (r.destination.prefix_len() == 0 && r.gateway == Some(eni.gateway)))
        };
        for msg in self.routes_v4().await? {
            let t = message_table(&msg);
            let Some(route) = table_route(&msg) else {
                if t == table {
                    self.delete_route(msg, table, "an unreadable route".into())
                        .await?;
                }
                continue;
            };
            let stray = (t == table && !ours(&route))
                || (t == MAIN_TABLE
                    && route.destination == subnet
                    && route.oif == Some(link.index));
            if stray {
                self.delete_route(msg, t, route.to_string()).await?;
            }
        }
        Ok(())
    }

    /// Flushes table `device_index + 1` (its routes only: the pod rules pointing at it belong to the
    /// plugin, and the link's address goes with the link). Idempotent.
    pub async fn remove(&self, device_index: u32) -> Result<(), HostError> {
        let table = table_of(device_index).ok_or(HostError::PrimaryEni)?;
        for msg in self.routes_v4().await? {
            if message_table(&msg) == table {
                let what = table_route(&msg).map_or_else(|| "a route".into(), |r| r.to_string());
                self.delete_route(msg, table, what).await?;
            }
        }
        Ok(())
    }

    /// The IPv4 routes in table `device_index + 1` now (introspection and tests).
    pub async fn table(&self, device_index: u32) -> Result<Vec<TableRoute>, HostError> {
        let table = table_of(device_index).ok_or(HostError::PrimaryEni)?;
        Ok(self
            .routes_v4()
            .await?
            .iter()
            .filter(|m| message_table(m) == table)
            .filter_map(table_route)
            .collect())
    }

    /// The link whose MAC is `mac` (lower case). Where several links share it (a VLAN or bond on top
    /// of the ENI), the one without a link kind (the physical device) wins.
    async fn find_link(&self, mac: &str) -> Result<EniLink, HostError> {
        let links: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing links", format!("looking for MAC {mac}")))?;
        let matching: Vec<&LinkMessage> = links
            .iter()
            .filter(|l| link_mac(l).as_deref() == Some(mac))
            .collect();
        matching
            .iter()
            .find(|l| !has_kind(l))
            .or_else(|| matching.first())
            .map(|l| eni_link(l))
            .ok_or_else(|| HostError::LinkNotFound {
                mac: mac.to_owned(),
            })
    }

    /// Adds `ip/prefix` to the link unless it is there. `noprefixroute`: the subnet route goes to the
    /// ENI's table, not the main one.
    async fn ensure_address(
        &self,
        link: &EniLink,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), HostError> {
        let target = || format!("{ip}/{prefix} dev {}", link.name);
        let addrs: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(link.index)
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing addresses", target()))?;
        let present = addrs.iter().any(|a| {
            a.header.prefix_len == prefix
                && a.attributes
                    .iter()
                    .any(|attr| matches!(attr, AddressAttribute::Local(IpAddr::V4(l)) if *l == ip))
        });
        if present {
            return Ok(());
        }
        let mut req = self
            .handle
            .address()
            .add(link.index, IpAddr::V4(ip), prefix);
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_exists(&e) => Ok(()),
            Err(e) => Err(nl("adding address", target())(e)),
        }
    }

    async fn routes_v4(&self) -> Result<Vec<RouteMessage>, HostError> {
        self.handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing routes", "IPv4, all tables"))
    }

    async fn delete_route(
        &self,
        msg: RouteMessage,
        table: u32,
        what: String,
    ) -> Result<(), HostError> {
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(nl("deleting route", format!("{what} table {table}"))(e)),
        }
    }
}

/// What one [`RouteKeeper::sync`] round did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Device indexes whose tables were (re)installed.
    pub ensured: Vec<u32>,
    /// Device indexes whose tables were flushed (the ENI is gone from the wanted list).
    pub removed: Vec<u32>,
    /// Device indexes that failed this round, with why; they are retried on the next one.
    pub failed: Vec<(u32, HostError)>,
}

/// Follows a changing list of ENIs: installs the table of each new (or changed) ENI, re-checks the
/// installed ones every `resync` (healing drift), and flushes the tables of ENIs that left the list.
/// ENIs whose link has not appeared yet are retried on every round.
#[derive(Debug)]
pub struct RouteKeeper {
    routing: EniRouting,
    resync: Duration,
    /// Every device index this keeper has worked on, with the ENI and when its table last
    /// converged (`None`: not yet, or the last attempt failed).
    installed: HashMap<u32, (EniRoute, Option<Instant>)>,
    /// ENIs whose link is missing: since when, and whether that was logged as a warning.
    missing_since: HashMap<u32, (Instant, bool)>,
}

/// How long an ENI's link may be missing before the keeper logs a warning, once (before: debug).
const LINK_WAIT_WARNING: Duration = Duration::from_secs(30);

impl RouteKeeper {
    /// A keeper that has installed nothing yet.
    pub fn new(routing: EniRouting, resync: Duration) -> Self {
        Self {
            routing,
            resync,
            installed: HashMap::new(),
            missing_since: HashMap::new(),
        }
    }

    /// One round against `wanted`.
    pub async fn sync(&mut self, wanted: &[EniRoute]) -> SyncReport {
        let now = Instant::now();
        let mut report = SyncReport::default();
        for eni in wanted {
            let due = match self.installed.get(&eni.device_index) {
                Some((done, Some(at))) => done != eni || now.duration_since(*at) >= self.resync,
                _ => true,
            };
            if !due {
                continue;
            }
            match self.routing.ensure(eni).await {
                Ok(()) => {
                    let fresh = self
                        .installed
                        .get(&eni.device_index)
                        .is_none_or(|(done, at)| done != eni || at.is_none());
                    if fresh {
                        tracing::info!(
                            mac = %eni.mac, device_index = eni.device_index,
                            table = eni.device_index + 1, subnet = %eni.subnet_cidr,
                            gateway = %eni.gateway, "ENI route table installed"
                        );
                    }
                    self.installed
                        .insert(eni.device_index, (eni.clone(), Some(now)));
                    self.missing_since.remove(&eni.device_index);
                    report.ensured.push(eni.device_index);
                }
                Err(e) => {
                    // Still ours: a partial table is flushed if the ENI leaves the list.
                    self.installed.insert(eni.device_index, (eni.clone(), None));
                    if matches!(e, HostError::LinkNotFound { .. }) {
                        let (since, warned) = self
                            .missing_since
                            .entry(eni.device_index)
                            .or_insert((now, false));
                        let waited = now.duration_since(*since);
                        if waited >= LINK_WAIT_WARNING && !*warned {
                            *warned = true;
                            tracing::warn!(mac = %eni.mac, device_index = eni.device_index, waited = ?waited, "ENI link still missing");
                        } else {
                            tracing::debug!(mac = %eni.mac, device_index = eni.device_index, "ENI link not there yet");
                        }
                    } else {
                        tracing::warn!(mac = %eni.mac, device_index = eni.device_index, error = %e, "installing the ENI route table failed");
                    }
                    report.failed.push((eni.device_index, e));
                }
            }
        }
        let gone: Vec<u32> = self
            .installed
            .keys()
            .copied()
            .filter(|i| !wanted.iter().any(|e| e.device_index == *i))
            .collect();
        for index in gone {
            match self.routing.remove(index).await {
                Ok(()) => {
                    self.installed.remove(&index);
                    tracing::info!(
                        device_index = index,
                        table = index + 1,
                        "ENI route table flushed"
                    );
                    report.removed.push(index);
                }
                Err(e) => {
                    tracing::warn!(device_index = index, error = %e, "flushing the ENI route table failed");
                    report.failed.push((index, e));
                }
            }
        }
        self.missing_since
            .retain(|i, _| wanted.iter().any(|e| e.device_index == *i));
        report
    }

    /// Runs [`Self::sync`] every `period` against what `wanted` returns (for the daemon:
    /// `move || pod_eni_routes(&pool.snapshot(), mtu)`), until `cancel`.
    pub fn spawn<F>(
        mut self,
        mut wanted: F,
        period: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Vec<EniRoute> + Send + 'static,
    {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let list = wanted();
                self.sync(&list).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eni(device_index: u32) -> EniRoute {
        EniRoute {
            mac: "02:AB:00:00:00:01".into(),
            device_index,
            subnet_cidr: "10.1.2.0/24".parse().unwrap(),
            gateway: "10.1.2.1".parse().unwrap(),
            primary_ip: "10.1.2.10".parse().unwrap(),
            mtu: Some(9001),
        }
    }

    #[test]
    fn tables_follow_the_plugin_convention() {
        assert_eq!(table_of(0), None);
        assert_eq!(table_of(1), Some(2));
        assert_eq!(table_of(14), Some(15));
        for i in 1..16 {
            assert_eq!(
                table_of(i),
                Some(crate::rpc::server::route_table(i)),
                "device index {i}"
            );
        }
        assert_eq!(eni(3).table(), Some(4));
    }

    #[test]
    fn gateway_is_the_subnet_router() {
        assert_eq!(
            subnet_gateway("10.1.2.0/24".parse().unwrap()),
            Ipv4Addr::new(10, 1, 2, 1)
        );
        assert_eq!(
            subnet_gateway("172.31.32.0/20".parse().unwrap()),
            Ipv4Addr::new(172, 31, 32, 1)
        );
    }

    #[test]
    fn validation_normalises_and_refuses() {
        assert_eq!(
            eni(1).validate().unwrap(),
            (2, "02:ab:00:00:00:01".to_owned())
        );
        assert!(matches!(eni(0).validate(), Err(HostError::PrimaryEni)));
        let mut bad = eni(1);
        bad.primary_ip = "10.9.9.9".parse().unwrap();
        let err = bad.validate().unwrap_err();
        assert!(
            err.to_string().contains("outside subnet 10.1.2.0/24"),
            "{err}"
        );
        let mut bad = eni(1);
        bad.mac = "02:ab:00:00:01".into();
        assert!(matches!(bad.validate(), Err(HostError::Invalid { .. })));
        let mut bad = eni(1);
        bad.mac = "02:ab:00:00:00:zz".into();
        assert!(matches!(bad.validate(), Err(HostError::Invalid { .. })));
    }

    #[test]
    fn pool_enis_map_to_routes() {
        use crate::pool::EniPhaseSnapshot;
        let snap = |role: EniRole, device_index: u32, cidr: Option<&str>| EniSnapshot {
            id: "eni-0123abcd".parse().unwrap(),
            mac: "02:AB:00:00:00:01".into(),
            device_index,
            subnet_id: "subnet-1".into(),
            subnet_cidr: cidr.map(|c| c.parse().unwrap()),
            primary_ip: "10.1.2.10".parse().unwrap(),
            role,
            phase: EniPhaseSnapshot::Serving,
            in_flight: 0,
            ips: Vec::new(),
        };
        let route =
            EniRoute::from_snapshot(&snap(EniRole::Pods, 2, Some("10.1.2.0/24")), Some(9001))
                .unwrap();
        assert_eq!(
            route,
            EniRoute {
                mac: "02:ab:00:00:00:01".into(),
                device_index: 2,
                subnet_cidr: "10.1.2.0/24".parse().unwrap(),
                gateway: "10.1.2.1".parse().unwrap(),
                primary_ip: "10.1.2.10".parse().unwrap(),
                mtu: Some(9001),
            }
        );
        assert_eq!(
            EniRoute::from_snapshot(&snap(EniRole::Primary, 0, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(
            EniRoute::from_snapshot(&snap(EniRole::Foreign, 1, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(
            EniRoute::from_snapshot(&snap(EniRole::Pods, 0, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(
            EniRoute::from_snapshot(&snap(EniRole::Pods, 1, None), None),
            None
        );
    }

    #[test]
    fn routes_display_like_ip() {
        let r = TableRoute {
            destination: "0.0.0.0/0".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(10, 1, 2, 1)),
            oif: Some(7),
            link_scope: false,
            onlink: true,
        };
        assert_eq!(r.to_string(), "default via 10.1.2.1 dev #7 onlink");
        let r = TableRoute {
            destination: "10.1.2.0/24".parse().unwrap(),
            gateway: None,
            oif: Some(7),
            link_scope: true,
            onlink: false,
        };
        assert_eq!(r.to_string(), "10.1.2.0/24 dev #7 scope link");
    }
}
