//! NetworkPolicy's warnings to the operator (issue 47, case 9), through the real daemon, plugin
//! and `eniipamctl` on the emulated VPC:
//!
//! - **The IPAM role.** A pod whose interface another plugin makes (eniipam as its IPAM) is not
//!   enforced: eniipam's rules key on its own host veth. The plugin tells the daemon its role; with
//!   enforcement on, the daemon counts the ADD in `eniipam_network_policy_unenforced_adds_total`
//!   and warns naming the pod. The main role's ADD counts nothing.
//! - **An `ipBlock` in the Service CIDR.** aws-node's agent judged egress before kube-proxy's DNAT,
//!   eniipam after: a policy allowing egress to the Service CIDR allows nothing here.
//!   `eniipamctl policy` names each such rule once the daemon knows the cluster's Service CIDRs
//!   (`ENIIPAM_SERVICE_CIDRS`), and says nothing of it without them.
//!
//! - **The startup taint waits for the first policy sync.** Until NetworkPolicy's rules are in
//!   force, a pod's ADD would wait for them and fail: the node keeps its startup taint although
//!   its pool is warm (here: the daemon's RBAC lacks NetworkPolicies, as a DaemonSet upgraded
//!   before its ClusterRole would), and drops it once the first sync is in the kernel.
//!
//! Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;
#[path = "netpol_cases/mod.rs"]
mod netpol_cases;

use datapath_support::policy::*;
use datapath_support::*;
use eniipam_kubeapi::FakeApiServer;
use netpol_cases::policy;
use serde_json::json;
use vpclab::Egress;

const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_is_told_what_is_not_enforced() {
    let test = "the_operator_is_told_what_is_not_enforced";
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, RpFilter::Strict).await else {
        return;
    };
    let api = FakeApiServer::start().await;
    api.put_namespace_labels("x", &[("ns", "x")]);
    // Egress of x/a to the Service CIDR (as written for aws-node), and to a block beside it.
    api.put_network_policy(policy(
        "x",
        "to-services",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": "10.100.0.0/16"}}]},
                          {"to": [{"ipBlock": {"cidr": "192.168.0.0/16"}}]}]}),
    ));
    let mut d =
        PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE, Placement::SecondaryEni).await;

    // The main role: enforced, nothing counted; no Service CIDR known, no warning.
    d.add_pod(&c, &api, "x", "a", None).await;
    assert_eq!(
        d.metric("eniipam_network_policy_unenforced_adds_total")
            .await,
        Some(0.0),
        "a main-role ADD is enforced"
    );
    let xa = d.ctl_policy("x/a");
    assert_eq!(xa["egress"]["isolated"], true, "{xa}");
    assert_eq!(xa["warnings"], json!([]), "no Service CIDR known: {xa}");

    // With the cluster's Service CIDRs: the rule naming one is a warning, the other is not.
    d.restart_with(&[("ENIIPAM_SERVICE_CIDRS", "10.100.0.0/16,fd00:10::/108")])
        .await;
    // Ready is not synced: the restarted daemon's first sync puts x/a back in its rules.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let xa = loop {
        let xa = d.ctl_policy("x/a");
        if xa["local"] == true {
            break xa;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "x/a not in the restarted daemon's rules within 30 s: {xa}\n{}",
            d.tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let warnings: Vec<String> = serde_json::from_value(xa["warnings"].clone()).unwrap();
    assert_eq!(warnings.len(), 1, "{xa}");
    assert!(
        warnings[0].starts_with(
            "x/to-services egress[0]: ipBlock 10.100.0.0/16 overlaps the Service CIDR 10.100.0.0/16"
        ),
        "{warnings:?}"
    );

    // The IPAM role: the address is given, the pod counted and named in a warning.
    api.put_pod(pod_object("x", "chained", NODE));
    let chained = d.add_pod_ipam_role(&c, "x", "chained").await;
    assert!(
        chained.result["interfaces"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "the IPAM role wires nothing: {}",
        chained.result
    );
    assert_eq!(
        d.metric("eniipam_network_policy_unenforced_adds_total")
            .await,
        Some(1.0),
        "the IPAM-role ADD is counted"
    );
    let log = d.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("NetworkPolicy is NOT enforced")
            && l.contains("x/chained")),
        "no warning names the IPAM-role pod:\n{}",
        d.tail()
    );
    // Bad input changes nothing: a Service CIDR that does not parse stops the daemon, naming it.
    d.stop().await;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", d.ns.path().display()))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_eniipamd"))
        .env("ENIIPAM_SERVICE_CIDRS", "10.100.0.0/16,nope")
        .env("ENIIPAM_CLUSTER_NAME", "datapath")
        .output()
        .expect("eniipamd");
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("service_cidrs"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.assert_no_drops().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_taint_waits_for_the_first_policy_sync() {
    use eniipam::reconcile::api_server::node::DEFAULT_STARTUP_TAINT;
    let test = "the_startup_taint_waits_for_the_first_policy_sync";
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, RpFilter::Strict).await else {
        return;
    };
    const POLICIES: &str = "networkpolicies.networking.k8s.io";
    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[(DEFAULT_STARTUP_TAINT, "NoSchedule")]);
    api.forbid(POLICIES, true);
    let d = PolicyDaemon::start_with(
        &c,
        &api,
        &c.a.instance_id,
        NODE,
        Placement::SecondaryEni,
        &[
            ("ENIIPAM_REMOVE_STARTUP_TAINT", "true"),
            ("ENIIPAM_NODE_CHECK_SECS", "1"),
        ],
    )
    .await;
    // The pool warms; the taint stays, and the log says what it waits for.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !d.log_text().lines().any(|l| {
        l.contains("startup taint: the pool holds warm IPs; kept until the rest is ready")
            && l.contains("network policy's first sync")
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keeper never said it holds the taint for the policy sync:\n{}",
            d.tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Several more checks (one a second) keep it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        api.taint_keys(NODE),
        [DEFAULT_STARTUP_TAINT],
        "the taint went before the first policy sync:\n{}",
        d.tail()
    );
    assert!(
        d.log_text().contains("403") || d.log_text().contains("forbidden"),
        "the policy watch's refusal is not in the log:\n{}",
        d.tail()
    );
    // RBAC fixed: the watch lists (its back-off is at most 30 s), the first sync lands, the
    // taint goes.
    api.forbid(POLICIES, false);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !api.taint_keys(NODE).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the taint stayed after the first policy sync:\n{}",
            d.tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        d.policy_table().await.is_some(),
        "no table after the first sync"
    );
}
