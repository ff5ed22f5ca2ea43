//! The adaptive warm pool: what this node's pods asked for lately (and the pods about to ask), and
//! the warm levels that follow.
//!
//! [`Demand`] remembers when pods started (new acquires, not retries of an attachment already held,
//! and pods seen bound to the node before their ADD) and the bursts among them; [`warm_levels`]
//! turns that, the configuration and the subnet's free addresses into three numbers the maintainer
//! works with each round:
//!
//! - `low`: below this many idle IPs (cooling ones count) the pool tops up;
//! - `fill`: what a top-up fills to, in one batch;
//! - `keep`: idle IPs beyond this are given back, down to `down_to`.
//!
//! `min_idle` and `max_idle` bound all of them. The policy (docs/how-it-works.md, "The warm
//! policy", tells the story with a plot):
//!
//! - A **burst** is [`BURST_MIN`] pod starts within [`BURST_WINDOW`]; it goes on while each start
//!   has another within the window. While one runs, the pool expects as many pods again as the
//!   burst has brought so far (bounded by `max_idle`) and warms for them, so a burst's tail finds
//!   IPs ready and the node's calls are few and large.
//! - **Steady starts** (a trickle) raise `fill` above `low` by half the starts of the last minute, so
//!   a trickle costs one assign call per few pods, not one per pod.
//! - **Give-back is slow** (hysteresis): until the node has been quiet (no pod start) for
//!   `give_back_delay`, only idle IPs past `max_idle` go back, down to halfway between `fill` and
//!   `max_idle`, or down to the last burst's size if that is more (a repeated burst finds its
//!   leftovers; the account's budget is not spent giving back and taking again). Once the node has
//!   been quiet for `give_back_delay`, the pool gives back what is above a band over `fill`
//!   (`fill + max(2, fill / 2)`), down to `fill`.
//! - **A short subnet** (fewer than a tenth of its addresses free at the last look) overrides all
//!   of that: the node holds exactly `min_idle`, so the addresses go to nodes that need them.
//! - With prefix delegation the levels are whole prefixes (16 addresses): a `/28` is assigned and
//!   given back whole, so reasoning in addresses would hold a prefix and call for another.
//! - **Pods seen before their ADD** ([`Demand::announce`], fed by the API-server watch of the pods
//!   bound to this node): a pod bound here, not host-network, not finished, with no IP yet, is demand
//!   at once. It counts as a start when first seen (so a ReplicaSet of 20 bound within a second is a
//!   burst of 20), and its ADD later is not counted again. While it waits it raises `low` to the
//!   number of such pods (bounded by `max_idle`; the top-up by the node's capacity), so one batched
//!   assign serves them all before their ADDs arrive. It stops counting when it ADDs, is deleted,
//!   finishes or turns out host-network, and after [`ANNOUNCED_FOR`] in any case (a pod stuck
//!   before its sandbox must not hold IPs for ever).
//! - **A burst is like the last one**: during a burst the pool expects at least as many pods as the
//!   last burst brought, if that burst is within [`BURST_MEMORY`] — a repeated scale-up is warmed
//!   for at once, not from four starts up.
//!
//! What the demand remembers (starts and bursts) is written to the state file by the daemon
//! ([`Demand::memory`], at most every few seconds) and read back at startup ([`Demand::restore`])
//! with its ages, so a restart does not start from zero.
//!
//! The `fixed` policy keeps the levels of earlier versions: top up below `min_idle` to halfway to
//! `max_idle`, give back above `max_idle`; with `minimum_ips` (the VPC CNI's `MINIMUM_IP_TARGET`)
//! the node also holds at least that many IPs, pods included.

//!
//! Parts: this file (the starts and bursts), `announced` (pods seen before their ADD), `memory`
//! (what is written to the state file), `levels` (the arithmetic of the levels).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::PodRef;

mod announced;
mod levels;
mod memory;

pub use announced::{ANNOUNCED_FOR, AnnounceOutcome};
pub use levels::{NodeLoad, WarmLevels, warm_levels};

use announced::Announced;

/// Starts within [`BURST_WINDOW`] that make a burst.
pub const BURST_MIN: u32 = 4;
/// The window a burst's starts fall in, and the longest gap within a burst.
pub const BURST_WINDOW: Duration = Duration::from_secs(10);
/// The window over which the trickle of starts is measured.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Starts older than this are forgotten.
const MEMORY: Duration = Duration::from_secs(60 * 60);
/// How long a burst's size is remembered for the next burst: long enough for a scale-down and a
/// quiet hour before the same scale-up again (the fleet benchmark's down-up pattern), short enough
/// that a day-old deployment does not shape today's warm pool.
pub const BURST_MEMORY: Duration = Duration::from_secs(6 * 60 * 60);

/// A run of pod starts close together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// The first start of the run.
    pub first: Instant,
    /// The last start so far.
    pub last: Instant,
    /// Starts in the run.
    pub starts: u32,
}

/// Told how long before its ADD a pod was first seen as demand (for a metric).
#[derive(Clone)]
pub struct LeadTimeObserver(pub Arc<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for LeadTimeObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeadTimeObserver")
    }
}

/// What the node's pods asked for lately, and the pods bound to it that are about to ask.
#[derive(Debug, Default)]
pub struct Demand {
    /// Starts within the last [`RATE_WINDOW`] (and at least the last [`BURST_MIN`]).
    recent: VecDeque<Instant>,
    /// The current run of starts each within [`BURST_WINDOW`] of the previous; a burst once it
    /// has [`BURST_MIN`] starts within the window.
    run: Option<Burst>,
    /// Whether `run` has become a burst.
    run_is_burst: bool,
    /// The last run that was a burst (maybe `run` itself).
    last_burst: Option<Burst>,
    /// The burst before `last_burst` became the current run (what the current burst is expected
    /// to be like).
    previous_burst: Option<Burst>,
    /// The last start.
    last_start: Option<Instant>,
    /// Pods bound to the node that have not ADDed yet.
    announced: Announced,
    /// Bumped whenever what is remembered (starts, bursts) changes: the daemon writes the memory
    /// when it moved.
    generation: u64,
    lead_time: Option<LeadTimeObserver>,
}

impl Demand {
    /// Records one pod start at `now`.
    pub fn record_start(&mut self, now: Instant) {
        self.generation += 1;
        self.last_start = Some(now);
        self.recent.push_back(now);
        while self.recent.len() > BURST_MIN as usize
            && self
                .recent
                .front()
                .is_some_and(|t| now.duration_since(*t) > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
        match &mut self.run {
            Some(run) if now.duration_since(run.last) <= BURST_WINDOW => {
                run.last = now;
                run.starts += 1;
            }
            _ => {
                self.run = Some(Burst {
                    first: now,
                    last: now,
                    starts: 1,
                });
                self.run_is_burst = false;
            }
        }
        let run = self.run.expect("set above");
        if !self.run_is_burst {
            let in_window = self
                .recent
                .iter()
                .rev()
                .take_while(|t| now.duration_since(**t) <= BURST_WINDOW && **t >= run.first)
                .count() as u32;
            self.run_is_burst = in_window >= BURST_MIN;
            if self.run_is_burst {
                // A new burst: the one before it is what it is expected to be like.
                self.previous_burst = self.last_burst;
            }
        }
        if self.run_is_burst {
            self.last_burst = Some(run);
        }
    }

    /// An ADD of `pod` (a new attachment) at `now`: a start, unless the pod was seen bound before
    /// (then it was counted when seen, and the lead time is observed and logged).
    pub fn record_pod_start(&mut self, pod: &PodRef, now: Instant) {
        match self.announced.take(pod, now) {
            Some(lead) => {
                tracing::debug!(pod = %pod.sticky_key(), lead_ms = lead.as_millis() as u64,
                    "ADD of a pod seen bound to the node before: its demand was counted then");
                if let Some(observe) = &self.lead_time {
                    (observe.0)(lead);
                }
            }
            None => self.record_start(now),
        }
    }

    /// The pods bound to the node now that want a pod IP (`bound`; `has_ip` says which hold one
    /// from this pool already). New ones count as starts now; those gone from `bound` stop counting.
    pub fn announce(
        &mut self,
        bound: &[PodRef],
        has_ip: impl Fn(&PodRef) -> bool,
        now: Instant,
    ) -> AnnounceOutcome {
        let outcome = self.announced.replace(bound, has_ip, now);
        for _ in 0..outcome.new {
            self.record_start(now);
        }
        outcome
    }

    /// Pods seen bound and not ADDed yet, first seen within [`ANNOUNCED_FOR`].
    pub fn announced_waiting(&self, now: Instant) -> u32 {
        self.announced.waiting(now)
    }

    /// Installs the observer of lead times (how long before its ADD a pod was first seen).
    pub fn set_lead_time_observer(&mut self, observer: LeadTimeObserver) {
        self.lead_time = Some(observer);
    }

    /// The burst going on at `now` (its last start within [`BURST_WINDOW`]), if any.
    pub fn ongoing_burst(&self, now: Instant) -> Option<Burst> {
        self.last_burst
            .filter(|b| now.duration_since(b.last) <= BURST_WINDOW)
    }

    /// The last burst, going on or over, if within `memory` of `now`.
    pub fn last_burst(&self, now: Instant, memory: Duration) -> Option<Burst> {
        self.last_burst
            .filter(|b| now.duration_since(b.last) <= memory.min(MEMORY))
    }

    /// The burst before the ongoing one, if within [`BURST_MEMORY`] of `now`: what the ongoing one
    /// is expected to grow to.
    pub fn previous_burst(&self, now: Instant) -> Option<Burst> {
        self.previous_burst
            .filter(|b| now.duration_since(b.last) <= BURST_MEMORY)
    }

    /// Whether the ongoing burst's warm level comes from memory: the burst before it was larger
    /// than what this one has brought so far, so the levels expect what has not started yet.
    pub fn remembered_burst_ahead(&self, now: Instant) -> bool {
        self.ongoing_burst(now)
            .zip(self.previous_burst(now))
            .is_some_and(|(b, p)| p.starts > b.starts)
    }

    /// Starts within the last minute.
    pub fn starts_last_minute(&self, now: Instant) -> u32 {
        self.recent
            .iter()
            .filter(|t| now.duration_since(**t) <= RATE_WINDOW)
            .count() as u32
    }

    /// How long since the last start (`None`: none seen).
    pub fn quiet_for(&self, now: Instant) -> Option<Duration> {
        self.last_start.map(|t| now.duration_since(t))
    }

    /// Changes with every change of what [`Demand::memory`] returns.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(n: usize) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: format!("pod-{n}"),
            uid: format!("uid-{n}"),
        }
    }

    fn starts(d: &mut Demand, t0: Instant, at_ms: &[u64]) {
        for ms in at_ms {
            d.record_start(t0 + Duration::from_millis(*ms));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn announced_pods_are_starts_once_and_their_adds_are_not() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        let bound: Vec<PodRef> = (0..5).map(pod).collect();
        let out = d.announce(&bound, |_| false, t0);
        assert_eq!((out.new, out.waiting), (5, 5));
        assert_eq!(d.ongoing_burst(t0).map(|b| b.starts), Some(5));
        // The same view again, then the ADDs: nothing counted twice.
        assert_eq!(d.announce(&bound, |_| false, t0).new, 0);
        let t1 = t0 + Duration::from_secs(1);
        for p in &bound {
            d.record_pod_start(p, t1);
        }
        assert_eq!(d.starts_last_minute(t1), 5);
        assert_eq!(d.announced_waiting(t1), 0);
        // A pod of the same name with another UID is another pod.
        let again = PodRef {
            uid: "uid-new".into(),
            ..pod(0)
        };
        assert_eq!(d.announce(&[again], |_| false, t1).new, 1);
        // Without announcements nothing is remembered per pod.
        let mut quiet = Demand::default();
        quiet.record_pod_start(&pod(0), t0);
        assert!(quiet.announced.take(&pod(0), t0).is_none());
        assert_eq!(quiet.starts_last_minute(t0), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_expected_to_be_like_the_last_one() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        let first: Vec<u64> = (0..12).map(|i| i * 100).collect();
        starts(&mut d, t0, &first);
        // An hour and a half later, a new burst of four: expected to grow to twelve.
        let later = t0 + Duration::from_secs(90 * 60);
        let at: Vec<u64> = (0..4).map(|i| 90 * 60 * 1000 + i * 100).collect();
        starts(&mut d, t0, &at);
        assert_eq!(d.ongoing_burst(later).map(|b| b.starts), Some(4));
        assert_eq!(d.previous_burst(later).map(|b| b.starts), Some(12));
        // Past BURST_MEMORY it is forgotten.
        assert_eq!(
            d.previous_burst(t0 + BURST_MEMORY + Duration::from_secs(2)),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_keeps_its_ages_across_a_restart_and_drops_what_is_too_old() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        let at: Vec<u64> = (0..8).map(|i| i * 200).collect();
        starts(&mut d, t0, &at);
        tokio::time::advance(Duration::from_secs(30)).await;
        let now = Instant::now();
        let now_ms = 1_000_000_000;
        let stored = d.memory(now, now_ms);
        assert_eq!(stored.starts_ms.len(), 8);
        assert_eq!(stored.last_burst.map(|b| b.starts), Some(8));

        // Restored 20 s later (a restart): the same ages, plus the 20 s.
        tokio::time::advance(Duration::from_secs(20)).await;
        let then = Instant::now();
        let mut back = Demand::default();
        back.restore(&stored, then, now_ms + 20_000);
        assert_eq!(back.starts_last_minute(then), d.starts_last_minute(then));
        assert_eq!(back.quiet_for(then), d.quiet_for(then));
        assert_eq!(back.last_burst(then, MEMORY), d.last_burst(then, MEMORY));
        assert_eq!(
            back.memory(then, now_ms + 20_000),
            d.memory(then, now_ms + 20_000)
        );

        // Restored after the horizons: nothing is left.
        let mut old = Demand::default();
        old.restore(
            &stored,
            then,
            now_ms + BURST_MEMORY.as_millis() as u64 + 60_000,
        );
        assert_eq!(old.starts_last_minute(then), 0);
        assert_eq!(old.last_burst(then, MEMORY), None);
        assert_eq!(old.quiet_for(then), None);
    }
}
