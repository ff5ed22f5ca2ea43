//! The IPAM service's side of NetworkPolicy: the gate a new pod's ADD waits on ([`PolicyGate`],
//! the daemon's enforcer), and the warning for pods allocated in the IPAM role, whose interfaces
//! another plugin makes and no rule of eniipam's matches.

use super::{Ipam, IpamError};
use crate::model::PodRef;

/// NetworkPolicy enforcement (the daemon's `network_policy`, `crate::daemon`'s `network_policy`):
/// a new pod's rules are in force before its ADD is answered, so its first packet already meets
/// them.
#[async_trait::async_trait]
pub trait PolicyGate: Send + Sync {
    /// Returns once the rules of `pod` (its IP just allocated here) are in the kernel; an error
    /// fails the ADD, and the allocation is undone.
    async fn admit(&self, pod: &PodRef) -> Result<(), IpamError>;
    /// An attachment was released: its pod's rules go at the next sync (not waited for).
    fn released(&self);
    /// What applies to pod `namespace/name` on this node now, for `eniipamctl policy`.
    async fn explain(&self, namespace: &str, name: &str) -> crate::network_policy::Explanation;
}

impl Ipam {
    /// A pod allocated for in the IPAM role while NetworkPolicy enforcement is on: another plugin
    /// wired it, under names eniipam's rules do not match, so nothing is enforced for it. Counted,
    /// and logged as a warning at the first such ADD and every 100th after (then at debug).
    pub(super) fn unenforced(&self, pod: &PodRef) {
        let n = self.inner.metrics.network_policy.unwired_add();
        if n == 1 || n.is_multiple_of(100) {
            tracing::warn!(
                pod = %format!("{}/{}", pod.namespace, pod.name),
                adds = n,
                "NetworkPolicy is NOT enforced for this pod: eniipam runs as another plugin's IPAM \
                 (\"ipam\": {{\"type\": \"eniipam\"}}), so that plugin wires the pod and eniipam's \
                 rules match nothing of it; run eniipam as the main plugin, or set \
                 network_policy = false and let the parent plugin (Calico, Cilium) enforce policy"
            );
        } else {
            tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), "NetworkPolicy not enforced: IPAM role");
        }
    }
}
