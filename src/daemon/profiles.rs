//! Network profiles in the daemon (`network_profiles = true`): the cluster's `NetworkProfile`s, as
//! [`crate::network_profiles`] reads them, checked against EC2 for this node and handed to the pool
//! ([`Pool::set_profiles`]); each pod's profile answered on ADD ([`PodProfiles`], the IPAM
//! service's [`ProfileSelector`]); and each profile's total slots advertised on the node
//! (`eniipam.io/network-<name>`, [`crate::network_profiles::resources`]).
//!
//! - **Checking**: a profile is usable here when its subnet is in the node's VPC and zone (by id, or
//!   the zone's subnet carrying its tags) and its groups exist in the node's VPC. The whole set is
//!   checked with two EC2 calls per node and change (one DescribeSubnets of the node's zone, one
//!   DescribeSecurityGroups of every group named), not two per profile: a profile applied to a
//!   cluster reaches every node at once. Only when a call fails for a reason that belongs to one
//!   profile (a group EC2 does not show, a subnet outside the zone) is that profile checked alone, so
//!   the reason names it. EC2 failing transiently keeps each profile's previous answer and tries
//!   again with back-off; the set is checked again every [`RECHECK`] too (a tag-selected subnet
//!   may have been replaced, a group deleted).
//! - **Groups follow the profile**: after each check, every ENI tagged with a usable profile whose
//!   groups differ from the profile's is brought to them (ModifyNetworkInterfaceAttribute), so a
//!   profile's changed groups reach its running pods, not only its next ENIs (a changed subnet
//!   cannot: it applies to new ENIs).
//! - **Selecting**: on a new ADD the pod's annotation comes from the daemon's pod watch (the pod is
//!   bound before the runtime makes its sandbox), else from one GET of the pod; its namespace's from
//!   the namespace watch, else one GET. A pod naming a profile that does not exist, is invalid or is
//!   unusable here gets CNI error 11 naming the profile and why; nothing is allocated.
//! - **Advertising**: every [`PUBLISH_EVERY`] the pool's total slots per profile
//!   ([`crate::pool::ProfileCapacity::total`]: it moves with the profile's ENIs, not its pods; 0 for a profile
//!   that is not usable here) are compared with what was published, and a change is patched onto
//!   the node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::pod_network::{groups_for_node, subnet_by_tags, subnet_for_node};
use crate::cloud::backoff::RetryPause;
use crate::cloud::{Cloud, CloudError, NodeContext, Subnet, SubnetFilter};
use crate::ipam::{IpamError, ProfileSelector};
use crate::metrics::{Metrics, ProfileLabel};
use crate::model::PodRef;
use crate::network_profiles::{
    self as np, ANNOTATION, Namespaces, ProfileSpec, Profiles, SubnetChoice,
};
use crate::pool::profiles::NETWORK_TAG;
use crate::pool::{Pool, PoolError, ProfileName, ProfileNetwork, ProfileUnavailableReason};
use crate::reconcile::api_server::PodWatch;

/// After ENIs were brought to their profile's groups, the next check comes this soon.
const SETTLE: Duration = Duration::from_secs(30);

/// The profiles are checked against EC2 again this often, changed or not.
pub(super) const RECHECK: Duration = Duration::from_secs(600);

/// The node's extended resources follow the pool this often (a PATCH only when a number changed).
pub(super) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// How long startup waits for the profiles' first check (see [`PodProfiles::first_answer`]).
const FIRST_ANSWER: Duration = super::pod_network::FIRST_ANSWER;

/// How long an ADD waits for the API server when the watches do not know the pod or its namespace.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// EC2 back-off while the profiles cannot be checked: doubling from the first, up to the last.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Each profile the cluster has, as this node judged it: usable here, or why not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Judged {
    /// The profiles have been listed once.
    known: bool,
    profiles: BTreeMap<ProfileName, Result<ProfileNetwork, String>>,
}

/// Answers the IPAM service's question "which profile does this pod select?" (see the module docs).
pub(super) struct PodProfiles {
    judged: Arc<RwLock<Judged>>,
    /// The cluster's profiles as listed (each one's egress mode).
    listed: watch::Receiver<Profiles>,
    namespaces: Namespaces,
    pods: Option<PodWatch>,
    client: kube::Client,
}

impl PodProfiles {
    /// Waits up to [`FIRST_ANSWER`] for the profiles' first check, so the first pods do not meet
    /// "not known yet" (the runtime would retry them; this is only quicker).
    pub(super) async fn first_answer(&self) {
        let known = async {
            while !self.judged.read().unwrap_or_else(|e| e.into_inner()).known {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(FIRST_ANSWER, known).await.is_err() {
            tracing::warn!(wait = ?FIRST_ANSWER, "network profiles: the cluster's NetworkProfiles are not known yet (API server slow or unreachable, or the CRD is not applied); pods that select one get CNI error 11 until they are");
        }
    }

    /// The pod's own annotation (`None`: it has none, or the API server does not know the pod).
    async fn pod_annotation(&self, pod: &PodRef) -> Result<Option<String>, IpamError> {
        if let Some(watch) = &self.pods {
            let bound = watch.bound_pods();
            if let Some(p) = bound.get(&pod.namespace, &pod.name)
                && (pod.uid.is_empty() || p.uid == pod.uid)
            {
                return Ok(p.network.clone());
            }
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let got = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(&pod.name))
            .await
            .map_err(|_| {
                IpamError::PodProfile(format!(
                    "the API server did not answer for pod {}/{} within {LOOKUP_TIMEOUT:?}",
                    pod.namespace, pod.name
                ))
            })?
            .map_err(|e| {
                IpamError::PodProfile(format!(
                    "reading pod {}/{} from the API server: {e}",
                    pod.namespace, pod.name
                ))
            })?;
        Ok(got.and_then(|p| p.metadata.annotations?.get(ANNOTATION).cloned()))
    }

    /// The namespace's annotation.
    async fn namespace_annotation(&self, ns: &str) -> Result<Option<String>, IpamError> {
        if self.namespaces.synced() {
            return Ok(self.namespaces.annotation_of(ns));
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let got = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(ns))
            .await
            .map_err(|_| {
                IpamError::PodProfile(format!(
                    "the API server did not answer for namespace {ns} within {LOOKUP_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| {
                IpamError::PodProfile(format!("reading namespace {ns} from the API server: {e}"))
            })?;
        Ok(got.and_then(|n| n.metadata.annotations?.get(ANNOTATION).cloned()))
    }

    /// Whether `profile` can serve pods here: `Ok` when it is usable, else the pool's error naming it.
    fn usable(&self, profile: &str, pod: &PodRef) -> Result<(), IpamError> {
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
        Err(IpamError::Pool(PoolError::ProfileUnavailable {
            profile: profile.to_owned(),
            reason: ProfileUnavailableReason::NotUsable(why),
        }))
    }
}

#[async_trait::async_trait]
impl ProfileSelector for PodProfiles {
    async fn select(&self, pod: &PodRef) -> Result<Option<ProfileName>, IpamError> {
        if pod.namespace.is_empty() || pod.name.is_empty() {
            // Not a Kubernetes pod (no K8S_POD_NAMESPACE / K8S_POD_NAME): the default network.
            return Ok(None);
        }
        let own = self.pod_annotation(pod).await?;
        let ns = self.namespace_annotation(&pod.namespace).await?;
        let one = |v: Option<String>| v.map(|v| BTreeMap::from([(ANNOTATION.to_owned(), v)]));
        let Some(profile) = np::pod_profile(one(own).as_ref(), one(ns).as_ref()) else {
            return Ok(None);
        };
        self.usable(&profile, pod)?;
        Ok(Some(profile))
    }

    fn own_eni_egress(&self, profile: &str) -> bool {
        let listed = self.listed.borrow();
        let mode = listed.valid.get(profile).map(|p| p.egress_mode);
        mode.unwrap_or_default() == np::EgressMode::Strict
    }
}

/// Starts the profile and namespace watches, the checker that feeds the pool, and the advertiser;
/// returns the selector the IPAM service asks on ADD.
pub(super) fn start(
    client: kube::Client,
    node_name: &str,
    pods: Option<PodWatch>,
    (pool, cloud, node): (Pool, Arc<dyn Cloud>, NodeContext),
    metrics: Metrics,
    cancel: CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> Arc<PodProfiles> {
    let (profiles, watcher) = np::spawn(client.clone());
    background.push(watcher);
    let (namespaces, ns_watcher) = np::spawn_namespaces(client.clone());
    background.push(ns_watcher);
    let judged = Arc::new(RwLock::new(Judged::default()));
    let listed = profiles.clone();
    background.push(spawn_checker(
        profiles,
        judged.clone(),
        (pool.clone(), cloud, node),
        metrics,
        cancel.clone(),
    ));
    let (total_tx, total_rx) = watch::channel(BTreeMap::new());
    background.push(np::resources::spawn(
        client.clone(),
        node_name.to_owned(),
        total_rx,
        cancel.clone(),
    ));
    background.push(spawn_publisher(judged.clone(), pool, total_tx, cancel));
    Arc::new(PodProfiles {
        judged,
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
    judged: Arc<RwLock<Judged>>,
    (pool, cloud, node): (Pool, Arc<dyn Cloud>, NodeContext),
    metrics: Metrics,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut retry = RetryPause::new(RETRY.0, RETRY.1);
        loop {
            let now = rx.borrow_and_update().clone();
            let previous = judged.read().unwrap_or_else(|e| e.into_inner()).clone();
            let checked = match judge(&now, cloud.as_ref(), &node).await {
                Ok(fresh) => {
                    apply(&pool, &metrics, &judged, &previous, fresh.clone());
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
    pool: Pool,
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
            let names: Vec<ProfileName> = {
                let j = judged.read().unwrap_or_else(|e| e.into_inner());
                if !j.known {
                    continue;
                }
                j.profiles.keys().cloned().collect()
            };
            let caps = pool.profile_capacity();
            let free: BTreeMap<String, u32> = names
                .into_iter()
                .map(|p| {
                    let n = caps.get(&p).map_or(0, |c| c.total);
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
fn apply(
    pool: &Pool,
    metrics: &Metrics,
    judged: &RwLock<Judged>,
    previous: &Judged,
    fresh: Judged,
) {
    if *previous == fresh {
        return;
    }
    for (name, verdict) in &fresh.profiles {
        metrics
            .network_profile_usable
            .get_or_create(&ProfileLabel::of(name))
            .set(i64::from(verdict.is_ok()));
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
            metrics
                .network_profile_usable
                .remove(&ProfileLabel::of(gone));
            tracing::info!(profile = %gone, "network profile deleted: its ENIs keep their pods, and are given back once empty");
        }
    }
    let usable: BTreeMap<ProfileName, ProfileNetwork> = fresh
        .profiles
        .iter()
        .filter_map(|(n, v)| Some((n.clone(), v.as_ref().ok()?.clone())))
        .collect();
    *judged.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    pool.set_profiles(usable);
}

/// Judges every profile for this node: two EC2 calls for the whole set when all is well (see the
/// module docs). `Err` only when EC2 failed transiently.
async fn judge(
    profiles: &Profiles,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<Judged, CloudError> {
    let mut out = Judged {
        known: profiles.known,
        profiles: BTreeMap::new(),
    };
    for (name, why) in &profiles.invalid {
        out.profiles.insert(name.clone(), Err(why.clone()));
    }
    if profiles.valid.is_empty() {
        return Ok(out);
    }
    let zone = zone_subnets(cloud, node).await?;
    let groups: BTreeSet<String> = profiles
        .valid
        .values()
        .flat_map(|p| p.security_groups.iter().cloned())
        .collect();
    let groups: Vec<String> = groups.into_iter().collect();
    let all_groups_ok = groups_for_node(cloud, node, &groups, "the NetworkProfiles")
        .await?
        .is_ok();
    for (name, spec) in &profiles.valid {
        let who = format!("NetworkProfile {name:?}");
        let subnet = match &spec.subnet {
            SubnetChoice::Id(id) => match zone.iter().find(|s| &s.id == id) {
                Some(s) => Ok(s.clone()),
                // Not in the node's zone: described alone, so the reason says where it is.
                None => subnet_for_node(cloud, node, id, &who).await?,
            },
            SubnetChoice::Tags(tags) => subnet_by_tags(&zone, node, tags, &who),
        };
        let verdict = match subnet {
            Err(why) => Err(why),
            Ok(subnet) => {
                let groups_ok = if all_groups_ok {
                    Ok(())
                } else {
                    groups_for_node(cloud, node, &spec.security_groups, &who).await?
                };
                groups_ok.map(|()| network(spec, subnet))
            }
        };
        out.profiles.insert(name.clone(), verdict);
    }
    Ok(out)
}

/// Brings every ENI of a usable profile to exactly the profile's groups (one DescribeInstances of
/// the node; one ModifyNetworkInterfaceAttribute per ENI that differs): a profile is the groups its
/// pods get, so changing them must reach the pods already running, not only new ENIs. How many
/// ENIs were changed; `Err` when EC2 failed transiently (the next try comes after back-off).
async fn sync_groups(
    judged: &Judged,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<usize, CloudError> {
    if !judged.profiles.values().any(Result::is_ok) {
        return Ok(0);
    }
    let instance = cloud.describe_instance(&node.instance_id).await?;
    let mut changed = 0;
    for eni in &instance.enis {
        let Some(profile) = eni.tags.get(NETWORK_TAG) else {
            continue;
        };
        let Some(Ok(net)) = judged.profiles.get(profile) else {
            continue;
        };
        let has: BTreeSet<&String> = eni.security_groups.iter().collect();
        let wants: BTreeSet<&String> = net.security_groups.iter().collect();
        if has == wants {
            continue;
        }
        match cloud
            .set_security_groups(&eni.id, &net.security_groups)
            .await
        {
            Ok(()) => {
                changed += 1;
                tracing::warn!(eni = %eni.id, %profile, from = ?eni.security_groups,
                    to = ?net.security_groups,
                    "network profile's security groups changed: its ENI (and the pods on it) now carries the new ones");
            }
            Err(e) if e.is_transient() => {
                return Err(e);
            }
            Err(e) => {
                tracing::error!(eni = %eni.id, %profile, error = %e,
                    "cannot bring the ENI to its network profile's security groups");
            }
        }
    }
    Ok(changed)
}

/// The subnets of the node's VPC and zone (one DescribeSubnets).
async fn zone_subnets(cloud: &dyn Cloud, node: &NodeContext) -> Result<Vec<Subnet>, CloudError> {
    let filter = SubnetFilter {
        vpc_id: Some(node.vpc_id.clone()),
        availability_zone: Some(node.availability_zone.clone()),
        ..SubnetFilter::default()
    };
    cloud.describe_subnets(&filter).await
}

fn network(spec: &ProfileSpec, subnet: Subnet) -> ProfileNetwork {
    ProfileNetwork {
        subnet,
        security_groups: spec.security_groups.clone(),
        max_enis: spec.max_enis,
    }
}
