//! The route table of every secondary ENI, kept by the daemon over rtnetlink (no `ip` commands).
//!
//! Pod IPs on a secondary ENI at device index `N` get `from <ip> lookup N+1` rules from the CNI plugin;
//! this module makes table `N+1` exist and lead out of that ENI:
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
//! ([`super::RouteKeeper`] does, on its next round). Everything is idempotent: routes are written with
//! `NLM_F_REPLACE`, the address only when missing, and anything else found in table `N+1` is removed,
//! so the table converges to exactly the two routes above. The primary ENI (device index 0) has no
//! table: its pod IPs route through the main table, which this module never writes to.

use std::net::{IpAddr, Ipv4Addr};

use eniipam_netlink::{LinkFacts, MAIN_TABLE, Netlink, TableRoute};
use ipnet::Ipv4Net;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::route::RouteScope;
use rtnetlink::RouteMessageBuilder;

use eniipam_api::model::vpc_router;

/// The policy-routing table of the ENI at `device_index` ([`eniipam_api::model::route_table`]: the one
/// convention the plugin's rules and these tables share).
pub fn table_of(device_index: u32) -> Option<u32> {
    eniipam_api::model::route_table(device_index)
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
    #[error(transparent)]
    Netlink(#[from] eniipam_netlink::Error),
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> HostError {
    let f = eniipam_netlink::Error::request(what);
    move |source| HostError::Netlink(f(source))
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
    /// The subnet's VPC router ([`vpc_router`]).
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

    /// The route of a secondary ENI (`None` for the primary, device index 0).
    pub fn of_eni(
        mac: &str,
        device_index: u32,
        subnet_cidr: Ipv4Net,
        primary_ip: Ipv4Addr,
        mtu: Option<u32>,
    ) -> Option<Self> {
        if device_index == 0 {
            return None;
        }
        let cidr = subnet_cidr.trunc();
        Some(Self {
            mac: mac.to_ascii_lowercase(),
            device_index,
            subnet_cidr: cidr,
            gateway: vpc_router(cidr.network()),
            primary_ip,
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

/// Keeps the route tables of secondary ENIs, over one rtnetlink connection bound to the network
/// namespace it was opened in. Cheap to clone; safe to use from several tasks.
#[derive(Clone, Debug)]
pub struct EniRouting {
    nl: Netlink,
}

impl EniRouting {
    /// Opens an rtnetlink socket in the calling thread's current network namespace (the host's, for
    /// the daemon). Must be called inside a tokio runtime: the connection runs as a task.
    pub async fn new() -> Result<Self, HostError> {
        Ok(Self {
            nl: Netlink::current()?,
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
        let link = self
            .nl
            .link_by_mac(&mac)
            .await?
            .ok_or(HostError::LinkNotFound { mac })?;
        let subnet = eni.subnet_cidr.trunc();

        let wants_mtu = eni.mtu.filter(|m| link.mtu != Some(*m));
        if !link.up || wants_mtu.is_some() {
            self.nl.set_up(link.index, &link.name, wants_mtu).await?;
        }

        self.ensure_address(&link, eni.primary_ip, subnet.prefix_len())
            .await?;

        let subnet_route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(subnet.network(), subnet.prefix_len())
            .output_interface(link.index)
            .scope(RouteScope::Link)
            .table_id(table)
            .build();
        self.nl
            .replace_route(
                subnet_route,
                &format!("{subnet} dev {} scope link table {table}", link.name),
            )
            .await?;
        let default = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
            .gateway(eni.gateway)
            .output_interface(link.index)
            .onlink()
            .table_id(table)
            .build();
        self.nl
            .replace_route(
                default,
                &format!(
                    "default via {} dev {} onlink table {table}",
                    eni.gateway, link.name
                ),
            )
            .await?;

        // Converge: only our two routes in the table, and no subnet route of this link in main.
        let ours = |r: &TableRoute| {
            r.oif == Some(link.index)
                && ((r.destination == subnet && r.gateway.is_none() && r.link_scope)
                    || (r.destination.prefix_len() == 0 && r.gateway == Some(eni.gateway)))
        };
        for msg in self.nl.routes_v4().await? {
            let t = eniipam_netlink::MessageTable::table(&msg);
            let Some(route) = TableRoute::of(&msg) else {
                if t == table {
                    self.nl
                        .delete_route(msg, &format!("an unreadable route in table {table}"))
                        .await?;
                }
                continue;
            };
            let stray = (t == table && !ours(&route))
                || (t == MAIN_TABLE
                    && route.destination == subnet
                    && route.oif == Some(link.index));
            if stray {
                self.nl.delete_route(msg, &route.to_string()).await?;
            }
        }
        Ok(())
    }

    /// Flushes table `device_index + 1` (its routes only: the pod rules pointing at it belong to the
    /// plugin, and the link's address goes with the link). Idempotent.
    pub async fn remove(&self, device_index: u32) -> Result<(), HostError> {
        let table = table_of(device_index).ok_or(HostError::PrimaryEni)?;
        for msg in self.nl.routes_v4().await? {
            if eniipam_netlink::MessageTable::table(&msg) == table {
                let what = TableRoute::of(&msg)
                    .map_or_else(|| format!("a route in table {table}"), |r| r.to_string());
                self.nl.delete_route(msg, &what).await?;
            }
        }
        Ok(())
    }

    /// The IPv4 routes in table `device_index + 1` now (introspection and tests).
    pub async fn table(&self, device_index: u32) -> Result<Vec<TableRoute>, HostError> {
        let table = table_of(device_index).ok_or(HostError::PrimaryEni)?;
        Ok(self
            .nl
            .routes_v4()
            .await?
            .iter()
            .filter_map(TableRoute::of)
            .filter(|r| r.table == table)
            .collect())
    }

    /// Adds `ip/prefix` to the link unless it is there. `noprefixroute`: the subnet route goes to the
    /// ENI's table, not the main one.
    async fn ensure_address(
        &self,
        link: &LinkFacts,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), HostError> {
        let target = || format!("adding address {ip}/{prefix} dev {}", link.name);
        let present = self.nl.addresses(link.index).await?.iter().any(|a| {
            a.header.prefix_len == prefix
                && a.attributes
                    .iter()
                    .any(|attr| matches!(attr, AddressAttribute::Local(IpAddr::V4(l)) if *l == ip))
        });
        if present {
            return Ok(());
        }
        let mut req = self
            .nl
            .handle()
            .address()
            .add(link.index, IpAddr::V4(ip), prefix);
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if eniipam_netlink::is_exists(&e) => Ok(()),
            Err(e) => Err(nl(target())(e)),
        }
    }
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
