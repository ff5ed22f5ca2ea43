//! Issue 28: the upstream network-policy e2e cases (Kubernetes' `test/e2e/network/netpol`), reproduced
//! with upstream's policies against eniipam's policy model (`eniipam::network_policy`).
//!
//! The world is upstream's: namespaces `x`, `y`, `z` (labelled `ns=<name>` and
//! `kubernetes.io/metadata.name=<name>`), pods `a`, `b`, `c` in each (labelled `pod=<name>`), every
//! pod serving ports 80 and 81 over TCP, UDP and SCTP, named `serve-<port>-<protocol>`. Each stage
//! of each case (upstream's dynamic cases change a policy in place or add a label between two
//! checks) applies its policies and labels and compares the whole probe matrix (9 × 9 pods) on each
//! of the six (protocol, port) pairs with the expected one, built as upstream builds it: start from
//! "all allowed", then state what the policies change. A pod reaching itself never leaves its
//! namespace and is always allowed.
//!
//! The cases' policies are shared ([`netpol_cases`]); their expected matrices are here, keyed by
//! case name. This proves the model (selectors, ports, named ports, ranges, ipBlock, policy types,
//! stacking, updates); `tests/network_policy_nft.rs` holds the kernel's ruleset to the model on
//! every stage, `tests/datapath_policy.rs` and `tests/datapath_policy_upstream.rs` the real daemon
//! and plugin.

#[path = "network_policy_cases/expected.rs"]
mod expected;
#[path = "netpol_cases/mod.rs"]
mod netpol_cases;
#[path = "network_policy_support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};

use eniipam::network_policy::{
    Cluster, NamedPort, PodView, Protocol, compile, compile_all, connection_allowed,
};
use expected::expected;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{NAMESPACES, PODS, ip_of, policy, world, world_at};

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

/// Every stage of every shared case gives its expected matrices in the model, on the six
/// (protocol, port) pairs, cell by cell; and compiles without problems (but [`BAD`]).
#[test]
fn every_upstream_case_gives_its_expected_matrices() {
    let cases = netpol_cases::cases(ip_of);
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), cases.len(), "two shared cases share a name");
    let mut wrong = Vec::new();
    for case in &cases {
        let stages = case.stages();
        let wants = expected(case.name);
        assert_eq!(
            stages.len(),
            wants.len(),
            "{}: {} stages, {} expected",
            case.name,
            stages.len(),
            wants.len()
        );
        for (stage, want) in stages.iter().zip(wants) {
            let cluster = world_at(&stage.policies, &stage.namespace_labels, &stage.pod_labels);
            if case.name != BAD {
                for pod in &cluster.pods {
                    let problems = compile(&cluster, pod).problems;
                    assert!(problems.is_empty(), "{}: {problems:?}", case.name);
                }
            }
            for ((protocol, port), reach) in &want.0 {
                wrong.extend(
                    probe(&cluster, *protocol, *port, reach)
                        .into_iter()
                        .map(|w| format!("{} ({}): {w}", case.name, stage.what)),
                );
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Upstream's cases that issue 47 found missing are all in the shared list, and the names upstream
/// gives are used with upstream's policies (two names were ours with other policies).
#[test]
fn the_cases_issue_47_found_missing_are_reproduced() {
    let cases = netpol_cases::cases(ip_of);
    let has = |name: &str| cases.iter().find(|c| c.name == name);
    for name in [
        "should enforce policy to allow ingress traffic for a target",
        "should allow ingress access on one named port",
        "should deny ingress from pods on other namespaces",
        "should allow ingress access from updated namespace",
        "should allow ingress access from updated pod",
        "should deny ingress access to updated pod",
        "should enforce updated policy",
        "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
        "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
        "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
    ] {
        assert!(has(name).is_some(), "missing: {name:?}");
    }
    for dynamic in [
        "should allow ingress access from updated namespace",
        "should allow ingress access from updated pod",
        "should deny ingress access to updated pod",
        "should enforce updated policy",
    ] {
        assert!(
            !has(dynamic).unwrap().then.is_empty(),
            "{dynamic:?} changes the world in a later stage"
        );
    }
    // Upstream's egress named-port policy selects every pod of x, not x/a alone.
    let named = has("should allow egress access on one named port").unwrap();
    assert_eq!(
        named.policies[0]["spec"]["podSelector"],
        json!({"matchLabels": {}})
    );
    // Upstream's client-side case lets x/a send to y/a only, and y's pods take x/a.
    let client = has(
        "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
    )
    .unwrap();
    assert_eq!(client.policies.len(), 3);
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
