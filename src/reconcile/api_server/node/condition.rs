//! The node condition: what the pool and the cloud layer say, judged without I/O ([`judge`]), and
//! published by a strategic merge patch of `status.conditions` (merged by `type`: the kubelet's own
//! conditions are left alone).

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::cloud::CloudError;
use crate::cloud::calls::{CallStatsSnapshot, Outcome};
use crate::pool::{ExhaustionReason, PoolSnapshot};

/// The condition's type.
pub const CONDITION_TYPE: &str = "eniipam.io/PodNetworkReady";

/// EC2 calls failed in a row (transport errors, 5xx, timeouts; every attempt counts) with no answer
/// in between before EC2 counts as unreachable: one call with the SDK's retries, not one blip.
const UNREACHABLE_AFTER: u64 = 3;

/// Why the condition is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `True`: idle IPs ready, or room to get them.
    IpsAvailable,
    /// No idle IP and the node holds all it may (capacity or ENI slots).
    NoIpCapacity,
    /// EC2 says the pod subnet has no free address.
    SubnetShort,
    /// EC2 calls fail without an answer.
    Ec2Unreachable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IpsAvailable => "IpsAvailable",
            Self::NoIpCapacity => "NoIpCapacity",
            Self::SubnetShort => "SubnetShort",
            Self::Ec2Unreachable => "Ec2Unreachable",
        }
    }
}

/// The condition at one look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub reason: Reason,
    pub message: String,
}

impl Verdict {
    pub fn ready(&self) -> bool {
        self.reason == Reason::IpsAvailable
    }

    pub fn status(&self) -> &'static str {
        if self.ready() { "True" } else { "False" }
    }

    /// Same status and reason: the message's figures move all the time and are published with the
    /// heartbeat, not on every change.
    pub fn same_state(&self, other: &Verdict) -> bool {
        self.reason == other.reason
    }
}

/// Whether EC2 answered lately, from the cloud layer's call counters (IMDS calls left out).
#[derive(Clone, Debug, Default)]
pub struct Ec2Reach {
    answered: u64,
    failed: u64,
    /// Attempts failed without an answer since the last look that saw one.
    failed_since_answer: u64,
}

impl Ec2Reach {
    /// Takes the counters' new totals: a look that saw any answer resets the run of failures.
    pub fn observe(&mut self, calls: &CallStatsSnapshot) {
        let (mut answered, mut failed) = (0, 0);
        for c in calls.calls.iter().filter(|c| !c.api.starts_with("imds:")) {
            match c.outcome {
                Outcome::Transient => failed += c.latency.count,
                _ => answered += c.latency.count,
            }
        }
        if answered > self.answered {
            self.failed_since_answer = 0;
        } else {
            self.failed_since_answer += failed.saturating_sub(self.failed);
        }
        self.answered = answered;
        self.failed = failed;
    }

    pub fn unreachable(&self) -> bool {
        self.failed_since_answer >= UNREACHABLE_AFTER
    }
}

fn subnet_full(e: &CloudError) -> bool {
    matches!(e, CloudError::SubnetFull { .. })
}

/// Why the pod subnets are short, if they are: EC2 said every pod subnet is full and the pool is
/// backing off from each; or, with no idle IP left, every pod subnet had no free address at EC2's
/// last word. (That word is not re-read until the pool asks EC2 again, so with idle IPs in hand a
/// zero from the past says nothing about now: the pool got them after it.)
fn subnet_short(s: &PoolSnapshot) -> Option<String> {
    if s.subnets.is_empty() {
        return None;
    }
    let ids = || {
        s.subnets
            .iter()
            .map(|sub| sub.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let backing_off = s.subnets.iter().all(|sub| {
        sub.backoff
            .as_ref()
            .is_some_and(|b| b.exhausted && subnet_full(&b.error))
    });
    if backing_off {
        let error = s.subnets[0].backoff.as_ref().map(|b| b.error.to_string());
        return Some(format!(
            "EC2 says the pod subnets are full ({}: {})",
            ids(),
            error.unwrap_or_default()
        ));
    }
    let none_free = s.idle_eligible == 0 && s.subnets.iter().all(|sub| sub.free == Some(0));
    none_free.then(|| format!("no free address in the pod subnets {}", ids()))
}

/// The condition the node should show now.
pub fn judge(s: &PoolSnapshot, reach: &Ec2Reach) -> Verdict {
    let idle = s.idle_eligible;
    let verdict = |reason, message| Verdict { reason, message };
    if idle == 0
        && let Some(
            why @ (ExhaustionReason::CapacityReached { .. } | ExhaustionReason::NoEniSlot { .. }),
        ) = &s.exhaustion
    {
        return verdict(Reason::NoIpCapacity, format!("no idle IP: {why}"));
    }
    if let Some(why) = subnet_short(s) {
        return verdict(
            Reason::SubnetShort,
            format!("{why}: {idle} idle IPs still ready, no more can be had"),
        );
    }
    if reach.unreachable() {
        return verdict(
            Reason::Ec2Unreachable,
            format!(
                "{} EC2 calls in a row failed without an answer: {idle} idle IPs still ready, no \
                 more can be had",
                reach.failed_since_answer
            ),
        );
    }
    verdict(
        Reason::IpsAvailable,
        format!(
            "{idle} idle IPs ready, {} assigned, {} of {} slots in use",
            s.assigned, s.tokens_used, s.capacity
        ),
    )
}

/// RFC 3339 UTC, to the second, as Kubernetes writes times.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Patches the condition onto `node`'s status. `lastTransitionTime` is set only when the status
/// differs from the one the node shows (read first: a restart does not move it).
pub async fn publish(api: &Api<Node>, node: &str, v: &Verdict) -> Result<(), kube::Error> {
    let current = api.get_status(node).await?;
    let shown = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == CONDITION_TYPE)
        .map(|c| c.status);
    let now = now_rfc3339();
    let mut condition = json!({
        "type": CONDITION_TYPE,
        "status": v.status(),
        "reason": v.reason.as_str(),
        "message": v.message,
        "lastHeartbeatTime": now,
    });
    if shown.as_deref() != Some(v.status()) {
        condition["lastTransitionTime"] = json!(now);
    }
    let patch = json!({"status": {"conditions": [condition]}});
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}
