//! Decision logs and per-rule counters (issue 47, operators' tools): which new connections the
//! node's NetworkPolicy rules denied (and, when asked, allowed), with the pod, the peer, the port
//! and the policy rule that decided, as the AWS network policy agent's policy event logs; and a
//! counter per policy rule (`eniipam_network_policy_rule_verdicts_total`).
//!
//! **In the kernel** ([`Reporting`], rendered into each isolated direction's chain by
//! `super::nft`):
//! - before the chain's final `drop`, one line `limit rate R/second burst 2R packets log prefix
//!   "eniipam deny <veth> <in|eg>" group G` ([`Reporting::deny_line`]): the first packet of a
//!   denied connection (and its retransmissions) is copied to NFLOG group `G`, at most `R` a second
//!   per chain. It is a line of its own, without a verdict: a `limit` that is over does not stop
//!   the `drop` that follows;
//! - on each line that allows (`return`), a named counter of the policy rule,
//!   `<chain>_r<j>` ([`Reporting::allow_statements`]), and, with allowed connections logged,
//!   `log prefix "eniipam allow <veth> <in|eg> r<j>" group G` (no kernel limit there: a `limit` on
//!   an allowing line would send what it drops to the chain's `drop`; the daemon limits);
//! - the chain's pod (its veth) and direction are in the prefix, the rule by its index `j` in the
//!   direction's compiled rules; [`DecisionMap`] maps them back to `namespace/name`, the policy and
//!   its rule (`x/p ingress[0]`), from the pods of the sync last put in force.
//!
//! **In the daemon**: `nflog` reads the group over netlink (`NETLINK_NETFILTER`, no crate: the
//! few attributes are read here), [`DecisionMap::decide`] turns a packet into a [`Decision`],
//! `limit` keeps the node's log to a rate (what it drops is counted and said once a second), and
//! `file` writes JSON lines to a size-rotated file. `counters` reads the per-rule counters back
//! for the metric; `task` is the daemon-side task that runs them (started by the enforcer).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Serialize;

use super::compile::{Direction, RuleSource};
use super::nft::reporting::PREFIX;
pub use super::nft::reporting::{LogTap, Logged, Reporting};
use super::nft::{LocalPod, PolicyType};

pub mod counters;
pub mod file;
pub mod limit;
pub mod nflog;
pub(crate) mod task;

/// A log prefix read back: the verdict, the pod's veth, the direction, the rule's index (allowed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    pub allowed: bool,
    pub veth: String,
    pub direction: PolicyType,
    pub rule: Option<usize>,
}

impl Tag {
    /// Reads a prefix [`Reporting`] wrote; `None` for any other (another table's log statement).
    pub fn parse(prefix: &str) -> Option<Self> {
        let mut words = prefix.split_whitespace();
        if words.next()? != PREFIX {
            return None;
        }
        let allowed = match words.next()? {
            "allow" => true,
            "deny" => false,
            _ => return None,
        };
        let veth = words.next()?.to_owned();
        let direction = match words.next()? {
            "in" => PolicyType::Ingress,
            "eg" => PolicyType::Egress,
            _ => return None,
        };
        let rule = match (allowed, words.next()) {
            (true, Some(r)) => Some(r.strip_prefix('r')?.parse().ok()?),
            (false, None) => None,
            _ => return None,
        };
        words.next().is_none().then_some(Self {
            allowed,
            veth,
            direction,
            rule,
        })
    }
}

/// A packet's addresses and ports, as read from its IP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1/58 ICMP).
    pub protocol: u8,
    /// Ports of TCP, UDP and SCTP.
    pub ports: Option<(u16, u16)>,
}

/// One decision, as logged (a JSON line of the file; the fields of the daemon's log line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// `deny` or `allow`.
    pub verdict: &'static str,
    /// The node's pod whose policy decided (`namespace/name`), and its host veth.
    pub pod: String,
    pub veth: String,
    /// `ingress` (the peer connects to the pod) or `egress` (the pod connects to the peer).
    pub direction: &'static str,
    pub peer: IpAddr,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or the number.
    pub protocol: String,
    /// The destination port (TCP, UDP, SCTP).
    pub port: Option<u16>,
    pub src_port: Option<u16>,
    /// Allowed: the policy rule that allowed it (`x/p ingress[0]`).
    pub rule: Option<String>,
    /// Denied: the policies isolating the pod in that direction, none of whose rules allowed it.
    pub policies: Vec<String>,
}

/// What the table's chains stand for, from the pods of the sync in force: veth → pod and its
/// isolated directions.
#[derive(Clone, Debug, Default)]
pub struct DecisionMap {
    pods: BTreeMap<String, MappedPod>,
}

#[derive(Clone, Debug, Default)]
struct MappedPod {
    name: String,
    ingress: Option<MappedDirection>,
    egress: Option<MappedDirection>,
}

#[derive(Clone, Debug)]
struct MappedDirection {
    policies: Vec<String>,
    rules: Vec<RuleSource>,
}

impl DecisionMap {
    pub fn new(pods: &[LocalPod]) -> Self {
        let mapped = |d: &Direction| match d {
            Direction::Open => None,
            Direction::Isolated { policies, rules } => Some(MappedDirection {
                policies: policies.clone(),
                rules: rules.iter().map(|r| r.source.clone()).collect(),
            }),
        };
        Self {
            pods: pods
                .iter()
                .map(|p| {
                    let m = MappedPod {
                        name: p.name.clone(),
                        ingress: mapped(&p.compiled.ingress),
                        egress: mapped(&p.compiled.egress),
                    };
                    (p.veth.clone(), m)
                })
                .collect(),
        }
    }

    /// The rule `j` of `veth`'s `direction` (`x/p ingress[0]`), with its pod.
    pub fn rule(&self, veth: &str, direction: PolicyType, j: usize) -> Option<(&str, &RuleSource)> {
        let pod = self.pods.get(veth)?;
        let d = self.direction(pod, direction)?;
        Some((&pod.name, d.rules.get(j)?))
    }

    /// The policies isolating `veth`'s `direction`, with its pod.
    pub fn policies(&self, veth: &str, direction: PolicyType) -> Option<(&str, &[String])> {
        let pod = self.pods.get(veth)?;
        Some((&pod.name, &self.direction(pod, direction)?.policies))
    }

    fn direction<'a>(&self, pod: &'a MappedPod, d: PolicyType) -> Option<&'a MappedDirection> {
        match d {
            PolicyType::Ingress => pod.ingress.as_ref(),
            PolicyType::Egress => pod.egress.as_ref(),
        }
    }

    /// The decision a logged packet stands for; `None` when its chain is not in the map (a pod
    /// gone since, or a rule index past its rules: the table changed under the packet).
    pub fn decide(&self, tag: &Tag, flow: &Flow) -> Option<Decision> {
        let (pod, rule, policies) = if tag.allowed {
            let (pod, source) = self.rule(&tag.veth, tag.direction, tag.rule?)?;
            let rule = format!(
                "{} {}[{}]",
                source.policy,
                tag.direction.word(),
                source.index
            );
            (pod, Some(rule), Vec::new())
        } else {
            let (pod, policies) = self.policies(&tag.veth, tag.direction)?;
            (pod, None, policies.to_vec())
        };
        let peer = match tag.direction {
            PolicyType::Ingress => flow.src,
            PolicyType::Egress => flow.dst,
        };
        Some(Decision {
            verdict: if tag.allowed { "allow" } else { "deny" },
            pod: pod.to_owned(),
            veth: tag.veth.clone(),
            direction: tag.direction.word(),
            peer,
            src: flow.src,
            dst: flow.dst,
            protocol: protocol_name(flow.protocol),
            port: flow.ports.map(|p| p.1),
            src_port: flow.ports.map(|p| p.0),
            rule,
            policies,
        })
    }
}

fn protocol_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// The decision log's knobs (`network_policy_log*` in `docs/config.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    pub logged: Logged,
    pub group: u16,
    /// Decisions logged per second on the node, at most (also the kernel's per-chain rate).
    pub per_second: u32,
    /// JSON lines written here too, when set.
    pub file: Option<PathBuf>,
    /// The file is rotated at this size (to `<file>.1`, `<file>.2`, …).
    pub file_max_bytes: u64,
    /// Rotated files kept.
    pub file_keep: u32,
}

impl LogConfig {
    pub fn reporting(&self) -> Reporting {
        Reporting::new(self.logged, self.group, self.per_second)
    }
}

#[cfg(test)]
mod tests;
