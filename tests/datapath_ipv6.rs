//! The IPv6 and dual-stack data-path matrices (issue 26 item 4) on the emulated VPC: the real
//! `eniipamd` with `ip_family = ipv6` or `dual` in each node namespace (one /80 on eth0; dual-stack
//! pods' IPv4 from eth0's secondary IPs), pods made by the real plugin with the shipped conflist
//! (chained with the reference `portmap` for hostPorts), real TCP, and EC2's source/destination
//! check and unassigned sink counting drops (every cell asserts none). Every cell runs IPv6-only
//! and dual-stack; a dual-stack cell runs each exchange in both families between the same pods.
//! Nodes run strict IPv4 `rp_filter` (the daemon must loosen eth0 for IPv4 itself); the
//! across-node and NodePort cells run loose too. IPv6 has no `rp_filter` sysctl (see `vpclab`'s
//! `fabric_ipv6.rs`), so the IPv6 path must not depend on it.
//!
//! | case | IPv6-only | dual-stack (IPv4 and IPv6) |
//! | --- | --- | --- |
//! | pod ↔ pod, same node | `ipv6_same_node` | `dual_same_node` |
//! | pod ↔ pod across nodes, node → pod on another node (strict `rp_filter`) | `ipv6_across_nodes_strict_rp_filter` | `dual_across_nodes_strict_rp_filter` |
//! | the same, loose `rp_filter` | `ipv6_across_nodes_loose_rp_filter` | `dual_across_nodes_loose_rp_filter` |
//! | node → pod (probes), pod → its node | `ipv6_node_to_pod` | `dual_node_to_pod` |
//! | pod → IPv6 internet (egress-only IGW: the pod's own address out, nothing in) | `ipv6_internet` | `dual_internet` |
//! | pod → IPv4 internet (SNAT to eth0's primary IPv4) | `datapath_ipv6_egress.rs` (node-local IPv4 per pod) | `dual_internet` |
//! | NodePort: `Local` to a pod on the node, `Cluster` to a pod on another node (strict) | `ipv6_node_port_strict_rp_filter` | `dual_node_port_strict_rp_filter` |
//! | the same, loose `rp_filter` | `ipv6_node_port_loose_rp_filter` | `dual_node_port_loose_rp_filter` |
//! | hostPort (`portmap`), removed by DEL | `ipv6_host_port` | `dual_host_port` |
//!
//! NodePort is kube-proxy's iptables mode emulated in `ip6tables` and `iptables`
//! (`datapath_support/v6/kube_proxy.rs`); the client is the other node. Needs root, `ip`, `nft`,
//! `iptables`, `ip6tables`, `nsenter` and `/usr/lib/cni/portmap` (the harness's checks); build the
//! plugin first (`cargo build --workspace --bins`). Skipped with a notice where the lab cannot run.

mod bins;
mod datapath_support;

use std::net::IpAddr;

use datapath_support::v6::kube_proxy::{NodePortService, TrafficPolicy};
use datapath_support::v6::*;
use datapath_support::*;
use mockcloud::LaunchedInstance;
use vpclab::{INTERNET_SERVER, INTERNET_SERVER_V6};

/// One test per family (IPv6-only, dual-stack) of a cell, under the given `rp_filter`.
macro_rules! matrix {
    ($case:ident, $rp:ident: $ipv6:ident, $dual:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $ipv6() {
            $case(stringify!($ipv6), Family::Ipv6, RpFilter::$rp).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $dual() {
            $case(stringify!($dual), Family::Dual, RpFilter::$rp).await;
        }
    };
}

matrix!(same_node, Strict: ipv6_same_node, dual_same_node);
matrix!(across_nodes, Strict: ipv6_across_nodes_strict_rp_filter, dual_across_nodes_strict_rp_filter);
matrix!(across_nodes, Loose: ipv6_across_nodes_loose_rp_filter, dual_across_nodes_loose_rp_filter);
matrix!(node_to_pod, Strict: ipv6_node_to_pod, dual_node_to_pod);
matrix!(internet, Strict: ipv6_internet, dual_internet);
matrix!(node_port, Strict: ipv6_node_port_strict_rp_filter, dual_node_port_strict_rp_filter);
matrix!(node_port, Loose: ipv6_node_port_loose_rp_filter, dual_node_port_loose_rp_filter);
matrix!(host_port, Strict: ipv6_host_port, dual_host_port);

/// A node's address of each family its pods have: (IPv6, IPv4 if dual-stack).
fn node_addrs(c: &Cluster, node: &LaunchedInstance, family: Family) -> Vec<IpAddr> {
    let mut addrs = vec![IpAddr::V6(c.node_v6(&node.instance_id))];
    if family == Family::Dual {
        addrs.push(IpAddr::V4(node.private_ip));
    }
    addrs
}

/// `from` reaches every address of `to` (both families where dual), and each exchange arrives
/// from `from`'s own address of that family: nothing is NATed inside the VPC.
async fn pod_reaches_pod(from: &CniPod6, to: &CniPod6) {
    for (dst, src) in to.ips().into_iter().zip(from.ips()) {
        assert_eq!(
            reach(&from.ns, dst, ECHO_PORT).await,
            src,
            "{} → {}",
            from.name,
            to.name
        );
    }
}

/// `node` reaches every address of `pod`; the pod sees the node's address of that family.
async fn node_reaches_pod(c: &Cluster, node: &LaunchedInstance, pod: &CniPod6, family: Family) {
    let ns = c.node_ns(&node.instance_id);
    for (dst, src) in pod.ips().into_iter().zip(node_addrs(c, node, family)) {
        assert_eq!(reach(&ns, dst, ECHO_PORT).await, src, "node → {}", pod.name);
    }
}

async fn same_node(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let d = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let p1 = d.add_pod6(&c, "web-1", None).await;
    let p2 = d.add_pod6(&c, "web-2", None).await;
    let (_s1, _s2) = (serve6(&p1.ns), serve6(&p2.ns));
    pod_reaches_pod(&p1, &p2).await;
    pod_reaches_pod(&p2, &p1).await;
    c.assert_no_drops().await;
}

async fn across_nodes(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let da = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let db = Daemon::start_family(&c, &c.b.instance_id, family).await;
    let pa = da.add_pod6(&c, "web-a", None).await;
    let pb = db.add_pod6(&c, "web-b", None).await;
    let (_sa, _sb) = (serve6(&pa.ns), serve6(&pb.ns));
    pod_reaches_pod(&pa, &pb).await;
    pod_reaches_pod(&pb, &pa).await;
    // A node reaches a pod on the other node (its reply goes back through the pod's node).
    node_reaches_pod(&c, &c.b, &pa, family).await;
    node_reaches_pod(&c, &c.a, &pb, family).await;
    c.assert_no_drops().await;
}

/// Kubelet probes: the node reaches its own pod from its eth0 addresses; the pod reaches a
/// host-network server on its node.
async fn node_to_pod(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let d = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let p = d.add_pod6(&c, "probed", None).await;
    let _s = serve6(&p.ns);
    node_reaches_pod(&c, &c.a, &p, family).await;
    let node = c.node_ns(&c.a.instance_id);
    let _on_node = serve6(&node);
    for (dst, src) in node_addrs(&c, &c.a, family).into_iter().zip(p.ips()) {
        assert_eq!(reach(&p.ns, dst, ECHO_PORT).await, src, "pod → its node");
    }
    c.assert_no_drops().await;
}

/// The IPv6 internet through the egress-only gateway with the pod's own address (nothing is NATed
/// in IPv6); dual-stack, the IPv4 internet through the node's SNAT to eth0's primary IPv4, as in
/// `datapath.rs`.
async fn internet(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let d = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let p = d.add_pod6(&c, "egress", None).await;
    let _s = serve6(&p.ns);
    let _internet = serve6(c.lab.internet());
    // Several connections each way.
    for _ in 0..3 {
        assert_eq!(
            reach(&p.ns, INTERNET_SERVER_V6.into(), ECHO_PORT).await,
            IpAddr::V6(p.ip),
            "the IPv6 internet sees the pod's own address"
        );
        if family == Family::Dual {
            assert_eq!(
                reach(&p.ns, INTERNET_SERVER.into(), ECHO_PORT).await,
                IpAddr::V4(c.a.private_ip),
                "the IPv4 internet sees eth0's primary IPv4 (SNAT)"
            );
        }
    }
    assert_eq!(c.lab.eigw_drops().await.expect("eigw"), 0, "replies got in");
    // Egress-only: the internet cannot open a connection to the pod.
    dropped6(c.lab.internet(), p.ip.into(), ECHO_PORT).await;
    assert!(
        c.lab.eigw_drops().await.expect("eigw") > 0,
        "the gateway dropped it"
    );
    assert_eq!(c.lab.igw_drops().await.expect("igw").egress_not_public, 0);
    c.assert_no_drops().await;
}

/// NodePort on node A from a client on node B, in each family the pods have: a `Local` service
/// to a pod on node A (the pod sees the client's address), and a `Cluster` service to a pod on
/// node B (kube-proxy masquerades: the pod sees node A's address, and its reply returns through
/// node A to be un-DNATed).
async fn node_port(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let da = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let db = Daemon::start_family(&c, &c.b.instance_id, family).await;
    let local = da.add_pod6(&c, "svc-local", None).await;
    let remote = db.add_pod6(&c, "svc-remote", None).await;
    let (_sl, _sr) = (serve6(&local.ns), serve6(&remote.ns));
    let (local_port, cluster_port) = (NODE_PORT, NODE_PORT + 1);
    let services: Vec<NodePortService> = local
        .ips()
        .into_iter()
        .map(|endpoint| NodePortService {
            node_port: local_port,
            endpoint,
            policy: TrafficPolicy::Local,
        })
        .chain(remote.ips().into_iter().map(|endpoint| NodePortService {
            node_port: cluster_port,
            endpoint,
            policy: TrafficPolicy::Cluster,
        }))
        .collect();
    da.add_node_ports(&services).await;
    let client = c.node_ns(&c.b.instance_id);
    let node_a = node_addrs(&c, &c.a, family);
    let node_b = node_addrs(&c, &c.b, family);
    for _ in 0..3 {
        for (a, b) in node_a.iter().zip(&node_b) {
            assert_eq!(
                reach(&client, *a, local_port).await,
                *b,
                "Local: no masquerade ({a})"
            );
            assert_eq!(
                reach(&client, *a, cluster_port).await,
                *a,
                "Cluster: masqueraded to node A ({a})"
            );
        }
    }
    c.assert_no_drops().await;
}

/// hostPort through the chained `portmap` (ip6tables for the IPv6, iptables for the IPv4), from a
/// client on the other node; the chain's DEL removes the DNAT.
async fn host_port(test: &str, family: Family, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let d = Daemon::start_family(&c, &c.a.instance_id, family).await;
    let p = d.add_pod6(&c, "hostport", Some(HOST_PORT)).await;
    let _s = serve6(&p.ns);
    let dport = format!("--dport {HOST_PORT}");
    let dual = family == Family::Dual;
    assert!(
        d.ip6tables_nat().await.contains(&dport),
        "portmap's IPv6 DNAT"
    );
    assert_eq!(
        d.iptables_nat().await.contains(&dport),
        dual,
        "portmap's IPv4 DNAT only for a pod with an IPv4"
    );
    let client = c.node_ns(&c.b.instance_id);
    for (a, b) in node_addrs(&c, &c.a, family)
        .into_iter()
        .zip(node_addrs(&c, &c.b, family))
    {
        assert_eq!(reach(&client, a, HOST_PORT).await, b, "hostPort on {a}");
    }
    c.assert_no_drops().await;
    d.del_pod6(&p).await;
    assert!(
        !d.ip6tables_nat().await.contains(&dport),
        "portmap's DEL removed its IPv6 DNAT"
    );
    assert!(
        !d.iptables_nat().await.contains(&dport),
        "portmap's DEL removed its IPv4 DNAT"
    );
}
