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
//! The cases' policies are shared ([`netpol_cases`]); their expected matrices are here, keyed by
//! case name. This proves the model (selectors, ports, named ports, ranges, ipBlock, policy types,
//! stacking); `tests/datapath_policy.rs` runs the same policies through the real daemon and plugin
//! and holds the kernel to the model.

#[path = "netpol_cases/mod.rs"]
mod netpol_cases;
#[path = "network_policy_support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};

use eniipam::network_policy::{
    Cluster, NamedPort, PodView, Protocol, compile, compile_all, connection_allowed,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{NAMESPACES, PODS, ip_of, policy, world};

/// The expected matrix: client `ns/pod` → server `ns/pod` → allowed.
#[derive(Clone)]
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

/// The case whose policy has parts the compiler refuses ([`a_bad_part_of_a_policy_is_named_and_allows_nothing`]).
const BAD: &str = "a bad part of a policy is named and allows nothing";

const TCP: Protocol = Protocol::Tcp;
const UDP: Protocol = Protocol::Udp;
const SCTP: Protocol = Protocol::Sctp;

/// Every pod of namespace `ns` as a client, denied everything.
fn egress_ns_denied(mut want: Reach, ns: &str) -> Reach {
    for p in PODS {
        want = want.egress(&format!("{ns}/{p}"), false);
    }
    want
}

/// The pods of `ns` as clients of `server`, allowed.
fn from_ns(mut want: Reach, ns: &str, server: &str) -> Reach {
    for p in PODS {
        want = want.set(&format!("{ns}/{p}"), server, true);
    }
    want
}

/// What each shared case ([`netpol_cases::cases`]) must give: (protocol, port, who reaches whom).
fn expected(name: &str) -> Vec<(Protocol, u16, Reach)> {
    let all = Reach::allowed;
    // x/a takes nothing, or only namespace y.
    let nobody = || all().ingress("x/a", false);
    let only_y = || from_ns(nobody(), "y", "x/a");
    let only_xb = || nobody().set("x/b", "x/a", true);
    // x/a sends nothing.
    let mute = || all().egress("x/a", false);
    match name {
        "should support a 'default-deny-ingress' policy" => {
            let want = all().ingress_ns("x", false);
            vec![(TCP, 80, want.clone()), (UDP, 81, want)]
        }
        "should support a 'default-deny-all' policy" => {
            let want = egress_ns_denied(all().ingress_ns("x", false), "x");
            vec![(TCP, 80, want.clone()), (SCTP, 81, want)]
        }
        "should support allow-all policy" => vec![(TCP, 80, all())],
        "ingress on 80 only" => vec![(TCP, 80, all()), (TCP, 81, nobody())],
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence" =>
        {
            vec![(TCP, 80, all()), (TCP, 81, all())]
        }
        "egress on 80 only" => vec![(TCP, 80, all()), (TCP, 81, mute())],
        "should enforce multiple egress policies with egress allow-all policy taking precedence" => {
            vec![(TCP, 81, all())]
        }
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector"
        | "should enforce policy based on PodSelector with MatchExpressions" => {
            vec![(TCP, 80, only_xb())]
        }
        "should enforce policy to allow ingress traffic from pods in all namespaces" => {
            vec![(TCP, 80, all())]
        }
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector"
        | "should enforce policy based on NamespaceSelector with MatchExpressions"
        | "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label" =>
        {
            vec![(TCP, 80, only_y())]
        }
        // Pod b of x, OR any pod outside x.
        "should enforce policy based on PodSelector or NamespaceSelector" => {
            vec![(TCP, 80, from_ns(from_ns(only_xb(), "y", "x/a"), "z", "x/a"))]
        }
        // Pod b of the namespaces other than x (one peer, both selectors).
        "should enforce policy based on PodSelector and NamespaceSelector" => vec![(
            TCP,
            80,
            nobody().set("y/b", "x/a", true).set("z/b", "x/a", true),
        )],
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors" => {
            let mut want = nobody();
            for client in ["y/b", "z/b", "y/c", "z/c"] {
                want = want.set(client, "x/a", true);
            }
            vec![(TCP, 80, want)]
        }
        "should enforce policy based on any PodSelectors" => {
            vec![(TCP, 80, only_xb().set("x/c", "x/a", true))]
        }
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector" =>
        {
            vec![(TCP, 80, nobody().set("y/a", "x/a", true))]
        }
        "should enforce policy based on Ports" => vec![(TCP, 80, nobody()), (TCP, 81, only_y())],
        "should allow ingress access from namespace on one named port" => vec![
            (TCP, 80, only_y()),
            (TCP, 81, nobody()),
            (UDP, 80, nobody()),
        ],
        "should enforce policy based on a port range (endPort)" => vec![
            (TCP, 80, only_y()),
            (TCP, 81, only_y()),
            (UDP, 80, nobody()),
        ],
        // Two policies stacked: 80 from y, 81 from y.
        "should enforce multiple, stacked policies with overlapping podSelectors" => {
            vec![(TCP, 80, only_y()), (TCP, 81, only_y())]
        }
        "should enforce ingress policy allowing any port traffic to a server on a specific protocol" =>
        {
            vec![(TCP, 80, all()), (TCP, 81, all()), (UDP, 80, nobody())]
        }
        "should not allow access by TCP when a policy specifies only UDP" => {
            vec![(UDP, 81, all()), (TCP, 81, nobody())]
        }
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'" => {
            vec![(SCTP, 80, all()), (TCP, 80, nobody())]
        }
        // Egress on one named port: x/a reaches everyone on 80, nobody on 81.
        "should allow egress access on one named port" => vec![(TCP, 80, all()), (TCP, 81, mute())],
        "should deny egress from pods based on PodSelector" => vec![(TCP, 80, mute())],
        "should deny egress from all pods in a namespace" => {
            vec![(TCP, 80, egress_ns_denied(all(), "x"))]
        }
        // To y/a only, by pod and namespace selectors.
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector" =>
        {
            vec![(TCP, 80, mute().set("x/a", "y/a", true))]
        }
        // To y/b's address by an ipBlock /32.
        "should allow egress access to server in CIDR block" => {
            vec![(TCP, 80, mute().set("x/a", "y/b", true))]
        }
        // To all of y's /24 except y/b.
        "should enforce except clause while egress access to server in CIDR block" => vec![(
            TCP,
            80,
            mute().set("x/a", "y/a", true).set("x/a", "y/c", true),
        )],
        // A second policy allowing the excepted /32: allowed (policies add up).
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed" => {
            let mut want = mute();
            for p in PODS {
                want = want.set("x/a", &format!("y/{p}"), true);
            }
            vec![(TCP, 80, want)]
        }
        // The client's egress denies what the server's ingress allows: denied.
        "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)" =>
        {
            vec![(TCP, 80, mute())]
        }
        // Ingress and egress controlled independently: x/a takes ingress only from x/b and sends
        // only to y.
        "should work with Ingress, Egress specified together" => {
            let mut want = only_xb().egress("x/a", false);
            for p in PODS {
                want = want.set("x/a", &format!("y/{p}"), true);
            }
            vec![(TCP, 80, want)]
        }
        // x/a is isolated, and the broken rules allow nobody.
        BAD => vec![(TCP, 80, nobody())],
        _ => panic!("no expected matrices for the shared case {name:?}"),
    }
}

/// Every shared case gives its expected matrices in the model, and compiles without problems
/// (but [`BAD`]).
#[test]
fn every_upstream_case_gives_its_expected_matrices() {
    let cases = netpol_cases::cases(ip_of);
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), cases.len(), "two shared cases share a name");
    let mut wrong = Vec::new();
    for case in &cases {
        let cluster = world(&case.policies);
        if case.name != BAD {
            for pod in &cluster.pods {
                let problems = compile(&cluster, pod).problems;
                assert!(problems.is_empty(), "{}: {problems:?}", case.name);
            }
        }
        for (protocol, port, want) in expected(case.name) {
            wrong.extend(
                probe(&cluster, protocol, port, &want)
                    .into_iter()
                    .map(|w| format!("{}: {w}", case.name)),
            );
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_bad_part_of_a_policy_is_named_and_allows_nothing() {
    let cluster = world(&netpol_cases::case_named(ip_of, BAD).policies);
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
}

/// Issue 47, case 9: `policyTypes` defaults as the API server defaults it
/// (`SetDefaults_NetworkPolicy`): unset and `[]` alike mean `Ingress`, plus `Egress` only when
/// `spec.egress` has a rule; `egress: []` present but empty adds no `Egress`.
#[test]
fn policy_types_default_as_the_api_server_does() {
    let to_y = json!([{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]);
    // (spec, x/a isolated for ingress, for egress)
    let specs = [
        (json!({"podSelector": {}}), true, false),
        (json!({"podSelector": {}, "policyTypes": []}), true, false),
        (json!({"podSelector": {}, "egress": []}), true, false),
        (
            json!({"podSelector": {}, "policyTypes": [], "egress": []}),
            true,
            false,
        ),
        (json!({"podSelector": {}, "egress": to_y}), true, true),
        (
            json!({"podSelector": {}, "policyTypes": [], "egress": to_y}),
            true,
            true,
        ),
        (
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
            false,
            true,
        ),
    ];
    let mut wrong = Vec::new();
    for (spec, ingress, egress) in specs {
        let cluster = world(&[policy("x", "p", spec.clone())]);
        let xa = cluster
            .pods
            .iter()
            .find(|p| p.namespace == "x" && p.name == "a")
            .unwrap();
        let c = compile(&cluster, xa);
        let isolated = |d: &eniipam::network_policy::Direction| {
            matches!(d, eniipam::network_policy::Direction::Isolated { .. })
        };
        let got = (isolated(&c.ingress), isolated(&c.egress));
        if got != (ingress, egress) {
            wrong.push(format!(
                "{spec}: (ingress, egress) isolated {got:?}, the API server's defaults say {:?}",
                (ingress, egress)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
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
