//! Where network profiles (the `eniipam-profiles` crate, [`crate::network_profiles`]) meet the pool,
//! the metrics, the pod watch and the IPAM service: [`PoolProfiles`] is the crate's
//! [`ProfileSink`] over the pool (its `CheckedProfile`s are the pool's `ProfileNetwork`s, one type
//! in the cloud crate) and the per-profile gauge; the pod watch answers the crate's [`KnownPods`];
//! [`Selector`] is the service's [`ProfileSelector`] over the crate's [`PodProfiles`], its refusals
//! turned into the pool's error (CNI error 11). The watches, the checks against EC2, the selection
//! and the advertising are the crate's ([`crate::network_profiles::controller`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::{Cloud, NodeContext};
use crate::ipam::{IpamError, ProfileSelector};
use crate::metrics::{Metrics, ProfileLabel};
use crate::model::PodRef;
use crate::network_profiles::{
    self as np, CheckedProfile, KnownPods, PodProfiles, ProfileSink, SelectError,
};
use crate::pool::{Pool, PoolError, ProfileName, ProfileUnavailableReason};
use crate::reconcile::api_server::PodWatch;

/// The pool and the metrics, as the profiles' controller sees them.
struct PoolProfiles {
    pool: Pool,
    metrics: Metrics,
}

impl ProfileSink for PoolProfiles {
    fn set_profiles(&self, usable: BTreeMap<String, CheckedProfile>) {
        self.pool.set_profiles(usable);
    }

    fn totals(&self) -> BTreeMap<String, u32> {
        let caps = self.pool.profile_capacity().into_iter();
        caps.map(|(name, c)| (name, c.total)).collect()
    }

    fn set_usable(&self, profile: &str, usable: Option<bool>) {
        let gauge = &self.metrics.network_profile_usable;
        match usable {
            Some(usable) => {
                gauge
                    .get_or_create(&ProfileLabel::of(profile))
                    .set(i64::from(usable));
            }
            None => {
                gauge.remove(&ProfileLabel::of(profile));
            }
        }
    }
}

/// The daemon's pod watch, asked first for a pod's annotation (it is bound before its sandbox).
struct WatchedPods(PodWatch);

impl KnownPods for WatchedPods {
    fn network_annotation(&self, pod: &PodRef) -> Option<Option<String>> {
        let bound = self.0.bound_pods();
        let p = bound.get(&pod.namespace, &pod.name)?;
        (pod.uid.is_empty() || p.uid == pod.uid).then(|| p.network.clone())
    }
}

/// The IPAM service's question "which profile does this pod select?", answered by the crate.
pub(super) struct Selector(Arc<PodProfiles>);

impl Selector {
    /// Waits (bounded) for the profiles' first check ([`PodProfiles::first_answer`]).
    pub(super) async fn first_answer(&self) {
        self.0.first_answer().await;
    }
}

#[async_trait::async_trait]
impl ProfileSelector for Selector {
    async fn select(&self, pod: &PodRef) -> Result<Option<ProfileName>, IpamError> {
        self.0.select(pod).await.map_err(|e| match e {
            SelectError::Lookup(why) => IpamError::PodProfile(why),
            SelectError::NotUsable { profile, why } => {
                IpamError::Pool(PoolError::ProfileUnavailable {
                    profile,
                    reason: ProfileUnavailableReason::NotUsable(why),
                })
            }
        })
    }

    fn own_eni_egress(&self, profile: &str) -> bool {
        self.0.own_eni_egress(profile)
    }
}

/// Starts the crate's controller over the pool; returns the selector the IPAM service asks on ADD.
pub(super) fn start(
    client: kube::Client,
    node_name: &str,
    pods: Option<PodWatch>,
    (pool, cloud, node): (Pool, Arc<dyn Cloud>, NodeContext),
    metrics: Metrics,
    cancel: CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> Arc<Selector> {
    let pods = pods.map(|w| Arc::new(WatchedPods(w)) as Arc<dyn KnownPods>);
    let sink = Arc::new(PoolProfiles { pool, metrics });
    let selector = np::start(
        client,
        node_name,
        pods,
        sink,
        (cloud, node),
        cancel,
        background,
    );
    Arc::new(Selector(selector))
}
