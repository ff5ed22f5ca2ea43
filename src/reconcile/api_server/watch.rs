//! The pods bound to this node: one list + watch (`fieldSelector=spec.nodeName=<node>`) kept as a
//! compact, cheaply cloned view, and whether that view may be trusted to say "gone".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

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
    pub pods: Arc<BTreeMap<PodKey, BoundPod>>,
    /// Bumped at every change of the view (or of `synced`).
    pub generation: u64,
}

impl BoundPods {
    pub fn get(&self, namespace: &str, name: &str) -> Option<&BoundPod> {
        self.pods.get(&PodKey::new(namespace, name))
    }
}

#[derive(Default)]
struct View {
    synced: bool,
    pods: Arc<BTreeMap<PodKey, BoundPod>>,
    generation: u64,
    /// When each pod UID stopped being a live pod on this node, as the watch saw it: deleted, replaced
    /// by another pod of the same name, or finished.
    departed: HashMap<String, Instant>,
}

impl View {
    fn depart(&mut self, uid: &str, now: Instant) {
        self.departed.entry(uid.to_owned()).or_insert(now);
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

    /// A complete list replaces the view; pods missing from it (or listed with another uid, or now
    /// finished) departed now.
    fn replace_all(&mut self, pods: BTreeMap<PodKey, BoundPod>, now: Instant) {
        let old = std::mem::take(&mut self.pods);
        for (key, was) in old.iter() {
            match pods.get(key) {
                None => self.depart(&was.uid, now),
                Some(p) if p.uid != was.uid => self.depart(&was.uid, now),
                Some(p) if p.phase.is_terminal() && !was.phase.is_terminal() => {
                    self.depart(&p.uid, now)
                }
                Some(_) => {}
            }
        }
        self.pods = Arc::new(pods);
        self.synced = true;
        self.prune(now);
    }

    fn apply(&mut self, pod: BoundPod, now: Instant) {
        match self.pods.get(&pod.key) {
            Some(was) if was.uid != pod.uid => {
                let uid = was.uid.clone();
                self.depart(&uid, now);
            }
            Some(was) if pod.phase.is_terminal() && !was.phase.is_terminal() => {
                self.depart(&pod.uid, now)
            }
            _ => {}
        }
        Arc::make_mut(&mut self.pods).insert(pod.key.clone(), pod);
    }

    fn delete(&mut self, pod: &BoundPod, now: Instant) {
        if self.pods.get(&pod.key).is_some_and(|p| p.uid == pod.uid) {
            Arc::make_mut(&mut self.pods).remove(&pod.key);
        }
        self.depart(&pod.uid, now);
    }
}

struct Shared {
    node_name: String,
    view: RwLock<View>,
    changed: notify::Sender<u64>,
    metrics: Metrics,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut View)) {
        let (generation, synced, count) = {
            let mut v = self.view.write().unwrap_or_else(|e| e.into_inner());
            f(&mut v);
            v.generation += 1;
            (v.generation, v.synced, v.pods.len())
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
            view: RwLock::new(View::default()),
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
            synced: v.synced,
            pods: v.pods.clone(),
            generation: v.generation,
        }
    }

    /// Whether the view is synced (see [`BoundPods::synced`]).
    pub fn is_synced(&self) -> bool {
        self.shared
            .view
            .read()
            .unwrap_or_else(|e| e.into_inner())
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
        let mut listing: Option<BTreeMap<PodKey, BoundPod>> = None;
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = stream.next() => next,
            };
            let now = Instant::now();
            match next {
                Some(Ok(watcher::Event::Init)) => listing = Some(BTreeMap::new()),
                Some(Ok(watcher::Event::InitApply(pod))) => {
                    if let (Some(l), Some(p)) = (listing.as_mut(), BoundPod::from_pod(&pod)) {
                        l.insert(p.key.clone(), p);
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    let pods = listing.take().unwrap_or_default();
                    let count = pods.len();
                    shared.update(|v| v.replace_all(pods, now));
                    if failures > 0 {
                        tracing::info!(node = %shared.node_name, pods = count, "API server watch is back: pods bound to this node listed again");
                    } else {
                        tracing::info!(node = %shared.node_name, pods = count, "API server watch synced: pods bound to this node listed");
                    }
                    failures = 0;
                }
                Some(Ok(watcher::Event::Apply(pod))) => {
                    if let Some(p) = BoundPod::from_pod(&pod) {
                        shared.update(|v| v.apply(p, now));
                    }
                }
                Some(Ok(watcher::Event::Delete(pod))) => {
                    if let Some(p) = BoundPod::from_pod(&pod) {
                        shared.update(|v| v.delete(&p, now));
                    }
                }
                Some(Err(e)) => {
                    shared.update(|v| v.synced = false);
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
                    shared.update(|v| v.synced = false);
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

    fn pod(ns: &str, name: &str, uid: &str, phase: PodPhase) -> BoundPod {
        BoundPod {
            key: PodKey::new(ns, name),
            uid: uid.into(),
            mirror_of: None,
            host_network: false,
            phase,
            deleting: false,
            network: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn departures_from_events_and_relists() {
        let mut v = View::default();
        let t0 = Instant::now();
        v.replace_all(
            [
                pod("a", "p1", "u1", PodPhase::Running),
                pod("a", "p2", "u2", PodPhase::Running),
                pod("a", "p3", "u3", PodPhase::Running),
            ]
            .into_iter()
            .map(|p| (p.key.clone(), p))
            .collect(),
            t0,
        );
        assert!(v.synced && v.departed.is_empty());
        let t1 = t0 + Duration::from_secs(5);
        // Replaced by a pod of the same name: the old uid departed.
        v.apply(pod("a", "p1", "u1b", PodPhase::Pending), t1);
        // Finished.
        v.apply(pod("a", "p2", "u2", PodPhase::Succeeded), t1);
        // Deleted.
        v.delete(&pod("a", "p3", "u3", PodPhase::Running), t1);
        assert_eq!(v.departed.get("u1"), Some(&t1));
        assert_eq!(v.departed.get("u2"), Some(&t1));
        assert_eq!(v.departed.get("u3"), Some(&t1));
        assert_eq!(v.pods.len(), 2);
        // A late DELETE of an old uid does not remove the new pod of that name.
        v.delete(&pod("a", "p1", "u1", PodPhase::Running), t1);
        assert_eq!(v.pods.get(&PodKey::new("a", "p1")).unwrap().uid, "u1b");
        // A re-list that misses a pod: it departed at the re-list.
        let t2 = t1 + Duration::from_secs(5);
        v.replace_all(BTreeMap::new(), t2);
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
