//! Startup steps 2 to 4: the state file, the node's identity and the subnets its ENIs may use, and the
//! rebuild from the file, IMDS, EC2 and the host.

use std::future::Future;
use std::time::Duration;

use ipnet::Ipv4Net;

use super::{CloudClients, DaemonError};
use crate::cloud::backoff::BackoffPolicy;
use crate::cloud::{Eni, Instance, InstanceLimits, NodeContext};
use crate::config::DaemonConfig;
use crate::metrics::Metrics;
use crate::pool::PoolSeed;
use crate::reconcile::{self, ReconcileReport};
use crate::store::Store;

/// How long the startup rides out EC2 being slow (throttled, failing transiently) before it gives up.
const STARTUP_PATIENCE: Duration = Duration::from_secs(10 * 60);
/// The ceiling of the first wait before a startup step is tried again; it doubles up to
/// [`STARTUP_RETRY_CAP`].
const STARTUP_RETRY_FIRST: Duration = Duration::from_secs(1);
const STARTUP_RETRY_CAP: Duration = Duration::from_secs(30);

/// Whether a startup step failed only because EC2 (or IMDS) was slow: throttled, or a transient
/// failure, after the limiter's own retries.
fn ec2_was_slow(err: &DaemonError) -> bool {
    matches!(err, DaemonError::Cloud(e) if e.is_transient())
}

/// Runs a startup step (node discovery, the rebuild) until it succeeds, trying it again after the
/// project's full-jitter back-off (`cloud::backoff`, 1 s doubling to 30 s) while it fails only
/// because EC2 is slow, for up to [`STARTUP_PATIENCE`]; any other failure ends the start at once. A
/// fleet whose nodes boot together (a Karpenter or cluster-autoscaler scale-up) shares the account's
/// buckets: the limiter's six attempts can run out on a describe, and a daemon that exited for it
/// would be restarted by the kubelet under a crash-loop back-off of up to 5 minutes, its node not
/// Ready all the while (found by the fleet benchmark's node-boot pattern at 500 nodes). Nothing is
/// served before the step succeeds, and a step is safe to run again (the rebuild writes the state
/// file only at its end).
pub(super) async fn patiently<T, F, Fut>(step: &str, mut run: F) -> Result<T, DaemonError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DaemonError>>,
{
    let mut backoff =
        BackoffPolicy::polling(STARTUP_RETRY_FIRST, STARTUP_RETRY_CAP, STARTUP_PATIENCE).start();
    loop {
        let err = match run().await {
            Ok(v) => return Ok(v),
            Err(err) if ec2_was_slow(&err) => err,
            Err(err) => return Err(err),
        };
        let Some(pause) = backoff.next_delay() else {
            return Err(err);
        };
        tracing::warn!(
            step,
            tries = backoff.attempts() - 1,
            error = %err,
            retry_in_ms = pause.as_millis() as u64,
            "EC2 is slow at startup (throttled or failing transiently): trying the step again"
        );
        tokio::time::sleep(pause).await;
    }
}

/// Step 2: the state file (a corrupt one is moved aside and rebuilt). Returns whether it was lost
/// (created afresh or moved aside): the rebuild then trusts nothing but EC2 and the host's evidence.
pub(super) async fn open_store(config: &DaemonConfig) -> Result<(Store, bool), DaemonError> {
    let (store, opened) = Store::open(&config.state_path).await?;
    if let Some(aside) = &opened.moved_aside {
        tracing::error!(
            path = %config.state_path.display(), moved_to = %aside.display(),
            "STATE FILE WAS CORRUPT: moved aside for inspection; rebuilding from IMDS, EC2 and the host"
        );
    }
    let mut lost = opened.created || opened.moved_aside.is_some();
    // A file no rebuild ever completed in (a life killed between creating it and writing its
    // first rebuild, which records the instance with everything else in one transaction) holds
    // nothing the next rebuild may trust: as lost as a missing one. Read as kept, its silence
    // dropped the live pods the plugin's cache still shows (the soak, seed 8: a SIGKILL right
    // after the state file's removal).
    if !lost && store.load().await?.instance_id.is_none() {
        tracing::warn!(path = %config.state_path.display(),
            "the state file records no completed rebuild (its first life was cut short): rebuilding as if it were lost");
        lost = true;
    }
    Ok((store, lost))
}

/// Beside the state file, the instance a daemon first completed a rebuild on (`state.db` →
/// `state.started`): a start that finds none (or another instance's) is the instance's first, so
/// the addresses it came with never served a pod here. It is not in the state file because losing
/// that file is exactly when the difference matters.
pub(super) fn start_marker(state_path: &std::path::Path) -> std::path::PathBuf {
    state_path.with_extension("started")
}

/// Step 3: who we are (IMDS), and what EC2 says about us: instance type, limits, eth0, and the
/// subnets new ENIs may go to. The instance as EC2 described it comes back too, so the rebuild's
/// first describe of the node's ENIs and the IPv6 step's look at eth0's /80 reuse this one
/// DescribeInstances instead of making more at every node boot (a fleet's boot shares the
/// account's DescribeInstances bucket, 100 + 20/s: two calls a node throttled 500 booting nodes).
pub(super) async fn discover_node(
    config: &DaemonConfig,
    clients: &CloudClients,
) -> Result<(NodeContext, Instance), DaemonError> {
    let identity = clients.metadata.identity().await?;
    let instance = clients
        .cloud
        .describe_instance(&identity.instance_id)
        .await?;
    // The shipped catalogue has EC2's figures for the types it knows: no DescribeInstanceTypes at
    // every node boot (a fleet's scale-up shares the account's bucket); an unknown type asks EC2.
    let limits = match InstanceLimits::from_catalog(&instance.instance_type) {
        Some(l) => l,
        None => {
            clients
                .cloud
                .instance_limits(&instance.instance_type)
                .await?
        }
    };
    if config.prefix_delegation && !limits.nitro {
        return Err(DaemonError::Config(format!(
            "prefix_delegation (ENIIPAM_PREFIX_DELEGATION) needs a Nitro instance type; {} is not one: \
             turn it off for this node group",
            instance.instance_type
        )));
    }
    let eth0 = eth0_of(&instance)
        .ok_or_else(|| DaemonError::NoPrimaryEni(identity.instance_id.clone()))?;
    let subnet_id = config
        .subnet_id
        .clone()
        .unwrap_or_else(|| eth0.subnet_id.clone());
    let pod_subnets = pod_subnets(config, clients, &instance, &subnet_id).await?;
    let node = NodeContext {
        cluster_name: config.cluster_name.clone(),
        instance_id: identity.instance_id.clone(),
        instance_type: instance.instance_type.clone(),
        availability_zone: instance.availability_zone.clone(),
        vpc_id: instance.vpc_id.clone(),
        subnet_id,
        security_groups: if config.security_groups.is_empty() {
            eth0.security_groups.clone()
        } else {
            config.security_groups.clone()
        },
        limits,
        pod_subnets,
    };
    Ok((node, instance))
}

/// The instance's eth0 (device 0), as EC2 described it.
pub(super) fn eth0_of(instance: &Instance) -> Option<&Eni> {
    instance
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
}

/// The AWS VPC CNI's subnet tag: `0` excludes a subnet, any other value includes it.
pub const SUBNET_ROLE_TAG: &str = "kubernetes.io/role/cni";
/// The AWS VPC CNI's cluster-scoped subnet tags (`cni.networking.k8s.aws/cluster/<cluster name>`,
/// any value; amazon-vpc-cni-k8s #3647): a subnet carrying one or more of them is discovered only by
/// the clusters they name, so two clusters in one VPC never share a pod subnet by accident.
pub const SUBNET_CLUSTER_TAG_PREFIX: &str = "cni.networking.k8s.aws/cluster/";

/// Whether a discovered subnet's cluster tags let `cluster_name` use it: it carries none, or one
/// naming this cluster. With no cluster name configured, a subnet reserved for named clusters is
/// not taken either (the daemon cannot tell it is one of them).
pub fn subnet_open_to_cluster(
    tags: &std::collections::BTreeMap<String, String>,
    cluster_name: &str,
) -> bool {
    let mut scoped = tags
        .keys()
        .filter_map(|k| k.strip_prefix(SUBNET_CLUSTER_TAG_PREFIX))
        .peekable();
    scoped.peek().is_none() || (!cluster_name.is_empty() && scoped.any(|c| c == cluster_name))
}

/// The subnets new ENIs may go to: `subnet_ids` when configured (each must be in the node's VPC and
/// availability zone: a clear error otherwise); else the VPC's subnets in the node's availability
/// zone tagged `kubernetes.io/role/cni` (not `0`) and open to this cluster (no
/// `cni.networking.k8s.aws/cluster/*` tag, or one naming it), plus the node's own subnet unless
/// tagged `0`. When EC2 cannot list them, the node's own subnet alone. With custom networking, none:
/// the node's ENIConfig names the subnet (the VPC CNI bypasses discovery then too).
async fn pod_subnets(
    config: &DaemonConfig,
    clients: &CloudClients,
    instance: &crate::cloud::Instance,
    own: &str,
) -> Result<Vec<crate::cloud::Subnet>, DaemonError> {
    use crate::cloud::SubnetFilter;
    if config.custom_networking {
        return Ok(Vec::new());
    }
    if !config.subnet_ids.is_empty() {
        let found = clients
            .cloud
            .describe_subnets(&SubnetFilter {
                ids: config.subnet_ids.clone(),
                ..SubnetFilter::default()
            })
            .await?;
        for id in &config.subnet_ids {
            let Some(s) = found.iter().find(|s| &s.id == id) else {
                return Err(DaemonError::Config(format!(
                    "subnet_ids: {id} does not exist (or the node may not describe it)"
                )));
            };
            if s.availability_zone != instance.availability_zone || s.vpc_id != instance.vpc_id {
                return Err(DaemonError::Config(format!(
                    "subnet_ids: {id} is in {} ({}), but this node is in {} ({}): an ENI can only use \
                     a subnet of the instance's own availability zone and VPC",
                    s.availability_zone, s.vpc_id, instance.availability_zone, instance.vpc_id
                )));
            }
        }
        return Ok(config
            .subnet_ids
            .iter()
            .filter_map(|id| found.iter().find(|s| &s.id == id).cloned())
            .collect());
    }
    let listed = clients
        .cloud
        .describe_subnets(&SubnetFilter {
            vpc_id: Some(instance.vpc_id.clone()),
            availability_zone: Some(instance.availability_zone.clone()),
            ..SubnetFilter::default()
        })
        .await;
    let subnets = match listed {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the availability zone's subnets: new ENIs go to the node's own");
            return Ok(Vec::new());
        }
    };
    let mut chosen: Vec<crate::cloud::Subnet> = subnets
        .into_iter()
        .filter(|s| match s.tags.get(SUBNET_ROLE_TAG).map(String::as_str) {
            Some("0") => false,
            Some(_) => true,
            None => s.id == own,
        })
        // The node's own subnet is the node's launch choice, whatever cluster tags it carries.
        .filter(|s| {
            let open = s.id == own || subnet_open_to_cluster(&s.tags, &config.cluster_name);
            if !open {
                tracing::info!(subnet = %s.id, cluster = %config.cluster_name, "subnet tagged for other clusters (cni.networking.k8s.aws/cluster/*): not used");
            }
            open
        })
        .collect();
    // The node's own subnet first among equals.
    chosen.sort_by_key(|s| s.id != own);
    if chosen.len() > 1 {
        tracing::info!(subnets = ?chosen.iter().map(|s| &s.id).collect::<Vec<_>>(), "subnets for new ENIs");
    }
    Ok(chosen)
}

/// Step 4: rebuild from the file, IMDS, EC2 and the host, and make the file equal the truth before
/// anything is served. Returns the pool's seed, the report and the VPC's CIDRs.
pub(super) async fn rebuild(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    (store, state_lost): (&Store, bool),
    metrics: &Metrics,
    described: Option<Instance>,
) -> Result<(PoolSeed, ReconcileReport, Vec<Ipv4Net>), DaemonError> {
    let stored = store.load().await?;
    let ec2_changes = store.load_ec2_changes().await?;
    // A change of the last minute may not show in EC2's describes yet: what they taught the client
    // is forgotten, and they teach it nothing until the minute has passed.
    let now_ms = crate::clock::unix_ms_now();
    if let Some(newest) = ec2_changes.iter().map(|c| c.at_ms).max()
        && newest + crate::cloud::DESCRIBE_SETTLES.as_millis() as u64 > now_ms
    {
        let at = crate::clock::instant_from_unix_ms(newest, tokio::time::Instant::now(), now_ms);
        clients.cloud.changed_before_start(at);
    }
    let netns = reconcile::NetnsView::of(&config.netns_dirs);
    let host = reconcile::host_evidence(&config.cni_cache_dir, &netns);
    let marker = start_marker(&config.state_path);
    let first_start = std::fs::read_to_string(&marker)
        .map_or(true, |started_on| started_on.trim() != node.instance_id);
    let rebuilt = reconcile::rebuild(
        clients.cloud.as_ref(),
        clients.metadata.as_ref(),
        &node.instance_id,
        reconcile::Inputs {
            stored,
            state_lost,
            first_start,
            host: &host,
            netns: &netns,
            use_primary_eni: config.eth0_serves_pods(),
            ec2_changes,
            described,
        },
    )
    .await?;
    let report = rebuilt.report;
    metrics
        .reconcile_dropped
        .inc_by(report.dropped_gone.len() as u64);
    metrics
        .reconcile_released
        .inc_by(report.released_dead.len() as u64);
    metrics.reconcile_unknown.inc_by(report.unknown_ips as u64);
    if !report.quarantined.is_empty() && report.state_lost && host.cache_visible {
        tracing::warn!(
            quarantined = report.quarantined.len(),
            "the state file was lost: IPs on our ENIs that no live pod claims are held (neither handed \
             out nor given back) until a describe a minute from now still shows them (EC2's describes \
             lag its changes, and one may be an IP given back just before the restart)"
        );
    } else if !report.quarantined.is_empty() {
        tracing::error!(
            quarantined = report.quarantined.len(),
            cache = %config.cni_cache_dir.display(),
            "the state file was lost and the plugin's result cache is not visible: IPs on our ENIs are \
             QUARANTINED (neither handed out nor given back) until the cache is visible or an operator \
             clears them (eniipamctl quarantine release)"
        );
    }
    if report.foreign_state {
        tracing::warn!("the state file belonged to another instance: ignored");
    }
    // What the plugin's cache placed (live pods' IPs, the file lost) is journalled as EC2's: the
    // describe may not show it yet, and once the file records those pods a restart within the
    // minute trusts only the journal for what the describe does not show.
    let mut adopted: std::collections::BTreeMap<&str, Vec<std::net::Ipv4Addr>> = Default::default();
    for (_, ip) in &report.adopted {
        if let Some(a) = rebuilt.state.assignments.iter().find(|a| a.ip == *ip) {
            adopted.entry(a.eni_id.as_str()).or_default().push(*ip);
        }
    }
    let adopted: Vec<(crate::model::EniId, Vec<std::net::Ipv4Addr>)> = adopted
        .into_iter()
        .filter_map(|(eni, ips)| Some((eni.parse().ok()?, ips)))
        .collect();
    store.replace_all(rebuilt.state).await?;
    if report.fresh_ips > 0 {
        tracing::info!(
            addresses = report.fresh_ips,
            "first start on this instance, no pod on the host: the addresses it was launched with are idle at once"
        );
    }
    if first_start {
        // From now on a lost state file is a loss, not a first start. A marker that cannot be
        // written only costs the next start the fresh addresses' head start.
        if let Err(e) = std::fs::write(&marker, &node.instance_id) {
            tracing::warn!(path = %marker.display(), error = %e, "cannot write the start marker");
        }
    }
    let journal = crate::ipam::StoreJournal::new(store.clone());
    for (eni, ips) in &adopted {
        crate::pool::ChangeJournal::assigned(&journal, eni, ips, &[]).await;
    }
    let vpc_cidrs = clients
        .metadata
        .primary_interface()
        .await?
        .map(|m| m.vpc_cidrs)
        .unwrap_or_default();
    Ok((rebuilt.seed, report, vpc_cidrs))
}
