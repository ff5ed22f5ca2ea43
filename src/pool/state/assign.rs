//! An ENI actor's assign batch: the plan for it ([`PoolState::plan_assign`]: refused, single IPs,
//! `/28` prefixes, or single addresses packed into fragmented blocks, cut to the ENI's free slots),
//! and what it came to, settled in one call ([`PoolState::settle_assign`]): IPs to the waiters and
//! the idle queue, or the ENI (or subnet) backing off and every waiter either back in line (EC2 was
//! only slow: throttled, a transient failure) or answered with the error.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::{PoolState, SubnetBackoffKind};
use crate::cloud::CloudError;
use crate::model::EniId;
use crate::pool::config::{PREFIX_ADDRESSES, WarmPolicy};
use crate::pool::error::{BackoffTarget, ExhaustionReason, PoolError};
use crate::pool::growth::{self, AssignSize};
use crate::pool::types::{AssignBatch, AssignOutcome, AssignPlan, EniPhase, Packed, Waiter};

/// The longest an ENI backs off after EC2 throttled a pods' assign: the throttle gate's longest
/// pause (`cloud::throttle`), which is also the kubelet's own retry period.
const THROTTLED_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl PoolState {
    /// The plan for `batch` on `eni` now.
    ///
    /// - The ENI takes no work (draining, backing off, its subnet exhausted): the batch is answered
    ///   with the error, its tokens return ([`AssignPlan::Refused`]; `batch` is left empty).
    /// - With prefix delegation, whole prefixes: the addresses beyond the batch join it as warm-ups
    ///   (`batch.warm` grows by `extra`, their tokens taken).
    /// - Single addresses packed into fragmented blocks (no free `/28`, or too few tokens for whole
    ///   prefixes): the batch is cut to the ENI's free slots first.
    pub fn plan_assign(
        &mut self,
        eni: &EniId,
        batch: &mut AssignBatch,
        now: Instant,
    ) -> AssignPlan {
        if let Err(err) = self.eni_accepts_work(eni, now) {
            let pods = std::mem::take(&mut batch.pods);
            let warm = std::mem::take(&mut batch.warm);
            self.reject_assign(eni, pods, warm, err.clone(), now);
            return AssignPlan::Refused(err);
        }
        if self.burst_sized(eni, now) {
            return self.plan_burst(eni, batch, now);
        }
        match self.how_to_assign(eni, batch.count(), now) {
            AssignPlan::Prefixes { count, extra } => {
                batch.warm += extra;
                AssignPlan::Prefixes { count, extra }
            }
            AssignPlan::Packed(_) => AssignPlan::Packed(self.fit_packed(eni, batch)),
            AssignPlan::Ips { count } if !batch.pods.is_empty() => {
                let extra = self.ride_along(eni, now);
                batch.warm += extra;
                AssignPlan::Ips {
                    count: count + extra,
                }
            }
            plan => plan,
        }
    }

    /// Whether an assign on `eni` is sized by [`growth::assign_size`]: burst prefixes on, a
    /// default-network ENI, its subnet with free `/28`s as far as the pool knows.
    fn burst_sized(&self, eni: &EniId, now: Instant) -> bool {
        self.burst_prefixes()
            && self
                .enis
                .get(eni)
                .is_some_and(|r| r.profile.is_none() && !self.prefixes_blocked(&r.subnet_id, now))
    }

    /// The plan for `batch` on `eni` with burst prefixes: the warm-ups that ride along first (a
    /// pods' call), then one call sized to the whole ([`growth::assign_size`]): whole `/28`s whose
    /// rounding up joins the batch as warm-ups (their tokens taken), or single IPs cut to the
    /// ENI's free slots (the pods beyond go back in line and come again in one batch).
    fn plan_burst(&mut self, eni: &EniId, batch: &mut AssignBatch, now: Instant) -> AssignPlan {
        if !batch.pods.is_empty() {
            batch.warm += self.ride_along(eni, now);
        }
        let free_slots = self
            .enis
            .get(eni)
            .map_or(0, |r| self.per_eni.saturating_sub(r.slots_used()));
        let size = growth::assign_size(
            batch.pods.len() as u32,
            batch.warm,
            free_slots,
            true,
            self.capacity.available(),
            self.demand.ongoing_burst(now).is_some() || self.booting(),
        );
        match size {
            AssignSize::Prefixes { count, warm } => {
                let r = self.enis.get_mut(eni).expect("checked above");
                if warm >= batch.warm {
                    let more = warm - batch.warm;
                    let got = self.capacity.take_up_to(more);
                    debug_assert_eq!(got, more, "assign_size checked the tokens");
                    r.inflight += got;
                    self.warming += got;
                } else {
                    // Warm-ups beyond whole prefixes wait for the next top-up.
                    let less = batch.warm - warm;
                    r.inflight = r.inflight.saturating_sub(less);
                    self.warming = self.warming.saturating_sub(less);
                    self.capacity.give_back(less);
                }
                let extra = warm.saturating_sub(batch.warm);
                batch.warm = warm;
                AssignPlan::Prefixes { count, extra }
            }
            AssignSize::Singles => {
                batch.warm = self.fit_single_addresses(eni, &mut batch.pods, batch.warm);
                AssignPlan::Ips {
                    count: batch.count(),
                }
            }
        }
    }

    /// Warm-ups that ride along in a pods' assign on `eni`: when the node is below its low mark,
    /// the maintainer would top up to the fill level in a call of its own right after this one;
    /// in this call the same addresses cost EC2 no extra call and no extra token. Within the
    /// ENI's room and the node's tokens; counted as warming, like the maintainer's. At or above
    /// the low mark nothing rides along: the levels held are the policy's, only the calls fewer
    /// (under assign contention, see below, up to the give-back level instead).
    fn ride_along(&mut self, eni: &EniId, now: Instant) -> u32 {
        let levels = self.warm_levels(now);
        let have = self.warm_on_hand(now);
        // Under assign contention (EC2 throttled one from this node lately) every assign call is
        // scarce and warm-ups make none of their own: with the adaptive policy the pods' call
        // takes the node up to its give-back level, the most it holds without giving back,
        // rather than the fill level (a fixed policy's levels are the operator's, and kept).
        let adaptive = self.config.warm_policy == WarmPolicy::Adaptive;
        let (below, target) = if self.assign_contended && adaptive {
            (levels.keep, levels.keep.max(levels.fill))
        } else {
            (levels.low, levels.fill)
        };
        if have >= below || self.is_profile_eni(eni) {
            // (A profile's ENI carries no warm-ups: the levels are the default network's.)
            return 0;
        }
        let want = target.saturating_sub(have);
        let Some(r) = self.enis.get(eni) else {
            return 0;
        };
        let room = self.eni_room_now(r, now);
        let extra = self.capacity.take_up_to(want.min(room));
        if extra > 0 {
            let r = self.enis.get_mut(eni).expect("checked");
            r.inflight += extra;
            self.warming += extra;
        }
        extra
    }

    /// EC2 found no free `/28` for a [`AssignPlan::Prefixes`] plan: its `extra` warm-ups leave the
    /// batch (their tokens return), prefixes are off in the ENI's subnet for a while, and the batch
    /// goes as single packed addresses, cut to the ENI's free slots.
    pub fn fall_back_to_packed(
        &mut self,
        eni: &EniId,
        batch: &mut AssignBatch,
        extra: u32,
        now: Instant,
    ) -> Packed {
        batch.warm -= extra;
        self.unplan_extra(eni, extra);
        self.no_free_prefix(eni, now);
        self.fit_packed(eni, batch)
    }

    /// Settles `batch` on `eni` with what it came to; returns what its warm-ups' callers are answered.
    pub fn settle_assign(
        &mut self,
        eni: &EniId,
        batch: AssignBatch,
        outcome: AssignOutcome,
        now: Instant,
    ) -> Result<(), PoolError> {
        let AssignBatch { pods, warm } = batch;
        match outcome {
            AssignOutcome::Assigned {
                ips,
                prefixes,
                eni_unlisted,
            } => {
                if eni_unlisted && self.suspend_eni(eni, now) {
                    // Detached behind the pool's back (an assign on a detached ENI succeeds): its
                    // IPs are held back, not handed out, until the running reconcile asks EC2.
                    tracing::warn!(
                        "IMDS does not list this ENI at all: it serves no new IPs until EC2 confirms it attached"
                    );
                }
                self.complete_assign(eni, ips, &prefixes, pods, warm, now);
                Ok(())
            }
            AssignOutcome::Failed(err) => Err(self.fail_assign(eni, err, pods, warm, now)),
            AssignOutcome::NotSent(err) => {
                self.reject_assign(eni, pods, warm, err.clone(), now);
                Err(err)
            }
        }
    }

    /// Cuts `batch` to the ENI's free slots for single addresses, and names the subnet to pack in.
    fn fit_packed(&mut self, eni: &EniId, batch: &mut AssignBatch) -> Packed {
        batch.warm = self.fit_single_addresses(eni, &mut batch.pods, batch.warm);
        Packed {
            count: batch.count(),
            subnet: self.subnet_of(eni),
        }
    }

    /// Whether the ENI actor may call the cloud now.
    fn eni_accepts_work(&self, eni: &EniId, now: Instant) -> Result<(), PoolError> {
        let r = self.enis.get(eni).ok_or(PoolError::ShuttingDown)?;
        if let Some(err) = self.subnet_exhausted(&r.subnet_id, now) {
            return Err(err);
        }
        match &r.phase {
            EniPhase::Draining => Err(PoolError::ShuttingDown),
            EniPhase::BackingOff {
                until, last_error, ..
            } if *until > now => Err(PoolError::BackingOff {
                target: BackoffTarget::Eni(eni.clone()),
                retry_after: *until - now,
                last_error: Box::new(last_error.clone()),
            }),
            _ => Ok(()),
        }
    }

    /// Answers a batch that was not sent to the cloud, or failed: its warm-ups' tokens return; its
    /// pods wait in line for the next try when EC2 was only slow to serve (throttled, backing off;
    /// see [`PoolState::wait_or_fail`]), or are answered with `err`.
    fn reject_assign(
        &mut self,
        eni: &EniId,
        pods: Vec<Waiter>,
        warm: u32,
        err: PoolError,
        now: Instant,
    ) {
        let n = pods.len() as u32 + warm;
        if n == 0 {
            return;
        }
        if let Some(r) = self.enis.get_mut(eni) {
            r.inflight = r.inflight.saturating_sub(n);
        }
        self.warming = self.warming.saturating_sub(warm);
        self.capacity.give_back(warm);
        for w in pods {
            self.wait_or_fail(w, err.clone(), now);
        }
    }

    /// How `count` addresses (a batch's pods and warm-ups) come to `eni` now.
    ///
    /// With prefix delegation it asks for whole prefixes, taking the tokens of the addresses beyond
    /// `count` (they join the batch as warm-ups: `AssignPlan::Prefixes::extra`); when the node has
    /// no tokens left for a whole prefix, or the subnet has no free `/28` for now, it asks for single
    /// addresses packed into blocks that are already fragmented.
    fn how_to_assign(&mut self, eni: &EniId, count: u32, now: Instant) -> AssignPlan {
        if !self.config.prefix_delegation {
            return AssignPlan::Ips { count };
        }
        let Some(r) = self.enis.get(eni) else {
            return AssignPlan::Ips { count };
        };
        if self.prefixes_blocked(&r.subnet_id, now) {
            return AssignPlan::Packed(Packed {
                count,
                subnet: None,
            });
        }
        let k = count.div_ceil(PREFIX_ADDRESSES);
        let extra = k * PREFIX_ADDRESSES - count;
        let got = self.capacity.take_up_to(extra);
        if got < extra {
            self.capacity.give_back(got);
            return AssignPlan::Packed(Packed {
                count,
                subnet: None,
            });
        }
        let r = self.enis.get_mut(eni).expect("checked");
        r.inflight += extra;
        self.warming += extra;
        AssignPlan::Prefixes { count: k, extra }
    }

    /// A prefix plan's extra addresses that will not come (the prefixes failed): their tokens return.
    fn unplan_extra(&mut self, eni: &EniId, extra: u32) {
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
    fn fit_single_addresses(&mut self, eni: &EniId, pods: &mut Vec<Waiter>, warm: u32) -> u32 {
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

    /// A batch's assign succeeded with `ips` (and, with prefix delegation, the `prefixes` they came
    /// in).
    #[allow(clippy::too_many_arguments)]
    fn complete_assign(
        &mut self,
        eni: &EniId,
        ips: Vec<Ipv4Addr>,
        prefixes: &[Ipv4Net],
        pods: Vec<Waiter>,
        warm: u32,
        now: Instant,
    ) {
        let asked = pods.len() as u32 + warm;
        // EC2 never assigns an address twice: one the pool already holds in an assign's answer is
        // a misread answer (an ambiguous assign settled from a describe that lagged an earlier
        // change). It stays where it is; it is not the pool's a second time.
        let (ips, held): (Vec<Ipv4Addr>, Vec<Ipv4Addr>) = ips
            .into_iter()
            .partition(|ip| !self.enis.values().any(|r| r.ips.contains(ip)));
        if !held.is_empty() {
            tracing::error!(%eni, ips = ?held, "an assign's answer names IPs the pool already holds: not taken a second time");
        }
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
    fn fail_assign(
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
            e if pods.is_empty() && e.is_throttle() => {
                // A warm-up EC2 throttled (not retried: `without_throttle_retries`) is no fault of
                // the ENI: the node's throttle gate paces the API, and the throttle it remembers
                // holds the warm-ups for a while (the maintainer's contention). Backing the ENI
                // off would hold the pods that come meanwhile.
                PoolError::Cloud(err)
            }
            _ => {
                // Pods EC2 throttled wait in line for the back-off and come back in one batch,
                // with the pods that arrive meanwhile. A throttle's back-off stops growing at the
                // throttle gate's longest pause: the account refills every second, and a node
                // that waits longer loses its turn to the nodes that asked later.
                let cfg = self.config.clone();
                let cap = if err.is_throttle() {
                    THROTTLED_BACKOFF_MAX
                } else {
                    Duration::MAX
                };
                if let Some(r) = self.enis.get_mut(eni) {
                    r.phase = r
                        .phase
                        .failed(err.clone(), now, |n| cfg.backoff_after(n).min(cap));
                }
                PoolError::Cloud(err)
            }
        };
        self.reject_assign(eni, pods, warm, pool_err.clone(), now);
        pool_err
    }
}
