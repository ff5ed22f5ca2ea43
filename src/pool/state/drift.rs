//! The state's side of the running reconcile's changes (see [`crate::pool::Pool`]'s reconcile
//! methods in `pool/drift.rs`): IPs EC2 no longer shows, ENIs EC2 does not show attached (suspected,
//! then forgotten), ENIs attached that the pool did not know (adopted), quarantined IPs that evidence
//! or an operator clears. `suspend_eni` is also the ENI actor's, when EC2 answers NotFound for its
//! ENI.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use tokio::time::Instant;

use super::{EniRecord, EniRole, PoolState, SubnetRecord};
use crate::cloud::{Eni, Subnet};
use crate::model::EniId;
use crate::pool::profiles::profile_of;
use crate::pool::{Allocation, AllocationSeed, EniPhase, Forgotten};

impl PoolState {
    /// EC2 no longer shows these IPs on `eni` (unassigned out of band): the pool forgets them and
    /// returns their tokens. IPs being given back are skipped (their absence is ours).
    pub fn forget_gone(&mut self, eni: &EniId, ips: &[Ipv4Addr]) -> Vec<Forgotten> {
        let Some(r) = self.enis.get_mut(eni) else {
            return Vec::new();
        };
        let gone: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| !self.releasing.contains_key(ip) && r.ips.remove(ip))
            .collect();
        self.drop_ips(gone)
    }

    /// Removes `ips` from wherever the pool holds them (not from their ENI's record) and returns
    /// their tokens; returns each with its holder.
    fn drop_ips(&mut self, ips: impl IntoIterator<Item = Ipv4Addr>) -> Vec<Forgotten> {
        let forgotten: Vec<Forgotten> = ips
            .into_iter()
            .map(|ip| {
                self.idle.remove(ip);
                self.held_back.remove(&ip);
                self.unconfirmed.remove(&ip);
                self.quarantined.remove(&ip);
                let holder = self.assigned.remove(&ip);
                if let Some(key) = &holder {
                    self.allocations.remove(key);
                }
                (ip, holder)
            })
            .collect();
        self.capacity.give_back(forgotten.len() as u32);
        forgotten
    }

    /// `ips` were placed without EC2's describe showing them ([`PoolState::unconfirmed`]): the idle
    /// ones are held back from now.
    pub fn hold_unconfirmed(&mut self, ips: &[Ipv4Addr]) {
        for ip in ips {
            self.unconfirmed.insert(*ip);
            if let Some(entry) = self.idle.remove(*ip) {
                self.held_back.insert(*ip, entry);
            }
        }
    }

    /// EC2's describe shows these on their ENIs: the unconfirmed among them are confirmed, and those
    /// held back for it alone are idle again. Returns those confirmed.
    pub fn confirm_shown(&mut self, shown: &BTreeSet<Ipv4Addr>) -> Vec<Ipv4Addr> {
        let confirmed: Vec<Ipv4Addr> = self.unconfirmed.intersection(shown).copied().collect();
        for ip in &confirmed {
            self.unconfirmed.remove(ip);
            let Some(entry) = self.held_back.get(ip) else {
                continue;
            };
            if !self.eni_suspect(&entry.eni)
                && let Some(entry) = self.held_back.remove(ip)
            {
                self.idle.reinsert(entry);
            }
        }
        confirmed
    }

    /// EC2 did not show `eni` attached to this instance: it takes no new work and its idle IPs are
    /// held back. Pods keep the IPs they hold (EC2 may just be slow to show the attachment). Returns
    /// whether it was serving until now.
    pub fn suspend_eni(&mut self, eni: &EniId, now: Instant) -> bool {
        let Some(r) = self.enis.get_mut(eni) else {
            return false;
        };
        if r.role != EniRole::Pods
            || matches!(r.phase, EniPhase::Suspect { .. } | EniPhase::Draining)
        {
            return false;
        }
        r.phase = EniPhase::Suspect { since: now };
        for ip in self.idle.ips_on(eni) {
            if let Some(entry) = self.idle.remove(ip) {
                self.held_back.insert(ip, entry);
            }
        }
        true
    }

    /// EC2 shows a suspected ENI attached again: it serves, and its held-back IPs are idle again in
    /// their old places.
    pub fn resume_eni(&mut self, eni: &EniId) -> bool {
        let Some(r) = self.enis.get_mut(eni) else {
            return false;
        };
        if !matches!(r.phase, EniPhase::Suspect { .. }) {
            return false;
        }
        r.phase = EniPhase::Serving;
        let back: Vec<Ipv4Addr> = self
            .held_back
            .iter()
            .filter(|(ip, e)| &e.eni == eni && !self.unconfirmed.contains(ip))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in back {
            if let Some(entry) = self.held_back.remove(&ip) {
                self.idle.reinsert(entry);
            }
        }
        true
    }

    /// EC2 confirms `eni` is no longer attached to this instance: the pool forgets it with every IP
    /// on it (returning their tokens); the pods that held them lost their IPs. Its actor ends once
    /// its handle is dropped here (the caller drops the returned record). Returns the forgotten IPs.
    pub fn forget_eni(&mut self, eni: &EniId) -> (Vec<Forgotten>, Option<EniRecord>) {
        let Some(rec) = self.enis.remove(eni) else {
            return (Vec::new(), None);
        };
        for ip in &rec.ips {
            self.releasing.remove(ip);
        }
        (self.drop_ips(rec.ips.iter().copied()), Some(rec))
    }

    /// Registers an ENI EC2 shows attached to this instance that the pool did not know (e.g. a create
    /// whose answer was lost), without its actor (the caller spawns it). Ours: its secondary IPs
    /// join the pool idle, cooling from now (no pod can hold them: the pool never handed them out).
    /// Not ours: it only takes its device index. Returns whether it serves pods.
    pub fn adopt_eni(&mut self, eni: &Eni, subnet: Subnet, managed: bool, now: Instant) -> bool {
        let Some(att) = eni.attachment.as_ref() else {
            return false;
        };
        if self.enis.contains_key(&eni.id) {
            return false;
        }
        let role = if managed {
            EniRole::Pods
        } else {
            EniRole::Foreign
        };
        let ips: BTreeSet<Ipv4Addr> = if managed {
            eni.pod_addresses()
                .into_iter()
                .filter(|ip| !self.assigned.contains_key(ip))
                .collect()
        } else {
            BTreeSet::new()
        };
        let fits = self.capacity.available() >= ips.len() as u32;
        let ips = if fits { ips } else { BTreeSet::new() };
        self.subnets
            .entry(eni.subnet_id.clone())
            .or_insert_with(|| SubnetRecord::new(None))
            .subnet
            .get_or_insert(subnet);
        self.capacity.take_existing(ips.len() as u32);
        for ip in &ips {
            self.idle
                .push(*ip, eni.id.clone(), now, self.config.reuse_cooldown, None);
        }
        self.enis.insert(
            eni.id.clone(),
            EniRecord {
                id: eni.id.clone(),
                mac: eni.mac.clone(),
                device_index: att.device_index,
                subnet_id: eni.subnet_id.clone(),
                primary_ip: eni.primary_ip,
                role,
                serves: managed,
                profile: profile_of(eni),
                prefixes: if managed && fits {
                    eni.ipv4_prefixes.iter().copied().collect()
                } else {
                    BTreeSet::new()
                },
                ips,
                inflight: 0,
                phase: EniPhase::Serving,
                release_retry_at: None,
                cloud: Some(eni.clone()),
                handle: None,
                task: None,
            },
        );
        managed
    }

    /// Releases quarantined IPs into the idle queue, cooling from `now` (evidence says no pod holds
    /// them, or an operator said so). Returns those that were quarantined.
    pub fn lift_quarantine(&mut self, ips: &[Ipv4Addr], now: Instant) -> Vec<Ipv4Addr> {
        let mut lifted = Vec::new();
        for ip in ips {
            if let Some(q) = self.quarantined.remove(ip) {
                self.idle
                    .push(*ip, q.eni, now, self.config.reuse_cooldown, None);
                lifted.push(*ip);
            }
        }
        lifted
    }

    /// A quarantined IP that evidence shows held by a live pod: it becomes that attachment's.
    pub fn adopt_quarantined(&mut self, held: AllocationSeed, now: Instant) -> Option<Allocation> {
        if self.allocations.contains_key(&held.attachment) {
            return None;
        }
        let q = self.quarantined.remove(&held.ip)?;
        let network = self.enis.get(&q.eni).and_then(|r| r.profile.clone());
        Some(self.record(
            held.attachment,
            held.pod,
            held.sticky_key,
            held.meta,
            network,
            held.ip,
            q.eni,
            now,
        ))
    }
}
