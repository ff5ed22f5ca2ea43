//! The host's side of the data path, kept in step with the pool: each secondary ENI's route table
//! (from the pool's snapshot), the pool's readiness gate of new ENIs (given to the pool when it is
//! built, before the keeper it asks is spawned over the pool), the SNAT and NodePort rules.
//! The daemon is where the pool and the host meet: neither imports the other.

use std::sync::Arc;
use std::time::Duration;

use super::{Building, CloudClients, DaemonError};
use crate::config::DaemonConfig;
use crate::host::EniRoute;
use crate::metrics::Metrics;
use crate::pool::{EniReadiness, Pool};
use crate::pool::{EniRole, EniSnapshot, PoolSnapshot};

/// The host's route keeper before the pool it keeps in step with exists: the rtnetlink handle and
/// the requests of the pool's readiness gate ([`host_route_gate`]), which the pool is built with.
pub(super) struct PendingRouting {
    routing: crate::host::EniRouting,
    ready_rx: tokio::sync::mpsc::Receiver<crate::host::ReadyRequest>,
}

/// The pool's readiness gate of new ENIs ([`HostRouteGate`], given to the pool when it is built)
/// and the route keeper it will ask, to be spawned over the pool by [`spawn_host_routing`].
pub(super) async fn host_route_gate(
    b: &Building,
    wait: Duration,
) -> Result<(Arc<dyn EniReadiness>, PendingRouting), DaemonError> {
    let routing = crate::host::EniRouting::new().await?;
    let (ready_tx, ready_rx) = tokio::sync::mpsc::channel(16);
    let gate = Arc::new(HostRouteGate {
        requests: ready_tx,
        wait,
        metrics: b.metrics.clone(),
    });
    Ok((gate, PendingRouting { routing, ready_rx }))
}

/// Each secondary ENI's table (device_index + 1), kept in step with the pool: installed when an ENI
/// appears (retried until its link shows up), flushed when it goes. A new ENI serves no pod before
/// its table is installed: the pool's readiness gate ([`HostRouteGate`]) waits for the keeper.
pub(super) fn spawn_host_routing(pool: &Pool, pending: PendingRouting, b: &mut Building) {
    let pool = pool.clone();
    b.background.push(
        crate::host::RouteKeeper::new(pending.routing, Duration::from_secs(60)).spawn_gated(
            move || pod_eni_routes(&pool.snapshot(), None),
            Duration::from_secs(2),
            pending.ready_rx,
            b.cancel.clone(),
        ),
    );
}

/// The pool's readiness gate of new ENIs when the daemon keeps their route tables: asks the route
/// keeper to install the new ENI's table now and waits, up to `wait` (`eni_route_wait_secs`), until it
/// is (see `pool::EniReadiness`, issue 23).
struct HostRouteGate {
    requests: tokio::sync::mpsc::Sender<crate::host::ReadyRequest>,
    wait: Duration,
    metrics: Metrics,
}

#[async_trait::async_trait]
impl EniReadiness for HostRouteGate {
    async fn ready(&self, eni: &crate::pool::NewEniFacts) -> Result<(), String> {
        let Some(cidr) = eni.subnet_cidr else {
            return Err(format!("the subnet of {} is not known", eni.id));
        };
        // As `pod_eni_routes` will list it once the pool serves it (no MTU: the same as there).
        let Some(route) =
            crate::host::EniRoute::of_eni(&eni.mac, eni.device_index, cidr, eni.primary_ip, None)
        else {
            // The primary ENI: routed by the main table, nothing to wait for.
            return Ok(());
        };
        let (respond_to, installed) = tokio::sync::oneshot::channel();
        let asked = crate::host::ReadyRequest { route, respond_to };
        if self.requests.send(asked).await.is_err() {
            return Err("the host route keeper has stopped".into());
        }
        match tokio::time::timeout(self.wait, installed).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("the host route keeper has stopped".into()),
            Err(_) => {
                self.metrics.eni_route_timeouts.inc();
                Err(format!(
                    "its route table (table {}) was not installed within {:?}: its link (MAC {}) did not \
                     show up on the host, or writing the table failed (see the warnings of the route keeper)",
                    eni.device_index + 1,
                    self.wait,
                    eni.mac
                ))
            }
        }
    }
}

/// SNAT and NodePort rules (nftables table `ip eniipam`, `fwmark` rule 1024, loose rp_filter on
/// eth0), installed before the socket is served and then kept: drift healed, VPC CIDRs re-read
/// from IMDS every 30 s. Left in place on shutdown (see `host::rules_keeper`).
pub(super) async fn spawn_host_rules(
    config: &DaemonConfig,
    clients: &CloudClients,
    b: &mut Building,
) -> Result<(), DaemonError> {
    let rules = crate::host::HostRules::new(crate::host::Nft::default())?;
    let mut keeper = crate::host::RulesKeeper::new(
        config.host_rules_config(),
        rules,
        Arc::new(ImdsPrimary(clients.metadata.clone())),
        Duration::from_secs(30),
    );
    keeper.sync().await?;
    b.background.push(keeper.spawn(
        Duration::from_secs(config.host_rules_check_secs),
        b.cancel.clone(),
    ));
    Ok(())
}

/// The primary interface's facts the host's rules keeper reads ([`crate::host::PrimaryFacts`]),
/// answered from IMDS: the host crate knows no cloud seam, the daemon gives it this one.
pub struct ImdsPrimary(pub Arc<dyn crate::cloud::Metadata>);

#[async_trait::async_trait]
impl crate::host::PrimaryFacts for ImdsPrimary {
    async fn primary_mac(&self) -> Result<String, String> {
        Ok(self.0.identity().await.map_err(|e| e.to_string())?.mac)
    }

    async fn interface(&self, mac: &str) -> Result<Option<crate::host::InterfaceFacts>, String> {
        let eni = self.0.interface(mac).await.map_err(|e| e.to_string())?;
        Ok(eni.map(|eni| crate::host::InterfaceFacts {
            ips: eni.ips,
            vpc_cidrs: eni.vpc_cidrs,
        }))
    }
}

/// The route of a pool ENI: only ENIs that serve pods ([`EniRole::Pods`]), are not the primary
/// and whose subnet is known get one.
pub fn eni_route(eni: &EniSnapshot, mtu: Option<u32>) -> Option<EniRoute> {
    if eni.role != EniRole::Pods {
        return None;
    }
    EniRoute::of_eni(
        &eni.mac,
        eni.device_index,
        eni.subnet_cidr?,
        eni.primary_ip,
        mtu,
    )
}

/// The routes of every pod ENI in `snapshot` ([`eni_route`]).
pub fn pod_eni_routes(snapshot: &PoolSnapshot, mtu: Option<u32>) -> Vec<EniRoute> {
    snapshot
        .enis
        .iter()
        .filter_map(|e| eni_route(e, mtu))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_enis_map_to_routes() {
        use crate::pool::EniPhaseSnapshot;
        let snap = |role: EniRole, device_index: u32, cidr: Option<&str>| EniSnapshot {
            id: "eni-0123abcd".parse().unwrap(),
            mac: "02:AB:00:00:00:01".into(),
            device_index,
            subnet_id: "subnet-1".into(),
            subnet_cidr: cidr.map(|c| c.parse().unwrap()),
            primary_ip: "10.1.2.10".parse().unwrap(),
            role,
            serves_pods: role == EniRole::Pods,
            prefixes: Vec::new(),
            phase: EniPhaseSnapshot::Serving,
            in_flight: 0,
            ips: Vec::new(),
            network: None,
        };
        let route = eni_route(&snap(EniRole::Pods, 2, Some("10.1.2.0/24")), Some(9001)).unwrap();
        assert_eq!(
            route,
            EniRoute {
                mac: "02:ab:00:00:00:01".into(),
                device_index: 2,
                subnet_cidr: "10.1.2.0/24".parse().unwrap(),
                gateway: "10.1.2.1".parse().unwrap(),
                primary_ip: "10.1.2.10".parse().unwrap(),
                mtu: Some(9001),
            }
        );
        assert_eq!(
            eni_route(&snap(EniRole::Primary, 0, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(
            eni_route(&snap(EniRole::Foreign, 1, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(
            eni_route(&snap(EniRole::Pods, 0, Some("10.1.2.0/24")), None),
            None
        );
        assert_eq!(eni_route(&snap(EniRole::Pods, 1, None), None), None);
    }
}
