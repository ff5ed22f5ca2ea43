//! Network profiles in the state: which ENIs (and so which idle IPs) an acquire of a profile may
//! use, when a profile may have another ENI, the round's ENI creations for profiles' waiters, and
//! each profile's capacity. The default network's ENIs never serve a profile and a profile's ENIs
//! never serve the default network (`check_invariants` holds both).

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::round::{CreatePlan, RoundPlan};
use super::{CreatingEni, PoolState};
use crate::cloud::lifecycle::Slots;
use crate::model::EniId;
use crate::pool::config::PREFIX_ADDRESSES;
use crate::pool::error::{PoolError, ProfileUnavailableReason};
use crate::pool::profiles::{ProfileCapacity, ProfileName, ProfileNetwork};
use crate::pool::types::Waiter;

impl PoolState {
    /// The ENIs that serve `network` (a profile's, or the default network's with `None`).
    pub(super) fn enis_of(&self, network: Option<&ProfileName>) -> BTreeSet<EniId> {
        self.enis
            .values()
            .filter(|r| r.serves && r.profile.as_ref() == network)
            .map(|r| r.id.clone())
            .collect()
    }

    /// Whether `eni` serves the default network (a profile's ENI does not).
    fn serves_default(&self, eni: &EniId) -> bool {
        self.enis.get(eni).is_none_or(|r| r.profile.is_none())
    }

    /// Idle IPs of the default network's ENIs no reservation holds at `now`: what its warm levels
    /// count (a profile's idle IPs are no use to its pods).
    pub(super) fn default_idle_unreserved(&self, now: Instant) -> u32 {
        self.idle
            .iter()
            .filter(|e| e.reserved_at(now).is_none() && self.serves_default(&e.eni))
            .count() as u32
    }

    /// Idle IPs of the default network's ENIs cooling at `now`.
    pub(super) fn default_idle_cooling(&self, now: Instant) -> u32 {
        self.idle
            .iter()
            .filter(|e| e.cooling_at(now) && self.serves_default(&e.eni))
            .count() as u32
    }

    /// Whether `eni` is a profile's ENI.
    pub(super) fn is_profile_eni(&self, eni: &EniId) -> bool {
        !self.serves_default(eni)
    }

    /// The error for a profile the node does not serve.
    pub(super) fn unknown_profile(profile: &str) -> PoolError {
        PoolError::ProfileUnavailable {
            profile: profile.to_owned(),
            reason: ProfileUnavailableReason::Unknown,
        }
    }

    /// ENIs of `profile`: attached, and being created.
    fn profile_enis(&self, profile: &str) -> (u32, u32) {
        let attached = self
            .enis
            .values()
            .filter(|r| r.profile.as_deref() == Some(profile))
            .count() as u32;
        let creating = self
            .creating
            .values()
            .filter(|c| c.profile.as_deref() == Some(profile))
            .count() as u32;
        (attached, creating)
    }

    /// Why `profile` may not have another ENI now, if so: its subnet backs off, it has `max_enis`,
    /// or the node has no device index left. `Ok(false)`: not now, but an ENI being created (or
    /// released) will make room, so its waiters wait; `Ok(true)`: it may.
    pub(super) fn profile_may_grow(&self, profile: &str, now: Instant) -> Result<bool, PoolError> {
        let Some(net) = self.profiles.get(profile) else {
            return Err(Self::unknown_profile(profile));
        };
        if let Some(err) = self.subnet_backing_off(&net.subnet.id, now) {
            return Err(err);
        }
        let (attached, creating) = self.profile_enis(profile);
        if let Some(max) = net.max_enis
            && attached + creating >= max
        {
            return if creating > 0 {
                Ok(false)
            } else {
                Err(PoolError::ProfileUnavailable {
                    profile: profile.to_owned(),
                    reason: ProfileUnavailableReason::MaxEnis {
                        enis: attached,
                        max_enis: max,
                    },
                })
            };
        }
        if self.free_device_index_for(Some(profile), now).is_none() {
            return if !self.creating.is_empty() || self.any_draining() {
                Ok(false)
            } else {
                Err(PoolError::ProfileUnavailable {
                    profile: profile.to_owned(),
                    reason: ProfileUnavailableReason::NoEniSlot {
                        enis: attached,
                        max_enis: self.max_enis,
                    },
                })
            };
        }
        Ok(true)
    }

    /// Sets the profiles the node serves. Their subnets are learned (EC2 described them); ENIs of a
    /// profile that disappears keep their pods and take no new ones; a change applies to new ENIs.
    pub fn set_profiles(&mut self, profiles: BTreeMap<ProfileName, ProfileNetwork>) {
        for (name, net) in &profiles {
            match self.profiles.get(name) {
                None => {
                    tracing::info!(profile = %name, subnet = %net.subnet.id, groups = %net.security_groups.join(","), max_enis = ?net.max_enis, "network profile served")
                }
                Some(old) if old != net => {
                    tracing::info!(profile = %name, subnet = %net.subnet.id, groups = %net.security_groups.join(","), max_enis = ?net.max_enis, "network profile changed: applies to its new ENIs")
                }
                Some(_) => {}
            }
            self.learn_subnet(net.subnet.clone());
        }
        for name in self.profiles.keys().filter(|n| !profiles.contains_key(*n)) {
            tracing::info!(profile = %name, "network profile no longer served: its ENIs take no new pods and go once empty");
        }
        self.profiles = profiles;
    }

    /// Who holds a spare device index now: each served profile below its `max_enis` whose subnet
    /// does not back off wants one, and so does the default network while no ENI serves it (eth0
    /// not serving pods, none created yet; as [`DEFAULT_NETWORK`]); the free indexes go one per
    /// claimant, fewest ENIs first (the default network first among equals, then by name), so a
    /// profile growing never takes the spare of one that has less. The default network creates
    /// an ENI only on its own spare or an index no spare holds, and so does a profile: see
    /// [`reserve_spares`].
    pub(super) fn profile_spares(&self, now: Instant) -> BTreeSet<ProfileName> {
        let default_enis = self.enis_of(None).len()
            + self
                .creating
                .values()
                .filter(|c| c.profile.is_none())
                .count();
        let mut wanting: Vec<(u32, ProfileName)> = self
            .profiles
            .iter()
            .filter(|(_, net)| self.subnet_backing_off(&net.subnet.id, now).is_none())
            .filter_map(|(name, net)| {
                let (attached, creating) = self.profile_enis(name);
                let enis = attached + creating;
                net.max_enis
                    .is_none_or(|m| enis < m)
                    .then(|| (enis, name.clone()))
            })
            .collect();
        if default_enis == 0 {
            wanting.push((0, DEFAULT_NETWORK.to_owned()));
        }
        reserve_spares(self.free_device_indexes().len(), wanting)
    }

    /// A free device index `network` (a profile, or the default network with `None`) may create
    /// an ENI on: one that leaves every other claimant's spare ([`Self::profile_spares`]) free.
    pub(super) fn free_device_index_for(&self, network: Option<&str>, now: Instant) -> Option<u32> {
        let free = self.free_device_indexes();
        if self.profiles.is_empty() {
            return free.first().copied();
        }
        let me = network.unwrap_or(DEFAULT_NETWORK);
        let held_by_others = self
            .profile_spares(now)
            .iter()
            .filter(|p| p.as_str() != me)
            .count();
        (free.len() > held_by_others)
            .then(|| free.first().copied())
            .flatten()
    }

    /// Per profile the node serves: ENIs, assigned, idle, free, and the total it advertises
    /// ([`ProfileCapacity::total`]): every address its serving ENIs (attached or being created)
    /// can hold, plus one ENI's worth for its spare device index. It moves only when the profile's
    /// ENIs, the node's free indexes, a limit or the profiles change, never with a pod's ADD or
    /// DEL: the scheduler subtracts the requests of the pods bound to the node itself.
    pub fn profile_capacity(&self, now: Instant) -> BTreeMap<ProfileName, ProfileCapacity> {
        let per_eni_room = self.per_eni * self.config.addresses_per_slot();
        let spares = self.profile_spares(now);
        let mut out = BTreeMap::new();
        for name in self.profiles.keys() {
            let mut cap = ProfileCapacity::default();
            let serving = self
                .enis
                .values()
                .filter(|r| r.profile.as_ref() == Some(name))
                .filter(|r| r.handle.is_some() && r.phase.accepts_work(now))
                .count() as u32;
            let mut cooling = 0u32;
            for e in self.idle.iter() {
                if self
                    .enis
                    .get(&e.eni)
                    .is_some_and(|r| r.profile.as_ref() == Some(name))
                {
                    cap.idle += 1;
                    if e.eligible_at() > now {
                        cooling += 1;
                    }
                }
            }
            cap.assigned = self
                .allocations
                .values()
                .filter(|a| a.network.as_ref() == Some(name))
                .count() as u32;
            let (attached, creating) = self.profile_enis(name);
            cap.enis = attached + creating;
            let spare = u32::from(spares.contains(name));
            cap.total = (serving + creating + spare) * per_eni_room;
            cap.free = cap.total.saturating_sub(cap.assigned + cooling);
            out.insert(name.clone(), cap);
        }
        out
    }

    /// Step 3 of a round for the profiles' waiters that need a new ENI: per profile, ENIs in its
    /// subnet with its groups carrying the waiters not covered by its ENIs being created (no warm
    /// IPs: the warm levels are the default network's). Waiters that must wait go back in line;
    /// those of an unknown profile, or of one that may have no other ENI, are answered.
    pub(super) fn plan_profile_creates(
        &mut self,
        waiters: Vec<Waiter>,
        plan: &mut RoundPlan,
        now: Instant,
    ) {
        let mut by_profile: BTreeMap<ProfileName, Vec<Waiter>> = BTreeMap::new();
        for w in waiters {
            let p = w.req.network.clone().expect("profile waiters only");
            by_profile.entry(p).or_default().push(w);
        }
        let per_slot = self.config.addresses_per_slot();
        for (profile, mut ws) in by_profile {
            let mut room_coming: u32 = self
                .creating
                .values()
                .filter(|c| c.profile.as_ref() == Some(&profile))
                .map(|c| (self.per_eni * per_slot).saturating_sub(c.count))
                .sum();
            loop {
                let uncovered = (ws.len() as u32).saturating_sub(room_coming);
                if uncovered == 0 || self.creating.len() >= self.config.max_concurrent_eni_creates {
                    break;
                }
                match self.profile_may_grow(&profile, now) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(err) => {
                        for w in std::mem::take(&mut ws) {
                            self.wait_or_fail(w, err.clone(), now);
                        }
                        break;
                    }
                }
                let net = self.profiles[&profile].clone();
                let device_index = self
                    .free_device_index_for(Some(&profile), now)
                    .expect("checked above");
                let prefixes =
                    self.config.prefix_delegation && !self.prefixes_blocked(&net.subnet.id, now);
                let mut n = uncovered.min(if prefixes {
                    self.per_eni * per_slot
                } else {
                    self.per_eni
                });
                let mut count = n;
                let slots = if prefixes {
                    let k = n.div_ceil(PREFIX_ADDRESSES);
                    let extra = k * PREFIX_ADDRESSES - n;
                    let got = self.capacity.take_up_to(extra);
                    if got == extra {
                        count += extra;
                        Slots::Prefixes(k)
                    } else {
                        self.capacity.give_back(got);
                        n = n.min(self.per_eni);
                        count = n;
                        Slots::Ips(n)
                    }
                } else {
                    Slots::Ips(n)
                };
                let carried: Vec<Waiter> = ws.split_off(ws.len() - n as usize);
                room_coming += (self.per_eni * per_slot).saturating_sub(count);
                self.next_create_id += 1;
                let id = self.next_create_id;
                self.creating.insert(
                    id,
                    CreatingEni {
                        device_index,
                        subnet_id: net.subnet.id.clone(),
                        profile: Some(profile.clone()),
                        count,
                        warm: 0,
                        started: now,
                        live: None,
                    },
                );
                tracing::info!(%profile, device_index, pods = n, "creating an ENI for a network profile");
                plan.creates.push(CreatePlan {
                    id,
                    device_index,
                    subnet_id: net.subnet.id.clone(),
                    slots,
                    waiters: carried,
                    describe_subnet: false,
                    network: Some(profile.clone()),
                    security_groups: Some(net.security_groups.clone()),
                    live: None,
                });
            }
            self.create_waiters.extend(ws);
        }
    }
}

/// The default network's name among the claimants of spare device indexes (a profile's name is
/// never empty, and this one sorts before every other).
pub const DEFAULT_NETWORK: &str = "";

/// The claimants that get a spare device index: `free` indexes handed one per claimant to
/// `wanting` (each claimant's ENIs, attached and being created, and its name), fewest ENIs first,
/// then by name. At most `free` claimants hold one, so the spares together never promise more
/// ENIs than the node can still attach: the rule that keeps the advertised totals within what the
/// node can create.
pub fn reserve_spares(free: usize, mut wanting: Vec<(u32, ProfileName)>) -> BTreeSet<ProfileName> {
    wanting.sort();
    wanting.into_iter().take(free).map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(list: &[(u32, &str)]) -> Vec<(u32, ProfileName)> {
        list.iter().map(|(n, p)| (*n, (*p).to_owned())).collect()
    }

    #[test]
    fn spares_go_one_per_profile_fewest_enis_first_never_more_than_the_free_indexes() {
        let got = |free, list: &[(u32, &str)]| -> Vec<String> {
            reserve_spares(free, w(list)).into_iter().collect()
        };
        assert_eq!(got(2, &[(0, "db"), (0, "app")]), ["app", "db"]);
        // One free index, two profiles: one spare, not two (issue 44, case 2).
        assert_eq!(got(1, &[(0, "db"), (0, "app")]), ["app"]);
        // A profile that grew does not take the spare of one that has less.
        assert_eq!(got(1, &[(1, "app"), (0, "db")]), ["db"]);
        assert!(got(0, &[(0, "db")]).is_empty());
        // The default network with no ENI comes first among equals.
        assert_eq!(
            got(1, &[(0, "db"), (0, DEFAULT_NETWORK)]),
            [DEFAULT_NETWORK]
        );
        assert!(got(3, &[]).is_empty());
    }
}
