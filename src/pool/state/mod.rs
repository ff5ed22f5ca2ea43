//! The pool's bookkeeping: one [`PoolState`] behind the pool's mutex, written by the acquire and
//! release paths, the ENI actors and the maintainer, each in short critical sections that never
//! await. Every decision about which IP or which ENI happens here, in one place, against one
//! consistent view; the cloud calls happen outside, in the actors and the maintainer's tasks.
//!
//! Token accounting (checked by [`PoolState::check_invariants`]):
//! `tokens used = idle + releasing + assigned + Σ ENI in-flight + waiting for an ENI + Σ creating`.
//!
//! The state's methods are split by job:
//! - this file: the records, lookups and the invariant check;
//! - [`seeding`]: building the state from the startup seed;
//! - [`routing`]: where an acquire goes (idle IP, an ENI actor, a new ENI) and how waiters are answered;
//! - [`outcomes`]: applying what the actors and the maintainer's cloud calls returned;
//! - [`plan`]: the maintainer's plan for one round;
//! - [`drift`]: what the running reconcile changes when the pool and EC2 (or the host) disagree.

mod drift;
mod outcomes;
mod plan;
mod routing;
mod seeding;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::capacity::{CapacityTokens, node_capacity};
use super::config::PREFIX_ADDRESSES;
use super::demand::{Demand, NodeLoad, WarmLevels};
use super::eni::{EniHandle, EniPhase, Waiter};
use super::error::{BackoffTarget, ExhaustionReason, PoolError, PreferUnavailable};
use super::idle::{IdleEntry, IdleQueue, IdleRefusal, Reservation};
use super::seed::{PoolSeed, SeedError};
use super::{Allocation, AttachmentMeta, PoolConfig, Released};
use crate::cloud::lifecycle::Slots;
use crate::cloud::{CloudError, Eni, NodeContext, Subnet};
use crate::model::{AttachmentKey, EniId, PodRef};

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
    /// IPs in the create call: pods + warm.
    pub count: u32,
    pub warm: u32,
    pub started: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AllocationRecord {
    pub ip: Ipv4Addr,
    pub eni: EniId,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
    pub since: Instant,
}

/// An allocation as it was before a release, so the release can be undone when recording it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseUndo {
    pub key: AttachmentKey,
    pub record: AllocationRecord,
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

/// An acquire as the state sees it.
pub(crate) struct AcquireRequest {
    pub key: AttachmentKey,
    pub pod: PodRef,
    pub prefer: Option<Ipv4Addr>,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
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

/// How an ENI actor fetches a batch's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AssignPlan {
    /// Single secondary IPs, EC2 picking them.
    Ips,
    /// `/28` prefixes; `extra` addresses beyond the batch's count were added to it as warm-ups.
    Prefixes { count: u32, extra: u32 },
    /// Single addresses picked by the pool, packed into blocks already fragmented.
    Packed,
}

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
    next_create_id: u64,
    pub shutting_down: bool,
}

impl EniRecord {
    /// Slots this ENI uses: its prefixes and its single secondary IPs.
    pub fn slots_used(&self) -> u32 {
        let in_prefixes = self.prefixes.len() as u32 * super::config::PREFIX_ADDRESSES;
        self.prefixes.len() as u32 + (self.ips.len() as u32).saturating_sub(in_prefixes)
    }
}

impl PoolState {
    /// Free slots on `r`, requests in flight counted (in prefix mode, a prefix per 16 of them).
    fn eni_room(&self, r: &EniRecord) -> u32 {
        let inflight_slots = r.inflight.div_ceil(self.config.addresses_per_slot());
        self.per_eni.saturating_sub(r.slots_used() + inflight_slots)
    }

    /// Addresses `r` can still take.
    fn eni_room_addresses(&self, r: &EniRecord) -> u32 {
        let per_slot = self.config.addresses_per_slot();
        let slots_free = self.per_eni.saturating_sub(r.slots_used());
        (slots_free * per_slot).saturating_sub(r.inflight)
    }

    /// Addresses the next assign on `r` can bring now: with prefix delegation, while its subnet has
    /// no free `/28` the assign asks for single packed addresses, one per slot, so the room is
    /// counted in single addresses (else a batch of a prefix's worth of singles exceeds the ENI's
    /// per-interface limit, and EC2 refuses the whole batch).
    pub(super) fn eni_room_now(&self, r: &EniRecord, now: Instant) -> u32 {
        if self.config.prefix_delegation && self.prefixes_blocked(&r.subnet_id, now) {
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

    /// The warm levels of the configured policy at `now` (see [`super::demand`]).
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
        super::demand::warm_levels(&self.config, &self.demand, load, now)
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

    /// The subnet for a new ENI: of the pod subnets not backing off, the one with the most free
    /// addresses EC2 last reported (with prefix delegation, one that still has `/28`s first).
    ///
    /// Subnets within a quarter of the best count are as good: among them each node takes one by
    /// a hash of its instance id, so nodes that boot together (and read the same counts) spread over
    /// them instead of all draining the same one.
    pub fn pick_subnet(&self, now: Instant) -> String {
        let candidates: Vec<&String> = self
            .pod_subnets
            .iter()
            .filter(|id| self.create_blocked(id, now).is_none())
            .collect();
        let free = |id: &str| {
            self.subnets
                .get(id)
                .and_then(|s| s.subnet.as_ref())
                .map_or(0, |s| s.available_ips)
        };
        let prefixes_ok =
            |id: &str| !self.config.prefix_delegation || !self.prefixes_blocked(id, now);
        let Some(best) = candidates
            .iter()
            .max_by_key(|id| {
                (
                    prefixes_ok(id),
                    free(id),
                    std::cmp::Reverse(self.pod_subnets.iter().position(|s| s == **id)),
                )
            })
            .map(|id| (*id).clone())
        else {
            return self.node.subnet_id.clone();
        };
        let (best_ok, best_free) = (prefixes_ok(&best), free(&best));
        let as_good: Vec<&&String> = candidates
            .iter()
            .filter(|id| prefixes_ok(id) == best_ok && free(id) >= best_free - best_free / 4)
            .collect();
        if as_good.len() < 2 || best_free == 0 {
            return best;
        }
        let spread = self
            .node
            .instance_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        (*as_good[(spread % as_good.len() as u64) as usize]).clone()
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
            .or_insert_with(|| SubnetRecord::new(None));
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

    /// EC2's description of an ENI, if known.
    pub fn cloud_eni(&self, eni: &EniId) -> Option<Eni> {
        self.enis.get(eni).and_then(|r| r.cloud.clone())
    }

    /// EC2 answered that `subnet_id` has no free address: its count is zero until the next read.
    fn subnet_seen_full(&mut self, subnet_id: &str) {
        if let Some(s) = self
            .subnets
            .get_mut(subnet_id)
            .and_then(|r| r.subnet.as_mut())
        {
            s.available_ips = 0;
        }
        if let Some(r) = self.subnets.get_mut(subnet_id) {
            r.free_known = r.subnet.is_some();
        }
    }

    /// Records a subnet description (fetched before a create, or by the periodic refresh).
    pub fn learn_subnet(&mut self, subnet: Subnet) {
        let id = subnet.id.clone();
        let r = self
            .subnets
            .entry(id)
            .or_insert_with(|| SubnetRecord::new(None));
        r.subnet = Some(subnet);
        r.free_known = true;
    }

    /// Checks the token accounting; `Err` describes the mismatch.
    pub fn check_invariants(&self) -> Result<(), String> {
        let inflight: u32 = self.enis.values().map(|r| r.inflight).sum();
        let creating: u32 = self.creating.values().map(|c| c.count).sum();
        let held = self.idle.len() as u32
            + self.releasing.len() as u32
            + self.allocations.len() as u32
            + self.quarantined.len() as u32
            + self.held_back.len() as u32;
        let sum = held + inflight + creating + self.create_waiters.len() as u32;
        if sum != self.capacity.used() {
            return Err(format!(
                "tokens used {} != idle {} + releasing {} + assigned {} + quarantined {} + held back {} \
                 + in flight {} + creating {} + waiting {}",
                self.capacity.used(),
                self.idle.len(),
                self.releasing.len(),
                self.allocations.len(),
                self.quarantined.len(),
                self.held_back.len(),
                inflight,
                creating,
                self.create_waiters.len()
            ));
        }
        if self.capacity.used() > self.capacity.capacity() {
            return Err(format!(
                "tokens used {} > capacity {}",
                self.capacity.used(),
                self.capacity.capacity()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for ip in self
            .idle
            .ips()
            .chain(self.releasing.keys().copied())
            .chain(self.assigned.keys().copied())
            .chain(self.quarantined.keys().copied())
            .chain(self.held_back.keys().copied())
        {
            if !seen.insert(ip) {
                return Err(format!("{ip} is in two places at once"));
            }
        }
        let on_enis: u32 = self
            .enis
            .values()
            .filter(|r| r.serves)
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
