//! The running reconcile: releases pods that died without a DEL, and compares the pool with EC2.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::cloud::{Cloud, CloudError, EniFilter};
use crate::model::AttachmentKey;

/// What one pass of the running reconcile found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Assignments released because their pod's network namespace is gone.
    pub released_dead: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Assignments released because the API server says their pod is gone ([`super::api_server`]).
    pub released_gone_from_api: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Pool IPs on managed ENIs that EC2 no longer shows there.
    pub missing_in_ec2: Vec<Ipv4Addr>,
    /// IPs EC2 shows on our managed ENIs that the pool does not hold (reported; a restart adopts them).
    pub unknown_to_pool: Vec<Ipv4Addr>,
    /// Pods whose IP was gone from EC2: forgotten by the pool and the state file.
    pub lost: Vec<(AttachmentKey, Ipv4Addr)>,
}

/// One pass of the running reconcile: releases assignments whose network namespace is gone or whose
/// pod the API server says is gone (`api`, when that source is on: pods that died without a DEL), then
/// compares the pool with EC2 and reports the drift.
pub async fn pass(
    ipam: &crate::ipam::Ipam,
    cloud: &dyn Cloud,
    instance_id: &str,
    netns_alive: &(dyn Fn(&str) -> bool + Sync),
    api: Option<&super::api_server::ApiServerGc>,
) -> Result<PassReport, CloudError> {
    let mut report = PassReport::default();
    if let Ok(state) = ipam.store().load().await {
        for a in state.assignments {
            if !a.netns.is_empty() && !netns_alive(&a.netns) {
                let key = AttachmentKey::new(a.container_id.clone(), a.ifname.clone());
                if ipam.release_dead(&key).await.is_ok() {
                    tracing::info!(attachment = %key, ip = %a.ip, netns = %a.netns, "pod network namespace is gone: released");
                    report.released_dead.push((key, a.ip));
                }
            }
        }
    }
    report.released_gone_from_api = super::api_server::release_gone_pods(ipam, api).await;
    let snapshot = ipam.pool().snapshot();
    let ec2 = cloud
        .describe_enis(&EniFilter {
            attached_to: Some(instance_id.to_owned()),
            ..EniFilter::default()
        })
        .await?;
    for e in snapshot.enis.iter().filter(|e| e.device_index != 0) {
        let Some(truth) = ec2.iter().find(|x| x.id == e.id) else {
            continue; // attaching or being released: not drift
        };
        let ec2_ips: BTreeSet<Ipv4Addr> = truth.secondary_ips.iter().copied().collect();
        let pool_ips: BTreeSet<Ipv4Addr> = e
            .ips
            .iter()
            .filter(|i| !matches!(i.state, crate::pool::snapshot::IpState::Releasing))
            .map(|i| i.ip)
            .collect();
        let gone: Vec<Ipv4Addr> = pool_ips.difference(&ec2_ips).copied().collect();
        if !gone.is_empty() {
            let forgotten = ipam.pool().forget_gone_ips(&e.id, &gone);
            let ips: Vec<Ipv4Addr> = forgotten.iter().map(|(ip, _)| *ip).collect();
            if let Err(err) = ipam.store().remove_ips(ips).await {
                tracing::error!(error = %err, "cannot remove forgotten IPs from the state file");
            }
            report.lost.extend(
                forgotten
                    .into_iter()
                    .filter_map(|(ip, k)| k.map(|k| (k, ip))),
            );
        }
        report.missing_in_ec2.extend(gone);
        if e.in_flight == 0 && truth.is_managed_by_us() {
            report.unknown_to_pool.extend(ec2_ips.difference(&pool_ips));
        }
    }
    if !report.missing_in_ec2.is_empty() || !report.unknown_to_pool.is_empty() {
        tracing::warn!(
            missing_in_ec2 = ?report.missing_in_ec2, unknown_to_pool = ?report.unknown_to_pool,
            lost = ?report.lost,
            "the pool and EC2 disagree (changed out of band?): IPs gone from EC2 were forgotten; \
             IPs unknown to the pool are adopted at the next restart"
        );
    }
    Ok(report)
}
