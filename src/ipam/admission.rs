//! The IPAM service's extension point "admit a wired pod before ADD returns" ([`Admission`]): a
//! feature that must act on a new pod before its first packet (NetworkPolicy enforcement, the
//! `eniipam-netpol` crate) plugs in here. The daemon wires it when it builds the service
//! ([`Extensions`], given to `Ipam::with_family`), so the core never calls up into a feature and
//! no late-set global exists; the core knows nothing of what the feature does.

use std::sync::Arc;

use super::IpamError;
use crate::model::PodRef;

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
    /// Admit a wired pod before its ADD returns (NetworkPolicy enforcement on).
    pub admission: Option<Arc<dyn Admission>>,
}
