//! The watchers: kube's `watcher` (paged list, watch from its resourceVersion, bookmarks, re-list
//! on 410 Gone, default backoff) over every `NetworkProfile` ([`spawn`]) and every namespace
//! ([`super::select::spawn_namespaces`]), each kept as a [`View`] of what the daemon needs of an
//! object, keyed by name.
//!
//! As in `custom_networking`'s watcher, the view is replaced whole at each (re-)list's end
//! (`InitDone`), so an object deleted while the watch was down does not linger; errors (API server
//! away, RBAC, the CRD not installed: 404) are logged and retried, and what was published stays: the
//! cluster's profiles did not change because the daemon stopped seeing them.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;

use super::profile::{NetworkProfile, ProfileSpec};

/// What one list + watch says: `T` (what is kept of each object) by object name
/// (`namespace/name` for namespaced objects).
pub(crate) struct View<T> {
    pub objects: BTreeMap<String, T>,
    /// Objects of a list in progress (between `Init` and `InitDone`).
    listing: Option<BTreeMap<String, T>>,
    /// A list has completed once.
    pub synced: bool,
}

impl<T: PartialEq> Default for View<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: PartialEq> View<T> {
    pub fn new() -> Self {
        Self {
            objects: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }

    /// The key of `object`: its name, or `namespace/name` for a namespaced object.
    pub fn key_of<K: kube::Resource>(object: &K) -> String {
        let meta = object.meta();
        let name = meta.name.clone().unwrap_or_default();
        match &meta.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        }
    }

    /// Applies one event, keeping `keep(object)` of each; true when the view changed (or the first
    /// list completed).
    pub fn apply<K: kube::Resource>(&mut self, event: Event<K>, keep: impl Fn(&K) -> T) -> bool {
        let name = |o: &K| Self::key_of(o);
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply(o) => {
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name(&o), keep(&o));
                false
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let changed = !self.synced || listed != self.objects;
                self.objects = listed;
                self.synced = true;
                changed
            }
            Event::Apply(o) => {
                let (n, kept) = (name(&o), keep(&o));
                if self.objects.get(&n) == Some(&kept) {
                    return false;
                }
                self.objects.insert(n, kept);
                true
            }
            Event::Delete(o) => self.objects.remove(&name(&o)).is_some(),
        }
    }
}

/// The cluster's network profiles, as the API server says now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profiles {
    /// A list of the profiles has completed once: until then a pod's profile is neither known nor
    /// known to be missing.
    pub known: bool,
    /// The usable profiles, by name.
    pub valid: BTreeMap<String, ProfileSpec>,
    /// The unusable ones, by name: why (naming the object and the field).
    pub invalid: BTreeMap<String, String>,
}

impl Profiles {
    fn of(view: &View<Result<ProfileSpec, String>>) -> Self {
        let mut p = Self {
            known: view.synced,
            ..Self::default()
        };
        for (name, judged) in &view.objects {
            match judged {
                Ok(spec) => {
                    p.valid.insert(name.clone(), spec.clone());
                }
                Err(why) => {
                    p.invalid.insert(name.clone(), why.clone());
                }
            }
        }
        p
    }
}

/// Watches the `NetworkProfile`s and publishes [`Profiles`] whenever they change (not on a
/// re-list that finds the same, nor on a change of something the daemon does not read).
pub fn spawn(client: kube::Client) -> (notify::Receiver<Profiles>, JoinHandle<()>) {
    let (tx, rx) = notify::channel(Profiles::default());
    let api: Api<NetworkProfile> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let task = tokio::spawn(async move {
        let mut view = View::new();
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(e) => view.apply(e, NetworkProfile::spec),
                Err(e) => {
                    tracing::warn!(error = %e, "watching NetworkProfiles (eniipam.io/v1alpha1) failed; retrying (is deploy/networkprofile-crd.yaml applied, and may the daemon list and watch networkprofiles?)");
                    false
                }
            };
            if !changed {
                continue;
            }
            let now = Profiles::of(&view);
            tx.send_if_modified(|old| {
                if *old == now {
                    return false;
                }
                for (name, why) in &now.invalid {
                    if old.invalid.get(name) != Some(why) {
                        tracing::warn!(profile = %name, %why, "network profile unusable");
                    }
                }
                tracing::info!(valid = ?now.valid.keys().collect::<Vec<_>>(),
                    invalid = ?now.invalid.keys().collect::<Vec<_>>(), "network profiles changed");
                *old = now;
                true
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn ns(name: &str, label: &str) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("l".into(), label.into())])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }
    }

    /// What a change is: a change of what is kept, not of the object (so a relabelled namespace
    /// or a re-list that finds the same publishes nothing).
    #[test]
    fn only_changes_of_what_is_kept_count() {
        let keep = |n: &Namespace| n.metadata.labels.as_ref().map(|l| l["l"].len());
        let mut v: View<Option<usize>> = View::new();
        assert!(!v.apply(Event::Init, keep));
        assert!(!v.apply(Event::InitApply(ns("a", "x")), keep));
        assert!(v.apply(Event::InitDone, keep), "the first list completes");
        assert!(
            !v.apply(Event::Apply(ns("a", "y")), keep),
            "same length kept"
        );
        assert!(v.apply(Event::Apply(ns("a", "yy")), keep));
        assert!(v.apply(Event::Apply(ns("b", "x")), keep), "a new object");
        assert!(!v.apply(Event::Init, keep));
        assert!(!v.apply(Event::InitApply(ns("a", "zz")), keep));
        assert!(!v.apply(Event::InitApply(ns("b", "z")), keep));
        assert!(
            !v.apply(Event::InitDone, keep),
            "a re-list that finds the same"
        );
        assert!(!v.apply(Event::Init, keep));
        assert!(!v.apply(Event::InitApply(ns("b", "z")), keep));
        assert!(
            v.apply(Event::InitDone, keep),
            "a deleted while not watched"
        );
        assert_eq!(v.objects.keys().collect::<Vec<_>>(), ["b"]);
        assert!(v.apply(Event::Delete(ns("b", "z")), keep));
        assert!(!v.apply(Event::Delete(ns("b", "z")), keep));
    }
}
