//! The feature's rows as the state file keeps them: the node's /80 with its cursors, the pods'
//! addresses and the sticky reservations. The daemon's store (`store::ipv6`, one transaction per
//! call on its owner thread) reads and writes them; this crate builds and reads them.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;

/// The node's delegated /80.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPrefix6 {
    pub prefix: Ipv6Net,
    /// The ENI it is delegated to (the primary ENI).
    pub eni_id: String,
    /// The offset of the next never-used address.
    pub next_offset: u64,
    /// The egress cursor: a count that only grows (`ipv6::egress`).
    pub egress_next: u64,
    /// When the daemon took or adopted it (unix ms).
    pub taken_at_ms: u64,
}

/// One pod's IPv6 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAssignment6 {
    pub ip: Ipv6Addr,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub sticky_key: Option<String>,
    pub assigned_at_ms: u64,
    /// The pod's node-local IPv4 for egress (ipv6 mode with `ipv4_egress`).
    pub egress_ipv4: Option<Ipv4Addr>,
}

/// A StatefulSet pod's address kept while the pod is away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredReservation6 {
    pub ip: Ipv6Addr,
    pub sticky_key: String,
    pub until_ms: u64,
    pub released_at_ms: u64,
}

/// Everything the IPv6 tables hold (sorted by address).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredIpv6 {
    pub prefix: Option<StoredPrefix6>,
    pub assignments: Vec<StoredAssignment6>,
    pub reservations: Vec<StoredReservation6>,
}
