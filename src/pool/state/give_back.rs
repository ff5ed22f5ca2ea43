//! What an ENI actor's give-backs come to: idle IPs handed back to EC2 (or kept, when a call
//! failed), and the release of an empty ENI (forgotten, or serving again after a back-off).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::PoolState;
use crate::cloud::CloudError;
use crate::model::EniId;
use crate::pool::error::PoolError;
use crate::pool::types::{EniPhase, GiveBackOutcome, ReleaseOutcome};

impl PoolState {
    /// Settles a give-back of `ips` (singles, and every address of `prefixes`) on `eni` with what
    /// it came to. Returns what its callers are answered.
    pub fn settle_give_back(
        &mut self,
        eni: &EniId,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        outcome: GiveBackOutcome,
        now: Instant,
    ) -> Result<(), PoolError> {
        match outcome {
            GiveBackOutcome::Done => {
                self.complete_unassign(eni, ips, prefixes);
                Ok(())
            }
            GiveBackOutcome::Failed {
                error,
                singles_gone,
            } => {
                self.settle_failed_unassign(eni, ips, prefixes, singles_gone, error.clone(), now);
                Err(PoolError::Cloud(error))
            }
            GiveBackOutcome::NotSent => {
                self.unassign_abandoned(eni, ips);
                Err(PoolError::ShuttingDown)
            }
        }
    }

    /// Settles the release of the empty ENI `eni` with what it came to.
    pub fn settle_release(&mut self, eni: &EniId, outcome: ReleaseOutcome, now: Instant) {
        match outcome {
            ReleaseOutcome::Deleted | ReleaseOutcome::Detached => self.complete_release(eni),
            ReleaseOutcome::StillAttached | ReleaseOutcome::NotSent => self.fail_release(eni, now),
            ReleaseOutcome::Unknown => {
                self.fail_release(eni, now);
                self.suspend_eni(eni, now);
            }
        }
    }

    /// IPs given back to EC2: tokens return.
    fn complete_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) {
        let mut n = 0;
        for ip in ips {
            if self.releasing.remove(ip).is_some() {
                n += 1;
            }
        }
        if let Some(r) = self.enis.get_mut(eni) {
            for ip in ips {
                r.ips.remove(ip);
            }
            for p in prefixes {
                r.prefixes.remove(p);
            }
            r.phase = r.phase.succeeded();
        }
        self.capacity.give_back(n);
    }

    /// A give-back of `ips` (singles, and every address of `prefixes`) whose calls did not all
    /// succeed: singles and prefixes go back in separate calls, each settled on its own. When the
    /// singles' call succeeded (`singles_gone`) and the prefixes' failed, EC2 no longer has the
    /// singles: they leave the pool (tokens return) and never go idle, or a pod would get an
    /// address no ENI holds; the prefixes' addresses are idle again for a later give-back.
    fn settle_failed_unassign(
        &mut self,
        eni: &EniId,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        singles_gone: bool,
        err: CloudError,
        now: Instant,
    ) {
        if !singles_gone {
            self.fail_unassign(eni, ips, err, now);
            return;
        }
        let (kept, gone): (Vec<Ipv4Addr>, Vec<Ipv4Addr>) = ips
            .iter()
            .partition(|ip| prefixes.iter().any(|p| p.contains(*ip)));
        self.complete_unassign(eni, &gone, &[]);
        self.fail_unassign(eni, &kept, err, now);
    }

    /// A give-back failed: the IPs are idle again (same place in the queue), the ENI backs off.
    fn fail_unassign(&mut self, eni: &EniId, ips: &[Ipv4Addr], err: CloudError, now: Instant) {
        self.unassign_abandoned(eni, ips);
        if err.is_not_found() {
            self.suspend_eni(eni, now);
            return;
        }
        let cfg = self.config.clone();
        if let Some(r) = self.enis.get_mut(eni) {
            r.phase = r.phase.failed(err, now, |n| cfg.backoff_after(n));
        }
    }

    /// A give-back that will not happen: the IPs are idle again.
    fn unassign_abandoned(&mut self, _eni: &EniId, ips: &[Ipv4Addr]) {
        for ip in ips {
            if let Some(entry) = self.releasing.remove(ip) {
                self.idle.reinsert(entry);
            }
        }
    }

    /// The ENI is gone from EC2.
    fn complete_release(&mut self, eni: &EniId) {
        if let Some(r) = self.enis.remove(eni)
            && !r.ips.is_empty()
        {
            tracing::error!(%eni, ips = r.ips.len(), "released an ENI that still held IPs");
        }
    }

    /// The ENI could not be released: it serves again, and is not retried for a back-off.
    fn fail_release(&mut self, eni: &EniId, now: Instant) {
        let delay = self.config.eni_backoff_max;
        if let Some(r) = self.enis.get_mut(eni) {
            r.phase = EniPhase::Serving;
            r.release_retry_at = Some(now + delay);
        }
    }
}
