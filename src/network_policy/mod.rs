//! Kubernetes NetworkPolicy (issue 28, `docs/network-policy.md`): which connections the cluster's
//! policies allow for this node's pods, and the nftables table that enforces it.
//!
//! - [`selector`]: label selectors (`matchLabels`, `matchExpressions`).
//! - [`compile`]: a pod's ingress and egress ([`compile()`], [`compile_all`] for the node's pods
//!   together, [`Compiled`]) and the verdict on one connection ([`connection_allowed`]); the
//!   semantics are in its docs.
//! - [`nft`]: the compiled policies of a node's pods rendered into table `inet eniipam_policy`
//!   (IPv4 and IPv6; base chains at prerouting against spoofed sources, forward and output),
//!   loaded whole or updated in place, and its verdict counters.
//! - [`watch`]: the cluster's NetworkPolicies, pods and namespaces, listed and watched.
//! - [`enforce`]: the engine, keeping the kernel's table in step with the cluster and the node's
//!   pods (through `host`'s `nft`).
//! - [`explain`]: what `eniipamctl policy <pod>` shows.
//! - [`decisions`]: decision logs (NFLOG) and per-rule counters: what the table reports of its
//!   verdicts, read back and mapped to pods and policy rules.
//!
//! The daemon's half (the sync task, a new pod's rules in force before its ADD returns) is
//! `crate::daemon`'s `network_policy`; the metrics are `crate::metrics::network_policy`.

pub mod compile;
pub mod decisions;
pub mod enforce;
pub mod explain;
pub mod nft;
pub mod selector;
pub mod watch;

pub use compile::{
    Cluster, Compiled, Direction, IpBlock, NamedPort, Peers, PodView, Ports, Protocol, Rule,
    RuleSource, Verdict, compile, compile_all, connection_allowed,
};
pub use explain::{DirectionCounts, Explanation};
