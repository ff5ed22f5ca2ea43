//! The NetworkPolicy soak's harness (`tests/soak_policy.rs`). The nodes' `eniipamd`s enforcing
//! NetworkPolicy, their pods' TCP and UDP servers on 80 and 81 and the node's table read back are
//! `datapath_support::policy`'s, as the data-path cases use them; here are the soak's probes, many
//! at once, each run from inside its client pod's namespace.
//!
//! The test's truth (namespaces, pods with their real IPs, policies) and its random changes are
//! in [`world`]; the spoofing attempts, hairpins and Service traffic of each step in [`attacks`].

#![allow(dead_code)]

pub mod attacks;
pub mod checks;
pub mod world;

use std::net::SocketAddr;
use std::sync::{Arc, mpsc};

use eniipam::network_policy::Protocol;

use crate::network_policy_support::enter;
use crate::network_policy_support::sweep::{self, SourcePorts, Sweep};

/// One probe: from the pod namespace named `client_ns` to `to` over `protocol`.
#[derive(Clone, Debug)]
pub struct Cell {
    pub client_ns: String,
    pub to: SocketAddr,
    pub protocol: Protocol,
}

/// Runs every cell at once (each from inside its client's namespace) as one [`Sweep`]: the cells
/// still silent once the answers have settled are denials (`network_policy_support::sweep`);
/// whether each connected, in order.
pub async fn probe_cells(cells: Vec<Cell>) -> Vec<bool> {
    /// The soak's UDP source ports, in turn (a 5-tuple comes back only after 40,000 probes).
    static PORTS: SourcePorts = SourcePorts::new();
    tokio::task::spawn_blocking(move || {
        let total = cells.len();
        let sweep = Arc::new(Sweep::new(total));
        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let (tx, sweep) = (tx.clone(), sweep.clone());
                std::thread::spawn(move || {
                    enter(&c.client_ns);
                    let _ = tx.send((i, sweep::probe_in(&sweep, c.protocol, c.to, &PORTS)));
                })
            })
            .collect();
        drop(tx);
        let got = sweep.collect(rx, total, || {
            for t in threads {
                t.join().expect("a probe thread");
            }
        });
        (0..total).map(|i| got.get(&i) == Some(&true)).collect()
    })
    .await
    .expect("the probes")
}
