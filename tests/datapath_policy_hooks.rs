//! Issue 47, case 9's daemon items, through the real daemon and plugin on one node of the emulated
//! VPC:
//!
//! - **A deleted pod's flows** ([`a_deleted_pods_flows_are_gone_after_its_del`]): a UDP flow from
//!   `y/a` to `x/a` is in the node's conntrack table until `x/a`'s DEL, and not after it, so the
//!   next pod given the address inherits no established flow.
//! - **The startup taint waits for the rules**
//!   ([`the_startup_taint_stays_until_the_policy_rules_are_in_force`]): with
//!   `remove_startup_taint` and enforcement on, the API server refusing to list NetworkPolicies
//!   keeps the node's startup taint although the pool is warm; once the list works, the first sync
//!   puts the rules in force and the taint goes.
//!
//! Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use std::net::SocketAddr;
use std::time::Duration;

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

const TAINT: &str = "eniipam.io/not-ready";

/// Before the fix the taint went as soon as the pool was warm: pods were scheduled to a node whose
/// every ADD then waited for rules that could not be put in force (and failed after 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_taint_stays_until_the_policy_rules_are_in_force() {
    let test = "the_startup_taint_stays_until_the_policy_rules_are_in_force";
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, RpFilter::Strict).await else {
        return;
    };
    let api = FakeApiServer::start().await;
    let mut d =
        PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
    // The node as registered with its startup taint (the start put it without).
    api.add_node(NODE_A, &[(TAINT, "NoSchedule")]);
    // The daemon again, now keeping the taint, and NetworkPolicies not listable.
    api.forbid("networkpolicies.networking.k8s.io", true);
    d.restart_with(&[
        ("ENIIPAM_REMOVE_STARTUP_TAINT", "true"),
        ("ENIIPAM_NODE_CHECK_SECS", "1"),
    ])
    .await;
    let started = tokio::time::Instant::now();
    let kept = "startup taint: the pool holds warm IPs; kept until the NetworkPolicy rules are first in force";
    // The pool warm, the taint kept: said once, and still there a few checks later.
    while !d.log_text().contains(kept) {
        assert!(
            api.taint_keys(NODE_A).contains(&TAINT.to_owned()),
            "the taint went before the rules were in force:\n{}",
            d.tail()
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon never said why it keeps the taint:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        api.taint_keys(NODE_A).contains(&TAINT.to_owned()),
        "the taint went before the rules were in force:\n{}",
        d.tail()
    );
    api.forbid("networkpolicies.networking.k8s.io", false);
    let allowed = tokio::time::Instant::now();
    while api.taint_keys(NODE_A).contains(&TAINT.to_owned()) {
        assert!(
            allowed.elapsed() < Duration::from_secs(60),
            "the taint stayed after the list worked again:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        d.policy_table().await.is_some(),
        "the taint went: the table is in the kernel"
    );
    eprintln!(
        "{test}: taint gone {:.1} s after the list worked",
        allowed.elapsed().as_secs_f64()
    );
}
