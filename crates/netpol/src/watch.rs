//! The cluster as NetworkPolicy sees it, kept from three list + watches of the API server (kube's
//! `watcher`: paged list, watch from its resourceVersion, bookmarks, re-list on 410 Gone, default
//! backoff): every NetworkPolicy, every pod of the cluster (a policy's peers live on any node) and
//! every namespace (`namespaceSelector` reads their labels).
//!
//! Each watch keeps only what the compiler reads ([`pod_view`], a policy's name and spec, a
//! namespace's labels), so a change of anything else (a pod's conditions, a resourceVersion) wakes
//! nobody. Every change that matters bumps a generation ([`ClusterWatch::subscribe`]) and records
//! when the oldest change not yet enforced happened ([`ClusterWatch::take_pending`]), for the
//! enforcer's lag. Errors (API server away, RBAC) are logged and retried; what was seen stays.
//!
//! A pod that reaches the daemon in a CNI ADD before the pod watch shows it is fetched with a GET
//! and remembered ([`ClusterWatch::remember`]) until the watch speaks of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::compile::{Cluster, NamedPort, PodView, Protocol};
use eniipam_kubeview::View;

/// What the policies need of a pod: namespace, name, labels, addresses (none once it has
/// terminated: its IP may already be another pod's), host networking and named container ports
/// (its containers' and its sidecars': init containers with `restartPolicy: Always`; a plain init
/// container has ended before the pod serves).
pub fn pod_view(pod: &Pod) -> PodView {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let terminated = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let mut ips = Vec::new();
    if !terminated && let Some(s) = status {
        let listed = s.pod_ips.iter().flatten().map(|p| p.ip.as_str());
        for ip in listed.chain(s.pod_ip.as_deref()) {
            if let Ok(ip) = ip.parse()
                && !ips.contains(&ip)
            {
                ips.push(ip);
            }
        }
    }
    // Sidecars (init containers with `restartPolicy: Always`) run beside the containers for the
    // pod's life: their named ports count alike.
    let sidecars = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let ports = spec
        .into_iter()
        .flat_map(|s| s.containers.iter())
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let name = p.name.clone()?;
            let protocol = Protocol::parse(p.protocol.as_deref()).ok()?;
            let port = u16::try_from(p.container_port).ok()?;
            Some(NamedPort {
                name,
                protocol,
                port,
            })
        })
        .collect();
    PodView {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ips,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        ports,
    }
}

/// A policy as the compiler reads it: namespace, name and spec.
fn policy_kept(p: &NetworkPolicy) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            namespace: p.metadata.namespace.clone(),
            name: p.metadata.name.clone(),
            ..ObjectMeta::default()
        },
        spec: p.spec.clone(),
    }
}

fn labels_kept(n: &Namespace) -> BTreeMap<String, String> {
    let mut labels = n.metadata.labels.clone().unwrap_or_default();
    // The API server sets it on every namespace; a watch of an older server may lack it.
    if let Some(name) = &n.metadata.name {
        labels
            .entry("kubernetes.io/metadata.name".into())
            .or_insert_with(|| name.clone());
    }
    labels
}

#[derive(Default)]
struct State {
    namespaces: View<BTreeMap<String, String>>,
    pods: View<PodView>,
    policies: View<NetworkPolicy>,
    /// Pods fetched on an ADD that the pod watch has not shown yet, by `namespace/name`.
    fetched: BTreeMap<String, PodView>,
    generation: u64,
    /// When the oldest change not yet taken by the enforcer happened.
    pending: Option<Instant>,
}

impl State {
    fn changed(&mut self, tx: &notify::Sender<u64>) {
        self.generation += 1;
        self.pending.get_or_insert_with(Instant::now);
        tx.send_replace(self.generation);
    }
}

/// The three views and the generation of their changes. Cloning is cheap.
#[derive(Clone)]
pub struct ClusterWatch {
    state: Arc<Mutex<State>>,
    tx: notify::Sender<u64>,
}

impl Default for ClusterWatch {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            tx: notify::channel(0).0,
        }
    }
}

impl ClusterWatch {
    /// Starts the three watches with `client`.
    pub fn spawn(client: kube::Client) -> (Self, Vec<JoinHandle<()>>) {
        let this = Self::default();
        let tasks = vec![
            this.follow(
                Api::<NetworkPolicy>::all(client.clone()),
                "NetworkPolicies (networking.k8s.io/v1)",
                |s| &mut s.policies,
                policy_kept,
            ),
            this.follow(
                Api::<Pod>::all(client.clone()),
                "pods (every namespace)",
                |s| &mut s.pods,
                pod_view,
            ),
            this.follow(
                Api::<Namespace>::all(client),
                "namespaces",
                |s| &mut s.namespaces,
                labels_kept,
            ),
        ];
        (this, tasks)
    }

    fn follow<K, T>(
        &self,
        api: Api<K>,
        what: &'static str,
        view: fn(&mut State) -> &mut View<T>,
        keep: fn(&K) -> T,
    ) -> JoinHandle<()>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        T: PartialEq + Clone + Send + 'static,
    {
        let this = self.clone();
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "network policy: watching {what} failed; retrying (may the daemon list and watch them? see deploy/rbac.yaml)");
                        continue;
                    }
                };
                let mut s = this.state.lock().unwrap_or_else(|p| p.into_inner());
                // A pod fetched on an ADD gives way to what the watch says of it.
                match &event {
                    Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                        let key = View::<T>::key_of(o);
                        s.fetched.remove(&key);
                    }
                    Event::Init | Event::InitDone => {}
                }
                if view(&mut s).apply(event, keep) {
                    s.changed(&this.tx);
                }
            }
        })
    }

    /// Whether all three lists have completed once (before, the cluster is not known).
    pub fn synced(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.namespaces.synced && s.pods.synced && s.policies.synced
    }

    /// The cluster now: namespaces, pods (fetched ones included) and policies.
    pub fn cluster(&self) -> Cluster {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        Cluster {
            namespaces: (*s.namespaces.objects).clone(),
            pods: s
                .pods
                .objects
                .values()
                .chain(s.fetched.values())
                .cloned()
                .collect(),
            policies: s.policies.objects.values().cloned().collect(),
        }
    }

    /// How many NetworkPolicies the cluster has.
    pub fn policy_count(&self) -> usize {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.policies.objects.len()
    }

    /// Pod `namespace/name` as known (watched or fetched).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        let key = format!("{namespace}/{name}");
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.pods
            .objects
            .get(&key)
            .or_else(|| s.fetched.get(&key))
            .cloned()
    }

    /// Remembers a pod fetched with a GET (the watch has not shown it yet): a change.
    pub fn remember(&self, pod: PodView) {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.pods.objects.contains_key(&key) {
            return;
        }
        s.fetched.insert(key, pod);
        s.changed(&self.tx);
    }

    /// Marks a change made outside the watches (a pod ADDed or DELeted here): a new generation.
    pub fn touch(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.changed(&self.tx);
        s.generation
    }

    /// The generation now, and when its oldest change not yet taken happened (taken now).
    pub fn take_pending(&self) -> (u64, Option<Instant>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.generation, s.pending.take())
    }

    /// Puts back the time of a change [`Self::take_pending`] took whose sync failed.
    pub fn restore_pending(&self, since: Option<Instant>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = since {
            s.pending = Some(s.pending.map_or(t, |p| p.min(t)));
        }
    }

    /// The generation, on every change.
    pub fn subscribe(&self) -> notify::Receiver<u64> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodIP, PodSpec, PodStatus};

    use super::*;

    fn pod(phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("x".into()),
                name: Some("a".into()),
                labels: Some(BTreeMap::from([("pod".into(), "a".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![
                        ContainerPort {
                            name: Some("serve-80-udp".into()),
                            container_port: 80,
                            protocol: Some("UDP".into()),
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            container_port: 81,
                            ..ContainerPort::default()
                        },
                    ]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: Some("10.0.0.5".into()),
                pod_ips: Some(vec![
                    PodIP {
                        ip: "10.0.0.5".into(),
                    },
                    PodIP {
                        ip: "2600::5".into(),
                    },
                ]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn a_pod_is_kept_as_the_policies_read_it() {
        let v = pod_view(&pod("Running"));
        assert_eq!((v.namespace.as_str(), v.name.as_str()), ("x", "a"));
        assert_eq!(v.labels["pod"], "a");
        assert_eq!(
            v.ips,
            [
                "10.0.0.5".parse::<std::net::IpAddr>().unwrap(),
                "2600::5".parse().unwrap()
            ]
        );
        assert_eq!(
            v.ports,
            [NamedPort {
                name: "serve-80-udp".into(),
                protocol: Protocol::Udp,
                port: 80
            }],
            "only named ports"
        );
        assert!(!v.host_network);
        for phase in ["Succeeded", "Failed"] {
            assert!(
                pod_view(&pod(phase)).ips.is_empty(),
                "a {phase} pod's IP may be another pod's"
            );
        }
    }

    /// Issue 47, case 9: a native sidecar's named port counts like a container's; a plain init
    /// container's does not (it has exited before the pod serves).
    #[test]
    fn a_sidecars_named_ports_count_like_a_containers() {
        let mut p = pod("Running");
        let port = |name: &str, port: i32| ContainerPort {
            name: Some(name.into()),
            container_port: port,
            ..ContainerPort::default()
        };
        p.spec.as_mut().unwrap().init_containers = Some(vec![
            Container {
                name: "proxy".into(),
                restart_policy: Some("Always".into()),
                ports: Some(vec![port("proxy-http", 15001)]),
                ..Container::default()
            },
            Container {
                name: "setup".into(),
                ports: Some(vec![port("setup-http", 9000)]),
                ..Container::default()
            },
        ]);
        let view = pod_view(&p);
        let names: Vec<&str> = view.ports.iter().map(|n| n.name.as_str()).collect();
        assert!(
            view.ports.contains(&NamedPort {
                name: "proxy-http".into(),
                protocol: Protocol::Tcp,
                port: 15001
            }),
            "the sidecar's named port is missing: {names:?}"
        );
        assert!(
            !names.contains(&"setup-http"),
            "a plain init container's port counted: {names:?}"
        );
        assert!(names.contains(&"serve-80-udp"), "{names:?}");
    }

    #[test]
    fn a_fetched_pod_counts_until_the_watch_speaks_of_it() {
        let w = ClusterWatch::default();
        let rx = w.subscribe();
        w.remember(pod_view(&pod("Pending")));
        assert_eq!(*rx.borrow(), 1, "a change");
        assert!(w.pod("x", "a").is_some());
        assert_eq!(w.cluster().pods.len(), 1);
        let (g, pending) = w.take_pending();
        assert_eq!(g, 1);
        assert!(pending.is_some());
        assert!(w.take_pending().1.is_none(), "taken");
        assert!(!w.synced());
    }
}
