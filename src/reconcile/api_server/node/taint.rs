//! Removing the startup taint: only that taint (its key and effect), other taints untouched.
//!
//! The node is read, the taint list written back without ours by a JSON merge patch that names the
//! resourceVersion read: another writer in between (the kubelet, a controller adding its own taint)
//! makes the API server answer 409 Conflict instead of the patch dropping its change, and the read
//! and patch are tried again. A taint already gone is fine.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::TaintEffect;

/// Conflicts tried through before giving up until the next look.
const CONFLICT_ATTEMPTS: u32 = 5;

/// What removing the taint came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintRemoval {
    /// Removed, after this many conflicts.
    Removed { conflicts: u32 },
    /// The node does not have it (never had it, or someone removed it first).
    Absent,
}

fn is_ours(t: &Taint, key: &str, effect: TaintEffect) -> bool {
    t.key == key && t.effect == effect.as_str()
}

/// Removes the taint `key:effect` from `node`, retrying on conflict.
pub async fn remove_taint(
    api: &Api<Node>,
    node: &str,
    key: &str,
    effect: TaintEffect,
) -> Result<TaintRemoval, kube::Error> {
    let mut conflicts = 0;
    loop {
        let n = api.get(node).await?;
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        let kept: Vec<&Taint> = taints.iter().filter(|t| !is_ours(t, key, effect)).collect();
        if kept.len() == taints.len() {
            return Ok(TaintRemoval::Absent);
        }
        let patch = json!({
            "metadata": {"resourceVersion": n.metadata.resource_version},
            "spec": {"taints": kept},
        });
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(TaintRemoval::Removed { conflicts }),
            Err(kube::Error::Api(s)) if s.is_conflict() && conflicts + 1 < CONFLICT_ATTEMPTS => {
                conflicts += 1;
                tracing::debug!(
                    node,
                    conflicts,
                    "startup taint: the node changed meanwhile, again"
                );
            }
            Err(e) => return Err(e),
        }
    }
}
