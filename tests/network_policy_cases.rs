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

/// The six (protocol, port) pairs of upstream's full matrix.
const PAIRS: [(Protocol, u16); 6] = [
    (TCP, 80),
    (TCP, 81),
    (UDP, 80),
    (UDP, 81),
    (SCTP, 80),
    (SCTP, 81),
];

/// One stage's expected matrices, one per (protocol, port) pair.
struct Matrices(BTreeMap<(Protocol, u16), Reach>);

/// `want` on every pair.
fn each(want: Reach) -> Matrices {
    Matrices(PAIRS.iter().map(|pair| (*pair, want.clone())).collect())
}

impl Matrices {
    /// `want` on `protocol`/`port`.
    fn on(mut self, protocol: Protocol, port: u16, want: Reach) -> Self {
        self.0.insert((protocol, port), want);
        self
    }
    /// `want` on both ports of `protocol`.
    fn on_protocol(self, protocol: Protocol, want: Reach) -> Self {
        self.on(protocol, 80, want.clone()).on(protocol, 81, want)
    }
}

/// What each stage of each shared case ([`netpol_cases::cases`]) must give, in order: the full
/// matrix (9 × 9 pods) on each of the six (protocol, port) pairs.
fn expected(name: &str) -> Vec<Matrices> {
    let all = Reach::allowed;
    // x/a takes nothing, or only namespace y, or only x/b.
    let nobody = || all().ingress("x/a", false);
    let only_y = || from_ns(nobody(), "y", "x/a");
    let only_xb = || nobody().set("x/b", "x/a", true);
    // x/a sends nothing; x's pods take nothing; x's pods send nothing.
    let mute = || all().egress("x/a", false);
    let x_closed = || all().ingress_ns("x", false);
    let x_mute = || egress_ns_denied(all(), "x");
    let deny_all = || egress_ns_denied(x_closed(), "x");
    let around_xb = || all().set("x/a", "x/b", false);
    match name {
        "should support a 'default-deny-ingress' policy" => vec![each(x_closed())],
        "should support a 'default-deny-all' policy" => vec![each(deny_all())],
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector"
        | "should enforce policy based on PodSelector with MatchExpressions" => {
            vec![each(only_xb())]
        }
        // x is closed, but x/a takes every pod of every namespace.
        "should enforce policy to allow ingress traffic for a target" => {
            vec![each(all().ingress("x/b", false).ingress("x/c", false))]
        }
        "should enforce policy to allow ingress traffic from pods in all namespaces"
        | "should support allow-all policy" => vec![each(all())],
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector"
        | "should enforce policy based on NamespaceSelector with MatchExpressions"
        | "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label" => {
            vec![each(only_y())]
        }
        // Any pod outside x, or x/b.
        "should enforce policy based on PodSelector or NamespaceSelector" => {
            vec![each(from_ns(from_ns(only_xb(), "y", "x/a"), "z", "x/a"))]
        }
        // Pod b of the namespaces other than x (one peer, both selectors).
        "should enforce policy based on PodSelector and NamespaceSelector" => vec![each(
            nobody().set("y/b", "x/a", true).set("z/b", "x/a", true),
        )],
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors" => {
            let mut want = nobody();
            for client in ["y/b", "z/b", "y/c", "z/c"] {
                want = want.set(client, "x/a", true);
            }
            vec![each(want)]
        }
        "should enforce policy based on any PodSelectors" => {
            vec![each(only_xb().set("x/c", "x/a", true))]
        }
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector" => {
            vec![each(nobody().set("y/a", "x/a", true))]
        }
        "should enforce policy based on Ports" => vec![each(nobody()).on(TCP, 81, only_y())],
        "using UDP: should enforce policy based on Ports" => {
            vec![each(nobody()).on(UDP, 81, only_y())]
        }
        "using SCTP: should enforce policy based on Ports" => {
            vec![each(nobody()).on(SCTP, 81, only_y())]
        }
        // 81 from y, then 80 from y too.
        "should enforce multiple, stacked policies with overlapping podSelectors" => vec![
            each(nobody()).on(TCP, 81, only_y()),
            each(nobody()).on(TCP, 81, only_y()).on(TCP, 80, only_y()),
        ],
        // Every pod of x takes TCP 81 (by name), from everyone.
        "should allow ingress access on one named port" => {
            vec![each(x_closed()).on(TCP, 81, all())]
        }
        "should allow ingress access from namespace on one named port" => {
            vec![each(nobody()).on(TCP, 80, only_y())]
        }
        // Every pod of x sends TCP 80 (by name, on each peer) only.
        "should allow egress access on one named port" => vec![each(x_mute()).on(TCP, 80, all())],
        "should enforce updated policy" => vec![each(all()), each(x_closed())],
        "should allow ingress access from updated namespace" => vec![each(nobody()), each(only_y())],
        "should allow ingress access from updated pod" => vec![each(nobody()), each(only_xb())],
        // x's pods take only x's pods.
        "should deny ingress from pods on other namespaces" => {
            let mut want = x_closed();
            for server in PODS {
                want = from_ns(want, "x", &format!("x/{server}"));
            }
            vec![each(want)]
        }
        "should deny ingress access to updated pod" => vec![each(all()), each(nobody())],
        "should deny egress from pods based on PodSelector" => vec![each(mute())],
        "should deny egress from all pods in a namespace" => vec![each(x_mute())],
        // x/a takes x/b only, and sends TCP 80 only.
        "should work with Ingress, Egress specified together" => {
            vec![each(only_xb().egress("x/a", false)).on(TCP, 80, only_xb())]
        }
        // x/a sends to y/a only; y/a and y/b take x/a only.
        "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)" => {
            vec![each(
                mute()
                    .ingress("y/a", false)
                    .ingress("y/b", false)
                    .set("x/a", "y/a", true),
            )]
        }
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector" => {
            vec![each(mute().set("x/a", "y/a", true))]
        }
        "should enforce ingress policy allowing any port traffic to a server on a specific protocol" => {
            vec![each(nobody()).on_protocol(TCP, all())]
        }
        // TCP 80 to x's pods, then everything.
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence" => {
            vec![each(x_closed()).on(TCP, 80, all()), each(all())]
        }
        "should enforce multiple egress policies with egress allow-all policy taking precedence" => {
            vec![each(x_mute()).on(TCP, 80, all()), each(all())]
        }
        "should stop enforcing policies after they are deleted" => {
            vec![each(deny_all()), each(all())]
        }
        // To y/b's address by an ipBlock /32.
        "should allow egress access to server in CIDR block" => {
            vec![each(mute().set("x/a", "y/b", true))]
        }
        // To the /4 holding every pod, x/b cut out.
        "should enforce except clause while egress access to server in CIDR block" => {
            vec![each(around_xb())]
        }
        // Then the policy updated in place to x/b's /32 alone.
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed" => {
            vec![each(around_xb()), each(mute().set("x/a", "x/b", true))]
        }
        // x/a's egress allows all; then its ingress is denied, its egress still allowed.
        "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector" => {
            vec![each(all()), each(nobody())]
        }
        // x is closed; x/a takes SCTP 81 from everyone.
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP" => {
            vec![each(x_closed()).on(SCTP, 81, x_closed().ingress("x/a", true))]
        }
        "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP" => {
            vec![each(nobody()).on(SCTP, 80, all())]
        }
        "should not allow access by TCP when a policy specifies only UDP" => {
            vec![each(nobody()).on(UDP, 81, all())]
        }
        // x/a sends to every namespace but y.
        "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label" => {
            let mut want = all();
            for p in PODS {
                want = want.set("x/a", &format!("y/{p}"), false);
            }
            vec![each(want)]
        }
        "ours: ingress on a port range (endPort) from namespace y" => vec![
            each(nobody())
                .on(TCP, 80, only_y())
                .on(TCP, 81, only_y()),
        ],
        // x/a is isolated, and the broken rules allow nobody.
        BAD => vec![each(nobody())],
        _ => panic!("no expected matrices for the shared case {name:?}"),
    }
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
    assert_eq!(named.policies[0]["spec"]["podSelector"], json!({"matchLabels": {}}));
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
