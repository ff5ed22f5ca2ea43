//! The controller: the cluster's `NetworkProfile`s, as [`crate::watch`] reads them, checked against
//! EC2 for this node ([`crate::check`]) and handed to the pool through [`ProfileSink`]; each pod's
//! profile answered on ADD ([`PodProfiles`]); and each profile's total slots advertised on the node
//! (`eniipam.io/network-<name>`, [`crate::resources`]). [`start`] starts it all.
//!
//! - **Checking**: on every change of the profiles, and every [`RECHECK`] too (a tag-selected subnet
//!   may have been replaced, a group deleted), see [`crate::check`]. EC2 failing transiently keeps
//!   each profile's previous answer and tries again with back-off.
//! - **Groups follow the profile**: after each check, [`crate::check::sync_groups`]; when it changed
//!   an ENI the next check comes after [`SETTLE`].
//! - **Selecting**: on a new ADD the pod's annotation comes from the daemon's pod watch
//!   ([`KnownPods`]: the pod is bound before the runtime makes its sandbox), else from one GET of the
//!   pod; its namespace's from the namespace watch, else one GET. A pod naming a profile that does
//!   not exist, is invalid or is unusable here gets [`SelectError::NotUsable`] naming the profile and
//!   why (the daemon answers CNI error 11); nothing is allocated.
//! - **Advertising**: every [`PUBLISH_EVERY`] the pool's total slots per profile
//!   ([`ProfileSink::totals`]: they move with the profile's ENIs, not its pods; 0 for a profile that
//!   is not usable here) are compared with what was published, and a change is patched onto the node.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use eniipam_api::model::PodRef;
use eniipam_cloud::backoff::RetryPause;
use eniipam_cloud::{Cloud, NodeContext};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::check::{CheckedProfile, Judged, judge, sync_groups};
use crate::{ANNOTATION, EgressMode, Namespaces, Profiles, pod_profile};

/// After ENIs were brought to their profile's groups, the next check comes this soon.
pub const SETTLE: Duration = Duration::from_secs(30);

/// The profiles are checked against EC2 again this often, changed or not.
pub const RECHECK: Duration = Duration::from_secs(600);

/// The node's extended resources follow the pool this often (a PATCH only when a number changed).
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// How long startup waits for the profiles' first check (see [`PodProfiles::first_answer`]): as
/// long as it waits for custom networking's first answer.
pub const FIRST_ANSWER: Duration = Duration::from_secs(10);

/// How long an ADD waits for the API server when the watches do not know the pod or its namespace.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// EC2 back-off while the profiles cannot be checked: doubling from the first, up to the last.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Where the checked profiles go, and where their capacity comes from: the pool (and the feature's
/// gauge). The daemon implements it over its pool and metrics.
pub trait ProfileSink: Send + Sync + 'static {
    /// The profiles the node serves now (the usable ones), by name.
    fn set_profiles(&self, usable: BTreeMap<String, CheckedProfile>);
    /// Per profile the pool serves: the pods the node can hold for it in all.
    fn totals(&self) -> BTreeMap<String, u32>;
    /// The per-profile gauge `eniipam_network_profile_usable`: set (`Some`), or removed for a
    /// deleted profile (`None`).
    fn set_usable(&self, profile: &str, usable: Option<bool>);
}

/// The pods the daemon's own pod watch knows (bound to this node).
pub trait KnownPods: Send + Sync + 'static {
    /// `pod`'s [`ANNOTATION`] as the watch has it (`Some(None)`: it has none), when the watch knows
    /// the pod by namespace and name and, unless `pod.uid` is empty, by uid; `None` otherwise.
    fn network_annotation(&self, pod: &PodRef) -> Option<Option<String>>;
}

/// Why a pod's profile cannot be answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectError {
    /// The API server could not tell the pod's or its namespace's annotation.
    Lookup(String),
    /// The pod selects `profile` and it cannot serve pods here: why, naming it.
    NotUsable { profile: String, why: String },
}

/// Answers the question "which profile does this pod select?" (see the module docs).
pub struct PodProfiles {
    judged: Arc<RwLock<Judged>>,
    /// Turns true once the cluster's profiles have been judged (the first check done).
    known: watch::Receiver<bool>,
    /// The cluster's profiles as listed (each one's egress mode).
    listed: watch::Receiver<Profiles>,
    namespaces: Namespaces,
    pods: Option<Arc<dyn KnownPods>>,
    client: kube::Client,
}

impl PodProfiles {
    /// Waits up to [`FIRST_ANSWER`] for the profiles' first check, so the first pods do not meet
    /// "not known yet" (the runtime would retry them; this is only quicker).
    pub async fn first_answer(&self) {
        let mut known = self.known.clone();
        // The checker gone (the daemon stopping) ends the wait as well: nothing will be known.
        if tokio::time::timeout(FIRST_ANSWER, known.wait_for(|k| *k))
            .await
            .is_err()
        {
            tracing::warn!(wait = ?FIRST_ANSWER, "network profiles: the cluster's NetworkProfiles are not known yet (API server slow or unreachable, or the CRD is not applied); pods that select one get CNI error 11 until they are");
        }
    }

    /// The profile `pod` selects (`None`: the node's default pod network), or why it cannot be
    /// answered or served.
    pub async fn select(&self, pod: &PodRef) -> Result<Option<String>, SelectError> {
        if pod.namespace.is_empty() || pod.name.is_empty() {
            // Not a Kubernetes pod (no K8S_POD_NAMESPACE / K8S_POD_NAME): the default network.
            return Ok(None);
        }
        let own = self.pod_annotation(pod).await?;
        let ns = self.namespace_annotation(&pod.namespace).await?;
        let one = |v: Option<String>| v.map(|v| BTreeMap::from([(ANNOTATION.to_owned(), v)]));
        let Some(profile) = pod_profile(one(own).as_ref(), one(ns).as_ref()) else {
            return Ok(None);
        };
        self.usable(&profile, pod)?;
        Ok(Some(profile))
    }

    /// Whether pods of `profile` leave by their own ENI with their own address (`strict` unless
    /// the profile asks for `standard`; `strict` for a profile no longer known).
    pub fn own_eni_egress(&self, profile: &str) -> bool {
        let listed = self.listed.borrow();
        let mode = listed.valid.get(profile).map(|p| p.egress_mode);
        mode.unwrap_or_default() == EgressMode::Strict
    }

    /// The pod's own annotation (`None`: it has none, or the API server does not know the pod).
    async fn pod_annotation(&self, pod: &PodRef) -> Result<Option<String>, SelectError> {
        if let Some(known) = self.pods.as_ref().and_then(|w| w.network_annotation(pod)) {
            return Ok(known);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let got = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(&pod.name))
            .await
            .map_err(|_| {
                SelectError::Lookup(format!(
                    "the API server did not answer for pod {}/{} within {LOOKUP_TIMEOUT:?}",
                    pod.namespace, pod.name
                ))
            })?
            .map_err(|e| {
                SelectError::Lookup(format!(
                    "reading pod {}/{} from the API server: {e}",
                    pod.namespace, pod.name
                ))
            })?;
        Ok(got.and_then(|p| p.metadata.annotations?.get(ANNOTATION).cloned()))
    }

    /// The namespace's annotation.
    async fn namespace_annotation(&self, ns: &str) -> Result<Option<String>, SelectError> {
        if self.namespaces.synced() {
            return Ok(self.namespaces.annotation_of(ns));
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let got = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(ns))
            .await
            .map_err(|_| {
                SelectError::Lookup(format!(
                    "the API server did not answer for namespace {ns} within {LOOKUP_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| {
                SelectError::Lookup(format!("reading namespace {ns} from the API server: {e}"))
            })?;
        Ok(got.and_then(|n| n.metadata.annotations?.get(ANNOTATION).cloned()))
    }

    /// Whether `profile` can serve pods here: `Ok` when it is usable, else why not.
    fn usable(&self, profile: &str, pod: &PodRef) -> Result<(), SelectError> {
        let judged = self.judged.read().unwrap_or_else(|e| e.into_inner());
        let why = if !judged.known {
            "the cluster's NetworkProfiles are not known yet (the API server has not answered the \
             list)"
                .to_owned()
        } else {
            match judged.profiles.get(profile) {
                Some(Ok(_)) => return Ok(()),
                Some(Err(why)) => why.clone(),
                None => format!(
                    "pod {}/{} selects it by its {ANNOTATION} annotation (or its namespace's), and \
                     no NetworkProfile of that name exists (kubectl get networkprofiles)",
                    pod.namespace, pod.name
                ),
            }
        };
        Err(SelectError::NotUsable {
            profile: profile.to_owned(),
            why,
        })
    }
}

/// Starts the profile and namespace watches, the checker that feeds the pool through `sink`, and
/// the advertiser; returns the selector the daemon asks on ADD.
pub fn start(
    client: kube::Client,
    node_name: &str,
    pods: Option<Arc<dyn KnownPods>>,
    sink: Arc<dyn ProfileSink>,
    (cloud, node): (Arc<dyn Cloud>, NodeContext),
    cancel: CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> Arc<PodProfiles> {
    let (profiles, watcher) = crate::spawn(client.clone());
    background.push(watcher);
    let (namespaces, ns_watcher) = crate::spawn_namespaces(client.clone());
    background.push(ns_watcher);
    let judged = Arc::new(RwLock::new(Judged::default()));
    let listed = profiles.clone();
    let (known_tx, known) = watch::channel(false);
    background.push(spawn_checker(
        profiles,
        (judged.clone(), known_tx),
        sink.clone(),
        (cloud, node),
        cancel.clone(),
    ));
    let (total_tx, total_rx) = watch::channel(BTreeMap::new());
    background.push(crate::resources::spawn(
        client.clone(),
        node_name.to_owned(),
        total_rx,
        cancel.clone(),
    ));
    background.push(spawn_publisher(judged.clone(), sink, total_tx, cancel));
    Arc::new(PodProfiles {
        judged,
        known,
        listed,
        namespaces,
        pods,
        client,
    })
}

/// Checks every change of the cluster's profiles (and every [`RECHECK`]) against EC2, and hands
/// the usable ones to the pool.
fn spawn_checker(
    mut rx: watch::Receiver<Profiles>,
    (judged, known): (Arc<RwLock<Judged>>, watch::Sender<bool>),
    sink: Arc<dyn ProfileSink>,
    (cloud, node): (Arc<dyn Cloud>, NodeContext),
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut retry = RetryPause::new(RETRY.0, RETRY.1);
        loop {
            let now = rx.borrow_and_update().clone();
            let previous = judged.read().unwrap_or_else(|e| e.into_inner()).clone();
            let checked = match judge(&now, cloud.as_ref(), &node).await {
                Ok(fresh) => {
                    apply(sink.as_ref(), &judged, &previous, fresh.clone());
                    if fresh.known {
                        known.send_replace(true);
                    }
                    sync_groups(&fresh, cloud.as_ref(), &node).await
                }
                Err(e) => Err(e),
            };
            let wait = match checked {
                Ok(changed) => {
                    retry.succeeded();
                    // An ENI whose create was in flight when the groups changed got the old ones:
                    // look again soon.
                    if changed > 0 { SETTLE } else { RECHECK }
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?retry.pause(),
                        "network profiles: cannot check them against EC2; the previous answers hold");
                    retry.failed()
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// Publishes the node's total slots per profile: the pool's numbers for the usable ones, 0 for the
/// rest the cluster has (so the scheduler sends their pods elsewhere).
fn spawn_publisher(
    judged: Arc<RwLock<Judged>>,
    sink: Arc<dyn ProfileSink>,
    tx: watch::Sender<BTreeMap<String, u32>>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PUBLISH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let names: Vec<String> = {
                let j = judged.read().unwrap_or_else(|e| e.into_inner());
                if !j.known {
                    continue;
                }
                j.profiles.keys().cloned().collect()
            };
            let totals = sink.totals();
            let free: BTreeMap<String, u32> = names
                .into_iter()
                .map(|p| {
                    let n = totals.get(&p).copied().unwrap_or(0);
                    (p, n)
                })
                .collect();
            tx.send_if_modified(|old| {
                let changed = *old != free;
                if changed {
                    *old = free;
                }
                changed
            });
        }
    })
}

/// Hands the usable profiles to the pool, sets the per-profile gauge, and logs what changed.
fn apply(sink: &dyn ProfileSink, judged: &RwLock<Judged>, previous: &Judged, fresh: Judged) {
    if *previous == fresh {
        return;
    }
    for (name, verdict) in &fresh.profiles {
        sink.set_usable(name, Some(verdict.is_ok()));
        if previous.profiles.get(name) == Some(verdict) {
            continue;
        }
        match verdict {
            Ok(p) => tracing::info!(profile = %name, subnet = %p.subnet.id,
                security_groups = %p.security_groups.join(","), max_enis = ?p.max_enis,
                "network profile usable on this node; new ENIs of it follow it"),
            Err(why) => tracing::warn!(profile = %name, %why,
                "network profile not usable on this node: its pods get no IP here"),
        }
    }
    for gone in previous.profiles.keys() {
        if !fresh.profiles.contains_key(gone) {
            sink.set_usable(gone, None);
            tracing::info!(profile = %gone, "network profile deleted: its ENIs keep their pods, and are given back once empty");
        }
    }
    let usable = fresh.usable();
    *judged.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    sink.set_profiles(usable);
}

#[cfg(test)]
mod tests;
