//! Where custom networking (the `eniipam-custom-networking` crate, [`crate::custom_networking`])
//! meets the pool: [`PoolPodNetwork`], the crate's [`PodNetworkSink`] over the pool and the daemon's
//! metrics, converting the crate's [`ResolvedNetwork`] into the pool's [`PodNetwork`] and back. The
//! ENIConfig's watch, its checks against EC2, the follower and its logs are the crate's
//! ([`crate::custom_networking::follow`]); `Daemon::start` wires them in its order.

use crate::custom_networking::{PodNetworkSink, ResolvedNetwork};
use crate::metrics::Metrics;
use crate::pool::{PodNetwork, Pool};

/// The pool and the metrics, as custom networking's controller sees them.
pub(super) struct PoolPodNetwork {
    pub pool: Pool,
    pub metrics: Metrics,
}

impl PodNetworkSink for PoolPodNetwork {
    fn set_pod_network(&self, new: ResolvedNetwork) -> Option<ResolvedNetwork> {
        let new = match new {
            ResolvedNetwork::Ready {
                eni_config,
                subnet,
                security_groups,
            } => PodNetwork::Custom {
                eni_config,
                subnet,
                security_groups,
            },
            ResolvedNetwork::Unavailable { reason } => PodNetwork::Unavailable { reason },
        };
        match self.pool.set_pod_network(new) {
            PodNetwork::Discovered => None,
            PodNetwork::Custom {
                eni_config,
                subnet,
                security_groups,
            } => Some(ResolvedNetwork::Ready {
                eni_config,
                subnet,
                security_groups,
            }),
            PodNetwork::Unavailable { reason } => Some(ResolvedNetwork::Unavailable { reason }),
        }
    }

    fn enis_serving_pods_in(&self, subnet_id: &str) -> usize {
        let snapshot = self.pool.snapshot();
        let serving = snapshot.enis.iter();
        serving
            .filter(|e| e.serves_pods && e.subnet_id == subnet_id)
            .count()
    }

    fn set_ready(&self, ready: bool) {
        self.metrics.pod_network_ready.set(i64::from(ready));
    }

    fn count_change(&self) {
        self.metrics.pod_network_changes.inc();
    }
}
