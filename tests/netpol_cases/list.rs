//! The shared cases themselves, in the order they run (the types and policy builders are in
//! `mod.rs`).

use std::net::IpAddr;

use serde_json::{Value, json};

use super::{
    Case, Stage, case, dynamic, egress, every, host, ingress, large_cidr, ns_named, ns_not_in, pod,
    policies_then, policy,
};

/// Every case, in the order they run; `ip_of(namespace, pod)` is a pod's address.
pub fn cases<A: Into<IpAddr>>(ip_of: impl Fn(&str, &str) -> A) -> Vec<Case> {
    let ip_of = |ns: &str, p: &str| -> IpAddr { ip_of(ns, p).into() };
    let x = "x";
    let deny_ingress = |name| ingress(x, name, json!({}), json!([]));
    let from = |peers: Value| json!([{"from": peers}]);
    let from_y_on =
        |ports: Value| json!([{"from": [{"namespaceSelector": ns_named("y")}], "ports": ports}]);
    let allow_81_from_y = ingress(
        x,
        "allow-client-a-via-ns-selector",
        pod("a"),
        from_y_on(json!([{"port": 81, "protocol": "TCP"}])),
    );
    let xb = ip_of("x", "b");
    let around_xb = egress(
        x,
        "allow-client-a-via-cidr-egress-rule",
        pod("a"),
        json!([{"to": [{"ipBlock": {"cidr": large_cidr(xb), "except": [host(xb)]}}]}]),
    );
    let from_xa = from(json!([{"namespaceSelector": ns_named("x"), "podSelector": pod("a")}]));
    let egress_80 = egress(
        x,
        "allow-egress-port-80",
        every(),
        json!([{"ports": [{"port": 80}]}]),
    );
    let ingress_80 = ingress(
        x,
        "allow-ingress-port-80",
        every(),
        json!([{"ports": [{"port": 80}]}]),
    );
    let deny_all = policy(
        x,
        "deny-all",
        json!({"podSelector": {}, "ingress": [], "egress": [], "policyTypes": ["Ingress", "Egress"]}),
    );
    let egress_for_a = egress(x, "allow-egress-for-target", pod("a"), json!([{}]));
    vec![
        case(
            "should support a 'default-deny-ingress' policy",
            vec![deny_ingress("deny-ingress")],
        ),
        case(
            "should support a 'default-deny-all' policy",
            vec![deny_all.clone()],
        ),
        case(
            "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            vec![ingress(
                x,
                "x-a-allows-x-b",
                pod("a"),
                from(json!([{"podSelector": pod("b")}])),
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic for a target",
            vec![
                deny_ingress("deny-all"),
                ingress(
                    x,
                    "allow-all-to-a",
                    pod("a"),
                    from(json!([{"podSelector": {}, "namespaceSelector": {}}])),
                ),
            ],
        ),
        case(
            "should enforce policy to allow ingress traffic from pods in all namespaces",
            vec![ingress(
                x,
                "allow-from-another-ns",
                pod("a"),
                from(json!([{"namespaceSelector": {"matchLabels": {}}}])),
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            vec![ingress(
                x,
                "allow-client-a-via-ns-selector",
                pod("a"),
                from(json!([{"namespaceSelector": ns_named("y")}])),
            )],
        ),
        case(
            "should enforce policy based on PodSelector with MatchExpressions",
            vec![ingress(
                x,
                "x-a-allows-x-b",
                pod("a"),
                from(
                    json!([{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]),
                ),
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions",
            vec![ingress(
                x,
                "allow-ns-y-match-selector",
                pod("a"),
                from(
                    json!([{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["y"]}]}}]),
                ),
            )],
        ),
        case(
            "should enforce policy based on PodSelector or NamespaceSelector",
            vec![ingress(
                x,
                "allow-ns-y-match-selector",
                pod("a"),
                from(json!([{"namespaceSelector": ns_not_in("x")}, {"podSelector": pod("b")}])),
            )],
        ),
        case(
            "should enforce policy based on PodSelector and NamespaceSelector",
            vec![ingress(
                x,
                "allow-ns-y-podselector-and-nsselector",
                pod("a"),
                from(json!([{"namespaceSelector": ns_not_in("x"), "podSelector": pod("b")}])),
            )],
        ),
        case(
            "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            vec![ingress(
                x,
                "allow-ns-y-z-pod-b-c",
                pod("a"),
                from(json!([{
                    "namespaceSelector": ns_not_in("x"),
                    "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]}
                }])),
            )],
        ),
        case(
            "should enforce policy based on any PodSelectors",
            vec![ingress(
                x,
                "allow-ns-x-pod-b-c",
                pod("a"),
                from(json!([{"podSelector": pod("b")}, {"podSelector": pod("c")}])),
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
            vec![ingress(
                x,
                "allow-ns-y-pod-a-via-namespace-pod-selector",
                pod("a"),
                from(json!([{"namespaceSelector": ns_named("y"), "podSelector": pod("a")}])),
            )],
        ),
        case(
            "should enforce policy based on Ports",
            vec![allow_81_from_y.clone()],
        ),
        dynamic(
            "should enforce multiple, stacked policies with overlapping podSelectors",
            vec![allow_81_from_y.clone()],
            vec![policies_then(
                "a second policy allows 80 from y",
                vec![
                    allow_81_from_y,
                    ingress(
                        x,
                        "allow-client-a-via-ns-selector-80",
                        pod("a"),
                        from_y_on(json!([{"port": 80, "protocol": "TCP"}])),
                    ),
                ],
            )],
        ),
        case(
            "should support allow-all policy",
            vec![ingress(x, "allow-all", every(), json!([{}]))],
        ),
        case(
            "should allow ingress access on one named port",
            vec![ingress(
                x,
                "allow-all",
                every(),
                json!([{"ports": [{"port": "serve-81-tcp"}]}]),
            )],
        ),
        case(
            "should allow ingress access from namespace on one named port",
            vec![ingress(
                x,
                "allow-client-a-via-ns-selector-80",
                pod("a"),
                from_y_on(json!([{"port": "serve-80-tcp", "protocol": "TCP"}])),
            )],
        ),
        case(
            "should allow egress access on one named port",
            vec![egress(
                x,
                "allow-egress",
                every(),
                json!([{"ports": [{"port": "serve-80-tcp"}]}]),
            )],
        ),
        dynamic(
            "should enforce updated policy",
            vec![ingress(
                x,
                "allow-all-mutate-to-deny-all",
                every(),
                json!([{}]),
            )],
            vec![policies_then(
                "the policy updated to deny all",
                vec![ingress(
                    x,
                    "allow-all-mutate-to-deny-all",
                    every(),
                    json!([]),
                )],
            )],
        ),
        dynamic(
            "should allow ingress access from updated namespace",
            vec![ingress(
                x,
                "allow-client-a-via-ns-selector",
                pod("a"),
                from(json!([{"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}])),
            )],
            vec![Stage {
                what: "namespace y labelled ns2=updated",
                policies: vec![ingress(
                    x,
                    "allow-client-a-via-ns-selector",
                    pod("a"),
                    from(json!([{"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}])),
                )],
                namespace_labels: vec![("y", "ns2", "updated")],
                pod_labels: Vec::new(),
            }],
        ),
        dynamic(
            "should allow ingress access from updated pod",
            vec![ingress(
                x,
                "allow-client-a-via-pod-selector",
                pod("a"),
                from(json!([{"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}}])),
            )],
            vec![Stage {
                what: "pod x/b labelled pod2=updated",
                policies: vec![ingress(
                    x,
                    "allow-client-a-via-pod-selector",
                    pod("a"),
                    from(
                        json!([{"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}}]),
                    ),
                )],
                namespace_labels: Vec::new(),
                pod_labels: vec![("x", "b", "pod2", "updated")],
            }],
        ),
        case(
            "should deny ingress from pods on other namespaces",
            vec![ingress(
                x,
                "deny-empty-policy",
                json!({}),
                from(json!([{"podSelector": {"matchLabels": {}}}])),
            )],
        ),
        dynamic(
            "should deny ingress access to updated pod",
            vec![ingress(
                x,
                "deny-ingress-via-label-selector",
                json!({"matchLabels": {"target": "isolated"}}),
                json!([]),
            )],
            vec![Stage {
                what: "pod x/a labelled target=isolated",
                policies: vec![ingress(
                    x,
                    "deny-ingress-via-label-selector",
                    json!({"matchLabels": {"target": "isolated"}}),
                    json!([]),
                )],
                namespace_labels: Vec::new(),
                pod_labels: vec![("x", "a", "target", "isolated")],
            }],
        ),
        case(
            "should deny egress from pods based on PodSelector",
            vec![egress(x, "deny-egress-pod-a", pod("a"), json!([]))],
        ),
        case(
            "should deny egress from all pods in a namespace",
            vec![egress(x, "deny-egress-ns-x", json!({}), json!([]))],
        ),
        case(
            "should work with Ingress, Egress specified together",
            vec![policy(
                x,
                "allow-client-a-via-pod-selector",
                json!({"podSelector": pod("a"),
                       "ingress": [{"from": [{"podSelector": pod("b")}]}],
                       "egress": [{"ports": [{"port": 80}]}],
                       "policyTypes": ["Egress", "Ingress"]}),
            )],
        ),
        case(
            "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
            vec![
                egress(
                    x,
                    "allow-to-ns-y-pod-a",
                    pod("a"),
                    json!([{"to": [{"namespaceSelector": ns_named("y"), "podSelector": pod("a")}]}]),
                ),
                ingress(
                    "y",
                    "allow-from-xa-on-ya-match-selector",
                    pod("a"),
                    from_xa.clone(),
                ),
                ingress("y", "allow-from-xa-on-yb-match-selector", pod("b"), from_xa),
            ],
        ),
        case(
            "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
            vec![egress(
                x,
                "allow-to-ns-y-pod-a",
                pod("a"),
                json!([{"to": [{"namespaceSelector": ns_named("y"), "podSelector": pod("a")}]}]),
            )],
        ),
        case(
            "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
            vec![ingress(
                x,
                "allow-ingress-by-proto",
                pod("a"),
                json!([{"ports": [{"protocol": "TCP"}]}]),
            )],
        ),
        dynamic(
            "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
            vec![ingress_80.clone()],
            vec![policies_then(
                "an allow-all ingress policy added",
                vec![
                    ingress_80,
                    ingress(x, "allow-ingress", every(), json!([{}])),
                ],
            )],
        ),
        dynamic(
            "should enforce multiple egress policies with egress allow-all policy taking precedence",
            vec![egress_80.clone()],
            vec![policies_then(
                "an allow-all egress policy added",
                vec![egress_80, egress(x, "allow-egress", every(), json!([{}]))],
            )],
        ),
        dynamic(
            "should stop enforcing policies after they are deleted",
            vec![deny_all],
            vec![policies_then("the policies deleted", Vec::new())],
        ),
        case(
            "should allow egress access to server in CIDR block",
            vec![egress(
                x,
                "allow-client-a-via-cidr-egress-rule",
                pod("a"),
                json!([{"to": [{"ipBlock": {"cidr": host(ip_of("y", "b"))}}]}]),
            )],
        ),
        case(
            "should enforce except clause while egress access to server in CIDR block",
            vec![around_xb.clone()],
        ),
        dynamic(
            "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            vec![around_xb],
            vec![policies_then(
                "the policy updated to allow x/b's address alone",
                vec![egress(
                    x,
                    "allow-client-a-via-cidr-egress-rule",
                    pod("a"),
                    json!([{"to": [{"ipBlock": {"cidr": host(xb)}}]}]),
                )],
            )],
        ),
        dynamic(
            "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
            vec![egress_for_a.clone()],
            vec![policies_then(
                "a policy denying x/a's ingress added",
                vec![
                    egress_for_a,
                    ingress(x, "deny-ingress-via-label-selector", pod("a"), json!([])),
                ],
            )],
        ),
        case(
            "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
            vec![
                deny_ingress("deny-ingress"),
                ingress(
                    x,
                    "allow-only-sctp-ingress-on-port-81",
                    pod("a"),
                    json!([{"ports": [{"port": 81, "protocol": "SCTP"}]}]),
                ),
            ],
        ),
        case(
            "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
            vec![ingress(
                x,
                "allow-only-sctp-ingress-on-port-80",
                pod("a"),
                json!([{"ports": [{"port": 80, "protocol": "SCTP"}]}]),
            )],
        ),
        case(
            "should not allow access by TCP when a policy specifies only UDP",
            vec![ingress(
                x,
                "allow-only-udp-ingress-on-port-81",
                pod("a"),
                json!([{"ports": [{"port": 81, "protocol": "UDP"}]}]),
            )],
        ),
        case(
            "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
            vec![ingress(
                x,
                "allow-client-a-via-ns-selector-for-immutable-ns-label",
                pod("a"),
                from(json!([{"namespaceSelector": ns_named("y")}])),
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
            vec![egress(
                x,
                "allow-ns-y-match-selector-for-immutable-ns-label",
                pod("a"),
                json!([{"to": [{"namespaceSelector": ns_not_in("y")}]}]),
            )],
        ),
        // Upstream's UDP and SCTP contexts repeat the TCP cases under the same names; only
        // "based on Ports" changes its policy (the protocol of port 81).
        case(
            "using UDP: should enforce policy based on Ports",
            vec![ingress(
                x,
                "allow-ingress-on-port-81-ns-x",
                pod("a"),
                from_y_on(json!([{"port": 81, "protocol": "UDP"}])),
            )],
        ),
        case(
            "using SCTP: should enforce policy based on Ports",
            vec![ingress(
                x,
                "allow-ingress-on-port-81-ns-x",
                pod("a"),
                from_y_on(json!([{"port": 81, "protocol": "SCTP"}])),
            )],
        ),
        // Ours: a port range (`endPort`) from namespace y.
        case(
            "ours: ingress on a port range (endPort) from namespace y",
            vec![ingress(
                x,
                "p",
                pod("a"),
                from_y_on(json!([{"port": 80, "endPort": 81}])),
            )],
        ),
        // Ours: the parts a compiler must refuse (a CIDR that is none, a port out of range,
        // endPort with a named port, an unknown operator) allow nothing, and the policy still
        // isolates x/a.
        case(
            "a bad part of a policy is named and allows nothing",
            vec![policy(
                x,
                "bad",
                json!({"podSelector": pod("a"), "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.1.1.0/33"}}]},
                    {"ports": [{"port": 70000}]},
                    {"ports": [{"port": "serve-80-tcp", "endPort": 81}]},
                    {"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Near", "values": ["b"]}]}}]}
                ]}),
            )],
        ),
    ]
}
