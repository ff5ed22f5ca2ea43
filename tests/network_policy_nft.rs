//! Issue 28, the kernel half: NetworkPolicy compiled by the model (`eniipam::network_policy`),
//! rendered by `network_policy::nft` into table `inet eniipam_policy`, loaded with the daemon's own
//! `host::Nft` inside a "node" network namespace, and probed with real traffic.
//!
//! The world is upstream's (as in `tests/network_policy_cases.rs`): namespaces `x`, `y`, `z`, pods
//! `a`, `b`, `c` in each, each pod a network namespace on a host veth `eni<ns><pod>` of the node
//! (address /32, default route via 169.254.1.1 on the veth, as the plugin wires pods), serving TCP
//! and UDP on 80 and 81. Each case probes every client × server × {TCP, UDP} × {80, 81} from inside
//! the client's namespace and asserts the observed matrix equals the model's `connection_allowed`
//! cell by cell (a pod reaching itself never leaves its namespace: always allowed). Then a policy
//! change, re-rendered and re-applied, must take effect.
//!
//! The cases and the in-place updates also run over IPv6-only pods (`_over_ipv6`) and dual-stack
//! pods (`_dual_stack`, both families probed), each pod's IPv6 and each `ipBlock` the twin of its
//! IPv4 (`network_policy_support/stack.rs`; issue 47, case 7).
//!
//! Needs root, `ip` and `nft`; skipped with a notice otherwise, a failure under `CI=true`.
//! Namespaces are deleted on drop, also when a case fails.

#[path = "netpol_cases/mod.rs"]
mod netpol_cases;
#[path = "network_policy_support/mod.rs"]
mod support;
#[path = "network_policy_nft/updates.rs"]
mod updates;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use eniipam::network_policy::nft::{CounterVerdict, LocalPod, PolicyType, render};
use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol, compile};
use serde_json::{Value, json};
use support::{Lab, Stack, policy, ruleset, run, world};
use updates::updates_in_place;

fn pod_a() -> Value {
    json!({"matchLabels": {"pod": "a"}})
}

/// One client's row of the matrix: 9 servers × 2 protocols × 2 ports (per family probed).
const ROW: usize = 9 * 2 * 2;

/// A case body run over IPv4 pods (upstream's world), IPv6-only pods and dual-stack pods (both
/// families probed, each cell equal to the model's; issue 47, case 7), as three tests.
macro_rules! over_stacks {
    ($body:ident: $v4:ident, $v6:ident, $dual:ident) => {
        #[test]
        fn $v4() {
            $body(stringify!($v4), Stack::V4)
        }
        #[test]
        fn $v6() {
            $body(stringify!($v6), Stack::V6)
        }
        #[test]
        fn $dual() {
            $body(stringify!($dual), Stack::Dual)
        }
    };
}

over_stacks!(every_upstream_case: every_upstream_case_agrees_with_the_model_over_tcp_udp_and_sctp,
    every_upstream_case_agrees_with_the_model_over_ipv6, every_upstream_case_agrees_with_the_model_dual_stack);
over_stacks!(ingress_cases: ingress_cases_agree_with_the_model,
    ingress_cases_agree_with_the_model_over_ipv6, ingress_cases_agree_with_the_model_dual_stack);
over_stacks!(egress_cases: egress_cases_agree_with_the_model,
    egress_cases_agree_with_the_model_over_ipv6, egress_cases_agree_with_the_model_dual_stack);
over_stacks!(a_changed_policy: a_changed_policy_re_rendered_and_re_applied_takes_effect,
    a_changed_policy_takes_effect_over_ipv6, a_changed_policy_takes_effect_dual_stack);
over_stacks!(updates_in_place: updates_in_place_equal_a_fresh_load,
    updates_in_place_equal_a_fresh_load_over_ipv6, updates_in_place_equal_a_fresh_load_dual_stack);

/// The labs [`every_upstream_case`] spreads its cases over, each on a thread of its own: a stage's
/// time is mostly its sweep waiting out the silence of the denied cells (issue 45), which labs of
/// their own wait out side by side. Each stage loads its ruleset whole, so no stage depends on the
/// lab's previous one.
const LABS: usize = 3;

/// Issue 47, case 8: every stage of every shared upstream case (`tests/netpol_cases`, upstream's
/// policies), the full matrix over TCP, UDP and SCTP (probed by its `INIT`:
/// `network_policy_support/sctp.rs`) on 80 and 81, equal to the model cell by cell; over IPv4,
/// IPv6-only and dual-stack pods (case 7). The cases are dealt over [`LABS`] labs.
fn every_upstream_case(test: &str, stack: Stack) {
    let mut shares: Vec<Vec<netpol_cases::Case>> = (0..LABS).map(|_| Vec::new()).collect();
    for (i, case) in netpol_cases::cases(support::ip_of).into_iter().enumerate() {
        shares[i % LABS].push(case);
    }
    let stages = std::thread::scope(|s| {
        let labs: Vec<_> = shares
            .into_iter()
            .map(|share| {
                s.spawn(move || {
                    let mut lab = Lab::with_stack(test, stack)?;
                    lab.probe_sctp_too();
                    let mut stages = 0;
                    for case in share {
                        for stage in case.stages() {
                            let cluster = support::world_at_in(
                                &stage.policies,
                                &stage.namespace_labels,
                                &stage.pod_labels,
                                stack,
                            );
                            lab.case_in(&format!("{} ({})", case.name, stage.what), &cluster);
                            stages += 1;
                        }
                    }
                    Some(stages)
                })
            })
            .collect();
        labs.into_iter()
            .map(|lab| lab.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .sum::<Option<usize>>()
    });
    let Some(stages) = stages else {
        return;
    };
    eprintln!(
        "{test}: {stages} stages, {} cells each, agree with the model",
        486 * stack.families()
    );
}

fn ingress_cases(test: &str, stack: Stack) {
    let Some(lab) = Lab::with_stack(test, stack) else {
        return;
    };
    let f = stack.families();
    assert_eq!(lab.case("no policy: everything open", &[]), 0);
    // Every other pod (8) × the 3 servers of x × 2 protocols × 2 ports: x's own pods too.
    let denied = lab.case(
        "default-deny-ingress",
        &[policy(
            "x",
            "deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )],
    );
    assert_eq!(denied, f * (3 * 8 * 4));
    let from = |peers: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": peers}]}),
        )
    };
    // Only x/b (and x/a itself) reach x/a.
    let denied = lab.case(
        "allow from a pod selector",
        &[from(
            json!([{"podSelector": {"matchLabels": {"pod": "b"}}}]),
        )],
    );
    assert_eq!(denied, f * (7 * 4));
    let denied = lab.case(
        "allow from a namespace selector",
        &[from(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
        )],
    );
    assert_eq!(denied, f * (5 * 4));
    lab.case(
        "pod and namespace selectors in one peer",
        &[from(json!([{"namespaceSelector": {"matchExpressions":
            [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
            "podSelector": {"matchLabels": {"pod": "b"}}}]))],
    );
    let from_y_on = |ports: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": ports}]}),
        )
    };
    // From y on TCP/81 only: the 3 pods of y lose 3 of 4 cells, the 5 others all 4.
    let denied = lab.case("ports: TCP 81 from y", &[from_y_on(json!([{"port": 81}]))]);
    assert_eq!(denied, f * (3 * 3 + 5 * 4));
    lab.case(
        "a named port, UDP",
        &[from_y_on(
            json!([{"port": "serve-80-udp", "protocol": "UDP"}]),
        )],
    );
    lab.case(
        "a port range (endPort) and a whole protocol, stacked",
        &[
            from_y_on(json!([{"port": 80, "endPort": 81}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "ingress": [{"ports": [{"protocol": "UDP"}]}]}),
            ),
        ],
    );
    lab.case(
        "ingress ipBlock with except",
        &[from(
            json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}]),
        )],
    );
}

fn egress_cases(test: &str, stack: Stack) {
    let Some(lab) = Lab::with_stack(test, stack) else {
        return;
    };
    let f = stack.families();
    let egress = |to: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": to}]}),
        )
    };
    let denied = lab.case(
        "deny egress from x/a",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
        )],
    );
    assert_eq!(denied, f * (ROW - 4));
    let denied = lab.case(
        "deny egress from all of x",
        &[policy(
            "x",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
        )],
    );
    assert_eq!(denied, f * (3 * (ROW - 4)));
    // To y's /24 except y/b: x/a reaches y/a and y/c (and itself).
    let denied = lab.case(
        "egress ipBlock with except",
        &[egress(
            json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}]),
        )],
    );
    assert_eq!(denied, f * (ROW - 3 * 4));
    lab.case(
        "an address both excepted and allowed by another policy",
        &[
            egress(json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.1.1.11/32"}}]}]}),
            ),
        ],
    );
    // Egress named port: resolved on each peer pod (a set of address . protocol . port).
    let denied = lab.case(
        "egress on one named port",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}),
        )],
    );
    assert_eq!(denied, f * (8 * 3));
    lab.case(
        "the client's egress denies what the server's ingress allows",
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
    );
    // Both chains meet one packet: x/a's egress says yes, y's ingress says no.
    let denied = lab.case(
        "the server's ingress denies what the client's egress allows",
        &[
            egress(json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}])),
            policy(
                "y",
                "server",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            ),
        ],
    );
    // x/a reaches none but itself; every other pod but x/b (and y's own to themselves) loses y.
    assert_eq!(denied, f * ((ROW - 4) + 7 * 3 * 4 - 3 * 4));
    lab.case(
        "ingress and egress together",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80}]}]}),
        )],
    );
}

fn a_changed_policy(test: &str, stack: Stack) {
    let Some(lab) = Lab::with_stack(test, stack) else {
        return;
    };
    let f = stack.families();
    let deny_x = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let first = lab.case("deny ingress to x", std::slice::from_ref(&deny_x));
    assert!(first > 0);
    // Open x/a to y: fewer denials, and the kernel agrees cell by cell.
    let open_a = policy(
        "x",
        "open-a",
        json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    );
    let second = lab.case("then allow y into x/a", &[deny_x, open_a]);
    assert_eq!(first - second, f * 3 * 4);
    // Every policy removed: everything connects again.
    assert_eq!(lab.case("then no policy", &[]), 0);
}

/// Each isolated direction counts what it allows and denies; an update that keeps the chain
/// keeps its counts.
#[test]
fn verdict_counters_count_allowed_and_denied_connections() {
    let Some(lab) = Lab::new("verdict_counters_count_allowed_and_denied_connections") else {
        return;
    };
    let only_from = |pod: &str| {
        world(&[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": pod}}}], "ports": [{"port": 80}]}]}),
        )])
    };
    let first = ruleset(&only_from("b"), |_| true);
    lab.load(&first.script());
    // The node's own link messages are no pod's connection: an address added to x/a's veth makes
    // the kernel send a duplicate-address probe and MLD reports from `::` towards x/a, now, under
    // the loaded ruleset (before the rule that accepts them, each counted as denied).
    lab.node_link_messages("enixa");
    let count = |verdict| {
        lab.counters()
            .into_iter()
            .find(|c| {
                c.veth == "enixa" && c.direction == PolicyType::Ingress && c.verdict == verdict
            })
            .map(|c| c.packets)
            .expect("x/a's ingress counter")
    };
    assert_eq!(
        (
            count(CounterVerdict::Allowed),
            count(CounterVerdict::Denied)
        ),
        (0, 0)
    );
    assert!(lab.probe_one("x/b", ("x", "a"), Protocol::Tcp, 80));
    assert_eq!(
        (
            count(CounterVerdict::Allowed),
            count(CounterVerdict::Denied)
        ),
        (1, 0)
    );
    assert!(!lab.probe_one("x/c", ("x", "a"), Protocol::Tcp, 80));
    let denied = count(CounterVerdict::Denied);
    assert!(denied >= 1, "a denied SYN (and its retransmissions) counts");
    assert_eq!(count(CounterVerdict::Allowed), 1);
    // Only x/a's ingress is isolated: no other pod has counters.
    assert!(
        lab.counters().iter().all(|c| c.pod == "x/a"),
        "{:?}",
        lab.counters()
    );
    // The peer changes in place (x/c instead of x/b): the chain stays, and so do its counts.
    let second = ruleset(&only_from("c"), |_| true);
    lab.load(&second.update_script(&first));
    assert_eq!(
        (
            count(CounterVerdict::Allowed),
            count(CounterVerdict::Denied)
        ),
        (1, denied)
    );
    assert!(lab.probe_one("x/c", ("x", "a"), Protocol::Tcp, 80));
    assert_eq!(count(CounterVerdict::Allowed), 2);
}

/// A full node: 110 local pods in `x`, each isolated both ways by one of 10 policies that select
/// peers among 1,000 pods of `y`; the ruleset loads in one transaction, holds a chain per pod and
/// direction, and loads again over itself (the replace a policy change does). Prints the figures.
#[test]
#[allow(clippy::disallowed_types)] // wall clock on purpose: the figure is real work
fn a_node_of_110_isolated_pods_loads_in_one_transaction() {
    let Some(lab) = Lab::new("a_node_of_110_isolated_pods_loads_in_one_transaction") else {
        return;
    };
    let mut c = Cluster::default();
    for ns in ["x", "y"] {
        c.namespaces.insert(
            ns.into(),
            BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), ns.to_owned())]),
        );
    }
    let pod = |ns: &str, i: u32, ip: Ipv4Addr| PodView {
        namespace: ns.into(),
        name: format!("p{i}"),
        labels: BTreeMap::from([("app".to_owned(), format!("app{}", i % 10))]),
        ips: vec![IpAddr::V4(ip)],
        host_network: false,
        ports: vec![NamedPort {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: 5353,
        }],
    };
    for i in 0..110 {
        c.pods.push(pod("x", i, Ipv4Addr::from(0x0a02_0000 + i)));
    }
    for i in 0..1000 {
        c.pods.push(pod("y", i, Ipv4Addr::from(0x0a03_0000 + i)));
    }
    for k in 0..10 {
        let app = json!({"matchLabels": {"app": format!("app{k}")}});
        let from_y = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}, "podSelector": app}]);
        c.policies.push(
            serde_json::from_value(policy(
                "x",
                &format!("p{k}"),
                json!({"podSelector": app, "policyTypes": ["Ingress", "Egress"],
                       "ingress": [{"from": from_y, "ports": [{"port": 8080, "endPort": 8090}]}],
                       "egress": [{"to": from_y, "ports": [{"port": "dns", "protocol": "UDP"}]},
                                  {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.2.0.0/16"]}}]}]}),
            ))
            .expect("a NetworkPolicy"),
        );
    }
    let start = std::time::Instant::now();
    let local: Vec<LocalPod> = c
        .pods
        .iter()
        .filter(|p| p.namespace == "x")
        .map(|p| LocalPod {
            name: format!("x/{}", p.name),
            veth: format!(
                "eni{:011x}",
                u32::from(match p.ips[0] {
                    IpAddr::V4(a) => a,
                    IpAddr::V6(_) => unreachable!(),
                })
            ),
            ips: p.ips.clone(),
            compiled: compile(&c, p),
        })
        .collect();
    let compiled = start.elapsed();
    let start = std::time::Instant::now();
    let ruleset = render(&local).expect("render");
    let rendered = start.elapsed();
    let script = ruleset.script();
    let first = lab.load(&script);
    let again = lab.load(&script);
    let listing = run(
        &[
            "ip",
            "netns",
            "exec",
            &lab.node,
            "nft",
            "list",
            "table",
            "inet",
            "eniipam_policy",
        ],
        None,
    )
    .expect("nft list");
    let chains = |prefix: &str| {
        listing
            .lines()
            .filter(|l| l.trim_start().starts_with(prefix))
            .count()
    };
    assert_eq!((chains("chain in_"), chains("chain eg_")), (110, 110));
    // Each pod's ingress peers: the 100 pods of y with its app label.
    assert_eq!(listing.matches("ip saddr @in_").count(), 110);
    let rules = listing
        .lines()
        .filter(|l| l.contains(" comment ") && !l.trim_start().starts_with("comment"))
        .count();
    println!(
        "110 isolated pods, 10 policies, 1,000 peer pods: compile {compiled:?}, render {rendered:?}, \
         first load {first:?}, replace {again:?}; {} script bytes, {rules} rules",
        script.len()
    );
}
