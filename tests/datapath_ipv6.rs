//! The IPv6 data path (issue 26 item 4) on the emulated VPC: the real `eniipamd` with
//! `ip_family = ipv6` in each node namespace (one /80 on eth0), pods made by the real plugin with
//! the shipped conflist, real TCP over IPv6, and EC2's source/destination check and unassigned sink
//! counting drops (every case asserts none). Nodes run strict IPv4 `rp_filter` as in
//! `datapath.rs`, and one cell runs loose; IPv6 has no `rp_filter` sysctl (see `vpclab`'s
//! `fabric_ipv6.rs`), so the IPv6 path must not depend on it.
//!
//! | case | cell |
//! | --- | --- |
//! | pod ↔ pod, same node | `ipv6_same_node` |
//! | pod ↔ pod, across nodes (strict, loose `rp_filter`) | `ipv6_across_nodes_strict_rp_filter`, `ipv6_across_nodes_loose_rp_filter` |
//! | node → pod (probes), own node and across | `ipv6_node_to_pod` |
//!
//! Needs root, `ip`, `nft`, `iptables`, `nsenter` and `/usr/lib/cni/portmap` (the harness's
//! checks); build the plugin first (`cargo build --workspace --bins`). Skipped with a notice where
//! the lab cannot run.

mod bins;
mod datapath_support;

use datapath_support::v6::*;
use datapath_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_same_node() {
    let Some(c) = Cluster::start_v6("ipv6_same_node", RpFilter::Strict).await else {
        return;
    };
    let d = Daemon::start_v6(&c, &c.a.instance_id).await;
    let p1 = d.add_pod_v6(&c, "web-1").await;
    let p2 = d.add_pod_v6(&c, "web-2").await;
    let (_s1, _s2) = (serve6(&p1.ns), serve6(&p2.ns));
    assert_eq!(reaches6(&p1.ns, p2.ip).await.server_saw.ip(), p1.ip);
    assert_eq!(reaches6(&p2.ns, p1.ip).await.server_saw.ip(), p2.ip);
    c.assert_no_drops().await;
}

async fn across_nodes(test: &str, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let da = Daemon::start_v6(&c, &c.a.instance_id).await;
    let db = Daemon::start_v6(&c, &c.b.instance_id).await;
    let pa = da.add_pod_v6(&c, "web-a").await;
    let pb = db.add_pod_v6(&c, "web-b").await;
    let (_sa, _sb) = (serve6(&pa.ns), serve6(&pb.ns));
    assert_eq!(reaches6(&pa.ns, pb.ip).await.server_saw.ip(), pa.ip);
    assert_eq!(reaches6(&pb.ns, pa.ip).await.server_saw.ip(), pb.ip);
    c.assert_no_drops().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_across_nodes_strict_rp_filter() {
    across_nodes("ipv6_across_nodes_strict_rp_filter", RpFilter::Strict).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_across_nodes_loose_rp_filter() {
    across_nodes("ipv6_across_nodes_loose_rp_filter", RpFilter::Loose).await;
}

/// Kubelet probes: the node reaches its own pod from its eth0 address; another node reaches it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_node_to_pod() {
    let Some(c) = Cluster::start_v6("ipv6_node_to_pod", RpFilter::Strict).await else {
        return;
    };
    let d = Daemon::start_v6(&c, &c.a.instance_id).await;
    let p = d.add_pod_v6(&c, "probed").await;
    let _s = serve6(&p.ns);
    let (na, nb) = (c.node_ns(&c.a.instance_id), c.node_ns(&c.b.instance_id));
    assert_eq!(
        reaches6(&na, p.ip).await.server_saw.ip(),
        c.node_v6(&c.a.instance_id)
    );
    assert_eq!(
        reaches6(&nb, p.ip).await.server_saw.ip(),
        c.node_v6(&c.b.instance_id)
    );
    c.assert_no_drops().await;
}
