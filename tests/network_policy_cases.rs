//! Issue 28: the upstream network-policy e2e cases (Kubernetes' `test/e2e/network/netpol`), reproduced
//! from their published descriptions against eniipam's policy model (`eniipam::network_policy`).
//!
//! The world is upstream's: namespaces `x`, `y`, `z` (labelled `ns=<name>` and
//! `kubernetes.io/metadata.name=<name>`), pods `a`, `b`, `c` in each (labelled `pod=<name>`), every
//! pod serving ports 80 and 81 over TCP, UDP and SCTP, named `serve-<port>-<protocol>`. Each case
//! applies its policies and compares the whole probe matrix (9 × 9 pods) with the expected one,
//! built as upstream builds it: start from "all allowed", then state what the policies change. A
//! pod reaching itself never leaves its namespace and is always allowed.
//!
//! This proves the model (selectors, ports, named ports, ranges, ipBlock, policy types, stacking).
//! The same cases run against nftables in network namespaces once enforcement lands.

#[path = "network_policy_support/mod.rs"]
mod support;

use std::collections::BTreeMap;

use eniipam::network_policy::{
    Cluster, NamedPort, PodView, Protocol, compile, compile_all, connection_allowed,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{NAMESPACES, PODS, ip_of, policy, world};

/// The expected matrix: client `ns/pod` → server `ns/pod` → allowed.
struct Reach(BTreeMap<(String, String), bool>);

fn all() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| format!("{ns}/{p}")))
        .collect()
}

impl Reach {
    fn allowed() -> Self {
        let mut m = BTreeMap::new();
        for c in all() {
            for s in all() {
                m.insert((c.clone(), s), true);
            }
        }
        Self(m)
    }
    /// Every client → `server`.
    fn ingress(mut self, server: &str, v: bool) -> Self {
        for c in all() {
            self.0.insert((c, server.to_owned()), v);
        }
        self
    }
    /// `client` → every server.
    fn egress(mut self, client: &str, v: bool) -> Self {
        for s in all() {
            self.0.insert((client.to_owned(), s), v);
        }
        self
    }
    fn set(mut self, client: &str, server: &str, v: bool) -> Self {
        self.0.insert((client.to_owned(), server.to_owned()), v);
        self
    }
    /// Every pod of namespace `ns` as a server.
    fn ingress_ns(mut self, ns: &str, v: bool) -> Self {
        for p in PODS {
            self = self.ingress(&format!("{ns}/{p}"), v);
        }
        self
    }
}

/// The differences between what the model says and `want`, on `protocol`/`port` (self-probes
/// always allowed).
fn probe(cluster: &Cluster, protocol: Protocol, port: u16, want: &Reach) -> Vec<String> {
    let pod = |key: &str| {
        let (ns, name) = key.split_once('/').unwrap();
        cluster
            .pods
            .iter()
            .find(|p| p.namespace == ns && p.name == name)
            .unwrap()
    };
    let mut wrong = Vec::new();
    for ((c, s), expected) in &want.0 {
        let expected = *expected || c == s;
        let got = c == s || connection_allowed(cluster, pod(c), pod(s), protocol, port);
        if got != expected {
            wrong.push(format!(
                "{c} → {s} {protocol:?}/{port}: got {got}, want {expected}"
            ));
        }
    }
    wrong
}

/// Runs one case: the policies, then each (protocol, port, expected matrix).
fn case(name: &str, policies: &[Value], probes: &[(Protocol, u16, &Reach)]) {
    let cluster = world(policies);
    for pod in &cluster.pods {
        let problems = compile(&cluster, pod).problems;
        assert!(problems.is_empty(), "{name}: {problems:?}");
    }
    let wrong: Vec<String> = probes
        .iter()
        .flat_map(|(pr, port, want)| probe(&cluster, *pr, *port, want))
        .collect();
    assert!(wrong.is_empty(), "{name}:\n{}", wrong.join("\n"));
}

const TCP: Protocol = Protocol::Tcp;
const UDP: Protocol = Protocol::Udp;
const SCTP: Protocol = Protocol::Sctp;

fn pod_a() -> Value {
    json!({"matchLabels": {"pod": "a"}})
}

#[test]
fn default_deny_ingress_and_default_deny_all() {
    let deny_in = policy(
        "x",
        "deny-ingress",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let want = Reach::allowed().ingress_ns("x", false);
    case(
        "should support a 'default-deny-ingress' policy",
        &[deny_in],
        &[(TCP, 80, &want), (UDP, 81, &want)],
    );
    let deny_all = policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    let mut want = Reach::allowed().ingress_ns("x", false);
    for p in PODS {
        want = want.egress(&format!("x/{p}"), false);
    }
    case(
        "should support a 'default-deny-all' policy",
        &[deny_all],
        &[(TCP, 80, &want), (SCTP, 81, &want)],
    );
}

#[test]
fn allow_all_and_stacked_allow_all_take_precedence() {
    let allow_all = policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    case(
        "should support allow-all policy",
        std::slice::from_ref(&allow_all),
        &[(TCP, 80, &Reach::allowed())],
    );
    let only_80 = policy(
        "x",
        "allow-80",
        json!({"podSelector": pod_a(), "ingress": [{"ports": [{"port": 80}]}]}),
    );
    let want81 = Reach::allowed().ingress("x/a", false);
    case(
        "ingress on 80 only",
        std::slice::from_ref(&only_80),
        &[(TCP, 80, &Reach::allowed()), (TCP, 81, &want81)],
    );
    case(
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
        &[only_80, allow_all],
        &[(TCP, 80, &Reach::allowed()), (TCP, 81, &Reach::allowed())],
    );
    let egress_80 = policy(
        "x",
        "egress-80",
        json!({"podSelector": pod_a(), "egress": [{"ports": [{"port": 80}]}], "policyTypes": ["Egress"]}),
    );
    let egress_all = policy(
        "x",
        "egress-all",
        json!({"podSelector": pod_a(), "egress": [{}], "policyTypes": ["Egress"]}),
    );
    case(
        "egress on 80 only",
        std::slice::from_ref(&egress_80),
        &[
            (TCP, 80, &Reach::allowed()),
            (TCP, 81, &Reach::allowed().egress("x/a", false)),
        ],
    );
    case(
        "should enforce multiple egress policies with egress allow-all policy taking precedence",
        &[egress_80, egress_all],
        &[(TCP, 81, &Reach::allowed())],
    );
}

#[test]
fn pod_and_namespace_selectors() {
    let from = |peers: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": peers}]}),
        )
    };
    // Only x/b reaches x/a.
    let want = Reach::allowed()
        .ingress("x/a", false)
        .set("x/b", "x/a", true);
    case(
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
        &[from(
            json!([{"podSelector": {"matchLabels": {"pod": "b"}}}]),
        )],
        &[(TCP, 80, &want)],
    );
    case(
        "should enforce policy based on PodSelector with MatchExpressions",
        &[from(
            json!([{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]),
        )],
        &[(TCP, 80, &want)],
    );
    // Every pod of every namespace.
    case(
        "should enforce policy to allow ingress traffic from pods in all namespaces",
        &[from(json!([{"namespaceSelector": {}}]))],
        &[(TCP, 80, &Reach::allowed())],
    );
    // Only the pods of y reach x/a.
    let mut want_y = Reach::allowed().ingress("x/a", false);
    for p in PODS {
        want_y = want_y.set(&format!("y/{p}"), "x/a", true);
    }
    case(
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
        &[from(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
        )],
        &[(TCP, 80, &want_y)],
    );
    case(
        "should enforce policy based on NamespaceSelector with MatchExpressions",
        &[from(
            json!([{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}}]),
        )],
        &[(TCP, 80, &want_y)],
    );
    case(
        "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
        &[from(
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]),
        )],
        &[(TCP, 80, &want_y)],
    );
    // Pod b of x, OR any pod outside x.
    let mut want_or = Reach::allowed()
        .ingress("x/a", false)
        .set("x/b", "x/a", true);
    for ns in ["y", "z"] {
        for p in PODS {
            want_or = want_or.set(&format!("{ns}/{p}"), "x/a", true);
        }
    }
    case(
        "should enforce policy based on PodSelector or NamespaceSelector",
        &[from(json!([
            {"podSelector": {"matchLabels": {"pod": "b"}}},
            {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]}}
        ]))],
        &[(TCP, 80, &want_or)],
    );
    // Pod b of the namespaces other than x (one peer, both selectors).
    let want_and = Reach::allowed()
        .ingress("x/a", false)
        .set("y/b", "x/a", true)
        .set("z/b", "x/a", true);
    case(
        "should enforce policy based on PodSelector and NamespaceSelector",
        &[from(json!([{
            "podSelector": {"matchLabels": {"pod": "b"}},
            "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]}
        }]))],
        &[(TCP, 80, &want_and)],
    );
    let want_multi = want_and.set("y/c", "x/a", true).set("z/c", "x/a", true);
    case(
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
        &[from(json!([{
            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]},
            "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]}
        }]))],
        &[(TCP, 80, &want_multi)],
    );
    let want_any = Reach::allowed()
        .ingress("x/a", false)
        .set("x/b", "x/a", true)
        .set("x/c", "x/a", true);
    case(
        "should enforce policy based on any PodSelectors",
        &[from(json!([
            {"podSelector": {"matchLabels": {"pod": "b"}}},
            {"podSelector": {"matchLabels": {"pod": "c"}}}
        ]))],
        &[(TCP, 80, &want_any)],
    );
    let want_ya = Reach::allowed()
        .ingress("x/a", false)
        .set("y/a", "x/a", true);
    case(
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
        &[from(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": pod_a()}]),
        )],
        &[(TCP, 80, &want_ya)],
    );
}

#[test]
fn ports_named_ports_ranges_and_protocols() {
    let from_y_on = |ports: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": ports}]}),
        )
    };
    let mut only_y = Reach::allowed().ingress("x/a", false);
    for p in PODS {
        only_y = only_y.set(&format!("y/{p}"), "x/a", true);
    }
    let nobody = Reach::allowed().ingress("x/a", false);
    case(
        "should enforce policy based on Ports",
        &[from_y_on(json!([{"port": 81}]))],
        &[(TCP, 80, &nobody), (TCP, 81, &only_y)],
    );
    case(
        "should allow ingress access from namespace on one named port",
        &[from_y_on(json!([{"port": "serve-80-tcp"}]))],
        &[(TCP, 80, &only_y), (TCP, 81, &nobody), (UDP, 80, &nobody)],
    );
    case(
        "should enforce policy based on a port range (endPort)",
        &[from_y_on(json!([{"port": 80, "endPort": 81}]))],
        &[(TCP, 80, &only_y), (TCP, 81, &only_y), (UDP, 80, &nobody)],
    );
    // Two policies stacked: 80 from y, 81 from y.
    case(
        "should enforce multiple, stacked policies with overlapping podSelectors",
        &[
            from_y_on(json!([{"port": 80}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 81}]}]}),
            ),
        ],
        &[(TCP, 80, &only_y), (TCP, 81, &only_y)],
    );
    let proto = |p: &str| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"ports": [{"protocol": p}]}]}),
        )
    };
    case(
        "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
        &[proto("TCP")],
        &[
            (TCP, 80, &Reach::allowed()),
            (TCP, 81, &Reach::allowed()),
            (UDP, 80, &nobody),
        ],
    );
    case(
        "should not allow access by TCP when a policy specifies only UDP",
        &[proto("UDP")],
        &[(UDP, 81, &Reach::allowed()), (TCP, 81, &nobody)],
    );
    case(
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'",
        &[proto("SCTP")],
        &[(SCTP, 80, &Reach::allowed()), (TCP, 80, &nobody)],
    );
    // Egress on one named port: x/a reaches everyone on 80, nobody on 81.
    let egress_named = policy(
        "x",
        "p",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
    );
    case(
        "should allow egress access on one named port",
        &[egress_named],
        &[
            (TCP, 80, &Reach::allowed()),
            (TCP, 81, &Reach::allowed().egress("x/a", false)),
        ],
    );
}

#[test]
fn egress_ip_blocks_and_both_directions() {
    let egress = |to: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": to}]}),
        )
    };
    // Deny all egress from x/a.
    case(
        "should deny egress from pods based on PodSelector",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
        )],
        &[(TCP, 80, &Reach::allowed().egress("x/a", false))],
    );
    let mut want = Reach::allowed();
    for p in PODS {
        want = want.egress(&format!("x/{p}"), false);
    }
    case(
        "should deny egress from all pods in a namespace",
        &[policy(
            "x",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
        )],
        &[(TCP, 80, &want)],
    );
    // To y/a only, by pod and namespace selectors.
    let to_ya = Reach::allowed()
        .egress("x/a", false)
        .set("x/a", "y/a", true);
    case(
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
        &[egress(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": pod_a()}]),
        )],
        &[(TCP, 80, &to_ya)],
    );
    // To y/b's address by an ipBlock /32.
    let yb = ip_of("y", "b");
    let to_yb = Reach::allowed()
        .egress("x/a", false)
        .set("x/a", "y/b", true);
    case(
        "should allow egress access to server in CIDR block",
        &[egress(json!([{"ipBlock": {"cidr": format!("{yb}/32")}}]))],
        &[(TCP, 80, &to_yb)],
    );
    // To all of y's /24 except y/b.
    let mut to_y_but_b = Reach::allowed().egress("x/a", false);
    for p in ["a", "c"] {
        to_y_but_b = to_y_but_b.set("x/a", &format!("y/{p}"), true);
    }
    case(
        "should enforce except clause while egress access to server in CIDR block",
        &[egress(
            json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": [format!("{yb}/32")]}}]),
        )],
        &[(TCP, 80, &to_y_but_b)],
    );
    // A second policy allowing the excepted /32: allowed (policies add up).
    case(
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
        &[
            egress(json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": [format!("{yb}/32")]}}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": format!("{yb}/32")}}]}]}),
            ),
        ],
        &[(TCP, 80, &to_y_but_b.set("x/a", "y/b", true))],
    );
    // The client's egress denies what the server's ingress allows: denied.
    case(
        "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
        &[
            policy(
                "x",
                "client",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
            ),
            policy(
                "y",
                "server",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
            ),
        ],
        &[(TCP, 80, &Reach::allowed().egress("x/a", false))],
    );
    // Ingress and egress controlled independently: x/a takes ingress only from x/b and sends only
    // to y.
    let both = policy(
        "x",
        "p",
        json!({"podSelector": pod_a(), "policyTypes": ["Ingress", "Egress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
               "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    );
    let mut want = Reach::allowed()
        .ingress("x/a", false)
        .set("x/b", "x/a", true)
        .egress("x/a", false);
    for p in PODS {
        want = want.set("x/a", &format!("y/{p}"), true);
    }
    case(
        "should work with Ingress, Egress specified together",
        &[both],
        &[(TCP, 80, &want)],
    );
}

#[test]
fn a_bad_part_of_a_policy_is_named_and_allows_nothing() {
    let cluster = world(&[policy(
        "x",
        "bad",
        json!({"podSelector": pod_a(), "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.1.1.0/33"}}]},
            {"ports": [{"port": 70000}]},
            {"ports": [{"port": "serve-80-tcp", "endPort": 81}]},
            {"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Near", "values": ["b"]}]}}]}
        ]}),
    )]);
    let xa = cluster
        .pods
        .iter()
        .find(|p| p.name == "a" && p.namespace == "x")
        .unwrap();
    let compiled = compile(&cluster, xa);
    let problems = compiled.problems.join("\n");
    for says in [
        "NetworkPolicy x/bad: spec.ingress[0].peers[0].ipBlock: \"10.1.1.0/33\" is not a CIDR",
        "spec.ingress[1].ports[0]: port 70000",
        "spec.ingress[2].ports[0]: endPort with a named port",
        "spec.ingress[3].peers[0]: podSelector",
    ] {
        assert!(problems.contains(says), "{says}\n{problems}");
    }
    // x/a is isolated, and the broken rules allow nobody.
    let want = Reach::allowed().ingress("x/a", false);
    let wrong = probe(&cluster, TCP, 80, &want);
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// A random cluster: 4 namespaces (one without a Namespace object), 30 pods (some on the host
/// network, some without an address, some with an IPv6 one too), 10 policies mixing every kind
/// of peer and port, a few of them malformed as the API server would have refused.
fn random_cluster(seed: u64) -> Cluster {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = Cluster::default();
    let namespaces = ["n0", "n1", "n2", "n3"];
    for ns in &namespaces[..3] {
        let team = if rng.random_bool(0.5) { "red" } else { "blue" };
        c.namespaces.insert(
            (*ns).into(),
            BTreeMap::from([
                ("kubernetes.io/metadata.name".to_owned(), (*ns).to_owned()),
                ("team".to_owned(), team.to_owned()),
            ]),
        );
    }
    for i in 0..30u8 {
        let mut labels = BTreeMap::from([(
            "app".to_owned(),
            ["a", "b", "c"][rng.random_range(0..3)].to_owned(),
        )]);
        if rng.random_bool(0.5) {
            labels.insert("tier".into(), ["web", "db"][rng.random_range(0..2)].into());
        }
        let mut ips = Vec::new();
        if !rng.random_bool(0.1) {
            ips.push(format!("10.0.{}.{}", i % 3, 10 + i).parse().unwrap());
            if rng.random_bool(0.2) {
                ips.push(format!("fd00::{i}").parse().unwrap());
            }
        }
        let mut ports = Vec::new();
        if rng.random_bool(0.6) {
            ports.push(NamedPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: if rng.random_bool(0.5) { 80 } else { 8080 },
            });
        }
        if rng.random_bool(0.4) {
            ports.push(NamedPort {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53,
            });
        }
        c.pods.push(PodView {
            namespace: namespaces[rng.random_range(0..4)].into(),
            name: format!("p{i}"),
            labels,
            ips,
            host_network: rng.random_bool(0.1),
            ports,
        });
    }
    let selector = |rng: &mut StdRng| -> Value {
        match rng.random_range(0..8) {
            0 => json!({}),
            1 | 2 => {
                let app = ["a", "b", "c"][rng.random_range(0..3)];
                json!({"matchLabels": {"app": app}})
            }
            3 => {
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]})
            }
            4 => {
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}, {"key": "tier", "operator": "Exists"}]})
            }
            5 => {
                json!({"matchLabels": {"app": "b"}, "matchExpressions": [{"key": "tier", "operator": "Equals", "values": ["db"]}]})
            }
            6 => json!({"matchExpressions": [{"key": "tier", "operator": "In"}]}),
            _ => json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
        }
    };
    let ns_selector = |rng: &mut StdRng| -> Value {
        match rng.random_range(0..5) {
            0 => json!({}),
            1 => json!({"matchLabels": {"team": "red"}}),
            2 => json!({"matchLabels": {"kubernetes.io/metadata.name": "n1"}}),
            3 => {
                json!({"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["x"]}]})
            }
            _ => {
                json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["blue"]}]})
            }
        }
    };
    let peers = |rng: &mut StdRng| -> Value {
        let n = rng.random_range(0..3);
        let list: Vec<Value> = (0..n)
            .map(|_| match rng.random_range(0..6) {
                0 => json!({"podSelector": selector(rng)}),
                1 => json!({"namespaceSelector": ns_selector(rng)}),
                2 | 3 => {
                    json!({"namespaceSelector": ns_selector(rng), "podSelector": selector(rng)})
                }
                4 => json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}),
                _ => json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}),
            })
            .collect();
        json!(list)
    };
    let ports = |rng: &mut StdRng| -> Value {
        let n = rng.random_range(0..3);
        let list: Vec<Value> = (0..n)
            .map(|_| match rng.random_range(0..8) {
                0 => json!({"port": 80}),
                1 => json!({"port": 80, "endPort": 90}),
                2 | 3 => json!({"port": "http"}),
                4 => json!({"port": "dns", "protocol": "UDP"}),
                5 => json!({"protocol": "SCTP"}),
                6 => json!({"protocol": "ICMP"}),
                _ => json!({"port": "http", "endPort": 90}),
            })
            .collect();
        json!(list)
    };
    for k in 0..10 {
        let mut spec = serde_json::Map::new();
        spec.insert("podSelector".into(), selector(&mut rng));
        match rng.random_range(0..4) {
            0 => {}
            1 => {
                let _ = spec.insert("policyTypes".into(), json!(["Ingress"]));
            }
            2 => {
                let _ = spec.insert("policyTypes".into(), json!(["Egress"]));
            }
            _ => {
                let _ = spec.insert("policyTypes".into(), json!(["Ingress", "Egress"]));
            }
        }
        for (field, peer_field) in [("ingress", "from"), ("egress", "to")] {
            if rng.random_bool(0.7) {
                let rules: Vec<Value> = (0..rng.random_range(0..3))
                    .map(|_| json!({peer_field: peers(&mut rng), "ports": ports(&mut rng)}))
                    .collect();
                spec.insert(field.into(), json!(rules));
            }
        }
        c.policies.push(
            serde_json::from_value(policy(
                namespaces[rng.random_range(0..4)],
                &format!("q{k}"),
                Value::Object(spec),
            ))
            .expect("a NetworkPolicy"),
        );
    }
    c
}

proptest! {
    /// `compile_all` shares work between pods; `compile`, pod by pod, is the reference.
    #[test]
    fn compile_all_equals_compile_pod_by_pod(seed in any::<u64>()) {
        let c = random_cluster(seed);
        let pods: Vec<&PodView> = c.pods.iter().collect();
        let all = compile_all(&c, &pods);
        for (pod, got) in pods.iter().zip(&all) {
            prop_assert_eq!(got, &compile(&c, pod), "pod {}/{}", pod.namespace, pod.name);
        }
    }
}
