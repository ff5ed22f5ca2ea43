//! NetworkPolicy over IPv6 through the real daemon and plugin (issue 47, case 7): `eniipamd` with
//! `ip_family = ipv6` and `network_policy` left at `auto` (on, as on any node that has an API
//! server) on a node of the emulated VPC, watching the API-server double; pods `a`, `b`, `c` of
//! namespace `default` made by the real plugin (IPv6 from the node's /80), each in the API server
//! before its ADD with its `status.podIPs` written after it, as the kubelet does; an echo server
//! in each. Under strict and loose IPv4 `rp_filter` (IPv6 has none; the path must not depend on
//! it).
//!
//! 1. No policy: every pod reaches every other.
//! 2. A default-deny ingress policy on the namespace: no pod reaches another.
//! 3. Plus `a` allowing ingress from the pods labelled `pod=b`: `b` reaches `a`; `c` still does
//!    not, nor does `a` reach `b` (still isolated by the default deny).
//!
//! Each step is awaited (the daemon's sync) for at most [`IN_FORCE_WITHIN`], and the last
//! differing cells are printed. The node's table holds the peer set of IPv6 addresses
//! (`ipv6_addr`) matched on `ip6 saddr`. Before case 7's fix the daemon enforced nothing with
//! `ip_family = ipv6` (`auto` turned enforcement off), so step 2 failed. Needs what
//! `tests/datapath_ipv6.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use datapath_support::policy::pod_object;
use datapath_support::v6::*;
use datapath_support::*;
use eniipam_kubeapi::FakeApiServer;
use serde_json::{Value, json};
use vpclab::{EchoOptions, echo};

const NODE: &str = "node-a";
const PODS: [&str; 3] = ["a", "b", "c"];
/// How long the daemon may take to put a change in force.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(15);

both_rp_filters!(policies_over_ipv6: ipv6_policies_in_force_strict_rp_filter, ipv6_policies_in_force_loose_rp_filter);

fn policy(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": "default", "name": name}, "spec": spec})
}

/// One exchange from `from` to `to`'s echo server: answered within 800 ms or not.
async fn connects(from: &CniPod6, to: &CniPod6) -> bool {
    echo(
        &from.ns,
        SocketAddr::new(IpAddr::V6(to.ip), ECHO_PORT),
        &EchoOptions {
            timeout: Duration::from_millis(800),
            ..Default::default()
        },
    )
    .await
    .is_ok()
}

/// Probes every ordered pair of distinct pods, all at once (each exchange waits out its own 800 ms;
/// issue 45: one after another, a denied matrix took 800 ms a cell), until each is what `want`
/// says (`want(client, server)`), for at most [`IN_FORCE_WITHIN`]; fails naming the cells that
/// still differ.
async fn until_matrix(
    step: &str,
    d: &Daemon,
    pods: &BTreeMap<&str, CniPod6>,
    want: impl Fn(&str, &str) -> bool,
) {
    let deadline = tokio::time::Instant::now() + IN_FORCE_WITHIN;
    let pairs: Vec<(&str, &CniPod6, &str, &CniPod6)> = pods
        .iter()
        .flat_map(|(c, client)| {
            pods.iter()
                .filter(move |(s, _)| *s != c)
                .map(move |(s, server)| (*c, client, *s, server))
        })
        .collect();
    loop {
        let got = futures::future::join_all(
            pairs
                .iter()
                .map(|(_, client, _, server)| connects(client, server)),
        )
        .await;
        let mut wrong = Vec::new();
        for (&(c, client, s, server), got) in pairs.iter().zip(got) {
            let w = want(c, s);
            if got != w {
                wrong.push(format!(
                    "{c} ({}) → {s} ({}): kernel {}, model {}",
                    client.ip,
                    server.ip,
                    verb(got),
                    verb(w)
                ));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{step}: {} cells differ after {IN_FORCE_WITHIN:?}:\n{}\ndaemon log:\n{}",
            wrong.len(),
            wrong.join("\n"),
            d.tail()
        );
    }
}

fn verb(allowed: bool) -> &'static str {
    if allowed { "connects" } else { "is denied" }
}

async fn policies_over_ipv6(test: &str, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let api = FakeApiServer::start().await;
    api.put_namespace_labels("default", &[("ns", "default")]);
    let (_forward, url) = forward_api(&c, &api, &c.a.instance_id, NODE).await;
    let env = [
        ("ENIIPAM_IP_FAMILY", "ipv6"),
        ("ENIIPAM_API_SERVER_URL", url.as_str()),
        ("ENIIPAM_API_SERVER_GC", "false"),
        ("ENIIPAM_NODE_CONDITION", "false"),
        ("ENIIPAM_NODE_NAME", NODE),
    ];
    let d = Daemon::start(&c, &c.a.instance_id, Placement::Eth0, &env).await;
    let mut pods = BTreeMap::new();
    let mut servers = Vec::new();
    for name in PODS {
        api.put_pod(pod_object("default", name, NODE));
        let pod = d.add_pod6(&c, name, None).await;
        let mut object = pod_object("default", name, NODE);
        object["status"] = json!({
            "phase": "Running",
            "podIP": pod.ip.to_string(),
            "podIPs": [{"ip": pod.ip.to_string()}],
        });
        api.put_pod(object);
        servers.push(serve6(&pod.ns));
        pods.insert(name, pod);
    }
    until_matrix("no policy", &d, &pods, |_, _| true).await;
    api.put_network_policy(policy(
        "default-deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    ));
    until_matrix("default-deny ingress", &d, &pods, |_, _| false).await;
    api.put_network_policy(policy(
        "a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    until_matrix("a allows b", &d, &pods, |c, s| (c, s) == ("b", "a")).await;
    // The peer is an IPv6 address in a set of IPv6 addresses, matched on the IPv6 source.
    let table =
        d.ns.exec("nft", &["list", "table", "inet", "eniipam_policy"])
            .await
            .expect("the policy table");
    assert!(
        table.contains("type ipv6_addr") && table.contains("ip6 saddr @"),
        "{table}"
    );
    assert!(table.contains(&pods["b"].ip.to_string()), "{table}");
    // Issue 47, case 2 over IPv6: each pod's veth is tied to its IPv6 address (the daemon knows
    // it from the node's /80 book), so a packet from it with another source is dropped.
    let sources =
        d.ns.exec(
            "nft",
            &["list", "set", "inet", "eniipam_policy", "pod_sources6"],
        )
        .await
        .expect("the IPv6 anti-spoofing set");
    for pod in pods.values() {
        assert!(
            sources.contains(&pod.ip.to_string()),
            "{} not tied to its veth:\n{sources}",
            pod.ip
        );
    }
    drop(servers);
    for pod in pods.values() {
        d.del_pod6(pod).await;
    }
}
