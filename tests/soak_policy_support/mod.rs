//! The NetworkPolicy soak's harness (`tests/soak_policy.rs`). The nodes' `eniipamd`s enforcing
//! NetworkPolicy, their pods' TCP and UDP servers on 80 and 81 and the node's table read back are
//! `datapath_support::policy`'s, as the data-path cases use them; here are the soak's probes, many
//! at once, each run from inside its client pod's namespace.
//!
//! The test's truth (namespaces, pods with their real IPs, policies) and its random changes are
//! in [`world`]; the spoofing attempts, hairpins and Service traffic of each step in [`attacks`].

#![allow(dead_code)]

pub mod attacks;
pub mod world;

use std::net::SocketAddr;

use eniipam::network_policy::Protocol;

use crate::network_policy_support::{enter, probe};

/// One probe: from the pod namespace named `client_ns` to `to` over `protocol`.
#[derive(Clone, Debug)]
pub struct Cell {
    pub client_ns: String,
    pub to: SocketAddr,
    pub protocol: Protocol,
}

/// Runs every cell at once (each from inside its client's namespace); whether each connected, in
/// order.
pub async fn probe_cells(cells: Vec<Cell>) -> Vec<bool> {
    tokio::task::spawn_blocking(move || {
        let threads: Vec<_> = cells
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    enter(&c.client_ns);
                    probe(c.protocol, c.to)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a probe thread"))
            .collect()
    })
    .await
    .expect("the probes")
}
