//! The NetworkPolicy soak's harness (`tests/soak_policy.rs`): the real `eniipamd` with
//! `ENIIPAM_NETWORK_POLICY=true` in lab nodes of `datapath_support`'s emulated VPC, reaching the
//! API-server double through a port forward; TCP and UDP servers on 80 and 81 in every pod; probes
//! run from inside pod namespaces; and the node's table `inet eniipam_policy` read back.
//!
//! The test's truth (namespaces, pods with their real IPs, policies) and its random changes are
//! in [`world`].

#![allow(dead_code)]

pub mod world;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use eniipam::network_policy::Protocol;
use eniipam_kubeapi::FakeApiServer;
use nix::poll::{PollFd, PollFlags, poll};
use vpclab::{NetNs, PortForward};

use crate::datapath_support::{Cluster, Daemon, Placement};
use crate::network_policy_support::{PORTS, enter, probe};

/// A node's `eniipamd` enforcing NetworkPolicy, and the port forward that lets it reach the
/// API-server double from inside the node.
pub struct PolicyDaemon {
    pub daemon: Daemon,
    /// The node's name in the API server (`ENIIPAM_NODE_NAME`, its pods' `spec.nodeName`).
    pub node: String,
    _forward: PortForward,
}

impl Deref for PolicyDaemon {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl DerefMut for PolicyDaemon {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

impl PolicyDaemon {
    /// Registers node `node` (instance `instance_id`) in `api` and starts its `eniipamd` with
    /// enforcement on; pods are served from eth0 first.
    pub async fn start(
        c: &Cluster,
        api: &FakeApiServer,
        instance_id: &str,
        node: &str,
    ) -> PolicyDaemon {
        let (forward, url) = crate::datapath_support::forward_api(c, api, instance_id, node).await;
        let env = [
            ("ENIIPAM_NETWORK_POLICY", "true"),
            ("ENIIPAM_API_SERVER_URL", url.as_str()),
            ("ENIIPAM_API_SERVER_GC", "false"),
            ("ENIIPAM_NODE_CONDITION", "false"),
            ("ENIIPAM_NODE_NAME", node),
        ];
        let daemon = Daemon::start(c, instance_id, Placement::Eth0, &env).await;
        PolicyDaemon {
            daemon,
            node: node.to_owned(),
            _forward: forward,
        }
    }

    /// The chains of the node's table `inet eniipam_policy` (none when there is no table).
    pub async fn chains(&self) -> BTreeSet<String> {
        let Ok(json) = self
            .ns
            .nft_json(&["list", "table", "inet", "eniipam_policy"])
            .await
        else {
            return BTreeSet::new();
        };
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["chain"]["name"].as_str())
            .map(str::to_owned)
            .collect()
    }
}

/// TCP and UDP servers on 80 and 81 inside a pod's namespace, answering `ok\n` on TCP and echoing
/// UDP; stopped when dropped.
pub struct Servers {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Servers {
    pub fn start(ns: &NetNs) -> Servers {
        let (name, stop) = (ns.name().to_owned(), Arc::new(AtomicBool::new(false)));
        let (tx, rx) = mpsc::channel();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            enter(&name);
            let tcp: Vec<TcpListener> = PORTS
                .iter()
                .map(|p| TcpListener::bind(("0.0.0.0", *p)).expect("tcp bind"))
                .collect();
            let udp: Vec<UdpSocket> = PORTS
                .iter()
                .map(|p| UdpSocket::bind(("0.0.0.0", *p)).expect("udp bind"))
                .collect();
            for l in &tcp {
                l.set_nonblocking(true).expect("nonblocking");
            }
            for u in &udp {
                u.set_nonblocking(true).expect("nonblocking");
            }
            tx.send(()).expect("the starter waits");
            while !stopped.load(Ordering::Acquire) {
                let mut fds: Vec<PollFd<'_>> = tcp
                    .iter()
                    .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
                    .chain(
                        udp.iter()
                            .map(|u| PollFd::new(u.as_fd(), PollFlags::POLLIN)),
                    )
                    .collect();
                if poll(&mut fds, 50u16).unwrap_or(0) == 0 {
                    continue;
                }
                for l in &tcp {
                    while let Ok((mut conn, _)) = l.accept() {
                        let _ = conn.write_all(b"ok\n");
                    }
                }
                let mut buf = [0u8; 64];
                for u in &udp {
                    while let Ok((n, from)) = u.recv_from(&mut buf) {
                        let _ = u.send_to(&buf[..n], from);
                    }
                }
            }
        });
        rx.recv().expect("the servers started");
        Servers {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
