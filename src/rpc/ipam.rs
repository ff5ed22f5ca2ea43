//! The `Ipam` gRPC service: checks the API version and the request's shape, converts protobuf to the
//! service's domain types, calls [`crate::ipam::Ipam`], and maps its errors to status codes carrying a
//! typed [`pb::ErrorReason`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;
use tokio::time::Instant;

use eniipam_api::status_with_reason;
use tonic::{Code, Request, Response, Status};

use super::{API_VERSION, pb};
use crate::ipam::{AllocateRequest, GcRequest, Ipam, IpamError};
use crate::ipv6::Ipv6Error;
use crate::metrics::Metrics;
use crate::model::{AttachmentKey, PodRef};
use crate::pool::{Acquire, AttachmentMeta, PoolError};

/// The `Ipam` service.
#[derive(Clone)]
pub struct IpamService {
    pub ipam: Ipam,
    pub metrics: Metrics,
}

fn check_version(v: u32) -> Result<(), Status> {
    if v == API_VERSION {
        Ok(())
    } else {
        Err(status_with_reason(
            Code::FailedPrecondition,
            format!(
                "API version mismatch: the client speaks eniipam API v{v}, this daemon speaks \
                 v{API_VERSION}; install the plugin that ships with this daemon"
            ),
            pb::ErrorReason::ApiVersionMismatch,
        ))
    }
}

fn invalid(msg: impl Into<String>) -> Status {
    status_with_reason(Code::InvalidArgument, msg, pb::ErrorReason::InvalidRequest)
}

/// The attachment a request names, under the rules the plugin applies too.
fn attachment(container_id: &str, ifname: &str) -> Result<AttachmentKey, Status> {
    eniipam_api::validate_container_id(container_id).map_err(|e| invalid(e.to_string()))?;
    eniipam_api::validate_ifname(ifname).map_err(|e| invalid(e.to_string()))?;
    Ok(AttachmentKey::new(container_id, ifname))
}

/// Maps a pool error to the status the plugin turns into a CNI code.
pub fn pool_status(e: &PoolError) -> Status {
    use pb::ErrorReason as R;
    let (code, reason) = match e {
        PoolError::PreferredUnavailable { .. } => {
            (Code::FailedPrecondition, R::PreferredIpUnavailable)
        }
        PoolError::ShuttingDown => (Code::Unavailable, R::NotReady),
        PoolError::Config(_) | PoolError::Seed(_) => (Code::Internal, R::Internal),
        e if e.is_retryable() => (Code::ResourceExhausted, R::Exhausted),
        _ => (Code::Unavailable, R::Exhausted),
    };
    status_with_reason(code, e.to_string(), reason)
}

/// Maps a service error to a status.
pub fn ipam_status(e: &IpamError) -> Status {
    match e {
        IpamError::NotReady => {
            status_with_reason(Code::Unavailable, e.to_string(), pb::ErrorReason::NotReady)
        }
        IpamError::Pool(p) => pool_status(p),
        IpamError::Ipv6(Ipv6Error::PreferredUnavailable { .. }) => status_with_reason(
            Code::FailedPrecondition,
            e.to_string(),
            pb::ErrorReason::PreferredIpUnavailable,
        ),
        // Pods on this node hold all 1022 egress addresses: one comes back when a pod goes.
        IpamError::Ipv6(Ipv6Error::EgressExhausted(_)) => status_with_reason(
            Code::ResourceExhausted,
            e.to_string(),
            pb::ErrorReason::Exhausted,
        ),
        IpamError::Ipv6(Ipv6Error::NoPrefix) => {
            status_with_reason(Code::Unavailable, e.to_string(), pb::ErrorReason::NotReady)
        }
        IpamError::PodProfile(_) => {
            status_with_reason(Code::Unavailable, e.to_string(), pb::ErrorReason::Exhausted)
        }
        // Retryable: the kubelet's next sandbox try finds the rules' cause gone or fixed.
        IpamError::Admission(_) => {
            status_with_reason(Code::Unavailable, e.to_string(), pb::ErrorReason::NotReady)
        }
        IpamError::Record(_) | IpamError::Unrecorded(_) => {
            status_with_reason(Code::Internal, e.to_string(), pb::ErrorReason::Internal)
        }
    }
}

/// What a caller's deadline leaves the pool to wait on EC2: the `grpc-timeout` it sent (the plugin
/// sends its `timeout_ms`), less a tenth of it, at most 5 s, for the answer to travel and the plugin
/// to wire the pod. `None` when the caller sent no deadline; an unreadable header is ignored (the
/// daemon's `add_wait` still bounds the wait).
pub fn caller_budget(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let raw = metadata.get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(raw)?;
    let margin = (timeout / 10).min(Duration::from_secs(5));
    Some(timeout.saturating_sub(margin))
}

/// A `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`), per the gRPC
/// over HTTP/2 protocol.
fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    if raw.len() < 2 || raw.len() > 9 {
        return None;
    }
    let (digits, unit) = raw.split_at(raw.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn outcome<T>(r: &Result<T, Status>) -> String {
    r.as_ref()
        .map_or_else(|s| format!("{:?}", s.code()), |_| "ok".to_owned())
}

impl IpamService {
    async fn allocate_inner(
        &self,
        r: pb::AllocateRequest,
        wait: Option<Duration>,
    ) -> Result<pb::AllocateReply, Status> {
        check_version(r.api_version)?;
        let key = attachment(&r.container_id, &r.ifname)?;
        let (prefer, prefer6) = match r.preferred_ip.as_str() {
            "" => (None, None),
            s => match s.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => (Some(ip), None),
                Ok(IpAddr::V6(ip)) => (None, Some(ip)),
                Err(_) => {
                    return Err(invalid(format!(
                        "preferred_ip {s:?} is not an IPv4 or IPv6 address"
                    )));
                }
            },
        };
        let pod = r.pod.unwrap_or_default();
        let req = AllocateRequest {
            acquire: Acquire {
                key,
                pod: PodRef {
                    namespace: pod.namespace,
                    name: pod.name,
                    uid: pod.uid,
                },
                prefer,
                sticky_key: (!r.sticky_key.is_empty()).then_some(r.sticky_key),
                meta: AttachmentMeta {
                    network: r.network,
                    netns: r.netns,
                },
                wait,
                network: None,
            },
            require_preferred: r.require_preferred,
            prefer6,
            ipam_role: r.ipam_role,
        };
        let done = self.ipam.allocate(req).await.map_err(|e| ipam_status(&e))?;
        let mut reply = pb::AllocateReply {
            ip_family: done.family.to_string(),
            ..Default::default()
        };
        if let Some(a) = &done.allocation {
            reply.ip = a.ip.to_string();
            reply.prefix_length = 32;
            reply.eni_id = a.eni.to_string();
            reply.mac = a.mac.clone();
            reply.device_index = a.device_index;
            reply.route_table = done.route_table;
            reply.subnet_cidr = a.subnet_cidr.to_string();
            reply.gateway = a.gateway.to_string();
            reply.vpc_cidrs = done.vpc_cidrs.iter().map(|c| c.to_string()).collect();
            reply.own_eni_egress = done.own_eni_egress;
        }
        if let Some(v6) = &done.ipv6 {
            reply.ipv6 = v6.ip.to_string();
            reply.ipv6_prefix = v6.prefix.to_string();
            reply.vpc_ipv6_cidrs = v6.vpc_cidrs.iter().map(|c| c.to_string()).collect();
            reply.egress_ipv4 = v6.egress_ipv4.map(|i| i.to_string()).unwrap_or_default();
        }
        Ok(reply)
    }

    async fn release_inner(&self, r: pb::ReleaseRequest) -> Result<pb::ReleaseReply, Status> {
        check_version(r.api_version)?;
        let key = attachment(&r.container_id, &r.ifname)?;
        let cleaning = match r.ip.as_str() {
            "" => None,
            s => Some(
                s.parse::<Ipv4Addr>()
                    .map_err(|_| invalid(format!("ip {s:?} is not an IPv4 address")))?,
            ),
        };
        let cleaning6 = match r.ipv6.as_str() {
            "" => None,
            s => Some(
                s.parse::<Ipv6Addr>()
                    .map_err(|_| invalid(format!("ipv6 {s:?} is not an IPv6 address")))?,
            ),
        };
        let released = self
            .ipam
            .release(&key, r.sticky)
            .await
            .map_err(|e| ipam_status(&e))?;
        let ip_held_by_other = cleaning
            .and_then(|ip| self.ipam.holder_of(ip))
            .is_some_and(|holder| holder != key);
        let ipv6_held_by_other = cleaning6
            .and_then(|ip| self.ipam.holder_of6(ip))
            .is_some_and(|holder| holder != key);
        let show = |ip: Option<String>| ip.unwrap_or_default();
        Ok(pb::ReleaseReply {
            released: released.is_some(),
            ip: show(released.as_ref().and_then(|r| r.ip).map(|i| i.to_string())),
            ip_held_by_other,
            ipv6: show(
                released
                    .as_ref()
                    .and_then(|r| r.ipv6)
                    .map(|i| i.to_string()),
            ),
            ipv6_held_by_other,
        })
    }
}

#[tonic::async_trait]
impl pb::ipam_server::Ipam for IpamService {
    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateReply>, Status> {
        let started = Instant::now();
        let wait = caller_budget(req.metadata());
        let result = self.allocate_inner(req.into_inner(), wait).await;
        self.metrics
            .add(&outcome(&result), started.elapsed().as_secs_f64());
        result.map(Response::new)
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        let started = Instant::now();
        let result = self.release_inner(req.into_inner()).await;
        self.metrics
            .del(&outcome(&result), started.elapsed().as_secs_f64());
        result.map(Response::new)
    }

    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckReply>, Status> {
        let r = req.into_inner();
        check_version(r.api_version)?;
        let key = attachment(&r.container_id, &r.ifname)?;
        let found = self.ipam.check(&key).map_err(|e| ipam_status(&e))?;
        let found6 = self.ipam.check6(&key).map_err(|e| ipam_status(&e))?;
        let family = self.ipam.family();
        let ip = found.as_ref().map(|a| a.ip.to_string()).unwrap_or_default();
        let ipv6 = found6.map(|i| i.to_string()).unwrap_or_default();
        let mut problems = Vec::new();
        if family.has_ipv4() && found.is_none() || family.has_ipv6() && found6.is_none() {
            problems.push(format!("eniipamd has no {family} address for {key}"));
        }
        if !r.ip.is_empty() && !ip.is_empty() && r.ip != ip {
            problems.push(format!("{key} holds {ip} but the runtime expects {}", r.ip));
        }
        if !r.ipv6.is_empty() && !ipv6.is_empty() && r.ipv6 != ipv6 {
            problems.push(format!(
                "{key} holds {ipv6} but the runtime expects {}",
                r.ipv6
            ));
        }
        let reply = pb::CheckReply {
            ok: problems.is_empty(),
            ip,
            message: problems.join("; "),
            ipv6,
            egress_ipv4: self
                .ipam
                .egress_of(&key)
                .map(|i| i.to_string())
                .unwrap_or_default(),
        };
        Ok(Response::new(reply))
    }

    async fn garbage_collect(
        &self,
        req: Request<pb::GarbageCollectRequest>,
    ) -> Result<Response<pb::GarbageCollectReply>, Status> {
        let r = req.into_inner();
        check_version(r.api_version)?;
        if r.network.is_empty() {
            return Err(invalid(
                "network must name the CNI network whose valid attachments are listed",
            ));
        }
        let req = GcRequest {
            network: r.network,
            valid: r
                .valid
                .iter()
                .map(|a| AttachmentKey::new(a.container_id.clone(), a.ifname.clone()))
                .collect(),
            listed_before_ms: r.listed_before_ms,
        };
        let cleaning: Vec<(IpAddr, String)> = r
            .cleaning
            .iter()
            .map(|s| {
                s.parse::<IpAddr>()
                    .map(|ip| (ip, s.clone()))
                    .map_err(|_| invalid(format!("cleaning: {s:?} is not an IP address")))
            })
            .collect::<Result<_, _>>()?;
        let released = self
            .ipam
            .garbage_collect(&req)
            .await
            .map_err(|e| ipam_status(&e))?;
        let held_by_others = cleaning
            .into_iter()
            .filter(|(ip, _)| match ip {
                IpAddr::V4(ip) => self.ipam.holder_of(*ip).is_some(),
                IpAddr::V6(ip) => self.ipam.holder_of6(*ip).is_some(),
            })
            .map(|(_, s)| s)
            .collect();
        Ok(Response::new(pb::GarbageCollectReply {
            released: released
                .into_iter()
                .map(|k| pb::Attachment {
                    container_id: k.container_id,
                    ifname: k.ifname,
                })
                .collect(),
            held_by_others,
        }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        check_version(req.into_inner().api_version)?;
        let s = self.ipam.pool().snapshot();
        let exhausted = s.exhaustion.is_some() && s.idle_eligible == 0;
        let (ipv6_prefix, ipv6_assigned) = self.ipam.ipv6_summary();
        Ok(Response::new(pb::StatusReply {
            ready: self.ipam.is_ready(),
            exhausted,
            reason: s
                .exhaustion
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_default(),
            capacity: s.capacity,
            idle: s.idle,
            assigned: s.assigned,
            ip_family: self.ipam.family().to_string(),
            ipv6_prefix,
            ipv6_assigned: ipv6_assigned as u64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn with_timeout(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        m
    }

    #[test]
    fn the_callers_deadline_leaves_a_margin_for_the_answer() {
        // The plugin's default 105 s: 5 s for the answer.
        assert_eq!(
            caller_budget(&with_timeout("105000m")),
            Some(Duration::from_secs(100))
        );
        // A short deadline keeps nine tenths.
        assert_eq!(
            caller_budget(&with_timeout("4S")),
            Some(Duration::from_millis(3600))
        );
        assert_eq!(
            caller_budget(&with_timeout("2M")),
            Some(Duration::from_secs(115))
        );
        assert_eq!(caller_budget(&MetadataMap::new()), None);
    }

    #[test]
    fn an_unreadable_deadline_is_ignored() {
        for bad in ["", "S", "12", "12x", "-5S", "123456789S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
    }
}
