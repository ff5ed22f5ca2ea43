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
        if self.free_device_index().is_none() {
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

    /// Per profile the node serves: ENIs, assigned, idle and free ([`ProfileCapacity::free`]).
    pub fn profile_capacity(&self, now: Instant) -> BTreeMap<ProfileName, ProfileCapacity> {
        let per_slot = self.config.addresses_per_slot();
        let free_indexes = {
            let used: BTreeSet<u32> = self
                .enis
                .values()
                .map(|r| r.device_index)
                .chain(self.creating.values().map(|c| c.device_index))
                .collect();
            (1..self.max_enis).filter(|i| !used.contains(i)).count() as u32
        };
        let mut out = BTreeMap::new();
        for (name, net) in &self.profiles {
            let mut cap = ProfileCapacity::default();
            let mut room = 0u32;
            let mut ready = 0u32;
            for r in self
                .enis
                .values()
                .filter(|r| r.profile.as_ref() == Some(name))
            {
                if r.handle.is_some() && r.phase.accepts_work(now) {
                    room += self.eni_room_addresses(r);
                }
            }
            for e in self.idle.iter() {
                if self
                    .enis
                    .get(&e.eni)
                    .is_some_and(|r| r.profile.as_ref() == Some(name))
                {
                    cap.idle += 1;
                    if e.eligible_at() <= now {
                        ready += 1;
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
            room += self
                .creating
                .values()
                .filter(|c| c.profile.as_ref() == Some(name))
                .map(|c| (self.per_eni * per_slot).saturating_sub(c.count))
                .sum::<u32>();
            let new_enis = net.max_enis.map_or(free_indexes, |m| {
                free_indexes.min(m.saturating_sub(cap.enis))
            });
            let grow = if self.subnet_backing_off(&net.subnet.id, now).is_some() {
                0
            } else {
                new_enis * self.per_eni * per_slot
            };
            cap.free = ready + (room + grow).min(self.capacity.available());
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
                let device_index = self.free_device_index().expect("checked above");
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
