//! Pods seen bound to the node before their ADD (issue 25, item 3).
//!
//! The daemon's API-server watch knows the pods the scheduler bound here. The kubelet creates a
//! pod's sandbox (and so calls the CNI ADD) after it has seen the pod, pulled nothing yet but mounted
//! its volumes: seconds later, or longer. Counting the pod as demand when it is bound lets one
//! batched assign serve a whole ReplicaSet's pods before their ADDs arrive. Under contention on
//! assigns (EC2 throttled one lately) the pool makes no call for them alone: their IPs ride in the
//! pods' own calls (`PoolState::plan_round`, step 2).
//!
//! The set is replaced whole at every change of the watch's view, so a pod deleted, finished or
//! host-network simply drops out. A pod counts as waiting for [`ANNOUNCED_FOR`] at most: a pod
//! stuck before its sandbox (a volume that never attaches) must not hold IPs for ever; it stays
//! known, so it is not counted again at the next change of the view.
//!
//! Pods whose ADD came are remembered as `started` while they stay bound (so the watch seeing a
//! pod without its IP yet, while its ADD is in flight, does not count it a second time), and
//! nothing is remembered at all until the first announcement: without an API server this costs
//! nothing.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::PodRef;

/// How long a pod seen bound and not ADDed counts as demand. The kubelet creates the sandbox only
/// once the pod's volumes are mounted, and gives up waiting for them after 2 minutes
/// (`WaitForAttachAndMount`'s timeout): a pod not ADDed by then may never be.
pub const ANNOUNCED_FOR: Duration = Duration::from_secs(2 * 60);

/// What one announcement changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnnounceOutcome {
    /// Pods seen for the first time (each counted as a start).
    pub new: u32,
    /// Pods waiting before that no longer are (deleted, finished, host-network, or holding an IP).
    pub withdrawn: u32,
    /// Pods waiting now (first seen within [`ANNOUNCED_FOR`]).
    pub waiting: u32,
}

/// `namespace/name`: how the watch and the CNI request name the same pod.
type Key = (String, String);

fn key(pod: &PodRef) -> Key {
    (pod.namespace.clone(), pod.name.clone())
}

/// Two UIDs name the same pod unless both are known and differ (a request without `K8S_POD_UID`
/// matches by name alone).
fn same_uid(a: &str, b: &str) -> bool {
    a.is_empty() || b.is_empty() || a == b
}

#[derive(Debug)]
struct Waiting {
    uid: String,
    since: Instant,
}

/// The pods bound to the node without an IP from this pool.
#[derive(Debug, Default)]
pub(super) struct Announced {
    /// An announcement was made: the API server's view feeds this node's demand.
    active: bool,
    waiting: HashMap<Key, Waiting>,
    /// Pods whose ADD came (by UID), kept while they stay bound.
    started: HashMap<Key, String>,
}

impl Announced {
    /// Replaces the set with `bound` (pods that want an IP); pods `has_ip` says hold one are not
    /// waiting.
    pub(super) fn replace(
        &mut self,
        bound: &[PodRef],
        has_ip: impl Fn(&PodRef) -> bool,
        now: Instant,
    ) -> AnnounceOutcome {
        self.active = true;
        let mut out = AnnounceOutcome::default();
        let mut waiting = HashMap::with_capacity(self.waiting.len());
        let mut started = HashMap::with_capacity(self.started.len());
        for pod in bound {
            let k = key(pod);
            if let Some(uid) = self.started.remove(&k)
                && same_uid(&uid, &pod.uid)
            {
                started.insert(k, uid);
                continue;
            }
            if has_ip(pod) {
                continue;
            }
            match self.waiting.remove(&k) {
                Some(w) if same_uid(&w.uid, &pod.uid) => {
                    waiting.insert(k, w);
                }
                _ => {
                    out.new += 1;
                    waiting.insert(
                        k,
                        Waiting {
                            uid: pod.uid.clone(),
                            since: now,
                        },
                    );
                }
            }
        }
        out.withdrawn = self
            .waiting
            .values()
            .filter(|w| now.duration_since(w.since) < ANNOUNCED_FOR)
            .count() as u32;
        self.waiting = waiting;
        self.started = started;
        out.waiting = self.waiting(now);
        out
    }

    /// The ADD of `pod`: how long ago it was first seen, if it was waiting. Remembered as started
    /// either way once announcements are on.
    pub(super) fn take(&mut self, pod: &PodRef, now: Instant) -> Option<Duration> {
        if !self.active {
            return None;
        }
        let k = key(pod);
        let lead = match self.waiting.get(&k) {
            Some(w) if same_uid(&w.uid, &pod.uid) => {
                let w = self.waiting.remove(&k).expect("just seen");
                Some(now.duration_since(w.since))
            }
            _ => None,
        };
        self.started.insert(k, pod.uid.clone());
        lead
    }

    /// Pods waiting, first seen within [`ANNOUNCED_FOR`].
    pub(super) fn waiting(&self, now: Instant) -> u32 {
        self.waiting
            .values()
            .filter(|w| now.duration_since(w.since) < ANNOUNCED_FOR)
            .count() as u32
    }
}
