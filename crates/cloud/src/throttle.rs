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
    /// Since when the node has been held back by EC2 throttling: the earliest start of a run of
    /// throttling among its gates still recovering (`None`: none is).
    pub(crate) fn contended_since(&self) -> Option<Instant> {
        self.0
            .lock()
            .expect("gates lock")
            .values()
            .filter_map(|g| {
                let st = g.lock();
                st.streak_since.filter(|_| !st.pause.is_zero())
            })
            .min()
    }

    /// The longest pause of a pod-driven attempt EC2 throttled now: [`ThrottleGate::pause_cap`] of
    /// how long the node has been held back ([`Self::contended_since`]).
    pub(crate) fn pod_pause_cap(&self) -> Duration {
        ThrottleGate::pause_cap(
            self.contended_since()
                .map_or(Duration::ZERO, |t| t.elapsed()),
        )
    }

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
/// [`ThrottleGate::MAX_PAUSE`], less for pods that have waited long: [`ThrottleGate::pause_cap`]);
/// each success halves it. EC2's buckets are the account's: when many
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
    /// When the current run of throttling began (the first throttle since the pause was zero,
    /// whatever the attempt's purpose: a burst's warm-up throttled is where its pods' wait began).
    streak_since: Option<Instant>,
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
    /// Contended for this long, a node keeps [`Self::MAX_PAUSE`] as its longest pause; beyond it the
    /// longest pause shrinks in proportion ([`Self::pause_cap`]).
    pub(crate) const PATIENT_FOR: Duration = Duration::from_secs(10);
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

    /// The longest pause of a pod-driven attempt on a node EC2's throttling has held back for
    /// `contended` (its oldest run of throttling on any API, [`ThrottleGates::contended_since`]):
    /// [`Self::MAX_PAUSE`] up to [`Self::PATIENT_FOR`], then shrinking in proportion to the wait,
    /// down to [`Self::FIRST_PAUSE`].
    ///
    /// When many nodes share an account bucket, each of its tokens goes to whichever node asks
    /// first after the refill. With the same pauses for all, that is a lottery, and a node that
    /// lost it for a minute is no likelier to win the next draw than one that started losing a
    /// second ago: the tail of a scale-up is the nodes unlucky many times over (500 nodes under
    /// another tenant: the slowest had every assign throttled, then its create, then its attach up
    /// to 9 times). Asking more often the longer it has waited gives the account's refill to the
    /// oldest waiters first, earliest-deadline-first across nodes with no word between them.
    pub(crate) fn pause_cap(contended: Duration) -> Duration {
        if contended <= Self::PATIENT_FOR {
            return Self::MAX_PAUSE;
        }
        Self::MAX_PAUSE
            .mul_f64(Self::PATIENT_FOR.as_secs_f64() / contended.as_secs_f64())
            .max(Self::FIRST_PAUSE)
    }

    /// Records an attempt's outcome. Any throttle starts this gate's run if none is on, and doubles
    /// the pause up to `cap`: a pod-driven attempt's is [`ThrottleGates::pod_pause_cap`]. Refills
    /// and give-backs wait on no pod: theirs is [`Self::MAX_PAUSE`], so a fleet's give-backs do not
    /// ask more often as they wait (down-up at 500 nodes: 11,418 throttled unassigns with the
    /// shorter cap, about 3,300 without).
    pub(crate) fn observe(&self, throttled: bool, cap: Duration) {
        let mut st = self.lock();
        if throttled {
            let now = Instant::now();
            st.last_throttled = Some(now);
            if st.pause.is_zero() {
                st.streak_since = None;
            }
            st.streak_since.get_or_insert(now);
            st.pause = (st.pause * 2).clamp(Self::FIRST_PAUSE, cap);
            let jittered = st.pause.mul_f64(rand::rng().random_range(0.5..=1.0));
            let until = Instant::now() + jittered;
            st.until = Some(st.until.map_or(until, |t| t.max(until)));
        } else if !st.pause.is_zero() {
            st.pause /= 2;
            if st.pause < Self::FIRST_PAUSE {
                st.pause = Duration::ZERO;
                st.streak_since = None;
            }
        }
        drop(st);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_pause_shrinks_with_the_nodes_wait() {
        assert_eq!(
            ThrottleGate::pause_cap(Duration::ZERO),
            ThrottleGate::MAX_PAUSE
        );
        assert_eq!(
            ThrottleGate::pause_cap(ThrottleGate::PATIENT_FOR),
            ThrottleGate::MAX_PAUSE
        );
        // Twice as long contended: half the longest pause.
        assert_eq!(
            ThrottleGate::pause_cap(ThrottleGate::PATIENT_FOR * 2),
            ThrottleGate::MAX_PAUSE / 2
        );
        // Never below the first pause, however long.
        assert_eq!(
            ThrottleGate::pause_cap(Duration::from_secs(3600)),
            ThrottleGate::FIRST_PAUSE
        );
        let mut last = ThrottleGate::MAX_PAUSE;
        for s in 0..200 {
            let cap = ThrottleGate::pause_cap(Duration::from_secs(s));
            assert!(cap <= last, "the cap never grows with the wait");
            last = cap;
        }
    }

    /// A node held back on one API for long asks its others often too: the oldest run of
    /// throttling on any of its gates sets every gate's longest pause.
    #[tokio::test(start_paused = true)]
    async fn a_long_contended_node_pauses_briefly_on_every_api() {
        let gates = ThrottleGates::default();
        let assign = gates.of("AssignPrivateIpAddresses");
        let create = gates.of("CreateNetworkInterface");
        assert_eq!(gates.contended_since(), None);
        let t0 = Instant::now();
        // Throttled on assigns for a minute: the pause doubles, first up to the cap...
        for _ in 0..6 {
            assign.observe(true, gates.pod_pause_cap());
            assign.pass().await;
        }
        assert_eq!(gates.contended_since(), Some(t0));
        let early = assign.lock().pause;
        assert!(early <= ThrottleGate::MAX_PAUSE);
        tokio::time::advance(Duration::from_secs(60)).await;
        // ...then, contended for over a minute, under a fraction of it.
        assign.observe(true, gates.pod_pause_cap());
        let cap = ThrottleGate::pause_cap(Instant::now() - t0);
        assert!(cap < ThrottleGate::MAX_PAUSE);
        assert!(assign.lock().pause <= cap);
        // The first throttle of its creates: the node has waited since t0, so the create's pause
        // is capped as short (it starts at the first pause, under the cap, and stays under it).
        for _ in 0..8 {
            create.observe(true, gates.pod_pause_cap());
            assert!(create.lock().pause <= cap.max(ThrottleGate::FIRST_PAUSE));
        }
        // A give-back's throttle (no pod waits on it) keeps the full cap, however long the node
        // has been held back.
        let unassign = gates.of("UnassignPrivateIpAddresses");
        for _ in 0..6 {
            unassign.observe(true, ThrottleGate::MAX_PAUSE);
        }
        assert_eq!(unassign.lock().pause, ThrottleGate::MAX_PAUSE);
        // Successes end the run: the pause decays to zero and the gate is no longer contended.
        for _ in 0..8 {
            assign.observe(false, gates.pod_pause_cap());
            create.observe(false, gates.pod_pause_cap());
            unassign.observe(false, ThrottleGate::MAX_PAUSE);
        }
        assert_eq!(gates.contended_since(), None);
    }
}
