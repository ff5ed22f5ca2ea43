//! What happens to a request before it reaches the world: account-level throttling (one bucket per
//! API, [`crate::throttling`]), denied actions, injected faults, and the per-action counters and
//! call log tests read back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::actions::ActionClass;
use crate::error::Ec2Error;
use crate::throttling::{self, Bucket, BucketLevel, Category, Throttling, ThrottlingError};

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

impl BucketState {
    /// The tokens at `now`: what was left, refilled since, at most the capacity.
    fn level(&self, size: Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        (self.tokens + elapsed * size.refill_per_sec).min(size.capacity)
    }
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
    /// Token levels by bucket name; a bucket not here is full.
    buckets: BTreeMap<String, BucketState>,
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

    /// Takes a token from the bucket (an API's, [`throttling::bucket_for`]).
    fn take_token(&mut self, bucket: &str, now: Instant) -> bool {
        if !self.throttling.enabled {
            return true;
        }
        let size = self.throttling.bucket(bucket);
        let b = self
            .buckets
            .entry(bucket.to_owned())
            .or_insert(BucketState {
                tokens: size.capacity,
                last: now,
            });
        b.tokens = b.level(size, now);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Another tenant of the account makes `n` calls that draw from `bucket`: each takes a token as a
    /// real call would, the first one the bucket cannot serve is throttled and the rest are not made
    /// (a throttled call spends nothing). Returns the calls that got a token (all `n` with throttling
    /// off). Not counted and not logged: the counters and the log are the calls that reach this
    /// endpoint, and the tenant's do not.
    pub fn spend(&mut self, bucket: &str, n: u32, now: Instant) -> Result<u32, ThrottlingError> {
        if !throttling::is_bucket(bucket) {
            return Err(ThrottlingError::UnknownBucket(bucket.to_owned()));
        }
        Ok((0..n).take_while(|_| self.take_token(bucket, now)).count() as u32)
    }

    /// Counts the request and decides what happens to it; `bucket` is the throttling bucket it draws
    /// from ([`throttling::bucket_for`]).
    pub fn admit(&mut self, action: &str, bucket: &str, now: Instant) -> Admission {
        self.counters
            .actions
            .entry(action.to_owned())
            .or_default()
            .calls += 1;
        if !self.take_token(bucket, now) {
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

    /// Sizes one bucket or a category ([`Throttling::set`]); each bucket whose size changed starts
    /// full again, the others keep their tokens.
    pub fn set_bucket(&mut self, name: &str, size: Bucket) -> Result<(), ThrottlingError> {
        let before = self.throttling.clone();
        self.throttling.set(name, size)?;
        for n in throttling::bucket_names() {
            if before.bucket(&n) != self.throttling.bucket(&n) {
                self.buckets.remove(&n);
            }
        }
        Ok(())
    }

    /// Every bucket, its size and its tokens at `now`.
    pub fn levels(&self, now: Instant) -> Vec<BucketLevel> {
        throttling::bucket_names()
            .into_iter()
            .map(|name| {
                let size = self.throttling.bucket(&name);
                let tokens = self
                    .buckets
                    .get(&name)
                    .map_or(size.capacity, |b| b.level(size, now));
                BucketLevel {
                    category: Category::of(&name),
                    own: self.throttling.apis.contains_key(&name),
                    capacity: size.capacity,
                    refill_per_sec: size.refill_per_sec,
                    tokens,
                    bucket: name,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `n` calls of `action` (filtered) get through at `at`.
    fn admitted(t: &mut Traffic, action: &str, n: usize, at: Instant) -> usize {
        (0..n)
            .filter(|_| matches!(t.admit(action, action, at), Admission::Proceed { .. }))
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_capacity_then_refill_rate() {
        let now = Instant::now();
        let mut t = Traffic::new(
            Throttling::uniform(Bucket::new(10.0, 2.0), Bucket::new(5.0, 1.0)),
            now,
        );
        assert_eq!(admitted(&mut t, "AssignPrivateIpAddresses", 20, now), 10);
        let later = now + Duration::from_secs(3);
        assert_eq!(admitted(&mut t, "AssignPrivateIpAddresses", 20, later), 6);
        // The describe bucket is separate.
        assert_eq!(admitted(&mut t, "DescribeSubnets", 20, later), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn each_api_spends_only_its_own_bucket() {
        let now = Instant::now();
        let mut t = Traffic::new(
            Throttling::uniform(Bucket::new(4.0, 1.0), Bucket::new(4.0, 1.0)),
            now,
        );
        assert_eq!(
            admitted(&mut t, "ModifyNetworkInterfaceAttribute", 10, now),
            4
        );
        // Six throttled Modify calls took nothing from the other APIs.
        assert_eq!(admitted(&mut t, "CreateNetworkInterface", 10, now), 4);
        assert_eq!(admitted(&mut t, "AssignPrivateIpAddresses", 10, now), 4);
        let level = |t: &Traffic, name: &str, at: Instant| {
            t.levels(at)
                .into_iter()
                .find(|l| l.bucket == name)
                .map(|l| l.tokens)
        };
        assert_eq!(level(&t, "ModifyNetworkInterfaceAttribute", now), Some(0.0));
        assert_eq!(level(&t, "AttachNetworkInterface", now), Some(4.0));
        assert_eq!(
            level(&t, "DescribeNetworkInterfaces:unfiltered", now),
            Some(4.0)
        );
        // Half a second refills half a token: not enough for a call, and the level says so.
        let half = now + Duration::from_millis(500);
        assert_eq!(level(&t, "CreateNetworkInterface", half), Some(0.5));
        assert_eq!(admitted(&mut t, "CreateNetworkInterface", 1, half), 0);
        assert_eq!(
            admitted(
                &mut t,
                "CreateNetworkInterface",
                1,
                now + Duration::from_secs(1)
            ),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resizing_one_bucket_refills_only_that_one() {
        let now = Instant::now();
        let mut t = Traffic::new(Throttling::default(), now);
        assert_eq!(admitted(&mut t, "CreateTags", 150, now), 100);
        assert_eq!(admitted(&mut t, "DeleteTags", 150, now), 100);
        t.set_bucket("CreateTags", Bucket::new(3.0, 0.01)).unwrap();
        assert_eq!(
            admitted(&mut t, "CreateTags", 10, now),
            3,
            "resized: full again"
        );
        assert_eq!(
            admitted(&mut t, "DeleteTags", 10, now),
            0,
            "untouched: still empty"
        );
        assert!(t.set_bucket("CreateTag", Bucket::new(3.0, 1.0)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn another_tenants_calls_spend_the_same_bucket() {
        let now = Instant::now();
        let mut t = Traffic::new(Throttling::default(), now);
        // Half of AssignPrivateIpAddresses's 100: the account's own calls get the other half.
        assert_eq!(t.spend("AssignPrivateIpAddresses", 50, now), Ok(50));
        assert_eq!(admitted(&mut t, "AssignPrivateIpAddresses", 80, now), 50);
        // Empty: the tenant's next calls are throttled and take nothing.
        assert_eq!(t.spend("AssignPrivateIpAddresses", 3, now), Ok(0));
        // Two seconds refill 10 tokens; the tenant takes 4 of them, the account gets 6.
        let later = now + Duration::from_secs(2);
        assert_eq!(t.spend("AssignPrivateIpAddresses", 4, later), Ok(4));
        assert_eq!(admitted(&mut t, "AssignPrivateIpAddresses", 10, later), 6);
        // Other buckets untouched; the tenant's calls are not the account's counted calls.
        assert_eq!(admitted(&mut t, "CreateNetworkInterface", 1, later), 1);
        assert_eq!(t.counters().calls("AssignPrivateIpAddresses"), 90);
        assert_eq!(
            t.spend("AssignPrivateIpAdresses", 1, later),
            Err(ThrottlingError::UnknownBucket(
                "AssignPrivateIpAdresses".into()
            ))
        );
        let mut off = Traffic::new(Throttling::disabled(), now);
        assert_eq!(off.spend("CreateTags", 500, now), Ok(500));
    }

    #[tokio::test(start_paused = true)]
    async fn counted_faults_run_out() {
        let now = Instant::now();
        let mut t = Traffic::new(Throttling::disabled(), now);
        t.add_fault(Fault::error("CreateTags", "InternalError", 2));
        for _ in 0..2 {
            match t.admit("CreateTags", "CreateTags", now) {
                Admission::Reject { error, .. } => {
                    assert_eq!((error.code.as_str(), error.status), ("InternalError", 500))
                }
                other => panic!("expected a fault, got {other:?}"),
            }
        }
        assert_eq!(admitted(&mut t, "CreateTags", 1, now), 1);
        assert_eq!(admitted(&mut t, "DeleteTags", 1, now), 1);
        assert!(t.faults().is_empty());
    }
}
