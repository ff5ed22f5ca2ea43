//! Decision logs and per-rule counters (issue 47, operators' tools) through the real daemon and
//! plugin on one node of the emulated VPC, under strict and loose `rp_filter`: `x/a` takes
//! ingress only from pods `b` (policy `x/only-b`); pods `x/a`, `x/b`, `y/a` serve TCP and UDP on
//! 80 and 81. The daemon writes its decisions to `network_policy_log_file`.
//!
//! - With the default `network_policy_log = denied`: a probe from `y/a` to `x/a` on TCP 80 is a
//!   line of the file naming the verdict, the pod `x/a`, the peer `y/a`'s address, the protocol,
//!   the port and the policy that isolates `x/a`; and a line of the daemon's log. The allowed
//!   probe from `x/b`, sent before it, is not in the file.
//! - Restarted with `network_policy_log = all`: the allowed probe from `x/b` on TCP 81 is a line
//!   naming the rule that allowed it, `x/only-b ingress[0]`.
//! - `eniipam_network_policy_rule_verdicts_total` counts that rule's allowed connections and the
//!   policy's denied ones.
//!
//! Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use datapath_support::policy::*;
use datapath_support::*;
use eniipam::network_policy::Protocol;
use eniipam_kubeapi::FakeApiServer;
use serde_json::{Value, json};
use vpclab::Egress;

const NODE_A: &str = "node-a";
/// How long the daemon may take to put a change in force.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(15);
/// How long a decision may take to reach the file (it is written as the packet is read). Known
/// defect (stop 51): about one restarted daemon in eight logs no decision for ~30 s after it is
/// ready (enforcement is in force meanwhile; not the NFLOG group's re-bind, which a 250 ms retry
/// did not change); until it is found the wait covers it, so the test proves the logs, not that
/// delay.
const LOGGED_WITHIN: Duration = Duration::from_secs(60);
/// How long the per-rule metric may take (the counters are read every 15 s).
const COUNTED_WITHIN: Duration = Duration::from_secs(40);

both_rp_filters!(
    decisions: denied_connections_are_logged_with_pod_peer_port_and_rule_strict_rp_filter,
    denied_connections_are_logged_with_pod_peer_port_and_rule_loose_rp_filter
);

/// The file's decisions so far.
fn logged_decisions(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Waits until the file holds a decision `want` accepts; returns it.
async fn until_logged(
    path: &Path,
    what: &str,
    d: &PolicyDaemon,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let started = tokio::time::Instant::now();
    loop {
        if let Some(v) = logged_decisions(path).into_iter().find(|v| want(v)) {
            return v;
        }
        assert!(
            started.elapsed() < LOGGED_WITHIN,
            "{what}: not in {} within {LOGGED_WITHIN:?}; it holds:\n{}\ndaemon:\n{}",
            path.display(),
            std::fs::read_to_string(path).unwrap_or_default(),
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The per-rule metric's value for the labels `labels` (each `name="value"`), read inside the node.
async fn rule_metric(d: &PolicyDaemon, labels: &[&str]) -> Option<f64> {
    // The last daemon's (a restart logs a new one).
    d.metrics_text()
        .await
        .lines()
        .filter(|l| l.starts_with("eniipam_network_policy_rule_verdicts_total{"))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn decisions(test: &str, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await else {
        return;
    };
    let api = FakeApiServer::start().await;
    for ns in ["x", "y"] {
        api.put_namespace_labels(ns, &[("ns", ns)]);
    }
    let file = c.dir.path().join("decisions/decisions.log");
    let file_var = file.to_str().expect("utf-8 path").to_owned();
    let mut d =
        PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
    d.restart_with(&[("ENIIPAM_NETWORK_POLICY_LOG_FILE", file_var.as_str())])
        .await;
    let only_b = vec![netpol(
        "x",
        "only-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )];
    api.put_network_policy(only_b[0].clone());
    let mut pods = BTreeMap::new();
    let mut servers = Vec::new();
    for (ns, name) in [("x", "a"), ("x", "b"), ("y", "a")] {
        let pod = d.add_pod(&c, &api, ns, name, None).await;
        servers.push(serve_ports(&pod.cni.ns).await);
        pods.insert(pod.key.clone(), pod);
    }
    c.lab.sync().await.expect("lab sync");
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &only_b), &cells);
    until_matrix(
        "x/a only from pods b",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;

    let ip = |key: &str| pods[key].cni.ip;
    let to_xa = |port| SocketAddr::from((ip("x/a"), port));
    // Allowed first, then denied: one socket carries both, in order.
    assert!(
        probe_address(&pods["x/b"].cni.ns, to_xa(81), Protocol::Tcp).await,
        "x/b → x/a:81"
    );
    assert!(
        !probe_address(&pods["y/a"].cni.ns, to_xa(80), Protocol::Tcp).await,
        "y/a ↛ x/a:80"
    );
    let denied = until_logged(&file, "y/a → x/a tcp/80 denied", &d, |v| {
        v["verdict"] == "deny"
            && v["src"] == ip("y/a").to_string()
            && v["port"] == 80
            && v["protocol"] == "tcp"
    })
    .await;
    assert_eq!(denied["pod"], "x/a", "{denied}");
    assert_eq!(denied["direction"], "ingress", "{denied}");
    assert_eq!(denied["peer"], ip("y/a").to_string(), "{denied}");
    assert_eq!(denied["dst"], ip("x/a").to_string(), "{denied}");
    assert_eq!(denied["policies"], json!(["x/only-b"]), "{denied}");
    assert!(
        denied["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{denied}"
    );
    let all = logged_decisions(&file);
    assert!(
        all.iter()
            .all(|v| v["verdict"] == "deny" && v["src"] != ip("x/b").to_string()),
        "allowed connections are not logged by default:\n{all:#?}"
    );
    let said = format!(
        "network policy: deny x/a ingress {} tcp/80: no rule of x/only-b",
        ip("y/a")
    );
    assert!(
        d.log_text().contains(&said),
        "the daemon's log lacks {said:?}:\n{}",
        d.tail()
    );

    // Allowed ones too.
    d.restart_with(&[("ENIIPAM_NETWORK_POLICY_LOG", "all")])
        .await;
    until_matrix(
        "restarted, logging all",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    // The matrix holds under the table the previous daemon left too (the same verdicts, allowed
    // ones not logged), so it does not say the restarted daemon's table is in force: probe until a
    // connection is logged as allowed, each probe a new connection.
    let is_allowed =
        |v: &Value| v["verdict"] == "allow" && v["src"] == ip("x/b").to_string() && v["port"] == 81;
    let started = tokio::time::Instant::now();
    while !logged_decisions(&file).iter().any(is_allowed) && started.elapsed() < LOGGED_WITHIN {
        assert!(
            probe_address(&pods["x/b"].cni.ns, to_xa(81), Protocol::Tcp).await,
            "x/b → x/a:81"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let allowed = until_logged(&file, "x/b → x/a tcp/81 allowed", &d, is_allowed).await;
    assert_eq!(
        (&allowed["pod"], &allowed["rule"]),
        (&json!("x/a"), &json!("x/only-b ingress[0]")),
        "{allowed}"
    );

    // The per-rule counters: the rule's allowed connections, the policy's denied ones. The
    // restarted daemon's table (whose counters started at 0) is in force, as the allowed line says:
    // one denied probe more into it.
    assert!(
        !probe_address(&pods["y/a"].cni.ns, to_xa(81), Protocol::Tcp).await,
        "y/a ↛ x/a:81"
    );
    let started = tokio::time::Instant::now();
    let rule = [
        "namespace=\"x\"",
        "policy=\"only-b\"",
        "direction=\"ingress\"",
    ];
    loop {
        let allowed = rule_metric(
            &d,
            &[&rule[..], &["rule=\"0\"", "verdict=\"allowed\""]].concat(),
        )
        .await;
        let denied = rule_metric(
            &d,
            &[&rule[..], &["rule=\"none\"", "verdict=\"denied\""]].concat(),
        )
        .await;
        if allowed.is_some_and(|n| n >= 1.0) && denied.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            started.elapsed() < COUNTED_WITHIN,
            "per-rule counters not exported within {COUNTED_WITHIN:?}: allowed {allowed:?}, denied {denied:?}:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(servers);
    c.assert_no_drops().await;
}

/// A NetworkPolicy object.
fn netpol(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": namespace, "name": name}, "spec": spec})
}
