//! Each profile's total slots, advertised on the node as an extended resource
//! `eniipam.io/network-<profile>` (issue 27, item 2), so that the scheduler places a pod that
//! requests one (`resources.limits: {eniipam.io/network-db: 1}`) only on a node with a slot free.
//!
//! The number is what the node can hold for the profile in all
//! (the daemon's `pool::ProfileCapacity::total`), not what is free: the scheduler subtracts the
//! requests of the pods bound to the node from `allocatable` itself, so a free count would be
//! subtracted twice (T − 2k with k pods running), and it would move, and be PATCHed, on every ADD
//! and DEL (issue 44, case 1). The VPC resource controller's `vpc.amazonaws.com/pod-eni` is a
//! constant for the same reason.
//!
//! How extended resources get onto a node, and why this module PATCHes both `status.capacity` and
//! `status.allocatable` and re-asserts them:
//!
//! - Any client may advertise a node-level extended resource by patching the node's `status`
//!   subresource (Kubernetes' task page "Advertise Extended Resources for a Node" does it with a JSON
//!   patch of `/status/capacity/example.com~1dongle`); device plugins do the same through the
//!   kubelet. The scheduler reads `status.allocatable`.
//! - The kubelet's periodic status update leaves extended resources it does not own in place: it
//!   patches the fields it computes, and its allocatable setter copies each extended resource of
//!   `status.capacity` into `status.allocatable` and drops from allocatable what capacity lacks. It
//!   does that at its own pace (the page says "asynchronously"), so this module patches both maps:
//!   the numbers are schedulable as soon as the PATCH lands, and the kubelet's copy agrees.
//! - But when the kubelet starts and finds its node object already registered while its device
//!   manager's checkpoint is gone (a node re-created under the same name, the kubelet's state wiped),
//!   it zeroes every extended resource in capacity and allocatable
//!   (`Kubelet.reconcileExtendedResource`, `ShouldResetExtendedResourceCapacity`), ours included.
//!   Nothing tells the daemon; so the advertiser re-reads the node every [`VERIFY_EVERY`] and
//!   re-PATCHes when the node does not say what it last published. Errors (the API server away, a
//!   409, a 5xx) make the next attempt re-read the node too, after a back-off.
//!
//! The patch is a JSON merge patch of the `status` subresource (RFC 7386: `null` deletes a key), which
//! touches only the keys it names: the kubelet's `cpu`, `memory`, `pods` and other plugins' resources
//! are left alone; a profile that is gone has its key set to `null` in both maps. Nothing is sent
//! while the numbers stay the same.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use eniipam_cloud::backoff::RetryPause;

/// Every profile's extended resource is this and the profile's name.
pub const RESOURCE_PREFIX: &str = "eniipam.io/network-";

/// The node is re-read this often, to re-assert numbers the kubelet zeroed (see the module docs).
pub const VERIFY_EVERY: Duration = Duration::from_secs(60);

/// API errors back off from 1 s, doubling, to 5 minutes (as the node status keeper's).
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The extended resource of `profile`, or why there is none: the API server accepts an extended
/// resource name only if it is a qualified name (`<DNS subdomain>/<name>`, the name at most 63
/// characters of `[A-Za-z0-9_.-]` starting and ending with a letter or digit) outside
/// `kubernetes.io`; `network-` takes 8 of the 63, so a profile's name has at most 55.
pub fn resource_name(profile: &str) -> Result<String, String> {
    let name = format!("network-{profile}");
    let ok = !profile.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(format!("{RESOURCE_PREFIX}{profile}"))
    } else {
        Err(format!(
            "{profile:?} makes no extended resource name {RESOURCE_PREFIX}<name>: a profile name \
             is 1 to 55 characters of [A-Za-z0-9_.-] ending with a letter or digit"
        ))
    }
}

/// Our resources as one map of the node's status says them: profile name → quantity string.
fn ours(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.strip_prefix(RESOURCE_PREFIX)?.to_owned(), q.0.clone())))
        .collect()
}

/// Keeps the node's `eniipam.io/network-*` resources equal to the total slots it is given.
pub struct Advertiser {
    api: Api<Node>,
    node: String,
    /// What the node says now, as far as the last PATCH (or read) knows; `None`: read it first.
    published: Option<BTreeMap<String, u32>>,
}

impl Advertiser {
    pub fn new(client: kube::Client, node: String) -> Self {
        Self {
            api: Api::all(client),
            node,
            published: None,
        }
    }

    /// Forgets what the node says: the next [`Self::advertise`] reads the node first.
    pub fn verify(&mut self) {
        self.published = None;
    }

    /// Makes the node advertise `free` (total slots per profile) and nothing else of ours. True when
    /// a PATCH was sent; nothing is sent when the node already says so. Profiles whose names make
    /// no resource name are left out (and logged): validation refuses them before they get here.
    pub async fn advertise(&mut self, free: &BTreeMap<String, u32>) -> Result<bool, kube::Error> {
        let want: BTreeMap<String, u32> = free
            .iter()
            .filter(|(p, _)| match resource_name(p) {
                Ok(_) => true,
                Err(why) => {
                    tracing::warn!(node = %self.node, profile = %p, %why, "not advertised");
                    false
                }
            })
            .map(|(p, n)| (p.clone(), *n))
            .collect();
        if self.published.as_ref() == Some(&want) {
            return Ok(false);
        }
        // Which of our keys the node holds (in either map), and whether it says `want` in both.
        let (held, same) = match &self.published {
            Some(p) => (p.keys().cloned().collect::<Vec<_>>(), false),
            None => {
                let node = self.api.get_status(&self.node).await?;
                let status = node.status.unwrap_or_default();
                let capacity = ours(status.capacity.as_ref());
                let allocatable = ours(status.allocatable.as_ref());
                let rendered: BTreeMap<String, String> = want
                    .iter()
                    .map(|(p, n)| (p.clone(), n.to_string()))
                    .collect();
                let same = capacity == rendered && allocatable == rendered;
                let mut held: Vec<String> = capacity.into_keys().collect();
                held.extend(allocatable.into_keys());
                (held, same)
            }
        };
        if same {
            self.published = Some(want);
            return Ok(false);
        }
        let mut resources = Map::new();
        for p in held {
            resources.insert(format!("{RESOURCE_PREFIX}{p}"), Value::Null);
        }
        for (p, n) in &want {
            resources.insert(format!("{RESOURCE_PREFIX}{p}"), json!(n.to_string()));
        }
        let patch = json!({"status": {"capacity": resources, "allocatable": resources}});
        self.published = None;
        self.api
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(node = %self.node, free = ?want, "network profiles: extended resources advertised");
        self.published = Some(want);
        Ok(true)
    }
}

/// Starts the advertiser: publishes what `free` holds now and at every change, re-reads the node
/// every [`VERIFY_EVERY`], retries errors with back-off; ends when `cancel` fires or `free`'s sender
/// is gone.
pub fn spawn(
    client: kube::Client,
    node: String,
    mut free: watch::Receiver<BTreeMap<String, u32>>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut adv = Advertiser::new(client, node);
        let mut retry = RetryPause::new(BACKOFF_FIRST, BACKOFF_MAX);
        let mut verify = tokio::time::interval(VERIFY_EVERY);
        verify.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        verify.tick().await;
        loop {
            let want = free.borrow_and_update().clone();
            let wait = match adv.advertise(&want).await {
                Ok(_) => {
                    retry.succeeded();
                    None
                }
                Err(e) => {
                    tracing::warn!(node = %adv.node, error = %e, retry_in = ?retry.pause(),
                        "network profiles: cannot advertise the extended resources");
                    Some(retry.failed())
                }
            };
            let retry = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = free.changed() => if changed.is_err() { return },
                _ = verify.tick() => adv.verify(),
                _ = retry => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_make_qualified_resource_names_or_are_refused() {
        assert_eq!(resource_name("db").unwrap(), "eniipam.io/network-db");
        assert_eq!(
            resource_name("team.a-1").unwrap(),
            "eniipam.io/network-team.a-1"
        );
        let longest = "a".repeat(55);
        assert!(resource_name(&longest).is_ok());
        for bad in ["", &"a".repeat(56), "db-", "db/x", "d b", "db."] {
            let why = resource_name(bad).unwrap_err();
            assert!(why.contains("1 to 55 characters"), "{bad:?}: {why}");
        }
    }
}
