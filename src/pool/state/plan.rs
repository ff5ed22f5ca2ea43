//! The maintainer's plan for one round: serve waiters for a new ENI, top up below `min_idle`, create
//! ENIs, give back beyond `max_idle`, release empty ENIs.

use super::*;

impl PoolState {
    /// Drops create waiters whose callers are gone, returning their tokens.
    pub(super) fn prune_create_waiters(&mut self) {
        let before = self.create_waiters.len();
        let mut kept = VecDeque::with_capacity(before);
        for w in std::mem::take(&mut self.create_waiters) {
            let followers_live = self
                .pending
                .get(&w.key)
                .is_some_and(|p| p.followers.iter().any(|f| !f.is_closed()));
            if w.respond_to.is_closed() && !followers_live {
                self.pending.remove(&w.key);
                self.capacity.give_back(1);
            } else {
                kept.push_back(w);
            }
        }
        self.create_waiters = kept;
    }

    /// Plans one maintainer round: serve waiters for a new ENI, top up below `min_idle`, give back
    /// beyond `max_idle` (past cooldown, not reserved, longest idle first, one unassign per ENI),
    /// create the ENIs the waiters need (in parallel; warming alone creates one per subnet), release empty ENIs nobody needs.
    pub fn plan_round(&mut self, now: Instant) -> RoundPlan {
        let mut plan = RoundPlan::default();
        if self.shutting_down {
            return plan;
        }
        self.prune_create_waiters();

        // 1. Waiters for a new ENI: idle IPs that became eligible, or ENIs that got room.
        for w in std::mem::take(&mut self.create_waiters) {
            if let Some(entry) = self.idle.pop_oldest(now) {
                // The idle IP already holds a token; the waiter's goes back.
                self.capacity.give_back(1);
                self.fulfil(w, entry.ip, entry.eni, now);
                continue;
            }
            match self.pick_eni(now) {
                Pick::Eni(id) => {
                    let r = self.enis.get_mut(&id).expect("picked ENI exists");
                    r.inflight += 1;
                    let handle = r.handle.clone().expect("pod ENIs have actors");
                    plan.reroutes.push((id, handle, w));
                }
                Pick::Blocked(err) => {
                    self.capacity.give_back(1);
                    self.fail_waiter(w, err);
                }
                Pick::NeedNewEni => self.create_waiters.push_back(w),
            }
        }

        // 2. Below min_idle, top up on ENIs with room — to halfway between min_idle and max_idle,
        //    not just to min_idle, so a trickle of pods costs one assign call per few pods rather
        //    than one per pod, and churn has room below max_idle before a give-back.
        let have = self.idle.unreserved(now) + self.warming;
        let mut deficit = if have < self.config.min_idle {
            self.config.refill_target().saturating_sub(have)
        } else {
            0
        };
        deficit = deficit.min(self.capacity.available());
        if deficit > 0 {
            let mut pods: Vec<(u32, EniId)> = self
                .enis
                .values()
                .filter(|r| {
                    r.role == EniRole::Pods
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
                let room = self.eni_room(&self.enis[&id]);
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
        let subnet_id = self.node.subnet_id.clone();
        let blocked_for_ip = self.enis.values().any(|r| {
            r.role == EniRole::Pods
                && self.eni_room(r) > 0
                && !r.phase.accepts_work(now)
                && r.phase != EniPhase::Draining
        });
        // Slots the ENIs being created here will have left for waiters once they are attached.
        let mut room_coming: u32 = self
            .creating
            .values()
            .filter(|c| c.subnet_id == subnet_id)
            .map(|c| self.per_eni.saturating_sub(c.count))
            .sum();
        loop {
            let creating_here = self.creating.values().any(|c| c.subnet_id == subnet_id);
            let uncovered = (self.create_waiters.len() as u32).saturating_sub(room_coming);
            let for_deficit = deficit > 0 && !blocked_for_ip && !creating_here;
            if uncovered == 0 && !for_deficit {
                break;
            }
            if self.creating.len() >= self.config.max_concurrent_eni_creates {
                break;
            }
            if let Some(err) = self.create_blocked(&subnet_id, now) {
                for w in std::mem::take(&mut self.create_waiters) {
                    self.capacity.give_back(1);
                    self.fail_waiter(w, err.clone());
                }
                break;
            }
            let Some(device_index) = self.free_device_index() else {
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
            let n_wait = uncovered.min(self.per_eni);
            let warm = self.capacity.take_up_to(deficit.min(self.per_eni - n_wait));
            deficit -= warm;
            self.warming += warm;
            let keep = self.create_waiters.len() - n_wait as usize;
            let waiters: Vec<Waiter> = self.create_waiters.drain(keep..).collect();
            let count = n_wait + warm;
            if count == 0 {
                break;
            }
            room_coming += self.per_eni - count;
            self.next_create_id += 1;
            let id = self.next_create_id;
            self.creating.insert(
                id,
                CreatingEni {
                    device_index,
                    subnet_id: subnet_id.clone(),
                    count,
                    warm,
                    started: now,
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
                count,
                waiters,
                describe_subnet,
            });
        }

        // 4. Give back beyond max_idle, only when nothing is waiting or warming.
        let quiet = self.create_waiters.is_empty() && self.creating.is_empty() && self.warming == 0;
        let unreserved = self.idle.unreserved(now);
        if quiet && unreserved > self.config.max_idle {
            let excess = (unreserved - self.config.max_idle) as usize;
            let chosen: Vec<(Ipv4Addr, EniId)> = self
                .idle
                .give_back_candidates(now)
                .into_iter()
                .filter(|e| {
                    self.enis
                        .get(&e.eni)
                        .is_some_and(|r| r.handle.is_some() && r.phase.accepts_work(now))
                })
                .take(excess)
                .map(|e| (e.ip, e.eni.clone()))
                .collect();
            let mut per_eni: BTreeMap<EniId, Vec<Ipv4Addr>> = BTreeMap::new();
            for (ip, eni) in chosen {
                if let Some(entry) = self.idle.remove(ip) {
                    self.releasing.insert(ip, entry);
                    per_eni.entry(eni).or_default().push(ip);
                }
            }
            for (eni, ips) in per_eni {
                let handle = self.enis[&eni].handle.clone().expect("filtered");
                plan.unassigns.push((eni, handle, ips));
            }
        }

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
