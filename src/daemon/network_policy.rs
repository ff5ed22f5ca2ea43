//! Where NetworkPolicy (the `eniipam-netpol` crate, `crate::network_policy`) meets the pool and the
//! IPAM service: the crate's enforcer is started here, before the service is built, with the node's
//! pods read from the pool and the IPv6 book ([`PoolPods`]), and handed to the service as its
//! admission ([`PolicyAdmission`]): a new pod's ADD waits for its rules. Everything about policy
//! itself (watches, compile, `nft`, the sync task, decision logs, metrics) is the crate's.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::DaemonConfig;
use crate::ipam::{Admission, IpamError};
use crate::ipv6::Ipv6Pool;
use crate::metrics::Metrics;
use crate::model::PodRef;
use crate::network_policy::decisions::LogConfig;
use crate::network_policy::enforce::LocalAttachment;
use crate::network_policy::{Enforcer, LocalPods, Setup};
use crate::pool::Pool;
use crate::pool::snapshot::IpState;
use crate::reconcile::api_server::node::StartupGate;

/// This node's pod attachments, from the pool (IPv4) and the IPv6 book (ipv6 and dual), each with
/// its host veth (named as the plugin names it, from `veth_prefix`).
pub(super) struct PoolPods {
    pub pool: Pool,
    pub ipv6: Option<Arc<Ipv6Pool>>,
    pub veth_prefix: String,
}

impl LocalPods for PoolPods {
    /// Its addresses of both families, in veth order: one per attachment, whatever the number of
    /// its addresses (two attachments may still name one veth, see
    /// [`crate::network_policy::enforce::newest_per_veth`]).
    fn attachments(&self) -> Vec<LocalAttachment> {
        let snapshot = self.pool.snapshot();
        let veth_prefix = self.veth_prefix.as_str();
        let mut out: BTreeMap<(String, String), LocalAttachment> = BTreeMap::new();
        // The book's pods (their IPv6; a node-local egress IPv4 is SNATed to the node's, no peer's).
        if let Some(p) = &self.ipv6 {
            let now_ms = crate::clock::unix_ms_now();
            p.with(|book| {
                for (attachment, held) in book.held() {
                    if held.pod.namespace.is_empty() || held.pod.name.is_empty() {
                        continue;
                    }
                    let veth =
                        eniipam_api::host_veth_name(veth_prefix, Some(&held.pod), attachment);
                    let held_for =
                        Duration::from_millis(now_ms.saturating_sub(held.assigned_at_ms));
                    let a = out
                        .entry((veth.clone(), attachment.to_string()))
                        .or_insert_with(|| LocalAttachment {
                            namespace: held.pod.namespace.clone(),
                            name: held.pod.name.clone(),
                            veth,
                            ips: Vec::new(),
                            container_id: attachment.container_id.clone(),
                            held_for,
                        });
                    a.ips.push(IpAddr::V6(held.ip));
                    a.held_for = a.held_for.min(held_for);
                }
            });
        }
        for eni in &snapshot.enis {
            for ip in &eni.ips {
                if let IpState::Assigned {
                    attachment,
                    pod,
                    held_for,
                    ..
                } = &ip.state
                {
                    if pod.namespace.is_empty() || pod.name.is_empty() {
                        // No pod identity: not a Kubernetes pod, no policy selects it.
                        continue;
                    }
                    let veth = eniipam_api::host_veth_name(veth_prefix, Some(pod), attachment);
                    let a = out
                        .entry((veth.clone(), attachment.to_string()))
                        .or_insert_with(|| LocalAttachment {
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                            veth,
                            ips: Vec::new(),
                            container_id: attachment.container_id.clone(),
                            held_for: *held_for,
                        });
                    a.ips.push(IpAddr::V4(ip.ip));
                    a.held_for = a.held_for.min(*held_for);
                }
            }
        }
        out.into_values().collect()
    }
}

/// The enforcer as the IPAM service's admission: its refusals become the service's error, named
/// as NetworkPolicy's (`network policy: …`).
pub(super) struct PolicyAdmission(pub Arc<Enforcer>);

#[async_trait::async_trait]
impl Admission for PolicyAdmission {
    async fn admit(&self, pod: &PodRef) -> Result<(), IpamError> {
        self.0
            .admit(pod)
            .await
            .map_err(|e| IpamError::Admission(format!("network policy: {e}")))
    }

    fn unwired(&self, pod: &PodRef) {
        self.0.unwired(pod);
    }

    fn released(&self) {
        self.0.released();
    }
}

/// The decision log's knobs, from the daemon's.
fn log_config(c: &DaemonConfig) -> LogConfig {
    LogConfig {
        logged: c.network_policy_log,
        group: c.network_policy_log_group,
        per_second: c.network_policy_log_rate,
        file: c.network_policy_log_file.clone(),
        file_max_bytes: c.network_policy_log_file_max_mb << 20,
        file_keep: c.network_policy_log_file_keep,
    }
}

/// Starts enforcement over `pods`; `first_sync` opens at each sync that put the rules in force
/// (the node's startup taint waits for the first).
pub(super) fn start(
    client: kube::Client,
    (config, pods): (&DaemonConfig, PoolPods),
    first_sync: StartupGate,
    metrics: &Metrics,
    cancel: CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> Arc<Enforcer> {
    crate::network_policy::start(
        Setup {
            client,
            pods: Arc::new(pods),
            on_synced: Box::new(move || first_sync.set_open()),
            log: log_config(config),
            metrics: metrics.network_policy.clone(),
        },
        cancel,
        background,
    )
}
