//! Rate limiting and retries for every EC2 call.
//!
//! Each attempt of an EC2 call goes through: a [`TokenBucket`] of its class (mutating or describe),
//! then the SDK; a throttled or transient failure is retried after an exponential backoff with full
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
//! be able to spend it alone. The per-node defaults are:
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
//! After EC2 throttles a call, the class's throttle gate pauses every call of the class, and
//! stays *recovering* (its pause non-zero) until enough calls have succeeded to halve the pause to
//! nothing. While it recovers:
//!
//! - only one attempt of the class is on the wire at a time (a probe): a node that fires its whole
//!   backlog the moment the pause ends spends the account's trickle on throttled attempts;
//! - refills and give-backs ([`Purpose::yields`]) wait, after the pause, while a call of another
//!   purpose (a pod's, the reconcile's) is waiting or running in the class, so the trickle goes to
//!   the calls a pod waits on. The wait is bounded (2 × the longest pause, 2 min): a steady stream of
//!   throttled pod calls never starves a refill for good; and with no pod-driven call about, a
//!   refill goes as the probe itself (otherwise nothing would succeed and end the recovery).
//!
//! # Default retries
//!
//! 6 attempts, backoff base 250 ms doubling to a 10 s cap, full jitter, and no retry starts after
//! 30 s: long enough to ride out a throttling storm of a few seconds, short enough that a pod ADD
//! waiting on an IP gets an answer (or a typed error the pool can back off on) well within the
//! kubelet's CNI timeout.

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
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

pub use super::backoff::{Backoff, BackoffPolicy};
use super::calls::{CallStats, Outcome};
use super::purpose::{Purpose, current_purpose};
use super::{CloudError, CloudResult};

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimiterConfig {
    /// Token buckets per call class.
    pub rates: RateLimitConfig,
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
    mutating: TokenBucket,
    describe: TokenBucket,
    mutating_gate: ThrottleGate,
    describe_gate: ThrottleGate,
    retry: BackoffPolicy,
    stats: Arc<CallStats>,
}

/// The node-wide answer to EC2 throttling, one per call class: after EC2 answers
/// `RequestLimitExceeded`, every call of that class on this node waits out a pause — not only the
/// call that was throttled — and each further throttle doubles the pause (jittered, up to
/// [`ThrottleGate::MAX_PAUSE`]); each success halves it. EC2's buckets are the account's: when many
/// nodes share them, a node that keeps its own token bucket full would keep spending the account's
/// refill on throttled attempts. This is additive-increase/multiplicative-decrease on the node's
/// attempt rate, as the AWS SDKs' adaptive retry mode does.
///
/// While the pause is non-zero (recovering) the gate also runs one attempt at a time and lets
/// refills and give-backs yield to the other calls (module docs).
#[derive(Debug)]
struct ThrottleGate {
    state: std::sync::Mutex<GateState>,
    /// One permit: the probe, taken by each attempt that starts while the gate is recovering.
    probe: Semaphore,
    /// Wakes yielding callers when the pause or the count of priority callers changes.
    changed: Notify,
}

impl Default for ThrottleGate {
    fn default() -> Self {
        Self {
            state: Default::default(),
            probe: Semaphore::new(1),
            changed: Notify::new(),
        }
    }
}

#[derive(Debug, Default)]
struct GateState {
    /// No call of the class starts before this.
    until: Option<Instant>,
    /// The current pause; zero when EC2 has not throttled us lately.
    pause: Duration,
    /// Attempts of a purpose that does not yield, waiting or running.
    priority: usize,
}

/// An attempt of a purpose that does not yield, counted from admission to outcome.
struct PriorityGuard<'a>(&'a ThrottleGate);

impl Drop for PriorityGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().priority -= 1;
        self.0.changed.notify_waiters();
    }
}

/// What an admitted attempt holds until its outcome is recorded.
struct Admission<'a> {
    _probe: Option<SemaphorePermit<'a>>,
    _priority: Option<PriorityGuard<'a>>,
}

impl ThrottleGate {
    const FIRST_PAUSE: Duration = Duration::from_millis(500);
    const MAX_PAUSE: Duration = Duration::from_secs(60);
    /// The longest a refill or give-back yields to other calls.
    const MAX_YIELD: Duration = Duration::from_secs(2 * Self::MAX_PAUSE.as_secs());

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("gate lock")
    }

    /// Whether EC2 throttled the class lately (the pause has not decayed to zero).
    fn recovering(&self) -> bool {
        !self.lock().pause.is_zero()
    }

    /// Counts a non-yielding attempt until the guard drops.
    fn enter_priority(&self) -> PriorityGuard<'_> {
        self.lock().priority += 1;
        PriorityGuard(self)
    }

    /// Waits while the gate recovers and a non-yielding attempt is about, at most
    /// [`Self::MAX_YIELD`].
    async fn yield_to_priority(&self) {
        let deadline = Instant::now() + Self::MAX_YIELD;
        loop {
            // Created before the check, so a change between the check and the await still wakes it.
            let changed = self.changed.notified();
            {
                let st = self.lock();
                if st.pause.is_zero() || st.priority == 0 {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                tracing::debug!("stopped yielding to pod-driven calls: waited long enough");
                return;
            }
        }
    }

    /// Waits until the gate is open.
    async fn pass(&self) -> Duration {
        let start = Instant::now();
        loop {
            let until = self.lock().until;
            match until {
                Some(t) if t > Instant::now() => tokio::time::sleep_until(t).await,
                _ => return start.elapsed(),
            }
        }
    }

    /// How long until the gate opens (zero when open).
    fn remaining(&self) -> Duration {
        let until = self.lock().until;
        until.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
    }

    /// Records an attempt's outcome.
    fn observe(&self, throttled: bool) {
        let mut st = self.lock();
        if throttled {
            st.pause = (st.pause * 2).clamp(Self::FIRST_PAUSE, Self::MAX_PAUSE);
            let jittered = st.pause.mul_f64(rand::rng().random_range(0.5..=1.0));
            let until = Instant::now() + jittered;
            st.until = Some(st.until.map_or(until, |t| t.max(until)));
        } else if !st.pause.is_zero() {
            st.pause /= 2;
            if st.pause < Self::FIRST_PAUSE {
                st.pause = Duration::ZERO;
            }
        }
        drop(st);
        self.changed.notify_waiters();
    }
}

impl Limiter {
    /// Build the buckets; counts go to `stats`.
    pub fn new(cfg: &LimiterConfig, stats: Arc<CallStats>) -> Result<Self, LimiterConfigError> {
        if cfg.retry.max_attempts == 0 {
            return Err(LimiterConfigError::ZeroAttempts);
        }
        Ok(Self {
            mutating: TokenBucket::new("mutating", cfg.rates.mutating)?,
            describe: TokenBucket::new("describe", cfg.rates.describe)?,
            mutating_gate: ThrottleGate::default(),
            describe_gate: ThrottleGate::default(),
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

    fn bucket(&self, class: CallClass) -> &TokenBucket {
        match class {
            CallClass::Mutating => &self.mutating,
            CallClass::Describe => &self.describe,
        }
    }

    fn gate(&self, class: CallClass) -> &ThrottleGate {
        match class {
            CallClass::Mutating => &self.mutating_gate,
            CallClass::Describe => &self.describe_gate,
        }
    }

    /// Wait out any throttling pause of `class` (then, while it recovers, for the other calls if
    /// `purpose` yields, and for the probe), then for a token, recording the wait. The admission is
    /// held until the attempt's outcome is recorded.
    async fn admit(&self, class: CallClass, purpose: Purpose) -> Admission<'_> {
        let (bucket, gate) = (self.bucket(class), self.gate(class));
        let start = Instant::now();
        let priority = (!purpose.yields()).then(|| gate.enter_priority());
        gate.pass().await;
        if purpose.yields() {
            gate.yield_to_priority().await;
        }
        let probe = if gate.recovering() {
            let permit = gate
                .probe
                .acquire()
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
            tracing::debug!(
                bucket = bucket.name(),
                waited_ms = waited.as_millis() as u64,
                "rate limited"
            );
        }
        self.stats.record_limiter_wait(bucket.name(), waited);
        Admission {
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
        let admission = self.admit(class, purpose).await;
        let start = Instant::now();
        let result = call.await;
        let outcome = Outcome::of(&result);
        let throttled = matches!(result, Err(CloudError::Throttled { .. }));
        self.gate(class).observe(throttled);
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
        // Not before the node's throttling pause for this class is over, and not at all when
        // that pause outlasts the time budget.
        let paused = self.limiter.gate(CallClass::of_api(self.api)).remaining();
        let next = self
            .backoff
            .next_delay()
            .filter(|_| self.backoff.elapsed() + paused < self.backoff.policy().max_elapsed)
            .map(|delay| delay.max(paused));
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
                self.limiter.stats.record_retries_exhausted(self.api);
                tracing::warn!(api = self.api, attempts = self.backoff.attempts(), error = %err, "giving up");
                Err(CloudError::RetriesExhausted {
                    api: self.api.to_owned(),
                    attempts: self.backoff.attempts(),
                    last: err.to_string(),
                    throttled: matches!(err, CloudError::Throttled { .. }),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use proptest::prelude::*;

    use super::*;

    fn policy(base_ms: u64, cap_ms: u64, attempts: u32, total_ms: u64) -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            max_attempts: attempts,
            max_elapsed: Duration::from_millis(total_ms),
        }
    }

    proptest! {
        /// GCRA bound: in every window of length t, at most burst + qps × t tokens.
        #[test]
        fn bucket_never_exceeds_burst_plus_rate(
            qps in 0.5f64..50.0, burst in 1u32..30, gaps in proptest::collection::vec(0u64..400, 1..120)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async {
                let bucket = TokenBucket::new("t", BucketConfig { qps, burst }).unwrap();
                let origin = Instant::now();
                let mut grants = Vec::new();
                for gap in gaps {
                    tokio::time::advance(Duration::from_millis(gap)).await;
                    // Greedy caller: take everything available at this instant.
                    while bucket.try_acquire() {
                        grants.push(Instant::now() - origin);
                    }
                }
                for (i, start) in grants.iter().enumerate() {
                    for (j, end) in grants.iter().enumerate().skip(i) {
                        let n = (j - i + 1) as f64;
                        let t = (*end - *start).as_secs_f64();
                        // 1e-6: nanosecond rounding of the replenish period.
                        prop_assert!(n <= burst as f64 + qps * t + 1e-6,
                            "{} grants in {}s with qps {} burst {}", n, t, qps, burst);
                    }
                }
                Ok(())
            })?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_on_tokio_clock() {
        let bucket = TokenBucket::new("t", BucketConfig { qps: 2.0, burst: 3 }).unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(bucket.acquire().await, Duration::ZERO);
        }
        // The 4th and 5th wait 500 ms each (2 qps).
        let w4 = bucket.acquire().await;
        let w5 = bucket.acquire().await;
        assert_eq!(w4, Duration::from_millis(500));
        assert_eq!(w5, Duration::from_millis(500));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_waiters_are_paced() {
        let bucket = Arc::new(
            TokenBucket::new(
                "t",
                BucketConfig {
                    qps: 10.0,
                    burst: 1,
                },
            )
            .unwrap(),
        );
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let b = bucket.clone();
            tasks.push(tokio::spawn(async move {
                b.acquire().await;
                Instant::now() - start
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.push(t.await.unwrap());
        }
        times.sort();
        // 1 immediately, then one per 100 ms.
        assert_eq!(*times.last().unwrap(), Duration::from_millis(1900));
        for w in times.windows(2) {
            assert!(w[1] - w[0] >= Duration::from_millis(100) - Duration::from_nanos(1));
        }
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(
            TokenBucket::new("m", BucketConfig { qps: 0.0, burst: 1 }),
            Err(LimiterConfigError::BadQps { .. })
        ));
        assert!(matches!(
            TokenBucket::new(
                "m",
                BucketConfig {
                    qps: f64::NAN,
                    burst: 1
                }
            ),
            Err(LimiterConfigError::BadQps { .. })
        ));
        assert!(matches!(
            TokenBucket::new("m", BucketConfig { qps: 1.0, burst: 0 }),
            Err(LimiterConfigError::ZeroBurst { .. })
        ));
        let cfg = LimiterConfig {
            retry: BackoffPolicy {
                max_attempts: 0,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(matches!(
            Limiter::new(&cfg, Arc::new(CallStats::new())),
            Err(LimiterConfigError::ZeroAttempts)
        ));
    }

    fn limiter(attempts: u32, total_ms: u64) -> Limiter {
        let cfg = LimiterConfig {
            rates: RateLimitConfig {
                mutating: BucketConfig { qps: 5.0, burst: 1 },
                describe: BucketConfig {
                    qps: 10.0,
                    burst: 20,
                },
            },
            retry: policy(100, 1_000, attempts, total_ms),
        };
        Limiter::new(&cfg, Arc::new(CallStats::new())).unwrap()
    }

    fn throttled() -> CloudError {
        CloudError::Throttled {
            api: "AssignPrivateIpAddresses".into(),
            code: "RequestLimitExceeded".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_pauses_every_call_of_its_class_on_the_node() {
        let l = limiter(1, 60_000);
        let r: CloudResult<()> = l
            .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                Err(throttled())
            })
            .await;
        assert!(r.is_err());
        // Another mutating call, not itself throttled, waits out the pause (500 ms, jittered to
        // 250..500 ms); a describe call does not.
        let t = Instant::now();
        l.attempt("DescribeInstances", CallClass::Describe, async { Ok(()) })
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
        let t = Instant::now();
        l.attempt("CreateNetworkInterface", CallClass::Mutating, async {
            Ok(())
        })
        .await
        .unwrap();
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited <= Duration::from_millis(510),
            "{waited:?}"
        );
        // That success halved the pause to nothing; consecutive throttles double it again
        // (0.5, 1, 2 s) and successes halve it back to nothing.
        for _ in 0..3 {
            let _: CloudResult<()> = l
                .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                    Err(throttled())
                })
                .await;
        }
        assert_eq!(
            l.mutating_gate.state.lock().unwrap().pause,
            Duration::from_secs(2)
        );
        for _ in 0..4 {
            l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                Ok(())
            })
            .await
            .unwrap();
        }
        assert_eq!(l.mutating_gate.state.lock().unwrap().pause, Duration::ZERO);
        assert_eq!(CallClass::of_api("DescribeSubnets"), CallClass::Describe);
        assert_eq!(
            CallClass::of_api("AttachNetworkInterface"),
            CallClass::Mutating
        );
    }

    /// Throttles the mutating class once: the gate recovers (pause 500 ms, jittered 250..500 ms).
    async fn throttle_once(l: &Limiter) {
        let _: CloudResult<()> = l
            .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                Err(throttled())
            })
            .await;
        assert!(l.mutating_gate.recovering());
    }

    /// One mutating attempt of `purpose` that takes `took`; returns when it started and ended.
    async fn timed_attempt(l: &Limiter, purpose: Purpose, took: Duration) -> (Instant, Instant) {
        crate::with_purpose(purpose, async {
            l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                let started = Instant::now();
                tokio::time::sleep(took).await;
                Ok((started, Instant::now()))
            })
            .await
            .unwrap()
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_throttle_one_attempt_runs_at_a_time() {
        let l = Arc::new(limiter(1, 60_000));
        throttle_once(&l).await;
        let (a, b) = tokio::join!(
            timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
            timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
        );
        let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        assert!(second.0 >= first.1, "overlap: {first:?} {second:?}");
        // The first one's success ended the recovery: attempts run side by side again.
        assert!(!l.mutating_gate.recovering());
        let start = Instant::now();
        tokio::join!(
            timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
            timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
        );
        // Side by side (the bucket's 200 ms between tokens aside).
        assert!(
            start.elapsed() < Duration::from_millis(1_500),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_throttle_a_refill_waits_for_the_pods_call() {
        let l = limiter(1, 60_000);
        // Three throttles: a 2 s pause, which two successes only halve to 500 ms (still recovering).
        for _ in 0..3 {
            throttle_once(&l).await;
        }
        let secs = Duration::from_secs;
        let after = |d: Duration, purpose| {
            let l = &l;
            async move {
                tokio::time::sleep(d).await;
                timed_attempt(l, purpose, secs(3)).await
            }
        };
        // A pod's call is the probe; a refill, then another pod's call, arrive while it runs. The
        // refill asked first, yet the pod's call goes first.
        let (_, refill, pod) = tokio::join!(
            after(Duration::ZERO, Purpose::Pod),
            after(Duration::from_millis(2_100), Purpose::Refill),
            after(Duration::from_millis(2_200), Purpose::Pod),
        );
        assert!(refill.0 >= pod.1, "refill {refill:?} pod {pod:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refill_yields_for_a_bounded_time_and_alone_goes_as_the_probe() {
        let l = limiter(1, 60_000);
        throttle_once(&l).await;
        // Alone, a refill is the probe: it goes once the pause is over.
        let start = Instant::now();
        timed_attempt(&l, Purpose::GiveBack, Duration::ZERO).await;
        assert!(
            start.elapsed() <= Duration::from_millis(510),
            "{:?}",
            start.elapsed()
        );
        // A pod-driven call that never ends holds a refill back at most MAX_YIELD.
        throttle_once(&l).await;
        let _pod = l.mutating_gate.enter_priority();
        let start = Instant::now();
        timed_attempt(&l, Purpose::Refill, Duration::ZERO).await;
        let waited = start.elapsed();
        assert!(
            waited >= ThrottleGate::MAX_YIELD
                && waited <= ThrottleGate::MAX_YIELD + Duration::from_millis(510),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ec2_calls_are_counted_by_purpose() {
        let l = limiter(1, 60_000);
        timed_attempt(&l, Purpose::Pod, Duration::ZERO).await;
        let _: CloudResult<()> = crate::with_purpose(
            Purpose::Refill,
            l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                Err(throttled())
            }),
        )
        .await;
        // Unscoped: counted as reconcile. IMDS reads are not counted by purpose.
        l.attempt("DescribeSubnets", CallClass::Describe, async { Ok(()) })
            .await
            .unwrap();
        l.stats()
            .record_call("imds:mac", Outcome::Ok, Duration::from_millis(1));
        let s = l.stats().snapshot();
        assert_eq!(s.purpose_calls(Purpose::Pod), 1);
        assert_eq!(s.purpose_throttled(Purpose::Pod), 0);
        assert_eq!(s.purpose_calls(Purpose::Refill), 1);
        assert_eq!(s.purpose_throttled(Purpose::Refill), 1);
        assert_eq!(s.purpose_calls(Purpose::Reconcile), 1);
        assert_eq!(s.purpose_calls(Purpose::Startup), 0);
        assert_eq!(s.by_purpose.len(), 3);
        assert!(s.by_purpose.iter().all(|p| !p.api.starts_with("imds:")));
        assert_eq!(
            s.by_purpose[0],
            crate::calls::PurposeSeries {
                purpose: Purpose::Pod,
                api: "AssignPrivateIpAddresses".into(),
                calls: 1,
                throttled: 0,
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_calls_are_retried_until_success() {
        let l = limiter(6, 60_000);
        let n = AtomicU32::new(0);
        let r = l
            .call("AssignPrivateIpAddresses", CallClass::Mutating, || async {
                if n.fetch_add(1, Ordering::SeqCst) < 3 {
                    Err(throttled())
                } else {
                    Ok(7)
                }
            })
            .await;
        assert_eq!(r, Ok(7));
        let s = l.stats().snapshot();
        assert_eq!(s.count("AssignPrivateIpAddresses", Outcome::Throttled), 3);
        assert_eq!(s.count("AssignPrivateIpAddresses", Outcome::Ok), 1);
        assert_eq!(s.retries("AssignPrivateIpAddresses"), 3);
        // Burst 1 at 5 qps: the four attempts each took a token; the limiter wait is recorded.
        assert_eq!(s.limiter_waits["mutating"].count, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn final_errors_are_not_retried() {
        let l = limiter(6, 60_000);
        let n = AtomicU32::new(0);
        let r: CloudResult<()> = l
            .call("AssignPrivateIpAddresses", CallClass::Mutating, || async {
                n.fetch_add(1, Ordering::SeqCst);
                Err(CloudError::SubnetFull {
                    api: "AssignPrivateIpAddresses".into(),
                    message: "full".into(),
                })
            })
            .await;
        assert!(matches!(r, Err(CloudError::SubnetFull { .. })));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(l.stats().snapshot().total_retries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_max_attempts() {
        let l = limiter(4, 600_000);
        let n = AtomicU32::new(0);
        let r: CloudResult<()> = l
            .call("DescribeNetworkInterfaces", CallClass::Describe, || async {
                n.fetch_add(1, Ordering::SeqCst);
                Err(CloudError::Transient {
                    api: "DescribeNetworkInterfaces".into(),
                    message: "503".into(),
                })
            })
            .await;
        assert!(matches!(
            r,
            Err(CloudError::RetriesExhausted { attempts: 4, .. })
        ));
        assert_eq!(n.load(Ordering::SeqCst), 4);
        let s = l.stats().snapshot();
        assert_eq!(s.retries("DescribeNetworkInterfaces"), 3);
        assert_eq!(s.retries_exhausted["DescribeNetworkInterfaces"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_total_time() {
        let l = limiter(1_000, 2_500);
        let start = Instant::now();
        let r: CloudResult<()> = l
            .call("DescribeNetworkInterfaces", CallClass::Describe, || async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Err(throttled())
            })
            .await;
        assert!(matches!(r, Err(CloudError::RetriesExhausted { .. })));
        // No retry starts after 2.5 s; the last attempt may run its 300 ms (plus a token wait).
        assert!(
            start.elapsed() <= Duration::from_millis(2_500 + 300 + 100),
            "{:?}",
            start.elapsed()
        );
    }
}
