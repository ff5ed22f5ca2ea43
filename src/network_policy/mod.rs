//! Kubernetes NetworkPolicy (issue 28), the model half: which connections the cluster's policies
//! allow for a pod, compiled into sets of peer addresses and ports per direction (what the node's
//! nftables sets will hold), each allowed connection traced to the policy rule that allows it.
//!
//! - [`selector`]: label selectors (`matchLabels`, `matchExpressions`).
//! - [`compile`]: a pod's ingress and egress ([`compile()`], [`Compiled`]) and the verdict on one
//!   connection ([`connection_allowed`]); the semantics are in its docs.
//!
//! Not wired yet: the daemon does not watch policies nor program rules (see the issue). The
//! upstream network-policy e2e cases are reproduced against this model in
//! `tests/network_policy_cases.rs`.

pub mod compile;
pub mod selector;

pub use compile::{
    Cluster, Compiled, Direction, IpBlock, NamedPort, Peers, PodView, Ports, Protocol, Rule,
    RuleSource, Verdict, compile, connection_allowed,
};
