//! Give-backs: which idle IPs a maintainer round hands back to EC2 (step 4 of
//! [`PoolState::plan_round`]), and what an ENI actor's give-backs come to: idle IPs handed back to
//! EC2 (or kept, when a call failed), and the release of an empty ENI (forgotten, or serving again
//! after a back-off).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::round::RoundPlan;
use super::{EniRole, PoolState};
use crate::cloud::CloudError;
use crate::model::EniId;
use crate::pool::demand::WarmLevels;
use crate::pool::error::PoolError;
use crate::pool::slots::prefix_addresses;
use crate::pool::types::{EniPhase, GiveBackOutcome, ReleaseOutcome};

impl PoolState {
    /// Step 4 of the round: the idle IPs beyond the keep level (down to its target), when the node
    /// is `quiet` (nothing waiting, warming or being created), and a profile's idle IPs once held
    /// long enough, go into `plan` as one unassign per ENI.
    pub(super) fn plan_give_backs(
        &mut self,
        levels: WarmLevels,
        quiet: bool,
        plan: &mut RoundPlan,
        now: Instant,
    ) {
        // IPs still cooling are on their way back into service (at a high churn a steady
        // rate × cooldown of them): they do not count toward the give-back level, or each released
        // IP would go back to EC2 as it cooled and each new pod would pay an assign for another.
        // The levels are the default network's: a profile's idle IPs count for none of them.
        let spare = self
            .default_idle_unreserved(now)
            .saturating_sub(self.default_idle_cooling(now));
        let excess = if quiet && spare > levels.keep {
            (spare - levels.down_to.min(levels.keep)) as usize
        } else {
            0
        };
        // Pod ENIs no pod uses: their idle IPs go back first (below).
        let pods_on: BTreeSet<&EniId> = self
            .enis
            .values()
            .filter(|r| r.ips.iter().any(|ip| self.assigned.contains_key(ip)))
            .map(|r| &r.id)
            .collect();
        let unused_pod_eni = |eni: &EniId| {
            self.enis
                .get(eni)
                .is_some_and(|r| r.role == EniRole::Pods && !pods_on.contains(eni))
        };
        // Idle IPs past cooldown and unreserved, longest idle first: what may go back.
        let eligible = self.idle.give_back_candidates(now);
        // While such an ENI backs off (its last give-back was throttled, say), the give-back waits
        // for it: taking eth0's IPs instead would leave the node its second ENI for its next burst.
        let excess = if excess > 0
            && eligible.iter().any(|e| {
                unused_pod_eni(&e.eni)
                    && !self.is_profile_eni(&e.eni)
                    && self
                        .enis
                        .get(&e.eni)
                        .is_some_and(|r| r.handle.is_some() && r.phase.retry_in(now).is_some())
            }) {
            0
        } else {
            excess
        };
        // A profile keeps no warm IPs: its idle ones go back, whatever the levels, once idle for
        // `give_back_delay` (past cooldown, unreserved) — the hold the adaptive policy gives a
        // burst's leftovers, so a profile's churning pods reuse their IPs rather than pay an
        // unassign and an assign each.
        let profile_hold = self.config.give_back_delay.max(self.config.reuse_cooldown);
        let mut candidates: Vec<(Ipv4Addr, EniId, bool)> = eligible
            .iter()
            .filter(|e| {
                self.enis
                    .get(&e.eni)
                    .is_some_and(|r| r.handle.is_some() && r.phase.accepts_work(now))
            })
            .map(|e| (e.ip, e.eni.clone(), self.is_profile_eni(&e.eni)))
            .filter(|(_, _, profile)| !profile)
            .chain(
                eligible
                    .iter()
                    .filter(|e| {
                        self.is_profile_eni(&e.eni)
                            && now.saturating_duration_since(e.idle_since) >= profile_hold
                            && self
                                .enis
                                .get(&e.eni)
                                .is_some_and(|r| r.handle.is_some() && r.phase.accepts_work(now))
                    })
                    .map(|e| (e.ip, e.eni.clone(), true)),
            )
            .collect();
        // The IPs of pod ENIs no pod uses go back first, the last-attached ENI first (otherwise
        // longest idle first): the node keeps its warm IPs where its pods are, eth0 before all, and
        // the emptied ENI is released (step 5). A node that keeps a second ENI for a few idle IPs
        // would need an assign on each ENI for its next burst, both on the account's one assign
        // bucket, where a released ENI's place is taken by a create whose buckets are others.
        if excess > 0 {
            let drain_order = |eni: &EniId| match self.enis.get(eni) {
                Some(r) if unused_pod_eni(eni) => (0, std::cmp::Reverse(r.device_index)),
                _ => (1, std::cmp::Reverse(0)),
            };
            candidates.sort_by_key(|(_, eni, _)| drain_order(eni));
        }
        if excess > 0 || candidates.iter().any(|(_, _, profile)| *profile) {
            // Single addresses go one by one; a prefix only whole, when all 16 of its addresses are
            // among the candidates (idle, past cooldown, unreserved), in the order above.
            let eligible: BTreeSet<Ipv4Addr> = candidates.iter().map(|(ip, _, _)| *ip).collect();
            let mut per_eni: BTreeMap<EniId, (Vec<Ipv4Addr>, Vec<Ipv4Net>)> = BTreeMap::new();
            let mut left = excess;
            let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
            for (ip, eni, profile) in &candidates {
                if (left == 0 && !profile) || taken.contains(ip) {
                    continue;
                }
                let r = &self.enis[eni];
                match r.prefixes.iter().find(|p| p.contains(ip)) {
                    None => {
                        taken.insert(*ip);
                        per_eni.entry(eni.clone()).or_default().0.push(*ip);
                        if !profile {
                            left -= 1;
                        }
                    }
                    Some(prefix) => {
                        let all: Vec<Ipv4Addr> = prefix_addresses(*prefix).collect();
                        if (!profile && left < all.len())
                            || !all.iter().all(|a| eligible.contains(a))
                        {
                            continue;
                        }
                        if !profile {
                            left -= all.len();
                        }
                        taken.extend(all.iter().copied());
                        let entry = per_eni.entry(eni.clone()).or_default();
                        entry.0.extend(all);
                        entry.1.push(*prefix);
                    }
                }
            }
            for (eni, (ips, prefixes)) in per_eni {
                let mut moved = Vec::new();
                for ip in ips {
                    if let Some(entry) = self.idle.remove(ip) {
                        self.releasing.insert(ip, entry);
                        moved.push(ip);
                    }
                }
                let handle = self.enis[&eni].handle.clone().expect("filtered");
                plan.unassigns.push((eni, handle, moved, prefixes));
            }
        }
    }

    /// Settles a give-back of `ips` (singles, and every address of `prefixes`) on `eni` with what
    /// it came to. Returns what its callers are answered.
    pub fn settle_give_back(
        &mut self,
        eni: &EniId,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        outcome: GiveBackOutcome,
        now: Instant,
    ) -> Result<(), PoolError> {
        match outcome {
            GiveBackOutcome::Done => {
                self.complete_unassign(eni, ips, prefixes);
                Ok(())
            }
            GiveBackOutcome::Failed {
                error,
                singles_gone,
            } => {
                self.settle_failed_unassign(eni, ips, prefixes, singles_gone, error.clone(), now);
                Err(PoolError::Cloud(error))
            }
            GiveBackOutcome::NotSent => {
                self.unassign_abandoned(eni, ips);
                Err(PoolError::ShuttingDown)
            }
        }
    }

    /// Settles the release of the empty ENI `eni` with what it came to.
    pub fn settle_release(&mut self, eni: &EniId, outcome: ReleaseOutcome, now: Instant) {
        match outcome {
            ReleaseOutcome::Deleted | ReleaseOutcome::Detached => self.complete_release(eni),
            ReleaseOutcome::StillAttached | ReleaseOutcome::NotSent => self.fail_release(eni, now),
            ReleaseOutcome::Unknown => {
                self.fail_release(eni, now);
                self.suspend_eni(eni, now);
            }
        }
    }

    /// IPs given back to EC2: tokens return.
    fn complete_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) {
        let mut n = 0;
        for ip in ips {
            if self.releasing.remove(ip).is_some() {
                n += 1;
            }
        }
        if let Some(r) = self.enis.get_mut(eni) {
            for ip in ips {
                r.ips.remove(ip);
            }
            for p in prefixes {
                r.prefixes.remove(p);
            }
            r.phase = r.phase.succeeded();
        }
        self.capacity.give_back(n);
    }

    /// A give-back of `ips` (singles, and every address of `prefixes`) whose calls did not all
    /// succeed: singles and prefixes go back in separate calls, each settled on its own. When the
    /// singles' call succeeded (`singles_gone`) and the prefixes' failed, EC2 no longer has the
    /// singles: they leave the pool (tokens return) and never go idle, or a pod would get an
    /// address no ENI holds; the prefixes' addresses are idle again for a later give-back.
    fn settle_failed_unassign(
        &mut self,
        eni: &EniId,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        singles_gone: bool,
        err: CloudError,
        now: Instant,
    ) {
        if !singles_gone {
            self.fail_unassign(eni, ips, err, now);
            return;
        }
        let (kept, gone): (Vec<Ipv4Addr>, Vec<Ipv4Addr>) = ips
            .iter()
            .partition(|ip| prefixes.iter().any(|p| p.contains(*ip)));
        self.complete_unassign(eni, &gone, &[]);
        self.fail_unassign(eni, &kept, err, now);
    }

    /// A give-back failed: the IPs are idle again (same place in the queue), the ENI backs off.
    fn fail_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], err: CloudError, now: Instant) {
        self.unassign_abandoned(eni, ips);
        if err.is_not_found() {
            self.suspend_eni(eni, now);
            return;
        }
        let cfg = self.config.clone();
        if let Some(r) = self.enis.get_mut(eni) {
            r.phase = r.phase.failed(err, now, |n| cfg.backoff_after(n));
        }
    }

    /// A give-back that will not happen: the IPs are idle again.
    fn unassign_abandoned(&mut self, _eni: &EniId, ips: &[Ipv4Addr]) {
        for ip in ips {
            if let Some(entry) = self.releasing.remove(ip) {
                self.idle.reinsert(entry);
            }
        }
    }

    /// The ENI is gone from EC2.
    fn complete_release(&mut self, eni: &EniId) {
        if let Some(r) = self.enis.remove(eni)
            && !r.ips.is_empty()
        {
            tracing::error!(%eni, ips = r.ips.len(), "released an ENI that still held IPs");
        }
    }

    /// The ENI could not be released: it serves again, and is not retried for a back-off.
    fn fail_release(&mut self, eni: &EniId, now: Instant) {
        let delay = self.config.eni_backoff_max;
        if let Some(r) = self.enis.get_mut(eni) {
            r.phase = EniPhase::Serving;
            r.release_retry_at = Some(now + delay);
        }
    }
}
