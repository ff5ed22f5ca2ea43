//! What an ENI creation the maintainer ran comes to: the new ENI registered with its actor and its
//! waiters served; or, when EC2 had no free `/28`, the waiters back in the queue for single
//! addresses; or the waiters failed and the subnet backing off.

use std::collections::BTreeSet;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{CreatePlan, EniRecord, EniRole, PoolState, SubnetBackoffKind};
use crate::cloud::{CloudError, Eni};
use crate::pool::error::{ExhaustionReason, PoolError};
use crate::pool::types::{CreateOutcome, EniHandle, EniPhase, Waiter};

impl PoolState {
    /// Raises what the default network's creates in `subnet_id` ask for at their next attempt
    /// while EC2 throttles them: the waiters in line that the warm-ups on the way (`warm_coming`)
    /// do not cover, up to each ENI's slots, oldest create first. Served by the create itself,
    /// those pods do not wait for the ENI to attach and then for an assign on it, a second call on
    /// the bucket a booting fleet drains. A create EC2 may have acted on keeps asking what it asked
    /// (its ClientToken); a lower count later asks no less than the plan. The IPs beyond the plan
    /// go idle when the ENI lands, and the waiters in line take them ([`Self::complete_create`]).
    pub(super) fn grow_creates(&self, subnet_id: &str, warm_coming: u32) {
        let mut need = (self.create_waiters.len() as u32).saturating_sub(warm_coming);
        let mine = self
            .creating
            .values()
            .filter(|c| c.subnet_id == subnet_id && c.profile.is_none());
        for c in mine {
            let Some(live) = &c.live else { continue };
            let add = need.min(self.per_eni.saturating_sub(c.count));
            live.set(c.count + add);
            need -= add;
        }
    }

    /// Settles the creation `plan` with what it came to.
    pub fn settle_create(&mut self, plan: CreatePlan, outcome: CreateOutcome, now: Instant) {
        match outcome {
            CreateOutcome::Created { eni, handle, task } => {
                self.complete_create(plan.id, *eni, handle, task, plan.waiters, now);
            }
            CreateOutcome::NoFreePrefix => {
                // No `/28` left: the next round creates this ENI with packed single addresses;
                // its waiters keep their place.
                self.no_free_prefix_in(&plan.subnet_id, now);
                self.requeue_create(plan.id, plan.waiters);
            }
            CreateOutcome::Failed(err) => self.fail_create(plan.id, err, plan.waiters, now),
        }
    }

    /// Registers an ENI the maintainer created, with its actor, and serves the create's waiters.
    #[allow(clippy::too_many_arguments)]
    fn complete_create(
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
                profile: c.profile.clone(),
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

    /// A creation that EC2 refused for want of a free `/28` (prefixes are now off in its subnet, see
    /// [`PoolState::no_free_prefix_in`]): the warm-ups' tokens return, the waiters go back to the
    /// queue with theirs, and the next planning round creates the ENI with single addresses.
    fn requeue_create(&mut self, id: u64, waiters: Vec<Waiter>) {
        let Some(c) = self.creating.remove(&id) else {
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        self.capacity
            .give_back(c.count.saturating_sub(waiters.len() as u32));
        self.create_waiters.extend(waiters);
    }

    /// An ENI creation failed: the subnet backs off; the waiters wait for the next try when EC2 was
    /// only slow to serve (throttled, a transient failure), or get the error; other tokens go back.
    fn fail_create(&mut self, id: u64, err: CloudError, waiters: Vec<Waiter>, now: Instant) {
        let Some(c) = self.creating.remove(&id) else {
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        // The waiters' tokens stay with them (they may wait for the next try); the rest return.
        self.capacity
            .give_back(c.count.saturating_sub(waiters.len() as u32));
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
            self.wait_or_fail(w, pool_err.clone(), now);
        }
    }
}
