//! IPv6 pods (issue 26): the node's one delegated /80 and the addresses pods draw from it.
//!
//! With `ip_family = ipv6` or `dual`, the daemon takes one /80 on the primary ENI at startup
//! (`AssignIpv6Addresses` with `Ipv6PrefixCount=1`, or the /80 it already has) and records it
//! ([`prefix`]). Every pod then gets an address from it with no EC2 call at all: the node makes one
//! mutating call in its life, where the IPv4 pool makes one per warm-up batch. The address book
//! ([`book`]) keeps the IPv4 pool's rules where they mean something for a /80: durable records
//! before the answer (the IPAM service's invariant 5), sticky StatefulSet addresses, GC, the startup
//! rebuild, and instead of a cooldown, an address is never handed out twice.
//!
//! In `dual` mode a pod gets an IPv4 from the ENI pool and an IPv6 from here, recorded per
//! attachment and released together (`ipam`).
//!
//! In `ipv6` mode with `ipv4_egress` (the default), each pod also gets a node-local IPv4 from
//! 169.254.172.0/22 with its IPv6, in the same record, which the node SNATs to its primary IPv4
//! ([`egress`]).
//!
//! One room (`eniipam-ipv6`; the daemon's `eniipam::ipv6`), depending on no part of the daemon: the
//! model from `eniipam-api`, the /80 taken through `eniipam-cloud`'s `Cloud`, and the feature's rows
//! as the state file keeps them ([`stored`]), which the daemon's store reads and writes. The pool
//! half (a pod's IPv6 beside its IPv4 in the IPAM service, the running reconcile's /80 check) stays
//! in the core.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;
use std::sync::Mutex;

use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

pub mod book;
pub mod egress;
pub mod prefix;
pub mod stored;

pub use book::{Book, Grant, Held, Ipv6Error, Meta, Released6, Reservation};

use crate::stored::{StoredAssignment6, StoredIpv6, StoredPrefix6, StoredReservation6};

/// Which address families pods get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// An IPv4 from the ENI pool (the default).
    #[default]
    Ipv4,
    /// An IPv6 from the node's /80, and no IPv4 from the pool.
    Ipv6,
    /// Both: an IPv4 from the pool and an IPv6 from the /80.
    Dual,
}

impl IpFamily {
    /// Whether pods get an IPv4 from the ENI pool.
    pub fn has_ipv4(self) -> bool {
        matches!(self, Self::Ipv4 | Self::Dual)
    }

    /// Whether pods get an IPv6 from the /80.
    pub fn has_ipv6(self) -> bool {
        matches!(self, Self::Ipv6 | Self::Dual)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Dual => "dual",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IpFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ipv4" => Ok(Self::Ipv4),
            "ipv6" => Ok(Self::Ipv6),
            "dual" => Ok(Self::Dual),
            other => Err(format!("ip_family {other:?} is not ipv4, ipv6 or dual")),
        }
    }
}

/// The node's /80 and its address book, shared by the IPAM service and the status and metrics.
#[derive(Debug)]
pub struct Ipv6Pool {
    book: Mutex<Book>,
    /// The ENI the /80 is delegated to.
    pub eni_id: String,
    /// The VPC's IPv6 CIDR blocks.
    pub vpc_cidrs: Vec<Ipv6Net>,
    /// How long a StatefulSet pod's address waits for it (ms); 0: not at all.
    pub stick_ms: u64,
}

/// What the startup rebuild of the IPv6 book found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Rows dropped: outside the prefix, held twice, or reservations that ran out.
    pub dropped: Vec<(Ipv6Addr, String)>,
    /// The IPv6 tables as they must be written.
    pub state: StoredIpv6,
}

impl Ipv6Pool {
    /// The book of `prefix`, with the state file's rows of it put back. With `egress`, every pod
    /// also gets an IPv4 egress address (rows keep theirs); without, rows lose theirs.
    pub fn restore(
        prefix: StoredPrefix6,
        stored: StoredIpv6,
        (vpc_cidrs, egress): (Vec<Ipv6Net>, bool),
        stick_ms: u64,
        now_ms: u64,
    ) -> (Self, Restored) {
        let mut book = Book::new(prefix.prefix, prefix.next_offset);
        if egress {
            book = book.with_egress(prefix.egress_next);
        }
        let mut dropped = Vec::new();
        for a in stored.assignments {
            let key =
                eniipam_api::model::AttachmentKey::new(a.container_id.clone(), a.ifname.clone());
            let held = Held {
                ip: a.ip,
                pod: eniipam_api::model::PodRef {
                    namespace: a.pod_namespace.clone(),
                    name: a.pod_name.clone(),
                    uid: a.pod_uid.clone(),
                },
                sticky_key: a.sticky_key.clone(),
                meta: Meta {
                    network: a.network.clone(),
                    netns: a.netns.clone(),
                },
                assigned_at_ms: a.assigned_at_ms,
                egress: a.egress_ipv4,
            };
            if let Err(why) = book.restore_held(key, held) {
                dropped.push((a.ip, why));
            }
        }
        for r in stored.reservations {
            if r.until_ms <= now_ms {
                dropped.push((r.ip, format!("reservation for {} ran out", r.sticky_key)));
                continue;
            }
            let res = Reservation {
                ip: r.ip,
                until_ms: r.until_ms,
                released_at_ms: r.released_at_ms,
            };
            if let Err(why) = book.restore_reservation(r.sticky_key.clone(), res) {
                dropped.push((r.ip, why));
            }
        }
        let state = StoredIpv6 {
            prefix: Some(StoredPrefix6 {
                next_offset: book.next_offset(),
                egress_next: book.egress().map_or(prefix.egress_next, |e| e.next()),
                ..prefix.clone()
            }),
            assignments: book.held().map(|(k, h)| stored_assignment(k, h)).collect(),
            reservations: book
                .reservations()
                .map(|(k, r)| stored_reservation(k, r))
                .collect(),
        };
        let pool = Self {
            book: Mutex::new(book),
            eni_id: prefix.eni_id,
            vpc_cidrs,
            stick_ms,
        };
        (pool, Restored { dropped, state })
    }

    /// Runs `f` on the book (a short, synchronous critical section).
    pub fn with<T>(&self, f: impl FnOnce(&mut Book) -> T) -> T {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut book)
    }

    pub fn prefix(&self) -> Ipv6Net {
        self.with(|b| b.prefix())
    }
}

/// The row of one held address.
pub fn stored_assignment(key: &eniipam_api::model::AttachmentKey, h: &Held) -> StoredAssignment6 {
    StoredAssignment6 {
        ip: h.ip,
        network: h.meta.network.clone(),
        container_id: key.container_id.clone(),
        ifname: key.ifname.clone(),
        netns: h.meta.netns.clone(),
        pod_namespace: h.pod.namespace.clone(),
        pod_name: h.pod.name.clone(),
        pod_uid: h.pod.uid.clone(),
        sticky_key: h.sticky_key.clone(),
        assigned_at_ms: h.assigned_at_ms,
        egress_ipv4: h.egress,
    }
}

/// The row of one reservation.
pub fn stored_reservation(sticky_key: &str, r: &Reservation) -> StoredReservation6 {
    StoredReservation6 {
        ip: r.ip,
        sticky_key: sticky_key.to_owned(),
        until_ms: r.until_ms,
        released_at_ms: r.released_at_ms,
    }
}

#[cfg(test)]
mod tests;
