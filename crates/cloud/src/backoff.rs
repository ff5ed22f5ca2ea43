//! Exponential backoff with full jitter, bounded in attempts and total time: the retry policy of every
//! EC2 call ([`super::limiter`]) and of the ENI lifecycle's polling. And [`RetryPause`], the same
//! doubling for a task that retries for ever (the daemon's API-server publishers and its checks of a
//! feature's settings against EC2), so no task rolls its own.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Exponential backoff with full jitter, bounded in attempts and total time.
///
/// The `n`-th retry (0-based) sleeps a uniformly random duration in `[0, min(cap, base × 2^n)]`
/// ("full jitter", as in the AWS Architecture Blog's "Exponential Backoff And Jitter"). No sleep
/// ends after `max_elapsed` from the start: the last sleep is shortened to fit, and once the time
/// is used up no further attempt is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackoffPolicy {
    /// Ceiling of the first retry's sleep.
    #[serde(with = "humantime_serde_compat")]
    pub base: Duration,
    /// Largest ceiling of any sleep.
    #[serde(with = "humantime_serde_compat")]
    pub cap: Duration,
    /// Attempts in total, the first one included (at least 1).
    pub max_attempts: u32,
    /// Time budget measured from the first attempt; no retry starts after it.
    #[serde(with = "humantime_serde_compat")]
    pub max_elapsed: Duration,
}

impl Default for BackoffPolicy {
    /// The EC2 retry policy: 6 attempts, 250 ms doubling to 10 s, within 30 s (see the module docs).
    fn default() -> Self {
        Self {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(10),
            max_attempts: 6,
            max_elapsed: Duration::from_secs(30),
        }
    }
}

impl BackoffPolicy {
    /// A polling policy: unlimited attempts, bounded only by `max_elapsed`.
    pub fn polling(base: Duration, cap: Duration, max_elapsed: Duration) -> Self {
        Self {
            base,
            cap,
            max_attempts: u32::MAX,
            max_elapsed,
        }
    }

    /// The upper bound of the sleep before retry number `retry` (0-based): `min(cap, base × 2^retry)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
    }

    /// A full-jitter sleep before retry number `retry`: uniform in `[0, ceiling(retry)]`.
    pub fn jittered<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(retry);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.random_range(0..=nanos))
    }

    /// Start a backoff sequence now (tokio's clock).
    pub fn start(&self) -> Backoff {
        Backoff {
            policy: *self,
            started: Instant::now(),
            attempts: 1,
        }
    }
}

/// One running backoff sequence: the first attempt is assumed made when it starts.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    started: Instant,
    attempts: u32,
}

impl Backoff {
    /// Attempts made so far (including the first).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The policy it follows.
    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// Time since the sequence started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The sleep before the next attempt, or `None` when attempts or time are used up. Counts the
    /// next attempt as made.
    pub fn next_delay(&mut self) -> Option<Duration> {
        self.next_delay_with(&mut rand::rng())
    }

    /// [`next_delay`](Self::next_delay) with a caller-provided random source.
    pub fn next_delay_with<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Option<Duration> {
        if self.attempts >= self.policy.max_attempts {
            return None;
        }
        let deadline = self.started + self.policy.max_elapsed;
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let delay = self
            .policy
            .jittered(self.attempts - 1, rng)
            .min(deadline - now);
        self.attempts += 1;
        Some(delay)
    }

    /// Sleep before the next attempt; `false` (without sleeping) when the budget is used up.
    pub async fn wait(&mut self) -> bool {
        match self.next_delay() {
            Some(d) => {
                tokio::time::sleep(d).await;
                true
            }
            None => false,
        }
    }
}

/// The pause of a task that retries until it succeeds or its own deadline passes (publishing to the
/// API server, checking a setting against EC2, asking again a describe that lags): the policy's ceiling for each consecutive failure, `first`
/// doubling up to `cap`, without jitter (one such task per node and purpose: no herd of retries
/// to spread), back to `first` after a success.
#[derive(Clone, Debug)]
pub struct RetryPause {
    policy: BackoffPolicy,
    failures: u32,
}

impl RetryPause {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self {
            policy: BackoffPolicy::polling(first, cap, Duration::MAX),
            failures: 0,
        }
    }

    /// The pause the next failure will wait (for a log line written before [`RetryPause::failed`]).
    pub fn pause(&self) -> Duration {
        self.policy.ceiling(self.failures)
    }

    /// A try failed: the pause before the next one (the next failure waits twice as long, up to
    /// the cap).
    pub fn failed(&mut self) -> Duration {
        let pause = self.pause();
        self.failures = self.failures.saturating_add(1);
        pause
    }

    /// A try succeeded: the next failure waits `first` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }
}

/// Serde for `Duration` fields as humantime strings (`"250ms"`, `"10s"`).
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn policy(base_ms: u64, cap_ms: u64, attempts: u32, total_ms: u64) -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            max_attempts: attempts,
            max_elapsed: Duration::from_millis(total_ms),
        }
    }

    #[test]
    fn ceiling_doubles_up_to_cap() {
        let p = policy(100, 1000, 10, 10_000);
        let c: Vec<u64> = (0..6).map(|n| p.ceiling(n).as_millis() as u64).collect();
        assert_eq!(c, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(p.ceiling(u32::MAX), Duration::from_millis(1000));
    }

    #[test]
    fn a_retry_pause_doubles_up_to_its_cap_and_starts_over_after_a_success() {
        let mut r = RetryPause::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(r.pause(), Duration::from_secs(1));
        let waits: Vec<u64> = (0..5).map(|_| r.failed().as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 5, 5]);
        r.succeeded();
        assert_eq!(r.failed(), Duration::from_secs(1));
        assert_eq!(r.pause(), Duration::from_secs(2));
    }

    proptest! {
        #[test]
        fn full_jitter_stays_within_zero_and_ceiling(
            base in 1u64..5_000, cap in 1u64..120_000, retry in 0u32..64, seed in any::<u64>()
        ) {
            let p = policy(base, cap, 10, 1_000_000);
            let mut rng = StdRng::seed_from_u64(seed);
            let d = p.jittered(retry, &mut rng);
            prop_assert!(d <= p.ceiling(retry));
            prop_assert!(p.ceiling(retry) <= Duration::from_millis(cap));
        }

        #[test]
        fn backoff_respects_attempts_and_total_time(
            base in 1u64..2_000, cap in 1u64..20_000, attempts in 1u32..20, total in 0u64..60_000,
            seed in any::<u64>()
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async {
                let p = policy(base, cap, attempts, total);
                let mut rng = StdRng::seed_from_u64(seed);
                let mut b = p.start();
                let mut slept = Duration::ZERO;
                let mut made = 1u32;
                while let Some(d) = b.next_delay_with(&mut rng) {
                    prop_assert!(d <= p.ceiling(made - 1));
                    tokio::time::sleep(d).await;
                    slept += d;
                    made += 1;
                }
                prop_assert!(made <= attempts);
                prop_assert!(slept <= Duration::from_millis(total));
                prop_assert_eq!(b.attempts(), made);
                Ok(())
            })?;
        }

    }
}
