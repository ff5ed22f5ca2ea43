//! The end's wait, on an event rather than a duration: the final check used to sleep out the grace
//! period of the last out-of-band change (and of the discrepancies the checker was timing), about
//! 15 s of every soak, though the daemon usually puts things right within one reconcile. It now ends
//! as soon as the daemon has caught up, and sleeps the full period only when it has not.
//!
//! "Caught up" is judged strictly enough that ending early cannot hide what the wait would show: an
//! observation of every attachment ever made, held against the invariants as if every grace period
//! were over (a grace of zero, every span of impeded EC2 or a full disk ended, no discrepancy still being timed;
//! which attachments a change hit is told as the real checks tell it), finds nothing. Any later check is more lenient than that, so the final verdict can only be the
//! one the full wait would have reached; a daemon that is still wrong keeps the old wait, and its
//! violation is then reported by the final check, as before.

use std::time::Duration;

use tokio::time::Instant;

use super::Soak;
use super::checker;
use super::findings::Rules;
use super::witnesses::Witnesses;

/// How often the end looks again while the daemon catches up.
const POLL: Duration = Duration::from_millis(250);

impl Soak {
    /// Waits until the daemon has caught up with every change, or until `until`, whichever is
    /// first.
    pub(super) async fn wait_caught_up(&mut self, step: u64, until: Instant) {
        while Instant::now() < until {
            if self.caught_up(step).await {
                return;
            }
            tokio::time::sleep(POLL.min(until - Instant::now())).await;
        }
    }

    /// Whether one observation, judged with every grace period over, finds nothing. Evaluated on a
    /// copy of the checker's memory, so the probe changes nothing the real checks see.
    async fn caught_up(&self, step: u64) -> bool {
        let now = Instant::now();
        // While EC2 or the disk is (still taken to be) impeded, a grace period is open however small it is.
        if self
            .model
            .impeded
            .iter()
            .any(|(_, _, end)| end.is_none_or(|e| e > now))
        {
            return false;
        }
        let Some(channel) = self.daemon.channel() else {
            return false;
        };
        let store_path = self.host.state_files()[0].clone();
        let witnesses = Witnesses {
            channel,
            store_path: &store_path,
            mock: &self.mock,
            instance_id: &self.instance_id,
            cache_dir: &self.host.cache_dir,
            networks: &self.network_names,
        };
        let Ok(obs) = witnesses.observe(&self.tracked(step, true)).await else {
            return false;
        };
        let rules = Rules {
            grace: Duration::ZERO,
            oob_window: self.grace,
            network_names: self.network_names.clone(),
            family: self.cfg.ip_family,
            profiles: self.cluster.as_ref().map(|c| c.world.clone()),
        };
        let mut state = self.checker.clone();
        let ev = checker::evaluate(&obs, &self.model, &mut state, &rules);
        ev.found.is_empty() && state.judged_by(Duration::ZERO).is_none()
    }
}
