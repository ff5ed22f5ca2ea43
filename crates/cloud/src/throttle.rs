//! The throttle gate: the node-wide answer to EC2 throttling, one per EC2 API (EC2 evaluates each
//! API on its own token bucket: "requests for other API are not affected"), that every attempt
//! passes before its token bucket ([`crate::limiter`]). After EC2 throttles a call, the gate pauses
//! every call of that API on the node, then, while it recovers, lets one probe at a time through and
//! has refills and give-backs yield to pod-driven calls (the limiter's module docs say why).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The node's gates, one per EC2 API, made on the API's first call.
#[derive(Debug, Default)]
pub(crate) struct ThrottleGates(std::sync::Mutex<HashMap<&'static str, Arc<ThrottleGate>>>);

impl ThrottleGates {
    /// The gate of `api` if it has one (no call of it yet: none).
    pub(crate) fn get(&self, api: &str) -> Option<Arc<ThrottleGate>> {
        self.0.lock().expect("gates lock").get(api).cloned()
    }

    /// The gate of `api`.
    pub(crate) fn of(&self, api: &'static str) -> Arc<ThrottleGate> {
        self.0
            .lock()
            .expect("gates lock")
            .entry(api)
            .or_default()
            .clone()
    }
}

/// The node-wide answer to EC2 throttling, one per API: after EC2 answers
/// `RequestLimitExceeded`, every call of that API on this node waits out a pause — not only the
/// call that was throttled — and each further throttle doubles the pause (jittered, up to
/// [`ThrottleGate::MAX_PAUSE`]); each success halves it. EC2's buckets are the account's: when many
/// nodes share them, a node that keeps its own token bucket full would keep spending the account's
/// refill on throttled attempts. This is additive-increase/multiplicative-decrease on the node's
/// attempt rate, as the AWS SDKs' adaptive retry mode does.
///
/// While the pause is non-zero (recovering) the gate also runs one attempt at a time and lets
/// refills and give-backs yield to the other calls (module docs).
#[derive(Debug)]
pub(crate) struct ThrottleGate {
    pub(crate) state: std::sync::Mutex<GateState>,
    /// One permit: the probe, taken by each attempt that starts while the gate is recovering.
    pub(crate) probe: Arc<Semaphore>,
    /// Wakes yielding callers when the pause or the count of priority callers changes.
    changed: Notify,
}

impl Default for ThrottleGate {
    fn default() -> Self {
        Self {
            state: Default::default(),
            probe: Arc::new(Semaphore::new(1)),
            changed: Notify::new(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct GateState {
    /// No call of the API starts before this.
    until: Option<Instant>,
    /// The current pause; zero when EC2 has not throttled us lately.
    pub(crate) pause: Duration,
    /// Attempts of a purpose that does not yield, waiting or running.
    priority: usize,
    /// When EC2 last throttled an attempt of the API.
    last_throttled: Option<Instant>,
}

/// An attempt of a purpose that does not yield, counted from admission to outcome.
pub(crate) struct PriorityGuard(Arc<ThrottleGate>);

impl Drop for PriorityGuard {
    fn drop(&mut self) {
        self.0.lock().priority -= 1;
        self.0.changed.notify_waiters();
    }
}

/// What an admitted attempt holds until its outcome is recorded.
pub(crate) struct Admission {
    /// The API's gate, which the attempt's outcome is recorded in.
    pub(crate) gate: Arc<ThrottleGate>,
    pub(crate) _probe: Option<OwnedSemaphorePermit>,
    pub(crate) _priority: Option<PriorityGuard>,
}

impl ThrottleGate {
    pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(500);
    /// The longest pause. Not a minute: a long pause eats much of the waiting pods' budget (100 s
    /// by default, `add_wait_secs`) before the node tries again, and when many nodes wait out long
    /// pauses on the same account bucket, its refill goes unused at the tail of a scale-up (100
    /// nodes, scale-up of 20 pods each: p99 wait 41 s with a 60 s cap, 33 s with 10 s, for 9 % more
    /// throttled attempts). 10 s is the kubelet's own retry period.
    pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(10);
    /// The longest a refill or give-back yields to other calls.
    pub(crate) const MAX_YIELD: Duration = Duration::from_secs(2 * Self::MAX_PAUSE.as_secs());

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("gate lock")
    }

    /// Whether EC2 throttled the API lately (the pause has not decayed to zero).
    pub(crate) fn recovering(&self) -> bool {
        !self.lock().pause.is_zero()
    }

    /// Whether EC2 throttled an attempt of the API within `window` of now.
    pub(crate) fn throttled_within(&self, window: Duration) -> bool {
        self.lock()
            .last_throttled
            .is_some_and(|t| t + window > Instant::now())
    }

    /// Counts a non-yielding attempt until the guard drops.
    pub(crate) fn enter_priority(self: &Arc<Self>) -> PriorityGuard {
        self.lock().priority += 1;
        PriorityGuard(self.clone())
    }

    /// Waits while the gate recovers and a non-yielding attempt is about, at most
    /// [`Self::MAX_YIELD`].
    pub(crate) async fn yield_to_priority(&self) {
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
    pub(crate) async fn pass(&self) -> Duration {
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
    pub(crate) fn remaining(&self) -> Duration {
        let until = self.lock().until;
        until.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
    }

    /// Records an attempt's outcome.
    pub(crate) fn observe(&self, throttled: bool) {
        let mut st = self.lock();
        if throttled {
            st.last_throttled = Some(Instant::now());
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
