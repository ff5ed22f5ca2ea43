//! The daemon side of the gRPC API: `Ipam` for the plugin and `Introspect` for eniipamctl, over the pool
//! and the state store, served on a unix socket.
//!
//! Invariant 5: an Allocate reply is sent only after its assignment is committed to SQLite; if the
//! commit fails, the IP goes back to the pool and the caller gets an error.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tonic::{Request, Response, Status};

use super::API_VERSION;
use super::pb;
use crate::model::{AttachmentKey, PodRef};
use crate::pool::snapshot::{EniPhaseSnapshot, IpState};
use crate::pool::{Pool, PoolError};
use crate::reconcile::unix_ms_now;
use crate::store::{Store, StoredAssignment};

/// What the services share.
pub struct Services {
    pub pool: Pool,
    pub store: Store,
    /// Startup rebuild done.
    pub ready: Arc<AtomicBool>,
    pub instance_id: String,
    pub instance_type: String,
    pub vpc_cidrs: Vec<String>,
    pub ip_stick_time: Duration,
    pub metrics: crate::telemetry::Metrics,
}

fn check_version(v: u32) -> Result<(), Status> {
    if v == API_VERSION {
        Ok(())
    } else {
        Err(Status::failed_precondition(format!(
            "API version mismatch: the client speaks eniipam API v{v}, this daemon speaks v{API_VERSION}; \
             install the plugin that ships with this daemon"
        )))
    }
}

fn attachment(container_id: &str, ifname: &str) -> Result<AttachmentKey, Status> {
    if container_id.is_empty() || container_id.len() > 256 {
        return Err(Status::invalid_argument(
            "container_id must be 1 to 256 characters",
        ));
    }
    if ifname.is_empty() || ifname.len() > 15 {
        return Err(Status::invalid_argument(
            "ifname must be 1 to 15 characters",
        ));
    }
    Ok(AttachmentKey::new(container_id, ifname))
}

/// Maps a pool error to the status the plugin turns into a CNI code.
pub fn pool_status(e: &PoolError) -> Status {
    match e {
        PoolError::PreferredUnavailable { .. } => Status::failed_precondition(e.to_string()),
        PoolError::ShuttingDown => Status::unavailable(e.to_string()),
        PoolError::Config(_) | PoolError::Seed(_) => Status::internal(e.to_string()),
        e if e.is_retryable() => Status::resource_exhausted(e.to_string()),
        e => Status::unavailable(e.to_string()),
    }
}

impl Services {
    fn ensure_ready(&self) -> Result<(), Status> {
        if self.ready.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Status::unavailable(
                "eniipamd is starting: the pool is being rebuilt from IMDS, EC2 and the state file",
            ))
        }
    }
}

/// The `Ipam` service.
#[derive(Clone)]
pub struct IpamService(pub Arc<Services>);

impl IpamService {
    async fn allocate_inner(&self, r: pb::AllocateRequest) -> Result<pb::AllocateReply, Status> {
        check_version(r.api_version)?;
        let key = attachment(&r.container_id, &r.ifname)?;
        let prefer = match r.preferred_ip.as_str() {
            "" => None,
            s => Some(s.parse::<Ipv4Addr>().map_err(|_| {
                Status::invalid_argument(format!("preferred_ip {s:?} is not an IPv4 address"))
            })?),
        };
        self.0.ensure_ready()?;
        let pod = r.pod.unwrap_or_default();
        let pod = PodRef {
            namespace: pod.namespace,
            name: pod.name,
            uid: pod.uid,
        };
        let sticky = (!r.sticky_key.is_empty()).then(|| r.sticky_key.clone());
        let pool = &self.0.pool;
        // A repeated ADD finds its allocation in place; only a new one is undone if the record fails.
        let existed = pool.allocation(&key).is_some();
        let alloc = match pool
            .acquire(key.clone(), pod.clone(), prefer, sticky.clone())
            .await
        {
            Err(PoolError::PreferredUnavailable { .. }) if !r.require_preferred => {
                pool.acquire(key.clone(), pod.clone(), None, sticky.clone())
                    .await
            }
            other => other,
        }
        .map_err(|e| pool_status(&e))?;
        let record = StoredAssignment {
            ip: alloc.ip,
            eni_id: alloc.eni.to_string(),
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            netns: r.netns.clone(),
            pod_namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            pod_uid: pod.uid.clone(),
            sticky_key: alloc.sticky_key.clone(),
            assigned_at_ms: unix_ms_now(),
        };
        if let Err(e) = self.0.store.record_assigned(record).await {
            tracing::error!(error = %e, attachment = %key, ip = %alloc.ip, "cannot record the assignment");
            if !existed {
                let _ = pool.release(&key, false);
            }
            return Err(Status::internal(format!(
                "cannot record the assignment durably: {e}"
            )));
        }
        Ok(pb::AllocateReply {
            ip: alloc.ip.to_string(),
            prefix_length: 32,
            eni_id: alloc.eni.to_string(),
            mac: alloc.mac.clone(),
            device_index: alloc.device_index,
            route_table: route_table(alloc.device_index),
            subnet_cidr: alloc.subnet_cidr.to_string(),
            gateway: alloc.gateway.to_string(),
            vpc_cidrs: self.0.vpc_cidrs.clone(),
        })
    }
}

#[tonic::async_trait]
impl pb::ipam_server::Ipam for IpamService {
    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateReply>, Status> {
        let started = std::time::Instant::now();
        let result = self.allocate_inner(req.into_inner()).await;
        let outcome = result
            .as_ref()
            .map_or_else(|s| format!("{:?}", s.code()), |_| "ok".to_owned());
        self.0
            .metrics
            .add(&outcome, started.elapsed().as_secs_f64());
        result.map(Response::new)
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        let started = std::time::Instant::now();
        let r = req.into_inner();
        let result = async {
            check_version(r.api_version)?;
            let key = attachment(&r.container_id, &r.ifname)?;
            self.0.ensure_ready()?;
            release_one(&self.0, &key, r.sticky).await
        }
        .await;
        let outcome = result
            .as_ref()
            .map_or_else(|s| format!("{:?}", s.code()), |_| "ok".to_owned());
        self.0
            .metrics
            .del(&outcome, started.elapsed().as_secs_f64());
        result.map(Response::new)
    }

    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckReply>, Status> {
        let r = req.into_inner();
        check_version(r.api_version)?;
        let key = attachment(&r.container_id, &r.ifname)?;
        self.0.ensure_ready()?;
        let reply = match self.0.pool.allocation(&key) {
            None => pb::CheckReply {
                ok: false,
                ip: String::new(),
                message: format!("eniipamd has no IP for {key}"),
            },
            Some(a) if !r.ip.is_empty() && r.ip != a.ip.to_string() => pb::CheckReply {
                ok: false,
                ip: a.ip.to_string(),
                message: format!("{key} holds {} but the runtime expects {}", a.ip, r.ip),
            },
            Some(a) => pb::CheckReply {
                ok: true,
                ip: a.ip.to_string(),
                message: String::new(),
            },
        };
        Ok(Response::new(reply))
    }

    async fn garbage_collect(
        &self,
        req: Request<pb::GarbageCollectRequest>,
    ) -> Result<Response<pb::GarbageCollectReply>, Status> {
        let r = req.into_inner();
        check_version(r.api_version)?;
        self.0.ensure_ready()?;
        let valid: BTreeSet<AttachmentKey> = r
            .valid
            .iter()
            .map(|a| AttachmentKey::new(a.container_id.clone(), a.ifname.clone()))
            .collect();
        let mut released = Vec::new();
        for key in assigned_attachments(&self.0.pool) {
            if !valid.contains(&key) {
                release_one(&self.0, &key, false).await?;
                self.0.metrics.gc_released.inc();
                tracing::info!(attachment = %key, "garbage-collected: not in the runtime's valid attachments");
                released.push(pb::Attachment {
                    container_id: key.container_id,
                    ifname: key.ifname,
                });
            }
        }
        Ok(Response::new(pb::GarbageCollectReply { released }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        check_version(req.into_inner().api_version)?;
        let ready = self.0.ready.load(Ordering::Acquire);
        let s = self.0.pool.snapshot();
        let exhausted = s.exhaustion.is_some() && s.idle_eligible == 0;
        Ok(Response::new(pb::StatusReply {
            ready,
            exhausted,
            reason: s
                .exhaustion
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_default(),
            capacity: s.capacity,
            idle: s.idle,
            assigned: s.assigned,
        }))
    }
}

/// Policy-routing table for a pod IP on the ENI at `device_index`: the main table for eth0, else
/// `device_index + 1` (the AWS VPC CNI's convention, so existing host tooling reads it the same).
pub fn route_table(device_index: u32) -> u32 {
    if device_index == 0 {
        0
    } else {
        device_index + 1
    }
}

/// Attachments that hold an IP now.
pub fn assigned_attachments(pool: &Pool) -> Vec<AttachmentKey> {
    pool.snapshot()
        .ips()
        .filter_map(|i| match &i.state {
            IpState::Assigned { attachment, .. } => Some(attachment.clone()),
            _ => None,
        })
        .collect()
}

/// Releases one attachment in the pool and records it (with a sticky reservation when asked).
pub async fn release_one(
    s: &Services,
    key: &AttachmentKey,
    sticky: bool,
) -> Result<pb::ReleaseReply, Status> {
    let sticky_key = s
        .pool
        .allocation(key)
        .map(|a| a.sticky_key.clone().unwrap_or_else(|| a.pod.sticky_key()));
    let ip = s.pool.release(key, sticky).map_err(|e| pool_status(&e))?;
    let Some(ip) = ip else {
        return Ok(pb::ReleaseReply {
            released: false,
            ip: String::new(),
        });
    };
    let now = unix_ms_now();
    let reservation = sticky
        .then_some(sticky_key)
        .flatten()
        .map(|k| (k, now + s.ip_stick_time.as_millis() as u64));
    if let Err(e) = s
        .store
        .record_released(&key.container_id, &key.ifname, now, reservation)
        .await
    {
        // The pool has the IP back; the file still says assigned. That errs on the safe side: after a
        // restart the IP stays held until GC finds the attachment gone.
        tracing::error!(error = %e, attachment = %key, %ip, "cannot record the release");
    }
    Ok(pb::ReleaseReply {
        released: true,
        ip: ip.to_string(),
    })
}

/// The `Introspect` service.
#[derive(Clone)]
pub struct IntrospectService(pub Arc<Services>);

fn eni_info(e: &crate::pool::snapshot::EniSnapshot) -> pb::EniInfo {
    let count = |f: fn(&IpState) -> bool| e.ips.iter().filter(|i| f(&i.state)).count() as u32;
    pb::EniInfo {
        eni_id: e.id.to_string(),
        mac: e.mac.clone(),
        device_index: e.device_index,
        subnet_id: e.subnet_id.clone(),
        subnet_cidr: e.subnet_cidr.map(|c| c.to_string()).unwrap_or_default(),
        primary_ip: e.primary_ip.to_string(),
        idle: count(|s| matches!(s, IpState::Idle { .. })),
        assigned: count(|s| matches!(s, IpState::Assigned { .. })),
        cooling: count(|s| matches!(s, IpState::Cooling { .. })),
        sticky: count(|s| matches!(s, IpState::Reserved { .. })),
        state: match &e.phase {
            EniPhaseSnapshot::Serving => "serving".to_owned(),
            EniPhaseSnapshot::BackingOff { .. } => "backing-off".to_owned(),
            EniPhaseSnapshot::Draining => "draining".to_owned(),
        },
        backlog: e.in_flight,
    }
}

#[tonic::async_trait]
impl pb::introspect_server::Introspect for IntrospectService {
    async fn pool(&self, _: Request<pb::PoolRequest>) -> Result<Response<pb::PoolReply>, Status> {
        let s = self.0.pool.snapshot();
        let mut backoffs = Vec::new();
        for sub in &s.subnets {
            if let Some(b) = &sub.backoff {
                backoffs.push(pb::Backoff {
                    scope: format!("subnet {}", sub.id),
                    reason: b.error.to_string(),
                    remaining_ms: b.retry_in.as_millis() as u64,
                });
            }
        }
        for e in &s.enis {
            if let EniPhaseSnapshot::BackingOff {
                retry_in,
                last_error,
                ..
            } = &e.phase
            {
                backoffs.push(pb::Backoff {
                    scope: format!("eni {}", e.id),
                    reason: last_error.to_string(),
                    remaining_ms: retry_in.as_millis() as u64,
                });
            }
        }
        Ok(Response::new(pb::PoolReply {
            instance_id: self.0.instance_id.clone(),
            instance_type: self.0.instance_type.clone(),
            capacity: s.capacity,
            tokens_in_use: s.tokens_used,
            min_idle: s.min_idle,
            max_idle: s.max_idle,
            idle: s.idle_eligible,
            assigned: s.assigned,
            cooling: s.cooling,
            sticky: s.reserved,
            in_flight: s.in_flight,
            exhausted: s.exhaustion.is_some(),
            exhausted_reason: s
                .exhaustion
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_default(),
            backoffs,
            enis: s.enis.iter().map(eni_info).collect(),
            ready: self.0.ready.load(Ordering::Acquire),
        }))
    }

    async fn allocations(
        &self,
        _: Request<pb::AllocationsRequest>,
    ) -> Result<Response<pb::AllocationsReply>, Status> {
        let state = self
            .0
            .store
            .load()
            .await
            .map_err(|e| Status::internal(format!("cannot read the state file: {e}")))?;
        Ok(Response::new(pb::AllocationsReply {
            allocations: state
                .assignments
                .into_iter()
                .map(|a| pb::Allocation {
                    ip: a.ip.to_string(),
                    container_id: a.container_id,
                    ifname: a.ifname,
                    netns: a.netns,
                    pod_namespace: a.pod_namespace,
                    pod_name: a.pod_name,
                    eni_id: a.eni_id,
                    sticky_key: a.sticky_key.unwrap_or_default(),
                    assigned_at_ms: a.assigned_at_ms,
                })
                .collect(),
        }))
    }

    async fn enis(&self, _: Request<pb::EnisRequest>) -> Result<Response<pb::EnisReply>, Status> {
        let s = self.0.pool.snapshot();
        Ok(Response::new(pb::EnisReply {
            enis: s.enis.iter().map(eni_info).collect(),
        }))
    }
}

/// Errors preparing the socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another eniipamd is already serving on {0}")]
    InUse(String),
    #[error("cannot prepare socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the unix socket: creates the directory, replaces a stale socket (one nobody answers on), and
/// refuses to steal a live one; the socket is mode 0600.
pub async fn bind_socket(path: &Path) -> Result<UnixListener, SocketError> {
    let io = |source| SocketError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(SocketError::InUse(path.display().to_string()));
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}
