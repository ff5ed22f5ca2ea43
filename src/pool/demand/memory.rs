//! What the demand remembers, as the state file keeps it: wall-clock times (unix ms), so a burst
//! remembered before a restart keeps its age after it. Read back with [`Demand::restore`]; what
//! is older than the horizons ([`super::MEMORY`] for starts, [`BURST_MEMORY`] for bursts) is
//! dropped on the way in.

use tokio::time::Instant;

use super::{BURST_MEMORY, Burst, Demand, MEMORY};
use crate::clock::{instant_from_unix_ms, unix_ms_from_instant};
use crate::store::{StoredBurst, StoredDemand};

fn to_stored(b: Burst, now: Instant, now_ms: u64) -> StoredBurst {
    StoredBurst {
        first_ms: unix_ms_from_instant(b.first, now, now_ms),
        last_ms: unix_ms_from_instant(b.last, now, now_ms),
        starts: b.starts,
    }
}

impl Demand {
    /// What to write to the state file (times against `now` = `now_ms` on the wall clock).
    pub fn memory(&self, now: Instant, now_ms: u64) -> StoredDemand {
        let ms = |at: Instant| unix_ms_from_instant(at, now, now_ms);
        StoredDemand {
            written_at_ms: now_ms,
            starts_ms: self.recent.iter().map(|t| ms(*t)).collect(),
            last_start_ms: self.last_start.map(ms),
            run: self.run.map(|b| to_stored(b, now, now_ms)),
            run_is_burst: self.run_is_burst,
            last_burst: self.last_burst.map(|b| to_stored(b, now, now_ms)),
            previous_burst: self.previous_burst.map(|b| to_stored(b, now, now_ms)),
        }
    }

    /// Takes back what [`Demand::memory`] wrote (maybe by an earlier life of the daemon), with its
    /// ages; what is past the horizons is dropped. Pods seen bound are not part of it: the watch
    /// lists them again.
    pub fn restore(&mut self, stored: &StoredDemand, now: Instant, now_ms: u64) {
        let age_ms = |ms: u64| now_ms.saturating_sub(ms);
        let fresh =
            |ms: u64, horizon: std::time::Duration| u128::from(age_ms(ms)) <= horizon.as_millis();
        let at = |ms: u64| instant_from_unix_ms(ms, now, now_ms);
        let burst = |b: &StoredBurst| {
            fresh(b.last_ms, BURST_MEMORY).then(|| Burst {
                first: at(b.first_ms),
                last: at(b.last_ms),
                starts: b.starts,
            })
        };
        let mut starts: Vec<u64> = stored
            .starts_ms
            .iter()
            .copied()
            .filter(|ms| fresh(*ms, MEMORY))
            .collect();
        starts.sort_unstable();
        self.recent = starts.into_iter().map(at).collect();
        self.last_start = stored
            .last_start_ms
            .filter(|ms| fresh(*ms, BURST_MEMORY))
            .map(at);
        self.run = stored.run.as_ref().and_then(burst);
        self.run_is_burst = self.run.is_some() && stored.run_is_burst;
        self.last_burst = stored.last_burst.as_ref().and_then(burst);
        self.previous_burst = stored.previous_burst.as_ref().and_then(burst);
        tracing::info!(
            starts = self.recent.len(),
            last_burst = ?self.last_burst.map(|b| b.starts),
            last_burst_age_s = self.last_burst.map(|b| now.duration_since(b.last).as_secs()),
            written_age_s = age_ms(stored.written_at_ms) / 1000,
            "learned demand restored from the state file"
        );
    }
}
