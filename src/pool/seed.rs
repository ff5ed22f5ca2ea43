//! What the pool starts from: the ENIs already attached with their IPs, and the assignments the
//! state layer restored. The reconciler builds a [`PoolSeed`] from SQLite, IMDS and EC2; a fresh node
//! passes [`PoolSeed::from_metadata`] of its interfaces.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::types::AttachmentMeta;
use crate::cloud::{Eni, MetadataEni};
use crate::model::{AttachmentKey, EniId, PodRef};

/// One ENI attached to the node at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EniSeed {
    pub id: EniId,
    pub mac: String,
    /// 0 is eth0 (its secondary IPs serve pods with `use_primary_eni`; it never detaches).
    pub device_index: u32,
    pub subnet_id: String,
    pub subnet_cidr: Ipv4Net,
    pub primary_ip: Ipv4Addr,
    /// The ENI's secondary IPs (primary excluded).
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Its delegated `/28` prefixes.
    pub prefixes: Vec<Ipv4Net>,
    /// Created by eniipam and not opted out: the pool may assign, unassign, detach and delete. Any
    /// other ENI (device index > 0) only takes a slot.
    pub managed: bool,
    /// EC2's description of the ENI, when the caller has it (saves a describe before a delete).
    pub eni: Option<Eni>,
    /// The network profile it was created for (its `eniipam.io/network` tag,
    /// [`crate::pool::profiles::profile_of`]); `None`: the default pod network.
    pub profile: Option<String>,
}

impl EniSeed {
    /// From IMDS's view of an interface (`ips[0]` is the primary).
    pub fn from_metadata(md: &MetadataEni, managed: bool) -> Self {
        Self {
            id: md.eni_id.clone(),
            mac: md.mac.clone(),
            device_index: md.device_number,
            subnet_id: md.subnet_id.clone(),
            subnet_cidr: md.subnet_cidr,
            primary_ip: md.ips.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED),
            secondary_ips: md.ips.iter().skip(1).copied().collect(),
            prefixes: md.ipv4_prefixes.clone(),
            managed,
            eni: None,
            profile: None,
        }
    }
}

/// One assignment restored from the state store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationSeed {
    pub ip: Ipv4Addr,
    pub attachment: AttachmentKey,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
}

/// An IP that starts quarantined: on a managed ENI, history unknown, and no evidence of who holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantineSeed {
    pub ip: Ipv4Addr,
    pub since: Instant,
    pub reason: String,
}

/// What is known about an idle IP (when it became idle, its reservation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleSeed {
    pub ip: Ipv4Addr,
    /// When it became idle (the store converts its wall-clock time to a tokio instant); cooldown
    /// runs from here.
    pub idle_since: Instant,
    /// A sticky reservation: key and end.
    pub reserved: Option<(String, Instant)>,
    /// Never served a pod (a fresh node's launch addresses): eligible at once, no cooldown.
    pub fresh: bool,
}

/// The pool's starting state. Secondary IPs on managed ENIs that are neither in `allocations` nor
/// in `idle` start idle *now*, cooling: their history is unknown, so they are treated as just
/// released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSeed {
    pub enis: Vec<EniSeed>,
    pub allocations: Vec<AllocationSeed>,
    pub idle: Vec<IdleSeed>,
    pub quarantined: Vec<QuarantineSeed>,
}

impl PoolSeed {
    /// A seed from IMDS interfaces: ENIs whose id is in `managed` are the pool's, the rest only
    /// take their slot.
    pub fn from_metadata(interfaces: &[MetadataEni], managed: &[EniId]) -> Self {
        Self {
            enis: interfaces
                .iter()
                .map(|md| {
                    EniSeed::from_metadata(
                        md,
                        md.device_number != 0 && managed.contains(&md.eni_id),
                    )
                })
                .collect(),
            allocations: Vec::new(),
            idle: Vec::new(),
            quarantined: Vec::new(),
        }
    }
}

/// A seed the pool refuses to start from.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SeedError {
    #[error("IP {ip} appears on more than one ENI")]
    DuplicateIp { ip: Ipv4Addr },
    #[error("device index {device_index} is used by {first} and {second}")]
    DuplicateDeviceIndex {
        device_index: u32,
        first: EniId,
        second: EniId,
    },
    #[error("assignment of {ip} to {attachment}: the IP is on no managed ENI")]
    UnknownIp {
        ip: Ipv4Addr,
        attachment: AttachmentKey,
    },
    #[error("attachment {attachment} holds two IPs ({first} and {second})")]
    DuplicateAttachment {
        attachment: AttachmentKey,
        first: Ipv4Addr,
        second: Ipv4Addr,
    },
    #[error("IP {ip} is assigned to both {first} and {second}")]
    IpAssignedTwice {
        ip: Ipv4Addr,
        first: AttachmentKey,
        second: AttachmentKey,
    },
    #[error("quarantined IP {ip} is on no managed ENI")]
    UnknownQuarantined { ip: Ipv4Addr },
    #[error("IP {ip} is quarantined and also assigned or quarantined twice")]
    QuarantinedTwice { ip: Ipv4Addr },
}
