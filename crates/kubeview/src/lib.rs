//! What one Kubernetes list + watch says, kept as a [`View`]: `T` (what a watcher keeps of each
//! object) by object name, replaced whole at each (re-)list's end so an object deleted while the
//! watch was down does not linger.
//!
//! Its own crate because every API-server watch shares it: the daemon's (the pods bound to the
//! node, the node's ENIConfig, network profiles and namespaces) and the NetworkPolicy crate's
//! (`eniipam-netpol`), which must not depend on the daemon.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::runtime::watcher::Event;

/// What one list + watch says: `T` (what is kept of each object) by object name
/// (`namespace/name` for namespaced objects).
pub struct View<T> {
    /// The objects, behind an `Arc` so that a reader on another task takes a snapshot without
    /// copying the map (a change copies it only while a snapshot is held).
    pub objects: Arc<BTreeMap<String, T>>,
    /// Each kept object's `metadata.uid`, when it has one: a delete removes only the object it
    /// names, not one re-created under the same name since.
    uids: BTreeMap<String, String>,
    /// Objects of a list in progress (between `Init` and `InitDone`), with their uids.
    listing: Option<BTreeMap<String, (T, Option<String>)>>,
    /// A list has completed once (a watcher may clear it after an error, to say the view may be
    /// stale until the next list completes).
    pub synced: bool,
}

impl<T: PartialEq + Clone> Default for View<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: PartialEq + Clone> View<T> {
    pub fn new() -> Self {
        Self {
            objects: Arc::new(BTreeMap::new()),
            uids: BTreeMap::new(),
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
        self.apply_with(event, |o| Some(keep(o)), |_| {})
    }

    /// [`View::apply`] for a watcher that keeps only some objects (`keep` answers `None` for one
    /// it ignores) and follows each change of what is kept: `changed` hears every object whose
    /// kept value differs after the event, as it was and as it is now (a re-list reports each
    /// object it added, replaced or dropped).
    pub fn apply_with<K: kube::Resource>(
        &mut self,
        event: Event<K>,
        keep: impl Fn(&K) -> Option<T>,
        mut changed: impl FnMut(Change<'_, T>),
    ) -> bool {
        let uid = |o: &K| o.meta().uid.clone();
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(kept) = keep(&o) {
                    self.listing
                        .get_or_insert_with(BTreeMap::new)
                        .insert(Self::key_of(&o), (kept, uid(&o)));
                }
                false
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let mut objects = BTreeMap::new();
                self.uids.clear();
                for (key, (kept, uid)) in listed {
                    if let Some(uid) = uid {
                        self.uids.insert(key.clone(), uid);
                    }
                    objects.insert(key, kept);
                }
                let mut any = !self.synced;
                for (key, was) in self.objects.iter() {
                    let now = objects.get(key);
                    if now != Some(was) {
                        any = true;
                        changed(Change {
                            key,
                            was: Some(was),
                            now,
                        });
                    }
                }
                for (key, now) in objects
                    .iter()
                    .filter(|(k, _)| !self.objects.contains_key(*k))
                {
                    any = true;
                    changed(Change {
                        key,
                        was: None,
                        now: Some(now),
                    });
                }
                self.objects = Arc::new(objects);
                self.synced = true;
                any
            }
            Event::Apply(o) => {
                let Some(kept) = keep(&o) else {
                    return false;
                };
                let key = Self::key_of(&o);
                match uid(&o) {
                    Some(u) => self.uids.insert(key.clone(), u),
                    None => self.uids.remove(&key),
                };
                if self.objects.get(&key) == Some(&kept) {
                    return false;
                }
                let objects = Arc::make_mut(&mut self.objects);
                let was = objects.insert(key.clone(), kept);
                changed(Change {
                    key: &key,
                    was: was.as_ref(),
                    now: objects.get(&key),
                });
                true
            }
            Event::Delete(o) => {
                let key = Self::key_of(&o);
                let same = match (uid(&o), self.uids.get(&key)) {
                    (Some(deleted), Some(kept)) => deleted == *kept,
                    _ => true,
                };
                if !same || !self.objects.contains_key(&key) {
                    return false;
                }
                self.uids.remove(&key);
                let was = Arc::make_mut(&mut self.objects).remove(&key);
                changed(Change {
                    key: &key,
                    was: was.as_ref(),
                    now: None,
                });
                true
            }
        }
    }
}

/// One object's change in a [`View`] ([`View::apply_with`]): what was kept of it, and what is now
/// (`None`: not in the view).
pub struct Change<'a, T> {
    pub key: &'a str,
    pub was: Option<&'a T>,
    pub now: Option<&'a T>,
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

    fn with_uid(mut n: Namespace, uid: &str) -> Namespace {
        n.metadata.uid = Some(uid.into());
        n
    }

    /// What a follower of the changes hears, event by event and across a re-list; a delete of an
    /// object re-created under its name since leaves the new one; a snapshot taken before a change
    /// does not see it.
    #[test]
    fn changes_are_reported_and_deletes_name_their_object() {
        let keep = |n: &Namespace| {
            let l = n.metadata.labels.as_ref().map(|l| l["l"].clone())?;
            (!l.is_empty()).then_some(l)
        };
        let mut v: View<String> = View::new();
        let mut heard: Vec<(String, Option<String>, Option<String>)> = Vec::new();
        let mut apply = |v: &mut View<String>, e: Event<Namespace>| {
            v.apply_with(e, keep, |c| {
                heard.push((c.key.into(), c.was.cloned(), c.now.cloned()));
            })
        };
        apply(&mut v, Event::Init);
        apply(&mut v, Event::InitApply(with_uid(ns("a", "x"), "a1")));
        apply(&mut v, Event::InitApply(ns("ignored", "")));
        assert!(apply(&mut v, Event::InitDone));
        let before = v.objects.clone();
        assert!(apply(&mut v, Event::Apply(with_uid(ns("a", "y"), "a2"))));
        assert!(!apply(&mut v, Event::Apply(ns("ignored", ""))), "not kept");
        assert_eq!(before.get("a").map(String::as_str), Some("x"), "a snapshot");
        assert!(
            !apply(&mut v, Event::Delete(with_uid(ns("a", "x"), "a1"))),
            "the delete of the object a re-created one replaced"
        );
        assert_eq!(v.objects.get("a").map(String::as_str), Some("y"));
        apply(&mut v, Event::Init);
        apply(&mut v, Event::InitApply(with_uid(ns("b", "z"), "b1")));
        assert!(apply(&mut v, Event::InitDone));
        assert!(apply(&mut v, Event::Delete(with_uid(ns("b", "z"), "b1"))));
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(
            heard,
            [
                ("a".into(), None, s("x")),
                ("a".into(), s("x"), s("y")),
                ("a".into(), s("y"), None),
                ("b".into(), None, s("z")),
                ("b".into(), s("z"), None),
            ]
        );
    }
}
