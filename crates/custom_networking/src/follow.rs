//! The controller: the node's ENIConfig, as [`crate::watch`] reads it from the API server, checked
//! against EC2 ([`resolve`]) and handed to the pool through [`PodNetworkSink`] ([`apply`],
//! [`spawn_follower`]).
//!
//! At startup the daemon waits a bounded time ([`first_answer`], [`FIRST_ANSWER`]) for the
//! watcher's first answer, so the first pods do not meet an ENIConfig "not known yet"; the pool
//! starts with creation blocked (its seed never falls back to the node's own subnet) and gets the
//! resolved setting before anything is served. Then a follower applies every change:
//! - a usable ENIConfig: its subnet must exist in the node's VPC and availability zone, and its
//!   security groups in the node's VPC (one DescribeSecurityGroups; none named: eth0's, as the VPC
//!   CNI does);
//! - anything else (the node names no ENIConfig, names one that does not exist, one that is invalid,
//!   or whose subnet or groups EC2 does not know): no new ENI, and every ADD that needs one fails with
//!   a CNI error naming the reason; ENIs the node has keep serving.
//!
//! A change applies to new ENIs only. It is logged (what changed, and how many ENIs of the old
//! setting keep their pods) and counted ([`PodNetworkSink::count_change`]); whether new ENIs can be
//! created is a gauge ([`PodNetworkSink::set_ready`]).
//!
//! EC2 failing transiently (throttled, unreachable) while a change is checked keeps the previous
//! setting and tries again with back-off; the newest ENIConfig wins if it changes meanwhile.

use std::sync::Arc;
use std::time::Duration;

use eniipam_cloud::backoff::RetryPause;
use eniipam_cloud::node_fit::{groups_for_node, subnet_for_node};
use eniipam_cloud::{Cloud, CloudError, NodeContext, Subnet};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::NodeNetwork;

/// How long startup waits for the watcher's first answer (a listed Node and ENIConfigs) before the
/// pool starts with creation blocked; the follower applies the answer when it comes.
pub const FIRST_ANSWER: Duration = Duration::from_secs(10);

/// EC2 back-off while a change cannot be checked: doubling from the first, up to the last.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// What new pod ENIs of this node get, as custom networking resolved it: the daemon's adapter turns
/// it into the pool's own setting (the pool also knows "the discovered subnets", which is not this
/// feature's, so the pool keeps its type and knows nothing of ENIConfigs' checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolvedNetwork {
    /// A usable ENIConfig, checked against EC2.
    Ready {
        /// The ENIConfig's name.
        eni_config: String,
        /// Its `spec.subnet`, as EC2 describes it (in the node's VPC and availability zone).
        subnet: Subnet,
        /// Its `spec.securityGroups`, or eth0's when it names none.
        security_groups: Vec<String>,
    },
    /// The node's ENIConfig cannot be used now: why, for the operator (the log, the pod's CNI error).
    Unavailable { reason: String },
}

impl ResolvedNetwork {
    /// One line for logs: `ENIConfig x (subnet …, security groups sg-…)` or the reason (the pool's
    /// own wording for the same setting).
    pub fn describe(&self) -> String {
        match self {
            Self::Ready {
                eni_config,
                subnet,
                security_groups,
            } => eniipam_cloud::node_fit::describe_eni_config(eni_config, subnet, security_groups),
            Self::Unavailable { reason } => format!("unavailable: {reason}"),
        }
    }
}

/// Where the resolved setting goes: the pool (new ENIs) and the feature's metrics. The daemon
/// implements it over its pool.
pub trait PodNetworkSink: Send + Sync + 'static {
    /// Hands `new` to the pool; what it replaced (`None`: not an ENIConfig's, the discovered subnets).
    fn set_pod_network(&self, new: ResolvedNetwork) -> Option<ResolvedNetwork>;
    /// How many ENIs of the node serve pods from `subnet_id` (they keep their pods when the
    /// ENIConfig changes).
    fn enis_serving_pods_in(&self, subnet_id: &str) -> usize;
    /// Whether new ENIs can be created (`eniipam_pod_network_ready`).
    fn set_ready(&self, ready: bool);
    /// One change of a usable ENIConfig to another (`eniipam_pod_network_changes_total`).
    fn count_change(&self);
}

/// Waits up to [`FIRST_ANSWER`] for the watcher to know the node's ENIConfig.
pub async fn first_answer(rx: &mut watch::Receiver<NodeNetwork>) -> NodeNetwork {
    let known = tokio::time::timeout(FIRST_ANSWER, rx.wait_for(|n| *n != NodeNetwork::Unknown));
    match known.await {
        Ok(Ok(n)) => n.clone(),
        _ => {
            tracing::warn!(
                wait = ?FIRST_ANSWER,
                "custom networking: the node's ENIConfig is not known yet (API server slow or \
                 unreachable); no new ENI until it is"
            );
            NodeNetwork::Unknown
        }
    }
}

/// What the pool should use for `net`: a usable ENIConfig checked against EC2, or why not.
/// `Err` only when EC2 could not answer (throttled, unreachable): try again later.
pub async fn resolve(
    net: &NodeNetwork,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<ResolvedNetwork, CloudError> {
    let unavailable = |reason: String| Ok(ResolvedNetwork::Unavailable { reason });
    let ready = match net {
        NodeNetwork::Unknown => {
            return unavailable(
                "custom networking is on and the node's ENIConfig is not known yet (the API \
                 server has not answered)"
                    .into(),
            );
        }
        NodeNetwork::Unnamed => {
            return unavailable(
                "custom networking is on, but this node names no ENIConfig and there is no \
                 ENIConfig named \"default\": give the node the annotation or label that \
                 eni_config_annotation / eni_config_label name"
                    .into(),
            );
        }
        NodeNetwork::Missing { name } => {
            return unavailable(format!(
                "this node names ENIConfig {name:?}, and no ENIConfig of that name exists \
                 (kubectl get eniconfigs)"
            ));
        }
        NodeNetwork::Invalid { name, why } => {
            return unavailable(format!("ENIConfig {name:?} is not usable: {why}"));
        }
        NodeNetwork::Ready(ready) => ready,
    };
    let who = format!("ENIConfig {:?}", ready.eni_config);
    let subnet = match subnet_for_node(cloud, node, &ready.subnet_id, &who).await? {
        Ok(subnet) => subnet,
        Err(why) => return unavailable(why),
    };
    let security_groups = if ready.security_groups.is_empty() {
        node.security_groups.clone()
    } else {
        // Checked now, so a typo is named here and not by every CreateNetworkInterface.
        if let Err(why) = groups_for_node(cloud, node, &ready.security_groups, &who).await? {
            return unavailable(why);
        }
        ready.security_groups.clone()
    };
    Ok(ResolvedNetwork::Ready {
        eni_config: ready.eni_config.clone(),
        subnet,
        security_groups,
    })
}

/// Hands `new` to the pool, logs and counts what changed.
pub fn apply(sink: &dyn PodNetworkSink, new: ResolvedNetwork) {
    let ready = matches!(new, ResolvedNetwork::Ready { .. });
    sink.set_ready(ready);
    let old = sink.set_pod_network(new.clone());
    if old.as_ref() == Some(&new) {
        return;
    }
    match (&old, &new) {
        (_, ResolvedNetwork::Unavailable { reason }) => {
            tracing::error!(%reason, "custom networking: no new ENI can be created for pods");
        }
        (Some(ResolvedNetwork::Ready { subnet: was, .. }), ResolvedNetwork::Ready { .. }) => {
            sink.count_change();
            let keeping = sink.enis_serving_pods_in(&was.id);
            let from = old
                .as_ref()
                .map(ResolvedNetwork::describe)
                .unwrap_or_default();
            tracing::warn!(
                %from, to = %new.describe(), enis_kept = keeping,
                "custom networking: the node's ENIConfig changed; new ENIs follow it, the ENIs \
                 the node has keep their subnet, groups and pods"
            );
        }
        _ => {
            tracing::info!(network = %new.describe(), "custom networking: new ENIs use the node's ENIConfig")
        }
    }
}

/// Applies every later change of the node's ENIConfig until `cancel`; the value `rx` holds now too
/// when `pending` (startup could not check it against EC2).
pub fn spawn_follower(
    mut rx: watch::Receiver<NodeNetwork>,
    pending: bool,
    sink: Arc<dyn PodNetworkSink>,
    (cloud, node): (Arc<dyn Cloud>, NodeContext),
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !pending {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
        loop {
            let net = rx.borrow_and_update().clone();
            let mut retry = RetryPause::new(RETRY.0, RETRY.1);
            let mut superseded = false;
            loop {
                match resolve(&net, cloud.as_ref(), &node).await {
                    Ok(resolved) => {
                        apply(sink.as_ref(), resolved);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?retry.pause(), "custom networking: cannot check the node's ENIConfig against EC2; the previous setting holds");
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(retry.failed()) => {}
                    // A newer ENIConfig replaces the one being checked.
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        superseded = true;
                        break;
                    }
                }
            }
            if superseded {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    })
}

#[cfg(test)]
mod tests;
