//! IAM on a [`MockCloud`]: the policies in force (account-wide and per caller), the shipped one,
//! the tags the policy requires of the nodes, and the calls refused so far.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Denial, Policy, node_tag, shipped_policy};
use crate::MockCloud;

impl MockCloud {
    /// Enforces the shipped policy (`deploy/iam-policy.json`) for `cluster` in the default world's
    /// VPC, account-wide ([`MockCloud::set_iam_policy`]), as every daemon-level test, benchmark,
    /// the soak and `--simulate` do; returns it. Every instance, running or launched later, is
    /// tagged as a node of `cluster` ([`node_tag`]), which the policy requires of the instance
    /// an ENI is attached to, detached from, or has its DeleteOnTermination set on. `None`,
    /// changing nothing, without a default world.
    pub fn enforce_shipped_policy(&self, cluster: &str) -> Option<Policy> {
        let vpc = self.default_world()?.vpc_id;
        let policy = shipped_policy(cluster, &vpc);
        self.tag_nodes(&BTreeMap::from([node_tag(cluster)]));
        self.set_iam_policy(Some(policy.clone()));
        Some(policy)
    }

    /// Tags every instance, running or launched later, with `tags` (added to its own), as a node
    /// group's launch template or Karpenter tags its nodes.
    pub fn tag_nodes(&self, tags: &BTreeMap<String, String>) {
        self.inner.world.lock().expect("world lock").tag_nodes(tags);
    }

    /// Sets the account-wide IAM policy: every caller's EC2 calls are evaluated against it (a
    /// caller with its own policy, [`MockCloud::set_iam_policy_for`], against that one instead).
    /// `None` turns enforcement off for callers without their own policy (the default).
    pub fn set_iam_policy(&self, policy: Option<Policy>) {
        self.inner.iam.lock().expect("iam lock").account = policy.map(Arc::new);
    }

    /// Sets the policy of one caller, identified by the access key id of its SigV4 `Credential`
    /// (e.g. one node's instance-profile role); it overrides the account-wide policy for that
    /// caller. `None` removes the override (the caller follows the account-wide policy again).
    pub fn set_iam_policy_for(&self, access_key_id: &str, policy: Option<Policy>) {
        let mut s = self.inner.iam.lock().expect("iam lock");
        match policy {
            Some(p) => {
                s.callers.insert(access_key_id.to_owned(), Arc::new(p));
            }
            None => {
                s.callers.remove(access_key_id);
            }
        }
    }

    /// The policy in force for `access_key_id` (its own, else the account-wide one); with `None`,
    /// the account-wide one.
    pub fn iam_policy(&self, access_key_id: Option<&str>) -> Option<Policy> {
        let s = self.inner.iam.lock().expect("iam lock");
        match access_key_id {
            Some(k) => s.policy_for(k).map(|p| (*p).clone()),
            None => s.account.as_deref().cloned(),
        }
    }

    /// Every call refused for IAM so far, oldest first.
    pub fn iam_denials(&self) -> Vec<Denial> {
        self.inner.iam.lock().expect("iam lock").denials.clone()
    }

    /// Forgets the recorded denials.
    pub fn clear_iam_denials(&self) {
        self.inner.iam.lock().expect("iam lock").denials.clear();
    }
}
