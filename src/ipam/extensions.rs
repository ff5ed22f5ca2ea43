//! The IPAM service's extension points, where a feature plugs into every new ADD: "choose the
//! network for a new pod" ([`ProfileSelector`]: network profiles, answered from the API server) and
//! "admit a wired pod before ADD returns" ([`Admission`]: a feature that must act on a new pod
//! before its first packet, NetworkPolicy enforcement, the `eniipam-netpol` crate). The daemon
//! wires them when it builds the service ([`Extensions`], given to `Ipam::with_family`), so the
//! core never calls up into a feature and no late-set global exists; the core knows nothing of
//! what a feature does.

use std::sync::Arc;

use super::IpamError;
use crate::model::PodRef;
use crate::pool::ProfileName;

/// How the service learns, on a new ADD, which network profile the pod selects (network profiles
/// on: the daemon answers from the API server, `crate::daemon`'s `profiles`).
#[async_trait::async_trait]
pub trait ProfileSelector: Send + Sync {
    /// The profile `pod` selects (`None`: the node's default pod network), or why the pod cannot be
    /// served: a profile that does not exist or cannot be used here is
    /// [`crate::pool::PoolError::ProfileUnavailable`], naming it and why.
    async fn select(&self, pod: &PodRef) -> Result<Option<ProfileName>, IpamError>;
    /// Whether pods of `profile` leave by their own ENI with their own address (its egress mode,
    /// `strict` unless the profile asks for `standard`; `strict` for a profile no longer known).
    fn own_eni_egress(&self, profile: &str) -> bool;
}

/// What may hold a new pod's ADD until the pod may start.
#[async_trait::async_trait]
pub trait Admission: Send + Sync {
    /// Returns once `pod` (its address just allocated here, new) may start; an error
    /// ([`IpamError::Admission`]) fails the ADD, and the allocation is undone.
    async fn admit(&self, pod: &PodRef) -> Result<(), IpamError>;
    /// `pod` was allocated for in the IPAM role: another plugin wires it, so what admission puts
    /// in force (keyed by eniipam's host veth) may not apply to it. Not waited for.
    fn unwired(&self, pod: &PodRef);
    /// An attachment was released (or a new one undone). Not waited for.
    fn released(&self);
}

/// The extension points the daemon wires into the service at construction.
#[derive(Clone, Default)]
pub struct Extensions {
    /// Choose the network profile of a new pod (network profiles on).
    pub profiles: Option<Arc<dyn ProfileSelector>>,
    /// Admit a wired pod before its ADD returns (NetworkPolicy enforcement on).
    pub admission: Option<Arc<dyn Admission>>,
    /// A release deletes its addresses' conntrack entries before it returns
    /// (`crate::host::conntrack`; issue 47, case 9), so the next pod given the address inherits no
    /// flow. Only where the daemon owns the host's networking.
    pub forget_flows: bool,
}
