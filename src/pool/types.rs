//! The words the pool's parts share, below all of them: the request ([`Acquire`]) and its answer
//! ([`Allocation`]), the waiter a request becomes when it needs a new IP ([`Waiter`]), what an ENI
//! actor is asked ([`EniCommand`], through its [`EniHandle`]), where an ENI is in its life
//! ([`EniPhase`]), and what the state plans for an actor's batch and hears back from it
//! ([`AssignPlan`], [`AssignOutcome`], [`GiveBackOutcome`], [`ReleaseOutcome`]).
//!
//! The ENI actor (`eni`), the maintainer and the state (`state`) import from here; nothing here
//! imports them.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Span;

use super::error::PoolError;
use super::profiles::ProfileName;
use crate::cloud::{CloudError, Eni, Subnet};
use crate::model::{AttachmentKey, EniId, PodRef};

/// Where an attachment lives: kept with its allocation, so the pool can say everything the state file
/// records about it (the running reconcile repairs the file from the pool).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttachmentMeta {
    /// The CNI network (the conflist's `name`); empty when unknown.
    pub network: String,
    /// The pod's network namespace path; empty when unknown.
    pub netns: String,
}

/// One acquire, the one shape a request has from the IPAM service down to the ENI actor (a
/// [`Waiter`] carries it): see [`crate::pool::Pool::acquire_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquire {
    pub key: AttachmentKey,
    pub pod: PodRef,
    /// An IP the caller would like; see [`crate::pool::Pool::acquire`].
    pub prefer: Option<Ipv4Addr>,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
    /// How long this request may wait for EC2 (throttled, or backing off after transient failures)
    /// before it fails: the caller's deadline, less a margin for its own answer. `None`: the pool's
    /// `add_wait`. Either way at most `add_wait` ([`crate::pool::PoolConfig::add_wait`] says why).
    pub wait: Option<Duration>,
    /// The network profile the pod selected ([`crate::pool::profiles`]): its IP comes only from an
    /// ENI of that profile. `None`: the node's default pod network.
    pub network: Option<ProfileName>,
}

/// What an acquire returns: everything the RPC layer needs to reply and the CNI plugin to wire the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ip: Ipv4Addr,
    pub attachment: AttachmentKey,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
    pub eni: EniId,
    pub mac: String,
    pub device_index: u32,
    pub subnet_id: String,
    pub subnet_cidr: Ipv4Net,
    /// The VPC router of the subnet ([`crate::cloud::Subnet::gateway`]).
    pub gateway: Ipv4Addr,
    /// The network profile of the IP's ENI (`None`: the default pod network).
    pub network: Option<ProfileName>,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub ip: Ipv4Addr,
    /// The sticky reservation made: the key and until when. `None` without `sticky`, or when
    /// `ip_stick_time` is zero.
    pub reservation: Option<(String, Instant)>,
    /// The allocation as it was, for [`crate::pool::Pool::undo_release`].
    pub(crate) undo: ReleaseUndo,
}

/// An allocation as the state keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AllocationRecord {
    pub ip: Ipv4Addr,
    pub eni: EniId,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
    pub since: Instant,
    /// The profile the attachment asked for (its ENI's, always: see `check_invariants`).
    pub network: Option<ProfileName>,
}

/// An allocation as it was before a release, so the release can be undone when recording it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseUndo {
    pub key: AttachmentKey,
    pub record: AllocationRecord,
}

/// Where an ENI is in its life, as far as the pool is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EniPhase {
    /// Takes requests.
    Serving,
    /// A call failed; no new work is routed here until `until`.
    BackingOff {
        until: Instant,
        /// Consecutive failures (the back-off doubles with each).
        failures: u32,
        last_error: CloudError,
    },
    /// Being detached and deleted; takes no work.
    Draining,
    /// EC2 did not show the ENI attached to this instance at the last look (or answered NotFound
    /// for it): takes no work and its idle IPs are held back, until EC2 confirms it (serving again)
    /// or misses it a second time (forgotten).
    Suspect { since: Instant },
}

impl EniPhase {
    /// Whether work may be routed to the ENI at `now` (a back-off that has run out counts as serving).
    pub fn accepts_work(&self, now: Instant) -> bool {
        match self {
            Self::Serving => true,
            Self::BackingOff { until, .. } => *until <= now,
            Self::Draining | Self::Suspect { .. } => false,
        }
    }

    /// Time left in a back-off at `now`.
    pub fn retry_in(&self, now: Instant) -> Option<Duration> {
        match self {
            Self::BackingOff { until, .. } if *until > now => Some(*until - now),
            _ => None,
        }
    }

    /// After a successful call.
    pub fn succeeded(&self) -> Self {
        match self {
            Self::Draining => Self::Draining,
            Self::Suspect { since } => Self::Suspect { since: *since },
            _ => Self::Serving,
        }
    }

    /// After a failed call at `now`, backing off for `backoff(failures)`.
    pub fn failed(
        &self,
        error: CloudError,
        now: Instant,
        backoff: impl Fn(u32) -> Duration,
    ) -> Self {
        if let Self::Suspect { since } = self {
            return Self::Suspect { since: *since };
        }
        let failures = match self {
            Self::BackingOff { failures, .. } => failures + 1,
            _ => 1,
        };
        Self::BackingOff {
            until: now + backoff(failures),
            failures,
            last_error: error,
        }
    }
}

/// The answer channel of an acquire.
pub(crate) type AllocationReply = oneshot::Sender<Result<Allocation, PoolError>>;

/// The answer channel of a warm-up, give-back or release.
pub(crate) type DoneReply = oneshot::Sender<Result<(), PoolError>>;

/// A pod request for one new IP, as it travels to an ENI actor or waits (for a new ENI, or for EC2
/// to take calls again): the request itself, where to answer, the caller's span and enqueue time,
/// the instant it stops waiting, and why it waits.
pub(crate) struct Waiter {
    pub req: Acquire,
    pub respond_to: AllocationReply,
    pub span: Span,
    pub enqueued_at: Instant,
    /// Past this instant the waiter is answered with [`PoolError::WaitedTooLong`], so the runtime's
    /// own timeout never fires first.
    pub deadline: Instant,
    /// The EC2 failure it waits out (throttling, a back-off), if any: what it is told at its deadline.
    pub waiting_on: Option<Box<PoolError>>,
}

/// What an ENI actor is asked to do.
pub(crate) enum EniCommand {
    /// One IP for a pod (boxed: a waiter is large, and the channel holds every command's size).
    Assign(Box<Waiter>),
    /// `count` IPs for the idle pool.
    Warm {
        count: u32,
        respond_to: DoneReply,
        span: Span,
        enqueued_at: Instant,
    },
    /// Give these idle IPs (and prefixes, every address of which is among `ips`) back to EC2.
    Unassign {
        ips: Vec<Ipv4Addr>,
        prefixes: Vec<Ipv4Net>,
        respond_to: DoneReply,
        span: Span,
        enqueued_at: Instant,
    },
    /// Detach and delete the (empty) ENI, then stop.
    Release { respond_to: DoneReply, span: Span },
}

/// The cloneable handle of one ENI actor: its ipBacklog. The actor behind it is spawned by
/// `EniHandle::spawn` (in `eni`).
#[derive(Clone, Debug)]
pub(crate) struct EniHandle {
    tx: mpsc::Sender<EniCommand>,
}

impl EniHandle {
    /// The handle over the sending side of an actor's backlog.
    pub(crate) fn new(tx: mpsc::Sender<EniCommand>) -> Self {
        Self { tx }
    }

    /// Queues a command (waits while the backlog is full); gives it back if the actor is gone.
    pub(crate) async fn send(&self, cmd: EniCommand) -> Result<(), EniCommand> {
        self.tx.send(cmd).await.map_err(|e| e.0)
    }
}

/// The assign part of an actor's batch: the pods waiting for an IP and the warm-ups.
#[derive(Default)]
pub(crate) struct AssignBatch {
    pub pods: Vec<Waiter>,
    pub warm: u32,
}

impl AssignBatch {
    /// Addresses the batch asks for.
    pub fn count(&self) -> u32 {
        self.pods.len() as u32 + self.warm
    }
}

/// How an ENI actor fetches a batch's addresses: the state's plan
/// ([`PoolState::plan_assign`](crate::pool::state::PoolState::plan_assign)).
#[derive(Debug)]
pub(crate) enum AssignPlan {
    /// The ENI takes no work now: the batch's pods were answered with this error and its tokens
    /// returned; nothing is called.
    Refused(PoolError),
    /// `count` single secondary IPs, EC2 picking them.
    Ips { count: u32 },
    /// `count` `/28` prefixes; `extra` addresses beyond the batch's pods and warm-ups joined it as
    /// warm-ups (already counted in the batch's `warm`).
    Prefixes { count: u32, extra: u32 },
    /// Single addresses picked by the pool; the batch was cut to the ENI's free slots.
    Packed(Packed),
}

/// `count` single addresses picked by the pool, packed into the blocks of `subnet` that are already
/// fragmented (EC2 picks when the subnet is not known).
#[derive(Debug)]
pub(crate) struct Packed {
    pub count: u32,
    pub subnet: Option<Subnet>,
}

/// What an assign batch came to, handed back to the state in one
/// [`PoolState::settle_assign`](crate::pool::state::PoolState::settle_assign).
pub(crate) enum AssignOutcome {
    /// EC2 assigned `ips` (with prefix delegation, in `prefixes`). `eni_unlisted`: every IMDS read
    /// while waiting for them found no interface with this ENI's MAC.
    Assigned {
        ips: Vec<Ipv4Addr>,
        prefixes: Vec<Ipv4Net>,
        eni_unlisted: bool,
    },
    /// The call failed.
    Failed(CloudError),
    /// The batch was never sent (the actor is gone or stopping): answered with this error.
    NotSent(PoolError),
}

/// What a give-back of idle IPs came to.
pub(crate) enum GiveBackOutcome {
    /// EC2 has them no more.
    Done,
    /// A call failed; `singles_gone`: the single addresses went back before the prefixes' call
    /// failed.
    Failed {
        error: CloudError,
        singles_gone: bool,
    },
    /// Never sent: the IPs are idle again.
    NotSent,
}

/// What the release of an empty ENI came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseOutcome {
    /// Detached and deleted (or EC2 no longer knew it).
    Deleted,
    /// Detached, not deleted: the pool forgets it, the leaked-ENI collector deletes it.
    Detached,
    /// It failed and EC2 still shows it attached: it serves again, after a back-off.
    StillAttached,
    /// It failed and EC2 cannot say whether it is attached: as [`Self::StillAttached`], and
    /// suspended until the reconcile decides.
    Unknown,
    /// Never sent (the actor is gone): as [`Self::StillAttached`].
    NotSent,
}

/// What an ENI creation came to, handed back to the state in one
/// [`PoolState::settle_create`](crate::pool::state::PoolState::settle_create).
pub(crate) enum CreateOutcome {
    /// Created, attached (and routable): the ENI with its actor.
    Created {
        eni: Box<Eni>,
        handle: EniHandle,
        task: JoinHandle<()>,
    },
    /// EC2 had no free `/28` in the subnet.
    NoFreePrefix,
    /// The describe, the create or the readiness gate failed.
    Failed(CloudError),
}
