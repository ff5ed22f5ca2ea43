//! The running reconcile's decisions: a pure function of one [`Snapshot`] of what the pool, the host
//! and EC2 say, and of what earlier passes saw ([`Memory`]), returning the [`Drift`]s to act on. No
//! I/O here: [`super::pass`] gathers the snapshot, [`super::apply`] acts through the IPAM service.
//!
//! 1. Pods whose network namespace is gone (died without a DEL) are released.
//! 2. Quarantined IPs are cleared once the host's evidence is visible: adopted by the pod the plugin's
//!    result cache names, else released into the idle queue (cooling); one quarantined because EC2's
//!    describe may have lagged a lost file's restart only once held a minute and shown by EC2.
//! 3. EC2 is eventually consistent, so nothing is forgotten on one look: an ENI EC2 does not show
//!    attached here is suspended (no new IPs from it) at the first miss and forgotten with its IPs at
//!    the second; IPs EC2 no longer shows on an ENI are forgotten at the second miss; an ENI attached
//!    here that the pool does not know is adopted (ours) or recorded (not ours) at the second
//!    sighting, never while the pool is creating an ENI.
//! 4. ([`decide_store`]) The state file is repaired from the pool where a row disagreed twice in a
//!    row.
//! 5. ([`prefix6`]) The node's IPv6 /80 gone from eth0 in EC2's describe is assigned back; EC2's
//!    "in use" is final only once a describe had a minute to show it on eth0.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use super::evidence::{HostClaim, HostEvidence, NetnsState};
use super::quarantine::QUARANTINE_UNSETTLED;
use crate::cloud::DESCRIBE_SETTLES;
use crate::cloud::{Eni, Subnet};
use crate::model::{AttachmentKey, EniId};
use crate::pool::EniRole;
use crate::pool::snapshot::{EniPhaseSnapshot, EniSnapshot, IpState, PoolSnapshot};
use crate::store::RowRepair;

mod prefix6;
mod store;
#[cfg(test)]
mod tests;

pub use prefix6::{AssignBackAnswer, Prefix6Memory, Prefix6Step};
pub use store::decide_store;

/// What the running reconcile looks at in one pass.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The pool, taken after EC2 answered (an ENI the pool creates is in it, or counted as being
    /// created, by the time EC2 shows it).
    pub pool: PoolSnapshot,
    /// What the host says about the network namespace of each attachment holding an IP (a path not
    /// in the map is unknown).
    pub netns: BTreeMap<String, NetnsState>,
    /// The plugin's result cache: read only while the pool holds quarantined IPs.
    pub host: Option<HostEvidence>,
    /// The ENIs EC2 shows attached (or attaching) to this instance; `None` when EC2 could not be
    /// asked (the host's drifts are still decided, nothing of EC2's).
    pub ec2: Option<BTreeMap<EniId, Eni>>,
}

/// What the running reconcile remembers between passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// ENIs of ours EC2 did not show attached, and in how many passes in a row.
    pub(crate) eni_misses: HashMap<EniId, u32>,
    /// Pool IPs EC2 did not show on their ENI, and in how many passes in a row.
    pub(crate) ip_misses: HashMap<Ipv4Addr, u32>,
    /// ENIs attached here that the pool does not know, and in how many passes in a row.
    pub(crate) unknown_sightings: HashMap<EniId, u32>,
    /// State-file rows that disagreed with the pool at the last look, as the pool wanted them.
    pub(crate) store_suspects: HashMap<Ipv4Addr, RowRepair>,
    /// What EC2 answered when the node's /80 was assigned back ([`prefix6`]).
    pub(crate) ipv6: Prefix6Memory,
}

impl Memory {
    /// The memory of the first pass after a start: the addresses the startup rebuild took from the
    /// journal while its describe did not show them have missed once already
    /// ([`super::ReconcileReport::unconfirmed`]).
    pub fn after_start(unconfirmed: &[Ipv4Addr]) -> Self {
        Self {
            ip_misses: unconfirmed.iter().map(|ip| (*ip, 1)).collect(),
            ..Self::default()
        }
    }
}

/// One thing the running reconcile decided, in the order it is applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// A pod's network namespace is gone (it died without a DEL): release its IP.
    NetnsGone {
        attachment: AttachmentKey,
        ip: Ipv4Addr,
        netns: String,
    },
    /// A quarantined IP the plugin's result cache shows held by a live pod: that pod's.
    AdoptQuarantined { claim: HostClaim },
    /// Quarantined IPs no pod claims while the plugin's cache is visible: idle, cooling.
    LiftQuarantine { ips: Vec<Ipv4Addr> },
    /// An ENI of ours EC2 does not show attached here, first miss: no new IPs from it for now.
    SuspendEni { eni: EniId },
    /// An ENI of ours EC2 did not show attached twice in a row: forgotten with its IPs.
    ForgetEni { eni: EniId },
    /// A suspected ENI EC2 shows attached again: it serves again.
    ResumeEni { eni: EniId },
    /// IPs the pool holds on `eni` that EC2 does not show there (reported); those missed twice in a
    /// row (`confirmed`) are forgotten.
    MissingInEc2 {
        eni: EniId,
        ips: Vec<Ipv4Addr>,
        confirmed: Vec<Ipv4Addr>,
    },
    /// IPs EC2 shows on a managed ENI that the pool does not hold: reported only (a restart adopts
    /// them).
    UnknownToPool { eni: EniId, ips: Vec<Ipv4Addr> },
    /// An ENI attached here that the pool did not know, seen twice: taken on, serving pods when it
    /// is ours (`managed`). `subnet` is `None` when the pool does not know its CIDR (EC2 is asked).
    AdoptEni {
        eni: Box<Eni>,
        subnet: Option<Subnet>,
        managed: bool,
    },
    /// State-file rows that disagreed with the pool twice in a row: rewritten from the pool.
    RepairStore { rows: Vec<RowRepair> },
}

impl Drift {
    /// Decided from the host's evidence alone (steps 1 and 2): applied whether or not EC2 answered.
    pub fn from_host(&self) -> bool {
        matches!(
            self,
            Drift::NetnsGone { .. } | Drift::AdoptQuarantined { .. } | Drift::LiftQuarantine { .. }
        )
    }
}

/// Whether eniipam manages an attached ENI: created by eniipam (and not opted out), and not eth0.
/// The startup rebuild and the running reconcile decide it the same way.
pub fn managed(eni: &Eni) -> bool {
    eni.attachment.as_ref().is_some_and(|a| a.device_index != 0) && eni.is_managed_by_us()
}

/// Steps 1 to 3 (see the module docs), in that order. Updates `memory` for the next pass; what EC2
/// decides is left alone when EC2 could not be asked.
pub fn decide(snapshot: &Snapshot, memory: &mut Memory) -> Vec<Drift> {
    let mut drifts = netns_gone(snapshot);
    drifts.extend(clear_quarantine(snapshot));
    if let Some(attached) = &snapshot.ec2 {
        drifts.extend(compare_enis(&snapshot.pool, attached, memory));
        drifts.extend(adopt_unknown(&snapshot.pool, attached, memory));
    }
    drifts
}

/// 1. Pods whose network namespace the host shows gone.
fn netns_gone(snapshot: &Snapshot) -> Vec<Drift> {
    snapshot
        .pool
        .ips()
        .filter_map(|i| match &i.state {
            IpState::Assigned {
                attachment, meta, ..
            } if snapshot.netns.get(&meta.netns) == Some(&NetnsState::Gone) => {
                Some(Drift::NetnsGone {
                    attachment: attachment.clone(),
                    ip: i.ip,
                    netns: meta.netns.clone(),
                })
            }
            _ => None,
        })
        .collect()
}

/// 2. Quarantined IPs, once the plugin's cache is visible.
///
/// One quarantined because EC2's describe may have lagged at startup ([`QUARANTINE_UNSETTLED`]) is
/// lifted only once it has been held [`DESCRIBE_SETTLES`] and this pass's describe shows it on its
/// ENI; one EC2 does not show is left to step 3, which forgets it at its second miss.
fn clear_quarantine(snapshot: &Snapshot) -> Vec<Drift> {
    let Some(evidence) = snapshot.host.as_ref().filter(|h| h.cache_visible) else {
        return Vec::new();
    };
    let mut drifts = Vec::new();
    let mut unclaimed = Vec::new();
    for e in &snapshot.pool.enis {
        for i in &e.ips {
            let IpState::Quarantined { reason, held_for } = &i.state else {
                continue;
            };
            if let Some(claim) = evidence.claims.iter().find(|c| c.ip == i.ip) {
                drifts.push(Drift::AdoptQuarantined {
                    claim: claim.clone(),
                });
                continue;
            }
            if reason == QUARANTINE_UNSETTLED {
                let shown = snapshot
                    .ec2
                    .as_ref()
                    .and_then(|m| m.get(&e.id))
                    .is_some_and(|truth| truth.pod_addresses().contains(&i.ip));
                if *held_for < DESCRIBE_SETTLES || !shown {
                    continue;
                }
            }
            unclaimed.push(i.ip);
        }
    }
    if !unclaimed.is_empty() {
        drifts.push(Drift::LiftQuarantine { ips: unclaimed });
    }
    drifts
}

/// 3a/3b. The pool's ENIs and IPs against what EC2 shows attached here.
fn compare_enis(
    pool: &PoolSnapshot,
    attached: &BTreeMap<EniId, Eni>,
    memory: &mut Memory,
) -> Vec<Drift> {
    let mut drifts = Vec::new();
    let mut still_missing = HashMap::new();
    let mut missing = BTreeSet::new();
    for e in pool
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
                drifts.push(Drift::ForgetEni { eni: e.id.clone() });
            } else {
                drifts.push(Drift::SuspendEni { eni: e.id.clone() });
                still_missing.insert(e.id.clone(), misses);
            }
            continue;
        };
        if matches!(e.phase, EniPhaseSnapshot::Suspect { .. }) {
            drifts.push(Drift::ResumeEni { eni: e.id.clone() });
        }
        drifts.extend(compare_ips(e, truth, memory, &mut missing));
    }
    memory.eni_misses = still_missing;
    // IPs that are back (or whose ENI went) start over.
    memory.ip_misses.retain(|ip, _| missing.contains(ip));
    drifts
}

/// 3b. One ENI's IPs against EC2's: what the pool holds and EC2 does not show (`missing` collects
/// them), and what EC2 shows on a managed ENI that the pool does not hold.
fn compare_ips(
    e: &EniSnapshot,
    truth: &Eni,
    memory: &mut Memory,
    missing: &mut BTreeSet<Ipv4Addr>,
) -> Vec<Drift> {
    let mut drifts = Vec::new();
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
    missing.extend(gone.iter().copied());
    if !gone.is_empty() {
        drifts.push(Drift::MissingInEc2 {
            eni: e.id.clone(),
            ips: gone,
            confirmed,
        });
    }
    if e.in_flight == 0 && truth.is_managed_by_us() {
        let unknown: Vec<Ipv4Addr> = ec2_ips.difference(&pool_ips).copied().collect();
        if !unknown.is_empty() {
            drifts.push(Drift::UnknownToPool {
                eni: e.id.clone(),
                ips: unknown,
            });
        }
    }
    drifts
}

/// 3c. ENIs attached here that the pool does not know: taken on at the second sighting, and never
/// while the pool is creating an ENI (the new one shows in EC2 before the pool registers it). The
/// sightings of one taken on are kept until the pool knows it, so a pass that cannot take it on
/// (EC2 does not describe its subnet) tries again at the next.
fn adopt_unknown(
    pool: &PoolSnapshot,
    attached: &BTreeMap<EniId, Eni>,
    memory: &mut Memory,
) -> Vec<Drift> {
    if pool.creating_enis > 0 {
        memory.unknown_sightings.clear();
        return Vec::new();
    }
    let mut drifts = Vec::new();
    let mut seen = HashMap::new();
    for (id, eni) in attached {
        if pool.eni(id).is_some() {
            continue;
        }
        let sightings = memory.unknown_sightings.get(id).copied().unwrap_or(0) + 1;
        seen.insert(id.clone(), sightings);
        if sightings < 2 {
            continue;
        }
        let subnet = pool
            .subnets
            .iter()
            .find(|s| s.id == eni.subnet_id)
            .and_then(|s| s.cidr)
            .map(|cidr| Subnet {
                id: eni.subnet_id.clone(),
                vpc_id: eni.vpc_id.clone(),
                cidr,
                availability_zone: eni.availability_zone.clone(),
                available_ips: 0,
                tags: Default::default(),
                ipv6_cidrs: Vec::new(),
            });
        drifts.push(Drift::AdoptEni {
            eni: Box::new(eni.clone()),
            subnet,
            managed: managed(eni),
        });
    }
    memory.unknown_sightings = seen;
    drifts
}
