//! The running reconcile, every period: the pool against the host, EC2 and the state file.
//!
//! 1. Pods whose network namespace is gone (died without a DEL) are released.
//! 2. Quarantined IPs are cleared once the host's evidence is visible: adopted by the pod the plugin's
//!    result cache names, else released into the idle queue (cooling).
//! 3. EC2 is eventually consistent, so nothing is forgotten on one look: an ENI EC2 does not show
//!    attached here is suspended (no new IPs from it) at the first miss and forgotten with its IPs at
//!    the second; IPs EC2 no longer shows on an ENI are forgotten at the second miss; an ENI attached
//!    here that the pool does not know is adopted (ours) or recorded (not ours) at the second sighting.
//! 4. The state file is repaired from the pool where a row disagreed twice in a row.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::evidence::{NetnsState, NetnsView, host_evidence};
use crate::cloud::{AttachmentStatus, Cloud, CloudError, Eni, EniFilter, Subnet};
use crate::ipam::{Ipam, StoreRepairs};
use crate::model::{AttachmentKey, EniId};
use crate::pool::snapshot::{EniPhaseSnapshot, IpState};
use crate::pool::{AttachmentMeta, EniRole};

/// Where the pass looks on the host.
#[derive(Clone, Debug)]
pub struct HostView {
    /// The plugin's result cache root.
    pub cni_cache_dir: PathBuf,
    /// Directories holding pod network namespaces that the daemon may see.
    pub netns_dirs: Vec<PathBuf>,
}

/// What the running reconcile remembers between passes.
#[derive(Debug, Default)]
pub struct Memory {
    eni_misses: HashMap<EniId, u32>,
    ip_misses: HashMap<Ipv4Addr, u32>,
    unknown_sightings: HashMap<EniId, u32>,
    store: StoreRepairs,
}

/// What one pass of the running reconcile found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Assignments released because their pod's network namespace is gone.
    pub released_dead: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Assignments released because the API server says their pod is gone ([`super::api_server`]).
    pub released_gone_from_api: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Pool IPs on managed ENIs that EC2 no longer shows there (this pass).
    pub missing_in_ec2: Vec<Ipv4Addr>,
    /// IPs EC2 shows on our managed ENIs that the pool does not hold (reported; a restart adopts them).
    pub unknown_to_pool: Vec<Ipv4Addr>,
    /// Pods whose IP is gone from EC2 (out of band, or with its ENI): forgotten by the pool and the
    /// state file.
    pub lost: Vec<(AttachmentKey, Ipv4Addr)>,
    /// ENIs EC2 did not show attached here for the first time: no new IPs from them for now.
    pub suspended_enis: Vec<EniId>,
    /// Suspended ENIs EC2 shows attached again.
    pub resumed_enis: Vec<EniId>,
    /// ENIs EC2 did not show attached twice in a row: forgotten with their IPs.
    pub forgotten_enis: Vec<EniId>,
    /// ENIs attached here that the pool did not know, taken on.
    pub adopted_enis: Vec<EniId>,
    /// Quarantined IPs the evidence adopted for a live pod.
    pub quarantine_adopted: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Quarantined IPs released into the idle queue.
    pub quarantine_lifted: Vec<Ipv4Addr>,
    /// State-file rows repaired from the pool.
    pub store_repairs: usize,
}

/// One pass; see the module docs. Releases assignments whose network namespace is gone or whose pod
/// the API server says is gone (`api`, when that source is on: pods that died without a DEL), then
/// compares the pool with EC2. EC2 errors end the pass (the next one tries again); store errors are
/// logged and the pass goes on.
pub async fn pass(
    ipam: &Ipam,
    cloud: &dyn Cloud,
    instance_id: &str,
    host: &HostView,
    memory: &mut Memory,
    api: Option<&super::api_server::ApiServerGc>,
) -> Result<PassReport, CloudError> {
    let mut report = PassReport::default();
    let netns = NetnsView::of(&host.netns_dirs);
    release_dead(ipam, &netns, &mut report).await;
    report.released_gone_from_api = super::api_server::release_gone_pods(ipam, api, &netns).await;
    clear_quarantine(ipam, host, &netns, &mut report).await;
    let ec2 = cloud
        .describe_enis(&EniFilter {
            attached_to: Some(instance_id.to_owned()),
            ..EniFilter::default()
        })
        .await?;
    let attached: BTreeMap<EniId, &Eni> = ec2
        .iter()
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
        .collect();
    compare_enis(ipam, &attached, memory, &mut report).await;
    adopt_unknown(ipam, cloud, &attached, memory, &mut report).await;
    match ipam.repair_store(&mut memory.store).await {
        Ok(n) => report.store_repairs = n,
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

/// 1. Pods whose netns the host shows gone.
async fn release_dead(ipam: &Ipam, netns: &NetnsView, report: &mut PassReport) {
    let snapshot = ipam.pool().snapshot();
    for i in snapshot.ips() {
        let IpState::Assigned {
            attachment, meta, ..
        } = &i.state
        else {
            continue;
        };
        if netns.state(&meta.netns) != NetnsState::Gone {
            continue;
        }
        if let Ok(Some(_)) = ipam.release_dead(attachment).await {
            tracing::info!(attachment = %attachment, ip = %i.ip, netns = %meta.netns, "pod network namespace is gone: released");
            report.released_dead.push((attachment.clone(), i.ip));
        }
    }
}

/// 2. Quarantined IPs, once the plugin's cache is visible.
async fn clear_quarantine(
    ipam: &Ipam,
    host: &HostView,
    netns: &NetnsView,
    report: &mut PassReport,
) {
    let snapshot = ipam.pool().snapshot();
    let quarantined: Vec<Ipv4Addr> = snapshot
        .ips()
        .filter(|i| matches!(i.state, IpState::Quarantined { .. }))
        .map(|i| i.ip)
        .collect();
    if quarantined.is_empty() {
        return;
    }
    let evidence = host_evidence(&host.cni_cache_dir, netns);
    if !evidence.cache_visible {
        return;
    }
    let mut unclaimed = Vec::new();
    for ip in quarantined {
        let claim = evidence.claims.iter().find(|c| c.ip == ip);
        match claim {
            Some(c) => match ipam
                .adopt_quarantined(
                    ip,
                    c.attachment.clone(),
                    c.pod.clone(),
                    c.sticky_key.clone(),
                    AttachmentMeta {
                        network: c.network.clone(),
                        netns: c.netns.clone(),
                    },
                )
                .await
            {
                Ok(Some(_)) => report.quarantine_adopted.push((c.attachment.clone(), ip)),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, %ip, "cannot record a quarantined IP's adoption")
                }
            },
            None => unclaimed.push(ip),
        }
    }
    match ipam.lift_quarantine(&unclaimed).await {
        Ok(lifted) => report.quarantine_lifted = lifted,
        Err(e) => tracing::error!(error = %e, "cannot record lifted quarantine"),
    }
}

/// 3a/3b. The pool's ENIs and IPs against what EC2 shows attached here.
async fn compare_enis(
    ipam: &Ipam,
    attached: &BTreeMap<EniId, &Eni>,
    memory: &mut Memory,
    report: &mut PassReport,
) {
    let snapshot = ipam.pool().snapshot();
    let mut still_missing = HashMap::new();
    for e in snapshot
        .enis
        .iter()
        .filter(|e| e.serves_pods && e.phase != EniPhaseSnapshot::Draining)
    {
        let Some(truth) = attached.get(&e.id) else {
            if e.role != EniRole::Pods {
                continue; // eth0 never goes away while the node runs
            }
            let misses = memory.eni_misses.get(&e.id).copied().unwrap_or(0) + 1;
            if misses >= 2 {
                match ipam.forget_eni(&e.id).await {
                    Ok(forgotten) => {
                        report.forgotten_enis.push(e.id.clone());
                        report.lost.extend(
                            forgotten
                                .into_iter()
                                .filter_map(|(ip, k)| k.map(|k| (k, ip))),
                        );
                    }
                    Err(err) => {
                        tracing::error!(error = %err, eni = %e.id, "cannot forget a detached ENI in the state file");
                    }
                }
            } else {
                if ipam.pool().suspend_eni(&e.id) {
                    report.suspended_enis.push(e.id.clone());
                }
                still_missing.insert(e.id.clone(), misses);
            }
            continue;
        };
        if matches!(e.phase, EniPhaseSnapshot::Suspect { .. }) && ipam.pool().resume_eni(&e.id) {
            report.resumed_enis.push(e.id.clone());
        }
        let ec2_ips: BTreeSet<Ipv4Addr> = truth.pod_addresses().into_iter().collect();
        let pool_ips: BTreeSet<Ipv4Addr> = e
            .ips
            .iter()
            .filter(|i| !matches!(i.state, IpState::Releasing))
            .map(|i| i.ip)
            .collect();
        let gone: Vec<Ipv4Addr> = pool_ips.difference(&ec2_ips).copied().collect();
        let mut confirmed = Vec::new();
        for ip in &gone {
            let misses = memory.ip_misses.get(ip).copied().unwrap_or(0) + 1;
            if misses >= 2 {
                confirmed.push(*ip);
                memory.ip_misses.remove(ip);
            } else {
                memory.ip_misses.insert(*ip, misses);
            }
        }
        if !confirmed.is_empty() {
            match ipam.forget_ips(&e.id, &confirmed).await {
                Ok(forgotten) => report.lost.extend(
                    forgotten
                        .into_iter()
                        .filter_map(|(ip, k)| k.map(|k| (k, ip))),
                ),
                Err(err) => {
                    tracing::error!(error = %err, "cannot remove forgotten IPs from the state file")
                }
            }
        }
        report.missing_in_ec2.extend(gone);
        if e.in_flight == 0 && truth.is_managed_by_us() {
            report
                .unknown_to_pool
                .extend(ec2_ips.difference(&pool_ips).copied());
        }
    }
    memory.eni_misses = still_missing;
    // IPs that are back (or whose ENI went) start over.
    let tracked: BTreeSet<Ipv4Addr> = report.missing_in_ec2.iter().copied().collect();
    memory.ip_misses.retain(|ip, _| tracked.contains(ip));
}

/// 3c. ENIs attached here that the pool does not know: taken on at the second sighting, and never
/// while the pool is creating an ENI (the new one shows in EC2 before the pool registers it).
async fn adopt_unknown(
    ipam: &Ipam,
    cloud: &dyn Cloud,
    attached: &BTreeMap<EniId, &Eni>,
    memory: &mut Memory,
    report: &mut PassReport,
) {
    let snapshot = ipam.pool().snapshot();
    if snapshot.creating_enis > 0 {
        memory.unknown_sightings.clear();
        return;
    }
    let mut seen = HashMap::new();
    for (id, eni) in attached {
        if snapshot.eni(id).is_some() {
            continue;
        }
        let sightings = memory.unknown_sightings.get(id).copied().unwrap_or(0) + 1;
        if sightings < 2 {
            seen.insert(id.clone(), sightings);
            continue;
        }
        let subnet = match snapshot
            .subnets
            .iter()
            .find(|s| s.id == eni.subnet_id)
            .and_then(|s| s.cidr)
        {
            Some(cidr) => Ok(Subnet {
                id: eni.subnet_id.clone(),
                vpc_id: eni.vpc_id.clone(),
                cidr,
                availability_zone: eni.availability_zone.clone(),
                available_ips: 0,
                tags: Default::default(),
            }),
            None => cloud.describe_subnet(&eni.subnet_id).await,
        };
        let subnet = match subnet {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, eni = %id, "cannot describe the subnet of an unknown attached ENI; trying next pass");
                seen.insert(id.clone(), sightings);
                continue;
            }
        };
        let device = eni.attachment.as_ref().map_or(0, |a| a.device_index);
        let managed = device != 0 && eni.is_managed_by_us();
        match ipam.adopt_eni(eni, subnet, managed).await {
            Ok(_) => report.adopted_enis.push(id.clone()),
            Err(e) => tracing::error!(error = %e, eni = %id, "cannot record an adopted ENI"),
        }
    }
    memory.unknown_sightings = seen;
}
