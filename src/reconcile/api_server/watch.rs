//! The pods bound to this node: one list + watch (`fieldSelector=spec.nodeName=<node>`) kept as a
//! compact, cheaply cloned view, and whether that view may be trusted to say "gone".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use eniipam_kubeview::View;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cloud::backoff::BackoffPolicy;
use crate::metrics::Metrics;

/// The annotation the kubelet puts on a mirror pod (a static pod's stand-in in the API): the static
/// pod's own UID (its config hash), which is the UID the kubelet gives the runtime, and so the one in
/// eniipam's records. The mirror pod's `metadata.uid` is another, API-assigned one.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How long a departure time is remembered (long past any sensible grace period).
const DEPARTED_KEPT: Duration = Duration::from_secs(3600);
/// At most this many departure times are remembered (a node runs a few hundred pods at most).
const DEPARTED_MAX: usize = 10_000;

/// A pod's `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    fn parse(phase: Option<&str>) -> Self {
        match phase {
            Some("Pending") | None => Self::Pending,
            Some("Running") => Self::Running,
            Some("Succeeded") => Self::Succeeded,
            Some("Failed") => Self::Failed,
            Some(_) => Self::Unknown,
        }
    }

    /// `Succeeded` and `Failed` are final: the kubelet has stopped the sandbox and never starts it again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// What eniipam keeps of one pod bound to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub key: PodKey,
    pub uid: String,
    /// For a mirror pod: the static pod's UID ([`MIRROR_ANNOTATION`]).
    pub mirror_of: Option<String>,
    pub host_network: bool,
    pub phase: PodPhase,
    /// `metadata.deletionTimestamp` is set: terminating, still running until the kubelet stops it.
    pub deleting: bool,
    /// The pod's [`crate::network_profiles::ANNOTATION`] as written (`Some("")`: explicitly the
    /// default network), which wins over its namespace's (`network_profiles::pod_profile`).
    pub network: Option<String>,
}

impl BoundPod {
    /// The parts of `pod` eniipam uses; `None` without a namespace, a name or a uid.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().filter(|s| !s.is_empty())?;
        let name = meta.name.clone().filter(|s| !s.is_empty())?;
        let uid = meta.uid.clone().filter(|s| !s.is_empty())?;
        Some(Self {
            key: PodKey { namespace, name },
            uid,
            mirror_of: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(MIRROR_ANNOTATION))
                .filter(|s| !s.is_empty())
                .cloned(),
            host_network: pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false),
            phase: PodPhase::parse(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
            deleting: meta.deletion_timestamp.is_some(),
            network: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::network_profiles::ANNOTATION))
                .cloned(),
        })
    }

    /// Whether `uid` (from a CNI request) names this pod: its own UID, or the static pod it mirrors.
    pub fn has_uid(&self, uid: &str) -> bool {
        self.uid == uid || self.mirror_of.as_deref() == Some(uid)
    }

    /// Whether the pod will want a pod IP from this node: bound, not host-network, not finished and
    /// not being deleted (what the lookahead counts as demand, [`super::lookahead`]).
    pub fn wants_ip(&self) -> bool {
        !self.host_network && !self.phase.is_terminal() && !self.deleting
    }
}

/// A snapshot of the pods bound to this node. Cloning is cheap (an `Arc`).
#[derive(Clone, Debug)]
pub struct BoundPods {
    /// The initial list is done and the watch has had no error since: a pod absent here is gone.
    /// When false the view may be stale or partial: pods are unknown, never gone.
    pub synced: bool,
    /// By `namespace/name` (the [`PodKey`]'s text, the list + watch view's key).
    pub pods: Arc<BTreeMap<String, BoundPod>>,
    /// Bumped at every change of the view (or of `synced`).
    pub generation: u64,
}

impl BoundPods {
    pub fn get(&self, namespace: &str, name: &str) -> Option<&BoundPod> {
        self.pods.get(&format!("{namespace}/{name}"))
    }
}

/// The watch's view: the list + watch [`View`] (`eniipam-kubeview`'s, shared by every API-server
/// watch) of the pods' [`BoundPod`]s, whose `synced` is also cleared by a watch error, and when each
/// pod left.
#[derive(Default)]
struct PodsView {
    pods: View<BoundPod>,
    generation: u64,
    /// When each pod UID stopped being a live pod on this node, as the watch saw it: deleted, replaced
    /// by another pod of the same name, or finished.
    departed: HashMap<String, Instant>,
}

/// The UID a change of one pod's entry ends, if it ends one: the pod gone (deleted, or missing from a
/// re-list), replaced by another pod of the same name, or finished.
fn departure<'a>(was: Option<&'a BoundPod>, now: Option<&'a BoundPod>) -> Option<&'a str> {
    match (was?, now) {
        (was, None) => Some(&was.uid),
        (was, Some(p)) if p.uid != was.uid => Some(&was.uid),
        (was, Some(p)) if p.phase.is_terminal() && !was.phase.is_terminal() => Some(&p.uid),
        _ => None,
    }
}

impl PodsView {
    /// Applies one watch event: a completed list replaces the view (pods missing from it, or listed
    /// with another uid, or now finished, departed now); an applied pod replaces its name's; a
    /// deleted one leaves (only the pod of that uid: not a newer one of its name).
    fn apply(&mut self, event: watcher::Event<Pod>, now: Instant) {
        let departed = &mut self.departed;
        self.pods.apply_with(event, BoundPod::from_pod, |c| {
            if let Some(uid) = departure(c.was, c.now) {
                departed.entry(uid.to_owned()).or_insert(now);
            }
        });
        self.prune(now);
    }

    fn prune(&mut self, now: Instant) {
        self.departed
            .retain(|_, at| now.saturating_duration_since(*at) < DEPARTED_KEPT);
        if self.departed.len() > DEPARTED_MAX {
            let mut times: Vec<Instant> = self.departed.values().copied().collect();
            times.sort();
            let cut = times[times.len() - DEPARTED_MAX];
            self.departed.retain(|_, at| *at >= cut);
        }
    }
}

struct Shared {
    node_name: String,
    view: RwLock<PodsView>,
    changed: notify::Sender<u64>,
    metrics: Metrics,
}

impl Shared {
    /// The view, for a change its readers need not hear of.
    fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, PodsView> {
        self.view.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the view and tells its readers (a new generation), with the metrics.
    fn update(&self, f: impl FnOnce(&mut PodsView)) {
        let (generation, synced, count) = {
            let mut v = self.view_mut();
            f(&mut v);
            v.generation += 1;
            (v.generation, v.pods.synced, v.pods.objects.len())
        };
        self.metrics.api_server_synced.set(i64::from(synced));
        self.metrics.api_server_bound_pods.set(count as i64);
        self.changed.send_replace(generation);
    }
}

/// The watch on the pods bound to this node. Cheap to clone; the task ends on cancel.
#[derive(Clone)]
pub struct PodWatch {
    shared: Arc<Shared>,
}

impl PodWatch {
    /// Starts the list + watch of the pods bound to `node_name` on `client`'s API server. Errors are
    /// retried for ever with jittered exponential backoff (1 s doubling to 60 s), each time from a
    /// fresh list so that "synced" always means a complete, current view.
    pub fn spawn(
        client: kube::Client,
        node_name: String,
        metrics: Metrics,
        cancel: CancellationToken,
    ) -> (Self, JoinHandle<()>) {
        let (changed, _) = notify::channel(0);
        let shared = Arc::new(Shared {
            node_name,
            view: RwLock::new(PodsView::default()),
            changed,
            metrics,
        });
        shared.metrics.api_server_synced.set(0);
        let task = tokio::spawn(run(shared.clone(), Api::all(client), cancel));
        (Self { shared }, task)
    }

    /// The node whose pods are watched.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    /// The pods bound to this node as the watch knows them now (a cheap snapshot).
    pub fn bound_pods(&self) -> BoundPods {
        let v = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        BoundPods {
            synced: v.pods.synced,
            pods: v.pods.objects.clone(),
            generation: v.generation,
        }
    }

    /// Whether the view is synced (see [`BoundPods::synced`]).
    pub fn is_synced(&self) -> bool {
        self.shared
            .view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .synced
    }

    /// When the watch saw pod `uid` stop being a live pod here (deleted, replaced, finished), if it did.
    pub fn departed_at(&self, uid: &str) -> Option<Instant> {
        self.shared
            .view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .departed
            .get(uid)
            .copied()
    }

    /// A receiver of the view's generation, which changes at every update (for waiting on the view).
    pub fn subscribe(&self) -> notify::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Waits until `f` holds for the view (checked now and after every change).
    pub async fn wait_for(&self, mut f: impl FnMut(&BoundPods) -> bool) {
        let mut rx = self.subscribe();
        loop {
            if f(&self.bound_pods()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

fn is_expired(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

fn is_forbidden(e: &watcher::Error) -> bool {
    let client = match e {
        watcher::Error::InitialListFailed(c)
        | watcher::Error::WatchStartFailed(c)
        | watcher::Error::WatchFailed(c) => c,
        watcher::Error::WatchError(status) => return status.code == 403 || status.code == 401,
        watcher::Error::NoResourceVersion => return false,
    };
    matches!(client, kube::Error::Api(s) if s.code == 403 || s.code == 401)
}

async fn run(shared: Arc<Shared>, api: Api<Pod>, cancel: CancellationToken) {
    let selector = format!("spec.nodeName={}", shared.node_name);
    // `any_semantic` and no paging: lists carry resourceVersion=0 and are served from the API server's
    // watch cache, as the kubelet's are, so a fleet re-listing after an API server restart does not all
    // hit etcd (kube leaves resourceVersion=0 out of paged lists; one node's pods are a small list). A
    // list a moment stale only delays a release: the grace period and a direct GET guard every release.
    let mut config = watcher::Config::default().fields(&selector).any_semantic();
    config.page_size = None;
    let backoff = BackoffPolicy::polling(
        Duration::from_secs(1),
        Duration::from_secs(60),
        Duration::MAX,
    );
    let mut failures: u32 = 0;
    loop {
        let stream = watcher(api.clone(), config.clone());
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = stream.next() => next,
            };
            let now = Instant::now();
            match next {
                // A list in progress changes nothing the readers see until it completes.
                Some(Ok(e @ (watcher::Event::Init | watcher::Event::InitApply(_)))) => {
                    shared.view_mut().apply(e, now);
                }
                Some(Ok(e @ watcher::Event::InitDone)) => {
                    let mut count = 0;
                    shared.update(|v| {
                        v.apply(e, now);
                        count = v.pods.objects.len();
                    });
                    if failures > 0 {
                        tracing::info!(node = %shared.node_name, pods = count, "API server watch is back: pods bound to this node listed again");
                    } else {
                        tracing::info!(node = %shared.node_name, pods = count, "API server watch synced: pods bound to this node listed");
                    }
                    failures = 0;
                }
                Some(Ok(e)) => shared.update(|v| v.apply(e, now)),
                Some(Err(e)) => {
                    shared.update(|v| v.pods.synced = false);
                    shared.metrics.api_server_watch_errors.inc();
                    if is_expired(&e) {
                        // The normal end of a watch whose resourceVersion was compacted away.
                        tracing::info!(node = %shared.node_name, "API server watch expired (410 Gone): listing pods again");
                    } else if is_forbidden(&e) {
                        tracing::error!(error = %e, node = %shared.node_name,
                            "the API server refused the pod list/watch: the eniipam service account needs \
                             get, list and watch on pods; pods are unknown meanwhile (nothing is released)");
                    } else {
                        tracing::warn!(error = %e, node = %shared.node_name, failures = failures + 1,
                            "API server pod watch failed: pods are unknown until it is listed again \
                             (nothing is released meanwhile)");
                    }
                    break;
                }
                None => {
                    shared.update(|v| v.pods.synced = false);
                    break;
                }
            }
        }
        let wait = backoff.jittered(failures, &mut rand::rng());
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    fn list(v: &mut PodsView, pods: Vec<Pod>, now: Instant) {
        v.apply(watcher::Event::Init, now);
        for p in pods {
            v.apply(watcher::Event::InitApply(p), now);
        }
        v.apply(watcher::Event::InitDone, now);
    }

    #[tokio::test(start_paused = true)]
    async fn departures_from_events_and_relists() {
        let mut v = PodsView::default();
        let t0 = Instant::now();
        let pods = vec![
            pod("a", "p1", "u1", "Running"),
            pod("a", "p2", "u2", "Running"),
            pod("a", "p3", "u3", "Running"),
        ];
        list(&mut v, pods, t0);
        assert!(v.pods.synced && v.departed.is_empty());
        let t1 = t0 + Duration::from_secs(5);
        // Replaced by a pod of the same name: the old uid departed.
        v.apply(watcher::Event::Apply(pod("a", "p1", "u1b", "Pending")), t1);
        // Finished.
        v.apply(watcher::Event::Apply(pod("a", "p2", "u2", "Succeeded")), t1);
        // Deleted.
        v.apply(watcher::Event::Delete(pod("a", "p3", "u3", "Running")), t1);
        assert_eq!(v.departed.get("u1"), Some(&t1));
        assert_eq!(v.departed.get("u2"), Some(&t1));
        assert_eq!(v.departed.get("u3"), Some(&t1));
        assert_eq!(v.pods.objects.len(), 2);
        // A late DELETE of an old uid does not remove the new pod of that name.
        v.apply(watcher::Event::Delete(pod("a", "p1", "u1", "Running")), t1);
        assert_eq!(v.pods.objects.get("a/p1").unwrap().uid, "u1b");
        // A re-list that misses a pod: it departed at the re-list.
        let t2 = t1 + Duration::from_secs(5);
        list(&mut v, Vec::new(), t2);
        assert_eq!(v.departed.get("u1b"), Some(&t2));
        assert_eq!(v.departed.get("u1"), Some(&t1), "first departure kept");
        // Old departures are forgotten.
        v.prune(t2 + DEPARTED_KEPT);
        assert!(v.departed.is_empty());
    }

    #[test]
    fn mirror_pods_answer_to_the_static_pod_uid() {
        let mut p = Pod::default();
        p.metadata.namespace = Some("kube-system".into());
        p.metadata.name = Some("etcd-node-a".into());
        p.metadata.uid = Some("api-uid".into());
        p.metadata.annotations = Some(
            [(MIRROR_ANNOTATION.to_owned(), "config-hash".to_owned())]
                .into_iter()
                .collect(),
        );
        let b = BoundPod::from_pod(&p).unwrap();
        assert!(b.has_uid("api-uid") && b.has_uid("config-hash") && !b.has_uid("other"));
        assert_eq!(b.phase, PodPhase::Pending);
        p.metadata.uid = None;
        assert!(BoundPod::from_pod(&p).is_none(), "no uid: not kept");
    }
}
