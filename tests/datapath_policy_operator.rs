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

/// A value of the node daemon's `/metrics` (`None`: not exported), read inside the node.
async fn metric(d: &PolicyDaemon, name: &str) -> Option<f64> {
    let log = d.log_text();
    // The last start's address (each start binds a port of its own).
    let addr = log
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("metrics="))
        .last()
        .unwrap_or_else(|| panic!("no metrics address in the daemon's log:\n{}", d.tail()));
    let text =
        d.ns.exec("curl", &["-sf", &format!("http://{addr}/metrics")])
            .await
            .expect("curl /metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

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
        metric(&d, "eniipam_network_policy_unenforced_adds_total").await,
        Some(0.0),
        "a main-role ADD is enforced"
    );
    let xa = d.ctl_policy("x/a");
    assert_eq!(xa["egress"]["isolated"], true, "{xa}");
    assert_eq!(xa["warnings"], json!([]), "no Service CIDR known: {xa}");

    // With the cluster's Service CIDRs: the rule naming one is a warning, the other is not.
    d.restart_with(&[("ENIIPAM_SERVICE_CIDRS", "10.100.0.0/16,fd00:10::/108")])
        .await;
    let xa = d.ctl_policy("x/a");
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
        metric(&d, "eniipam_network_policy_unenforced_adds_total").await,
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
