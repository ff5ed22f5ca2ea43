//! Kubernetes NetworkPolicy (issue 28), the model half: which connections the cluster's policies
//! allow for a pod, compiled into sets of peer addresses and ports per direction (what the node's
//! nftables sets will hold), each allowed connection traced to the policy rule that allows it.
//!
//! - [`selector`]: label selectors (`matchLabels`, `matchExpressions`).
//! - [`compile`]: a pod's ingress and egress ([`compile()`], [`Compiled`]) and the verdict on one
//!   connection ([`connection_allowed`]); the semantics are in its docs.
//! - [`nft`]: the compiled policies of a node's pods rendered into the nftables ruleset that
//!   enforces them (table `inet eniipam_policy`, IPv4), loaded as one transaction.
//!
//! Not wired yet: the daemon does not watch policies nor load the ruleset (see the issue). The
//! upstream network-policy e2e cases are reproduced against this model in
//! `tests/network_policy_cases.rs`, and against the kernel (model and nftables agreeing on every
//! probe) in `tests/network_policy_nft.rs`.

pub mod compile;
pub mod enforce;
pub mod explain;
pub mod metrics;
pub mod nft;
pub mod selector;
pub mod watch;

pub use compile::{
    Cluster, Compiled, Direction, IpBlock, NamedPort, Peers, PodView, Ports, Protocol, Rule,
    RuleSource, Verdict, compile, compile_all, connection_allowed,
};
pub use explain::{DirectionCounts, Explanation};
