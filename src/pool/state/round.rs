//! The maintainer's plan for one round: serve waiters for a new ENI, top up below the warm level,
//! create ENIs, give back beyond it, release empty ENIs.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::{CreatingEni, EniRole, Pick, PoolState};
use crate::cloud::lifecycle::Slots;
use crate::cloud::{Eni, LiveCount};
use crate::model::EniId;
use crate::pool::config::{PREFIX_ADDRESSES, WarmPolicy};
use crate::pool::demand::{self, NodeLoad, WarmLevels};
use crate::pool::error::{BackoffTarget, PoolError};
use crate::pool::growth;
use crate::pool::types::{EniHandle, EniPhase, Waiter};

/// One ENI creation the maintainer decided on.
pub(crate) struct CreatePlan {
    pub id: u64,
    pub device_index: u32,
    pub subnet_id: String,
    /// What the ENI is created with (pods + warm-ups, in single IPs or prefixes).
    pub slots: Slots,
    pub waiters: Vec<Waiter>,
    /// The subnet's CIDR is not known yet: describe it first.
    pub describe_subnet: bool,
    /// The network profile it is created for (tagged so), `None` for the default network.
    pub network: Option<String>,
    /// The profile's security groups; `None`: the default network's
    /// ([`PoolState::new_eni_security_groups`]).
    pub security_groups: Option<Vec<String>>,
    /// The count the create asks for at each attempt, raised by later rounds while EC2 throttles
    /// it ([`CreatingEni::live`]); `None`: `slots` as planned.
    pub live: Option<LiveCount>,
}

/// What one maintainer round does.
#[derive(Default)]
pub(crate) struct RoundPlan {
    pub reroutes: Vec<(EniId, EniHandle, Waiter)>,
    pub warms: Vec<(EniId, EniHandle, u32)>,
    pub unassigns: Vec<(EniId, EniHandle, Vec<Ipv4Addr>, Vec<Ipv4Net>)>,
    pub creates: Vec<CreatePlan>,
    pub releases: Vec<(EniId, EniHandle)>,
}

impl RoundPlan {
    pub fn is_empty(&self) -> bool {
        self.reroutes.is_empty()
            && self.warms.is_empty()
            && self.unassigns.is_empty()
            && self.creates.is_empty()
            && self.releases.is_empty()
    }
}

impl PoolState {
    /// The warm levels of the configured policy at `now` (see [`crate::pool::demand`]).
    pub fn warm_levels(&self, now: Instant) -> WarmLevels {
        // Short: every pod subnet EC2 told us about has under a tenth of its addresses free.
        let mut known = self
            .pod_subnets
            .iter()
            .filter_map(|id| self.subnets.get(id))
            .filter(|r| r.free_known)
            .filter_map(|r| r.subnet.as_ref())
            .peekable();
        let subnet_short = known.peek().is_some()
            && known.all(|s| {
                let size = 1u64 << (32 - u32::from(s.cidr.prefix_len()));
                u64::from(s.available_ips) * 10 < size
            });
        let load = NodeLoad {
            in_use: self.allocations.len() as u32,
            subnet_short,
        };
        let levels = demand::warm_levels(&self.config, &self.demand, load, now);
        if load.in_use >= self.launch_floor {
            return levels;
        }
        // The launch's addresses (`launch_floor`) were sized for the node's pods: until the pods
        // outgrow them, none is given back, and a burst within them wants no warm-up beyond them.
        let left = self.launch_floor - load.in_use;
        let ahead = left.max(self.config.min_idle);
        WarmLevels {
            low: levels.low.min(ahead),
            fill: levels.fill.min(ahead),
            keep: levels.keep.max(left),
            down_to: levels.down_to.max(left),
        }
    }

    /// Drops create waiters whose callers are gone, returning their tokens.
    fn prune_create_waiters(&mut self) {
        let before = self.create_waiters.len();
        let mut kept = VecDeque::with_capacity(before);
        for w in std::mem::take(&mut self.create_waiters) {
            let followers_live = self
                .pending
                .get(&w.req.key)
                .is_some_and(|p| p.followers.iter().any(|f| !f.is_closed()));
            if w.respond_to.is_closed() && !followers_live {
                self.pending.remove(&w.req.key);
                self.capacity.give_back(1);
            } else {
                kept.push_back(w);
            }
        }
        self.create_waiters = kept;
    }

    /// Answers the waiters that waited out EC2's slowness (throttling, a back-off) up to their
    /// deadline: [`PoolError::WaitedTooLong`], their tokens back. A waiter for a new ENI that met
    /// no failure is not timed out here (its create is on the way; its caller may cancel).
    fn expire_waiters(&mut self, now: Instant) {
        let mut kept = VecDeque::with_capacity(self.create_waiters.len());
        for mut w in std::mem::take(&mut self.create_waiters) {
            match w.waiting_on.take() {
                Some(last) if w.deadline <= now => {
                    self.capacity.give_back(1);
                    let err = PoolError::WaitedTooLong {
                        waited: now - w.enqueued_at,
                        last_error: last,
                    };
                    self.fail_waiter(w, err);
                }
                last => {
                    w.waiting_on = last;
                    kept.push_back(w);
                }
            }
        }
        self.create_waiters = kept;
    }

    /// When the maintainer should run a round next for the waiters in line, beyond its tick: the
    /// earliest end of a back-off they wait out, or of a waiter's budget.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        let mut deadlines = self
            .create_waiters
            .iter()
            .filter(|w| w.waiting_on.is_some())
            .map(|w| w.deadline)
            .peekable();
        deadlines.peek()?;
        let enis = self.enis.values().filter_map(|r| match r.phase {
            EniPhase::BackingOff { until, .. } if r.serves && until > now => Some(until),
            _ => None,
        });
        let subnets = self
            .subnets
            .values()
            .filter_map(|s| s.backoff.as_ref())
            .map(|b| b.until)
            .filter(|t| *t > now);
        deadlines.chain(enis).chain(subnets).min()
    }

    /// With burst prefixes, the node took the create path for a burst (an ENI of the default
    /// network is being created) while EC2 throttles its assigns (`assign_contended`): one growth
    /// call per burst, so the burst's later pods wait for that ENI's room, not for an assign on
    /// eth0 too, which would take a token of the bucket other nodes' pods wait on.
    fn committed_to_create(&self) -> bool {
        self.burst_prefixes()
            && self.assign_contended
            && self.creating.values().any(|c| c.profile.is_none())
    }

    /// Where a waiter of the default network (`default_network`) blocked by `err` goes
    /// ([`growth::blocked_path`]).
    fn blocked_path(
        &self,
        err: &PoolError,
        default_network: bool,
        now: Instant,
    ) -> growth::BlockedPath {
        let blockage = match err {
            PoolError::BackingOff {
                target: BackoffTarget::Eni(_),
                last_error,
                ..
            } if last_error.is_throttle() => growth::Blockage::Throttled,
            _ => growth::Blockage::Other,
        };
        growth::blocked_path(
            self.burst_prefixes() && default_network,
            blockage,
            self.growth_contended,
            self.free_device_index_for(None, now).is_some(),
        )
    }

    /// Plans one maintainer round: serve waiters for a new ENI, top up below the warm level, give
    /// back beyond it (past cooldown, not reserved, longest idle first, one unassign per ENI),
    /// create the ENIs the waiters need (in parallel; warming alone creates one per subnet, and none
    /// while [`PoolState::growth_contended`]), release empty ENIs nobody needs.
    pub fn plan_round(&mut self, now: Instant) -> RoundPlan {
        let mut plan = RoundPlan::default();
        if self.shutting_down {
            return plan;
        }
        self.prune_create_waiters();
        self.expire_waiters(now);

        // 0. Acquires waiting for warm IPs in flight: served as those land; once nothing is
        //    warming, they take a token freed meanwhile (and go the way of a new IP) or fail.
        // (Warm waiters are the default network's: a profile's acquire never waits for warm-ups.)
        let default_enis = self.enis_of(None);
        for w in std::mem::take(&mut self.warm_waiters) {
            if let Some(entry) = self.idle.pop_oldest_on(now, |e| default_enis.contains(e)) {
                // The idle IP holds the token; the waiter held none.
                self.fulfil(w, entry.ip, entry.eni, now);
            } else if self.warming as usize > self.warm_waiters.len() {
                self.warm_waiters.push_back(w);
            } else if self.capacity.try_take(1) {
                self.create_waiters.push_front(w);
            } else {
                let err = self.capacity_reached(now);
                self.fail_waiter(w, err);
            }
        }

        // 1. Waiters in line: idle IPs that became eligible, or ENIs that got room (or take calls
        //    again after a back-off: every such waiter of the node goes to the ENI in this round,
        //    and the actor sends them in one call). Those still blocked by a back-off wait on,
        //    outside the count of waiters that need a new ENI (step 3), since the ENI they wait
        //    for has room.
        //    A waiter of a profile takes only its profile's IPs and ENIs; one of a profile the node
        //    no longer serves is answered.
        let mut blocked: Vec<Waiter> = Vec::new();
        for w in std::mem::take(&mut self.create_waiters) {
            let network = w.req.network.clone();
            if let Some(p) = &network
                && !self.profiles.contains_key(p)
            {
                self.capacity.give_back(1);
                self.fail_waiter(w, Self::unknown_profile(p));
                continue;
            }
            let mine = self.enis_of(network.as_ref());
            if let Some(entry) = self.idle.pop_oldest_on(now, |e| mine.contains(e)) {
                // The idle IP already holds a token; the waiter's goes back.
                self.capacity.give_back(1);
                self.fulfil(w, entry.ip, entry.eni, now);
                continue;
            }
            if network.is_none() && self.committed_to_create() {
                // The burst fell over to a new ENI while the assign bucket is dry: its pods wait
                // for that ENI's room (step 3 counts it) rather than spend an assign as well.
                self.create_waiters.push_back(w);
                continue;
            }
            match self.pick_eni(now, network.as_ref()) {
                Pick::Eni(id) => {
                    let r = self.enis.get_mut(&id).expect("picked ENI exists");
                    r.inflight += 1;
                    let handle = r.handle.clone().expect("pod ENIs have actors");
                    plan.reroutes.push((id, handle, w));
                }
                Pick::Blocked(err) => match self.blocked_path(&err, network.is_none(), now) {
                    // EC2 throttled the assign on the ENI with room: a new ENI carries the pod in
                    // its create, on the create bucket, now (step 3).
                    growth::BlockedPath::NewEni => self.create_waiters.push_back(w),
                    growth::BlockedPath::Wait => blocked.extend(self.hold_or_fail(w, err, now)),
                },
                Pick::NeedNewEni => self.create_waiters.push_back(w),
            }
        }

        // 2. Below the warm level, top up on ENIs with room — to the fill level, not just to the
        //    low mark, so a trickle of pods costs one assign call per few pods rather than one per
        //    pod, and churn has room below the give-back level (see `pool::demand`).
        let levels = self.warm_levels(now);
        let have = self.warm_on_hand(now);
        let mut deficit = if have < levels.low {
            levels.fill.saturating_sub(have)
        } else {
            0
        };
        deficit = deficit.min(self.capacity.available());
        // Under contention on assigns (EC2 throttled one from this node within the minute) a
        // warm-up alone is not worth a call: its tokens are ones pods, here or on other nodes, are
        // waiting on. The warm-ups then ride along in the pods' own calls
        // (`PoolState::plan_assign`). So do the IPs of pods bound here and not yet ADDed (the
        // lookahead): their ADDs follow within a second or so, and a call of their own would carry
        // only the pods bound so far, then the later ones need another. At a 500-node scale-up
        // that made the first assign of many nodes a small one, and p99 went from 95 s to 118 s.
        // No ENI is created instead either, while one has room.
        // A booting node's first warm-up is what its pods wait on (its startup taint holds them
        // until the pool is warm): never held.
        if self.first_warm_pending && (!self.booting() || self.default_idle_unreserved(now) > 0) {
            self.first_warm_pending = false;
        }
        let hold_warm_ups = self.assign_contended && !self.booting();
        if hold_warm_ups
            && self.enis.values().any(|r| {
                r.serves && r.profile.is_none() && r.handle.is_some() && self.eni_room(r) > 0
            })
        {
            deficit = 0;
        }
        if deficit > 0 && !hold_warm_ups {
            let mut pods: Vec<(u32, EniId)> = self
                .enis
                .values()
                .filter(|r| {
                    r.serves
                        && r.profile.is_none()
                        && r.handle.is_some()
                        && r.phase.accepts_work(now)
                        && self.subnet_exhausted(&r.subnet_id, now).is_none()
                })
                .map(|r| (r.device_index, r.id.clone()))
                .collect();
            pods.sort();
            for (_, id) in pods {
                if deficit == 0 {
                    break;
                }
                let room = self.eni_room_now(&self.enis[&id], now);
                let n = room.min(deficit);
                if n == 0 {
                    continue;
                }
                let n = self.capacity.take_up_to(n);
                let r = self.enis.get_mut(&id).expect("listed above");
                r.inflight += n;
                self.warming += n;
                deficit -= n;
                plan.warms
                    .push((id, r.handle.clone().expect("filtered"), n));
            }
        }

        // 3. New ENIs, carrying the IPs for their waiters and the rest of the deficit. Waiters
        //    beyond the room that ENIs already being created will have get ENIs of their own,
        //    created in parallel (up to `max_concurrent_eni_creates`), so a burst needing k ENIs
        //    waits for one create+attach chain, not k in a row; the warm deficit alone never
        //    starts a second create in a subnet.
        //    Profiles' waiters get ENIs of their profile's (after the default network's).
        let (profile_waiters, default_waiters): (Vec<Waiter>, Vec<Waiter>) =
            std::mem::take(&mut self.create_waiters)
                .into_iter()
                .partition(|w| w.req.network.is_some());
        self.create_waiters = default_waiters.into();
        let subnet_id = self.pick_subnet(now);
        // Slots of a new ENI here may take whole /28s (prefix delegation, or burst prefixes) unless
        // the subnet has no free /28: then it comes with single addresses, one per slot.
        let prefixes_here = self.prefix_slots() && !self.prefixes_blocked(&subnet_id, now);
        let per_slot = if self.prefix_slots() {
            PREFIX_ADDRESSES
        } else {
            1
        };
        let per_eni_addresses = if prefixes_here {
            self.per_eni * per_slot
        } else {
            self.per_eni
        };
        let blocked_for_ip = self.enis.values().any(|r| {
            r.serves
                && r.profile.is_none()
                && self.eni_room(r) > 0
                && !r.phase.accepts_work(now)
                && r.phase != EniPhase::Draining
        });
        // Slots the ENIs being created here will have left for waiters once they are attached,
        // and the warm-ups in flight no warm waiter has claimed (top-ups on attached ENIs, those
        // riding in pods' calls, the warm part of creates): the waiters in line take them as they
        // land (step 1), so an ENI is created for a waiter only when none of those will serve it.
        // Otherwise pods arriving while a top-up is on the wire would each start an ENI's create,
        // attach and modify, in a scale-up the account's scarcest calls.
        let warm_coming = self.warming.saturating_sub(self.warm_waiters.len() as u32);
        let mut room_coming: u32 = self
            .creating
            .values()
            .filter(|c| c.subnet_id == subnet_id && c.profile.is_none())
            .map(|c| per_eni_addresses.saturating_sub(c.count))
            .sum::<u32>()
            + warm_coming;
        self.grow_creates(&subnet_id, warm_coming);
        loop {
            let creating_here = self
                .creating
                .values()
                .any(|c| c.subnet_id == subnet_id && c.profile.is_none());
            let uncovered = (self.create_waiters.len() as u32).saturating_sub(room_coming);
            // Under account contention (EC2 throttled the node's creates or attaches lately) no
            // ENI is started for warm-ups alone: its create, attach and modify would spend tokens
            // of buckets that pods, here or on other nodes, are waiting on. Warm-ups still ride
            // along in a create that carries waiters (they cost no extra call), and top-ups on
            // ENIs with room go on (step 2).
            // Nor, with the adaptive policy, for the part of a burst only remembered (the last
            // burst was larger than this one so far): at a fleet's repeated scale-up every node
            // would start one at once, on buckets its pods' own creates need. The remembered
            // warm-ups ride along in the pods' create instead, when they come. (A fixed policy's
            // levels are the operator's, and kept.)
            let remembered = self.config.warm_policy == WarmPolicy::Adaptive
                && self.demand.remembered_burst_ahead(now);
            let for_deficit = deficit > 0
                && !blocked_for_ip
                && !creating_here
                && !self.growth_contended
                && !remembered;
            if uncovered == 0 && !for_deficit {
                break;
            }
            if self.creating.len() >= self.config.max_concurrent_eni_creates {
                break;
            }
            if let Some(err) = self.create_blocked(&subnet_id, now) {
                for w in std::mem::take(&mut self.create_waiters) {
                    self.wait_or_fail(w, err.clone(), now);
                }
                break;
            }
            let Some(device_index) = self.free_device_index_for(None, now) else {
                if self.creating.is_empty() && !self.any_draining() {
                    let err = self.no_eni_slot();
                    for w in std::mem::take(&mut self.create_waiters) {
                        self.capacity.give_back(1);
                        self.fail_waiter(w, err.clone());
                    }
                }
                break;
            };
            // The waiters this ENI carries: those not covered by ENIs already coming, taken
            // from the back of the queue so the oldest keep their place for the coming room.
            let n_wait = uncovered.min(per_eni_addresses);
            let mut warm = self
                .capacity
                .take_up_to(deficit.min(per_eni_addresses - n_wait));
            deficit -= warm;
            let keep = self.create_waiters.len() - n_wait as usize;
            let mut waiters: Vec<Waiter> = self.create_waiters.drain(keep..).collect();
            let mut count = n_wait + warm;
            let mut singles_in_prefix_mode = false;
            if count == 0 {
                break;
            }
            // With prefix delegation the ENI comes with whole prefixes; with burst prefixes, with
            // whole prefixes when the burst it carries is large enough ([`growth::create_prefixes`]).
            // The addresses beyond the count join as warm-ups, when the node has the tokens; else
            // single addresses.
            let prefixes = if !prefixes_here {
                None
            } else if self.config.prefix_delegation {
                Some(count.div_ceil(PREFIX_ADDRESSES))
            } else {
                growth::create_prefixes(
                    n_wait,
                    warm,
                    self.per_eni,
                    true,
                    self.capacity.available(),
                    self.demand.ongoing_burst(now).is_some(),
                )
            };
            let mut whole = None;
            if let Some(k) = prefixes {
                let addresses = k * PREFIX_ADDRESSES;
                if addresses < count {
                    // Burst prefixes: warm-ups beyond whole prefixes wait for a later top-up.
                    let dropped_warm = count - addresses;
                    warm -= dropped_warm;
                    self.capacity.give_back(dropped_warm);
                    deficit += dropped_warm;
                    count = addresses;
                }
                let extra = addresses - count;
                let got = self.capacity.take_up_to(extra);
                if got == extra {
                    warm += extra;
                    count += extra;
                    whole = Some(Slots::Prefixes(k));
                } else {
                    self.capacity.give_back(got);
                }
            }
            let slots = match whole {
                Some(prefixes) => prefixes,
                None if prefixes_here => {
                    // Single addresses where slots take prefixes (too few tokens for whole
                    // prefixes, or a burst small enough for singles): one per slot. Beyond the
                    // ENI's slots, warm-ups' tokens return and the newest waiters go back to the
                    // queue (EC2 refuses a create beyond the per-interface limit outright).
                    let over = count.saturating_sub(self.per_eni);
                    let dropped_warm = over.min(warm);
                    warm -= dropped_warm;
                    self.capacity.give_back(dropped_warm);
                    deficit += dropped_warm;
                    let back = (over - dropped_warm) as usize;
                    self.create_waiters
                        .extend(waiters.split_off(waiters.len() - back));
                    count -= over;
                    singles_in_prefix_mode = true;
                    Slots::Ips(count)
                }
                None => Slots::Ips(count),
            };
            self.warming += warm;
            room_coming += if singles_in_prefix_mode {
                // Its free slots take prefixes later.
                (self.per_eni - count) * per_slot
            } else {
                per_eni_addresses - count
            };
            self.next_create_id += 1;
            let id = self.next_create_id;
            // Single IPs, EC2 picking them: the count may grow while EC2 throttles the create.
            let live = matches!(slots, Slots::Ips(_) if !self.config.prefix_delegation)
                .then(|| LiveCount::new(count));
            self.creating.insert(
                id,
                CreatingEni {
                    device_index,
                    subnet_id: subnet_id.clone(),
                    profile: None,
                    count,
                    warm,
                    started: now,
                    live: live.clone(),
                },
            );
            let describe_subnet = self
                .subnets
                .get(&subnet_id)
                .is_none_or(|s| s.subnet.is_none());
            plan.creates.push(CreatePlan {
                id,
                device_index,
                subnet_id: subnet_id.clone(),
                slots,
                waiters,
                describe_subnet,
                network: None,
                security_groups: None,
                live,
            });
        }

        self.plan_profile_creates(profile_waiters, &mut plan, now);

        // The waiters blocked by a back-off stay in line, ahead of the rest.
        for w in blocked.into_iter().rev() {
            self.create_waiters.push_front(w);
        }

        // 4. Give back beyond the keep level (down to its target), only when nothing is waiting or
        //    warming.
        let quiet = self.create_waiters.is_empty() && self.creating.is_empty() && self.warming == 0;
        self.plan_give_backs(levels, quiet, &mut plan, now);

        // 5. Release ENIs that hold no IP, when nothing needs them.
        if quiet && deficit == 0 && plan.warms.is_empty() {
            for r in self.enis.values_mut() {
                let empty = r.role == EniRole::Pods && r.ips.is_empty() && r.inflight == 0;
                let may = r.phase.accepts_work(now) && r.release_retry_at.is_none_or(|t| t <= now);
                if empty
                    && may
                    && r.cloud.as_ref().is_none_or(Eni::is_managed_by_us)
                    && let Some(handle) = r.handle.clone()
                {
                    r.phase = EniPhase::Draining;
                    plan.releases.push((r.id.clone(), handle));
                }
            }
        }
        plan
    }
}
