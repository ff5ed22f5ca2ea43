//! The upstream network-policy e2e cases (Kubernetes' `test/e2e/network/netpol`) as data: each
//! case's name and the NetworkPolicies it applies, in upstream's world (namespaces `x`, `y`, `z`
//! labelled `ns=<name>`, pods `a`, `b`, `c` labelled `pod=<name>`, ports 80 and 81 named
//! `serve-<port>-<protocol>`). Shared by `tests/network_policy_cases.rs`, which holds each case's
//! expected matrices and checks the model, and `tests/datapath_policy.rs`, which runs the same
//! policies through the real daemon and plugin and compares the kernel with the model.
//!
//! The `ipBlock` cases name pod addresses, so the list is built from the world's addresses
//! (`ip_of`): the model's world numbers each namespace's pods in a /24 of its own, the lab's get
//! theirs from the VPC.

#![allow(dead_code)] // each test binary reads its own part

use std::net::Ipv4Addr;

use serde_json::{Value, json};

/// One case: upstream's name (or ours, for the cases upstream does not name) and its policies.
pub struct Case {
    pub name: &'static str,
    pub policies: Vec<Value>,
}

/// A NetworkPolicy `ns/name` with `spec`.
pub fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn pod_a() -> Value {
    json!({"matchLabels": {"pod": "a"}})
}

fn ns_y() -> Value {
    json!({"matchLabels": {"ns": "y"}})
}

/// `x/a` takes ingress only `from` these peers.
fn x_a_from(peers: Value) -> Value {
    policy(
        "x",
        "p",
        json!({"podSelector": pod_a(), "ingress": [{"from": peers}]}),
    )
}

/// `x/a` takes ingress only from namespace `y`, on `ports`.
fn x_a_from_y_on(name: &str, ports: Value) -> Value {
    policy(
        "x",
        name,
        json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": ns_y()}], "ports": ports}]}),
    )
}

/// `x/a` takes ingress on every port of `protocol` only.
fn x_a_protocol(protocol: &str) -> Value {
    policy(
        "x",
        "p",
        json!({"podSelector": pod_a(), "ingress": [{"ports": [{"protocol": protocol}]}]}),
    )
}

/// `x/a` sends only `to` these peers (policy `name`).
fn x_a_to(name: &str, to: Value) -> Value {
    policy(
        "x",
        name,
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": to}]}),
    )
}

/// Every case, in the order they run; `ip_of(namespace, pod)` is a pod's address.
pub fn cases(ip_of: impl Fn(&str, &str) -> Ipv4Addr) -> Vec<Case> {
    let case = |name, policies| Case { name, policies };
    let allow_all = policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    let only_80 = policy(
        "x",
        "allow-80",
        json!({"podSelector": pod_a(), "ingress": [{"ports": [{"port": 80}]}]}),
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
    let not_x = json!({"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]});
    let pod_b = json!({"matchLabels": {"pod": "b"}});
    let yb = ip_of("y", "b");
    // The /24 holding y/b, y/b itself cut out.
    let around_yb = Ipv4Addr::from(u32::from(yb) & 0xffff_ff00);
    let block_but_yb =
        json!([{"ipBlock": {"cidr": format!("{around_yb}/24"), "except": [format!("{yb}/32")]}}]);
    vec![
        case(
            "should support a 'default-deny-ingress' policy",
            vec![policy(
                "x",
                "deny-ingress",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            )],
        ),
        case(
            "should support a 'default-deny-all' policy",
            vec![policy(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            )],
        ),
        case("should support allow-all policy", vec![allow_all.clone()]),
        case("ingress on 80 only", vec![only_80.clone()]),
        case(
            "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
            vec![only_80, allow_all],
        ),
        case("egress on 80 only", vec![egress_80.clone()]),
        case(
            "should enforce multiple egress policies with egress allow-all policy taking precedence",
            vec![egress_80, egress_all],
        ),
        case(
            "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            vec![x_a_from(json!([{"podSelector": pod_b}]))],
        ),
        case(
            "should enforce policy based on PodSelector with MatchExpressions",
            vec![x_a_from(
                json!([{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]),
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic from pods in all namespaces",
            vec![x_a_from(json!([{"namespaceSelector": {}}]))],
        ),
        case(
            "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            vec![x_a_from(json!([{"namespaceSelector": ns_y()}]))],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions",
            vec![x_a_from(
                json!([{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}}]),
            )],
        ),
        case(
            "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
            vec![x_a_from(
                json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]),
            )],
        ),
        case(
            "should enforce policy based on PodSelector or NamespaceSelector",
            vec![x_a_from(
                json!([{"podSelector": pod_b}, {"namespaceSelector": not_x}]),
            )],
        ),
        case(
            "should enforce policy based on PodSelector and NamespaceSelector",
            vec![x_a_from(
                json!([{"podSelector": pod_b, "namespaceSelector": not_x}]),
            )],
        ),
        case(
            "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            vec![x_a_from(json!([{
                "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]},
                "namespaceSelector": not_x
            }]))],
        ),
        case(
            "should enforce policy based on any PodSelectors",
            vec![x_a_from(
                json!([{"podSelector": pod_b}, {"podSelector": {"matchLabels": {"pod": "c"}}}]),
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
            vec![x_a_from(
                json!([{"namespaceSelector": ns_y(), "podSelector": pod_a()}]),
            )],
        ),
        case(
            "should enforce policy based on Ports",
            vec![x_a_from_y_on("p", json!([{"port": 81}]))],
        ),
        case(
            "should allow ingress access from namespace on one named port",
            vec![x_a_from_y_on("p", json!([{"port": "serve-80-tcp"}]))],
        ),
        case(
            "should enforce policy based on a port range (endPort)",
            vec![x_a_from_y_on("p", json!([{"port": 80, "endPort": 81}]))],
        ),
        case(
            "should enforce multiple, stacked policies with overlapping podSelectors",
            vec![
                x_a_from_y_on("p", json!([{"port": 80}])),
                x_a_from_y_on("q", json!([{"port": 81}])),
            ],
        ),
        case(
            "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
            vec![x_a_protocol("TCP")],
        ),
        case(
            "should not allow access by TCP when a policy specifies only UDP",
            vec![x_a_protocol("UDP")],
        ),
        case(
            "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'",
            vec![x_a_protocol("SCTP")],
        ),
        case(
            "should allow egress access on one named port",
            vec![policy(
                "x",
                "p",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
            )],
        ),
        case(
            "should deny egress from pods based on PodSelector",
            vec![policy(
                "x",
                "p",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
            )],
        ),
        case(
            "should deny egress from all pods in a namespace",
            vec![policy(
                "x",
                "p",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
            )],
        ),
        case(
            "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
            vec![x_a_to(
                "p",
                json!([{"namespaceSelector": ns_y(), "podSelector": pod_a()}]),
            )],
        ),
        case(
            "should allow egress access to server in CIDR block",
            vec![x_a_to(
                "p",
                json!([{"ipBlock": {"cidr": format!("{yb}/32")}}]),
            )],
        ),
        case(
            "should enforce except clause while egress access to server in CIDR block",
            vec![x_a_to("p", block_but_yb.clone())],
        ),
        case(
            "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            vec![
                x_a_to("p", block_but_yb),
                x_a_to("q", json!([{"ipBlock": {"cidr": format!("{yb}/32")}}])),
            ],
        ),
        case(
            "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
            vec![
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
        ),
        case(
            "should work with Ingress, Egress specified together",
            vec![policy(
                "x",
                "p",
                json!({"podSelector": pod_a(), "policyTypes": ["Ingress", "Egress"],
                       "ingress": [{"from": [{"podSelector": pod_b}]}],
                       "egress": [{"to": [{"namespaceSelector": ns_y()}]}]}),
            )],
        ),
        // Ours: the parts a compiler must refuse (a CIDR that is none, a port out of range,
        // endPort with a named port, an unknown operator) allow nothing, and the policy still
        // isolates x/a.
        case(
            "a bad part of a policy is named and allows nothing",
            vec![policy(
                "x",
                "bad",
                json!({"podSelector": pod_a(), "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.1.1.0/33"}}]},
                    {"ports": [{"port": 70000}]},
                    {"ports": [{"port": "serve-80-tcp", "endPort": 81}]},
                    {"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Near", "values": ["b"]}]}}]}
                ]}),
            )],
        ),
    ]
}

/// The case named `name` (panics naming it when there is none).
pub fn case_named(ip_of: impl Fn(&str, &str) -> Ipv4Addr, name: &str) -> Case {
    cases(ip_of)
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no shared case is named {name:?}"))
}
