//! The chain of one isolated direction of one local pod, and the named sets its rules match
//! (see the parent module's docs for the ruleset's shape).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::reporting::Reporting;
use super::text::{comment, ident, merge, proto, range, span4, span6, subtract};
use super::{Chain, LocalPod, PolicyType, Ruleset, Set};
use crate::compile::{Peers, Ports, Protocol, Rule, RuleSource};

impl Ruleset {
    pub(super) fn set(&mut self, name: &str, kind: &str, interval: bool, elements: Vec<String>) {
        self.sets.insert(
            name.to_owned(),
            Set {
                kind: kind.to_owned(),
                interval,
                elements,
            },
        );
    }

    /// Declares a peer set of a policy rule (`part` of the rule's sets, `shared`) and returns its
    /// name: the rule's own name, which every pod the policy selects uses (declared by the first,
    /// the same for the others), unless a pod's render of it differs (never so today: a rule's
    /// peers do not depend on the pod it selects), in which case the chain keeps a set of its own
    /// (`<chain>_r<j>_<part>`), so sharing never changes a verdict.
    fn peer_set(
        &mut self,
        (shared, chain, j): (&str, &str, usize),
        part: &str,
        kind: &str,
        interval: bool,
        elements: Vec<String>,
    ) -> String {
        let name = format!("{shared}_{part}");
        let same = |s: &Set| s.kind == kind && s.interval == interval && s.elements == elements;
        let name = match self.sets.get(&name) {
            None => name,
            Some(s) if same(s) => return name,
            Some(_) => format!("{chain}_r{j}_{part}"),
        };
        self.set(&name, kind, interval, elements);
        name
    }

    pub(super) fn chain(
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
            // The peers' sets are the policy rule's, shared by every pod it selects.
            let shared = rule_sets(dir, &rule.source);
            // Each way a peer can match is a prefix of the rule's lines: none (every peer), or
            // per family, the pods' addresses and the blocks' ranges. Each way comes with the
            // family it matches (`None`: both).
            let peers: Vec<(Option<Family>, String)> = match &rule.peers {
                Peers::Any => vec![(None, String::new())],
                Peers::Listed { pods, blocks } => {
                    let (mut pods4, mut pods6) = (Vec::new(), Vec::new());
                    for ip in pods {
                        match ip {
                            IpAddr::V4(a) => pods4.push(a.to_string()),
                            IpAddr::V6(a) => pods6.push(a.to_string()),
                        }
                    }
                    // `ipBlock`s, their `except`s cut out (an `except` of the other family cuts
                    // nothing); `None` for a family no block is of.
                    let (mut blocks4, mut blocks6) = (None::<Vec<_>>, None::<Vec<_>>);
                    for b in blocks {
                        match b.cidr {
                            IpNet::V4(net) => blocks4.get_or_insert_default().extend(subtract(
                                span4(net),
                                b.except.iter().filter_map(|e| match e {
                                    IpNet::V4(e) => Some(span4(*e)),
                                    IpNet::V6(_) => None,
                                }),
                            )),
                            IpNet::V6(net) => blocks6.get_or_insert_default().extend(subtract(
                                span6(net),
                                b.except.iter().filter_map(|e| match e {
                                    IpNet::V6(e) => Some(span6(*e)),
                                    IpNet::V4(_) => None,
                                }),
                            )),
                        }
                    }
                    let blocks4 = blocks4.map(|r| merge(r).into_iter().map(range).collect());
                    let blocks6 = blocks6.map(|r| merge(r).into_iter().map(range).collect());
                    let mut prefixes = Vec::new();
                    for (family, pods, blocks_of) in
                        [(Family::V4, pods4, blocks4), (Family::V6, pods6, blocks6)]
                    {
                        // Pods' addresses: a plain set, not an interval one. `nft` reads every
                        // interval set's elements back from the kernel before it changes one, so
                        // thousands of peer pods there would make each `add element` cost
                        // seconds. A rule whose selectors match no pod of a family keeps that
                        // family's (empty) set, so a pod that comes is an element added, not a
                        // chain refilled.
                        if !pods.is_empty() || blocks.is_empty() {
                            let part = format!("pods{}", family.suffix());
                            let name = self.peer_set(
                                (&shared, chain, j),
                                &part,
                                family.addr(),
                                false,
                                pods,
                            );
                            uses.insert(name.clone());
                            prefixes.push((Some(family), format!("{} @{name} ", family.peer(dir))));
                        }
                        // The blocks of the family: few ranges, an interval set.
                        if let Some(elements) = blocks_of {
                            let part = format!("blocks{}", family.suffix());
                            let name = self.peer_set(
                                (&shared, chain, j),
                                &part,
                                family.addr(),
                                true,
                                elements,
                            );
                            uses.insert(name.clone());
                            prefixes.push((Some(family), format!("{} @{name} ", family.peer(dir))));
                        }
                    }
                    prefixes
                }
            };
            // Each way the ports can match, as the middle of a line.
            let mut port_matches = Vec::new();
            match &rule.ports {
                Ports::Any => port_matches.push((None, String::new())),
                Ports::Listed {
                    ranges,
                    protocols,
                    per_peer,
                } => {
                    if !protocols.is_empty() {
                        let list: Vec<&str> = protocols.iter().map(|p| proto(*p)).collect();
                        port_matches
                            .push((None, format!("meta l4proto {{ {} }} ", list.join(", "))));
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
                        port_matches.push((None, format!("meta l4proto . th dport @{name} ")));
                    }
                    // Egress named ports, resolved on each peer pod: per family, a set of
                    // `address . protocol . port`.
                    for family in [Family::V4, Family::V6] {
                        let named: BTreeSet<String> = per_peer
                            .iter()
                            .filter(|(ip, _, _)| ip.is_ipv6() == (family == Family::V6))
                            .map(|(ip, p, port)| format!("{ip} . {} . {port}", proto(*p)))
                            .collect();
                        if named.is_empty() {
                            continue;
                        }
                        let part = format!("named{}", family.suffix());
                        let kind = format!("{} . inet_proto . inet_service", family.addr());
                        let elements = named.into_iter().collect();
                        let name =
                            self.peer_set((&shared, chain, j), &part, &kind, false, elements);
                        uses.insert(name.clone());
                        port_matches.push((
                            Some(family),
                            format!("{} . meta l4proto . th dport @{name} ", family.peer(dir)),
                        ));
                    }
                }
            }
            // Decision reporting (`super::super::decisions`): the rule's counter, its log
            // statement.
            if let Some((name, about)) =
                reporting.rule_counter(chain, &pod.veth, dir, j, &rule.source)
            {
                uses.insert(name.clone());
                self.counters.insert(name, comment(&about));
            }
            let report = reporting.allow_statements(chain, &pod.veth, dir, j);
            // Every peer match with every ports match of a family they share (an IPv4 peer's
            // line cannot also match an IPv6 named port: no packet is both).
            for (peer_family, peer) in &peers {
                for (_, ports) in port_matches
                    .iter()
                    .filter(|(f, _)| peer_family.is_none() || f.is_none() || f == peer_family)
                {
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

/// An address family of the peers' sets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    /// The sets' address type.
    fn addr(self) -> &'static str {
        match self {
            Self::V4 => "ipv4_addr",
            Self::V6 => "ipv6_addr",
        }
    }
    /// What a set's name ends with: nothing for IPv4 (the names an IPv4-only ruleset always had),
    /// `6` for IPv6.
    fn suffix(self) -> &'static str {
        match self {
            Self::V4 => "",
            Self::V6 => "6",
        }
    }
    /// The peer's address of this family: where the packet comes from (ingress) or goes to
    /// (egress). A line matching it matches packets of this family only.
    fn peer(self, dir: PolicyType) -> &'static str {
        match (self, dir) {
            (Self::V4, PolicyType::Ingress) => "ip saddr",
            (Self::V4, PolicyType::Egress) => "ip daddr",
            (Self::V6, PolicyType::Ingress) => "ip6 saddr",
            (Self::V6, PolicyType::Egress) => "ip6 daddr",
        }
    }
}

/// The name prefix of the peer sets of policy rule `source` in direction `dir`:
/// `<in|eg>_<policy>_<hash>_r<index>`, the policy's `namespace/name` made a name and cut to 24
/// characters to be read, and a hash of the whole (64-bit FNV-1a, stable across runs and
/// versions) to tell apart policies cut alike: about 60 bytes with a set's part, well within
/// `nft`'s limit on names.
pub(super) fn rule_sets(dir: PolicyType, source: &RuleSource) -> String {
    let readable: String = ident(&source.policy).chars().take(24).collect();
    let key = format!("{}\0{}\0{}", source.policy, dir.word(), source.index);
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}_{readable}_{hash:016x}_r{}", dir.short(), source.index)
}
