//! `tests/network_policy_nft.rs`'s in-place updates: each change loaded as the daemon sends it
//! (`Ruleset::update_script`) must leave the kernel's table as a fresh load of the new ruleset
//! does, and every probe must agree with the model of the new state.

use eniipam::network_policy::PodView;
use serde_json::{Value, json};

use crate::pod_a;
use crate::support::{Lab, Stack, policy, ruleset, world_in};

/// Which pods are the node's in an update case.
#[derive(Clone, Copy, Debug)]
enum Local {
    All,
    X,
}

impl Local {
    fn keeps(self, p: &PodView) -> bool {
        match self {
            Self::All => true,
            Self::X => p.namespace == "x",
        }
    }
}

/// For each pair A → B: A loaded whole, then B's `update_script(&A)`; the kernel's table must
/// list as B loaded whole does, and every probe must agree with the model of B.
pub fn updates_in_place(test: &str, stack: Stack) {
    let Some(lab) = Lab::with_stack(test, stack) else {
        return;
    };
    let from = |peers: Value, ports: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": peers, "ports": ports}]}),
        )
    };
    let from_y = || {
        from(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
            json!([{"port": 80}]),
        )
    };
    let from_y_z = from(
        json!([{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]}}]),
        json!([{"port": 80}]),
    );
    let deny_all = || {
        policy(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )
    };
    let y_egress = || {
        policy(
            "y",
            "out",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.1.0.0/24", "except": ["10.1.0.11/32"]}}]}]}),
        )
    };
    let block = |except: &str| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.1.1.0/24", "except": [except]}}]}]}),
        )
    };
    // A state: the policies, and which pods are the node's.
    type State = (Vec<Value>, Local);
    let cases: Vec<(&str, State, State)> = vec![
        (
            "pods added",
            (vec![from_y(), y_egress()], Local::X),
            (vec![from_y(), y_egress()], Local::All),
        ),
        (
            "pods removed",
            (vec![from_y(), y_egress()], Local::All),
            (vec![from_y(), y_egress()], Local::X),
        ),
        (
            "peers added",
            (vec![from_y()], Local::All),
            (vec![from_y_z.clone()], Local::All),
        ),
        (
            "peers removed",
            (vec![from_y_z], Local::All),
            (vec![from_y()], Local::All),
        ),
        (
            "an except moved inside a block",
            (vec![block("10.1.1.11/32")], Local::All),
            (vec![block("10.1.1.8/30")], Local::All),
        ),
        (
            "a policy's ports changed",
            (vec![from_y()], Local::All),
            (
                vec![from(
                    json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
                    json!([{"port": 81}, {"protocol": "UDP"}]),
                )],
                Local::All,
            ),
        ),
        (
            "a pod isolated",
            (vec![], Local::All),
            (vec![from_y()], Local::All),
        ),
        (
            "a pod opened",
            (vec![from_y(), deny_all()], Local::All),
            (vec![deny_all()], Local::All),
        ),
        (
            "everything removed",
            (vec![from_y(), deny_all(), y_egress()], Local::All),
            (vec![], Local::All),
        ),
        (
            "everything added",
            (vec![], Local::All),
            (vec![from_y(), deny_all(), y_egress()], Local::All),
        ),
    ];
    for (name, (a, a_local), (b, b_local)) in cases {
        let (a, b) = (world_in(&a, stack), world_in(&b, stack));
        let (ra, rb) = (
            ruleset(&a, |p| a_local.keeps(p)),
            ruleset(&b, |p| b_local.keeps(p)),
        );
        lab.load(&rb.script());
        let fresh = lab.listing();
        lab.load(&ra.script());
        let update = rb.update_script(&ra);
        assert!(!update.is_empty(), "{name}: no update");
        if name.starts_with("peers") || name.starts_with("an except") {
            assert!(
                update
                    .lines()
                    .all(|l| l.starts_with("add element ") || l.starts_with("delete element ")),
                "{name}: more than elements:\n{update}"
            );
        }
        lab.load(&update);
        assert_eq!(
            lab.listing(),
            fresh,
            "{name}: the update lists otherwise:\n{update}"
        );
        lab.check(name, &b, &|p| b_local.keeps(p), &update);
    }
}
