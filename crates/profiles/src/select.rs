//! Which profile a pod selects: the annotation [`ANNOTATION`] on the pod, else on its namespace
//! ([`pod_profile`]); and the namespaces' annotations, watched so the daemon can answer on a CNI ADD
//! without a request to the API server ([`Namespaces`], [`spawn_namespaces`]).
//!
//! The pod's own annotation comes from the pod watch the daemon already runs
//! (`reconcile::api_server`'s `BoundPod::network`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use eniipam_kubeview::View;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::task::JoinHandle;

/// The annotation that names a pod's network profile, on the pod or on its namespace.
pub const ANNOTATION: &str = "eniipam.io/network";

/// The profile a pod selects, given its annotations and its namespace's: the pod's
/// [`ANNOTATION`] wins over its namespace's. An empty value says "the default network" explicitly
/// (so a pod opts out of its namespace's profile): `None`, as when neither carries the annotation.
pub fn pod_profile(
    pod_annotations: Option<&BTreeMap<String, String>>,
    namespace_annotations: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let of = |a: Option<&BTreeMap<String, String>>| a.and_then(|a| a.get(ANNOTATION)).cloned();
    let chosen = of(pod_annotations).or_else(|| of(namespace_annotations))?;
    let chosen = chosen.trim();
    (!chosen.is_empty()).then(|| chosen.to_owned())
}

/// Each namespace's [`ANNOTATION`], as the namespace watch says now. Cloning is cheap.
#[derive(Clone, Default)]
pub struct Namespaces {
    inner: Arc<RwLock<View<Option<String>>>>,
}

impl std::fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.inner.read().unwrap();
        f.debug_struct("Namespaces")
            .field("synced", &v.synced)
            .field(
                "annotated",
                &v.objects
                    .iter()
                    .filter(|(_, a)| a.is_some())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Namespaces {
    /// Namespace `ns`'s annotation value (`Some("")`: explicitly the default network), `None` when
    /// it has none or is unknown (see [`Self::synced`]).
    pub fn annotation_of(&self, ns: &str) -> Option<String> {
        self.inner
            .read()
            .unwrap()
            .objects
            .get(ns)
            .cloned()
            .flatten()
    }

    /// The profile namespace `ns` selects for its pods (an empty annotation: none).
    pub fn profile_of(&self, ns: &str) -> Option<String> {
        let a = self
            .annotation_of(ns)
            .map(|v| BTreeMap::from([(ANNOTATION.to_owned(), v)]));
        pod_profile(None, a.as_ref())
    }

    /// The profile of a pod in `ns` whose own annotation value is `pod_annotation` (from
    /// `BoundPod::network`): the pod's wins.
    pub fn pod_profile(&self, ns: &str, pod_annotation: Option<&str>) -> Option<String> {
        let pod = pod_annotation.map(|v| BTreeMap::from([(ANNOTATION.to_owned(), v.to_owned())]));
        let nsa = self
            .annotation_of(ns)
            .map(|v| BTreeMap::from([(ANNOTATION.to_owned(), v)]));
        pod_profile(pod.as_ref(), nsa.as_ref())
    }

    /// A list of the namespaces has completed: a namespace absent here has no annotation.
    pub fn synced(&self) -> bool {
        self.inner.read().unwrap().synced
    }
}

/// Watches every namespace, keeping only its [`ANNOTATION`]: a cluster has tens to a few thousand
/// namespaces, and a namespace is small, so one list + watch costs little (the pods of a namespace
/// may land on any node). Errors are logged and retried; the view keeps its last state meanwhile.
pub fn spawn_namespaces(client: kube::Client) -> (Namespaces, JoinHandle<()>) {
    let namespaces = Namespaces::default();
    let view = namespaces.inner.clone();
    let api: Api<Namespace> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let task = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            match event {
                Ok(e) => {
                    let changed = view.write().unwrap().apply(e, |ns: &Namespace| {
                        ns.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(ANNOTATION))
                            .cloned()
                    });
                    if changed {
                        tracing::debug!("namespace annotations {ANNOTATION} changed");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching namespaces for {ANNOTATION} failed; retrying (may the daemon list and watch namespaces?)");
                }
            }
        }
    });
    (namespaces, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (ANNOTATION.to_owned(), v.to_owned()),
            ("other".to_owned(), "x".to_owned()),
        ])
    }

    #[test]
    fn the_pod_wins_over_its_namespace_and_empty_means_the_default_network() {
        let none = BTreeMap::new();
        assert_eq!(
            pod_profile(Some(&a("db")), Some(&a("app"))),
            Some("db".into())
        );
        assert_eq!(
            pod_profile(Some(&none), Some(&a("app"))),
            Some("app".into())
        );
        assert_eq!(pod_profile(None, Some(&a("app"))), Some("app".into()));
        assert_eq!(pod_profile(Some(&a("db")), None), Some("db".into()));
        assert_eq!(
            pod_profile(Some(&a("")), Some(&a("app"))),
            None,
            "the pod opts out"
        );
        assert_eq!(pod_profile(Some(&a(" ")), Some(&a("app"))), None);
        assert_eq!(pod_profile(None, Some(&a(""))), None);
        assert_eq!(pod_profile(Some(&none), Some(&none)), None);
        assert_eq!(pod_profile(None, None), None);
    }
}
