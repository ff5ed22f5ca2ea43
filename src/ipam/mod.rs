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
//! It speaks domain types only; `rpc` converts protobuf to and from them.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use tokio::sync::OwnedMutexGuard;

use crate::clock::{to_unix_ms, unix_ms_now};
use crate::metrics::Metrics;
use crate::model::AttachmentKey;
use crate::pool::snapshot::IpState;
use crate::pool::{Acquire, Allocation, Pool, PoolError, PoolSnapshot};
use crate::store::{Store, StoreError};

mod drift;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The startup rebuild is not finished (or the daemon is stopping).
    #[error("eniipamd is starting: the pool is being rebuilt from IMDS, EC2 and the state file")]
    NotReady,
    /// The pool refused.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The change could not be recorded durably (and was undone).
    #[error("cannot record the change durably: {0}")]
    Record(#[source] StoreError),
    /// A release could not be recorded and could not be undone either (the IP went elsewhere): the
    /// pool and the file disagree until the running reconcile repairs the file.
    #[error(
        "cannot record the release durably ({0}); the running reconcile will repair the state file"
    )]
    Unrecorded(#[source] StoreError),
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
}

/// What a successful allocation returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub allocation: Allocation,
    /// The policy-routing table of the IP's ENI; 0 for the primary ENI (main table).
    pub route_table: u32,
    pub vpc_cidrs: Vec<Ipv4Net>,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub ip: Ipv4Addr,
    /// The sticky reservation the pool made: the key and until when (unix ms).
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
    store: Store,
    ready: Arc<AtomicBool>,
    vpc_cidrs: Vec<Ipv4Net>,
    metrics: Metrics,
    locks: AttachmentLocks,
}

impl Ipam {
    pub fn new(
        pool: Pool,
        store: Store,
        ready: Arc<AtomicBool>,
        vpc_cidrs: Vec<Ipv4Net>,
        metrics: Metrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                store,
                ready,
                vpc_cidrs,
                metrics,
                locks: AttachmentLocks::default(),
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
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

    /// An IP for `req.key`, recorded durably before it is returned.
    pub async fn allocate(&self, req: AllocateRequest) -> Result<Allocated, IpamError> {
        self.ensure_ready()?;
        let key = &req.acquire.key;
        let _serial = self.inner.locks.lock(key).await;
        let pool = &self.inner.pool;
        // A repeated ADD finds its allocation in place; only a new one is undone if the record fails.
        let existed = pool.allocation(key).is_some();
        let acquire = |prefer| {
            pool.acquire_with(Acquire {
                prefer,
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
        Ok(Allocated {
            route_table: crate::model::route_table(alloc.device_index).unwrap_or(0),
            allocation: alloc,
            vpc_cidrs: self.inner.vpc_cidrs.clone(),
        })
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

    /// The pool and the file agree after every outcome: a release whose record fails is undone (the
    /// attachment holds its IP again and the caller gets an error, so the runtime retries the DEL),
    /// rather than leaving an IP idle in the pool and assigned in the file.
    async fn release_ready(
        &self,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<Released>, IpamError> {
        let _serial = self.inner.locks.lock(key).await;
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
        Ok(Some(Released {
            ip: released.ip,
            reservation,
        }))
    }

    /// The allocation of `key`, if it holds an IP.
    pub fn check(&self, key: &AttachmentKey) -> Result<Option<Allocation>, IpamError> {
        self.ensure_ready()?;
        Ok(self.inner.pool.allocation(key))
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
        let mut released = Vec::new();
        for a in recorded.assignments {
            let key = AttachmentKey::new(a.container_id.clone(), a.ifname.clone());
            if a.network != req.network
                || req.valid.contains(&key)
                || a.assigned_at_ms >= req.listed_before_ms
            {
                continue;
            }
            if self.release_ready(&key, false).await?.is_some() {
                self.inner.metrics.gc_released.inc();
                tracing::info!(attachment = %key, network = %req.network, ip = %a.ip,
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
