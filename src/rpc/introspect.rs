//! The `Introspect` gRPC service for `eniipamctl`: the pool, the allocations in the state file, the
//! ENIs. Read-only.

use tonic::{Request, Response, Status};

use super::pb;
use crate::ipam::Ipam;
use crate::pool::snapshot::{EniPhaseSnapshot, IpState};

/// The `Introspect` service.
#[derive(Clone)]
pub struct IntrospectService {
    pub ipam: Ipam,
    pub instance_id: String,
    pub instance_type: String,
    /// The cluster's Service CIDRs (`service_cidrs`), for `eniipamctl policy`'s warnings.
    pub service_cidrs: Vec<ipnet::IpNet>,
    /// The NetworkPolicy enforcer, when enforcement is on (`eniipamctl policy`).
    pub policy: Option<std::sync::Arc<crate::network_policy::Enforcer>>,
}

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
            EniPhaseSnapshot::Suspect { .. } => "suspect".to_owned(),
        },
        backlog: e.in_flight,
        prefixes: e.prefixes.iter().map(ToString::to_string).collect(),
        serves_pods: e.serves_pods,
        network: e.network.clone().unwrap_or_default(),
    }
}

/// The reply of `eniipamctl policy`.
fn policy_reply(
    e: crate::network_policy::Explanation,
    service_cidrs: &[ipnet::IpNet],
) -> pb::PolicyReply {
    use crate::network_policy::Direction;
    use crate::network_policy::explain::{peers_text, ports_text, service_cidr_warnings};
    let direction = |word: &str, d: &Direction, allowed: u64, denied: u64| match d {
        Direction::Open => pb::PolicyDirection::default(),
        Direction::Isolated { policies, rules } => pb::PolicyDirection {
            isolated: true,
            policies: policies.clone(),
            rules: rules
                .iter()
                .map(|r| pb::PolicyRule {
                    source: format!("{} {word}[{}]", r.source.policy, r.source.index),
                    peers: peers_text(&r.peers),
                    ports: ports_text(&r.ports),
                })
                .collect(),
            allowed,
            denied,
        },
    };
    let c = e.counts;
    let mut reply = pb::PolicyReply {
        enforcing: e.enforcing,
        not_enforced: e.not_enforced,
        last_error: e.last_error.unwrap_or_default(),
        ..pb::PolicyReply::default()
    };
    if let Some(pod) = e.pod {
        reply.warnings = service_cidr_warnings(&pod.compiled, service_cidrs);
        reply.local = true;
        reply.veth = pod.veth;
        reply.ingress = Some(direction(
            "ingress",
            &pod.compiled.ingress,
            c.ingress_allowed,
            c.ingress_denied,
        ));
        reply.egress = Some(direction(
            "egress",
            &pod.compiled.egress,
            c.egress_allowed,
            c.egress_denied,
        ));
        reply.problems = pod.compiled.problems;
    }
    reply
}

/// Puts each IPv6 address the /80's book holds on its attachment's row: a dual-stack pod's IPv4 row
/// gains it, an IPv6-only pod gets a row of its own (no IPv4; its ENI is the /80's). The book is
/// the daemon's live view, written under the same lock as the durable record the answer waited for.
fn merge_ipv6(rows: &mut Vec<pb::Allocation>, p: &crate::ipv6::Ipv6Pool) {
    let held: Vec<(crate::model::AttachmentKey, crate::ipv6::Held)> =
        p.with(|b| b.held().map(|(k, h)| (k.clone(), h.clone())).collect());
    for (key, h) in held {
        let row = rows
            .iter_mut()
            .find(|r| r.container_id == key.container_id && r.ifname == key.ifname);
        match row {
            Some(r) => r.ipv6 = h.ip.to_string(),
            None => rows.push(pb::Allocation {
                ip: String::new(),
                container_id: key.container_id,
                ifname: key.ifname,
                netns: h.meta.netns,
                pod_namespace: h.pod.namespace,
                pod_name: h.pod.name,
                eni_id: p.eni_id.clone(),
                sticky_key: h.sticky_key.unwrap_or_default(),
                assigned_at_ms: h.assigned_at_ms,
                network: h.meta.network,
                ipv6: h.ip.to_string(),
            }),
        }
    }
}

#[tonic::async_trait]
impl pb::introspect_server::Introspect for IntrospectService {
    async fn pool(&self, _: Request<pb::PoolRequest>) -> Result<Response<pb::PoolReply>, Status> {
        let s = self.ipam.pool().snapshot();
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
        let (ipv6_prefix, ipv6_assigned) = self.ipam.ipv6_summary();
        Ok(Response::new(pb::PoolReply {
            instance_id: self.instance_id.clone(),
            instance_type: self.instance_type.clone(),
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
            ready: self.ipam.is_ready(),
            invariant_error: self
                .ipam
                .pool()
                .check_invariants()
                .err()
                .unwrap_or_default(),
            quarantined: s.quarantined,
            warm_policy: s.warm_policy.to_string(),
            warm_target: s.warm_target,
            warm_fill: s.warm_fill,
            warm_keep: s.warm_keep,
            ip_family: self.ipam.family().to_string(),
            ipv6_prefix,
            ipv6_assigned: ipv6_assigned as u32,
        }))
    }

    async fn allocations(
        &self,
        _: Request<pb::AllocationsRequest>,
    ) -> Result<Response<pb::AllocationsReply>, Status> {
        let state = self
            .ipam
            .store()
            .load()
            .await
            .map_err(|e| Status::internal(format!("cannot read the state file: {e}")))?;
        let mut rows: Vec<pb::Allocation> = state
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
                network: a.network,
                ipv6: String::new(),
            })
            .collect();
        if let Some(p) = self.ipam.ipv6() {
            merge_ipv6(&mut rows, p);
        }
        Ok(Response::new(pb::AllocationsReply { allocations: rows }))
    }

    async fn release_quarantined(
        &self,
        req: Request<pb::ReleaseQuarantinedRequest>,
    ) -> Result<Response<pb::ReleaseQuarantinedReply>, Status> {
        let r = req.into_inner();
        let quarantined: std::collections::BTreeSet<std::net::Ipv4Addr> = self
            .ipam
            .pool()
            .snapshot()
            .ips()
            .filter(|i| matches!(i.state, IpState::Quarantined { .. }))
            .map(|i| i.ip)
            .collect();
        let ips: Vec<std::net::Ipv4Addr> = if r.all {
            quarantined.into_iter().collect()
        } else {
            if r.ips.is_empty() {
                return Err(Status::invalid_argument(
                    "name the IPs to release, or ask for all",
                ));
            }
            let ips: Vec<std::net::Ipv4Addr> = r
                .ips
                .iter()
                .map(|s| {
                    s.parse().map_err(|_| {
                        Status::invalid_argument(format!("{s:?} is not an IPv4 address"))
                    })
                })
                .collect::<Result<_, _>>()?;
            // Bad input changes nothing: an IP that is not quarantined (a typo, a pod's IP) fails
            // the whole request.
            let not: Vec<String> = ips
                .iter()
                .filter(|ip| !quarantined.contains(ip))
                .map(|ip| ip.to_string())
                .collect();
            if !not.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "not quarantined: {} (nothing released)",
                    not.join(", ")
                )));
            }
            ips
        };
        let released = self
            .ipam
            .lift_quarantine(&ips)
            .await
            .map_err(|e| Status::internal(format!("cannot record the release: {e}")))?;
        tracing::warn!(ips = ?released, "quarantine released by an operator");
        Ok(Response::new(pb::ReleaseQuarantinedReply {
            released: released.iter().map(|ip| ip.to_string()).collect(),
        }))
    }

    async fn policy(
        &self,
        request: Request<pb::PolicyRequest>,
    ) -> Result<Response<pb::PolicyReply>, Status> {
        let r = request.into_inner();
        if r.namespace.is_empty() || r.name.is_empty() {
            return Err(Status::invalid_argument(
                "a pod is named by its namespace and name, both non-empty",
            ));
        }
        let Some(gate) = &self.policy else {
            return Ok(Response::new(pb::PolicyReply::default()));
        };
        Ok(Response::new(policy_reply(
            gate.explain(&r.namespace, &r.name).await,
            &self.service_cidrs,
        )))
    }

    async fn enis(&self, _: Request<pb::EnisRequest>) -> Result<Response<pb::EnisReply>, Status> {
        let s = self.ipam.pool().snapshot();
        Ok(Response::new(pb::EnisReply {
            enis: s.enis.iter().map(eni_info).collect(),
        }))
    }
}
