//! The IP pool: the heart of eniipamd.
//!
//! A [`Pool`] hands out the node's VPC secondary IPs to pod attachments and takes them back. Its
//! parts, one file each:
//!
//! - [`capacity`]: capacity tokens, one per IP slot the node may hold; taken before an IP is asked
//!   of EC2, returned when it is given back. `idle + assigned + in flight ≤ capacity`, always.
//! - [`idle`]: the idle queue, in reverse-time order (the IP idle the longest goes first), with the
//!   reuse cooldown and sticky reservations.
//! - `eni`: one actor per attached ENI with its bounded ipBacklog; it batches what it receives
//!   within a short window into ONE assign (or unassign) call and answers every waiter.
//! - [`demand`]: the adaptive warm pool: the node's recent pod starts and bursts, the pods bound
//!   to it and not ADDed yet, and the warm levels (top up below, fill to, give back beyond) that
//!   follow, within `[min_idle, max_idle]`; what it learned goes to the state file through the
//!   daemon ([`Pool::demand_memory`], [`Pool::restore_demand`]).
//! - [`growth`]: how a burst beyond the idle IPs grows the node, as pure decisions: single IPs or
//!   whole `/28`s in one assign, or one new ENI carrying the burst when the assign bucket is dry.
//! - `maintainer`: keeps idle IPs at those levels in batches, creates an ENI (with its IPs in the
//!   create call) when every ENI is full, releases ENIs that hold no IP.
//! - `state`: the bookkeeping every part reads and writes under one lock, in short critical
//!   sections that never await; every routing decision is made there.
//! - [`pod_network`]: where new ENIs go: discovered subnets, or the node's ENIConfig (custom
//!   networking), changed at run time by [`Pool::set_pod_network`].
//! - [`profiles`]: network profiles (a subnet and security groups per workload): ENIs per
//!   profile, no IP of one handed to another, set by [`Pool::set_profiles`].
//! - [`slots`]: single IPs or `/28` prefixes, and the dense packing of single addresses.
//! - [`seed`], [`snapshot`], [`error`], [`config`]: the startup input, the read-only view, the
//!   typed errors and the configuration.
//! - `types`: the words the others share (the request, the waiter, the ENI phase, the actor's
//!   commands, the state's plans and outcomes), below all of them; `shared`: what the tasks share
//!   and the provisioner and readiness seams.
//!
//! Imports go one way: this file → `maintainer` → `eni` → `shared` → `state` → `types` (and the
//! leaf modules above).
//!
//! Time is tokio's (`tokio::time::Instant`, `sleep`, `interval`) everywhere, so
//! `tokio::time::pause` drives every timer in tests.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::unix_ms_now;
use crate::cloud::lifecycle::EniLifecycle;
use crate::cloud::{Cloud, Metadata, NodeContext};
use crate::model::{AttachmentKey, EniId, PodRef};
use crate::store::StoredDemand;

pub mod capacity;
pub mod config;
pub mod demand;
mod drift;
mod eni;
pub mod error;
pub mod growth;
pub mod idle;
mod maintainer;
pub mod pod_network;
pub mod profiles;
pub mod seed;
mod shared;
pub mod slots;
pub mod snapshot;
mod state;
mod types;

pub use capacity::{CapacityTokens, node_capacity};
pub use config::{ConfigError, PREFIX_ADDRESSES, PoolConfig};
pub use drift::Forgotten;
pub use error::{
    BackoffTarget, ExhaustionReason, PoolError, PreferUnavailable, ProfileUnavailableReason,
};
pub use pod_network::PodNetwork;
pub use profiles::{ProfileCapacity, ProfileName, ProfileNetwork};
pub use seed::QuarantineSeed;
pub use seed::{AllocationSeed, EniSeed, IdleSeed, PoolSeed, SeedError};
pub use shared::{ChangeJournal, EniProvisioner, EniReadiness, NewEniFacts, PoolSeams};
pub use snapshot::{
    EniPhaseSnapshot, EniSnapshot, IpSnapshot, IpState, PoolSnapshot, SubnetBackoffSnapshot,
    SubnetSnapshot,
};
pub use state::EniRole;
pub use types::{Acquire, Allocation, AttachmentMeta, EniPhase, Released};

use maintainer::MaintainerCommand;
use shared::Shared;
use state::{PoolState, Route};
use types::{AssignBatch, AssignOutcome, EniCommand, EniHandle};

/// How long after a waiting acquire's budget the pool's own answer still wins: the maintainer
/// answers waiters that wait out a back-off at their deadline, with the error they waited on.
const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// The pool's answer to a waiting acquire; or, once its budget (`answer_by`) has run out with its
/// IP still on the way (an assign in flight or being retried, an ENI being created and attached),
/// [`PoolError::WaitedTooLong`], so the caller hears why within its budget rather than nothing by
/// its own deadline (the plugin's gRPC timeout). `answer_by` `None`: no budget, the answer whenever
/// it comes. The dropped receiver is a cancelled acquire: an IP that lands for it later goes idle.
async fn answer(
    rx: oneshot::Receiver<Result<Allocation, PoolError>>,
    started: Instant,
    answer_by: Option<Instant>,
) -> Result<Allocation, PoolError> {
    let Some(answer_by) = answer_by else {
        return rx.await.unwrap_or(Err(PoolError::ShuttingDown));
    };
    match tokio::time::timeout_at(answer_by + ANSWER_GRACE, rx).await {
        Ok(r) => r.unwrap_or(Err(PoolError::ShuttingDown)),
        Err(_) => Err(PoolError::WaitedTooLong {
            waited: started.elapsed(),
            last_error: Box::new(PoolError::StillComing),
        }),
    }
}

/// Gives back what routing took for a waiter that never reached its ENI actor (the acquire was
/// cancelled while the send waited on a full ipBacklog).
struct RoutedGuard<'a> {
    shared: &'a Arc<Shared>,
    eni: EniId,
    key: AttachmentKey,
    armed: bool,
}

impl Drop for RoutedGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(attachment = %self.key, eni = %self.eni, "acquire cancelled before its request reached the ENI; giving back its token");
            self.shared.lock().abandon_routed(&self.eni, &self.key);
            self.shared.wake.notify_one();
        }
    }
}

struct PoolInner {
    shared: Arc<Shared>,
    maintainer_tx: Mutex<Option<mpsc::Sender<MaintainerCommand>>>,
    maintainer_task: Mutex<Option<JoinHandle<()>>>,
}

impl PoolInner {
    /// Stops taking work, drops every actor handle (actors end after their backlog) and the
    /// maintainer's sender; returns the tasks to wait for.
    fn stop(&self) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        {
            let mut st = self.shared.lock();
            st.shutting_down = true;
            for w in std::mem::take(&mut st.create_waiters) {
                let _ = w.respond_to.send(Err(PoolError::ShuttingDown));
            }
            for w in std::mem::take(&mut st.warm_waiters) {
                let _ = w.respond_to.send(Err(PoolError::ShuttingDown));
            }
            for r in st.enis.values_mut() {
                r.handle = None;
                tasks.extend(r.task.take());
            }
        }
        self.maintainer_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        tasks.extend(
            self.maintainer_task
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        tasks
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The pool handle: cheap to clone; the pool stops when the last clone is dropped or on
/// [`Pool::shutdown`].
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.shared.lock();
        f.debug_struct("Pool")
            .field("capacity", &st.capacity)
            .field("idle", &st.idle.len())
            .field("assigned", &st.allocations.len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Starts the pool for `node` from `seed` (ENIs already attached, assignments restored), with
    /// the real ENI lifecycle and no seams (nothing waits on a new ENI, nothing is journalled).
    /// Must be called inside a tokio runtime: it spawns one actor per ENI and the maintainer.
    pub fn start(
        config: PoolConfig,
        cloud: Arc<dyn Cloud>,
        metadata: Arc<dyn Metadata>,
        node: NodeContext,
        seed: PoolSeed,
    ) -> Result<Self, PoolError> {
        Self::start_with_seams(config, cloud, metadata, node, seed, PoolSeams::default())
    }

    /// [`Pool::start`] with the daemon's [`PoolSeams`] (the readiness gate of new ENIs, the journal
    /// of address changes), in force from the first ENI actor on.
    pub fn start_with_seams(
        config: PoolConfig,
        cloud: Arc<dyn Cloud>,
        metadata: Arc<dyn Metadata>,
        node: NodeContext,
        seed: PoolSeed,
        seams: PoolSeams,
    ) -> Result<Self, PoolError> {
        let lifecycle = Arc::new(EniLifecycle::new(
            cloud.clone(),
            metadata.clone(),
            node.clone(),
            config.lifecycle,
        ));
        Self::launch(config, (cloud, metadata), node, seed, (lifecycle, seams))
    }

    /// [`Pool::start`] with another ENI provisioner.
    pub fn start_with_provisioner(
        config: PoolConfig,
        cloud: Arc<dyn Cloud>,
        metadata: Arc<dyn Metadata>,
        node: NodeContext,
        seed: PoolSeed,
        provisioner: Arc<dyn EniProvisioner>,
    ) -> Result<Self, PoolError> {
        let seams = PoolSeams::default();
        Self::launch(config, (cloud, metadata), node, seed, (provisioner, seams))
    }

    /// Builds the state from `seed` and spawns the ENI actors and the maintainer.
    fn launch(
        config: PoolConfig,
        (cloud, metadata): (Arc<dyn Cloud>, Arc<dyn Metadata>),
        node: NodeContext,
        seed: PoolSeed,
        (provisioner, seams): (Arc<dyn EniProvisioner>, PoolSeams),
    ) -> Result<Self, PoolError> {
        config.validate()?;
        let state = PoolState::from_seed(config.clone(), node, seed, Instant::now())?;
        let pod_enis: Vec<(EniId, String)> = state
            .enis
            .values()
            .filter(|r| r.serves)
            .map(|r| (r.id.clone(), r.mac.clone()))
            .collect();
        let shared = Arc::new(Shared::new(
            config,
            cloud,
            metadata,
            provisioner,
            seams,
            state,
        ));
        for (id, mac) in pod_enis {
            let (handle, task) = EniHandle::spawn(shared.clone(), id.clone(), mac);
            let mut st = shared.lock();
            let r = st.enis.get_mut(&id).expect("seeded ENI");
            r.handle = Some(handle);
            r.task = Some(task);
        }
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(
            maintainer::run(shared.clone(), rx).instrument(tracing::info_span!("pool_maintainer")),
        );
        {
            let st = shared.lock();
            tracing::info!(
                capacity = st.capacity.capacity(),
                held = st.capacity.used(),
                enis = st.enis.len(),
                min_idle = st.config.min_idle,
                max_idle = st.config.max_idle,
                "IP pool started"
            );
        }
        Ok(Self {
            inner: Arc::new(PoolInner {
                shared,
                maintainer_tx: Mutex::new(Some(tx)),
                maintainer_task: Mutex::new(Some(task)),
            }),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// An IP for `attachment`.
    ///
    /// - The same attachment gets the same IP back (also while its first acquire is in flight).
    /// - With a `sticky_key`, an IP reserved for that key wins (`prefer` picks among several).
    /// - With `prefer`, that IP if it is idle and free for this caller; otherwise
    ///   [`PoolError::PreferredUnavailable`] — never another IP.
    /// - Otherwise the IP idle the longest, past its cooldown; failing that, a new IP from EC2
    ///   (batched with concurrent requests, or carried by a new ENI).
    pub async fn acquire(
        &self,
        attachment: AttachmentKey,
        pod: PodRef,
        prefer: Option<Ipv4Addr>,
        sticky_key: Option<String>,
    ) -> Result<Allocation, PoolError> {
        self.acquire_with(Acquire {
            key: attachment,
            pod,
            prefer,
            sticky_key,
            meta: AttachmentMeta::default(),
            wait: None,
            network: None,
        })
        .await
    }

    /// [`Pool::acquire`] with the attachment's [`AttachmentMeta`] kept alongside.
    ///
    /// Cancelling the returned future is safe at any point: before the request reaches an ENI actor
    /// everything it took (a capacity token, the attachment's pending entry) is given back; after, an
    /// IP that arrives for nobody goes idle.
    pub async fn acquire_with(&self, req: Acquire) -> Result<Allocation, PoolError> {
        let span = tracing::info_span!(
            "acquire",
            attachment = %req.key,
            pod = %req.pod.sticky_key(),
            prefer = ?req.prefer,
        );
        let shared = self.shared().clone();
        async move {
            let started = Instant::now();
            // The request's budget for EC2 (`add_wait`, or less by the caller's deadline); none
            // with `add_wait` zero, whose requests fail at once when EC2 is slow and otherwise wait
            // for their call as they always did.
            let (answer_by, route) = {
                let mut st = shared.lock();
                let budget = st.config.add_budget(req.wait);
                let route = st.route_acquire(req, started, tracing::Span::current());
                ((!budget.is_zero()).then_some(started + budget), route)
            };
            let result = match route {
                Route::Done(result) => {
                    if result.is_ok() {
                        shared.wake.notify_one();
                    }
                    result
                }
                Route::Wait(rx) => {
                    shared.wake.notify_one();
                    answer(rx, started, answer_by).await
                }
                Route::Send {
                    eni,
                    handle,
                    waiter,
                    rx,
                } => {
                    // Until the actor has the waiter, a cancelled acquire must give back what
                    // routing took (the send may wait on a full ipBacklog).
                    let mut guard = RoutedGuard {
                        shared: &shared,
                        eni: eni.clone(),
                        key: waiter.req.key.clone(),
                        armed: true,
                    };
                    let sent = handle.send(EniCommand::Assign(Box::new(waiter))).await;
                    guard.armed = false;
                    if let Err(EniCommand::Assign(w)) = sent {
                        let _ = shared.lock().settle_assign(
                            &eni,
                            AssignBatch {
                                pods: vec![*w],
                                warm: 0,
                            },
                            AssignOutcome::NotSent(PoolError::ShuttingDown),
                            Instant::now(),
                        );
                    }
                    answer(rx, started, answer_by).await
                }
            };
            match &result {
                Ok(a) => tracing::info!(ip = %a.ip, eni = %a.eni, "acquired"),
                Err(e) => tracing::info!(error = %e, "acquire failed"),
            }
            result
        }
        .instrument(span)
        .await
    }

    /// Takes `attachment`'s IP back: it goes idle and cools down for `reuse_cooldown`; with
    /// `sticky`, it stays reserved for the attachment's sticky key (or pod `namespace/name`) for
    /// `ip_stick_time`. Returns the IP and the reservation made, or `None` for an unknown attachment
    /// (a no-op).
    pub fn release(
        &self,
        attachment: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<Released>, PoolError> {
        let released = self
            .shared()
            .lock()
            .release(attachment, sticky, Instant::now());
        match &released {
            Some(r) => {
                tracing::info!(%attachment, ip = %r.ip, sticky, "released");
                self.shared().wake.notify_one();
            }
            None => tracing::debug!(%attachment, "release of an unknown attachment"),
        }
        Ok(released)
    }

    /// Puts a released allocation back as it was (recording the release failed), unless its IP went
    /// elsewhere meanwhile. Returns whether it did.
    pub fn undo_release(&self, released: &Released) -> bool {
        let undone = self.shared().lock().undo_release(&released.undo);
        if undone {
            tracing::warn!(attachment = %released.undo.key, ip = %released.ip, "release undone: the attachment holds its IP again");
        }
        undone
    }

    /// The pods bound to this node that want a pod IP, as the API-server watch sees them now (not
    /// host-network, not finished, not being deleted; a mirror pod under its static pod's UID).
    /// Those without an IP from this pool are demand at once (see [`demand`]): new ones count as
    /// pod starts now, and the maintainer warms for every one waiting, so their ADDs find IPs
    /// ready. The set replaces the last one: a pod missing from it stops counting. The pool is
    /// woken when the set changed.
    pub fn announce_bound_pods(&self, bound: &[PodRef]) -> demand::AnnounceOutcome {
        let now = Instant::now();
        let outcome = {
            let mut guard = self.shared().lock();
            let st = &mut *guard;
            let held: std::collections::HashMap<(&str, &str), &str> = st
                .allocations
                .values()
                .map(|r| {
                    (
                        (r.pod.namespace.as_str(), r.pod.name.as_str()),
                        r.pod.uid.as_str(),
                    )
                })
                .collect();
            let has_ip = |p: &PodRef| {
                held.get(&(p.namespace.as_str(), p.name.as_str()))
                    .is_some_and(|uid| uid.is_empty() || p.uid.is_empty() || *uid == p.uid)
            };
            st.demand.announce(bound, has_ip, now)
        };
        if outcome.new > 0 || outcome.withdrawn > 0 {
            tracing::debug!(
                new = outcome.new,
                withdrawn = outcome.withdrawn,
                waiting = outcome.waiting,
                "pods bound to the node without an IP: demand before their ADDs"
            );
            self.shared().wake.notify_one();
        }
        outcome
    }

    /// Calls `observe` with how long before its ADD each pod was first seen as demand
    /// ([`Pool::announce_bound_pods`]): the lead time the API-server watch buys.
    pub fn set_lead_time_observer(&self, observe: impl Fn(Duration) + Send + Sync + 'static) {
        self.shared()
            .lock()
            .demand
            .set_lead_time_observer(demand::LeadTimeObserver(Arc::new(observe)));
    }

    /// What the demand remembers, for the state file, with its generation (it changes whenever
    /// the memory does; compare to skip a write).
    pub fn demand_memory(&self) -> (u64, StoredDemand) {
        let st = self.shared().lock();
        let memory = st.demand.memory(Instant::now(), unix_ms_now());
        (st.demand.generation(), memory)
    }

    /// Takes back the demand an earlier life of the daemon learned ([`Pool::demand_memory`]), with
    /// its ages; older than the memory's horizons is dropped. Call right after [`Pool::start`].
    pub fn restore_demand(&self, stored: &StoredDemand) {
        self.shared()
            .lock()
            .demand
            .restore(stored, Instant::now(), unix_ms_now());
        self.shared().wake.notify_one();
    }

    /// Sets what decides the subnet and security groups of new ENIs (custom networking's ENIConfig,
    /// as the daemon resolved it); returns what it was. ENIs the node has are left as they are. The
    /// maintainer runs at once: creates that waited on an unusable ENIConfig go ahead, or the
    /// acquires waiting on them get [`PoolError::NoPodNetwork`].
    pub fn set_pod_network(&self, network: PodNetwork) -> PodNetwork {
        let old = self.inner.shared.lock().set_pod_network(network);
        self.inner.shared.wake.notify_one();
        old
    }

    /// What decides the subnet and security groups of new ENIs now.
    pub fn pod_network(&self) -> PodNetwork {
        self.inner.shared.lock().pod_network.clone()
    }

    /// The profiles the node serves now ([`profiles`]). A profile that disappears stops getting new
    /// ENIs and its acquires fail with [`PoolError::ProfileUnavailable`] (its ENIs keep their pods
    /// and are given back once empty); a changed one applies to new ENIs only. The maintainer runs
    /// at once: waiters of a removed profile are answered.
    pub fn set_profiles(&self, profiles: BTreeMap<ProfileName, ProfileNetwork>) {
        self.shared().lock().set_profiles(profiles);
        self.shared().wake.notify_one();
    }

    /// Per profile the node serves: its ENIs, assigned and idle IPs, free slots and the total it advertises (see
    /// [`ProfileCapacity::free`]): what the node advertises as the profile's extended resource.
    pub fn profile_capacity(&self) -> BTreeMap<ProfileName, ProfileCapacity> {
        self.shared().lock().profile_capacity(Instant::now())
    }

    /// A read-only view of the pool now.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.shared().lock().snapshot(Instant::now())
    }

    /// The allocation of `attachment`, if it holds an IP.
    pub fn allocation(&self, attachment: &AttachmentKey) -> Option<Allocation> {
        let st = self.shared().lock();
        let rec = st.allocations.get(attachment)?;
        Some(st.allocation_of(attachment, rec))
    }

    /// Runs a maintainer round now and waits until its cloud work (warm-ups, give-backs, ENI
    /// creation and release) is done. For operators ("reconcile now") and tests.
    pub async fn maintain_now(&self) -> Result<(), PoolError> {
        let tx = self
            .inner
            .maintainer_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(PoolError::ShuttingDown)?;
        let (respond_to, rx) = oneshot::channel();
        tx.send(MaintainerCommand::RunNow { respond_to })
            .await
            .map_err(|_| PoolError::ShuttingDown)?;
        rx.await.map_err(|_| PoolError::ShuttingDown)
    }

    /// Checks the pool's token accounting (`tokens used = idle + releasing + assigned + in flight`,
    /// and every held IP is on an ENI). For tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.shared().lock().check_invariants()
    }

    /// Stops the pool: pending waits for a new ENI are answered with [`PoolError::ShuttingDown`],
    /// actors finish their backlog and end, the maintainer ends. ENIs and IPs stay as they are.
    pub async fn shutdown(&self) {
        for task in self.inner.stop() {
            let _ = task.await;
        }
    }
}
