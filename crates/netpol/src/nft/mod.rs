//! The compiled policies of a node's pods, rendered into the nftables ruleset that enforces them
//! (issue 28, the kernel half): one table of its own, `inet eniipam_policy`, so the SNAT/NodePort
//! keeper (table `ip eniipam`) never fights it, loaded whole as one transaction.
//!
//! The ruleset, for the local pods, each known by its host veth:
//! - three base chains ([`base`]): `prerouting` (priority raw) ties each local pod's veth to its
//!   own addresses (a spoofed source is counted and dropped); `forward` and `output` judge new
//!   connections, pod traffic the node routes and what leaves through local-out with a pod's
//!   source (kube-proxy's IPVS mode). Each accepts `ct state established,related` first: replies
//!   and ICMP errors of an allowed connection follow it, whatever the policies say of the reverse
//!   direction. (A connection already open when a policy changes keeps flowing: the new rules
//!   judge new connections only, as conntrack-based enforcers do.) Then a pod reaching itself is
//!   accepted (a pod cannot block access to itself), and verdict maps dispatch to the pods'
//!   chains: by veth (`egress_dispatch`, `ingress_dispatch`) and, in `output`, by source address
//!   (`egress_by_addr`). An open direction has no chain and no map element;
//! - an isolated direction's chain holds one rule per way a policy rule can match (a whole
//!   protocol, numbered ports and ranges, egress named ports per peer) and ends in `drop`. A
//!   matching rule `return`s rather than `accept`s: an accept inside a jumped-to chain would end
//!   the base chain, and a pod-to-pod packet must still meet the server's ingress chain after the
//!   client's egress chain said yes (a connection needs both, as the model says). Each verdict
//!   counts in the chain's named counters, `<chain>_allowed` and `<chain>_denied` (new
//!   connections only; read back with [`parse_counters`]); rendered by [`render_with`], the
//!   daemon's way, each rule also counts in its own `<chain>_r<j>` and the chain logs its
//!   decisions to NFLOG (`super::decisions`, one statement on the allowing lines and one line
//!   before the `drop`);
//! - peers and ports live in named sets, so they can later be updated in place, each family in
//!   sets of its own (a set has one type) matched by lines of its own (`ip saddr`/`ip daddr` for
//!   IPv4, `ip6 saddr`/`ip6 daddr` for IPv6; a line matches packets of its family only): the
//!   addresses of a rule's selected pods are a set of `ipv4_addr` (`_pods`) and one of
//!   `ipv6_addr` (`_pods6`), its `ipBlock`s (an `except` already cut out of the CIDR) an interval
//!   set per family a block is of (`_blocks`, `_blocks6`) (the pods' sets are not interval sets:
//!   `nft` reads every interval set's elements back before it changes one, which at thousands of
//!   peer pods costs seconds per change); ports and ranges an interval set of
//!   `inet_proto . inet_service`; egress named ports, resolved on each peer pod, a set of
//!   `ipv4_addr . inet_proto . inet_service` (`_named`) and one of
//!   `ipv6_addr . inet_proto . inet_service` (`_named6`). A dual-stack peer is in both families'
//!   sets, so a rule naming it allows it over either. The peer sets are the policy rule's, shared
//!   by every local pod the policy selects (`<in|eg>_<policy>_<hash>_r<index>_pods`, ...: a peer
//!   that comes is one element added, whatever the number of pods); the ports' set stays the
//!   chain's (`<chain>_r<j>_ports`: an ingress named port is looked up in the selected pod);
//! - every chain and rule carries a comment naming the pod or the policy rule
//!   (`x/p ingress[0]`), for `nft list` and `eniipamctl policy` later.
//!
//! [`render`] makes a [`Ruleset`]: the table's sets, maps, counters and chains by name. Its
//! [`Ruleset::script`] makes the kernel's table exactly this one in one `nft -f -` transaction
//! (declare, delete, define); [`Ruleset::update_script`] takes the kernel there from the ruleset
//! last loaded, also in one transaction, changing set elements in place and refilling only the
//! chains that changed (a peer pod coming or going is an `add element`/`delete element`). Either
//! is loaded through `host::Nft::apply`, the same `nft` binary and transaction the SNAT keeper
//! uses, so no packet sees a half-built table.
//!
//! IPv4 and IPv6 alike: the base chain hooks both families (table family `inet`) and
//! dispatches by interface, and every peer set has its IPv6 twin. The daemon loads it through
//! `super::enforce`; `tests/network_policy_nft.rs` loads it into network namespaces and checks the
//! kernel's verdicts against the model's, over IPv4, IPv6 and dual-stack pods.
//!
//! `base` holds the base chains and the sets and maps they read, `chain` renders an isolated
//! direction's chain and its sets, `update` writes the scripts, `check` compares the kernel's table
//! with the one loaded, `counters` reads the counters back, and `text` holds the pieces: names and
//! comments made safe for `nft`, address and port ranges cut (an `except`) and merged (an interval
//! set refuses overlapping elements), for both families.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::compile::{Compiled, Direction};

mod base;
mod chain;
mod check;
mod counters;
pub mod reporting;
mod text;
mod update;
pub use base::{BASE_CHAINS, BaseChain, SPOOFED, spoofed_packets};
pub use check::{base_chain_differs, chains_differ, maps_differ};
pub(crate) use counters::table_counters;
pub use counters::{CounterReading, CounterVerdict, parse_counters};
use reporting::Reporting;
use text::{ident, is_ifname};
pub use update::Changes;

/// The table's name (family `inet`).
pub const TABLE: &str = "eniipam_policy";

/// One pod on this node: its name (`namespace/name`, for comments), its host veth, its own
/// addresses (the only sources its veth may carry, [`base`]) and its policy.
#[derive(Clone, Debug)]
pub struct LocalPod {
    pub name: String,
    pub veth: String,
    pub ips: Vec<IpAddr>,
    pub compiled: Compiled,
}

/// What [`render`] made: the table's objects by name, so that two rulesets can be compared and
/// the kernel taken from one to the other in place ([`Ruleset::update_script`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// The named sets of peers and ports.
    pub sets: BTreeMap<String, Set>,
    /// The named counters, two per chain (`<chain>_allowed`, `<chain>_denied`), and one per
    /// policy rule when reported (`<chain>_r<j>`, `super::decisions`): name → comment.
    pub counters: BTreeMap<String, String>,
    /// The chains of isolated directions (the base chains, [`BASE_CHAINS`], are not among them).
    pub chains: BTreeMap<String, Chain>,
    /// The verdict maps the base chains dispatch by (`<key type> : verdict`, each element
    /// `<key> : jump <chain>`): a pod's veth or address to its chains ([`base`]).
    pub maps: BTreeMap<String, Set>,
}

/// A named set: its type, whether it holds ranges, and its elements as `nft` spells them (ranges
/// already merged, so an element's text is its identity in the kernel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub kind: String,
    pub interval: bool,
    pub elements: Vec<String>,
}

/// A regular chain: its comment, its rules in order (each as `nft add rule` takes it), and the
/// sets and counters those rules use (which cannot be deleted while a rule refers to them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub comment: String,
    pub rules: Vec<String>,
    pub uses: BTreeSet<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    #[error("pod {pod}: host veth {veth:?} is not an interface name (1-15 of [A-Za-z0-9._@:-])")]
    BadVeth { pod: String, veth: String },
    #[error("pods {first} and {second} both name host veth {veth:?}")]
    SharedVeth {
        veth: String,
        first: String,
        second: String,
    },
}

/// Renders the ruleset enforcing `pods`' policies (see the module docs).
pub fn render(pods: &[LocalPod]) -> Result<Ruleset, RenderError> {
    render_with(pods, &Reporting::default())
}

/// [`render`], each isolated chain also reporting its decisions as `reporting` says (per-rule
/// counters, NFLOG statements: `super::decisions`).
pub fn render_with(pods: &[LocalPod], reporting: &Reporting) -> Result<Ruleset, RenderError> {
    let mut seen: BTreeMap<String, &LocalPod> = BTreeMap::new();
    for pod in pods {
        if !is_ifname(&pod.veth) {
            return Err(RenderError::BadVeth {
                pod: pod.name.clone(),
                veth: pod.veth.clone(),
            });
        }
        // Chain names keep [A-Za-z0-9_] of the veth: two veths must not meet there either.
        if let Some(first) = seen.insert(ident(&pod.veth), pod) {
            return Err(RenderError::SharedVeth {
                veth: pod.veth.clone(),
                first: first.name.clone(),
                second: pod.name.clone(),
            });
        }
    }
    let mut out = Ruleset::default();
    base::add_pod_sets(&mut out, pods);
    for pod in pods {
        for (dir, compiled) in [
            (PolicyType::Egress, &pod.compiled.egress),
            (PolicyType::Ingress, &pod.compiled.ingress),
        ] {
            let Direction::Isolated { policies, rules } = compiled else {
                continue;
            };
            let chain = format!("{}_{}", dir.short(), ident(&pod.veth));
            out.chain(pod, dir, &chain, (policies, rules), reporting);
            base::dispatch(&mut out, pod, dir, &chain);
        }
    }
    Ok(out)
}

/// A direction of a pod's traffic, as `spec.policyTypes` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyType {
    Ingress,
    Egress,
}

impl PolicyType {
    /// `ingress` or `egress`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
    /// The prefix of its chains' names.
    fn short(self) -> &'static str {
        match self {
            Self::Ingress => "in",
            Self::Egress => "eg",
        }
    }
}

#[cfg(test)]
mod tests;
