//! The startup rebuild: EC2's ENIs (authoritative) + IMDS (CIDRs, MACs) + the state file + the host's
//! evidence, merged into the pool's seed and the state written back before anything is served.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::evidence::{HostEvidence, NetnsState, NetnsView};
use super::quarantine::{QUARANTINE_NO_EVIDENCE, QUARANTINE_UNSETTLED};
use crate::clock::{instant_from_unix_ms, unix_ms_now};
use crate::cloud::DESCRIBE_SETTLES;
use crate::cloud::{Cloud, CloudError, Eni, Metadata, MetadataEni, SubnetFilter};
use crate::model::{AttachmentKey, PodRef};
use crate::pool::{AllocationSeed, AttachmentMeta, EniSeed, IdleSeed, PoolSeed, QuarantineSeed};
use crate::store::{
    Ec2Address, Ec2Change, StoredAssignment, StoredEc2Change, StoredEni, StoredIdle,
    StoredQuarantined, StoredState,
};

/// What the startup rebuild found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// ENIs attached (EC2's view), and how many of them are ours to manage.
    pub enis: usize,
    pub managed_enis: usize,
    /// Assignments kept.
    pub kept: usize,
    /// Assignments whose IP is on no ENI any more (dropped; the pod lost its IP out of band).
    pub dropped_gone: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Assignments whose network namespace is gone (released into cooldown).
    pub released_dead: Vec<(AttachmentKey, Ipv4Addr)>,
    /// IPs on our ENIs that the file did not know (idle, cooling).
    pub unknown_ips: usize,
    /// IPs the file did not know but the host shows a live pod holding (adopted as assigned).
    pub adopted: Vec<(AttachmentKey, Ipv4Addr)>,
    /// IPs held out of circulation: history unknown and no evidence of who holds them.
    pub quarantined: Vec<Ipv4Addr>,
    /// Quarantined IPs the evidence now accounts for (adopted or idle).
    pub quarantine_lifted: Vec<Ipv4Addr>,
    /// The state file was lost (new, moved aside as corrupt, or another instance's).
    pub state_lost: bool,
    /// Addresses a first start found on its ENIs with no pod on the host: the instance's launch
    /// addresses, idle and eligible at once.
    pub fresh_ips: usize,
    /// IPs IMDS and EC2 disagreed on (EC2 won).
    pub imds_mismatches: usize,
    /// The file belonged to another instance and was ignored.
    pub foreign_state: bool,
    /// Addresses the describe showed otherwise than EC2 answered the pool's own change of them
    /// less than [`DESCRIBE_SETTLES`] ago (the file's journal won: EC2's describes lag).
    pub journal_corrections: usize,
    /// Addresses the journal placed on an ENI that the describe did not show (EC2 assigned them
    /// less than a minute ago, or they were lost since): the running reconcile counts the
    /// describe's silence as their first miss, so one more forgets them (a restart does not give
    /// a lost address another two passes: a pod could get it meanwhile).
    pub unconfirmed: Vec<Ipv4Addr>,
}

/// The rebuilt state.
pub struct Rebuilt {
    pub seed: PoolSeed,
    pub state: StoredState,
    pub report: ReconcileReport,
}

/// What the rebuild merges besides EC2 and IMDS.
pub struct Inputs<'a> {
    /// The state file's contents.
    pub stored: StoredState,
    /// Whether the state file was lost (created afresh or moved aside as corrupt).
    pub state_lost: bool,
    /// No daemon ever started on this instance before (no start marker beside the state file,
    /// [`crate::daemon`]'s `first start`): the addresses the instance came with (a launch
    /// template's `SecondaryPrivateIpAddressCount` or `Ipv4PrefixCount` on eth0) never served a pod
    /// here, so when the host shows no pod either they are fresh: idle at once, neither cooling
    /// nor quarantined.
    pub first_start: bool,
    pub host: &'a HostEvidence,
    pub netns: &'a NetnsView,
    /// eth0's secondary IPs are pod IPs (the pool's `use_primary_eni`).
    pub use_primary_eni: bool,
    /// The file's journal of the pool's own address changes (`store::changes`).
    pub ec2_changes: Vec<StoredEc2Change>,
    /// The instance as node discovery described it moments ago: the first describe of the node's
    /// ENIs reads it instead of asking EC2 again (a retry, or a describe asked again while EC2
    /// lags a new ENI, asks afresh).
    pub described: Option<crate::cloud::Instance>,
}

/// Reads IMDS and EC2 and merges them with the stored state.
pub async fn rebuild(
    cloud: &dyn Cloud,
    metadata: &dyn Metadata,
    instance_id: &str,
    mut inputs: Inputs<'_>,
) -> Result<Rebuilt, CloudError> {
    let imds = metadata.interfaces().await?;
    let ec2 = settled::describe(
        cloud,
        instance_id,
        &imds,
        (&inputs.stored, &inputs.ec2_changes),
        inputs.described.take(),
    )
    .await?;
    // An ENI attached just before a crash may be in neither IMDS (which lags) nor the file: its
    // subnet's CIDR comes from EC2 then, so the ENI and the pods already on it are kept. Skipping it
    // would drop those pods' records, and their IPs would go to other pods.
    let imds_macs: BTreeSet<&str> = imds.iter().map(|m| m.mac.as_str()).collect();
    let stored_ids: BTreeSet<&str> = inputs
        .stored
        .enis
        .iter()
        .map(|e| e.eni_id.as_str())
        .collect();
    let unknown_subnets: BTreeSet<String> = ec2
        .iter()
        .filter(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.instance_id == instance_id)
                && !imds_macs.contains(e.mac.as_str())
                && !stored_ids.contains(e.id.as_str())
        })
        .map(|e| e.subnet_id.clone())
        .collect();
    let subnet_cidrs: BTreeMap<String, Ipv4Net> = if unknown_subnets.is_empty() {
        BTreeMap::new()
    } else {
        cloud
            .describe_subnets(&SubnetFilter {
                ids: unknown_subnets.into_iter().collect(),
                ..SubnetFilter::default()
            })
            .await?
            .into_iter()
            .map(|s| (s.id, s.cidr))
            .collect()
    };
    Ok(merge(
        instance_id,
        &imds,
        &ec2,
        &subnet_cidrs,
        inputs,
        Instant::now(),
        unix_ms_now(),
    ))
}

/// EC2's ENIs as the pool's own changes of the last [`DESCRIBE_SETTLES`] left them: the describe may
/// not show them yet (EC2 is eventually consistent), EC2's answers to those changes did. An address
/// EC2 assigned stays, one given back goes, whatever the describe says; an ENI the describe does not
/// show attached here is left alone (the ENI's own state is not journalled). Each address the
/// describe showed otherwise is counted in `report.journal_corrections`.
fn with_recent_changes(
    ec2: &[Eni],
    changes: &[StoredEc2Change],
    now_ms: u64,
    report: &mut ReconcileReport,
) -> Vec<Eni> {
    let settles_ms = DESCRIBE_SETTLES.as_millis() as u64;
    let mut enis = ec2.to_vec();
    // Oldest first: the latest change of an address wins.
    for c in changes.iter().filter(|c| c.at_ms + settles_ms > now_ms) {
        let Some(e) = enis.iter_mut().find(|e| e.id.as_str() == c.eni_id) else {
            continue;
        };
        let corrected = match (c.address, c.change) {
            (Ec2Address::Ip(ip), Ec2Change::Assigned) => {
                !e.secondary_ips.contains(&ip) && {
                    e.secondary_ips.push(ip);
                    report.unconfirmed.push(ip);
                    true
                }
            }
            (Ec2Address::Ip(ip), Ec2Change::Unassigned) => {
                let before = e.secondary_ips.len();
                e.secondary_ips.retain(|i| *i != ip);
                e.secondary_ips.len() != before
            }
            (Ec2Address::Prefix(p), Ec2Change::Assigned) => {
                !e.ipv4_prefixes.contains(&p) && {
                    e.ipv4_prefixes.push(p);
                    report
                        .unconfirmed
                        .extend(crate::pool::slots::prefix_addresses(p));
                    true
                }
            }
            (Ec2Address::Prefix(p), Ec2Change::Unassigned) => {
                let before = e.ipv4_prefixes.len();
                e.ipv4_prefixes.retain(|q| *q != p);
                e.ipv4_prefixes.len() != before
            }
        };
        if corrected {
            tracing::info!(address = %c.address, eni = %c.eni_id, change = ?c.change, ago_ms = now_ms.saturating_sub(c.at_ms),
                "EC2's describe does not show the pool's recent change of this address yet: EC2's answer to the change wins");
            report.journal_corrections += 1;
        }
    }
    enis
}

/// EC2's ENIs with the IPs live pods hold that the describe does not show yet: the plugin caches a
/// pod's result, with the ENI the daemon answered from, only after the daemon recorded the IP, which
/// EC2 had assigned; a describe that lags EC2's changes may not list it yet (a restart within seconds
/// of the pod's ADD, its state file lost). Only for an ENI the describe shows attached here: a
/// single address where the ENI holds no `/28` or where IMDS lists it as one, or the `/28` IMDS
/// lists holding it (IMDS shows EC2's assignment before the describe does); an address on an ENI
/// with `/28`s that IMDS does not list is left out, as nothing tells which it is. Each is counted
/// in `report.journal_corrections`.
///
/// Only when the state file was lost: with the file, the journal holds every address EC2 gave an
/// ENI in the last minute before any pod got it ([`crate::pool`] waits for the write), so a live
/// pod's IP that neither the describe nor the journal shows was lost out of band, and taking it
/// back from the cache would hold an address no ENI has (issue 44 case 8).
fn with_claimed(
    ec2: &[Eni],
    (host, imds): (&HostEvidence, &[MetadataEni]),
    instance_id: &str,
    report: &mut ReconcileReport,
) -> Vec<Eni> {
    let mut enis = ec2.to_vec();
    for c in host.claims.iter().filter(|c| !c.ip.is_unspecified()) {
        if enis.iter().any(|e| e.pod_addresses().contains(&c.ip)) {
            continue;
        }
        let Some(e) = enis.iter_mut().find(|e| {
            e.id.as_str() == c.eni_id
                && e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance_id)
        }) else {
            continue;
        };
        // Inside a `/28` the instance's metadata already lists on this ENI (IMDS shows EC2's
        // assignment before its describe does): the prefix is taken whole, its addresses held
        // from new pods until a describe shows it (burst prefixes put `/28`s beside single IPs on
        // eth0, so a prefix on the ENI no longer means every address is in one).
        let listed = imds
            .iter()
            .filter(|m| m.mac == e.mac)
            .flat_map(|m| m.ipv4_prefixes.iter())
            .find(|p| p.contains(&c.ip))
            .copied();
        if let Some(prefix) = listed {
            tracing::info!(ip = %c.ip, %prefix, eni = %e.id, attachment = %c.attachment,
                "a live pod holds an address of a /28 IMDS lists and EC2's describe does not show yet: the /28 is taken as on its ENI");
            e.ipv4_prefixes.push(prefix);
            report
                .unconfirmed
                .extend(crate::cloud::prefix_addresses(prefix));
            report.journal_corrections += 1;
            continue;
        }
        let listed_single = imds.iter().any(|m| m.mac == e.mac && m.ips.contains(&c.ip));
        if !e.ipv4_prefixes.is_empty() && !listed_single {
            // Whether it is a single address or in a /28 the metadata does not show yet, nothing
            // tells: placing either could hand out addresses EC2 does not have.
            continue;
        }
        tracing::info!(ip = %c.ip, eni = %e.id, attachment = %c.attachment,
            "a live pod holds an IP EC2's describe does not show yet: taken as on its ENI");
        e.secondary_ips.push(c.ip);
        report.unconfirmed.push(c.ip);
        report.journal_corrections += 1;
    }
    enis
}

/// The pure part of [`rebuild`]: EC2's ENIs (authoritative) + IMDS (for CIDRs and MACs) + the file +
/// the host's evidence.
pub fn merge(
    instance_id: &str,
    imds: &[MetadataEni],
    ec2: &[Eni],
    subnet_cidrs: &BTreeMap<String, Ipv4Net>,
    inputs: Inputs<'_>,
    now: Instant,
    now_ms: u64,
) -> Rebuilt {
    let Inputs {
        stored,
        state_lost,
        first_start,
        host,
        netns,
        use_primary_eni,
        ec2_changes,
        described: _,
    } = inputs;
    let mut report = ReconcileReport::default();
    let stored = if stored
        .instance_id
        .as_deref()
        .is_some_and(|i| i != instance_id)
    {
        report.foreign_state = true;
        StoredState::default()
    } else {
        stored
    };
    report.state_lost = state_lost || report.foreign_state;
    // Nothing can hold an address of a node no daemon served before and whose host shows no pod.
    let fresh = first_start && state_lost && host.claims.is_empty();
    let ec2 = &with_recent_changes(ec2, &ec2_changes, now_ms, &mut report);
    let ec2 = &if report.state_lost {
        with_claimed(ec2, (host, imds), instance_id, &mut report)
    } else {
        ec2.clone()
    };
    let by_mac: BTreeMap<&str, &MetadataEni> = imds.iter().map(|m| (m.mac.as_str(), m)).collect();
    let known_enis: BTreeMap<&str, &StoredEni> =
        stored.enis.iter().map(|e| (e.eni_id.as_str(), e)).collect();

    let mut enis = Vec::new();
    let mut stored_enis = Vec::new();
    // ip -> eni id, for pod IPs on managed ENIs.
    let mut pod_ips: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
    for e in ec2 {
        let Some(att) = e
            .attachment
            .as_ref()
            .filter(|a| a.instance_id == instance_id)
        else {
            continue;
        };
        let md = by_mac.get(e.mac.as_str()).copied();
        if let Some(md) = md {
            let imds_ips: BTreeSet<_> = md.ips.iter().copied().collect();
            let ec2_ips: BTreeSet<_> = std::iter::once(e.primary_ip)
                .chain(e.secondary_ips.iter().copied())
                .collect();
            report.imds_mismatches += imds_ips.symmetric_difference(&ec2_ips).count();
            let imds_prefixes: BTreeSet<_> = md.ipv4_prefixes.iter().collect();
            let ec2_prefixes: BTreeSet<_> = e.ipv4_prefixes.iter().collect();
            report.imds_mismatches += imds_prefixes.symmetric_difference(&ec2_prefixes).count();
        }
        let subnet_cidr = md
            .map(|m| m.subnet_cidr)
            .or_else(|| {
                known_enis
                    .get(e.id.as_str())
                    .and_then(|s| s.subnet_cidr.parse().ok())
            })
            .or_else(|| subnet_cidrs.get(&e.subnet_id).copied());
        let Some(subnet_cidr) = subnet_cidr else {
            // Neither IMDS, the file nor EC2 knows the CIDR (EC2 did not describe the subnet):
            // leave it to the next start.
            tracing::warn!(eni = %e.id, "no subnet CIDR known for an attached ENI yet; not serving from it");
            continue;
        };
        let managed = super::decide::managed(e);
        report.enis += 1;
        if managed {
            report.managed_enis += 1;
        }
        // eth0's secondary IPs serve pods too with `use_primary_eni`.
        if managed || (att.device_index == 0 && use_primary_eni) {
            for ip in e.pod_addresses() {
                pod_ips.insert(ip, e.id.to_string());
            }
        }
        enis.push(EniSeed {
            id: e.id.clone(),
            mac: e.mac.clone(),
            device_index: att.device_index,
            subnet_id: e.subnet_id.clone(),
            subnet_cidr,
            primary_ip: e.primary_ip,
            secondary_ips: e.secondary_ips.clone(),
            prefixes: e.ipv4_prefixes.clone(),
            managed,
            eni: Some(e.clone()),
            // The profile the ENI was created for, from its tag: its IPs keep serving that
            // profile's pods only.
            profile: crate::pool::profiles::profile_of(e),
        });
        stored_enis.push(StoredEni {
            eni_id: e.id.to_string(),
            mac: e.mac.clone(),
            device_index: att.device_index,
            subnet_id: e.subnet_id.clone(),
            subnet_cidr: subnet_cidr.to_string(),
            primary_ip: e.primary_ip,
            created_by_us: e.is_managed_by_us(),
            created_at_ms: known_enis
                .get(e.id.as_str())
                .map_or(now_ms, |s| s.created_at_ms),
        });
    }

    let mut allocations = Vec::new();
    let mut assignments = Vec::new();
    let mut idle = Vec::new();
    let mut stored_idle = Vec::new();
    let mut quarantined = Vec::new();
    let mut stored_quarantined = Vec::new();
    let mut seen: BTreeSet<Ipv4Addr> = BTreeSet::new();
    let mut attachments: BTreeSet<AttachmentKey> = BTreeSet::new();
    for a in stored.assignments {
        let key = AttachmentKey::new(a.container_id.clone(), a.ifname.clone());
        let Some(eni_id) = pod_ips.get(&a.ip) else {
            tracing::warn!(ip = %a.ip, attachment = %key, "assigned IP is on no ENI of this node any more: dropped");
            report.dropped_gone.push((key, a.ip));
            continue;
        };
        if seen.contains(&a.ip) || attachments.contains(&key) {
            tracing::warn!(ip = %a.ip, attachment = %key, "duplicate record in the state file: ignored");
            continue;
        }
        if netns.state(&a.netns) == NetnsState::Gone {
            tracing::info!(ip = %a.ip, attachment = %key, netns = %a.netns, "pod network namespace is gone: released");
            report.released_dead.push((key, a.ip));
            // Released now: it joins the idle IPs below, cooling from now.
            continue;
        }
        seen.insert(a.ip);
        attachments.insert(key.clone());
        report.kept += 1;
        allocations.push(AllocationSeed {
            ip: a.ip,
            attachment: key,
            pod: PodRef {
                namespace: a.pod_namespace.clone(),
                name: a.pod_name.clone(),
                uid: a.pod_uid.clone(),
            },
            sticky_key: a.sticky_key.clone(),
            meta: AttachmentMeta {
                network: a.network.clone(),
                netns: a.netns.clone(),
            },
        });
        assignments.push(StoredAssignment {
            eni_id: eni_id.clone(),
            ..a
        });
    }
    for i in stored.idle {
        let Some(eni_id) = pod_ips.get(&i.ip) else {
            continue; // given back to EC2 since: nothing to keep
        };
        if !seen.insert(i.ip) {
            continue;
        }
        idle.push(IdleSeed {
            ip: i.ip,
            idle_since: instant_from_unix_ms(i.idle_since_ms, now, now_ms),
            reserved: i
                .reservation
                .as_ref()
                .filter(|(_, until)| *until > now_ms)
                .map(|(k, until)| (k.clone(), now + Duration::from_millis(until - now_ms))),
            fresh: false,
        });
        stored_idle.push(StoredIdle {
            eni_id: eni_id.clone(),
            ..i
        });
    }
    for claim in &host.claims {
        let Some(eni_id) = pod_ips.get(&claim.ip) else {
            continue;
        };
        if seen.contains(&claim.ip) || attachments.contains(&claim.attachment) {
            continue; // the file knows this IP or this attachment: it wins
        }
        tracing::warn!(ip = %claim.ip, attachment = %claim.attachment, netns = %claim.netns,
            "IP unknown to the state file is held by a pod the host still shows (plugin cache): adopted as assigned");
        seen.insert(claim.ip);
        attachments.insert(claim.attachment.clone());
        report.adopted.push((claim.attachment.clone(), claim.ip));
        allocations.push(claim.allocation());
        assignments.push(StoredAssignment {
            ip: claim.ip,
            eni_id: eni_id.clone(),
            network: claim.network.clone(),
            container_id: claim.attachment.container_id.clone(),
            ifname: claim.attachment.ifname.clone(),
            netns: claim.netns.clone(),
            pod_namespace: claim.pod.namespace.clone(),
            pod_name: claim.pod.name.clone(),
            pod_uid: claim.pod.uid.clone(),
            sticky_key: claim.sticky_key.clone(),
            assigned_at_ms: now_ms,
        });
    }
    // Quarantined before, and still unexplained: they stay quarantined until evidence is visible.
    let was_quarantined: BTreeMap<Ipv4Addr, StoredQuarantined> =
        stored.quarantined.into_iter().map(|q| (q.ip, q)).collect();
    let released: BTreeSet<Ipv4Addr> = report.released_dead.iter().map(|(_, ip)| *ip).collect();
    for (ip, eni_id) in &pod_ips {
        if seen.contains(ip) {
            if was_quarantined.contains_key(ip) {
                report.quarantine_lifted.push(*ip);
            }
            continue;
        }
        let hold = if let Some(q) = was_quarantined.get(ip) {
            (!host.cache_visible || q.reason == QUARANTINE_UNSETTLED)
                .then(|| (q.since_ms, q.reason.clone()))
        } else if report.state_lost && !fresh && !released.contains(ip) {
            Some((
                now_ms,
                if host.cache_visible {
                    QUARANTINE_UNSETTLED
                } else {
                    QUARANTINE_NO_EVIDENCE
                }
                .to_owned(),
            ))
        } else {
            None
        };
        if let Some((since_ms, reason)) = hold {
            tracing::warn!(%ip, eni = %eni_id, %reason, "IP quarantined: neither handed out nor given back until evidence or an operator clears it");
            report.quarantined.push(*ip);
            quarantined.push(QuarantineSeed {
                ip: *ip,
                since: instant_from_unix_ms(since_ms, now, now_ms),
                reason: reason.clone(),
            });
            stored_quarantined.push(StoredQuarantined {
                ip: *ip,
                eni_id: eni_id.clone(),
                since_ms,
                reason,
            });
            continue;
        }
        if was_quarantined.contains_key(ip) {
            report.quarantine_lifted.push(*ip);
        } else if fresh {
            report.fresh_ips += 1;
        } else if !released.contains(ip) {
            report.unknown_ips += 1;
        }
        // Unknown history (or just released): idle from now, so it cools before any pod gets it;
        // a fresh node's launch addresses served no pod, so they are eligible at once.
        idle.push(IdleSeed {
            ip: *ip,
            idle_since: now,
            reserved: None,
            fresh,
        });
        stored_idle.push(StoredIdle {
            ip: *ip,
            eni_id: eni_id.clone(),
            idle_since_ms: now_ms,
            reservation: None,
        });
    }
    enis.sort_by_key(|e| e.device_index);
    stored_enis.sort_by_key(|e| e.device_index);
    assignments.sort_by_key(|a| a.ip);
    stored_idle.sort_by_key(|i| i.ip);
    stored_quarantined.sort_by_key(|q| q.ip);
    Rebuilt {
        seed: PoolSeed {
            enis,
            allocations,
            idle,
            quarantined,
        },
        state: StoredState {
            instance_id: Some(instance_id.to_owned()),
            enis: stored_enis,
            assignments,
            idle: stored_idle,
            quarantined: stored_quarantined,
        },
        report,
    }
}

mod settled;
#[cfg(test)]
mod tests;
