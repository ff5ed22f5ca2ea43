//! What `eniipamctl policy <pod>` shows: the verdicts that apply to a pod of this node and why
//! ([`Explanation`]), with each rule's peers and ports in words ([`peers_text`], [`ports_text`]).

use super::compile::{Peers, Ports, Protocol};
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::compile::{IpBlock, PortRange};
    use super::*;

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
