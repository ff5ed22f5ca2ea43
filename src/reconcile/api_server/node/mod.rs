//! The node's readiness, told to the API server (issue 25, item 5): a startup taint removed once the
//! node can serve pods, and a node condition that says whether it still can.
//!
//! Why: the kubelet marks a node `Ready` as soon as a CNI config file exists, which is long before
//! the node holds an IP for a pod: the scheduler then places pods that fail their sandbox with "no
//! IP" until the pool has warmed up. The AWS VPC CNI's users asked for a way to keep pods off such a
//! node (aws/amazon-vpc-cni-k8s #2808, #2274). The node group puts a taint on the node at
//! registration (Karpenter's `startupTaints`, a managed node group's `taints`); the daemon removes
//! it — that taint alone — once the pool holds its first warm IPs ([`taint`]) and every other part
//! a pod's ADD needs is ready ([`StartupGate`]: NetworkPolicy's first sync, when enforcement is on).
//!
//! The condition [`CONDITION_TYPE`] ([`condition`]) is `True` while the node can serve pods (free
//! IPs or room to get them, EC2 reachable lately, the pod subnet not short) and `False` with the
//! reason otherwise. It is patched when its status or reason changes and every heartbeat period
//! (so `lastHeartbeatTime` is honest), never in a tight loop: API errors are logged and retried
//! with an exponential back-off.
//!
//! Inputs are what the daemon already has: the pool's snapshot and the cloud layer's call counters.

mod condition;
mod taint;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cloud::backoff::RetryPause;
use crate::cloud::calls::CallStats;
use crate::pool::{Pool, PoolSnapshot};

pub use condition::{CONDITION_TYPE, Ec2Reach, Reason, Verdict, judge};
pub use taint::{TaintRemoval, remove_taint};

/// The startup taint's default key.
pub const DEFAULT_STARTUP_TAINT: &str = "eniipam.io/not-ready";

/// A taint's effect, as Kubernetes spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

impl FromStr for TaintEffect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "NoSchedule" => Ok(Self::NoSchedule),
            "PreferNoSchedule" => Ok(Self::PreferNoSchedule),
            "NoExecute" => Ok(Self::NoExecute),
            _ => Err(format!(
                "{s:?} is not a taint effect (NoSchedule, PreferNoSchedule or NoExecute)"
            )),
        }
    }
}

impl std::fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `key` is a taint key the API server accepts: a qualified name, `[prefix/]name`, the
/// prefix a DNS subdomain, the name at most 63 characters of `[A-Za-z0-9_.-]` that start and end
/// with a letter or digit.
pub fn check_taint_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty: a taint key like eniipam.io/not-ready".into());
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a taint key: [DNS subdomain/]name, the name at most 63 characters of \
             [A-Za-z0-9_.-] starting and ending with a letter or digit"
        ))
    }
}

/// What the keeper is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatusConfig {
    pub node_name: String,
    /// The startup taint to remove (key, effect), when that is on.
    pub startup_taint: Option<(String, TaintEffect)>,
    /// Publish the condition.
    pub condition: bool,
    /// An unchanged condition is re-published this often.
    pub heartbeat: Duration,
    /// The pool is looked at this often.
    pub check: Duration,
}

/// A part of the node besides the pool that a pod's ADD needs, opened once by its owner: the
/// startup taint stays until every gate is open. NetworkPolicy's is its first sync (until then an
/// ADD waits for rules that cannot be in force yet, and fails after 10 s).
#[derive(Clone, Debug)]
pub struct StartupGate {
    /// What it waits for, for the log (`"network policy's first sync"`).
    pub what: &'static str,
    pub open: Arc<AtomicBool>,
}

impl StartupGate {
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            open: Arc::default(),
        }
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub fn set_open(&self) {
        self.open.store(true, Ordering::Release);
    }
}

/// Whether the pool holds its first warm IPs: an idle IP any pod may have now, or, when the pool
/// keeps none warm (a warm target of 0), a pool that is up at all.
pub fn warm(snapshot: &PoolSnapshot) -> bool {
    snapshot.idle_eligible > 0 || snapshot.warm_target == 0
}

/// API errors back off from 1 s, doubling, to 5 minutes.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Starts the keeper: every `check`, the startup taint (until it is gone; kept while a gate is
/// closed) and the condition.
pub fn spawn(
    client: kube::Client,
    config: NodeStatusConfig,
    (pool, gates): (Pool, Vec<StartupGate>),
    calls: Arc<CallStats>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client);
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = run(api, config, (pool, gates), calls) => {}
        }
    })
}

async fn run(
    api: Api<Node>,
    config: NodeStatusConfig,
    (pool, gates): (Pool, Vec<StartupGate>),
    calls: Arc<CallStats>,
) {
    let node = config.node_name.as_str();
    let mut taint = config.startup_taint.clone();
    // The gate last said to hold the taint (logged once per gate).
    let mut held_by: Option<&'static str> = None;
    let mut reach = Ec2Reach::default();
    let mut published: Option<(Verdict, Instant)> = None;
    let mut retry = RetryPause::new(BACKOFF_FIRST, BACKOFF_MAX);
    let mut retry_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(config.check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let snapshot = pool.snapshot();
        reach.observe(&calls.snapshot());
        if retry_at.is_some_and(|at| now < at) {
            continue;
        }
        let mut failed = false;
        let closed = gates.iter().find(|g| !g.is_open());
        if let (Some((key, _)), Some(gate)) = (&taint, closed)
            && warm(&snapshot)
            && held_by != Some(gate.what)
        {
            tracing::info!(node, taint = %key, idle = snapshot.idle_eligible, waiting_for = gate.what,
                "startup taint: the pool holds warm IPs; kept until the rest is ready");
            held_by = Some(gate.what);
        }
        if let Some((key, effect)) = &taint
            && warm(&snapshot)
            && closed.is_none()
        {
            match remove_taint(&api, node, key, *effect).await {
                Ok(done) => {
                    tracing::info!(node, taint = %key, effect = %effect, idle = snapshot.idle_eligible,
                        outcome = ?done, "startup taint: the pool holds warm IPs, pods may be scheduled here");
                    taint = None;
                }
                Err(e) => {
                    tracing::warn!(node, taint = %key, error = %e, retry_in = ?retry.pause(),
                        "startup taint: cannot remove it");
                    failed = true;
                }
            }
        }
        if config.condition && !failed {
            let verdict = judge(&snapshot, &reach);
            let due = published.as_ref().is_none_or(|(last, at)| {
                !last.same_state(&verdict) || now.duration_since(*at) >= config.heartbeat
            });
            if due {
                match condition::publish(&api, node, &verdict).await {
                    Ok(()) => {
                        if published
                            .as_ref()
                            .is_none_or(|(last, _)| !last.same_state(&verdict))
                        {
                            tracing::info!(node, condition = CONDITION_TYPE, status = verdict.status(),
                                reason = verdict.reason.as_str(), message = %verdict.message,
                                "node condition");
                        }
                        published = Some((verdict, now));
                    }
                    Err(e) => {
                        tracing::warn!(node, condition = CONDITION_TYPE, error = %e, retry_in = ?retry.pause(),
                            "node condition: cannot publish it");
                        failed = true;
                    }
                }
            }
        }
        if failed {
            retry_at = Some(now + retry.failed());
        } else {
            retry_at = None;
            retry.succeeded();
        }
    }
}
