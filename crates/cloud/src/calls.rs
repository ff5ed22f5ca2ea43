//! Call accounting for the cloud layer: every EC2 and IMDS call counted and timed by API name and
//! outcome, plus retries and rate-limiter waits, and every EC2 attempt counted by what it was for
//! ([`Purpose`]) and whether EC2 throttled it.
//!
//! [`CallStats`] is shared (`Arc`) by the EC2 client, the IMDS client and the limiter; the metrics
//! endpoint reads it through [`CallStats::snapshot`], which returns plain data (no locks, no
//! Prometheus types), so the exporter can be written against it later without touching this layer.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::purpose::Purpose;
use super::{CloudError, CloudResult};

/// How one call ended, as counted. Matches the `outcome` label the metrics endpoint will export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The call succeeded.
    Ok,
    /// `RequestLimitExceeded` / `Throttling`.
    Throttled,
    /// 5xx, timeouts, connection failures.
    Transient,
    /// Subnet full, per-ENI IP limit, attachment limit.
    Capacity,
    /// `*.NotFound` (or a 404 from IMDS).
    NotFound,
    /// `UnauthorizedOperation`: a missing IAM permission.
    Unauthorized,
    /// Any other refusal (bad parameter, resource in use, unparseable metadata, ...).
    Rejected,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Throttled,
        Outcome::Transient,
        Outcome::Capacity,
        Outcome::NotFound,
        Outcome::Unauthorized,
        Outcome::Rejected,
    ];

    /// The outcome of a finished call.
    pub fn of<T>(result: &CloudResult<T>) -> Self {
        match result {
            Ok(_) => Outcome::Ok,
            Err(e) => Self::from_error(e),
        }
    }

    /// The outcome an error stands for.
    pub fn from_error(err: &CloudError) -> Self {
        match err {
            CloudError::Throttled { .. } => Outcome::Throttled,
            CloudError::Transient { .. } | CloudError::RetriesExhausted { .. } => {
                Outcome::Transient
            }
            CloudError::SubnetFull { .. }
            | CloudError::IpLimitExceeded { .. }
            | CloudError::AttachmentLimitExceeded { .. }
            | CloudError::NoFreePrefix { .. } => Outcome::Capacity,
            CloudError::NotFound { .. } => Outcome::NotFound,
            CloudError::Unauthorized { .. } => Outcome::Unauthorized,
            CloudError::Rejected { .. }
            | CloudError::NoIpv6Cidr { .. }
            | CloudError::Metadata(_)
            | CloudError::NotOurs { .. } => Outcome::Rejected,
        }
    }

    /// The label value (`ok`, `throttled`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Throttled => "throttled",
            Outcome::Transient => "transient",
            Outcome::Capacity => "capacity",
            Outcome::NotFound => "not_found",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Rejected => "rejected",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Upper bounds (seconds) of the latency/wait histogram buckets; a last, implicit bucket is `+Inf`.
/// The Prometheus client's default buckets, which fit both IMDS (ms) and throttled EC2 calls (s).
pub const HISTOGRAM_BOUNDS_SECONDS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A duration histogram as plain data: `buckets[i]` counts observations `<=
/// HISTOGRAM_BOUNDS_SECONDS[i]` and above the previous bound (not cumulative); the last entry is the
/// `+Inf` bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Histogram {
    /// Observations.
    pub count: u64,
    /// Sum of the observations.
    pub sum: Duration,
    /// Per-bucket counts (see the type's docs).
    pub buckets: [u64; HISTOGRAM_BOUNDS_SECONDS.len() + 1],
}

impl Histogram {
    /// Add one observation.
    pub fn observe(&mut self, d: Duration) {
        self.count += 1;
        self.sum += d;
        let secs = d.as_secs_f64();
        let idx = HISTOGRAM_BOUNDS_SECONDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(HISTOGRAM_BOUNDS_SECONDS.len());
        self.buckets[idx] += 1;
    }

    /// Cumulative bucket counts, as Prometheus exposes them (`le` buckets, last is `+Inf`).
    pub fn cumulative(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .scan(0u64, |acc, &n| {
                *acc += n;
                Some(*acc)
            })
            .collect()
    }
}

/// One (api, outcome) series of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallSeries {
    /// EC2 action name (`AssignPrivateIpAddresses`) or `imds:<key>` for metadata reads.
    pub api: String,
    /// How the attempts ended.
    pub outcome: Outcome,
    /// Count and latency of those attempts.
    pub latency: Histogram,
}

/// One (purpose, api) series of a snapshot: EC2 attempts only (IMDS reads have no purpose).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PurposeSeries {
    /// What the attempts were for.
    pub purpose: Purpose,
    /// EC2 action name.
    pub api: String,
    /// Attempts that reached the wire, throttled ones included.
    pub calls: u64,
    /// Of those, the ones EC2 throttled.
    pub throttled: u64,
}

/// A point-in-time copy of everything [`CallStats`] counted.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CallStatsSnapshot {
    /// Per (api, outcome): count and latency of each attempt that reached the wire.
    pub calls: Vec<CallSeries>,
    /// Per api: attempts made after a throttled/transient failure.
    pub retries: BTreeMap<String, u64>,
    /// Per api: retries that were given up (attempts or time bound reached).
    pub retries_exhausted: BTreeMap<String, u64>,
    /// Per limiter bucket (`mutating`, `describe`): time callers waited for a token.
    pub limiter_waits: BTreeMap<String, Histogram>,
    /// Per (purpose, api): EC2 attempts and how many were throttled.
    pub by_purpose: Vec<PurposeSeries>,
}

impl CallStatsSnapshot {
    /// Attempts of `api` with `outcome`.
    pub fn count(&self, api: &str, outcome: Outcome) -> u64 {
        self.calls
            .iter()
            .filter(|s| s.api == api && s.outcome == outcome)
            .map(|s| s.latency.count)
            .sum()
    }

    /// All attempts of `api`, any outcome.
    pub fn calls(&self, api: &str) -> u64 {
        self.calls
            .iter()
            .filter(|s| s.api == api)
            .map(|s| s.latency.count)
            .sum()
    }

    /// All attempts with `outcome`, any api.
    pub fn total(&self, outcome: Outcome) -> u64 {
        self.calls
            .iter()
            .filter(|s| s.outcome == outcome)
            .map(|s| s.latency.count)
            .sum()
    }

    /// Retries of `api`.
    pub fn retries(&self, api: &str) -> u64 {
        self.retries.get(api).copied().unwrap_or(0)
    }

    /// Retries of every api.
    pub fn total_retries(&self) -> u64 {
        self.retries.values().sum()
    }

    /// EC2 attempts made for `purpose`, any api.
    pub fn purpose_calls(&self, purpose: Purpose) -> u64 {
        self.by_purpose
            .iter()
            .filter(|s| s.purpose == purpose)
            .map(|s| s.calls)
            .sum()
    }

    /// EC2 attempts made for `purpose` that EC2 throttled, any api.
    pub fn purpose_throttled(&self, purpose: Purpose) -> u64 {
        self.by_purpose
            .iter()
            .filter(|s| s.purpose == purpose)
            .map(|s| s.throttled)
            .sum()
    }

    /// Total time spent waiting for tokens, all buckets.
    pub fn total_limiter_wait(&self) -> Duration {
        self.limiter_waits.values().map(|h| h.sum).sum()
    }
}

#[derive(Default)]
struct Inner {
    calls: BTreeMap<(String, Outcome), Histogram>,
    retries: BTreeMap<String, u64>,
    retries_exhausted: BTreeMap<String, u64>,
    waits: BTreeMap<String, Histogram>,
    /// (purpose, api) -> (attempts, throttled).
    purposes: BTreeMap<(Purpose, String), (u64, u64)>,
}

/// Counters and timers of cloud calls, shared by every client of one daemon.
#[derive(Default)]
pub struct CallStats {
    inner: Mutex<Inner>,
}

impl fmt::Debug for CallStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallStats").finish_non_exhaustive()
    }
}

impl CallStats {
    /// Empty counters.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding this lock cannot leave the counters inconsistent in a way that
        // matters (each update is a single increment), so a poisoned lock is simply reused.
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Count one attempt of `api` that ended with `outcome` after `took`.
    pub fn record_call(&self, api: &str, outcome: Outcome, took: Duration) {
        self.with(|i| {
            i.calls
                .entry((api.to_owned(), outcome))
                .or_default()
                .observe(took)
        });
    }

    /// Count one EC2 attempt of `api` made for `purpose` (the limiter's, so IMDS reads never count).
    pub fn record_purpose(&self, purpose: Purpose, api: &str, throttled: bool) {
        self.with(|i| {
            let (calls, thr) = i.purposes.entry((purpose, api.to_owned())).or_default();
            *calls += 1;
            *thr += u64::from(throttled);
        });
    }

    /// Count one retry of `api`.
    pub fn record_retry(&self, api: &str) {
        self.with(|i| *i.retries.entry(api.to_owned()).or_default() += 1);
    }

    /// Count one retry loop of `api` that gave up.
    pub fn record_retries_exhausted(&self, api: &str) {
        self.with(|i| *i.retries_exhausted.entry(api.to_owned()).or_default() += 1);
    }

    /// Record that a caller waited `waited` for a token of `bucket` (zero waits count too).
    pub fn record_limiter_wait(&self, bucket: &str, waited: Duration) {
        self.with(|i| {
            i.waits
                .entry(bucket.to_owned())
                .or_default()
                .observe(waited)
        });
    }

    /// A copy of everything counted so far.
    pub fn snapshot(&self) -> CallStatsSnapshot {
        self.with(|i| CallStatsSnapshot {
            calls: i
                .calls
                .iter()
                .map(|((api, outcome), h)| CallSeries {
                    api: api.clone(),
                    outcome: *outcome,
                    latency: h.clone(),
                })
                .collect(),
            retries: i.retries.clone(),
            retries_exhausted: i.retries_exhausted.clone(),
            limiter_waits: i.waits.clone(),
            by_purpose: i
                .purposes
                .iter()
                .map(|((purpose, api), &(calls, throttled))| PurposeSeries {
                    purpose: *purpose,
                    api: api.clone(),
                    calls,
                    throttled,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_cumulative() {
        let mut h = Histogram::default();
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.count, 3);
        assert_eq!(h.sum, Duration::from_millis(60_008));
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[HISTOGRAM_BOUNDS_SECONDS.len()], 1);
        assert_eq!(*h.cumulative().last().unwrap(), 3);
    }

    #[test]
    fn snapshot_counts_by_api_and_outcome() {
        let s = CallStats::new();
        s.record_call(
            "AssignPrivateIpAddresses",
            Outcome::Ok,
            Duration::from_millis(3),
        );
        s.record_call(
            "AssignPrivateIpAddresses",
            Outcome::Throttled,
            Duration::from_millis(3),
        );
        s.record_call(
            "AssignPrivateIpAddresses",
            Outcome::Throttled,
            Duration::from_millis(3),
        );
        s.record_call(
            "DescribeNetworkInterfaces",
            Outcome::Ok,
            Duration::from_millis(3),
        );
        s.record_retry("AssignPrivateIpAddresses");
        s.record_limiter_wait("mutating", Duration::from_millis(200));
        let snap = s.snapshot();
        assert_eq!(snap.calls("AssignPrivateIpAddresses"), 3);
        assert_eq!(
            snap.count("AssignPrivateIpAddresses", Outcome::Throttled),
            2
        );
        assert_eq!(snap.total(Outcome::Ok), 2);
        assert_eq!(snap.retries("AssignPrivateIpAddresses"), 1);
        assert_eq!(snap.total_limiter_wait(), Duration::from_millis(200));
    }

    #[test]
    fn outcome_classification() {
        let e = CloudError::SubnetFull {
            api: "x".into(),
            message: "m".into(),
        };
        assert_eq!(Outcome::from_error(&e), Outcome::Capacity);
        assert_eq!(Outcome::of::<()>(&Ok(())), Outcome::Ok);
        assert_eq!(Outcome::NotFound.as_str(), "not_found");
    }
}
