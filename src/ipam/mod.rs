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

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipnet::Ipv4Net;

use crate::clock::{to_unix_ms, unix_ms_now};
use crate::model::{AttachmentKey, PodRef};
use crate::pool::snapshot::IpState;
use crate::pool::{Allocation, Pool, PoolError, PoolSnapshot};
use crate::store::{Store, StoreError, StoredAssignment};
use crate::telemetry::Metrics;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The startup rebuild is not finished (or the daemon is stopping).
    #[error("eniipamd is starting: the pool is being rebuilt from IMDS, EC2 and the state file")]
    NotReady,
    /// The pool refused.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The allocation could not be recorded durably (it was undone).
    #[error("cannot record the assignment durably: {0}")]
    Record(#[source] StoreError),
}

/// One allocation request, as the service sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateRequest {
    pub key: AttachmentKey,
    pub netns: String,
    pub pod: PodRef,
    /// An IP the caller would like.
    pub prefer: Option<Ipv4Addr>,
    /// Fail rather than fall back when `prefer` is not available.
    pub require_preferred: bool,
    pub sticky_key: Option<String>,
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
        let pool = &self.inner.pool;
        // A repeated ADD finds its allocation in place; only a new one is undone if the record fails.
        let existed = pool.allocation(&req.key).is_some();
        let acquire = |prefer| {
            pool.acquire(
                req.key.clone(),
                req.pod.clone(),
                prefer,
                req.sticky_key.clone(),
            )
        };
        let alloc = match acquire(req.prefer).await {
            Err(PoolError::PreferredUnavailable { .. }) if !req.require_preferred => {
                acquire(None).await
            }
            other => other,
        }?;
        let record = StoredAssignment {
            ip: alloc.ip,
            eni_id: alloc.eni.to_string(),
            container_id: req.key.container_id.clone(),
            ifname: req.key.ifname.clone(),
            netns: req.netns.clone(),
            pod_namespace: req.pod.namespace.clone(),
            pod_name: req.pod.name.clone(),
            pod_uid: req.pod.uid.clone(),
            sticky_key: alloc.sticky_key.clone(),
            assigned_at_ms: unix_ms_now(),
        };
        if let Err(e) = self.inner.store.record_assigned(record).await {
            tracing::error!(error = %e, attachment = %req.key, ip = %alloc.ip, "cannot record the assignment");
            if !existed {
                let _ = pool.release(&req.key, false);
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

    async fn release_ready(
        &self,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<Released>, IpamError> {
        let Some(released) = self.inner.pool.release(key, sticky)? else {
            return Ok(None);
        };
        let reservation = released
            .reservation
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
            // The pool has the IP back; the file still says assigned. That errs on the safe side: after a
            // restart the IP stays held until GC finds the attachment gone.
            tracing::error!(error = %e, attachment = %key, ip = %released.ip, "cannot record the release");
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

    /// CNI GC: releases every attachment not in `valid`; returns those released.
    pub async fn garbage_collect(
        &self,
        valid: &std::collections::BTreeSet<AttachmentKey>,
    ) -> Result<Vec<AttachmentKey>, IpamError> {
        self.ensure_ready()?;
        let mut released = Vec::new();
        for key in assigned_attachments(&self.inner.pool.snapshot()) {
            if valid.contains(&key) {
                continue;
            }
            self.release_ready(&key, false).await?;
            self.inner.metrics.gc_released.inc();
            tracing::info!(attachment = %key, "garbage-collected: not in the runtime's valid attachments");
            released.push(key);
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
