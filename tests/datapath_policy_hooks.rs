//! Issue 47, case 9's daemon items, through the real daemon and plugin on one node of the emulated
//! VPC:
//!
//! - **A deleted pod's flows** ([`a_deleted_pods_flows_are_gone_after_its_del`]): a UDP flow from
//!   `y/a` to `x/a` is in the node's conntrack table until `x/a`'s DEL, and not after it, so the
//!   next pod given the address inherits no established flow.
//!
//! (The startup taint held until the first policy sync is `tests/datapath_policy_operator.rs`.)
//!
//! Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use std::net::SocketAddr;

use datapath_support::policy::*;
use datapath_support::*;
use eniipam::network_policy::Protocol;
use eniipam_kubeapi::FakeApiServer;
use vpclab::Egress;

const NODE_A: &str = "node-a";

/// The node's conntrack entries naming `ip` at an end (`/proc/net/nf_conntrack`, read inside it).
async fn flows_of(d: &PolicyDaemon, ip: std::net::Ipv4Addr) -> Vec<String> {
    let table =
        d.ns.exec("cat", &["/proc/net/nf_conntrack"])
            .await
            .expect("the node's conntrack table");
    let (src, dst) = (format!("src={ip} "), format!("dst={ip} "));
    table
        .lines()
        .filter(|l| l.contains(&src) || l.contains(&dst))
        .map(str::to_owned)
        .collect()
}

/// Issue 47, case 9. Before the fix the DEL left the flow's entry (a replied UDP flow lives 120 s),
/// so a new pod given the address within that time met an established flow it never opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_flows_are_gone_after_its_del() {
    let test = "a_deleted_pods_flows_are_gone_after_its_del";
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, RpFilter::Strict).await else {
        return;
    };
    let api = FakeApiServer::start().await;
    for ns in ["x", "y"] {
        api.put_namespace_labels(ns, &[("ns", ns)]);
    }
    let d = PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
    let xa = d.add_pod(&c, &api, "x", "a", None).await;
    let ya = d.add_pod(&c, &api, "y", "a", None).await;
    let _servers = serve_ports(&xa.cni.ns).await;
    c.lab.sync().await.expect("lab sync");
    let to = SocketAddr::from((xa.cni.ip, 80));
    assert!(
        probe_address(&ya.cni.ns, to, Protocol::Udp).await,
        "y/a → x/a udp/80"
    );
    let before = flows_of(&d, xa.cni.ip).await;
    assert!(
        before.iter().any(|l| l.contains("udp")),
        "the flow is not in the node's conntrack table: {before:#?}"
    );
    d.delete_pod(&api, &xa).await;
    let after = flows_of(&d, xa.cni.ip).await;
    assert!(
        after.is_empty(),
        "x/a's DEL left its flows in the node's conntrack table: {after:#?}\n{}",
        d.tail()
    );
    c.assert_no_drops().await;
}
