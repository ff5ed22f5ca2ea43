//! IPv6 helpers: addresses and /80 prefixes assigned through mockcloud's world, an echo server on
//! `[::]`, a lab whose nodes forward IPv6, addresses inside a prefix.

use std::net::{Ipv6Addr, SocketAddr};

use ipnet::Ipv6Net;
use mockcloud::MockCloud;
use mockcloud::world::{Ipv6Args, Ipv6Assigned};
use vpclab::{EchoServer, LabConfig, NetNs};

use super::PORT;

pub fn assign_v6(mock: &MockCloud, eni: &str, args: Ipv6Args) -> Ipv6Assigned {
    mock.with_world(|w, now| w.assign_ipv6(eni, args, now))
        .expect("assign IPv6")
}

/// One IPv6 address and one /80 on `eni`, as a node in an IPv6 cluster holds them.
pub fn address_and_prefix(mock: &MockCloud, eni: &str) -> (Ipv6Addr, Ipv6Net) {
    let a = assign_v6(mock, eni, Ipv6Args::Count(1)).addresses[0];
    let p = assign_v6(mock, eni, Ipv6Args::PrefixCount(1)).prefixes[0];
    (a, p)
}

/// The `n`-th address of a prefix.
pub fn nth(prefix: Ipv6Net, n: u128) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(prefix.network()) + n)
}

pub fn serve6(ns: &NetNs) -> EchoServer {
    EchoServer::start(ns, SocketAddr::from((Ipv6Addr::UNSPECIFIED, PORT))).expect("echo server")
}

/// The default lab with IPv6 forwarding on in every node (what `eniipamd --prepare-host` sets for
/// an IPv6 node) and, when `strict`, strict IPv4 reverse-path filtering. IPv6 has no `rp_filter`
/// sysctl: the kernel filters IPv6 by reverse path only through an nftables/ip6tables `fib`
/// rule, which neither the lab nor a node installs, so the IPv6 cells must pass either way.
pub fn config(strict: bool) -> LabConfig {
    let mut c = LabConfig::default();
    c.node_sysctls
        .push(("net/ipv6/conf/all/forwarding".into(), "1".into()));
    if strict {
        for (k, v) in c.node_sysctls.iter_mut() {
            if k.ends_with("/rp_filter") {
                *v = "1".into();
            }
        }
    }
    c
}
