//! Custom networking in the daemon: the node's ENIConfig, as [`crate::custom_networking`] reads it
//! from the API server, checked against EC2 and handed to the pool ([`Pool::set_pod_network`]).
//!
//! At startup the daemon waits a bounded time ([`FIRST_ANSWER`]) for the watcher's first answer, so
//! the first pods do not meet an ENIConfig "not known yet"; the pool starts with creation blocked
//! (its seed never falls back to the node's own subnet) and gets the resolved setting before anything
//! is served. Then a follower applies every change:
//! - a usable ENIConfig: its subnet must exist in the node's VPC and availability zone, and its
//!   security groups in the node's VPC (one DescribeSecurityGroups; none named: eth0's, as the VPC
//!   CNI does);
//! - anything else (the node names no ENIConfig, names one that does not exist, one that is invalid,
//!   or whose subnet or groups EC2 does not know): no new ENI, and every ADD that needs one fails with
//!   a CNI error naming the reason; ENIs the node has keep serving.
//!
//! A change applies to new ENIs only. It is logged (what changed, and how many ENIs of the old
//! setting keep their pods) and counted (`eniipam_pod_network_changes_total`);
//! `eniipam_pod_network_ready` says whether new ENIs can be created.
//!
//! EC2 failing transiently (throttled, unreachable) while a change is checked keeps the previous
//! setting and tries again with back-off; the newest ENIConfig wins if it changes meanwhile.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::backoff::RetryPause;
use crate::cloud::{Cloud, CloudError, NodeContext, Subnet, SubnetFilter};
use crate::custom_networking::{self as cn, NodeNetwork};
use crate::metrics::Metrics;
use crate::pool::{PodNetwork, Pool};

/// How long startup waits for the watcher's first answer (a listed Node and ENIConfigs) before the
/// pool starts with creation blocked; the follower applies the answer when it comes.
pub(super) const FIRST_ANSWER: Duration = Duration::from_secs(10);

/// EC2 back-off while a change cannot be checked: doubling from the first, up to the last.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Waits up to [`FIRST_ANSWER`] for the watcher to know the node's ENIConfig.
pub(super) async fn first_answer(rx: &mut watch::Receiver<NodeNetwork>) -> NodeNetwork {
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
pub(super) async fn resolve(
    net: &NodeNetwork,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<PodNetwork, CloudError> {
    let unavailable = |reason: String| Ok(PodNetwork::Unavailable { reason });
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
    Ok(PodNetwork::Custom {
        eni_config: ready.eni_config.clone(),
        subnet,
        security_groups,
    })
}

/// Subnet `id` as EC2 describes it, if new ENIs of this node may use it: it exists, in the node's
/// VPC and availability zone. `Ok(Err(why))` names `who` (the object that chose it) and what is
/// wrong; `Err` only when EC2 failed transiently.
pub(super) async fn subnet_for_node(
    cloud: &dyn Cloud,
    node: &NodeContext,
    id: &str,
    who: &str,
) -> Result<Result<Subnet, String>, CloudError> {
    let filter = SubnetFilter {
        ids: vec![id.to_owned()],
        ..SubnetFilter::default()
    };
    let subnet = match cloud.describe_subnets(&filter).await {
        Ok(found) => found.into_iter().find(|s| s.id == id),
        Err(e) if e.is_transient() => return Err(e),
        Err(CloudError::NotFound { .. }) => None,
        Err(CloudError::Rejected { code, .. }) if code.contains("NotFound") => None,
        Err(e) => {
            return Ok(Err(format!(
                "{who}: EC2 refused to describe its subnet {id}: {e}"
            )));
        }
    };
    let Some(subnet) = subnet else {
        return Ok(Err(format!(
            "{who} names subnet {id}, which EC2 does not know"
        )));
    };
    Ok(in_node_zone(subnet, node, who))
}

/// `subnet` if it is in the node's VPC and availability zone, else why not.
fn in_node_zone(subnet: Subnet, node: &NodeContext, who: &str) -> Result<Subnet, String> {
    if subnet.vpc_id != node.vpc_id || subnet.availability_zone != node.availability_zone {
        return Err(format!(
            "{who} names subnet {} in {} ({}), but this node is in {} ({}): an ENI can only use a \
             subnet of the instance's own availability zone and VPC (one object per zone is the \
             usual layout)",
            subnet.id, subnet.availability_zone, subnet.vpc_id, node.availability_zone, node.vpc_id
        ));
    }
    Ok(subnet)
}

/// Of `zone` (the subnets of the node's VPC and zone), the one that carries every one of `tags`
/// (several: the one with the most free addresses, then the lowest id, so every node of the zone
/// agrees while they are equal); else why none, naming `who`.
pub(super) fn subnet_by_tags(
    zone: &[Subnet],
    node: &NodeContext,
    tags: &std::collections::BTreeMap<String, String>,
    who: &str,
) -> Result<Subnet, String> {
    let best = zone
        .iter()
        .filter(|s| s.vpc_id == node.vpc_id && s.availability_zone == node.availability_zone)
        .filter(|s| tags.iter().all(|(k, v)| s.tags.get(k) == Some(v)))
        .max_by(|a, b| {
            a.available_ips
                .cmp(&b.available_ips)
                .then_with(|| b.id.cmp(&a.id))
        });
    best.cloned().ok_or_else(|| {
        let wanted: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "{who}: no subnet of {} in {} carries the tags {}",
            node.availability_zone,
            node.vpc_id,
            wanted.join(",")
        )
    })
}

/// `Ok(Ok(()))` when every one of `groups` exists in the node's VPC (one DescribeSecurityGroups),
/// else why not, naming `who`; `Err` only when EC2 failed transiently.
pub(super) async fn groups_for_node(
    cloud: &dyn Cloud,
    node: &NodeContext,
    groups: &[String],
    who: &str,
) -> Result<Result<(), String>, CloudError> {
    let found = match cloud.describe_security_groups(groups).await {
        Ok(found) => found,
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => {
            return Ok(Err(format!(
                "{who} names security groups {} that EC2 does not show: {e}",
                groups.join(",")
            )));
        }
    };
    if let Some(missing) = groups.iter().find(|g| !found.iter().any(|f| &f.id == *g)) {
        return Ok(Err(format!(
            "{who} names security group {missing}, which EC2 does not show"
        )));
    }
    if let Some(g) = found.iter().find(|g| g.vpc_id != node.vpc_id) {
        return Ok(Err(format!(
            "{who} names security group {} of {}, but this node's VPC is {}",
            g.id, g.vpc_id, node.vpc_id
        )));
    }
    Ok(Ok(()))
}

/// Hands `new` to the pool, logs and counts what changed.
pub(super) fn apply(pool: &Pool, metrics: &Metrics, new: PodNetwork) {
    let ready = matches!(new, PodNetwork::Custom { .. });
    metrics.pod_network_ready.set(i64::from(ready));
    let old = pool.set_pod_network(new.clone());
    if old == new {
        return;
    }
    match (&old, &new) {
        (_, PodNetwork::Unavailable { reason }) => {
            tracing::error!(%reason, "custom networking: no new ENI can be created for pods");
        }
        (PodNetwork::Custom { subnet: was, .. }, PodNetwork::Custom { .. }) => {
            metrics.pod_network_changes.inc();
            let keeping = pool
                .snapshot()
                .enis
                .iter()
                .filter(|e| e.serves_pods && e.subnet_id == was.id)
                .count();
            tracing::warn!(
                from = %old.describe(), to = %new.describe(), enis_kept = keeping,
                "custom networking: the node's ENIConfig changed; new ENIs follow it, the ENIs \
                 the node has keep their subnet, groups and pods"
            );
        }
        _ => {
            tracing::info!(network = %new.describe(), "custom networking: new ENIs use the node's ENIConfig")
        }
    }
}

/// Starts the ENIConfig watcher for this node.
pub(super) fn watch(
    client: kube::Client,
    node_name: &str,
    selector: cn::Selector,
) -> (watch::Receiver<NodeNetwork>, JoinHandle<()>) {
    cn::spawn(client, node_name.to_owned(), selector)
}

/// Applies every later change of the node's ENIConfig until `cancel`; the value `rx` holds now too
/// when `pending` (startup could not check it against EC2).
pub(super) fn spawn_follower(
    mut rx: watch::Receiver<NodeNetwork>,
    pending: bool,
    pool: Pool,
    cloud: Arc<dyn Cloud>,
    node: NodeContext,
    metrics: Metrics,
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
                        apply(&pool, &metrics, resolved);
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
