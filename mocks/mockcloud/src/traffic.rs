//! What happens to a request before it reaches the world: account-level throttling, denied actions,
//! injected faults, and the per-action counters and call log tests read back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config::{ActionClass, Throttling};
use crate::error::Ec2Error;

/// What an injected fault does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer with this EC2 error; the action is not performed.
    Error {
        code: String,
        #[serde(default = "default_status")]
        status: u16,
        #[serde(default)]
        message: Option<String>,
    },
    /// Wait this long, then answer `InternalError` (500); the action is not performed.
    Hang { ms: u64 },
    /// Perform the action, then hold the reply this long (a client timing out will retry something
    /// that already happened: what ClientToken exists for).
    SlowReply { ms: u64 },
}

fn default_status() -> u16 {
    400
}

fn default_probability() -> f64 {
    1.0
}

/// A fault rule: which action (all when `action` is None), what, how many times (forever when None),
/// and with what probability each eligible call is hit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub action: Option<String>,
    #[serde(flatten)]
    pub kind: FaultKind,
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default = "default_probability")]
    pub probability: f64,
}

impl Fault {
    /// The next `count` calls of `action` fail with `code` (status from EC2's usual mapping).
    pub fn error(action: &str, code: &str, count: u32) -> Self {
        let status = match code {
            "RequestLimitExceeded" | "Unavailable" | "ServiceUnavailable" => 503,
            "InternalError" | "InternalFailure" => 500,
            "UnauthorizedOperation" => 403,
            _ => 400,
        };
        Self {
            action: Some(action.to_owned()),
            kind: FaultKind::Error {
                code: code.to_owned(),
                status,
                message: None,
            },
            count: Some(count),
            probability: 1.0,
        }
    }

    /// Every call (of `action`, or all) fails with `code` with probability `rate`, forever.
    pub fn rate(action: Option<&str>, code: &str, rate: f64) -> Self {
        Self {
            action: action.map(str::to_owned),
            count: None,
            probability: rate,
            ..Self::error("", code, 0)
        }
    }

    /// The next `count` calls of `action` are performed but answered only after `delay`.
    pub fn slow_reply(action: &str, delay: Duration, count: u32) -> Self {
        Self {
            action: Some(action.to_owned()),
            kind: FaultKind::SlowReply {
                ms: delay.as_millis() as u64,
            },
            count: Some(count),
            probability: 1.0,
        }
    }

    /// The next `count` calls of `action` hang for `delay` and then fail, not performed.
    pub fn hang(action: &str, delay: Duration, count: u32) -> Self {
        Self {
            kind: FaultKind::Hang {
                ms: delay.as_millis() as u64,
            },
            ..Self::slow_reply(action, delay, count)
        }
    }
}

/// Counters of one action.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionCounters {
    /// Requests received (including throttled and failed ones).
    pub calls: u64,
    pub ok: u64,
    /// Answered `RequestLimitExceeded` by the account bucket.
    pub throttled: u64,
    /// Errors by code (throttles from the bucket excluded; injected errors included).
    pub errors: BTreeMap<String, u64>,
}

/// One call as it reached mockcloud: when (ms since start or last reset), which action, the outcome
/// (`ok` or the error code).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub at_ms: f64,
    pub action: String,
    pub outcome: String,
}

/// Per-action counters plus totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub actions: BTreeMap<String, ActionCounters>,
    pub imds_requests: u64,
    pub imds_unauthorized: u64,
}

impl Counters {
    pub fn calls(&self, action: &str) -> u64 {
        self.actions.get(action).map_or(0, |c| c.calls)
    }

    pub fn ok(&self, action: &str) -> u64 {
        self.actions.get(action).map_or(0, |c| c.ok)
    }

    pub fn throttled(&self, action: &str) -> u64 {
        self.actions.get(action).map_or(0, |c| c.throttled)
    }

    pub fn total_calls(&self) -> u64 {
        self.actions.values().map(|c| c.calls).sum()
    }

    pub fn total_throttled(&self) -> u64 {
        self.actions.values().map(|c| c.throttled).sum()
    }

    /// Successful calls of mutating actions (Create/Attach/Assign/...): what a pool spends.
    pub fn mutating_ok(&self) -> u64 {
        self.actions
            .iter()
            .filter(|(a, _)| ActionClass::of(a) == ActionClass::Mutating)
            .map(|(_, c)| c.ok)
            .sum()
    }
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

/// The decision for one request.
#[derive(Debug)]
pub enum Admission {
    /// Go ahead, and hold the reply this long after performing it.
    Proceed { slow_reply: Option<Duration> },
    /// Do not perform; wait this long, then answer this error.
    Reject { after: Duration, error: Ec2Error },
}

/// Mutable traffic state, behind the mock's lock.
#[derive(Debug)]
pub struct Traffic {
    pub throttling: Throttling,
    buckets: BTreeMap<ActionClass, BucketState>,
    faults: Vec<Fault>,
    denied: BTreeSet<String>,
    counters: Counters,
    log: Vec<CallRecord>,
    epoch: Instant,
}

/// At most this many call records are kept (about 40 MB); older ones are dropped first.
const MAX_LOG: usize = 500_000;

impl Traffic {
    pub fn new(throttling: Throttling, now: Instant) -> Self {
        Self {
            throttling,
            buckets: BTreeMap::new(),
            faults: Vec::new(),
            denied: BTreeSet::new(),
            counters: Counters::default(),
            log: Vec::new(),
            epoch: now,
        }
    }

    /// Takes a token from the action class's account bucket.
    fn take_token(&mut self, class: ActionClass, now: Instant) -> bool {
        if !self.throttling.enabled {
            return true;
        }
        let cfg = self.throttling.bucket(class);
        let b = self.buckets.entry(class).or_insert(BucketState {
            tokens: cfg.capacity,
            last: now,
        });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * cfg.refill_per_sec).min(cfg.capacity);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Counts the request and decides what happens to it.
    pub fn admit(&mut self, action: &str, now: Instant) -> Admission {
        self.counters
            .actions
            .entry(action.to_owned())
            .or_default()
            .calls += 1;
        if !self.take_token(ActionClass::of(action), now) {
            return Admission::Reject {
                after: Duration::ZERO,
                error: Ec2Error::throttled(),
            };
        }
        if self.denied.contains(action) {
            return Admission::Reject {
                after: Duration::ZERO,
                error: Ec2Error::new(
                    403,
                    "UnauthorizedOperation",
                    format!("You are not authorized to perform this operation. (ec2:{action})"),
                ),
            };
        }
        let mut rng = rand::rng();
        let mut hit = None;
        for (i, f) in self.faults.iter_mut().enumerate() {
            if f.action.as_deref().is_some_and(|a| a != action) || f.count == Some(0) {
                continue;
            }
            if f.probability < 1.0 && !rng.random_bool(f.probability.clamp(0.0, 1.0)) {
                continue;
            }
            if let Some(c) = &mut f.count {
                *c -= 1;
            }
            hit = Some((i, f.kind.clone()));
            break;
        }
        self.faults.retain(|f| f.count != Some(0));
        match hit.map(|(_, k)| k) {
            None => Admission::Proceed { slow_reply: None },
            Some(FaultKind::SlowReply { ms }) => Admission::Proceed {
                slow_reply: Some(Duration::from_millis(ms)),
            },
            Some(FaultKind::Hang { ms }) => Admission::Reject {
                after: Duration::from_millis(ms),
                error: Ec2Error::internal(),
            },
            Some(FaultKind::Error {
                code,
                status,
                message,
            }) => Admission::Reject {
                after: Duration::ZERO,
                error: Ec2Error::new(
                    status,
                    &code,
                    message.unwrap_or_else(|| format!("Injected fault: {code}")),
                ),
            },
        }
    }

    /// Records how a request ended.
    pub fn record(&mut self, action: &str, outcome: Result<(), &Ec2Error>, now: Instant) {
        let c = self.counters.actions.entry(action.to_owned()).or_default();
        let label = match outcome {
            Ok(()) => {
                c.ok += 1;
                "ok".to_owned()
            }
            Err(e) if e.code == "RequestLimitExceeded" => {
                c.throttled += 1;
                e.code.clone()
            }
            Err(e) => {
                *c.errors.entry(e.code.clone()).or_default() += 1;
                e.code.clone()
            }
        };
        if self.log.len() >= MAX_LOG {
            self.log.drain(..MAX_LOG / 10);
        }
        self.log.push(CallRecord {
            at_ms: now.saturating_duration_since(self.epoch).as_secs_f64() * 1000.0,
            action: action.to_owned(),
            outcome: label,
        });
    }

    pub fn record_imds(&mut self, authorized: bool) {
        self.counters.imds_requests += 1;
        if !authorized {
            self.counters.imds_unauthorized += 1;
        }
    }

    pub fn counters(&self) -> Counters {
        self.counters.clone()
    }

    pub fn log(&self) -> Vec<CallRecord> {
        self.log.clone()
    }

    /// Zeroes counters and the log; the log's clock restarts at `now`.
    pub fn reset(&mut self, now: Instant) {
        self.counters = Counters::default();
        self.log.clear();
        self.epoch = now;
    }

    pub fn add_fault(&mut self, f: Fault) {
        self.faults.push(f);
    }

    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    pub fn faults(&self) -> Vec<Fault> {
        self.faults.clone()
    }

    pub fn set_denied(&mut self, action: &str, denied: bool) {
        if denied {
            self.denied.insert(action.to_owned());
        } else {
            self.denied.remove(action);
        }
    }

    /// Replaces the throttling config; buckets start full again.
    pub fn set_throttling(&mut self, t: Throttling) {
        self.throttling = t;
        self.buckets.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Bucket;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_capacity_then_refill_rate() {
        let now = Instant::now();
        let mut t = Traffic::new(
            Throttling {
                enabled: true,
                mutating: Bucket {
                    capacity: 10.0,
                    refill_per_sec: 2.0,
                },
                describe: Bucket {
                    capacity: 5.0,
                    refill_per_sec: 1.0,
                },
            },
            now,
        );
        let ok = (0..20)
            .filter(|_| {
                matches!(
                    t.admit("AssignPrivateIpAddresses", now),
                    Admission::Proceed { .. }
                )
            })
            .count();
        assert_eq!(ok, 10);
        let later = now + Duration::from_secs(3);
        let ok = (0..20)
            .filter(|_| {
                matches!(
                    t.admit("AssignPrivateIpAddresses", later),
                    Admission::Proceed { .. }
                )
            })
            .count();
        assert_eq!(ok, 6);
        // The describe bucket is separate.
        let ok = (0..20)
            .filter(|_| matches!(t.admit("DescribeSubnets", later), Admission::Proceed { .. }))
            .count();
        assert_eq!(ok, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn counted_faults_run_out() {
        let now = Instant::now();
        let mut t = Traffic::new(Throttling::disabled(), now);
        t.add_fault(Fault::error("CreateTags", "InternalError", 2));
        for _ in 0..2 {
            match t.admit("CreateTags", now) {
                Admission::Reject { error, .. } => {
                    assert_eq!((error.code.as_str(), error.status), ("InternalError", 500))
                }
                other => panic!("expected a fault, got {other:?}"),
            }
        }
        assert!(matches!(
            t.admit("CreateTags", now),
            Admission::Proceed { .. }
        ));
        assert!(matches!(
            t.admit("DeleteTags", now),
            Admission::Proceed { .. }
        ));
        assert!(t.faults().is_empty());
    }
}
