//! The running reconcile's acts: each [`Drift`] applied through the IPAM service (so the pool and
//! the state file change together), and what it did written into the [`PassReport`]. Errors are
//! logged and the rest goes on; the next pass decides again.

use super::decide::Drift;
use super::report::PassReport;
use crate::cloud::Cloud;
use crate::ipam::Ipam;
use crate::pool::Forgotten;

/// Applies `drifts` in order. `cloud` describes the subnet of an ENI to adopt when the pool does not
/// know it.
pub async fn apply(ipam: &Ipam, cloud: &dyn Cloud, drifts: Vec<Drift>, report: &mut PassReport) {
    for drift in drifts {
        match drift {
            Drift::NetnsGone {
                attachment,
                ip,
                netns,
            } => {
                if let Ok(Some(_)) = ipam.release_dead(&attachment).await {
                    tracing::info!(attachment = %attachment, ip = %ip, netns = %netns, "pod network namespace is gone: released");
                    report.released_dead.push((attachment, ip));
                }
            }
            Drift::AdoptQuarantined { claim } => {
                let ip = claim.ip;
                match ipam.adopt_quarantined(claim.allocation()).await {
                    Ok(Some(_)) => report.quarantine_adopted.push((claim.attachment, ip)),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(error = %e, %ip, "cannot record a quarantined IP's adoption")
                    }
                }
            }
            Drift::LiftQuarantine { ips } => match ipam.lift_quarantine(&ips).await {
                Ok(lifted) => report.quarantine_lifted.extend(lifted),
                Err(e) => tracing::error!(error = %e, "cannot record lifted quarantine"),
            },
            Drift::SuspendEni { eni } => {
                if ipam.suspend_eni(&eni) {
                    report.suspended_enis.push(eni);
                }
            }
            Drift::ForgetEni { eni } => match ipam.forget_eni(&eni).await {
                Ok(forgotten) => {
                    report.forgotten_enis.push(eni);
                    report.lost.extend(held(forgotten));
                }
                Err(err) => {
                    tracing::error!(error = %err, eni = %eni, "cannot forget a detached ENI in the state file");
                }
            },
            Drift::ResumeEni { eni } => {
                if ipam.resume_eni(&eni) {
                    report.resumed_enis.push(eni);
                }
            }
            Drift::MissingInEc2 {
                eni,
                ips,
                confirmed,
            } => {
                if !confirmed.is_empty() {
                    match ipam.forget_ips(&eni, &confirmed).await {
                        Ok(forgotten) => report.lost.extend(held(forgotten)),
                        Err(err) => {
                            tracing::error!(error = %err, "cannot remove forgotten IPs from the state file")
                        }
                    }
                }
                report.missing_in_ec2.extend(ips);
            }
            Drift::UnknownToPool { ips, .. } => report.unknown_to_pool.extend(ips),
            Drift::AdoptEni {
                eni,
                subnet,
                managed,
            } => {
                let subnet = match subnet {
                    Some(s) => s,
                    None => match cloud.describe_subnet(&eni.subnet_id).await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, eni = %eni.id, "cannot describe the subnet of an unknown attached ENI; trying next pass");
                            continue;
                        }
                    },
                };
                match ipam.adopt_eni(&eni, subnet, managed).await {
                    Ok(_) => report.adopted_enis.push(eni.id),
                    Err(e) => {
                        tracing::error!(error = %e, eni = %eni.id, "cannot record an adopted ENI")
                    }
                }
            }
            Drift::RepairStore { rows } => match ipam.repair_store(rows).await {
                Ok(n) => report.store_repairs += n,
                Err(e) => {
                    tracing::error!(error = %e, "cannot compare the state file with the pool")
                }
            },
        }
    }
}

/// The forgotten IPs a pod held: those pods lost their IPs.
fn held(
    forgotten: Vec<Forgotten>,
) -> impl Iterator<Item = (crate::model::AttachmentKey, std::net::Ipv4Addr)> {
    forgotten
        .into_iter()
        .filter_map(|(ip, k)| k.map(|k| (k, ip)))
}
