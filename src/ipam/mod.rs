//! The IPAM service: allocate, release, check and garbage-collect pod IPs over the pool and the state
//! file, with the rules that must hold whoever calls (the gRPC API, the running reconcile):
//!
//! - **Invariant 5**: an allocation is answered only after it is committed to SQLite; if the commit
//!   fails, a new allocation goes back to the pool (a repeated ADD keeps its live one) and the caller
//!   gets an error.
//! - **Preferred IPs**: a preferred IP that is not free for this caller falls back to any IP, unless
//!   the caller requires it.
//! - **Sticky reservations**: the pool decides them ([`Released::reservation`]); the file records
//!   exactly what the pool reserved.
//!
//! - **Families**: with `ip_family = ipv6` a pod's address comes from the node's /80 (`crate::ipv6`),
//!   with `dual` from both: the IPv4 first, then the IPv6, each recorded before the answer; an IPv6
//!   that fails undoes a new IPv4. A release releases both under the attachment's lock (`ipv6.rs`).
//!
//! It speaks domain types only; `rpc` converts protobuf to and from them.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use tokio::sync::OwnedMutexGuard;

use crate::clock::{to_unix_ms, unix_ms_now};
use crate::ipv6::{IpFamily, Ipv6Error, Ipv6Pool};
use crate::metrics::Metrics;
use crate::model::AttachmentKey;
use crate::pool::snapshot::IpState;
use crate::pool::{Acquire, Allocation, Pool, PoolError, PoolSnapshot};
use crate::store::{Store, StoreError};

mod drift;
mod extensions;
mod ipv6;
mod journal;

pub use extensions::{Admission, Extensions, ProfileSelector};
pub use ipv6::Allocated6;
pub use journal::StoreJournal;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The startup rebuild is not finished (or the daemon is stopping).
    #[error("eniipamd is starting: the pool is being rebuilt from IMDS, EC2 and the state file")]
    NotReady,
    /// The pool refused.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The node's /80 refused (a preferred IPv6 address that is not free).
    #[error(transparent)]
    Ipv6(#[from] Ipv6Error),
    /// The change could not be recorded durably (and was undone).
    #[error("cannot record the change durably: {0}")]
    Record(#[source] StoreError),
    /// A release could not be recorded and could not be undone either (the IP went elsewhere): the
    /// pool and the file disagree until the running reconcile repairs the file.
    #[error(
        "cannot record the release durably ({0}); the running reconcile will repair the state file"
    )]
    Unrecorded(#[source] StoreError),
    /// Network profiles: the pod's profile could not be learnt (the API server did not answer);
    /// nothing was allocated, and the runtime's next try asks again.
    #[error("cannot learn the pod's network profile: {0}")]
    PodProfile(String),
    /// The pod was not admitted before its ADD is answered ([`Admission::admit`]; NetworkPolicy
    /// enforcement: its rules could not be put in force, the text says why, naming the feature);
    /// the addresses went back, and the runtime's next try asks again.
    #[error("{0}")]
    Admission(String),
}

/// One allocation request, as the service sees it: the pool's request as it goes down to the ENI
/// actor, and the service's own rule for its preferred IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateRequest {
    /// The attachment, its pod, the preferred IP, the sticky key, and where the attachment lives
    /// (`meta.network`: the conflist's `name`; `meta.netns`).
    pub acquire: Acquire,
    /// Fail rather than fall back when `acquire.prefer` is not available.
    pub require_preferred: bool,
    /// An IPv6 address the caller would like (ipv6 and dual), under the same rule.
    pub prefer6: Option<Ipv6Addr>,
    /// The plugin runs in the IPAM role: another plugin wires the pod, so none of this node's
    /// NetworkPolicy rules (keyed by eniipam's host veth) applies to it.
    pub ipam_role: bool,
}

/// What a successful allocation returns: the IPv4 (ipv4 and dual) and the IPv6 (ipv6 and dual).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub family: IpFamily,
    pub allocation: Option<Allocation>,
    pub ipv6: Option<Allocated6>,
    /// The policy-routing table of the IP's ENI; 0 for the primary ENI (main table).
    pub route_table: u32,
    pub vpc_cidrs: Vec<Ipv4Net>,
    /// The pod's egress leaves by its own ENI, unSNATed: a network profile's pod in the `strict`
    /// egress mode ([`ProfileSelector::own_eni_egress`]).
    pub own_eni_egress: bool,
}

/// What a release did: the addresses released (an attachment holds one of each family at most).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub ip: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    /// The sticky reservation made: the key and until when (unix ms).
    pub reservation: Option<(String, u64)>,
}

/// One network's CNI GC request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcRequest {
    /// Only this network's attachments are considered.
    pub network: String,
    /// The network's attachments the runtime still has.
    pub valid: BTreeSet<AttachmentKey>,
    /// Unix ms no later than when the runtime built `valid`: allocations recorded after it are kept.
    pub listed_before_ms: u64,
}

/// One lock per attachment, so two requests for the same attachment (a runtime's retried ADD while the
/// first is still in flight, an ADD racing its DEL) run one after the other: a repeated ADD then finds
/// the first one's allocation in place, and only the request that made an allocation can undo it.
#[derive(Default)]
struct AttachmentLocks(Mutex<HashMap<AttachmentKey, Arc<tokio::sync::Mutex<()>>>>);

impl AttachmentLocks {
    async fn lock(&self, key: &AttachmentKey) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() > 1024 {
                // Forget locks nobody holds or waits for.
                map.retain(|_, l| Arc::strong_count(l) > 1);
            }
            map.entry(key.clone()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Ipam {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    family: IpFamily,
    ipv6: Option<Arc<Ipv6Pool>>,
    store: Store,
    ready: Arc<AtomicBool>,
    vpc_cidrs: Vec<Ipv4Net>,
    metrics: Metrics,
    locks: AttachmentLocks,
    /// Which network profile a new pod selects (network profiles on), wired at construction.
    profiles: Option<Arc<dyn ProfileSelector>>,
    /// What may hold a new pod's ADD (NetworkPolicy enforcement), wired at construction.
    admission: Option<Arc<dyn Admission>>,
    /// A released address's conntrack entries are deleted (the daemon on a real node).
    forget_flows: bool,
}

impl Ipam {
    pub fn new(
        pool: Pool,
        store: Store,
        ready: Arc<AtomicBool>,
        vpc_cidrs: Vec<Ipv4Net>,
        metrics: Metrics,
    ) -> Self {
        Self::with_family(
            pool,
            None,
            store,
            ready,
            vpc_cidrs,
            metrics,
            Extensions::default(),
        )
    }

    /// The service of a node whose pods get IPv6: `ipv6` is the family and the node's /80 (`None`, or
    /// the `ipv4` family: IPv4 only). With `ipv6` pods get an IPv6 alone (the pool is held empty,
    /// `DaemonConfig::pool_config`); with `dual` an IPv4 from `pool` too. `extensions` are the
    /// features' extension points, wired here once (the daemon's).
    pub fn with_family(
        pool: Pool,
        ipv6: Option<(IpFamily, Arc<Ipv6Pool>)>,
        store: Store,
        ready: Arc<AtomicBool>,
        vpc_cidrs: Vec<Ipv4Net>,
        metrics: Metrics,
        extensions: Extensions,
    ) -> Self {
        let (family, ipv6) = match ipv6 {
            Some((family, p)) if family.has_ipv6() => (family, Some(p)),
            _ => (IpFamily::Ipv4, None),
        };
        Self {
            inner: Arc::new(Inner {
                pool,
                family,
                ipv6,
                store,
                ready,
                vpc_cidrs,
                metrics,
                locks: AttachmentLocks::default(),
                profiles: extensions.profiles,
                admission: extensions.admission,
                forget_flows: extensions.forget_flows,
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Which addresses pods get.
    pub fn family(&self) -> IpFamily {
        self.inner.family
    }

    /// The node's /80 (ipv6 and dual).
    pub fn ipv6(&self) -> Option<&Arc<Ipv6Pool>> {
        self.inner.ipv6.as_ref()
    }

    /// The node's /80 (empty when IPv6 is off) and how many of its addresses pods hold: what both
    /// gRPC status replies (`Status`, `Introspect`) report of IPv6.
    pub fn ipv6_summary(&self) -> (String, usize) {
        self.ipv6().map_or((String::new(), 0), |p| {
            (p.prefix().to_string(), p.with(|b| b.assigned()))
        })
    }

    /// The state file.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Whether the startup rebuild is done and requests are served.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    fn ensure_ready(&self) -> Result<(), IpamError> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(IpamError::NotReady)
        }
    }

    /// An IP for `req.key` (an IPv4, an IPv6 or both, by the node's family), recorded durably
    /// before it is returned.
    pub async fn allocate(&self, req: AllocateRequest) -> Result<Allocated, IpamError> {
        self.ensure_ready()?;
        let key = &req.acquire.key;
        let _serial = self.inner.locks.lock(key).await;
        let family = self.inner.family;
        let mut v4 = None;
        if family.has_ipv4() {
            v4 = Some(self.allocate_v4(&req).await?);
        }
        let mut v6 = None;
        if let Some(p) = &self.inner.ipv6 {
            match self.allocate_v6(p, &req).await {
                Ok(a) => v6 = Some(a),
                Err(e) => {
                    if let Some((_, true)) = &v4 {
                        // The IPv4 this call made goes back: the pod gets both or neither.
                        self.release_v4(key, false).await.ok();
                    }
                    return Err(e);
                }
            }
        }
        // A new pod is admitted before it is answered (whichever family made it new: an
        // IPv6-only pod too); if it cannot be, it gets nothing.
        let new = matches!(v4, Some((_, true))) || matches!(v6, Some((_, true)));
        if let (Some(gate), true) = (&self.inner.admission, new)
            && let Err(e) = gate.admit(&req.acquire.pod).await
        {
            if matches!(v4, Some((_, true))) {
                self.release_v4(key, false).await.ok();
            }
            if let Some(p) = &self.inner.ipv6 {
                self.release_v6(p, key, false).await.ok();
            }
            gate.released();
            return Err(e);
        }
        if let (Some(gate), true) = (&self.inner.admission, req.ipam_role) {
            gate.unwired(&req.acquire.pod);
        }
        let allocation = v4.map(|(a, _)| a);
        let v6 = v6.map(|(a, _)| a);
        let own_eni_egress = match (allocation.as_ref(), self.inner.profiles.as_ref()) {
            (
                Some(Allocation {
                    network: Some(profile),
                    ..
                }),
                Some(selector),
            ) => selector.own_eni_egress(profile),
            _ => false,
        };
        Ok(Allocated {
            own_eni_egress,
            family,
            route_table: allocation
                .as_ref()
                .and_then(|a| crate::model::route_table(a.device_index))
                .unwrap_or(0),
            allocation,
            ipv6: v6,
            vpc_cidrs: self.inner.vpc_cidrs.clone(),
        })
    }

    /// The IPv4 part, under the attachment's lock: the allocation and whether this call made it.
    async fn allocate_v4(&self, req: &AllocateRequest) -> Result<(Allocation, bool), IpamError> {
        let key = &req.acquire.key;
        let pool = &self.inner.pool;
        // A repeated ADD finds its allocation in place; only a new one is undone if the record fails.
        let existed = pool.allocation(key).is_some();
        // A new ADD learns the pod's profile; a repeated one keeps what it has (so it is answered even
        // while the API server is away).
        let mut network = req.acquire.network.clone();
        if !existed
            && network.is_none()
            && let Some(selector) = self.inner.profiles.as_ref()
        {
            network = selector.select(&req.acquire.pod).await?;
        }
        let acquire = |prefer| {
            pool.acquire_with(Acquire {
                prefer,
                network: network.clone(),
                ..req.acquire.clone()
            })
        };
        let alloc = match acquire(req.acquire.prefer).await {
            Err(PoolError::PreferredUnavailable { .. }) if !req.require_preferred => {
                acquire(None).await
            }
            other => other,
        }?;
        let record = drift::assignment_row(&alloc, unix_ms_now());
        if let Err(e) = self.inner.store.record_assigned(record).await {
            tracing::error!(error = %e, attachment = %key, ip = %alloc.ip, "cannot record the assignment");
            if !existed {
                let _ = pool.release(key, false);
            }
            return Err(IpamError::Record(e));
        }
        Ok((alloc, !existed))
    }

    /// Releases `key` (with a sticky reservation when asked) and records it. `None` for an unknown
    /// attachment: still a success.
    pub async fn release(
        &self,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<Released>, IpamError> {
        self.ensure_ready()?;
        self.release_ready(key, sticky).await
    }

    /// Both families' addresses of `key`, under its lock. An address released and recorded stays
    /// released if the other family's record then fails: the caller gets the error, the runtime
    /// retries the DEL, and the retry releases what is left.
    async fn release_ready(
        &self,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<Released>, IpamError> {
        let _serial = self.inner.locks.lock(key).await;
        if let Some(gate) = &self.inner.admission {
            gate.released();
        }
        let mut released = Released {
            ip: None,
            ipv6: None,
            reservation: None,
        };
        if let Some((ip, reservation)) = self.release_v4(key, sticky).await? {
            released.ip = Some(ip);
            released.reservation = reservation;
        }
        if let Some(p) = &self.inner.ipv6
            && let Some((ip, reservation)) = self.release_v6(p, key, sticky).await?
        {
            released.ipv6 = Some(ip);
            released.reservation = released.reservation.or(reservation);
        }
        if self.inner.forget_flows {
            forget_flows(key, &released).await;
        }
        Ok((released.ip.is_some() || released.ipv6.is_some()).then_some(released))
    }

    /// The IPv4 part. The pool and the file agree after every outcome: a release whose record fails
    /// is undone (the attachment holds its IP again and the caller gets an error, so the runtime
    /// retries the DEL), rather than leaving an IP idle in the pool and assigned in the file.
    async fn release_v4(
        &self,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<(Ipv4Addr, Option<(String, u64)>)>, IpamError> {
        let Some(released) = self.inner.pool.release(key, sticky)? else {
            return Ok(None);
        };
        let reservation = released
            .reservation
            .clone()
            .map(|(k, until)| (k, to_unix_ms(until)));
        if let Err(e) = self
            .inner
            .store
            .record_released(
                &key.container_id,
                &key.ifname,
                unix_ms_now(),
                reservation.clone(),
            )
            .await
        {
            tracing::error!(error = %e, attachment = %key, ip = %released.ip, "cannot record the release");
            return Err(if self.inner.pool.undo_release(&released) {
                IpamError::Record(e)
            } else {
                IpamError::Unrecorded(e)
            });
        }
        Ok(Some((released.ip, reservation)))
    }

    /// The allocation of `key`, if it holds an IP.
    pub fn check(&self, key: &AttachmentKey) -> Result<Option<Allocation>, IpamError> {
        self.ensure_ready()?;
        Ok(self.inner.pool.allocation(key))
    }

    /// The attachment's IPv6 address, if it holds one.
    pub fn check6(&self, key: &AttachmentKey) -> Result<Option<Ipv6Addr>, IpamError> {
        self.ensure_ready()?;
        Ok(self
            .inner
            .ipv6
            .as_ref()
            .and_then(|p| p.with(|b| b.get(key).map(|h| h.ip))))
    }

    /// The attachment's IPv4 egress address (ipv6 mode with `ipv4_egress`), if it holds one.
    pub fn egress_of(&self, key: &AttachmentKey) -> Option<Ipv4Addr> {
        self.inner
            .ipv6
            .as_ref()
            .and_then(|p| p.with(|b| b.get(key).and_then(|h| h.egress)))
    }

    /// The attachment holding the IPv6 `ip` now, if any.
    pub fn holder_of6(&self, ip: Ipv6Addr) -> Option<AttachmentKey> {
        self.inner
            .ipv6
            .as_ref()
            .and_then(|p| p.with(|b| b.holder_of(ip).cloned()))
    }

    /// The attachment holding `ip` now, if any (a plugin asks before removing rules of an IP).
    pub fn holder_of(&self, ip: Ipv4Addr) -> Option<AttachmentKey> {
        match self.inner.pool.snapshot().ip(ip) {
            Some(IpState::Assigned { attachment, .. }) => Some(attachment.clone()),
            _ => None,
        }
    }

    /// CNI GC of one network: releases every attachment of `req.network` that is not in `req.valid` and
    /// was recorded before the runtime built that list. Attachments of other networks, and records
    /// that do not say their network (older than schema v2), are never touched. Returns those
    /// released.
    pub async fn garbage_collect(&self, req: &GcRequest) -> Result<Vec<AttachmentKey>, IpamError> {
        self.ensure_ready()?;
        let recorded = self.inner.store.load().await.map_err(IpamError::Record)?;
        let mut candidates: Vec<(AttachmentKey, String, String, u64)> = recorded
            .assignments
            .into_iter()
            .map(|a| {
                let key = AttachmentKey::new(a.container_id, a.ifname);
                (key, a.network, a.ip.to_string(), a.assigned_at_ms)
            })
            .collect();
        if self.inner.ipv6.is_some() {
            let v6 = self
                .inner
                .store
                .load_ipv6()
                .await
                .map_err(IpamError::Record)?;
            candidates.extend(v6.assignments.into_iter().map(|a| {
                let key = AttachmentKey::new(a.container_id, a.ifname);
                (key, a.network, a.ip.to_string(), a.assigned_at_ms)
            }));
        }
        let mut released = Vec::new();
        for (key, network, ip, assigned_at_ms) in candidates {
            if network != req.network
                || req.valid.contains(&key)
                || assigned_at_ms >= req.listed_before_ms
                || released.contains(&key)
            {
                continue;
            }
            if self.release_ready(&key, false).await?.is_some() {
                self.inner.metrics.gc_released.inc();
                tracing::info!(attachment = %key, network = %req.network, %ip,
                    "garbage-collected: not in the runtime's valid attachments of its network");
                released.push(key);
            }
        }
        Ok(released)
    }

    /// Releases an attachment whose pod is provably gone (the running reconcile's evidence).
    pub async fn release_dead(&self, key: &AttachmentKey) -> Result<Option<Released>, IpamError> {
        self.release_ready(key, false).await
    }
}

/// Attachments that hold an IP in `snapshot`.
pub fn assigned_attachments(snapshot: &PoolSnapshot) -> Vec<AttachmentKey> {
    snapshot
        .ips()
        .filter_map(|i| match &i.state {
            IpState::Assigned { attachment, .. } => Some(attachment.clone()),
            _ => None,
        })
        .collect()
}

/// Deletes the conntrack entries of `released`'s addresses (`crate::host::conntrack`).
async fn forget_flows(key: &AttachmentKey, released: &Released) {
    let ips: Vec<std::net::IpAddr> = (released.ip.map(std::net::IpAddr::from).into_iter())
        .chain(released.ipv6.map(std::net::IpAddr::from))
        .collect();
    crate::host::conntrack::forget_released(&key.to_string(), &ips).await;
}
