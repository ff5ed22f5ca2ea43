//! The pool's bookkeeping: one [`PoolState`] behind the pool's mutex, written by the acquire and
//! release paths, the ENI actors and the maintainer, each in short critical sections that never
//! await. Every decision about which IP or which ENI happens here, in one place, against one
//! consistent view; the cloud calls happen outside, in the actors and the maintainer's tasks.
//!
//! Token accounting (checked by [`PoolState::check_invariants`]):
//! `tokens used = idle + releasing + assigned + Σ ENI in-flight + waiting for an ENI + Σ creating`.
//!
//! The state's methods are split by what they decide, one `impl PoolState` a file, each with its
//! own imports:
//! - this file: the records, lookups shared by the others;
//! - [`seeding`]: building the state from the startup seed;
//! - [`routing`]: where an acquire goes (idle IP, an ENI actor, a new ENI) and how waiters are answered;
//! - [`release`]: a release, and its undo;
//! - [`assign`]: an ENI actor's assign batch: its plan, and settling what it came to;
//! - [`give_back`]: an actor's give-back of idle IPs and release of its ENI, settled;
//! - [`create`]: settling an ENI creation the maintainer ran;
//! - [`round`]: the maintainer's plan for one round;
//! - [`profiles`]: network profiles: which ENIs and idle IPs a profile's acquire may use, its
//!   ENI creations, its capacity;
//! - [`subnets`]: which subnet a new ENI goes to, and the subnets' back-offs;
//! - [`invariants`]: the token accounting check;
//! - [`drift`]: what the running reconcile changes when the pool and EC2 (or the host) disagree.

mod assign;
mod create;
mod drift;
mod give_back;
mod invariants;
mod profiles;
mod release;
mod round;
mod routing;
mod seeding;
mod subnets;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::capacity::CapacityTokens;
use super::config::{PREFIX_ADDRESSES, PoolConfig};
use super::demand::Demand;
use super::error::{ExhaustionReason, PoolError};
use super::idle::{IdleEntry, IdleQueue};
use super::pod_network::PodNetwork;
use super::profiles::{ProfileName, ProfileNetwork};
use super::types::{Allocation, AttachmentMeta, EniHandle, EniPhase, Waiter};
use crate::cloud::{CloudError, Eni, LiveCount, NodeContext, Subnet};
use crate::model::{AttachmentKey, EniId, PodRef};

pub(crate) use super::types::AllocationRecord;
pub(crate) use round::CreatePlan;

/// What an ENI is to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EniRole {
    /// eth0: never detached; its secondary IPs serve pods when `use_primary_eni` is on.
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
    /// Its addresses serve pods: a [`EniRole::Pods`] ENI, or eth0 with `use_primary_eni`.
    pub serves: bool,
    /// The network profile it was created for: its IPs go to that profile's pods only. `None`:
    /// the default pod network.
    pub profile: Option<ProfileName>,
    /// Pod addresses the pool holds on this ENI (secondary IPs, and every address of its prefixes):
    /// idle, assigned, being released, quarantined or held back.
    pub ips: BTreeSet<Ipv4Addr>,
    /// Its delegated `/28` prefixes (their addresses are in `ips`).
    pub prefixes: BTreeSet<Ipv4Net>,
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
    /// With prefix delegation: EC2 found no free `/28` here; single packed addresses until then.
    pub no_prefix: Option<PrefixBackoff>,
    /// `subnet.available_ips` came from EC2 (a record built from IMDS alone has no count).
    pub free_known: bool,
}

/// A subnet without a free `/28` for now.
#[derive(Clone, Debug)]
pub(crate) struct PrefixBackoff {
    pub until: Instant,
    pub failures: u32,
}

impl SubnetRecord {
    pub fn new(subnet: Option<Subnet>) -> Self {
        Self {
            subnet,
            backoff: None,
            no_prefix: None,
            free_known: false,
        }
    }
}

pub(crate) struct CreatingEni {
    pub device_index: u32,
    pub subnet_id: String,
    /// The profile it is created for (`None`: the default pod network).
    pub profile: Option<ProfileName>,
    /// IPs in the create call as planned: pods + warm.
    pub count: u32,
    pub warm: u32,
    pub started: Instant,
    /// What the call asks for at its next attempt while EC2 throttles it: `count` and the waiters
    /// that came since (see [`PoolState::grow_creates`]). `None`: `count` only.
    pub live: Option<LiveCount>,
}

/// An IP held out of circulation: neither idle nor assigned (see [`super::Pool::lift_quarantine`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quarantine {
    pub eni: EniId,
    pub since: Instant,
    pub reason: String,
}

#[derive(Default)]
pub(crate) struct Pending {
    followers: Vec<oneshot::Sender<Result<Allocation, PoolError>>>,
    released: bool,
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

/// Where a new IP should come from ([`PoolState::pick_eni`]).
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
    /// Acquires in line, each holding a capacity token: waiting for a new ENI, or for EC2 to take
    /// calls again (throttled, an ENI or ENI creation backing off: `Waiter::waiting_on`, answered
    /// at `Waiter::deadline` at the latest). Each maintainer round routes them again.
    pub create_waiters: VecDeque<Waiter>,
    /// Acquires that found every token taken while warm-ups were in flight: they hold no token and
    /// take the warm IPs as those land (see [`PoolState::plan_round`]).
    pub warm_waiters: VecDeque<Waiter>,
    pub subnets: BTreeMap<String, SubnetRecord>,
    pub releasing: BTreeMap<Ipv4Addr, IdleEntry>,
    /// IPs held out of circulation until evidence or an operator clears them.
    pub quarantined: BTreeMap<Ipv4Addr, Quarantine>,
    /// Idle IPs of ENIs EC2 did not show attached at the last look ([`EniPhase::Suspect`]): not
    /// handed out until the ENI is confirmed (they go back to the idle queue) or forgotten.
    pub held_back: BTreeMap<Ipv4Addr, IdleEntry>,
    /// IPs the startup rebuild took from the journal or the plugin's cache while EC2's describe
    /// did not show them (EC2's lag, or lost since): their pods keep them, but none goes to a new
    /// pod (idle, it waits in `held_back`) until a describe shows it; at its next miss it is
    /// forgotten ([`super::Pool::hold_unconfirmed`]).
    pub unconfirmed: BTreeSet<Ipv4Addr>,
    /// Warm-up IPs asked for and not arrived.
    pub warming: u32,
    /// The node's recent pod starts, for the adaptive warm levels.
    pub demand: Demand,
    /// ENIs the node may have, eth0 included.
    pub max_enis: u32,
    /// Slots per ENI (IPv4 per ENI − 1: the primary is not used); a slot is one address, or a
    /// `/28` prefix of 16 with prefix delegation.
    pub per_eni: u32,
    /// The subnets new ENIs may go to (the node's own, or those discovered or configured), in order
    /// of preference when they have as many free addresses.
    pub pod_subnets: Vec<String>,
    /// What decides the subnet and groups of new ENIs (custom networking's ENIConfig, or discovery).
    pub pod_network: PodNetwork,
    /// The network profiles the node serves ([`crate::pool::profiles`]).
    pub profiles: BTreeMap<ProfileName, ProfileNetwork>,
    next_create_id: u64,
    /// EC2 throttled the node's growth calls (create, attach) lately: the account is short of them,
    /// so the round starts no ENI for warm-ups alone (set by the maintainer before each round; see
    /// [`PoolState::plan_round`]).
    pub growth_contended: bool,
    /// EC2 throttled the node's assigns lately: warm-ups alone make no assign call (they ride along
    /// in pods' calls instead; see [`PoolState::plan_round`]).
    pub assign_contended: bool,
    /// The node has not held a warm IP yet since the daemon started, and serves no pod: a booting
    /// node (its startup taint keeps pods away until the pool is warm). Its first warm-up is what
    /// its pods wait on, so it is not held under contention, and with burst prefixes it takes a
    /// whole `/28` ([`PoolState::booting`]).
    pub first_warm_pending: bool,
    /// Addresses the instance was launched with, found fresh at the daemon's first start (its node
    /// group's launch template asked RunInstances for them): the node holds at least this many,
    /// pods included, as `minimum_ips` would, so the warm pool never gives back what the operator
    /// sized for the node's pods before they come.
    pub launch_floor: u32,
    pub shutting_down: bool,
}

impl EniRecord {
    /// Slots this ENI uses: its prefixes and its single secondary IPs.
    pub fn slots_used(&self) -> u32 {
        let in_prefixes = self.prefixes.len() as u32 * PREFIX_ADDRESSES;
        self.prefixes.len() as u32 + (self.ips.len() as u32).saturating_sub(in_prefixes)
    }
}

impl PoolState {
    /// Whether the node is booting: no warm IP held yet since the start, and no pod served or
    /// asking ([`PoolState::first_warm_pending`]).
    pub(crate) fn booting(&self) -> bool {
        self.first_warm_pending && self.allocations.is_empty() && self.pending.is_empty()
    }

    /// Burst prefixes are on for this node (configured, a Nitro type, and no prefix delegation):
    /// a default-network ENI's free slots take single IPs or whole `/28`s ([`crate::pool::growth`]).
    pub(crate) fn burst_prefixes(&self) -> bool {
        self.config.burst_prefixes && !self.config.prefix_delegation && self.node.limits.nitro
    }

    /// Whether the default network's slots may take whole `/28`s: prefix delegation, or burst
    /// prefixes.
    pub(crate) fn prefix_slots(&self) -> bool {
        self.config.prefix_delegation || self.burst_prefixes()
    }

    /// Whether `r`'s free slots may take whole `/28`s: prefix delegation, or burst prefixes on a
    /// default-network ENI (a profile's ENIs keep the mode its advertised capacity counts).
    fn slots_take_prefixes(&self, r: &EniRecord) -> bool {
        self.config.prefix_delegation || (self.burst_prefixes() && r.profile.is_none())
    }

    /// Addresses a free slot of `r` counts for in its room: 16 when it may take a `/28`, else 1.
    fn room_per_slot(&self, r: &EniRecord) -> u32 {
        if self.slots_take_prefixes(r) {
            PREFIX_ADDRESSES
        } else {
            1
        }
    }

    /// Free slots on `r`, requests in flight counted (when slots take prefixes, a prefix per 16 of
    /// them).
    fn eni_room(&self, r: &EniRecord) -> u32 {
        let inflight_slots = r.inflight.div_ceil(self.room_per_slot(r));
        self.per_eni.saturating_sub(r.slots_used() + inflight_slots)
    }

    /// Warm IPs the node has or has coming: idle ones of the default network's ENIs no reservation
    /// holds, and warm-ups in flight. What the warm levels are compared with (a profile keeps no
    /// warm IPs: its idle ones are not the default network's).
    fn warm_on_hand(&self, now: Instant) -> u32 {
        self.default_idle_unreserved(now) + self.warming
    }

    /// Addresses `r` can still take.
    fn eni_room_addresses(&self, r: &EniRecord) -> u32 {
        let per_slot = self.room_per_slot(r);
        let slots_free = self.per_eni.saturating_sub(r.slots_used());
        (slots_free * per_slot).saturating_sub(r.inflight)
    }

    /// Addresses the next assign on `r` can bring now: when its slots take prefixes but its subnet
    /// has no free `/28` for now, the assign asks for single addresses, one per slot, so the room
    /// is counted in single addresses (else a batch of a prefix's worth of singles exceeds the
    /// ENI's per-interface limit, and EC2 refuses the whole batch).
    fn eni_room_now(&self, r: &EniRecord, now: Instant) -> u32 {
        if self.slots_take_prefixes(r) && self.prefixes_blocked(&r.subnet_id, now) {
            self.per_eni
                .saturating_sub(r.slots_used())
                .saturating_sub(r.inflight)
        } else {
            self.eni_room_addresses(r)
        }
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
            meta: rec.meta.clone(),
            eni: rec.eni.clone(),
            mac: eni.map(|e| e.mac.clone()).unwrap_or_default(),
            device_index: eni.map_or(0, |e| e.device_index),
            subnet_id: eni.map(|e| e.subnet_id.clone()).unwrap_or_default(),
            subnet_cidr: subnet.map_or_else(|| Ipv4Net::from(rec.ip), |s| s.cidr),
            gateway: subnet.map_or(Ipv4Addr::UNSPECIFIED, Subnet::gateway),
            network: rec.network.clone(),
        }
    }

    /// Records `ip` (on `eni`) as held by `key` and returns the reply.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        key: AttachmentKey,
        pod: PodRef,
        sticky_key: Option<String>,
        meta: AttachmentMeta,
        network: Option<ProfileName>,
        ip: Ipv4Addr,
        eni: EniId,
        now: Instant,
    ) -> Allocation {
        let rec = AllocationRecord {
            ip,
            eni,
            pod,
            sticky_key,
            meta,
            since: now,
            network,
        };
        let alloc = self.allocation_of(&key, &rec);
        self.assigned.insert(ip, key.clone());
        self.allocations.insert(key, rec);
        alloc
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

    /// The device indexes no ENI uses or is being created at, lowest first (which a network may
    /// take: [`PoolState::free_device_index_for`]).
    fn free_device_indexes(&self) -> Vec<u32> {
        let used: BTreeSet<u32> = self
            .enis
            .values()
            .map(|r| r.device_index)
            .chain(self.creating.values().map(|c| c.device_index))
            .collect();
        (1..self.max_enis).filter(|i| !used.contains(i)).collect()
    }

    /// EC2's description of an ENI, if known.
    pub fn cloud_eni(&self, eni: &EniId) -> Option<Eni> {
        self.enis.get(eni).and_then(|r| r.cloud.clone())
    }
}
