//! Kubernetes NetworkPolicy (issue 28, `docs/network-policy.md`), whole: which connections the
//! cluster's policies allow for this node's pods, the nftables table that enforces it, the watches,
//! the enforcer that keeps the kernel in step, its decision logs and its metrics. One room (issue
//! 45): it does not depend on the daemon (`eniipam`); the daemon re-exports it as
//! `eniipam::network_policy`, gives it the node's pods through [`LocalPods`], and hands its
//! [`Enforcer`] to the IPAM service as the admission a new pod's ADD waits on, at construction.
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
//!   pods (through `eniipam-netfilter`'s `nft`).
//! - [`enforcer`]: the controller: the sync task, a new pod's rules in force before its ADD
//!   returns ([`Enforcer::admit`]), the table kept, the verdict counters read.
//! - [`explain`]: what `eniipamctl policy <pod>` shows.
//! - [`decisions`]: decision logs (NFLOG) and per-rule counters: what the table reports of its
//!   verdicts, read back and mapped to pods and policy rules, and the task that logs them.
//! - [`metrics`]: `eniipam_network_policy_*` ([`PolicyMetrics`]).

pub mod compile;
pub mod decisions;
pub mod enforce;
pub mod enforcer;
pub mod explain;
pub mod metrics;
pub mod nft;
pub mod selector;
pub mod watch;

pub use compile::{
    Cluster, Compiled, Direction, IpBlock, NamedPort, Peers, PodView, Ports, Protocol, Rule,
    RuleSource, Verdict, compile, compile_all, connection_allowed,
};
pub use enforcer::{AdmitError, Enforcer, LocalPods, Setup, remove_table, start};
pub use explain::{DirectionCounts, Explanation};
pub use metrics::PolicyMetrics;
