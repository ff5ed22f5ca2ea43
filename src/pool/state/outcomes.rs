//! Applying outcomes: what the ENI actors' assign/unassign calls and the maintainer's ENI creations
//! and releases returned, with the tokens, back-offs and waiters that follow from each.

use super::*;

impl PoolState {
    /// Answers a batch the actor will not send to the cloud.
    pub fn reject_assign(&mut self, eni: &EniId, pods: Vec<Waiter>, warm: u32, err: PoolError) {
        let n = pods.len() as u32 + warm;
        if n == 0 {
            return;
        }
        if let Some(r) = self.enis.get_mut(eni) {
            r.inflight = r.inflight.saturating_sub(n);
        }
        self.warming = self.warming.saturating_sub(warm);
        self.capacity.give_back(n);
        for w in pods {
            self.fail_waiter(w, err.clone());
        }
    }

    /// How the actor of `eni` fetches `count` addresses (its batch's pods and warm-ups) now.
    ///
    /// With prefix delegation it asks for whole prefixes, taking the tokens of the addresses beyond
    /// `count` (they join the batch as warm-ups: [`AssignPlan::Prefixes::extra`]); when the node has
    /// no tokens left for a whole prefix, or the subnet has no free `/28` for now, it asks for single
    /// addresses packed into blocks that are already fragmented.
    pub fn plan_assign(&mut self, eni: &EniId, count: u32, now: Instant) -> AssignPlan {
        if !self.config.prefix_delegation {
            return AssignPlan::Ips;
        }
        let Some(r) = self.enis.get(eni) else {
            return AssignPlan::Ips;
        };
        if self.prefixes_blocked(&r.subnet_id, now) {
            return AssignPlan::Packed;
        }
        let k = count.div_ceil(PREFIX_ADDRESSES);
        let extra = k * PREFIX_ADDRESSES - count;
        let got = self.capacity.take_up_to(extra);
        if got < extra {
            self.capacity.give_back(got);
            return AssignPlan::Packed;
        }
        let r = self.enis.get_mut(eni).expect("checked");
        r.inflight += extra;
        self.warming += extra;
        AssignPlan::Prefixes { count: k, extra }
    }

    /// A prefix plan's extra addresses that will not come (the prefixes failed): their tokens return.
    pub fn unplan_extra(&mut self, eni: &EniId, extra: u32) {
        if let Some(r) = self.enis.get_mut(eni) {
            r.inflight = r.inflight.saturating_sub(extra);
        }
        self.warming = self.warming.saturating_sub(extra);
        self.capacity.give_back(extra);
    }

    /// Fits a batch that goes to `eni` as single addresses (no free `/28`, or too few tokens for
    /// whole prefixes) to the ENI's free slots, one address per slot: EC2 refuses an assign beyond
    /// the per-interface limit for the whole batch. Warm-ups beyond go first (their tokens return),
    /// then the newest pods, which go back to the queue for a new ENI with their tokens. Returns the
    /// warm-ups kept; `pods` keeps the pods that fit.
    pub fn fit_single_addresses(&mut self, eni: &EniId, pods: &mut Vec<Waiter>, warm: u32) -> u32 {
        let Some(r) = self.enis.get(eni) else {
            return warm;
        };
        let room = self.per_eni.saturating_sub(r.slots_used());
        let over = (pods.len() as u32 + warm).saturating_sub(room);
        if over == 0 {
            return warm;
        }
        let dropped_warm = over.min(warm);
        let requeued = pods.split_off(pods.len() - (over - dropped_warm) as usize);
        tracing::info!(%eni, room, warm_dropped = dropped_warm, pods_requeued = requeued.len(),
            "single addresses: the batch is cut to the ENI's free slots");
        let r = self.enis.get_mut(eni).expect("checked");
        r.inflight = r.inflight.saturating_sub(over);
        self.warming = self.warming.saturating_sub(dropped_warm);
        self.capacity.give_back(dropped_warm);
        self.create_waiters.extend(requeued);
        warm - dropped_warm
    }

    /// Whether prefixes are off for now in `subnet_id` (no free `/28` at the last try).
    pub fn prefixes_blocked(&self, subnet_id: &str, now: Instant) -> bool {
        self.subnets
            .get(subnet_id)
            .and_then(|s| s.no_prefix.as_ref())
            .is_some_and(|b| b.until > now)
    }

    /// EC2 found no free `/28` in the subnet of `eni`: single packed addresses there until the
    /// back-off ends.
    pub fn no_free_prefix(&mut self, eni: &EniId, now: Instant) {
        if let Some(subnet_id) = self.enis.get(eni).map(|r| r.subnet_id.clone()) {
            self.no_free_prefix_in(&subnet_id, now);
        }
    }

    /// EC2 found no free `/28` in `subnet_id`.
    pub fn no_free_prefix_in(&mut self, subnet_id: &str, now: Instant) {
        let subnet_id = subnet_id.to_owned();
        let rec = self
            .subnets
            .entry(subnet_id.clone())
            .or_insert_with(|| SubnetRecord::new(None));
        let failures = rec.no_prefix.as_ref().map_or(1, |b| b.failures + 1);
        let delay = self.config.prefix_retry_after(failures);
        tracing::warn!(subnet = %subnet_id, failures, retry_in_s = delay.as_secs(),
            "no free /28 for a prefix in this subnet: serving single addresses packed into fragmented blocks");
        rec.no_prefix = Some(PrefixBackoff {
            until: now + delay,
            failures,
        });
    }

    /// The subnet of `eni`, as far as the pool knows it.
    pub fn subnet_of(&self, eni: &EniId) -> Option<Subnet> {
        let r = self.enis.get(eni)?;
        self.subnets.get(&r.subnet_id)?.subnet.clone()
    }

    /// A batch's assign succeeded with `ips` (and, with prefix delegation, the `prefixes` they came
    /// in).
    #[allow(clippy::too_many_arguments)]
    pub fn complete_assign(
        &mut self,
        eni: &EniId,
        ips: Vec<Ipv4Addr>,
        prefixes: &[Ipv4Net],
        pods: Vec<Waiter>,
        warm: u32,
        now: Instant,
    ) {
        let asked = pods.len() as u32 + warm;
        let got = ips.len() as u32;
        match self.enis.get_mut(eni) {
            Some(r) => {
                r.inflight = r.inflight.saturating_sub(asked);
                r.phase = r.phase.succeeded();
                r.ips.extend(ips.iter().copied());
                r.prefixes.extend(prefixes.iter().copied());
                if !prefixes.is_empty()
                    && let Some(s) = self.subnets.get_mut(&r.subnet_id)
                {
                    s.no_prefix = None;
                }
            }
            None => {
                // The ENI was forgotten while the call was out: its IPs are not the pool's.
                tracing::warn!(%eni, ips = ?ips, "assign completed for an ENI the pool forgot; not using its IPs");
                self.warming = self.warming.saturating_sub(warm);
                self.capacity.give_back(asked);
                for w in pods {
                    self.fail_waiter(
                        w,
                        PoolError::Cloud(CloudError::NotFound {
                            api: "AssignPrivateIpAddresses".into(),
                            code: "InvalidNetworkInterfaceID.NotFound".into(),
                            message: format!("{eni} is no longer attached to this instance"),
                        }),
                    );
                }
                return;
            }
        }
        self.warming = self.warming.saturating_sub(warm);
        if got > asked {
            self.capacity.take_existing(got - asked);
        } else {
            self.capacity.give_back(asked - got);
        }
        let mut ips = ips.into_iter();
        for w in pods {
            match ips.next() {
                Some(ip) => self.fulfil(w, ip, eni.clone(), now),
                None => {
                    let err = PoolError::Cloud(CloudError::Transient {
                        api: "AssignPrivateIpAddresses".into(),
                        message: format!("EC2 returned {got} of {asked} requested IPs"),
                    });
                    self.fail_waiter(w, err);
                }
            }
        }
        for ip in ips {
            self.park_idle(ip, eni.clone(), now, Duration::ZERO, None);
        }
    }

    /// A batch's assign failed: every waiter gets the error, tokens go back, the ENI (or subnet)
    /// backs off. Returns the error the waiters got.
    pub fn fail_assign(
        &mut self,
        eni: &EniId,
        err: CloudError,
        pods: Vec<Waiter>,
        warm: u32,
        now: Instant,
    ) -> PoolError {
        let subnet_backoff = self.config.subnet_backoff;
        let subnet_id = self
            .enis
            .get(eni)
            .map(|r| r.subnet_id.clone())
            .unwrap_or_default();
        let pool_err = match &err {
            CloudError::SubnetFull { .. } | CloudError::AttachmentLimitExceeded { .. } => {
                if matches!(err, CloudError::SubnetFull { .. }) {
                    self.subnet_seen_full(&subnet_id);
                }
                self.back_off_subnet(&subnet_id, SubnetBackoffKind::Exhausted, err.clone(), now);
                PoolError::Exhausted {
                    reason: ExhaustionReason::Cloud {
                        subnet_id,
                        error: Box::new(err.clone()),
                    },
                    retry_after: Some(subnet_backoff),
                }
            }
            CloudError::IpLimitExceeded { .. } => {
                if let Some(r) = self.enis.get_mut(eni) {
                    r.phase = r.phase.failed(err.clone(), now, |_| subnet_backoff);
                }
                PoolError::Exhausted {
                    reason: ExhaustionReason::Cloud {
                        subnet_id,
                        error: Box::new(err.clone()),
                    },
                    retry_after: Some(subnet_backoff),
                }
            }
            e if e.is_not_found() => {
                // EC2 does not know the ENI (any more): serve nothing from it until the running
                // reconcile confirms (forgotten) or refutes (serving again).
                self.suspend_eni(eni, now);
                PoolError::Cloud(err)
            }
            _ => {
                let cfg = self.config.clone();
                if let Some(r) = self.enis.get_mut(eni) {
                    r.phase = r.phase.failed(err.clone(), now, |n| cfg.backoff_after(n));
                }
                PoolError::Cloud(err)
            }
        };
        self.reject_assign(eni, pods, warm, pool_err.clone());
        pool_err
    }

    /// IPs given back to EC2: tokens return.
    pub fn complete_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) {
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
    pub fn settle_failed_unassign(
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
    pub fn fail_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], err: CloudError, now: Instant) {
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
    pub fn unassign_abandoned(&mut self, _eni: &EniId, ips: &[Ipv4Addr]) {
        for ip in ips {
            if let Some(entry) = self.releasing.remove(ip) {
                self.idle.reinsert(entry);
            }
        }
    }

    /// The ENI is gone from EC2.
    pub fn complete_release(&mut self, eni: &EniId) {
        if let Some(r) = self.enis.remove(eni)
            && !r.ips.is_empty()
        {
            tracing::error!(%eni, ips = r.ips.len(), "released an ENI that still held IPs");
        }
    }

    /// The ENI could not be released: it serves again, and is not retried for a back-off.
    pub fn fail_release(&mut self, eni: &EniId, now: Instant) {
        let delay = self.config.eni_backoff_max;
        if let Some(r) = self.enis.get_mut(eni) {
            r.phase = EniPhase::Serving;
            r.release_retry_at = Some(now + delay);
        }
    }

    /// Registers an ENI the maintainer created, with its actor, and serves the create's waiters.
    #[allow(clippy::too_many_arguments)]
    pub fn complete_create(
        &mut self,
        id: u64,
        eni: Eni,
        handle: EniHandle,
        task: JoinHandle<()>,
        waiters: Vec<Waiter>,
        now: Instant,
    ) {
        let Some(c) = self.creating.remove(&id) else {
            tracing::error!(eni = %eni.id, "completed an unknown ENI creation");
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        tracing::debug!(eni = %eni.id, took_ms = (now - c.started).as_millis() as u64, "ENI creation done");
        let addresses = eni.pod_addresses();
        let got = addresses.len() as u32;
        if got > c.count {
            self.capacity.take_existing(got - c.count);
        } else {
            self.capacity.give_back(c.count - got);
        }
        let (handle, task) = if self.shutting_down {
            // The actor ends as soon as its only handle is dropped here.
            (None, None)
        } else {
            (Some(handle), Some(task))
        };
        let device_index = eni
            .attachment
            .as_ref()
            .map_or(c.device_index, |a| a.device_index);
        let eni_id = eni.id.clone();
        let ips = addresses;
        let prefixes: BTreeSet<Ipv4Net> = eni.ipv4_prefixes.iter().copied().collect();
        self.enis.insert(
            eni_id.clone(),
            EniRecord {
                id: eni_id.clone(),
                mac: eni.mac.clone(),
                device_index,
                subnet_id: eni.subnet_id.clone(),
                primary_ip: eni.primary_ip,
                role: EniRole::Pods,
                serves: true,
                prefixes,
                ips: ips.iter().copied().collect(),
                inflight: 0,
                phase: EniPhase::Serving,
                release_retry_at: None,
                cloud: Some(eni),
                handle,
                task,
            },
        );
        if let Some(s) = self.subnets.get_mut(&c.subnet_id)
            && s.backoff
                .as_ref()
                .is_some_and(|b| b.kind == SubnetBackoffKind::CreateFailing)
        {
            s.backoff = None;
        }
        let mut ips = ips.into_iter();
        for w in waiters {
            match ips.next() {
                Some(ip) => self.fulfil(w, ip, eni_id.clone(), now),
                None => {
                    // Fewer IPs than asked: the waiter goes back in line for the next round.
                    if self.capacity.try_take(1) {
                        self.create_waiters.push_front(w);
                    } else {
                        let err = self.capacity_reached(now);
                        self.fail_waiter(w, err);
                    }
                }
            }
        }
        for ip in ips {
            self.idle
                .push(ip, eni_id.clone(), now, Duration::ZERO, None);
        }
    }

    /// An ENI creation failed: waiters get the error, tokens go back, the subnet backs off.
    /// A creation that EC2 refused for want of a free `/28` (prefixes are now off in its subnet, see
    /// [`PoolState::no_free_prefix_in`]): the warm-ups' tokens return, the waiters go back to the
    /// queue with theirs, and the next planning round creates the ENI with single addresses.
    pub fn requeue_create(&mut self, id: u64, waiters: Vec<Waiter>) {
        let Some(c) = self.creating.remove(&id) else {
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        self.capacity
            .give_back(c.count.saturating_sub(waiters.len() as u32));
        self.create_waiters.extend(waiters);
    }

    pub fn fail_create(&mut self, id: u64, err: CloudError, waiters: Vec<Waiter>, now: Instant) {
        let Some(c) = self.creating.remove(&id) else {
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        self.capacity.give_back(c.count);
        let pool_err = if err.is_capacity() {
            if matches!(err, CloudError::SubnetFull { .. }) {
                self.subnet_seen_full(&c.subnet_id);
            }
            self.back_off_subnet(&c.subnet_id, SubnetBackoffKind::Exhausted, err.clone(), now);
            PoolError::Exhausted {
                reason: ExhaustionReason::Cloud {
                    subnet_id: c.subnet_id.clone(),
                    error: Box::new(err),
                },
                retry_after: Some(self.config.subnet_backoff),
            }
        } else {
            self.back_off_subnet(
                &c.subnet_id,
                SubnetBackoffKind::CreateFailing,
                err.clone(),
                now,
            );
            PoolError::Cloud(err)
        };
        for w in waiters {
            self.fail_waiter(w, pool_err.clone());
        }
    }
}
