//! The upstream network-policy e2e cases (Kubernetes' `test/e2e/network/netpol/network_policy.go`)
//! as data: each case's name and the NetworkPolicies it applies, with upstream's policies (names,
//! selectors, ports, policy types) in upstream's world: namespaces `x`, `y`, `z` (labelled
//! `ns=<name>` and `kubernetes.io/metadata.name=<name>`), pods `a`, `b`, `c` labelled
//! `pod=<name>`, ports 80 and 81 named `serve-<port>-<protocol>`.
//!
//! Upstream's dynamic cases change the world between two checks (a policy updated in place under
//! its name, a label added to a namespace or a pod): a case is a list of [`Stage`]s, each the whole
//! state to check (its policies and the labels added so far). [`Case::policies`] is the first
//! stage's; [`Case::then`] the later ones.
//!
//! Shared by `tests/network_policy_cases.rs` (each stage's expected matrices, against the model),
//! `tests/network_policy_nft.rs` (the kernel, loaded with the daemon's ruleset),
//! `tests/datapath_policy.rs` (every case's first stage through the real daemon and plugin) and
//! `tests/datapath_policy_upstream.rs` (every stage, through the daemon's watch and in-place
//! updates).
//!
//! The `ipBlock` cases name pod addresses, so the list is built from the world's addresses
//! (`ip_of`, IPv4 or IPv6): the model's world numbers each namespace's pods in a /24 of its own,
//! the lab's get theirs from the VPC.

#![allow(dead_code)] // each test binary reads its own part

mod list;

use std::net::IpAddr;

pub use list::cases;
use serde_json::{Value, json};

/// One case: upstream's name (or ours, for the cases upstream does not have) and its stages.
pub struct Case {
    pub name: &'static str,
    /// The first stage's policies (no label added).
    pub policies: Vec<Value>,
    /// The later stages, in order (upstream's dynamic cases); empty for most.
    pub then: Vec<Stage>,
}

/// One state of the world to check: the policies then, and the labels added to upstream's.
#[derive(Clone, Debug, Default)]
pub struct Stage {
    /// What changed to reach it, in upstream's words.
    pub what: &'static str,
    pub policies: Vec<Value>,
    /// Labels added to namespaces: (namespace, key, value).
    pub namespace_labels: Vec<(&'static str, &'static str, &'static str)>,
    /// Labels added to pods: (namespace, pod, key, value).
    pub pod_labels: Vec<(&'static str, &'static str, &'static str, &'static str)>,
}

impl Case {
    /// Every stage, the first one included.
    pub fn stages(&self) -> Vec<Stage> {
        let first = Stage {
            what: "the policies created",
            policies: self.policies.clone(),
            ..Stage::default()
        };
        std::iter::once(first).chain(self.then.clone()).collect()
    }
}

/// A NetworkPolicy `ns/name` with `spec`.
pub fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

/// Upstream's `GenNetworkPolicyWithNameAndPodSelector(name, selector, SetSpecIngressRules(rules))`
/// in namespace `ns`: `policyTypes: [Ingress]`, `ingress` the rules (maybe none).
fn ingress(ns: &str, name: &str, selector: Value, rules: Value) -> Value {
    policy(
        ns,
        name,
        json!({"podSelector": selector, "ingress": rules, "policyTypes": ["Ingress"]}),
    )
}

/// The same with `SetSpecEgressRules(rules)`: `policyTypes: [Egress]`.
fn egress(ns: &str, name: &str, selector: Value, rules: Value) -> Value {
    policy(
        ns,
        name,
        json!({"podSelector": selector, "egress": rules, "policyTypes": ["Egress"]}),
    )
}

/// `podSelector` / `matchLabels` `pod: <name>`.
fn pod(name: &str) -> Value {
    json!({"matchLabels": {"pod": name}})
}

/// `GenNetworkPolicyWithNameAndPodMatchLabel(name, {})`: every pod of the namespace.
fn every() -> Value {
    json!({"matchLabels": {}})
}

/// A namespace selector on the API server's own label.
fn ns_named(ns: &str) -> Value {
    json!({"matchLabels": {"kubernetes.io/metadata.name": ns}})
}

fn ns_not_in(ns: &str) -> Value {
    json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}]})
}

/// `ip`'s host CIDR (/32 or /128).
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// Upstream's `makeLargeCIDRForIP`: the /4 holding `ip`.
fn large_cidr(ip: IpAddr) -> String {
    let net = ipnet::IpNet::new(ip, 4).expect("a /4").trunc();
    net.to_string()
}

/// A case of one stage.
fn case(name: &'static str, policies: Vec<Value>) -> Case {
    Case {
        name,
        policies,
        then: Vec::new(),
    }
}

/// A case whose world changes: `first`, then each stage in turn.
fn dynamic(name: &'static str, first: Vec<Value>, then: Vec<Stage>) -> Case {
    Case {
        name,
        policies: first,
        then,
    }
}

/// A later stage with `policies` and no label added.
fn policies_then(what: &'static str, policies: Vec<Value>) -> Stage {
    Stage {
        what,
        policies,
        ..Stage::default()
    }
}

/// The case named `name` (panics naming it when there is none).
pub fn case_named<A: Into<IpAddr>>(ip_of: impl Fn(&str, &str) -> A, name: &str) -> Case {
    cases(ip_of)
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no shared case is named {name:?}"))
}
