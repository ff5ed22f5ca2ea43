//! The soak's attacks and Service traffic (issue 47, cases 1, 2 and 4), run each step after the
//! sampled probes, checked against the model:
//!
//! - **spoofing**: a pod sends raw UDP datagrams (a pod has `NET_RAW`) to a pod of its node with a
//!   third pod's address as their source. The model: never delivered. A delivered datagram would
//!   be echoed by the server to the third pod, where a socket waits for it: a violation;
//! - **hairpin**: a pod reaches itself through a Service of its own. The model: always allowed;
//! - **Service traffic**: a pod reaches another through a Service in its node. The model: what
//!   `connection_allowed` says of the two pods.
//!
//! Each Service takes a random mode of `vpclab::service`: `Dnat` (kube-proxy's iptables and
//! nftables modes) or `LocalInOut` (IPVS's local-in, local-out path).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use eniipam::network_policy::{Protocol, connection_allowed};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use vpclab::NetNs;
use vpclab::service::{Service, ServiceMode};

use super::world::World;
use super::{Cell, probe_cells};
use crate::network_policy_support::PORTS;

/// How long a spoofed datagram's echo is waited for.
const ECHO_WAIT: Duration = Duration::from_millis(500);
/// Spoofed datagrams a step sends.
const SPOOFED: u32 = 3;

/// What one step's attacks found.
#[derive(Debug, Default)]
pub struct Findings {
    pub spoofs: u64,
    pub hairpins: u64,
    pub services: u64,
    /// Of the Service probes, those the model denies.
    pub services_denied: u64,
    pub violations: Vec<String>,
    pub not_converged: Vec<String>,
}

fn mode(rng: &mut StdRng) -> ServiceMode {
    if rng.random_bool(0.5) {
        ServiceMode::Dnat
    } else {
        ServiceMode::LocalInOut
    }
}

/// One step's attacks on `world`, whose node `i` is the namespace `nodes[i]`; `cluster_ips` are
/// two addresses no Service of the nodes holds.
pub async fn attack(
    world: &World,
    nodes: &[NetNs],
    rng: &mut StdRng,
    cluster_ips: [Ipv4Addr; 2],
) -> Findings {
    let mut found = Findings::default();
    let pods = &world.pods;
    if pods.len() < 3 {
        return found;
    }
    let cluster = world.cluster();

    // Spoofing: c sends as p to s, s on c's node.
    let c = rng.random_range(0..pods.len());
    let same: Vec<usize> = (0..pods.len())
        .filter(|s| *s != c && pods[*s].node == pods[c].node)
        .collect();
    if let Some(&s) = same.choose(rng) {
        let others: Vec<usize> = (0..pods.len()).filter(|p| *p != c && *p != s).collect();
        let p = *others.choose(rng).expect("three pods");
        let port = *PORTS.choose(rng).expect("ports");
        let (impersonated, server) = (pods[p].cni.ip, pods[s].cni.ip);
        let recorder = pods[p]
            .cni
            .ns
            .run_async(|| {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp bind");
                s.set_nonblocking(true).expect("nonblocking");
                s
            })
            .await
            .expect("a socket in the impersonated pod");
        let echo_port = recorder.local_addr().expect("its port").port();
        let recorder = tokio::net::UdpSocket::from_std(recorder).expect("tokio socket");
        pods[c]
            .cni
            .ns
            .run_async(move || {
                for _ in 0..SPOOFED {
                    vpclab::raw::send_udp_from(
                        SocketAddrV4::new(impersonated, echo_port),
                        SocketAddrV4::new(server, port),
                        b"spoofed",
                    )
                    .expect("a raw datagram");
                }
            })
            .await
            .expect("a raw socket in the pod");
        let mut buf = [0u8; 16];
        let echoed = tokio::time::timeout(ECHO_WAIT, recorder.recv_from(&mut buf)).await;
        found.spoofs += 1;
        if let Ok(Ok((n, _))) = echoed {
            found.violations.push(format!(
                "{} sent UDP/{port} as {} ({impersonated}) to {} ({server}): delivered ({:?} echoed back)",
                pods[c].key(),
                pods[p].key(),
                pods[s].key(),
                String::from_utf8_lossy(&buf[..n])
            ));
        }
    }

    // A hairpin and a Service to another pod, each in a random mode.
    let h = rng.random_range(0..pods.len());
    let (client, server) = {
        let c = rng.random_range(0..pods.len());
        let s = (0..pods.len()).filter(|s| *s != c).collect::<Vec<_>>();
        (c, *s.choose(rng).expect("two pods"))
    };
    let (hairpin_mode, service_mode) = (mode(rng), mode(rng));
    let hairpin = Service::start(
        &nodes[pods[h].node],
        hairpin_mode,
        cluster_ips[0],
        pods[h].cni.ip,
        &PORTS,
    )
    .await
    .expect("the hairpin's Service");
    let service = Service::start(
        &nodes[pods[client].node],
        service_mode,
        cluster_ips[1],
        pods[server].cni.ip,
        &PORTS,
    )
    .await
    .expect("the Service");
    let pick = |rng: &mut StdRng| {
        let protocol = *[Protocol::Tcp, Protocol::Udp].choose(rng).expect("two");
        (protocol, *PORTS.choose(rng).expect("ports"))
    };
    let ((hp, hport), (sp, sport)) = (pick(rng), pick(rng));
    let got = probe_cells(vec![
        Cell {
            client_ns: pods[h].cni.ns.name().to_owned(),
            to: SocketAddr::from((cluster_ips[0], hport)),
            protocol: hp,
        },
        Cell {
            client_ns: pods[client].cni.ns.name().to_owned(),
            to: SocketAddr::from((cluster_ips[1], sport)),
            protocol: sp,
        },
    ])
    .await;
    drop((hairpin, service));
    found.hairpins += 1;
    if !got[0] {
        found.not_converged.push(format!(
            "{} through its own {hairpin_mode:?} Service {hp:?}/{hport}: no answer, the model allows it (a pod cannot block access to itself)",
            pods[h].key()
        ));
    }
    let (cv, sv) = (pods[client].view(), pods[server].view());
    let allowed = connection_allowed(&cluster, &cv, &sv, sp, sport);
    found.services += 1;
    found.services_denied += u64::from(!allowed);
    if allowed != got[1] {
        let text = format!(
            "{} → {}'s {service_mode:?} Service {sp:?}/{sport}: {}, the model {}",
            pods[client].key(),
            pods[server].key(),
            if got[1] { "connected" } else { "no answer" },
            if allowed { "allows it" } else { "denies it" }
        );
        if got[1] {
            found.violations.push(text);
        } else {
            found.not_converged.push(text);
        }
    }
    found
}
