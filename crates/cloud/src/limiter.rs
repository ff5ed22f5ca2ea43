//! Rate limiting and retries for every EC2 call.
//!
//! Each attempt of an EC2 call goes through: the [`TokenBucket`] of its API (one per EC2 API, as
//! EC2 has, see [`buckets`]; sized from its class, mutating or describe, unless configured), then
//! the SDK; a throttled or transient failure is retried after an exponential backoff with full
//! jitter ([`BackoffPolicy`]), and the retry passes the bucket again, so retries never exceed the
//! configured rate either. Everything else (capacity, not found, rejected, unauthorized) is returned
//! to the caller at once.
//!
//! All timing uses tokio's clock (`tokio::time::Instant`, `sleep`), so `tokio::time::pause` drives
//! the buckets and the backoffs in tests. `governor`'s default clock is not tokio's; the buckets
//! here run governor's GCRA on a [`TokioClock`].
//!
//! # Default rates, and why
//!
//! EC2 throttles per account and region with token buckets (AWS EC2 developer guide, "Request
//! throttling for the Amazon EC2 API"; the default buckets, which mockcloud models, are 200 tokens
//! refilled at 5/s for mutating actions and 100 refilled at 20/s for non-mutating ones). That
//! budget is shared by every node of every cluster in the account and region, so a node must not
//! be able to spend it alone. The per-node defaults, for each API of the class, are:
//!
//! - **mutating: 2 qps, burst 10.** A node's real need is bursty and small: first boot or a
//!   scale-up does create + attach + DeleteOnTermination + one batched assign per ENI (≈ 4-8
//!   calls), which the burst of 10 absorbs without waiting; afterwards the pool batches
//!   assign/unassign, so sustained need is well under one call per second. Capping a node at 2/s
//!   keeps any single misbehaving node below half of the account's mutating refill.
//! - **describe: 5 qps, burst 20.** Describes are cheaper for EC2 and refill faster; reconcile,
//!   the ENI lifecycle's confirmations and the ambiguous-assign check need a handful at a time.
//!
//! A fleet of N nodes can still ask for N × those rates; the per-node caps bound the damage of a
//! burst, and the jittered backoff on `RequestLimitExceeded` spreads the fleet out when the
//! account's bucket is dry. Large fleets should lower the rates (they are configurable).
//!
//! # Under throttling: one probe at a time, and pods first
//!
//! After EC2 throttles a call, the API's throttle gate pauses every call of that API on the node
//! (EC2 evaluates each API on its own bucket, so the node's other APIs go on), and stays
//! *recovering* (its pause non-zero) until enough calls have succeeded to halve the pause to
//! nothing. While it recovers:
//!
//! - only one attempt of the API is on the wire at a time (a probe): a node that fires its whole
//!   backlog the moment the pause ends spends the account's trickle on throttled attempts;
//! - refills and give-backs ([`Purpose::yields`]) wait, after the pause, while a call of another
//!   purpose (a pod's, the reconcile's) is waiting or running on the API, so the trickle goes to
//!   the calls a pod waits on. The wait is bounded (2 × the longest pause, 20 s): a steady stream of
//!   throttled pod calls never starves a refill for good; and with no pod-driven call about, a
//!   refill goes as the probe itself (otherwise nothing would succeed and end the recovery).
//!
//! # Default retries
//!
//! 6 attempts, backoff base 250 ms doubling to a 10 s cap, full jitter, and no retry starts after
//! 30 s: long enough to ride out a throttling storm of a few seconds, short enough that a pod ADD
//! waiting on an IP gets an answer (or a typed error the pool can back off on) well within the
//! kubelet's CNI timeout.
//!
//! Work run in [`crate::deadline::without_throttle_retries`] (the pool's assigns) takes a throttle as
//! its answer instead: the caller plans the next try itself, with whatever came in meanwhile.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::ops::Add;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub use super::backoff::{Backoff, BackoffPolicy};
use super::calls::{CallStats, Outcome};
use super::purpose::{Purpose, current_purpose};
use super::throttle::{Admission, ThrottleGate, ThrottleGates};
use super::{CloudError, CloudResult};
use buckets::ApiBuckets;
pub use buckets::EC2_APIS;

/// A governor clock on tokio's time, so `tokio::time::pause` drives the buckets.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

/// A [`tokio::time::Instant`] that governor can compute with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokioInstant(pub Instant);

impl Add<Nanos> for TokioInstant {
    type Output = Self;
    fn add(self, other: Nanos) -> Self {
        Self(self.0 + Duration::from(other))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        self.0.saturating_duration_since(earlier.0).into()
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        Self(self.0.checked_sub(duration.into()).unwrap_or(self.0))
    }
}

impl Clock for TokioClock {
    type Instant = TokioInstant;
    fn now(&self) -> TokioInstant {
        TokioInstant(Instant::now())
    }
}

/// Rate of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Sustained calls per second (may be fractional, e.g. 0.5).
    pub qps: f64,
    /// Calls allowed at once after a quiet period.
    pub burst: u32,
}

/// Rates of the two EC2 call classes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateLimitConfig {
    /// Create/attach/detach/delete/modify/assign/unassign/tag.
    pub mutating: BucketConfig,
    /// Describe*.
    pub describe: BucketConfig,
}

impl Default for RateLimitConfig {
    /// Mutating 2 qps burst 10, describe 5 qps burst 20 (reasoning in the module docs).
    fn default() -> Self {
        Self {
            mutating: BucketConfig {
                qps: 2.0,
                burst: 10,
            },
            describe: BucketConfig {
                qps: 5.0,
                burst: 20,
            },
        }
    }
}

/// Everything the [`Limiter`] needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimiterConfig {
    /// The rate of each API's bucket, by the API's class.
    pub rates: RateLimitConfig,
    /// The rate of an API's bucket when it is not its class's (keys: [`EC2_APIS`]).
    #[serde(default)]
    pub per_api: BTreeMap<String, BucketConfig>,
    /// Retries of throttled and transient failures.
    pub retry: BackoffPolicy,
}

/// A rate or retry setting that cannot work.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum LimiterConfigError {
    /// A bucket's rate is zero, negative or not a number.
    #[error("{bucket} bucket: qps must be a positive finite number, got {qps}")]
    BadQps { bucket: &'static str, qps: f64 },
    /// A bucket without room for a single call.
    #[error("{bucket} bucket: burst must be at least 1")]
    ZeroBurst { bucket: &'static str },
    /// A per-API rate for an API eniipam does not call (a typo would otherwise go unnoticed).
    #[error("per-API rate for {api:?}: not an EC2 API eniipam calls (known: {known})", known = EC2_APIS.join(", "))]
    UnknownApi { api: String },
    /// A retry policy that would never make the first attempt.
    #[error("retry policy: max_attempts must be at least 1")]
    ZeroAttempts,
}

/// Which bucket a call draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallClass {
    /// Create, attach, detach, delete, modify, assign, unassign, tag.
    Mutating,
    /// Describe*.
    Describe,
}

impl CallClass {
    /// The class's name, as metrics label it.
    pub fn label(self) -> &'static str {
        match self {
            CallClass::Mutating => "mutating",
            CallClass::Describe => "describe",
        }
    }

    /// The class of an EC2 action by its name: `Describe*` reads, everything else mutates.
    pub fn of_api(api: &str) -> Self {
        if api.starts_with("Describe") {
            CallClass::Describe
        } else {
            CallClass::Mutating
        }
    }
}

type GovernorLimiter =
    RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

/// One token bucket (governor's GCRA on tokio's clock): in any window of length `t` at most
/// `burst + qps × t` tokens are handed out.
pub struct TokenBucket {
    name: &'static str,
    limiter: GovernorLimiter,
}

impl std::fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBucket")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TokenBucket {
    /// A bucket named `name` (the label of its wait metrics).
    pub fn new(name: &'static str, cfg: BucketConfig) -> Result<Self, LimiterConfigError> {
        if !(cfg.qps.is_finite() && cfg.qps > 0.0) {
            return Err(LimiterConfigError::BadQps {
                bucket: name,
                qps: cfg.qps,
            });
        }
        let burst =
            NonZeroU32::new(cfg.burst).ok_or(LimiterConfigError::ZeroBurst { bucket: name })?;
        let period = Duration::from_secs_f64(1.0 / cfg.qps);
        let quota = Quota::with_period(period)
            .ok_or(LimiterConfigError::BadQps {
                bucket: name,
                qps: cfg.qps,
            })?
            .allow_burst(burst);
        Ok(Self {
            name,
            limiter: RateLimiter::direct_with_clock(quota, TokioClock),
        })
    }

    /// The bucket's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Take a token without waiting; `false` when none is available.
    pub fn try_acquire(&self) -> bool {
        self.limiter.check().is_ok()
    }

    /// Wait (on tokio's clock) until a token is available and take it; returns the time waited.
    pub async fn acquire(&self) -> Duration {
        let start = Instant::now();
        loop {
            match self.limiter.check() {
                Ok(()) => return start.elapsed(),
                // Another waiter may take the token first when we wake up; then we wait again.
                Err(not_until) => tokio::time::sleep_until(not_until.earliest_possible().0).await,
            }
        }
    }
}

/// The gate every EC2 call passes: buckets, retry policy and call accounting.
#[derive(Debug)]
pub struct Limiter {
    /// One token bucket per EC2 API.
    buckets: ApiBuckets,
    /// One throttle gate per EC2 API.
    gates: ThrottleGates,
    retry: BackoffPolicy,
    stats: Arc<CallStats>,
}

impl Limiter {
    /// Build the buckets; counts go to `stats`.
    pub fn new(cfg: &LimiterConfig, stats: Arc<CallStats>) -> Result<Self, LimiterConfigError> {
        if cfg.retry.max_attempts == 0 {
            return Err(LimiterConfigError::ZeroAttempts);
        }
        Ok(Self {
            buckets: ApiBuckets::new(cfg)?,
            gates: ThrottleGates::default(),
            retry: cfg.retry,
            stats,
        })
    }

    /// The counters this limiter records into.
    pub fn stats(&self) -> &Arc<CallStats> {
        &self.stats
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> &BackoffPolicy {
        &self.retry
    }

    /// The rate of `api`'s bucket (its own when configured, its class's otherwise).
    pub fn rate(&self, api: &'static str, class: CallClass) -> BucketConfig {
        self.buckets.rate(api, class)
    }

    /// Whether EC2 throttled a call of `api` from this node within `window`: the account's bucket of
    /// it is short, and other nodes' pods may be waiting on its tokens.
    pub fn throttled_within(&self, api: &str, window: Duration) -> bool {
        self.gates
            .get(api)
            .is_some_and(|g| g.throttled_within(window))
    }

    /// The throttle gate of `api`.
    pub(crate) fn gate(&self, api: &'static str) -> Arc<ThrottleGate> {
        self.gates.of(api)
    }

    /// Wait out any throttling pause of `api` (then, while it recovers, for the other calls if
    /// `purpose` yields, and for the probe), then for a token of `api`'s bucket, recording the wait
    /// under `class` (the metric's label). The admission is held until the attempt's outcome is
    /// recorded.
    async fn admit(&self, api: &'static str, class: CallClass, purpose: Purpose) -> Admission {
        let (bucket, gate) = (self.buckets.of(api, class), self.gate(api));
        let start = Instant::now();
        let priority = (!purpose.yields()).then(|| gate.enter_priority());
        gate.pass().await;
        if purpose.yields() {
            gate.yield_to_priority().await;
        }
        let probe = if gate.recovering() {
            let permit = gate
                .probe
                .clone()
                .acquire_owned()
                .await
                .expect("the probe is never closed");
            // The probe before us may have been throttled again: wait out the new pause. If it
            // succeeded and the gate recovered meanwhile, the permit goes on to the next in line.
            gate.pass().await;
            gate.recovering().then_some(permit)
        } else {
            None
        };
        bucket.acquire().await;
        let waited = start.elapsed();
        if waited > Duration::ZERO {
            tracing::debug!(api, waited_ms = waited.as_millis() as u64, "rate limited");
        }
        self.stats.record_limiter_wait(class.label(), waited);
        Admission {
            gate,
            _probe: probe,
            _priority: priority,
        }
    }

    /// One attempt: a token, then `call`, counted and timed under `api` and under the task's
    /// [`Purpose`] ([`current_purpose`]). No retry.
    pub async fn attempt<T, Fut>(
        &self,
        api: &'static str,
        class: CallClass,
        call: Fut,
    ) -> CloudResult<T>
    where
        Fut: Future<Output = CloudResult<T>>,
    {
        let purpose = current_purpose();
        let admission = self.admit(api, class, purpose).await;
        let start = Instant::now();
        let result = call.await;
        let outcome = Outcome::of(&result);
        let throttled = matches!(result, Err(CloudError::Throttled { .. }));
        // How long the node has waited shortens only a pod-driven attempt's pause, and is looked
        // up only when EC2 throttled it.
        let cap = if throttled && !purpose.yields() {
            self.gates.pod_pause_cap()
        } else {
            ThrottleGate::MAX_PAUSE
        };
        admission.gate.observe(throttled, cap);
        // Only now may the next probe go, and yielding callers look at the gate again.
        drop(admission);
        self.stats.record_call(api, outcome, start.elapsed());
        self.stats.record_purpose(purpose, api, throttled);
        if let Err(e) = &result {
            tracing::debug!(api, %outcome, error = %e, "EC2 call failed");
        }
        result
    }

    /// A retry loop for `api` driven by the caller (for calls that must look around between
    /// attempts, like the ambiguous-assign check). Start it before the first attempt.
    pub fn retry(&self, api: &'static str) -> Retry<'_> {
        Retry {
            limiter: self,
            api,
            backoff: self.retry.start(),
        }
    }

    /// The whole thing: attempts of `f()` through the bucket, retried per the policy.
    pub async fn call<T, F, Fut>(
        &self,
        api: &'static str,
        class: CallClass,
        mut f: F,
    ) -> CloudResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = CloudResult<T>>,
    {
        let mut retry = self.retry(api);
        loop {
            match self.attempt(api, class, f()).await {
                Ok(v) => return Ok(v),
                Err(e) => retry.after_failure(e).await?,
            }
        }
    }
}

/// A caller-driven retry loop (see [`Limiter::retry`]).
#[derive(Debug)]
pub struct Retry<'a> {
    limiter: &'a Limiter,
    api: &'static str,
    backoff: Backoff,
}

impl Retry<'_> {
    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.backoff.attempts()
    }

    /// Decide after a failed attempt: `Ok(())` after sleeping when the error is worth retrying and
    /// budget is left; the error itself when it is final; `RetriesExhausted` when the budget is gone.
    pub async fn after_failure(&mut self, err: CloudError) -> Result<(), CloudError> {
        if !err.is_retryable() {
            return Err(err);
        }
        // Work that takes a throttle as its answer (`deadline::without_throttle_retries`).
        if err.is_throttle() && !crate::deadline::throttle_retries_allowed() {
            tracing::debug!(api = self.api, error = %err, "throttled: not retried, handed back");
            return Err(self.exhausted(err));
        }
        // Not before the node's throttling pause for this API is over, and not at all when that
        // pause outlasts the time budget.
        let paused = self.limiter.gate(self.api).remaining();
        // Nor when the caller's deadline (its pods' budget) comes before the next attempt would.
        let deadline = crate::deadline::current_deadline();
        let next = self
            .backoff
            .next_delay()
            .filter(|_| self.backoff.elapsed() + paused < self.backoff.policy().max_elapsed)
            .map(|delay| delay.max(paused))
            .filter(|delay| deadline.is_none_or(|d| Instant::now() + *delay < d));
        match next {
            Some(delay) => {
                tracing::debug!(
                    api = self.api,
                    attempt = self.backoff.attempts(),
                    delay_ms = delay.as_millis() as u64,
                    error = %err,
                    "retrying"
                );
                self.limiter.stats.record_retry(self.api);
                tokio::time::sleep(delay).await;
                Ok(())
            }
            None => {
                tracing::warn!(api = self.api, attempts = self.backoff.attempts(), error = %err, "giving up");
                Err(self.exhausted(err))
            }
        }
    }

    /// No more attempts after `err`: counted, and answered as `RetriesExhausted`.
    fn exhausted(&self, err: CloudError) -> CloudError {
        self.limiter.stats.record_retries_exhausted(self.api);
        CloudError::RetriesExhausted {
            api: self.api.to_owned(),
            attempts: self.backoff.attempts(),
            last: err.to_string(),
            throttled: err.is_throttle(),
        }
    }
}

mod buckets;
#[cfg(test)]
mod tests;
