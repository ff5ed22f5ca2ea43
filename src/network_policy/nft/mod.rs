//! The compiled policies of a node's pods, rendered into the nftables ruleset that enforces them
//! (issue 28, the kernel half): one table of its own, `inet eniipam_policy`, so the SNAT/NodePort
//! keeper (table `ip eniipam`) never fights it, loaded whole as one transaction.
//!
//! The ruleset, for the local pods, each known by its host veth:
//! - a base chain `forward` (filter hook, policy accept) accepts `ct state established,related`
//!   first: replies and ICMP errors of an allowed connection follow it, whatever the policies say
//!   of the reverse direction. (A connection already open when a policy changes keeps flowing:
//!   the new rules judge new connections only, as conntrack-based enforcers do.) Then, per pod
//!   with an isolated direction, `iifname <veth> oifname <veth>` is accepted (the pod reaching
//!   itself through its Service: a pod cannot block access to itself), then `iifname <veth>`
//!   jumps to its egress chain and `oifname <veth>` to its ingress chain. An open direction has
//!   no chain and no jump;
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
//! - peers and ports live in named sets, so they can later be updated in place: the addresses of
//!   a rule's selected pods are a set of `ipv4_addr` (`_pods`), its `ipBlock`s (an `except`
//!   already cut out of the CIDR) an interval set of `ipv4_addr` (`_blocks`), each matched by a
//!   line of its own (the pods' set is not an interval set: `nft` reads every interval set's
//!   elements back before it changes one, which at thousands of peer pods costs seconds per
//!   change); ports and ranges an interval set of
//!   `inet_proto . inet_service`; egress named ports, resolved on each peer pod, a set of
//!   `ipv4_addr . inet_proto . inet_service`;
//! - every chain, jump and rule carries a comment naming the pod or the policy rule
//!   (`x/p ingress[0]`), for `nft list` and `eniipamctl policy` later.
//!
//! [`render`] makes a [`Ruleset`]: the table's sets, counters and chains by name. Its
//! [`Ruleset::script`] makes the kernel's table exactly this one in one `nft -f -` transaction
//! (declare, delete, define); [`Ruleset::update_script`] takes the kernel there from the ruleset
//! last loaded, also in one transaction, changing set elements in place and refilling only the
//! chains that changed (a peer pod coming or going is an `add element`/`delete element`). Either
//! is loaded through `host::Nft::apply`, the same `nft` binary and transaction the SNAT keeper
//! uses, so no packet sees a half-built table.
//!
//! IPv4 only: IPv6 peer addresses and blocks are left out of the sets (named in
//! [`Ruleset::not_enforced`]); an isolated pod's IPv6 traffic therefore meets the chain's `drop`
//! unless a rule allows every peer. The daemon loads it through `super::enforce`;
//! `tests/network_policy_nft.rs` loads it into network namespaces and checks the kernel's verdicts
//! against the model's.
//!
//! `update` writes the scripts, `counters` reads the counters back, and `text` holds the pieces: names and comments made safe for `nft`, address and port ranges cut
//! (an `except`) and merged (an interval set refuses overlapping elements).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::compile::{Compiled, Direction, Peers, Ports, Protocol, Rule};
use super::decisions::Reporting;

mod check;
mod counters;
mod text;
mod update;
pub use check::{base_chain_differs, chains_differ};
pub use counters::{CounterReading, CounterVerdict, parse_counters};
use text::{comment, ident, is_ifname, merge, proto, range, subtract};
pub use update::Changes;

/// The table's name (family `inet`).
pub const TABLE: &str = "eniipam_policy";

/// One pod on this node: its name (`namespace/name`, for comments), its host veth and its policy.
#[derive(Clone, Debug)]
pub struct LocalPod {
    pub name: String,
    pub veth: String,
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
    /// The chains of isolated directions (the base chain `forward` is not one of them).
    pub chains: BTreeMap<String, Chain>,
    /// The base chain's rules after its `ct state established,related accept`, in order: per
    /// isolated pod, its hairpin accept and its jumps.
    pub jumps: Vec<String>,
    /// Parts of the policies this ruleset cannot enforce (IPv6 peers), each naming the pod and rule.
    pub not_enforced: Vec<String>,
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
    for pod in pods {
        let isolated = [&pod.compiled.egress, &pod.compiled.ingress]
            .into_iter()
            .any(|d| matches!(d, Direction::Isolated { .. }));
        if isolated {
            // Hairpin: the pod reaching itself through its Service (DNAT to its own address)
            // comes in and goes out by its own veth; a pod cannot block access to itself. Only
            // its own veth both ways: another pod sending from its address meets its chains.
            out.jumps.push(format!(
                "iifname \"{0}\" oifname \"{0}\" accept comment \"{1}\"",
                pod.veth,
                comment(&format!(
                    "{} to itself: a pod cannot block access to itself",
                    pod.name
                ))
            ));
        }
        for (dir, compiled, hook) in [
            (PolicyType::Egress, &pod.compiled.egress, "iifname"),
            (PolicyType::Ingress, &pod.compiled.ingress, "oifname"),
        ] {
            let Direction::Isolated { policies, rules } = compiled else {
                continue;
            };
            let chain = format!("{}_{}", dir.short(), ident(&pod.veth));
            out.chain(pod, dir, &chain, (policies, rules), reporting);
            out.jumps.push(format!(
                "{hook} \"{}\" jump {chain} comment \"{}\"",
                pod.veth,
                comment(&format!("{} {}", pod.name, dir.word()))
            ));
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
    /// The peer's address: where the packet comes from (ingress) or goes to (egress).
    fn peer(self) -> &'static str {
        match self {
            Self::Ingress => "ip saddr",
            Self::Egress => "ip daddr",
        }
    }
}

impl Ruleset {
    fn set(&mut self, name: &str, kind: &str, interval: bool, elements: Vec<String>) {
        self.sets.insert(
            name.to_owned(),
            Set {
                kind: kind.to_owned(),
                interval,
                elements,
            },
        );
    }

    fn chain(
        &mut self,
        pod: &LocalPod,
        dir: PolicyType,
        chain: &str,
        (policies, rules): (&[String], &[Rule]),
        reporting: &Reporting,
    ) {
        let (allowed, denied) = (format!("{chain}_allowed"), format!("{chain}_denied"));
        // Every verdict of the chain counts in its two counters (new connections only: replies
        // and established flows were accepted before the jump).
        let count = format!("counter name \"{allowed}\" ");
        let mut uses = BTreeSet::from([allowed.clone(), denied.clone()]);
        let mut lines = Vec::new();
        for (j, rule) in rules.iter().enumerate() {
            let what = format!(
                "{} {}[{}]",
                rule.source.policy,
                dir.word(),
                rule.source.index
            );
            let note = comment(&what);
            // Each way a peer can match is a prefix of the rule's lines: none (every peer), the
            // pods' addresses, the blocks' ranges.
            let peers: Vec<String> = match &rule.peers {
                Peers::Any => vec![String::new()],
                Peers::Listed { pods, blocks } => {
                    let mut addresses = Vec::new();
                    let mut v4 = Vec::new();
                    let mut v6 = 0;
                    for ip in pods {
                        match ip {
                            IpAddr::V4(a) => addresses.push(a.to_string()),
                            IpAddr::V6(_) => v6 += 1,
                        }
                    }
                    for b in blocks {
                        match b.cidr {
                            IpNet::V4(net) => v4.extend(subtract(
                                (u32::from(net.network()), u32::from(net.broadcast())),
                                b.except.iter().filter_map(|e| match e {
                                    IpNet::V4(e) => {
                                        Some((u32::from(e.network()), u32::from(e.broadcast())))
                                    }
                                    IpNet::V6(_) => None,
                                }),
                            )),
                            IpNet::V6(_) => v6 += 1,
                        }
                    }
                    if v6 > 0 {
                        self.not_enforced.push(format!(
                            "pod {}: {what}: {v6} IPv6 peer address(es) or block(s) (IPv4 only)",
                            pod.name
                        ));
                    }
                    let mut prefixes = Vec::new();
                    // Pods' addresses: a plain set, not an interval one. `nft` reads every
                    // interval set's elements back from the kernel before it changes one, so
                    // thousands of peer pods there would make each `add element` cost seconds.
                    // A rule whose selectors match no pod keeps its (empty) set, so a pod that
                    // comes is an element added, not a chain refilled.
                    if !addresses.is_empty() || blocks.is_empty() {
                        let name = format!("{chain}_r{j}_pods");
                        self.set(&name, "ipv4_addr", false, addresses);
                        uses.insert(name.clone());
                        prefixes.push(format!("{} @{name} ", dir.peer()));
                    }
                    // `ipBlock`s, their `except`s cut out: few ranges, an interval set.
                    if !blocks.is_empty() {
                        let name = format!("{chain}_r{j}_blocks");
                        let elements: Vec<String> = merge(v4).into_iter().map(range).collect();
                        self.set(&name, "ipv4_addr", true, elements);
                        uses.insert(name.clone());
                        prefixes.push(format!("{} @{name} ", dir.peer()));
                    }
                    prefixes
                }
            };
            // Each way the ports can match, as the middle of a line.
            let mut port_matches = Vec::new();
            match &rule.ports {
                Ports::Any => port_matches.push(String::new()),
                Ports::Listed {
                    ranges,
                    protocols,
                    per_peer,
                } => {
                    if !protocols.is_empty() {
                        let list: Vec<&str> = protocols.iter().map(|p| proto(*p)).collect();
                        port_matches.push(format!("meta l4proto {{ {} }} ", list.join(", ")));
                    }
                    if !ranges.is_empty() {
                        let mut by_proto: BTreeMap<Protocol, Vec<(u32, u32)>> = BTreeMap::new();
                        for r in ranges {
                            by_proto
                                .entry(r.protocol)
                                .or_default()
                                .push((u32::from(r.first), u32::from(r.last)));
                        }
                        let elements: Vec<String> = by_proto
                            .into_iter()
                            .flat_map(|(p, rs)| {
                                merge(rs).into_iter().map(move |(a, b)| {
                                    if a == b {
                                        format!("{} . {a}", proto(p))
                                    } else {
                                        format!("{} . {a}-{b}", proto(p))
                                    }
                                })
                            })
                            .collect();
                        let name = format!("{chain}_r{j}_ports");
                        self.set(&name, "inet_proto . inet_service", true, elements);
                        uses.insert(name.clone());
                        port_matches.push(format!("meta l4proto . th dport @{name} "));
                    }
                    let named: BTreeSet<String> = per_peer
                        .iter()
                        .filter_map(|(ip, p, port)| match ip {
                            IpAddr::V4(a) => Some(format!("{a} . {} . {port}", proto(*p))),
                            IpAddr::V6(_) => None,
                        })
                        .collect();
                    if named.len() < per_peer.len() {
                        self.not_enforced.push(format!(
                            "pod {}: {what}: named ports of IPv6 peers (IPv4 only)",
                            pod.name
                        ));
                    }
                    if !named.is_empty() {
                        let name = format!("{chain}_r{j}_named");
                        let elements: Vec<String> = named.into_iter().collect();
                        self.set(
                            &name,
                            "ipv4_addr . inet_proto . inet_service",
                            false,
                            elements,
                        );
                        uses.insert(name.clone());
                        port_matches
                            .push(format!("{} . meta l4proto . th dport @{name} ", dir.peer()));
                    }
                }
            }
            // Decision reporting (`super::decisions`): the rule's counter, its log statement.
            if let Some((name, about)) =
                reporting.rule_counter(chain, &pod.veth, dir, j, &rule.source)
            {
                uses.insert(name.clone());
                self.counters.insert(name, comment(&about));
            }
            let report = reporting.allow_statements(chain, &pod.veth, dir, j);
            for peer in &peers {
                for ports in &port_matches {
                    lines.push(format!(
                        "{peer}{ports}{count}{report}return comment \"{note}\""
                    ));
                }
            }
        }
        lines.extend(reporting.deny_line(&pod.veth, dir));
        lines.push(format!(
            "counter name \"{denied}\" drop comment \"{}\"",
            comment(&format!(
                "{} {}: no rule of {} allows it",
                pod.name,
                dir.word(),
                policies.join(", ")
            ))
        ));
        // The veth leads the counters' comment: a comment longer than `nft` takes is cut at its
        // end, and `parse_counters` reads the veth back from it.
        let about = comment(&format!("{} {} {}", pod.veth, pod.name, dir.word()));
        self.counters.insert(allowed, about.clone());
        self.counters.insert(denied, about);
        self.chains.insert(
            chain.to_owned(),
            Chain {
                // Fixed for the chain's life (an `add chain` does not change a comment): the
                // policies that isolate it are named on its `drop`.
                comment: comment(&format!("{} {} ({})", pod.name, dir.word(), pod.veth)),
                rules: lines,
                uses,
            },
        );
    }
}

#[cfg(test)]
mod tests;
