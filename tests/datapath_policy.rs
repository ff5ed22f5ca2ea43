//! NetworkPolicy through the real daemon and plugin (issue 28, "Done when": every reproduced
//! upstream case passes, on one node and across nodes, under strict and loose `rp_filter`).
//!
//! Each node of the emulated VPC runs the real `eniipamd` with `ENIIPAM_NETWORK_POLICY=true`,
//! watching NetworkPolicies, pods and namespaces in the API-server double; pods are made by the real
//! plugin, exist in the double (labels, upstream's named ports) before their ADD and get their
//! `status.podIPs` after it. Upstream's world: namespaces `x`, `y`, `z` (labelled `ns=<name>`), pods
//! `a`, `b`, `c` in each, every pod serving TCP and UDP on 80 and 81.
//!
//! - **Topologies.** One node: the nine pods on node A (secondary ENIs). Two nodes: pods `a` on
//!   node A (secondary ENIs), pods `b` and `c` on node B (eth0), so every case has cells that cross
//!   the VPC, allowed and denied (checked per case).
//! - **Cases.** Every shared upstream case (`tests/netpol_cases`, the policies whose expected
//!   matrices `tests/network_policy_cases.rs` holds), dealt over two labs of the topology side by
//!   side (`datapath_policy/world.rs`), each case in turn in its lab: the previous case's policies are
//!   deleted and the case's put in the API server, then the full matrix (9 × 9 pods, TCP and UDP,
//!   80 and 81: 324 cells) is probed until every cell is what the model's `connection_allowed`
//!   says, for at most [`IN_FORCE_WITHIN`]; the last round's differing cells are printed. The rounds
//!   each case took are printed, not asserted.
//! - **A new pod is filtered from its first packet.** With `x` taking ingress only from pods `b`, a
//!   new pod `x/d` is ADDed: when the plugin returns, its host veth already has chains in
//!   `table inet eniipam_policy`, and the first probes from `y/a` are dropped while those from `x/b`
//!   connect.
//! - **`eniipamctl policy x/a`** names the isolating policy and its rule (with `x/b`'s address), and
//!   its denied counter grows with a denied probe.
//! - **A deleted pod's address reused:** with `y/a` taking ingress only from `x/d`, `x/d` is deleted
//!   and its address given to a new `z/e`; right after the ADD, `z/e` cannot reach `y/a` (no stale
//!   peer) and `y/b` reaches `z/e` (no stale chain), and the whole matrix agrees with the model.
//! - **A flushed table** (issue 47, case 5): another agent's `nft flush ruleset` in the node; the
//!   daemon loads the table again within seconds, warns naming what was missing, counts it, and
//!   the matrix agrees with the model again.
//! - **A recreated sandbox** (issue 47, case 6): `x/a` ADDed again before its old attachment's DEL
//!   (one veth name, two attachments): the ADD and the next one succeed, the new `x/a` is enforced,
//!   the old attachment is reported (`eniipamctl policy`, a warning, a gauge) until its DEL.
//! - **A new local pod is a peer from its ADD** (issue 47, case 3, `issue47`): its address not
//!   posted by the kubelet yet, its first packets to a pod that allows it connect.
//! - **Hairpin** (issue 47, case 4, `issue47`): a pod closed both ways reaches itself through its
//!   Service (a ClusterIP DNAT in the node); another pod sending from its address does not.
//! - **Spoofing** (issue 47, case 2, `spoofing`): a pod's raw datagrams with an allowed peer's
//!   source reach neither an isolated pod nor an open one.
//! - **Services in every kube-proxy mode** (issue 47, case 1, `services`): through a ClusterIP
//!   DNATed at prerouting and through one taken at local-in and sent on through local-out with
//!   the client's source (IPVS's path), connections are what the model says of the pods behind
//!   them, and a pod reaches itself.
//! - **Enforcement off:** the daemons restarted with `ENIIPAM_NETWORK_POLICY=false` delete the table,
//!   and every cell connects although the policies are still in the API server.
//!
//! SCTP is not probed here (TCP and UDP only): the lab's kernel has no SCTP sockets, so SCTP is
//! probed by its `INIT` on raw sockets (`network_policy_support/sctp.rs`) in
//! `tests/datapath_policy_upstream.rs` (every upstream case through two real daemons) and in
//! `tests/network_policy_nft.rs`. Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;
#[path = "datapath_policy/issue47.rs"]
mod issue47;
#[path = "netpol_cases/mod.rs"]
mod netpol_cases;
#[path = "datapath_policy/services.rs"]
mod services;
#[path = "datapath_policy/spoofing.rs"]
mod spoofing;
#[path = "datapath_policy/udp.rs"]
mod udp;
#[path = "datapath_policy/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::time::Duration;

use datapath_support::policy::*;
use datapath_support::*;
use eniipam::network_policy::Protocol;
use eniipam_kubeapi::FakeApiServer;
use netpol_cases::policy;
use serde_json::{Value, json};
use vpclab::Egress;
use world::{LABS, Topology, World};

const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
/// How long the daemons may take to put a change in force before the matrix must agree.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(15);

both_rp_filters!(one_node: one_node_strict_rp_filter, one_node_loose_rp_filter);
both_rp_filters!(two_nodes: two_nodes_strict_rp_filter, two_nodes_loose_rp_filter);

async fn one_node(test: &str, rp_filter: RpFilter) {
    policies_in_force(test, rp_filter, Topology::OneNode).await;
}

async fn two_nodes(test: &str, rp_filter: RpFilter) {
    policies_in_force(test, rp_filter, Topology::TwoNodes).await;
}

async fn policies_in_force(test: &str, rp_filter: RpFilter, topology: Topology) {
    let worlds =
        futures::future::join_all((0..LABS).map(|_| World::start(test, rp_filter, topology))).await;
    let Some(mut worlds) = worlds.into_iter().collect::<Option<Vec<World>>>() else {
        return;
    };
    // Every shared case, dealt over the worlds.
    let total = netpol_cases::cases(|_, _| std::net::Ipv4Addr::UNSPECIFIED).len();
    let started = tokio::time::Instant::now();
    let ran: usize = futures::future::join_all(
        worlds
            .iter_mut()
            .enumerate()
            .map(|(share, w)| w.cases(test, share)),
    )
    .await
    .into_iter()
    .sum();
    assert_eq!(ran, total, "every shared case ran");
    eprintln!(
        "{test}: {ran} cases over {LABS} labs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The other worlds stay up until the end: tearing a lab down (its namespaces) stalls the
    // kernel's networking for the one going on.
    let mut w = worlds.remove(0);

    // A new pod's rules are in force before its ADD returns.
    let gate = policy(
        "x",
        "gate",
        json!({"podSelector": {}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    w.set_policies(std::slice::from_ref(&gate)).await;
    let cells = all_cells(&w.pods);
    let want = expected(&model(&w.pods, std::slice::from_ref(&gate)), &cells);
    until_matrix("gate", &w.pods, &cells, &want, IN_FORCE_WITHIN, || w.logs()).await;
    let xd = w.on_a.add_pod(&w.c, &w.api, "x", "d", None).await;
    let veth = host_veth(&xd.cni);
    let table = w
        .on_a
        .policy_table()
        .await
        .expect("table inet eniipam_policy");
    assert!(
        table.contains(&veth),
        "x/d's ADD returned before its veth {veth} had chains:\n{table}"
    );
    w.servers.push(serve_ports(&xd.cni.ns).await);
    // The fabric learns the new address (EC2 knew it before the ADD returned).
    w.c.lab.sync().await.expect("lab sync");
    let mut with_d = w.pods.clone();
    with_d.insert(xd.key.clone(), xd.clone());
    let first: Vec<Cell> = ["x/b", "y/a"]
        .into_iter()
        .flat_map(|client| {
            PROTOCOLS.map(|protocol| Cell {
                client: client.to_owned(),
                server: "x/d".to_owned(),
                protocol,
                port: 80,
            })
        })
        .collect();
    let got = probe_cells(&with_d, &first, FIRST_PACKETS_WAIT).await;
    let want = expected(&model(&with_d, std::slice::from_ref(&gate)), &first);
    assert_eq!(
        want.values().filter(|w| **w).count(),
        2,
        "x/b is allowed, y/a is not"
    );
    let wrong = differences(&with_d, &got, &want);
    assert!(
        wrong.is_empty(),
        "x/d's first packets, right after its ADD:\n{}",
        wrong.join("\n")
    );

    // What eniipamctl says of x/a, and its denied counter.
    let xa = w.on_a.ctl_policy("x/a");
    let ingress = &xa["ingress"];
    assert_eq!(ingress["isolated"], true, "{xa}");
    assert!(
        ingress["policies"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == "x/gate")),
        "{xa}"
    );
    let xb_ip = w.pods["x/b"].cni.ip.to_string();
    assert!(
        ingress["rules"]
            .as_array()
            .is_some_and(|rules| rules.iter().any(|r| {
                r["source"].as_str().is_some_and(|s| s.contains("x/gate"))
                    && r["peers"]
                        .as_array()
                        .is_some_and(|p| p.iter().any(|p| p == xb_ip.as_str()))
            })),
        "no rule of x/gate lets x/b ({xb_ip}) in: {xa}"
    );
    let denied_before = ingress["denied"].as_u64().expect("a denied count");
    let to_xa = [Cell {
        client: "y/a".to_owned(),
        server: "x/a".to_owned(),
        protocol: Protocol::Tcp,
        port: 80,
    }];
    let got = probe_cells(&w.pods, &to_xa, PROBE_WAIT).await;
    assert_eq!(got.values().next(), Some(&false), "y/a → x/a connected");
    let xa = w.on_a.ctl_policy("x/a");
    assert!(
        xa["ingress"]["denied"].as_u64().expect("a denied count") > denied_before,
        "the denied probe was not counted (before: {denied_before}): {xa}"
    );

    // x/d's address, reused by a pod of z once x/d is gone: no stale verdict either way.
    let only_d = policy(
        "y",
        "only-d",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}},
                                      "podSelector": {"matchLabels": {"pod": "d"}}}]}]}),
    );
    let reuse_policies = [gate.clone(), only_d];
    w.set_policies(&reuse_policies).await;
    let cells_d = all_cells(&with_d);
    let want = expected(&model(&with_d, &reuse_policies), &cells_d);
    assert_eq!(
        want.iter()
            .filter(|(c, w)| c.server == "y/a" && **w && c.client != "y/a")
            .count(),
        PROTOCOLS.len() * PORTS.len(),
        "only x/d reaches y/a"
    );
    until_matrix(
        "only x/d reaches y/a",
        &with_d,
        &cells_d,
        &want,
        IN_FORCE_WITHIN,
        || w.logs(),
    )
    .await;
    w.on_a.delete_pod(&w.api, &xd).await;
    w.servers.pop();
    let ze = w
        .on_a
        .add_pod(&w.c, &w.api, "z", "e", Some(xd.cni.ip))
        .await;
    assert_eq!(ze.cni.ip, xd.cni.ip, "z/e did not get x/d's address");
    w.servers.push(serve_ports(&ze.cni.ns).await);
    w.c.lab.sync().await.expect("lab sync");
    let mut with_e = w.pods.clone();
    with_e.insert(ze.key.clone(), ze.clone());
    let stale: Vec<Cell> = PROTOCOLS
        .into_iter()
        .flat_map(|protocol| {
            [("z/e", "y/a"), ("y/b", "z/e")].map(|(client, server)| Cell {
                client: client.to_owned(),
                server: server.to_owned(),
                protocol,
                port: 80,
            })
        })
        .collect();
    let want = expected(&model(&with_e, &reuse_policies), &stale);
    assert!(
        want.iter().all(|(c, w)| *w == (c.server == "z/e")),
        "z/e is denied y/a, y/b reaches z/e"
    );
    let got = probe_cells(&with_e, &stale, FIRST_PACKETS_WAIT).await;
    let wrong = differences(&with_e, &got, &want);
    assert!(
        wrong.is_empty(),
        "x/d's address reused by z/e, right after its ADD:\n{}",
        wrong.join("\n")
    );
    let cells_e = all_cells(&with_e);
    let want = expected(&model(&with_e, &reuse_policies), &cells_e);
    until_matrix(
        "x/d's address reused by z/e",
        &with_e,
        &cells_e,
        &want,
        IN_FORCE_WITHIN,
        || w.logs(),
    )
    .await;

    // Enforcement off: the table goes, everything connects although the policies stay.
    for d in [Some(&mut w.on_a), w.on_b.as_mut()].into_iter().flatten() {
        d.restart_with(&[("ENIIPAM_NETWORK_POLICY", "false")]).await;
        assert_eq!(
            d.policy_table().await,
            None,
            "{}: the table outlived enforcement",
            d.node
        );
    }
    let open = expected(&model(&with_e, &[]), &cells_e);
    until_matrix(
        "enforcement off",
        &with_e,
        &cells_e,
        &open,
        IN_FORCE_WITHIN,
        || w.logs(),
    )
    .await;
    w.c.assert_no_drops().await;
    for other in worlds {
        other.c.assert_no_drops().await;
    }
}

/// How long an outside `nft flush ruleset` may leave the node unenforced (issue 47, case 5): the
/// daemon checks the kernel's table every few seconds; generous for a loaded lab.
const RESTORED_WITHIN: Duration = Duration::from_secs(15);

/// One node, `x/a` taking ingress only from `x/b`, and pods `x/a`, `x/b`, `y/a` serving.
async fn small_world(
    test: &str,
    rp_filter: RpFilter,
) -> Option<(
    Cluster,
    FakeApiServer,
    PolicyDaemon,
    Vec<Value>,
    BTreeMap<String, PolicyPod>,
    Vec<Servers>,
)> {
    let c = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await?;
    let api = FakeApiServer::start().await;
    for ns in NAMESPACES {
        api.put_namespace_labels(ns, &[("ns", ns)]);
    }
    let d = PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
    let only_b = vec![policy(
        "x",
        "only-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )];
    for p in &only_b {
        api.put_network_policy(p.clone());
    }
    let mut pods = BTreeMap::new();
    let mut servers = Vec::new();
    for (ns, name) in [("x", "a"), ("x", "b"), ("y", "a")] {
        let pod = d.add_pod(&c, &api, ns, name, None).await;
        servers.push(serve_ports(&pod.cni.ns).await);
        pods.insert(pod.key.clone(), pod);
    }
    c.lab.sync().await.expect("lab sync");
    Some((c, api, d, only_b, pods, servers))
}

/// Issue 47, case 5: another agent's `nft flush ruleset` in the node takes the table away; the
/// daemon puts it back within seconds (not at the next cluster change or the 10-minute reload),
/// logs what was missing and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_table_is_restored_within_seconds() {
    let test = "a_flushed_table_is_restored_within_seconds";
    let Some((c, _api, d, policies, pods, _servers)) = small_world(test, RpFilter::Strict).await
    else {
        return;
    };
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix(
        "x/a only from x/b",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    assert!(d.policy_table().await.is_some(), "no table to flush");

    d.ns.exec("nft", &["flush", "ruleset"])
        .await
        .expect("nft flush ruleset in the node");
    assert_eq!(d.policy_table().await, None, "the flush left the table");
    let flushed = tokio::time::Instant::now();
    while d.policy_table().await.is_none() {
        assert!(
            flushed.elapsed() < RESTORED_WITHIN,
            "table inet eniipam_policy not restored within {RESTORED_WITHIN:?} of `nft flush ruleset`:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "{test}: restored after {:.1} s",
        flushed.elapsed().as_secs_f64()
    );
    until_matrix(
        "after the flush",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    let log = d.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("table inet eniipam_policy")
            && l.contains("missing")),
        "no warning names the missing table:\n{}",
        d.tail()
    );
    assert_eq!(
        d.metric("eniipam_network_policy_table_restored_total")
            .await,
        Some(1.0),
        "the restore is counted once"
    );
    c.assert_no_drops().await;
}

/// Issue 47, case 6: a pod's sandbox recreated while its old attachment is still assigned (no DEL
/// yet) gives two attachments one host veth. The node keeps enforcing: the newest attachment owns
/// the veth, the other is reported, and ADDs on the node go on succeeding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_sandbox_does_not_fail_the_node() {
    let test = "a_recreated_sandbox_does_not_fail_the_node";
    let Some((c, api, d, policies, mut pods, mut servers)) =
        small_world(test, RpFilter::Strict).await
    else {
        return;
    };
    let old = pods["x/a"].clone();
    // The new sandbox's ADD, the old attachment still assigned.
    let new = d.add_pod(&c, &api, "x", "a", None).await;
    assert_eq!(
        host_veth(&new.cni),
        host_veth(&old.cni),
        "one veth name per pod"
    );
    assert_ne!(
        new.cni.ip, old.cni.ip,
        "the old attachment still holds its address"
    );
    servers.push(serve_ports(&new.cni.ns).await);
    pods.insert(new.key.clone(), new.clone());
    // Another ADD on the node while the duplicate lasts.
    let yb = d.add_pod(&c, &api, "y", "b", None).await;
    servers.push(serve_ports(&yb.cni.ns).await);
    pods.insert(yb.key.clone(), yb);
    c.lab.sync().await.expect("lab sync");
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix("the new x/a", &pods, &cells, &want, IN_FORCE_WITHIN, || {
        d.tail()
    })
    .await;
    let xa = d.ctl_policy("x/a");
    let reported = xa["not_enforced"].as_array().is_some_and(|n| {
        n.iter().any(|n| {
            n.as_str().is_some_and(|s| {
                s.contains(&old.cni.container_id) && s.contains(&host_veth(&old.cni))
            })
        })
    });
    assert!(reported, "the superseded attachment is not reported: {xa}");
    eprintln!("{test}: x/a reports {}", xa["not_enforced"]);
    assert_eq!(
        d.metric("eniipam_network_policy_superseded_attachments")
            .await,
        Some(1.0)
    );
    assert!(
        d.log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains(&old.cni.container_id)),
        "no warning names the superseded attachment:\n{}",
        d.tail()
    );
    // The old sandbox's DEL ends it: nothing superseded, the new x/a still enforced.
    d.del_pod(&old.cni).await;
    let gauge = tokio::time::Instant::now();
    while d
        .metric("eniipam_network_policy_superseded_attachments")
        .await
        != Some(0.0)
    {
        assert!(
            gauge.elapsed() < IN_FORCE_WITHIN,
            "still superseded after the DEL:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    until_matrix(
        "after the old DEL",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    c.assert_no_drops().await;
}
