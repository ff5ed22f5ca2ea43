//! Where an acquire goes: the attachment's own IP, a sticky or preferred idle IP, the IP idle the
//! longest, an ENI actor with room, or the wait for a new ENI; and how waiters are answered.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{EniRecord, Pending, Pick, PoolState, Route};
use crate::cloud::CloudError;
use crate::model::{AttachmentKey, EniId};
use crate::pool::error::{BackoffTarget, PoolError, PreferUnavailable};
use crate::pool::idle::{IdleEntry, IdleRefusal, Reservation};
use crate::pool::profiles::ProfileName;
use crate::pool::types::{Acquire, Allocation, EniPhase, Waiter};

impl PoolState {
    fn record_idle(&mut self, entry: IdleEntry, req: Acquire, now: Instant) -> Allocation {
        tracing::debug!(ip = %entry.ip, idle_ms = (now - entry.idle_since).as_millis() as u64, "IP from the idle queue");
        self.record(
            req.key,
            req.pod,
            req.sticky_key,
            req.meta,
            req.network,
            entry.ip,
            entry.eni,
            now,
        )
    }

    /// Decides how an acquire is served.
    pub fn route_acquire(&mut self, req: Acquire, now: Instant, span: tracing::Span) -> Route {
        if self.shutting_down {
            return Route::Done(Err(PoolError::ShuttingDown));
        }
        if let Some(rec) = self.allocations.get(&req.key) {
            return Route::Done(Ok(self.allocation_of(&req.key, rec)));
        }
        if let Some(p) = self.pending.get_mut(&req.key) {
            let (tx, rx) = oneshot::channel();
            p.released = false;
            p.followers.push(tx);
            return Route::Wait(rx);
        }
        // A new pod start (not a retry of an attachment held or in flight): the demand learns it,
        // unless it counted the pod when the API server showed it bound here.
        if let Some(p) = &req.network
            && !self.profiles.contains_key(p)
        {
            return Route::Done(Err(Self::unknown_profile(p)));
        }
        self.demand.record_pod_start(&req.pod, now);
        // Only the idle IPs of the ENIs of the acquire's network (its profile's, or the default
        // network's): the queue is shared, its order kept within each.
        let mine = self.enis_of(req.network.as_ref());
        if let Some(key) = req.sticky_key.as_deref()
            && let Some(entry) = self
                .idle
                .pop_for_key_on(key, now, req.prefer, |e| mine.contains(e))
        {
            return Route::Done(Ok(self.record_idle(entry, req, now)));
        }
        if let Some(ip) = req.prefer {
            if self.idle.get(ip).is_some_and(|e| !mine.contains(&e.eni)) {
                return Route::Done(Err(PoolError::PreferredUnavailable {
                    ip,
                    reason: PreferUnavailable::OtherNetwork,
                }));
            }
            return match self.idle.take_if_free(ip, now, req.sticky_key.as_deref()) {
                Ok(entry) => Route::Done(Ok(self.record_idle(entry, req, now))),
                Err(refusal) => {
                    let reason = match refusal {
                        IdleRefusal::Cooling(remaining) => PreferUnavailable::Cooling { remaining },
                        IdleRefusal::Reserved(remaining) => {
                            PreferUnavailable::ReservedForOther { remaining }
                        }
                        IdleRefusal::NotIdle if self.assigned.contains_key(&ip) => {
                            PreferUnavailable::Assigned
                        }
                        IdleRefusal::NotIdle if self.releasing.contains_key(&ip) => {
                            PreferUnavailable::BeingReleased
                        }
                        IdleRefusal::NotIdle => PreferUnavailable::NotInPool,
                    };
                    Route::Done(Err(PoolError::PreferredUnavailable { ip, reason }))
                }
            };
        }
        if let Some(entry) = self.idle.pop_oldest_on(now, |e| mine.contains(e)) {
            return Route::Done(Ok(self.record_idle(entry, req, now)));
        }
        self.route_new_ip(req, now, span)
    }

    fn route_new_ip(&mut self, req: Acquire, now: Instant, span: tracing::Span) -> Route {
        // Warm-ups on the wire that no waiter has claimed yet serve this acquire when they land,
        // holding its token: no call of its own (in a scale-up, each would be one more assign of
        // the account's scarcest, queued behind the one in flight anyway). Otherwise: every token
        // taken, some by warm-ups still in flight: this acquire takes one of those IPs when it
        // lands instead of failing while the node still has room for it.
        // Warm-ups are the default network's: a profile's acquire takes a token of its own.
        let unclaimed_warm =
            req.network.is_none() && self.warming as usize > self.warm_waiters.len();
        let has_token = !unclaimed_warm && self.capacity.try_take(1);
        if !has_token && !unclaimed_warm {
            return Route::Done(Err(self.capacity_reached(now)));
        }
        let (tx, rx) = oneshot::channel();
        let key = req.key.clone();
        let budget = self.config.add_budget(req.wait);
        let waiter = Waiter {
            req,
            respond_to: tx,
            span,
            enqueued_at: now,
            deadline: now + budget,
            waiting_on: None,
        };
        if !has_token {
            tracing::debug!(parent: &waiter.span, warming = self.warming, "waiting for a warm IP in flight");
            self.pending.insert(key, Pending::default());
            self.warm_waiters.push_back(waiter);
            return Route::Wait(rx);
        }
        let network = waiter.req.network.clone();
        match self.pick_eni(now, network.as_ref()) {
            Pick::Eni(id) => {
                let rec = self.enis.get_mut(&id).expect("picked ENI exists");
                rec.inflight += 1;
                let handle = rec.handle.clone().expect("pod ENIs have actors");
                self.pending.insert(key, Pending::default());
                Route::Send {
                    eni: id,
                    handle,
                    waiter,
                    rx,
                }
            }
            Pick::Blocked(err) => {
                // EC2 is slow to serve (throttled, backing off): the request waits its budget out
                // in line, or is answered with the error at once when waiting cannot help.
                self.pending.insert(key, Pending::default());
                self.wait_or_fail(waiter, err, now);
                Route::Wait(rx)
            }
            Pick::NeedNewEni if network.is_some() => {
                // The profile's ENIs are full: a new one for it, when it may have one.
                let profile = network.expect("matched");
                self.pending.insert(key, Pending::default());
                match self.profile_may_grow(&profile, now) {
                    Ok(_) => self.create_waiters.push_back(waiter),
                    Err(err) => self.wait_or_fail(waiter, err, now),
                }
                Route::Wait(rx)
            }
            Pick::NeedNewEni => {
                let subnet = self.pick_subnet(now);
                if let Some(err) = self.create_blocked(&subnet, now) {
                    self.pending.insert(key, Pending::default());
                    self.wait_or_fail(waiter, err, now);
                    return Route::Wait(rx);
                }
                if self.free_device_index_for(None, now).is_none()
                    && self.creating.is_empty()
                    && !self.any_draining()
                {
                    self.capacity.give_back(1);
                    return Route::Done(Err(self.no_eni_slot()));
                }
                self.pending.insert(key, Pending::default());
                self.create_waiters.push_back(waiter);
                Route::Wait(rx)
            }
        }
    }

    /// The ENI a new IP for `network` (a profile, or the default network) should come from: of its
    /// ENIs, the lowest device index with room that takes work.
    pub(super) fn pick_eni(&self, now: Instant, network: Option<&ProfileName>) -> Pick {
        let mut blocked = None;
        let mut pods: Vec<&EniRecord> = self
            .enis
            .values()
            .filter(|r| r.serves && r.profile.as_ref() == network)
            .collect();
        pods.sort_by_key(|r| r.device_index);
        for r in pods {
            if self.eni_room_now(r, now) == 0 || r.phase == EniPhase::Draining || r.handle.is_none()
            {
                continue;
            }
            if let Some(err) = self.subnet_exhausted(&r.subnet_id, now) {
                blocked.get_or_insert(err);
                continue;
            }
            if !r.phase.accepts_work(now) {
                if let EniPhase::BackingOff {
                    until, last_error, ..
                } = &r.phase
                {
                    blocked.get_or_insert(PoolError::BackingOff {
                        target: BackoffTarget::Eni(r.id.clone()),
                        retry_after: *until - now,
                        last_error: Box::new(last_error.clone()),
                    });
                }
                continue;
            }
            return Pick::Eni(r.id.clone());
        }
        match blocked {
            Some(err) => Pick::Blocked(err),
            None => Pick::NeedNewEni,
        }
    }

    /// Whether `waiter` may wait out `err` rather than fail now: EC2 is slow to serve
    /// ([`PoolError::is_worth_waiting`]) and what is known of the wait ends before its deadline.
    fn may_wait(&self, waiter: &Waiter, err: &PoolError, now: Instant) -> bool {
        err.is_worth_waiting() && now + err.retry_after().unwrap_or_default() < waiter.deadline
    }

    /// `waiter` (holding a capacity token) met `err`: it waits in line, keeping its token, for the
    /// maintainer to route it again once EC2 takes calls ([`PoolState::plan_round`] sends every
    /// waiter of the node in one batch); or, when waiting cannot help or would outlast its
    /// deadline, it is answered with `err` and its token returns.
    pub(super) fn wait_or_fail(&mut self, waiter: Waiter, err: PoolError, now: Instant) {
        if let Some(w) = self.hold_or_fail(waiter, err, now) {
            self.create_waiters.push_back(w);
        }
    }

    /// What [`PoolState::wait_or_fail`] decides, with the waiter that may wait handed back (its
    /// `waiting_on` set) for the caller to put in line; `None` when it was answered with the error
    /// ([`PoolError::WaitedTooLong`] around it when it had been waiting), its token back.
    pub(super) fn hold_or_fail(
        &mut self,
        mut waiter: Waiter,
        err: PoolError,
        now: Instant,
    ) -> Option<Waiter> {
        if self.may_wait(&waiter, &err, now) {
            tracing::debug!(
                parent: &waiter.span,
                error = %err,
                budget_left_ms = (waiter.deadline - now).as_millis() as u64,
                "EC2 is slow to serve: waiting in line"
            );
            waiter.waiting_on = Some(Box::new(err));
            return Some(waiter);
        }
        self.capacity.give_back(1);
        let err = if waiter.waiting_on.is_some() && err.is_worth_waiting() {
            PoolError::WaitedTooLong {
                waited: now - waiter.enqueued_at,
                last_error: Box::new(err),
            }
        } else {
            err
        };
        self.fail_waiter(waiter, err);
        None
    }

    /// Answers `waiter` (and any followers of its attachment) with `err`. Tokens are the caller's business.
    pub(super) fn fail_waiter(&mut self, waiter: Waiter, err: PoolError) {
        if let Some(p) = self.pending.remove(&waiter.req.key) {
            for f in p.followers {
                let _ = f.send(Err(err.clone()));
            }
        }
        tracing::debug!(parent: &waiter.span, error = %err, "acquire failed");
        let _ = waiter.respond_to.send(Err(err));
    }

    /// Gives `ip` (new from EC2, on `eni`) to `waiter`, or to the idle queue if nobody wants it any more.
    pub(super) fn fulfil(&mut self, waiter: Waiter, ip: Ipv4Addr, eni: EniId, now: Instant) {
        let pending = self.pending.remove(&waiter.req.key).unwrap_or_default();
        if pending.released {
            self.park_idle(ip, eni, now, Duration::ZERO, None);
            for f in pending.followers {
                let _ = f.send(Err(PoolError::ReleasedWhilePending));
            }
            let _ = waiter.respond_to.send(Err(PoolError::ReleasedWhilePending));
            return;
        }
        let live_followers: Vec<_> = pending
            .followers
            .into_iter()
            .filter(|f| !f.is_closed())
            .collect();
        if waiter.respond_to.is_closed() && live_followers.is_empty() {
            tracing::info!(parent: &waiter.span, %ip, "caller went away before its IP arrived; IP goes idle");
            self.park_idle(ip, eni, now, Duration::ZERO, None);
            return;
        }
        if self.eni_suspect(&eni) {
            // EC2 stopped showing the ENI attached while this IP was being assigned to it (an
            // assign on a detached ENI succeeds): a pod given it would have an IP the instance does
            // not hold. The IP is held back with the ENI; the caller retries (CNI ADD is retried
            // by the runtime) and is served from an ENI that is attached.
            tracing::warn!(parent: &waiter.span, %ip, %eni, "new IP is on an ENI EC2 does not show attached: held back, not handed out");
            self.park_idle(ip, eni.clone(), now, Duration::ZERO, None);
            self.fail_waiter(
                waiter,
                PoolError::Cloud(CloudError::Transient {
                    api: "AssignPrivateIpAddresses".into(),
                    message: format!("{eni} is not shown attached to this instance; retry"),
                }),
            );
            return;
        }
        let Waiter {
            req,
            respond_to,
            span,
            enqueued_at,
            ..
        } = waiter;
        let alloc = self.record(
            req.key,
            req.pod,
            req.sticky_key,
            req.meta,
            req.network,
            ip,
            eni,
            now,
        );
        tracing::debug!(
            parent: &span,
            %ip,
            waited_ms = (now - enqueued_at).as_millis() as u64,
            "IP assigned"
        );
        for f in live_followers {
            let _ = f.send(Ok(alloc.clone()));
        }
        let _ = respond_to.send(Ok(alloc));
    }

    /// Whether EC2 did not show `eni` attached at the last look ([`EniPhase::Suspect`]).
    pub(super) fn eni_suspect(&self, eni: &EniId) -> bool {
        self.enis
            .get(eni)
            .is_some_and(|r| matches!(r.phase, EniPhase::Suspect { .. }))
    }

    /// Puts `ip` (on `eni`) into the idle queue, or holds it back while its ENI is suspect: an IP of
    /// an ENI that may be detached goes to no pod until EC2 shows the ENI attached again.
    pub(super) fn park_idle(
        &mut self,
        ip: Ipv4Addr,
        eni: EniId,
        now: Instant,
        cooldown: Duration,
        reservation: Option<Reservation>,
    ) {
        let suspect = self.eni_suspect(&eni) || self.unconfirmed.contains(&ip);
        self.idle.push(ip, eni, now, cooldown, reservation);
        if suspect && let Some(entry) = self.idle.remove(ip) {
            self.held_back.insert(ip, entry);
        }
    }

    /// An acquire routed to `eni` was cancelled before its waiter reached the actor: give back the
    /// token and the in-flight slot, and answer anyone who followed the same attachment.
    pub fn abandon_routed(&mut self, eni: &EniId, key: &AttachmentKey) {
        if let Some(r) = self.enis.get_mut(eni) {
            r.inflight = r.inflight.saturating_sub(1);
        }
        self.capacity.give_back(1);
        if let Some(p) = self.pending.remove(key) {
            for f in p.followers {
                let _ = f.send(Err(PoolError::Abandoned));
            }
        }
    }
}
