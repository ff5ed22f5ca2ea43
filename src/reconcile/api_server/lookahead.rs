//! The lookahead (issue 25, item 3): the pods the watch shows bound to this node, not host-network,
//! not finished, not being deleted, become the pool's demand before their ADDs arrive
//! ([`crate::pool::Pool::announce_bound_pods`]). The pool skips those that hold an IP already and
//! counts each new one once, so a ReplicaSet scheduled here is warmed for in one batch while the
//! kubelet is still preparing its sandboxes.
//!
//! Only a synced view is announced: a stale or partial one (re-listing after an error) would make
//! pods it misses stop counting. Until the view syncs again the last announcement stands, and
//! decays in the pool.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::watch::{BoundPods, PodWatch};
use crate::model::PodRef;
use crate::pool::Pool;

/// The pods of `view` that will want a pod IP from this node, as the CNI request names them (a
/// mirror pod under its static pod's UID, the one the kubelet gives the runtime).
pub fn pods_wanting_ip(view: &BoundPods) -> Vec<PodRef> {
    view.pods
        .values()
        .filter(|p| p.wants_ip())
        .map(|p| PodRef {
            namespace: p.key.namespace.clone(),
            name: p.key.name.clone(),
            uid: p.mirror_of.clone().unwrap_or_else(|| p.uid.clone()),
        })
        .collect()
}

/// Feeds `pool` the pods `watch` shows bound here, at every change of the view, until `cancel`.
pub fn spawn_lookahead(watch: PodWatch, pool: Pool, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut changed = watch.subscribe();
        loop {
            let view = watch.bound_pods();
            if view.synced {
                pool.announce_bound_pods(&pods_wanting_ip(&view));
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = changed.changed() => if r.is_err() { return },
            }
        }
    })
}
