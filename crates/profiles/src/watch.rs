//! The watchers: kube's `watcher` (paged list, watch from its resourceVersion, bookmarks, re-list
//! on 410 Gone, default backoff) over every `NetworkProfile` ([`spawn`]) and every namespace
//! ([`super::select::spawn_namespaces`]), each kept as a [`View`] of what the daemon needs of an
//! object, keyed by name (`eniipam-kubeview`'s, shared with the NetworkPolicy crate).
//!
//! As in `custom_networking`'s watcher, the view is replaced whole at each (re-)list's end
//! (`InitDone`), so an object deleted while the watch was down does not linger; errors (API server
//! away, RBAC, the CRD not installed: 404) are logged and retried, and what was published stays: the
//! cluster's profiles did not change because the daemon stopped seeing them.

use std::collections::BTreeMap;

use eniipam_kubeview::View;
use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;

use super::profile::{NetworkProfile, ProfileSpec};

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
        for (name, judged) in view.objects.iter() {
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
