//! What `eniipamctl policy <pod>` shows: the verdicts that apply to a pod of this node and why
//! ([`Explanation`]), with each rule's peers and ports in words ([`peers_text`], [`ports_text`]),
//! and the `ipBlock`s that name the cluster's Service addresses ([`service_cidr_warnings`]).

use ipnet::IpNet;

use super::compile::{Compiled, Direction, Peers, Ports, Protocol};
use super::nft::LocalPod;

/// What applies to one pod, as the enforcer last put it in the kernel.
#[derive(Clone, Debug, Default)]
pub struct Explanation {
    /// Enforcement is on on this node.
    pub enforcing: bool,
    /// The pod, its veth and its compiled policy, when it is on this node.
    pub pod: Option<LocalPod>,
    /// What the rules cannot enforce for this pod.
    pub not_enforced: Vec<String>,
    /// Why the last sync failed, when it did.
    pub last_error: Option<String>,
    /// New connections counted by the kernel: (ingress, egress) × (allowed, denied).
    pub counts: DirectionCounts,
}

/// New connections a pod's chains allowed and denied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectionCounts {
    pub ingress_allowed: u64,
    pub ingress_denied: u64,
    pub egress_allowed: u64,
    pub egress_denied: u64,
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// A rule's peers in words: `any`, or addresses and blocks (`10.0.0.0/16 except 10.0.1.0/24`).
pub fn peers_text(peers: &Peers) -> Vec<String> {
    match peers {
        Peers::Any => vec!["any".into()],
        Peers::Listed { pods, blocks } => pods
            .iter()
            .map(ToString::to_string)
            .chain(blocks.iter().map(|b| {
                if b.except.is_empty() {
                    b.cidr.to_string()
                } else {
                    let except: Vec<String> = b.except.iter().map(ToString::to_string).collect();
                    format!("{} except {}", b.cidr, except.join(", "))
                }
            }))
            .collect(),
    }
}

/// A rule's ports in words: `any`, `sctp` (every port), `tcp/80`, `udp/80-90`, and named ports
/// resolved on a peer (`tcp/80 to 10.0.0.5`).
pub fn ports_text(ports: &Ports) -> Vec<String> {
    match ports {
        Ports::Any => vec!["any".into()],
        Ports::Listed {
            ranges,
            protocols,
            per_peer,
        } => protocols
            .iter()
            .map(|p| proto(*p).to_owned())
            .chain(ranges.iter().map(|r| {
                if r.first == r.last {
                    format!("{}/{}", proto(r.protocol), r.first)
                } else {
                    format!("{}/{}-{}", proto(r.protocol), r.first, r.last)
                }
            }))
            .chain(
                per_peer
                    .iter()
                    .map(|(ip, p, port)| format!("{}/{port} to {ip}", proto(*p))),
            )
            .collect(),
    }
}

/// The rules of `compiled` whose `ipBlock` overlaps one of the cluster's Service CIDRs, each as a
/// warning naming the rule, the block and the CIDR.
///
/// eniipam judges a connection after kube-proxy's DNAT: a pod's egress to a Service is judged on
/// the backend pod's address, never on the Service's. aws-node's agent judged egress before the
/// DNAT, so a policy written for it, allowing egress to the Service CIDR, allows nothing here
/// (allow the backends instead). No packet comes *from* a Service address either, so such a block
/// in an ingress rule matches nothing.
pub fn service_cidr_warnings(compiled: &Compiled, service_cidrs: &[IpNet]) -> Vec<String> {
    let overlaps = |a: &IpNet, b: &IpNet| a.contains(&b.network()) || b.contains(&a.network());
    let mut out = Vec::new();
    for (word, direction) in [("ingress", &compiled.ingress), ("egress", &compiled.egress)] {
        let Direction::Isolated { rules, .. } = direction else {
            continue;
        };
        for rule in rules {
            let Peers::Listed { blocks, .. } = &rule.peers else {
                continue;
            };
            for block in blocks {
                for cidr in service_cidrs.iter().filter(|c| overlaps(c, &block.cidr)) {
                    let why = if word == "egress" {
                        "egress is judged after the Service's DNAT, on the backend pod's address \
                         (aws-node judged the Service's address): allow the backend pods instead"
                    } else {
                        "no packet comes from a Service address"
                    };
                    out.push(format!(
                        "{} {word}[{}]: ipBlock {} overlaps the Service CIDR {cidr}: {why}",
                        rule.source.policy, rule.source.index, block.cidr
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::compile::{IpBlock, PortRange, Rule, RuleSource};
    use super::*;

    #[test]
    fn a_block_inside_a_service_cidr_is_named_with_its_rule() {
        let rule = |index, cidr: &str| Rule {
            source: RuleSource {
                policy: "x/to-services".into(),
                index,
            },
            peers: Peers::Listed {
                pods: BTreeSet::new(),
                blocks: vec![IpBlock {
                    cidr: cidr.parse().unwrap(),
                    except: vec![],
                }],
            },
            ports: Ports::Any,
        };
        let compiled = Compiled {
            ingress: Direction::Open,
            egress: Direction::Isolated {
                policies: vec!["x/to-services".into()],
                // Inside, around, and beside the Service CIDR.
                rules: vec![
                    rule(0, "10.100.0.10/32"),
                    rule(1, "10.0.0.0/8"),
                    rule(2, "192.168.0.0/16"),
                ],
            },
            problems: vec![],
        };
        let cidrs: Vec<IpNet> = vec!["10.100.0.0/16".parse().unwrap()];
        let w = service_cidr_warnings(&compiled, &cidrs);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("x/to-services egress[0]: ipBlock 10.100.0.10/32 overlaps the Service CIDR 10.100.0.0/16: egress is judged after the Service's DNAT"), "{w:?}");
        assert!(
            w[1].starts_with("x/to-services egress[1]: ipBlock 10.0.0.0/8"),
            "{w:?}"
        );
        assert!(service_cidr_warnings(&compiled, &[]).is_empty());
    }

    #[test]
    fn rules_read_as_words() {
        let peers = Peers::Listed {
            pods: BTreeSet::from(["10.0.0.5".parse().unwrap()]),
            blocks: vec![IpBlock {
                cidr: "10.1.0.0/16".parse().unwrap(),
                except: vec!["10.1.2.0/24".parse().unwrap()],
            }],
        };
        assert_eq!(
            peers_text(&peers),
            ["10.0.0.5", "10.1.0.0/16 except 10.1.2.0/24"]
        );
        assert_eq!(peers_text(&Peers::Any), ["any"]);
        let ports = Ports::Listed {
            ranges: vec![
                PortRange {
                    protocol: Protocol::Tcp,
                    first: 80,
                    last: 80,
                },
                PortRange {
                    protocol: Protocol::Udp,
                    first: 80,
                    last: 90,
                },
            ],
            protocols: BTreeSet::from([Protocol::Sctp]),
            per_peer: BTreeSet::from([("10.0.0.5".parse().unwrap(), Protocol::Tcp, 81)]),
        };
        assert_eq!(
            ports_text(&ports),
            ["sctp", "tcp/80", "udp/80-90", "tcp/81 to 10.0.0.5"]
        );
    }
}
