//! Releasing allocations whose pod the API server says is gone: the step the running reconcile runs.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::time::Instant;

use super::watch::{BoundPod, BoundPods, PodPhase, PodWatch};
use crate::ipam::Ipam;
use crate::metrics::Metrics;
use crate::model::{AttachmentKey, PodRef};
use crate::pool::snapshot::IpState;
use crate::reconcile::evidence::{NetnsState, NetnsView};

/// How long the confirming GET may take before the pod counts as unknown.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a pod counts as gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoneReason {
    /// No pod of that namespace/name is bound to this node.
    Deleted,
    /// A pod of the same namespace/name exists with another uid: the recorded one is gone.
    Replaced { uid: String },
    /// The pod finished: the kubelet stopped its sandbox, and it never runs again.
    Finished(PodPhase),
}

impl std::fmt::Display for GoneReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Deleted => f.write_str("deleted from the API server"),
            Self::Replaced { uid } => {
                write!(f, "replaced by a new pod of the same name (uid {uid})")
            }
            Self::Finished(phase) => write!(f, "finished ({phase:?})"),
        }
    }
}

/// What the API server's view says of an allocation's pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Alive,
    Gone(GoneReason),
    /// Cannot tell: kept.
    Unknown(&'static str),
}

/// The verdict on the recorded `pod` given what the API server has under its namespace/name
/// (`found`). A recorded pod with no uid (an old runtime without `K8S_POD_UID`) matches any pod of
/// that name. A missing pod named `<anything>-<node>` may be a static pod whose mirror pod is not in
/// the API (the kubelet could not create it): unknown, not gone.
pub fn judge(found: Option<&BoundPod>, pod: &PodRef, node_name: &str) -> Verdict {
    match found {
        Some(p) if pod.uid.is_empty() || p.has_uid(&pod.uid) => {
            if p.phase.is_terminal() {
                Verdict::Gone(GoneReason::Finished(p.phase))
            } else {
                Verdict::Alive
            }
        }
        Some(p) => Verdict::Gone(GoneReason::Replaced { uid: p.uid.clone() }),
        None if !node_name.is_empty() && pod.name.ends_with(&format!("-{node_name}")) => {
            Verdict::Unknown("possibly a static pod without its mirror pod")
        }
        None => Verdict::Gone(GoneReason::Deleted),
    }
}

/// The API-server pod GC: the watch, the client for confirming GETs, the grace period, and since when
/// each allocation's pod has been seen gone. Cheap to clone.
#[derive(Clone)]
pub struct ApiServerGc {
    inner: Arc<Inner>,
}

struct Inner {
    watch: PodWatch,
    client: kube::Client,
    grace: Duration,
    metrics: Metrics,
    /// Allocation → when its pod was first seen gone (by the watch, or by a synced pass).
    gone_since: Mutex<HashMap<AttachmentKey, Instant>>,
}

/// One allocation due for release, before the confirming GET.
struct Due {
    attachment: AttachmentKey,
    /// Its IPv4 (ipv4, dual) or IPv6 (ipv6), for the logs.
    ip: IpAddr,
    pod: PodRef,
    /// The pod's network namespace as the plugin reported it at ADD (empty when unknown).
    netns: String,
}

impl ApiServerGc {
    /// `client` is the one `watch` runs on (used for the confirming GETs).
    pub fn new(watch: PodWatch, client: kube::Client, grace: Duration, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                watch,
                client,
                grace,
                metrics,
                gone_since: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The watch (its [`PodWatch::bound_pods`] is the snapshot a lookahead would read).
    pub fn watch(&self) -> &PodWatch {
        &self.inner.watch
    }

    pub fn grace(&self) -> Duration {
        self.inner.grace
    }

    /// The allocations due for release at `now` according to `view`, updating the gone-since marks.
    fn due(&self, ipam: &Ipam, view: &BoundPods, now: Instant) -> Vec<Due> {
        let inner = &self.inner;
        let node = inner.watch.node_name();
        let mut marks = inner.gone_since.lock().unwrap_or_else(|e| e.into_inner());
        if !view.synced {
            // Unknown: forget what was seen; after the next full list, the clock starts again (from
            // the departures the watch saw, or from then).
            marks.clear();
            return Vec::new();
        }
        let snapshot = ipam.pool().snapshot();
        // Every attachment that holds an address: the pool's, then the /80's that hold no IPv4
        // (ip_family ipv6), each with how long it has held it.
        let mut held: Vec<(AttachmentKey, IpAddr, PodRef, String, Duration)> = snapshot
            .ips()
            .filter_map(|ip| match &ip.state {
                IpState::Assigned {
                    attachment,
                    pod,
                    meta,
                    held_for,
                    ..
                } => Some((
                    attachment.clone(),
                    IpAddr::V4(ip.ip),
                    pod.clone(),
                    meta.netns.clone(),
                    *held_for,
                )),
                _ => None,
            })
            .collect();
        if let Some(p) = ipam.ipv6() {
            let now_ms = crate::clock::unix_ms_now();
            let known: HashSet<AttachmentKey> = held.iter().map(|h| h.0.clone()).collect();
            p.with(|b| {
                for (k, h) in b.held().filter(|(k, _)| !known.contains(*k)) {
                    let held_for = Duration::from_millis(now_ms.saturating_sub(h.assigned_at_ms));
                    held.push((
                        k.clone(),
                        IpAddr::V6(h.ip),
                        h.pod.clone(),
                        h.meta.netns.clone(),
                        held_for,
                    ));
                }
            });
        }
        let mut assigned = HashSet::new();
        let mut due = Vec::new();
        for (attachment, ip, pod, netns, held_for) in &held {
            let (attachment, pod, held_for) = (attachment, pod, held_for);
            if pod.namespace.is_empty() || pod.name.is_empty() {
                continue; // no pod identity (IPAM role without K8S_POD_*): never this source's to release
            }
            assigned.insert(attachment.clone());
            match judge(view.get(&pod.namespace, &pod.name), pod, node) {
                Verdict::Gone(_) => {
                    let departed = inner
                        .watch
                        .departed_at(&pod.uid)
                        .map_or(now, |t| t.min(now));
                    let since = *marks.entry(attachment.clone()).or_insert(departed);
                    // A pod ADDed less than `grace` ago may simply not be in the watch yet.
                    if now.saturating_duration_since(since) >= inner.grace
                        && *held_for >= inner.grace
                    {
                        due.push(Due {
                            attachment: attachment.clone(),
                            ip: *ip,
                            pod: pod.clone(),
                            netns: netns.clone(),
                        });
                    }
                }
                Verdict::Alive => {
                    marks.remove(attachment);
                }
                Verdict::Unknown(why) => {
                    marks.remove(attachment);
                    tracing::debug!(attachment = %attachment, pod = %format!("{}/{}", pod.namespace, pod.name),
                        why, "pod not in the API server's view, but not provably gone: kept");
                }
            }
        }
        marks.retain(|k, _| assigned.contains(k));
        due
    }

    /// A direct GET of the pod, judged like the view: `None` when the API server cannot be asked.
    async fn confirm(&self, pod: &PodRef) -> Option<Verdict> {
        let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), &pod.namespace);
        match tokio::time::timeout(CONFIRM_TIMEOUT, api.get_opt(&pod.name)).await {
            Ok(Ok(found)) => {
                let found = found.as_ref().and_then(BoundPod::from_pod);
                Some(judge(found.as_ref(), pod, self.inner.watch.node_name()))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, pod = %format!("{}/{}", pod.namespace, pod.name),
                    "cannot confirm with the API server that a pod is gone: kept for now");
                None
            }
            Err(_) => {
                tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), timeout = ?CONFIRM_TIMEOUT,
                    "the API server did not answer a pod GET in time: kept for now");
                None
            }
        }
    }
}

/// The running reconcile's API-server step: releases, through [`Ipam::release_dead`], every
/// allocation whose pod has been gone from the API server for at least the grace period and which a
/// direct GET confirms gone. Does nothing when `gc` is off or its watch is not synced. Returns what it
/// released.
///
/// The host's word comes first: an allocation whose network namespace `netns` still shows is kept
/// (a force-deleted pod's sandbox may run on; giving its IP to a new pod would put two pods on one
/// address). The skip is logged and counted (`eniipam_api_server_release_deferred`); the pod stays
/// marked gone, so the first pass after the namespace disappears releases it.
pub async fn release_gone_pods(
    ipam: &Ipam,
    gc: Option<&ApiServerGc>,
    netns: &NetnsView,
) -> Vec<(AttachmentKey, Ipv4Addr)> {
    let Some(gc) = gc else {
        return Vec::new();
    };
    let now = Instant::now();
    let view = gc.inner.watch.bound_pods();
    let due = gc.due(ipam, &view, now);
    let mut released = Vec::new();
    for d in due {
        let pod_name = format!("{}/{}", d.pod.namespace, d.pod.name);
        if netns.state(&d.netns) == NetnsState::Alive {
            tracing::info!(attachment = %d.attachment, ip = %d.ip, pod = %pod_name, netns = %d.netns,
                "pod is gone from the API server but its network namespace is still on the host \
                 (a sandbox still running): kept until the namespace is gone");
            gc.inner.metrics.api_server_release_deferred.inc();
            continue;
        }
        let reason = match gc.confirm(&d.pod).await {
            Some(Verdict::Gone(reason)) => reason,
            Some(verdict) => {
                // The watch was behind: the API server still has the pod.
                tracing::info!(attachment = %d.attachment, pod = %pod_name, ?verdict,
                    "the watch showed the pod gone but the API server still has it: kept");
                gc.inner
                    .gone_since
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&d.attachment);
                continue;
            }
            // The API server cannot be asked: unknown; the rest waits for the next pass too.
            None => break,
        };
        match ipam.release_dead(&d.attachment).await {
            Ok(Some(r)) => {
                tracing::info!(attachment = %d.attachment, ip = ?r.ip, ipv6 = ?r.ipv6, pod = %pod_name,
                    uid = %d.pod.uid, %reason, grace = ?gc.inner.grace,
                    "pod is gone from the API server without a CNI DEL: released");
                gc.inner.metrics.api_server_released.inc();
                if let Some(ip) = r.ip {
                    released.push((d.attachment.clone(), ip));
                }
            }
            Ok(None) => {} // a DEL released it meanwhile
            Err(e) => {
                tracing::warn!(error = %e, attachment = %d.attachment, ip = %d.ip, pod = %pod_name,
                    "cannot release an allocation whose pod is gone; trying again next pass");
                continue;
            }
        }
        gc.inner
            .gone_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&d.attachment);
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::api_server::PodKey;

    fn bound(name: &str, uid: &str, phase: PodPhase, mirror: Option<&str>) -> BoundPod {
        BoundPod {
            key: PodKey::new("default", name),
            uid: uid.into(),
            mirror_of: mirror.map(str::to_owned),
            host_network: false,
            phase,
            deleting: false,
            network: None,
        }
    }

    fn rec(name: &str, uid: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn verdicts() {
        let node = "ip-10-0-0-1.ec2.internal";
        let running = bound("web", "u1", PodPhase::Running, None);
        assert_eq!(
            judge(Some(&running), &rec("web", "u1"), node),
            Verdict::Alive
        );
        assert_eq!(
            judge(Some(&running), &rec("web", ""), node),
            Verdict::Alive,
            "no uid recorded: the name decides"
        );
        assert_eq!(
            judge(Some(&running), &rec("web", "u0"), node),
            Verdict::Gone(GoneReason::Replaced { uid: "u1".into() })
        );
        assert_eq!(
            judge(None, &rec("web", "u1"), node),
            Verdict::Gone(GoneReason::Deleted)
        );
        let done = bound("job", "u2", PodPhase::Succeeded, None);
        assert_eq!(
            judge(Some(&done), &rec("job", "u2"), node),
            Verdict::Gone(GoneReason::Finished(PodPhase::Succeeded))
        );
        // Static pods: the record has the static pod's uid, the mirror pod another.
        let name = format!("kube-proxy-{node}");
        let mirror = bound(&name, "api-uid", PodPhase::Running, Some("hash"));
        assert_eq!(
            judge(Some(&mirror), &rec(&name, "hash"), node),
            Verdict::Alive
        );
        assert_eq!(
            judge(Some(&mirror), &rec(&name, "old-hash"), node),
            Verdict::Gone(GoneReason::Replaced {
                uid: "api-uid".into()
            }),
            "a new version of the static pod replaced the recorded one"
        );
        assert!(matches!(
            judge(None, &rec(&name, "hash"), node),
            Verdict::Unknown(_)
        ));
    }
}
