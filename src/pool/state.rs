//! The pool's bookkeeping: one [`PoolState`] behind the pool's mutex, written by the acquire and
//! release paths, the ENI actors and the maintainer, each in short critical sections that never
//! await. Every decision about which IP or which ENI happens here, in one place, against one
//! consistent view; the cloud calls happen outside, in the actors and the maintainer's tasks.
//!
//! Token accounting (checked by [`PoolState::check_invariants`]):
//! `tokens used = idle + releasing + assigned + Σ ENI in-flight + waiting for an ENI + Σ creating`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::capacity::{CapacityTokens, node_capacity};
use super::eni::{EniHandle, EniPhase, Waiter};
use super::error::{BackoffTarget, ExhaustionReason, PoolError, PreferUnavailable};
use super::idle::{IdleEntry, IdleQueue, IdleRefusal, Reservation};
use super::seed::{PoolSeed, SeedError};
use super::{Allocation, PoolConfig, Released};
use crate::cloud::{CloudError, Eni, NodeContext, Subnet};
use crate::model::{AttachmentKey, EniId, PodRef};

/// What an ENI is to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EniRole {
    /// eth0: never used for pods.
    Primary,
    /// Attached but not ours (not created by eniipam, or opted out): takes a slot, never touched.
    Foreign,
    /// Ours: its secondary IPs serve pods.
    Pods,
}

pub(crate) struct EniRecord {
    pub id: EniId,
    pub mac: String,
    pub device_index: u32,
    pub subnet_id: String,
    pub primary_ip: Ipv4Addr,
    pub role: EniRole,
    /// Secondary IPs the pool holds on this ENI: idle, assigned or being released.
    pub ips: BTreeSet<Ipv4Addr>,
    /// IPs asked of the actor and not answered yet.
    pub inflight: u32,
    pub phase: EniPhase,
    /// After a failed release, not before this instant again.
    pub release_retry_at: Option<Instant>,
    pub cloud: Option<Eni>,
    pub handle: Option<EniHandle>,
    pub task: Option<JoinHandle<()>>,
}

/// Why a subnet is backing off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubnetBackoffKind {
    /// EC2 said full / limit reached: no new IPs from this subnet until the end.
    Exhausted,
    /// ENI creation failed: no creation in this subnet until the end; existing ENIs still serve.
    CreateFailing,
}

#[derive(Clone, Debug)]
pub(crate) struct SubnetBackoff {
    pub until: Instant,
    pub kind: SubnetBackoffKind,
    pub failures: u32,
    pub error: CloudError,
}

pub(crate) struct SubnetRecord {
    pub subnet: Option<Subnet>,
    pub backoff: Option<SubnetBackoff>,
}

pub(crate) struct CreatingEni {
    pub device_index: u32,
    pub subnet_id: String,
    /// IPs in the create call: pods + warm.
    pub count: u32,
    pub warm: u32,
    pub started: Instant,
}

pub(crate) struct AllocationRecord {
    pub ip: Ipv4Addr,
    pub eni: EniId,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub since: Instant,
}

#[derive(Default)]
pub(crate) struct Pending {
    followers: Vec<oneshot::Sender<Result<Allocation, PoolError>>>,
    released: bool,
}

/// An acquire as the state sees it.
pub(crate) struct AcquireRequest {
    pub key: AttachmentKey,
    pub pod: PodRef,
    pub prefer: Option<Ipv4Addr>,
    pub sticky_key: Option<String>,
}

/// Where an acquire goes next.
pub(crate) enum Route {
    Done(Result<Allocation, PoolError>),
    /// Waiting for an answer (a new ENI, or the first request for the same attachment).
    Wait(oneshot::Receiver<Result<Allocation, PoolError>>),
    /// To an ENI actor.
    Send {
        eni: EniId,
        handle: EniHandle,
        waiter: Waiter,
        rx: oneshot::Receiver<Result<Allocation, PoolError>>,
    },
}

/// One ENI creation the maintainer decided on.
pub(crate) struct CreatePlan {
    pub id: u64,
    pub device_index: u32,
    pub subnet_id: String,
    pub count: u32,
    pub waiters: Vec<Waiter>,
    /// The subnet's CIDR is not known yet: describe it first.
    pub describe_subnet: bool,
}

/// What one maintainer round does.
#[derive(Default)]
pub(crate) struct RoundPlan {
    pub reroutes: Vec<(EniId, EniHandle, Waiter)>,
    pub warms: Vec<(EniId, EniHandle, u32)>,
    pub unassigns: Vec<(EniId, EniHandle, Vec<Ipv4Addr>)>,
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

enum Pick {
    Eni(EniId),
    Blocked(PoolError),
    NeedNewEni,
}

pub(crate) struct PoolState {
    pub config: PoolConfig,
    pub node: NodeContext,
    pub capacity: CapacityTokens,
    pub idle: IdleQueue,
    pub allocations: HashMap<AttachmentKey, AllocationRecord>,
    pub assigned: HashMap<Ipv4Addr, AttachmentKey>,
    pub pending: HashMap<AttachmentKey, Pending>,
    pub enis: BTreeMap<EniId, EniRecord>,
    pub creating: BTreeMap<u64, CreatingEni>,
    pub create_waiters: VecDeque<Waiter>,
    pub subnets: BTreeMap<String, SubnetRecord>,
    pub releasing: BTreeMap<Ipv4Addr, IdleEntry>,
    /// Warm-up IPs asked for and not arrived.
    pub warming: u32,
    /// ENIs the node may have, eth0 included.
    pub max_enis: u32,
    /// Pod IPs per ENI (IPv4 per ENI − 1: the primary is not used).
    pub per_eni: u32,
    next_create_id: u64,
    pub shutting_down: bool,
}

impl PoolState {
    /// Builds the state from a startup seed, without actors (the caller spawns them).
    pub fn from_seed(
        config: PoolConfig,
        node: NodeContext,
        seed: PoolSeed,
        now: Instant,
    ) -> Result<Self, SeedError> {
        let max_enis = config
            .max_enis
            .map_or(node.limits.max_enis, |cap| cap.min(node.limits.max_enis));
        let per_eni = node.limits.ipv4_per_eni.saturating_sub(1);
        let mut st = Self {
            capacity: CapacityTokens::new(0),
            idle: IdleQueue::new(),
            allocations: HashMap::new(),
            assigned: HashMap::new(),
            pending: HashMap::new(),
            enis: BTreeMap::new(),
            creating: BTreeMap::new(),
            create_waiters: VecDeque::new(),
            subnets: BTreeMap::new(),
            releasing: BTreeMap::new(),
            warming: 0,
            max_enis,
            per_eni,
            next_create_id: 0,
            shutting_down: false,
            config,
            node,
        };
        let mut ip_owner: HashMap<Ipv4Addr, EniId> = HashMap::new();
        let mut by_index: HashMap<u32, EniId> = HashMap::new();
        let mut foreign = 0;
        for e in seed.enis {
            if let Some(first) = by_index.insert(e.device_index, e.id.clone()) {
                return Err(SeedError::DuplicateDeviceIndex {
                    device_index: e.device_index,
                    first,
                    second: e.id,
                });
            }
            let role = if e.device_index == 0 {
                EniRole::Primary
            } else if e.managed {
                EniRole::Pods
            } else {
                foreign += 1;
                EniRole::Foreign
            };
            for ip in std::iter::once(e.primary_ip).chain(e.secondary_ips.iter().copied()) {
                if ip_owner.insert(ip, e.id.clone()).is_some() {
                    return Err(SeedError::DuplicateIp { ip });
                }
            }
            st.subnets
                .entry(e.subnet_id.clone())
                .or_insert_with(|| SubnetRecord {
                    subnet: Some(Subnet {
                        id: e.subnet_id.clone(),
                        vpc_id: st.node.vpc_id.clone(),
                        cidr: e.subnet_cidr,
                        availability_zone: st.node.availability_zone.clone(),
                        available_ips: 0,
                    }),
                    backoff: None,
                });
            let ips = if role == EniRole::Pods {
                e.secondary_ips.iter().copied().collect()
            } else {
                BTreeSet::new()
            };
            st.enis.insert(
                e.id.clone(),
                EniRecord {
                    id: e.id,
                    mac: e.mac,
                    device_index: e.device_index,
                    subnet_id: e.subnet_id,
                    primary_ip: e.primary_ip,
                    role,
                    ips,
                    inflight: 0,
                    phase: EniPhase::Serving,
                    release_retry_at: None,
                    cloud: e.eni,
                    handle: None,
                    task: None,
                },
            );
        }
        st.capacity = CapacityTokens::new(node_capacity(
            st.node.limits,
            st.config.max_enis,
            st.config.max_ips,
            foreign,
        ));
        let pod_eni_of = |st: &Self, ip: Ipv4Addr| {
            ip_owner
                .get(&ip)
                .filter(|id| {
                    st.enis
                        .get(*id)
                        .is_some_and(|r| r.role == EniRole::Pods && r.ips.contains(&ip))
                })
                .cloned()
        };
        for a in seed.allocations {
            let Some(eni) = pod_eni_of(&st, a.ip) else {
                return Err(SeedError::UnknownIp {
                    ip: a.ip,
                    attachment: a.attachment,
                });
            };
            if let Some(first) = st.assigned.get(&a.ip) {
                return Err(SeedError::IpAssignedTwice {
                    ip: a.ip,
                    first: first.clone(),
                    second: a.attachment,
                });
            }
            if let Some(first) = st.allocations.get(&a.attachment) {
                return Err(SeedError::DuplicateAttachment {
                    attachment: a.attachment,
                    first: first.ip,
                    second: a.ip,
                });
            }
            st.assigned.insert(a.ip, a.attachment.clone());
            st.allocations.insert(
                a.attachment,
                AllocationRecord {
                    ip: a.ip,
                    eni,
                    pod: a.pod,
                    sticky_key: a.sticky_key,
                    since: now,
                },
            );
        }
        let idle_info: HashMap<Ipv4Addr, _> = seed.idle.into_iter().map(|i| (i.ip, i)).collect();
        let cooldown = st.config.reuse_cooldown;
        let mut held = 0;
        let pod_ips: Vec<(Ipv4Addr, EniId)> = st
            .enis
            .values()
            .filter(|r| r.role == EniRole::Pods)
            .flat_map(|r| r.ips.iter().map(|ip| (*ip, r.id.clone())))
            .collect();
        for (ip, eni) in pod_ips {
            held += 1;
            if st.assigned.contains_key(&ip) {
                continue;
            }
            match idle_info.get(&ip) {
                Some(info) => {
                    let reservation = info.reserved.as_ref().map(|(key, until)| Reservation {
                        key: key.clone(),
                        until: *until,
                    });
                    st.idle
                        .push(ip, eni, info.idle_since, cooldown, reservation);
                }
                None => st.idle.push(ip, eni, now, cooldown, None),
            }
        }
        st.capacity.take_existing(held);
        Ok(st)
    }

    fn eni_room(&self, r: &EniRecord) -> u32 {
        self.per_eni.saturating_sub(r.ips.len() as u32 + r.inflight)
    }

    pub fn allocation_of(&self, key: &AttachmentKey, rec: &AllocationRecord) -> Allocation {
        let eni = self.enis.get(&rec.eni);
        let subnet = eni
            .and_then(|e| self.subnets.get(&e.subnet_id))
            .and_then(|s| s.subnet.as_ref());
        Allocation {
            ip: rec.ip,
            attachment: key.clone(),
            pod: rec.pod.clone(),
            sticky_key: rec.sticky_key.clone(),
            eni: rec.eni.clone(),
            mac: eni.map(|e| e.mac.clone()).unwrap_or_default(),
            device_index: eni.map_or(0, |e| e.device_index),
            subnet_id: eni.map(|e| e.subnet_id.clone()).unwrap_or_default(),
            subnet_cidr: subnet.map_or_else(|| Ipv4Net::from(rec.ip), |s| s.cidr),
            gateway: subnet.map_or(Ipv4Addr::UNSPECIFIED, Subnet::gateway),
        }
    }

    /// Records `ip` (on `eni`) as held by `key` and returns the reply.
    fn record(
        &mut self,
        key: AttachmentKey,
        pod: PodRef,
        sticky_key: Option<String>,
        ip: Ipv4Addr,
        eni: EniId,
        now: Instant,
    ) -> Allocation {
        let rec = AllocationRecord {
            ip,
            eni,
            pod,
            sticky_key,
            since: now,
        };
        let alloc = self.allocation_of(&key, &rec);
        self.assigned.insert(ip, key.clone());
        self.allocations.insert(key, rec);
        alloc
    }

    fn record_idle(&mut self, entry: IdleEntry, req: AcquireRequest, now: Instant) -> Allocation {
        tracing::debug!(ip = %entry.ip, idle_ms = (now - entry.idle_since).as_millis() as u64, "IP from the idle queue");
        self.record(req.key, req.pod, req.sticky_key, entry.ip, entry.eni, now)
    }

    /// Decides how an acquire is served.
    pub fn route_acquire(
        &mut self,
        req: AcquireRequest,
        now: Instant,
        span: tracing::Span,
    ) -> Route {
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
        if let Some(key) = req.sticky_key.as_deref()
            && let Some(entry) = self.idle.pop_for_key(key, now, req.prefer)
        {
            return Route::Done(Ok(self.record_idle(entry, req, now)));
        }
        if let Some(ip) = req.prefer {
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
        if let Some(entry) = self.idle.pop_oldest(now) {
            return Route::Done(Ok(self.record_idle(entry, req, now)));
        }
        self.route_new_ip(req, now, span)
    }

    fn capacity_reached(&self, now: Instant) -> PoolError {
        PoolError::Exhausted {
            reason: ExhaustionReason::CapacityReached {
                capacity: self.capacity.capacity(),
                cooling: self.idle.cooling(now),
                reserved: self.idle.reserved(now),
            },
            retry_after: self
                .idle
                .next_eligible_at()
                .map(|at| at.saturating_duration_since(now)),
        }
    }

    fn route_new_ip(&mut self, req: AcquireRequest, now: Instant, span: tracing::Span) -> Route {
        if !self.capacity.try_take(1) {
            return Route::Done(Err(self.capacity_reached(now)));
        }
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            key: req.key.clone(),
            pod: req.pod,
            sticky_key: req.sticky_key,
            respond_to: tx,
            span,
            enqueued_at: now,
        };
        match self.pick_eni(now) {
            Pick::Eni(id) => {
                let rec = self.enis.get_mut(&id).expect("picked ENI exists");
                rec.inflight += 1;
                let handle = rec.handle.clone().expect("pod ENIs have actors");
                self.pending.insert(req.key, Pending::default());
                Route::Send {
                    eni: id,
                    handle,
                    waiter,
                    rx,
                }
            }
            Pick::Blocked(err) => {
                self.capacity.give_back(1);
                Route::Done(Err(err))
            }
            Pick::NeedNewEni => {
                let subnet = self.node.subnet_id.clone();
                if let Some(err) = self.create_blocked(&subnet, now) {
                    self.capacity.give_back(1);
                    return Route::Done(Err(err));
                }
                if self.free_device_index().is_none()
                    && self.creating.is_empty()
                    && !self.any_draining()
                {
                    self.capacity.give_back(1);
                    return Route::Done(Err(self.no_eni_slot()));
                }
                self.pending.insert(req.key, Pending::default());
                self.create_waiters.push_back(waiter);
                Route::Wait(rx)
            }
        }
    }

    fn no_eni_slot(&self) -> PoolError {
        PoolError::Exhausted {
            reason: ExhaustionReason::NoEniSlot {
                max_enis: self.max_enis,
            },
            retry_after: None,
        }
    }

    fn any_draining(&self) -> bool {
        self.enis.values().any(|r| r.phase == EniPhase::Draining)
    }

    /// An exhausted-subnet error for `subnet_id` if it is backing off as exhausted at `now`.
    fn subnet_exhausted(&self, subnet_id: &str, now: Instant) -> Option<PoolError> {
        let b = self.subnets.get(subnet_id)?.backoff.as_ref()?;
        (b.kind == SubnetBackoffKind::Exhausted && b.until > now).then(|| PoolError::Exhausted {
            reason: ExhaustionReason::Cloud {
                subnet_id: subnet_id.to_owned(),
                error: Box::new(b.error.clone()),
            },
            retry_after: Some(b.until - now),
        })
    }

    /// Why no ENI may be created in `subnet_id` at `now`, if so.
    fn create_blocked(&self, subnet_id: &str, now: Instant) -> Option<PoolError> {
        let b = self.subnets.get(subnet_id)?.backoff.as_ref()?;
        if b.until <= now {
            return None;
        }
        Some(match b.kind {
            SubnetBackoffKind::Exhausted => self.subnet_exhausted(subnet_id, now)?,
            SubnetBackoffKind::CreateFailing => PoolError::BackingOff {
                target: BackoffTarget::EniCreation {
                    subnet_id: subnet_id.to_owned(),
                },
                retry_after: b.until - now,
                last_error: Box::new(b.error.clone()),
            },
        })
    }

    /// The ENI a new IP should come from: the lowest device index with room that takes work.
    fn pick_eni(&self, now: Instant) -> Pick {
        let mut blocked = None;
        let mut pods: Vec<&EniRecord> = self
            .enis
            .values()
            .filter(|r| r.role == EniRole::Pods)
            .collect();
        pods.sort_by_key(|r| r.device_index);
        for r in pods {
            if self.eni_room(r) == 0 || r.phase == EniPhase::Draining || r.handle.is_none() {
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

    /// The lowest device index no ENI uses or is being created at.
    fn free_device_index(&self) -> Option<u32> {
        let used: BTreeSet<u32> = self
            .enis
            .values()
            .map(|r| r.device_index)
            .chain(self.creating.values().map(|c| c.device_index))
            .collect();
        (1..self.max_enis).find(|i| !used.contains(i))
    }

    /// The send to an ENI actor failed (actor gone): undo the routing and answer.
    pub fn abort_waiter(&mut self, eni: &EniId, waiter: Waiter, err: PoolError) {
        if let Some(r) = self.enis.get_mut(eni) {
            r.inflight = r.inflight.saturating_sub(1);
        }
        self.capacity.give_back(1);
        self.fail_waiter(waiter, err);
    }

    /// Answers `waiter` (and any followers of its attachment) with `err`. Tokens are the caller's business.
    fn fail_waiter(&mut self, waiter: Waiter, err: PoolError) {
        if let Some(p) = self.pending.remove(&waiter.key) {
            for f in p.followers {
                let _ = f.send(Err(err.clone()));
            }
        }
        tracing::debug!(parent: &waiter.span, error = %err, "acquire failed");
        let _ = waiter.respond_to.send(Err(err));
    }

    /// Gives `ip` (new from EC2, on `eni`) to `waiter`, or to the idle queue if nobody wants it any more.
    fn fulfil(&mut self, waiter: Waiter, ip: Ipv4Addr, eni: EniId, now: Instant) {
        let pending = self.pending.remove(&waiter.key).unwrap_or_default();
        if pending.released {
            self.idle.push(ip, eni, now, Duration::ZERO, None);
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
            self.idle.push(ip, eni, now, Duration::ZERO, None);
            return;
        }
        let Waiter {
            key,
            pod,
            sticky_key,
            respond_to,
            span,
            enqueued_at,
        } = waiter;
        let alloc = self.record(key, pod, sticky_key, ip, eni, now);
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

    /// Whether the ENI actor may call the cloud now.
    pub fn eni_accepts_work(&self, eni: &EniId, now: Instant) -> Result<(), PoolError> {
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

    /// A batch's assign succeeded with `ips`.
    pub fn complete_assign(
        &mut self,
        eni: &EniId,
        ips: Vec<Ipv4Addr>,
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
            }
            None => tracing::error!(%eni, "assign completed for an unknown ENI"),
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
            self.idle.push(ip, eni.clone(), now, Duration::ZERO, None);
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

    fn back_off_subnet(
        &mut self,
        subnet_id: &str,
        kind: SubnetBackoffKind,
        error: CloudError,
        now: Instant,
    ) {
        let rec = self
            .subnets
            .entry(subnet_id.to_owned())
            .or_insert_with(|| SubnetRecord {
                subnet: None,
                backoff: None,
            });
        let failures = rec
            .backoff
            .as_ref()
            .filter(|b| b.kind == kind)
            .map_or(1, |b| b.failures + 1);
        let delay = match kind {
            SubnetBackoffKind::Exhausted => self.config.subnet_backoff,
            SubnetBackoffKind::CreateFailing => self.config.backoff_after(failures),
        };
        tracing::warn!(subnet = subnet_id, ?kind, error = %error, backoff_ms = delay.as_millis() as u64, "subnet backs off");
        rec.backoff = Some(SubnetBackoff {
            until: now + delay,
            kind,
            failures,
            error,
        });
    }

    /// IPs given back to EC2: tokens return.
    pub fn complete_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr]) {
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
            r.phase = r.phase.succeeded();
        }
        self.capacity.give_back(n);
    }

    /// A give-back failed: the IPs are idle again (same place in the queue), the ENI backs off.
    pub fn fail_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], err: CloudError, now: Instant) {
        self.unassign_abandoned(eni, ips);
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

    /// EC2 no longer shows these IPs on `eni` (unassigned out of band): the pool forgets them and
    /// returns their tokens. IPs being given back are skipped (their absence is ours). Returns every IP
    /// forgotten, with the attachment that held it, if any (that pod lost its IP).
    pub fn forget_gone(
        &mut self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> Vec<(Ipv4Addr, Option<AttachmentKey>)> {
        let mut forgotten = Vec::new();
        let Some(r) = self.enis.get_mut(eni) else {
            return forgotten;
        };
        for ip in ips {
            if self.releasing.contains_key(ip) || !r.ips.remove(ip) {
                continue;
            }
            self.idle.remove(*ip);
            let holder = self.assigned.remove(ip);
            if let Some(key) = &holder {
                self.allocations.remove(key);
            }
            forgotten.push((*ip, holder));
        }
        self.capacity.give_back(forgotten.len() as u32);
        forgotten
    }

    /// EC2's description of an ENI, if known.
    pub fn cloud_eni(&self, eni: &EniId) -> Option<Eni> {
        self.enis.get(eni).and_then(|r| r.cloud.clone())
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
        let got = eni.secondary_ips.len() as u32;
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
        let ips = eni.secondary_ips.clone();
        self.enis.insert(
            eni_id.clone(),
            EniRecord {
                id: eni_id.clone(),
                mac: eni.mac.clone(),
                device_index,
                subnet_id: eni.subnet_id.clone(),
                primary_ip: eni.primary_ip,
                role: EniRole::Pods,
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
    pub fn fail_create(&mut self, id: u64, err: CloudError, waiters: Vec<Waiter>, now: Instant) {
        let Some(c) = self.creating.remove(&id) else {
            return;
        };
        self.warming = self.warming.saturating_sub(c.warm);
        self.capacity.give_back(c.count);
        let pool_err = if err.is_capacity() {
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

    /// Records a subnet description fetched before a create.
    pub fn learn_subnet(&mut self, subnet: Subnet) {
        let id = subnet.id.clone();
        self.subnets
            .entry(id)
            .or_insert_with(|| SubnetRecord {
                subnet: None,
                backoff: None,
            })
            .subnet = Some(subnet);
    }

    /// Releases `key`'s IP into the idle queue (cooling; reserved for its sticky key when `sticky`).
    /// `None` when the attachment holds nothing (a no-op, as CNI DEL requires).
    pub fn release(&mut self, key: &AttachmentKey, sticky: bool, now: Instant) -> Option<Released> {
        if let Some(p) = self.pending.get_mut(key) {
            p.released = true;
            return None;
        }
        let rec = self.allocations.remove(key)?;
        self.assigned.remove(&rec.ip);
        let reservation = (sticky && !self.config.ip_stick_time.is_zero()).then(|| Reservation {
            key: rec
                .sticky_key
                .clone()
                .unwrap_or_else(|| rec.pod.sticky_key()),
            until: now + self.config.ip_stick_time,
        });
        let released = Released {
            ip: rec.ip,
            reservation: reservation.as_ref().map(|r| (r.key.clone(), r.until)),
        };
        self.idle.push(
            rec.ip,
            rec.eni,
            now,
            self.config.reuse_cooldown,
            reservation,
        );
        Some(released)
    }

    /// Drops create waiters whose callers are gone, returning their tokens.
    fn prune_create_waiters(&mut self) {
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

    /// Checks the token accounting; `Err` describes the mismatch.
    pub fn check_invariants(&self) -> Result<(), String> {
        let inflight: u32 = self.enis.values().map(|r| r.inflight).sum();
        let creating: u32 = self.creating.values().map(|c| c.count).sum();
        let held =
            self.idle.len() as u32 + self.releasing.len() as u32 + self.allocations.len() as u32;
        let sum = held + inflight + creating + self.create_waiters.len() as u32;
        if sum != self.capacity.used() {
            return Err(format!(
                "tokens used {} != idle {} + releasing {} + assigned {} + in flight {} + creating {} + waiting {}",
                self.capacity.used(),
                self.idle.len(),
                self.releasing.len(),
                self.allocations.len(),
                inflight,
                creating,
                self.create_waiters.len()
            ));
        }
        let on_enis: u32 = self
            .enis
            .values()
            .filter(|r| r.role == EniRole::Pods)
            .map(|r| r.ips.len() as u32)
            .sum();
        if on_enis != held {
            return Err(format!(
                "ENIs hold {on_enis} IPs, the pool accounts for {held}"
            ));
        }
        Ok(())
    }
}
