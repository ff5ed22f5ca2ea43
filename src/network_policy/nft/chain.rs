//! The chain of one isolated direction of one local pod, and the named sets its rules match
//! (see the parent module's docs for the ruleset's shape).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::text::{comment, merge, proto, range, subtract};
use super::{Chain, LocalPod, PolicyType, Ruleset, Set};
use crate::network_policy::compile::{Peers, Ports, Protocol, Rule};

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

    pub(super) fn chain(
        &mut self,
        pod: &LocalPod,
        dir: PolicyType,
        chain: &str,
        policies: &[String],
        rules: &[Rule],
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
            for peer in &peers {
                for ports in &port_matches {
                    lines.push(format!("{peer}{ports}{count}return comment \"{note}\""));
                }
            }
        }
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
