//! The running reconcile, every period: gathers a [`Snapshot`] of the pool, the host and EC2,
//! [`decide`]s, and [`apply`]s the decisions through the IPAM service; then the same for the state
//! file against the pool (see [`super::decide`] for what is decided).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::apply::apply;
use super::decide::{AssignBackAnswer, Drift, Memory, Prefix6Step, Snapshot, decide, decide_store};
use super::evidence::{NetnsView, host_evidence};
use super::report::PassReport;
use crate::clock::unix_ms_now;
use crate::cloud::{ADDRESS_IN_USE, AttachmentStatus, Cloud, CloudError, Eni, Metadata};
use crate::ipam::Ipam;
use crate::model::{AttachmentKey, EniId};
use crate::pool::snapshot::{IpState, PoolSnapshot};

/// Where the pass looks on the host.
#[derive(Clone, Debug)]
pub struct HostView {
    /// The plugin's result cache root.
    pub cni_cache_dir: PathBuf,
    /// Directories holding pod network namespaces that the daemon may see.
    pub netns_dirs: Vec<PathBuf>,
}

/// The node whose ENIs the pass compares, and where their ids come from.
pub struct NodeEnis<'a> {
    pub instance_id: &'a str,
    pub vpc_id: &'a str,
    /// IMDS, which lists the ENIs attached here (an ENI attached out of band shows there within its
    /// lag). `None`, or IMDS failing: the pass describes by filter, every ENI of the VPC paged.
    pub metadata: Option<&'a dyn Metadata>,
}

impl NodeEnis<'_> {
    /// The ENIs EC2 shows attached here, by the ids the pool and IMDS know (one describe call, not
    /// one per 1,000 ENIs of the region): every ENI the pool holds, and every one IMDS lists, the
    /// ENIs attached out of band among them. Without IMDS's answer, the describe by filter.
    async fn describe(
        &self,
        cloud: &dyn Cloud,
        pool: &PoolSnapshot,
    ) -> Result<Vec<Eni>, CloudError> {
        let imds = match self.metadata {
            Some(m) => match m.interfaces().await {
                Ok(list) => Some(list),
                Err(e) => {
                    tracing::debug!(error = %e, "IMDS did not list the interfaces: describing the node's ENIs by filter");
                    None
                }
            },
            None => None,
        };
        let known: Vec<EniId> = match imds {
            Some(list) => list
                .into_iter()
                .map(|m| m.eni_id)
                .chain(pool.enis.iter().map(|e| e.id.clone()))
                .collect(),
            None => Vec::new(),
        };
        cloud
            .describe_attached(self.instance_id, self.vpc_id, &known)
            .await
    }
}

/// One pass; see the module docs. Releases assignments whose network namespace is gone or whose pod
/// the API server says is gone (`api`, when that source is on: pods that died without a DEL), then
/// compares the pool with EC2, then the state file with the pool. EC2 errors end the pass after the
/// host's drifts (the next one tries again); store errors are logged and the pass goes on.
pub async fn pass(
    ipam: &Ipam,
    cloud: &dyn Cloud,
    node: &NodeEnis<'_>,
    host: &HostView,
    memory: &mut Memory,
    api: Option<&super::api_server::ApiServerGc>,
) -> Result<PassReport, CloudError> {
    let mut report = PassReport::default();
    let netns = NetnsView::of(&host.netns_dirs);
    let instance_id = node.instance_id;
    let described = node.describe(cloud, &ipam.pool().snapshot()).await;
    let (ec2, ec2_error) = match described {
        Ok(enis) => (Some(attached_here(enis, instance_id)), None),
        Err(e) => (None, Some(e)),
    };
    if let Some(enis) = &ec2 {
        let shown: std::collections::BTreeSet<std::net::Ipv4Addr> =
            enis.values().flat_map(|e| e.pod_addresses()).collect();
        ipam.pool().confirm_shown(&shown);
    }
    let snapshot = gather(ipam.pool().snapshot(), &netns, &host.cni_cache_dir, ec2);
    let mut drifts = decide(&snapshot, memory);
    report.decided = drifts.clone();
    // In the order decided: dead pods first, then the API server's gone pods (which the host's
    // word must not find already released), then quarantine; EC2's drifts only when it answered.
    let dead = take_leading(&mut drifts, |d| matches!(d, Drift::NetnsGone { .. }));
    apply(ipam, cloud, dead, &mut report).await;
    release_dead_ipv6(ipam, &netns, &mut report).await;
    if let (Some(p), Some(enis)) = (ipam.ipv6(), &snapshot.ec2) {
        check_ipv6_prefix(cloud, p, enis, memory, &mut report).await;
    }
    report.released_gone_from_api = super::api_server::release_gone_pods(ipam, api, &netns).await;
    let quarantine = take_leading(&mut drifts, Drift::from_host);
    apply(ipam, cloud, quarantine, &mut report).await;
    if let Some(e) = ec2_error {
        return Err(e);
    }
    apply(ipam, cloud, drifts, &mut report).await;
    match ipam.store().load().await {
        Ok(stored) => {
            let pool = ipam.pool().snapshot();
            let repair = decide_store(&pool, &stored, unix_ms_now(), memory);
            report.decided.extend(repair.clone());
            apply(ipam, cloud, repair.into_iter().collect(), &mut report).await;
        }
        Err(e) => tracing::error!(error = %e, "cannot compare the state file with the pool"),
    }
    if !report.missing_in_ec2.is_empty()
        || !report.unknown_to_pool.is_empty()
        || !report.lost.is_empty()
    {
        tracing::warn!(
            missing_in_ec2 = ?report.missing_in_ec2, unknown_to_pool = ?report.unknown_to_pool,
            lost = ?report.lost,
            "the pool and EC2 disagree (changed out of band?): what EC2 misses twice is forgotten; \
             IPs unknown to the pool are adopted at the next restart"
        );
    }
    Ok(report)
}

/// The node's /80 as EC2 shows it. Gone from its ENI, which has no other /80: assigned back by value
/// (one call, through the limiter), so its pods' addresses route again and nothing is lost. EC2's
/// definitive refusal (another ENI took it meanwhile) is remembered: reported every pass, asked no
/// more while the describe does not show it. "In use" is final only once a describe had a minute to
/// show the /80 on eth0 (EC2's describes lag: assigned back moments ago, it is eth0's own;
/// [`Prefix6Memory`]). Another /80 on the ENI (someone else's doing): only reported.
async fn check_ipv6_prefix(
    cloud: &dyn Cloud,
    p: &crate::ipv6::Ipv6Pool,
    enis: &BTreeMap<EniId, Eni>,
    memory: &mut Memory,
    report: &mut PassReport,
) {
    let prefix = p.prefix();
    let shown = enis.values().any(|e| e.ipv6_prefixes.contains(&prefix));
    let eth0 = enis
        .iter()
        .find(|(id, e)| id.as_str() == p.eni_id && e.ipv6_prefixes.is_empty());
    let now = tokio::time::Instant::now();
    match memory.ipv6.step(prefix, shown, eth0.is_some(), now) {
        Prefix6Step::InPlace => return,
        Prefix6Step::Settling => {
            tracing::info!(%prefix, eni = %p.eni_id,
                "EC2's describe does not show the node's /80 on eth0 yet, and EC2 answered it in use: \
                 taken as eth0's own (assigned back moments ago) while the describe settles");
            report.ipv6_prefix_settling = true;
            return;
        }
        Prefix6Step::Missing => {}
        Prefix6Step::AssignBack => {
            let id = &eth0.expect("AssignBack only with eth0 free").0.clone();
            let result = cloud.assign_specific_ipv6_prefixes(id, &[prefix]).await;
            let answer = match &result {
                Ok(_) => AssignBackAnswer::Assigned,
                Err(CloudError::Rejected { code, .. }) if code == ADDRESS_IN_USE => {
                    AssignBackAnswer::InUse
                }
                Err(e) if crate::ipv6::prefix::refused_for_good(e) => AssignBackAnswer::Refused,
                Err(_) => AssignBackAnswer::Failed,
            };
            let refused = memory.ipv6.answered(prefix, answer, now);
            match result {
                Ok(_) => {
                    report.ipv6_prefix_reclaimed = true;
                    tracing::warn!(%prefix, eni = %id,
                        "the node's IPv6 /80 was gone from its ENI in EC2 (unassigned out of band?) and is \
                         assigned back: IPv6 pods on this node route again");
                    return;
                }
                Err(err) if refused => {
                    tracing::error!(%prefix, eni = %id, error = %err,
                        "the node's IPv6 /80 is gone from its ENI and EC2 refuses to give it back: IPv6 \
                         pods on this node no longer route; restart eniipamd to take a new /80");
                }
                Err(err) if answer == AssignBackAnswer::InUse => {
                    tracing::info!(%prefix, eni = %id, error = %err,
                        "EC2 answers the node's /80 in use while its describe does not show it on eth0: \
                         taken as eth0's own (EC2's describes lag) until a describe has had a minute to show it");
                    report.ipv6_prefix_settling = true;
                    return;
                }
                Err(err) => {
                    tracing::warn!(%prefix, eni = %id, error = %err,
                        "could not assign the node's lost IPv6 /80 back; trying again next pass");
                }
            }
        }
    }
    if eth0.is_none() {
        tracing::error!(%prefix, eni = %p.eni_id,
            "the node's IPv6 /80 is gone from its ENI in EC2 and the ENI has another (or is not \
             attached here): IPv6 pods on this node no longer route; restart eniipamd to take it on");
    }
    report.ipv6_prefix_missing = true;
}

/// Releases IPv6-only attachments (those the pool does not hold: `ip_family = ipv6`) whose pod
/// network namespace is provably gone, as the pool's dead pods are (dual-stack attachments go with
/// their IPv4, through `Drift::NetnsGone`).
async fn release_dead_ipv6(ipam: &Ipam, netns: &NetnsView, report: &mut PassReport) {
    let Some(p) = ipam.ipv6() else {
        return;
    };
    let pool = ipam.pool();
    let dead: Vec<(AttachmentKey, std::net::Ipv6Addr, String)> = p.with(|b| {
        b.held()
            .filter(|(k, h)| {
                pool.allocation(k).is_none()
                    && netns.state(&h.meta.netns) == super::evidence::NetnsState::Gone
            })
            .map(|(k, h)| (k.clone(), h.ip, h.meta.netns.clone()))
            .collect()
    });
    for (key, ip, ns) in dead {
        if let Ok(Some(_)) = ipam.release_dead(&key).await {
            tracing::info!(attachment = %key, %ip, netns = %ns, "pod network namespace is gone: released");
            report.released_dead_ipv6.push((key, ip));
        }
    }
}

/// Removes the drifts at the front of `drifts` that `f` selects and returns them.
fn take_leading(drifts: &mut Vec<Drift>, f: impl Fn(&Drift) -> bool) -> Vec<Drift> {
    let n = drifts.iter().take_while(|d| f(d)).count();
    drifts.drain(..n).collect()
}

/// The ENIs EC2 shows attached (or attaching) to `instance_id`.
fn attached_here(enis: Vec<Eni>, instance_id: &str) -> BTreeMap<EniId, Eni> {
    enis.into_iter()
        .filter(|e| {
            e.attachment.as_ref().is_some_and(|a| {
                a.instance_id == instance_id
                    && matches!(
                        a.status,
                        AttachmentStatus::Attached | AttachmentStatus::Attaching
                    )
            })
        })
        .map(|e| (e.id.clone(), e))
        .collect()
}

/// What the host says, for the pool as it is: the network namespace of every attachment holding an
/// IP, and the plugin's result cache while the pool holds quarantined IPs.
fn gather(
    pool: PoolSnapshot,
    netns: &NetnsView,
    cni_cache_dir: &Path,
    ec2: Option<BTreeMap<EniId, Eni>>,
) -> Snapshot {
    let mut states = BTreeMap::new();
    let mut quarantined = false;
    for i in pool.ips() {
        match &i.state {
            IpState::Assigned { meta, .. } => {
                states
                    .entry(meta.netns.clone())
                    .or_insert_with(|| netns.state(&meta.netns));
            }
            IpState::Quarantined { .. } => quarantined = true,
            _ => {}
        }
    }
    let host = quarantined.then(|| host_evidence(cni_cache_dir, netns));
    Snapshot {
        pool,
        netns: states,
        host,
        ec2,
    }
}
