//! The soak's checks against the model (`connection_allowed` and `compile` on the cluster as the
//! test holds it, with the pods' real IPs): the matrix probed, and each node's chains.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use eniipam::network_policy::{Direction, Protocol, compile, connection_allowed};

use super::world::World;
use super::{Cell, probe_cells};
use crate::datapath_support::policy::PolicyDaemon;
use crate::network_policy_support::PORTS;

/// A cell of the matrix: client and server (indices of the world's pods), protocol, port.
pub type MatrixCell = (usize, usize, Protocol, u16);

/// Every (client, server, protocol, port) between two live pods, by index.
pub fn all_cells(world: &World) -> Vec<MatrixCell> {
    let n = world.pods.len();
    let mut cells = Vec::new();
    for client in 0..n {
        for server in (0..n).filter(|s| *s != client) {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                for port in PORTS {
                    cells.push((client, server, protocol, port));
                }
            }
        }
    }
    cells
}

/// Probes `cells` and judges them against the model: the problems (true: a violation, false: not
/// converged) described, and how many cells the model denied. `daemons` name the pods' nodes.
pub async fn probe(
    world: &World,
    daemons: &[PolicyDaemon],
    cells: &[MatrixCell],
) -> (Vec<(bool, String)>, u64) {
    let cluster = world.cluster();
    let pods = &world.pods;
    let probes = cells
        .iter()
        .map(|&(client, server, protocol, port)| Cell {
            client_ns: pods[client].cni.ns.name().to_owned(),
            to: SocketAddr::from((pods[server].cni.ip, port)),
            protocol,
        })
        .collect();
    let got = probe_cells(probes).await;
    let mut problems = Vec::new();
    let mut denied = 0;
    for (&(client, server, protocol, port), connected) in cells.iter().zip(got) {
        let (cv, sv) = (pods[client].view(), pods[server].view());
        let allowed = connection_allowed(&cluster, &cv, &sv, protocol, port);
        denied += u64::from(!allowed);
        if allowed != connected {
            let (c, s) = (&pods[client], &pods[server]);
            problems.push((
                connected,
                format!(
                    "{} ({}, node {}) → {} ({}, node {}) {protocol:?}/{port}: {}, the model {}",
                    c.key(),
                    c.cni.ip,
                    daemons[c.node].node,
                    s.key(),
                    s.cni.ip,
                    daemons[s.node].node,
                    if connected { "connected" } else { "no answer" },
                    if allowed { "allows it" } else { "denies it" },
                ),
            ));
        }
    }
    (problems, denied)
}

/// Each node's chains against the model: a live pod's ingress (egress) chain exists iff the model
/// isolates that direction; no chain names another veth.
pub async fn chain_mismatches(world: &World, daemons: &[PolicyDaemon]) -> Vec<String> {
    let cluster = world.cluster();
    let mut out = Vec::new();
    for (node, daemon) in daemons.iter().enumerate() {
        let chains = daemon.chains().await;
        let mut expected = BTreeSet::from(["forward".to_owned()]);
        for pod in world.pods.iter().filter(|p| p.node == node) {
            let compiled = compile(&cluster, &pod.view());
            for (dir, prefix) in [(&compiled.ingress, "in"), (&compiled.egress, "eg")] {
                let chain = format!("{prefix}_{}", pod.veth);
                let isolated = matches!(dir, Direction::Isolated { .. });
                if isolated {
                    expected.insert(chain.clone());
                }
                if isolated != chains.contains(&chain) {
                    out.push(format!(
                        "{}: {} ({}) {} chain {chain}, the model {}",
                        daemon.node,
                        pod.key(),
                        pod.veth,
                        if isolated { "lacks" } else { "has" },
                        if isolated {
                            "isolates it"
                        } else {
                            "leaves it open"
                        },
                    ));
                }
            }
        }
        for stale in chains
            .iter()
            .filter(|c| !expected.contains(*c) && (c.starts_with("in_") || c.starts_with("eg_")))
        {
            out.push(format!(
                "{}: chain {stale} names no live pod's veth",
                daemon.node
            ));
        }
    }
    out
}
