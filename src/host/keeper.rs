//! [`RouteKeeper`]: follows the pool's changing list of ENIs and keeps each one's route table in step
//! ([`super::routes`] does the netlink work).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::routes::{EniRoute, EniRouting, HostError};

/// What one [`RouteKeeper::sync`] round did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Device indexes whose tables were (re)installed.
    pub ensured: Vec<u32>,
    /// Device indexes whose tables were flushed (the ENI is gone from the wanted list).
    pub removed: Vec<u32>,
    /// Device indexes that failed this round, with why; they are retried on the next one.
    pub failed: Vec<(u32, HostError)>,
}

/// Follows a changing list of ENIs: installs the table of each new (or changed) ENI, re-checks the
/// installed ones every `resync` (healing drift), and flushes the tables of ENIs that left the list.
/// ENIs whose link has not appeared yet are retried on every round.
#[derive(Debug)]
pub struct RouteKeeper {
    routing: EniRouting,
    resync: Duration,
    /// Every device index this keeper has worked on, with the ENI and when its table last
    /// converged (`None`: not yet, or the last attempt failed).
    installed: HashMap<u32, (EniRoute, Option<Instant>)>,
    /// ENIs whose link is missing: since when, and whether that was logged as a warning.
    missing_since: HashMap<u32, (Instant, bool)>,
}

/// How long an ENI's link may be missing before the keeper logs a warning, once (before: debug).
const LINK_WAIT_WARNING: Duration = Duration::from_secs(30);

impl RouteKeeper {
    /// A keeper that has installed nothing yet.
    pub fn new(routing: EniRouting, resync: Duration) -> Self {
        Self {
            routing,
            resync,
            installed: HashMap::new(),
            missing_since: HashMap::new(),
        }
    }

    /// One round against `wanted`.
    pub async fn sync(&mut self, wanted: &[EniRoute]) -> SyncReport {
        let now = Instant::now();
        let mut report = SyncReport::default();
        for eni in wanted {
            let due = match self.installed.get(&eni.device_index) {
                Some((done, Some(at))) => done != eni || now.duration_since(*at) >= self.resync,
                _ => true,
            };
            if !due {
                continue;
            }
            match self.routing.ensure(eni).await {
                Ok(()) => {
                    let fresh = self
                        .installed
                        .get(&eni.device_index)
                        .is_none_or(|(done, at)| done != eni || at.is_none());
                    if fresh {
                        tracing::info!(
                            mac = %eni.mac, device_index = eni.device_index,
                            table = eni.device_index + 1, subnet = %eni.subnet_cidr,
                            gateway = %eni.gateway, "ENI route table installed"
                        );
                    }
                    self.installed
                        .insert(eni.device_index, (eni.clone(), Some(now)));
                    self.missing_since.remove(&eni.device_index);
                    report.ensured.push(eni.device_index);
                }
                Err(e) => {
                    // Still ours: a partial table is flushed if the ENI leaves the list.
                    self.installed.insert(eni.device_index, (eni.clone(), None));
                    if matches!(e, HostError::LinkNotFound { .. }) {
                        let (since, warned) = self
                            .missing_since
                            .entry(eni.device_index)
                            .or_insert((now, false));
                        let waited = now.duration_since(*since);
                        if waited >= LINK_WAIT_WARNING && !*warned {
                            *warned = true;
                            tracing::warn!(mac = %eni.mac, device_index = eni.device_index, waited = ?waited, "ENI link still missing");
                        } else {
                            tracing::debug!(mac = %eni.mac, device_index = eni.device_index, "ENI link not there yet");
                        }
                    } else {
                        tracing::warn!(mac = %eni.mac, device_index = eni.device_index, error = %e, "installing the ENI route table failed");
                    }
                    report.failed.push((eni.device_index, e));
                }
            }
        }
        let gone: Vec<u32> = self
            .installed
            .keys()
            .copied()
            .filter(|i| !wanted.iter().any(|e| e.device_index == *i))
            .collect();
        for index in gone {
            match self.routing.remove(index).await {
                Ok(()) => {
                    self.installed.remove(&index);
                    tracing::info!(
                        device_index = index,
                        table = index + 1,
                        "ENI route table flushed"
                    );
                    report.removed.push(index);
                }
                Err(e) => {
                    tracing::warn!(device_index = index, error = %e, "flushing the ENI route table failed");
                    report.failed.push((index, e));
                }
            }
        }
        self.missing_since
            .retain(|i, _| wanted.iter().any(|e| e.device_index == *i));
        report
    }

    /// Runs [`Self::sync`] every `period` against what `wanted` returns (for the daemon:
    /// `move || pod_eni_routes(&pool.snapshot(), mtu)`), until `cancel`.
    pub fn spawn<F>(
        mut self,
        mut wanted: F,
        period: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Vec<EniRoute> + Send + 'static,
    {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let list = wanted();
                self.sync(&list).await;
            }
        })
    }
}
