//! What one Kubernetes list + watch says, kept as a [`View`]: `T` (what a watcher keeps of each
//! object) by object name, replaced whole at each (re-)list's end so an object deleted while the
//! watch was down does not linger.
//!
//! Its own crate because two rooms share it: the daemon's network profiles (`eniipam`'s
//! `network_profiles`) and the NetworkPolicy crate (`eniipam-netpol`), which must not depend on
//! the daemon.

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;

/// What one list + watch says: `T` (what is kept of each object) by object name
/// (`namespace/name` for namespaced objects).
pub struct View<T> {
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
