//! [`RouteKeeper`]: follows the pool's changing list of ENIs and keeps each one's route table in step
//! ([`super::routes`] does the netlink work).
//!
//! It also answers the pool's readiness gate (issue 23): a [`ReadyRequest`] for a new ENI (not yet
//! in the pool's list, whose IPs wait for it) is worked on at once and retried every
//! [`READY_RETRY`] until the ENI's link has shown up and its table is installed; then it is
//! answered, and the table is held (never flushed as "gone") until the pool lists the ENI, or for
//! [`READY_HOLD`] if it never does (the create was abandoned).

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
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

/// A request of the pool's readiness gate: answered once `route`'s table is installed.
#[derive(Debug)]
pub struct ReadyRequest {
    pub route: EniRoute,
    pub respond_to: oneshot::Sender<()>,
}

/// How often a new ENI the pool waits for is retried while its link is missing.
pub const READY_RETRY: Duration = Duration::from_millis(50);

/// How long a table installed for the readiness gate is kept while the pool does not list its ENI.
pub const READY_HOLD: Duration = Duration::from_secs(120);

/// `wanted` plus the routes the readiness gate waits for or holds (they win over a listed ENI of
/// the same device index: the pool lists an ENI it is giving up until it is gone).
pub fn with_gated(
    wanted: Vec<EniRoute>,
    gated: impl IntoIterator<Item = EniRoute>,
) -> Vec<EniRoute> {
    let mut list = wanted;
    for route in gated {
        list.retain(|e| e.device_index != route.device_index);
        list.push(route);
    }
    list
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

    /// Whether `eni`'s table is installed as described (its last attempt succeeded).
    pub fn is_installed(&self, eni: &EniRoute) -> bool {
        matches!(self.installed.get(&eni.device_index), Some((done, Some(_))) if done == eni)
    }

    /// Runs [`Self::sync`] every `period` against what `wanted` returns (for the daemon, in
    /// `daemon/host.rs`: `move || pod_eni_routes(&pool.snapshot(), mtu)`), until `cancel`.
    pub fn spawn<F>(
        self,
        wanted: F,
        period: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Vec<EniRoute> + Send + 'static,
    {
        let (_, ready) = mpsc::channel(1);
        self.spawn_gated(wanted, period, ready, cancel)
    }

    /// [`Self::spawn`], also answering the pool's readiness gate on `ready` (see the module docs).
    pub fn spawn_gated<F>(
        mut self,
        mut wanted: F,
        period: Duration,
        mut ready: mpsc::Receiver<ReadyRequest>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Vec<EniRoute> + Send + 'static,
    {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut ready_open = true;
            let mut pending: Vec<ReadyRequest> = Vec::new();
            // Tables installed for the gate, until the pool lists their ENI.
            let mut held: HashMap<u32, (EniRoute, Instant)> = HashMap::new();
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tick.tick() => {}
                    req = ready.recv(), if ready_open => match req {
                        Some(req) => pending.push(req),
                        None => ready_open = false,
                    },
                    _ = tokio::time::sleep(READY_RETRY), if !pending.is_empty() => {}
                }
                let now = Instant::now();
                let listed = wanted();
                held.retain(|index, (route, until)| {
                    now < *until
                        && !listed
                            .iter()
                            .any(|e| e.device_index == *index && e == route)
                });
                pending.retain(|p| !p.respond_to.is_closed());
                let gated = held
                    .values()
                    .map(|(r, _)| r.clone())
                    .chain(pending.iter().map(|p| p.route.clone()));
                let list = with_gated(listed, gated.collect::<Vec<_>>());
                self.sync(&list).await;
                for p in std::mem::take(&mut pending) {
                    if self.is_installed(&p.route) {
                        held.insert(p.route.device_index, (p.route.clone(), now + READY_HOLD));
                        let _ = p.respond_to.send(());
                    } else {
                        pending.push(p);
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(device_index: u32, mac: &str) -> EniRoute {
        EniRoute {
            mac: mac.into(),
            device_index,
            subnet_cidr: "10.0.0.0/20".parse().unwrap(),
            gateway: "10.0.0.1".parse().unwrap(),
            primary_ip: "10.0.0.9".parse().unwrap(),
            mtu: None,
        }
    }

    #[test]
    fn gated_routes_join_the_list_and_win_their_device_index() {
        let listed = vec![route(1, "02:00:00:00:00:01"), route(2, "02:00:00:00:00:02")];
        let fresh = route(2, "02:00:00:00:00:22");
        let list = with_gated(listed, [route(3, "02:00:00:00:00:03"), fresh.clone()]);
        let indexes: Vec<u32> = list.iter().map(|r| r.device_index).collect();
        assert_eq!(indexes, [1, 3, 2]);
        assert!(list.contains(&fresh), "the ENI the gate waits for wins");
        assert_eq!(with_gated(Vec::new(), Vec::new()), Vec::<EniRoute>::new());
    }
}
