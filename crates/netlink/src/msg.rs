//! Netlink messages read back: a link's facts, a route's shape, the table of a route or rule.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteScope,
};
use netlink_packet_route::rule::{RuleAttribute, RuleMessage};

use crate::format_mac;

/// Facts about one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkFacts {
    /// Interface index.
    pub index: u32,
    /// Interface name (`#<index>` when the kernel did not say).
    pub name: String,
    /// Hardware address, lower case (empty when it has none).
    pub mac: String,
    /// Administratively up.
    pub up: bool,
    /// MTU, when reported.
    pub mtu: Option<u32>,
    /// The link kind (`veth`, `vlan`, ...); `None` for a physical device.
    pub kind: Option<String>,
}

impl LinkFacts {
    /// Reads a link message.
    pub fn of(msg: &LinkMessage) -> Self {
        let mut facts = Self {
            index: msg.header.index,
            name: format!("#{}", msg.header.index),
            mac: String::new(),
            up: msg.header.flags.contains(LinkFlags::Up),
            mtu: None,
            kind: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => facts.name = n.clone(),
                LinkAttribute::Address(bytes) => facts.mac = format_mac(bytes),
                LinkAttribute::Mtu(m) => facts.mtu = Some(*m),
                LinkAttribute::LinkInfo(infos) => {
                    facts.kind = infos.iter().find_map(|i| match i {
                        LinkInfo::Kind(InfoKind::Veth) => Some("veth".to_owned()),
                        LinkInfo::Kind(k) => Some(k.to_string()),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        facts
    }

    /// Whether the link is a veth.
    pub fn is_veth(&self) -> bool {
        self.kind.as_deref() == Some("veth")
    }
}

/// The routing table a route or rule message names (the `RTA_TABLE`/`FRA_TABLE` attribute, which holds
/// tables above 255, else the header's byte).
pub trait MessageTable {
    /// The table id.
    fn table(&self) -> u32;
}

impl MessageTable for RouteMessage {
    fn table(&self) -> u32 {
        self.attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(self.header.table))
    }
}

impl MessageTable for RuleMessage {
    fn table(&self) -> u32 {
        self.attributes
            .iter()
            .find_map(|a| match a {
                RuleAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(self.header.table))
    }
}

/// One IPv4 route as read back; displayed like `ip route` shows it within its table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRoute {
    /// The table it is in.
    pub table: u32,
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

impl TableRoute {
    /// Reads an IPv4 route message; `None` when it has no readable IPv4 destination.
    pub fn of(msg: &RouteMessage) -> Option<Self> {
        let len = msg.header.destination_prefix_length;
        let dst = if len == 0 {
            Ipv4Addr::UNSPECIFIED
        } else {
            msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
                _ => None,
            })?
        };
        Some(Self {
            table: msg.table(),
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
}

/// One IPv6 route as read back (the pod's default route via `fe80::1`, a pod's `/128` host route).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRoute6 {
    /// The table it is in.
    pub table: u32,
    /// Destination (`::/0` for the default route).
    pub destination: Ipv6Net,
    /// Next hop, if any.
    pub gateway: Option<Ipv6Addr>,
    /// Output interface index.
    pub oif: Option<u32>,
}

impl TableRoute6 {
    /// Reads an IPv6 route message; `None` when it has no readable IPv6 destination.
    pub fn of(msg: &RouteMessage) -> Option<Self> {
        let len = msg.header.destination_prefix_length;
        let dst = if len == 0 {
            Ipv6Addr::UNSPECIFIED
        } else {
            msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(*ip),
                _ => None,
            })?
        };
        Some(Self {
            table: msg.table(),
            destination: Ipv6Net::new(dst, len).ok()?,
            gateway: msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => Some(*ip),
                _ => None,
            }),
            oif: msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            }),
        })
    }
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
