//! SNAT of pod egress, as the AWS VPC CNI does it: connections from pods to destinations outside the
//! VPC's CIDRs (and outside `snat_exclude_cidrs`) leave with eth0's primary IP, which is the address
//! that has a public IP behind an internet gateway. With `external_snat` (a NAT gateway does the
//! translation) none of this is installed and pods leave with their own VPC address.
//!
//! Two pieces (rendered by [`super::rules::desired_table`]):
//!
//! ```text
//! chain mark-pods   filter prerouting, priority dstnat + 10 (after kube-proxy's and portmap's DNAT)
//!   iifname "eni*" ct state new ip daddr != { VPC CIDRs, exclusions } fib daddr type != local
//!       ct mark set ct mark | 0x80          # "leave by eth0": rule 1024 fwmark 0x80 lookup main
//! chain pod-snat    nat postrouting, priority srcnat + 10 (after kube-proxy's and portmap's masquerade)
//!   ip daddr { VPC CIDRs, exclusions } return
//!   fib daddr type local return
//!   snat to <eth0 primary IP> fully-random  # `random` for hashrandom, nothing for none
//! ```
//!
//! With `ip_family = ipv6` and `ipv4_egress`, `pod-snat` starts with one more rule, whatever
//! `external_snat` says ([`egress_snat_rule`]):
//!
//! ```text
//!   ip saddr 169.254.172.0/22 snat to <eth0 primary IP> fully-random
//! ```
//!
//! It comes before the VPC-CIDR return because an IPv6-only pod's node-local IPv4 means nothing in
//! the VPC: a VPC destination could not answer it, so it is translated too. A NAT gateway cannot
//! translate a 169.254 source either, hence independent of `external_snat`. No mark is needed:
//! IPv6-only pods have no secondary ENI, so their IPv4 leaves by the main table anyway.
//!
//! **Network profiles' strict egress** (issue 44; `own_eni_egress`): a profile pod's host veth is
//! in link group [`eniipam_api::OWN_ENI_EGRESS_LINK_GROUP`] unless its profile asks for
//! `egressMode: standard`. The mark rule skips that group (`iifgroup != …`) and `pod-snat` returns
//! for it first (`iifgroup … return`; the kernel gives postrouting the input interface of
//! forwarded packets), so such a pod's connections to the internet, a peered VPC or on-premises
//! follow its `from <pod ip> lookup <ENI table>` rule and leave by its own ENI with its own address,
//! judged by its own security groups, as the VPC CNI's `POD_SECURITY_GROUP_ENFORCING_MODE=strict`.
//! [`strict_egress_problems`] checks a rendered or listed table for it.
//!
//! The mark matters for pods on a secondary ENI: their `from <pod ip> lookup <ENI table>` rule would
//! send the connection out of that ENI, and a packet leaving ethN with eth0's address is dropped by
//! EC2's source/destination check. The mark is set after destination NAT, so a pod's connection to a
//! ClusterIP is judged by the backend it was translated to (a VPC address: not marked, not SNATed),
//! never by the service address (the VPC CNI pitfall of marking before DNAT, issues #3563 and #3800).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::netfilter::{Action, Chain, ChainType, Hook, Match, Priority, Rule, SnatPorts};

/// The SNAT chain's name.
pub const SNAT_CHAIN: &str = "pod-snat";

/// Whether and how pod egress is SNATed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Snat {
    /// Destinations outside the VPC get eth0's primary IP as source.
    Node {
        /// Source port selection (`AWS_VPC_K8S_CNI_RANDOMIZESNAT`).
        ports: SnatPorts,
        /// Further destinations never SNATed (`AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`).
        exclude: Vec<Ipv4Net>,
    },
    /// Pods keep their own address; a NAT gateway translates (`AWS_VPC_K8S_CNI_EXTERNALSNAT=true`).
    External,
}

impl Snat {
    pub fn is_on(&self) -> bool {
        matches!(self, Self::Node { .. })
    }
}

/// The destinations never SNATed: the VPC's CIDRs and the exclusions, merged (overlaps and
/// neighbours collapse), so the sets in the rules are minimal and canonical.
pub fn never_snat(vpc_cidrs: &[Ipv4Net], exclude: &[Ipv4Net]) -> Vec<Ipv4Net> {
    let all: Vec<Ipv4Net> = vpc_cidrs
        .iter()
        .chain(exclude.iter())
        .map(|n| n.trunc())
        .collect();
    Ipv4Net::aggregate(&all)
}

/// Marks a pod's new connection to a destination that will be SNATed, so it leaves by eth0; pods
/// whose host veth is in link group `own_eni` (network profiles' strict egress) are left alone.
pub fn egress_mark_rule(
    veth_prefix: &str,
    never: &[Ipv4Net],
    mark: u32,
    own_eni: Option<u32>,
) -> Rule {
    let mut matches = vec![Match::IifNamePrefix(veth_prefix.to_owned())];
    if let Some(group) = own_eni {
        matches.push(Match::IifGroup {
            group,
            negate: true,
        });
    }
    matches.extend([
        Match::CtStateNew,
        Match::DaddrIn {
            nets: never.to_vec(),
            negate: true,
        },
        Match::DaddrLocal {
            on_iif: false,
            negate: true,
        },
    ]);
    Rule {
        matches,
        action: Action::CtMarkSet(mark),
        comment: Some("eniipam: pod egress to be SNATed leaves by the primary ENI".into()),
    }
}

/// Translates the node-local egress addresses of IPv6-only pods (`ipv6::egress`) to `to`, every
/// destination included (see the module docs).
pub fn egress_snat_rule(to: Ipv4Addr, ports: SnatPorts) -> Rule {
    Rule {
        matches: vec![Match::SaddrIn(Ipv4Net::new_assert(
            eniipam_api::egress::NETWORK,
            eniipam_api::egress::PREFIX_LEN,
        ))],
        action: Action::Snat { to, ports },
        comment: Some(
            "eniipam: IPv6-only pods' IPv4 egress to the primary ENI's primary IP".into(),
        ),
    }
}

/// The nat chain with the `rules` given (the egress rule, the pod SNAT rules, or both).
pub fn nat_chain(rules: Vec<Rule>) -> Chain {
    Chain {
        name: SNAT_CHAIN.into(),
        kind: ChainType::Nat,
        hook: Hook::Postrouting,
        // After kube-proxy's and portmap's masquerade (srcnat): the first chain to NAT a connection
        // decides, as KUBE-POSTROUTING does when it precedes AWS-SNAT-CHAIN-0 in iptables.
        priority: Priority::SrcNat(10),
        rules,
    }
}

/// The nat chain that translates pod egress to `to` (eth0's primary IP), except what comes in on an
/// interface of link group `own_eni`.
pub fn snat_chain(
    to: Ipv4Addr,
    never: &[Ipv4Net],
    ports: SnatPorts,
    own_eni: Option<u32>,
) -> Chain {
    nat_chain(snat_rules(to, never, ports, own_eni))
}

/// The rules of [`snat_chain`].
pub fn snat_rules(
    to: Ipv4Addr,
    never: &[Ipv4Net],
    ports: SnatPorts,
    own_eni: Option<u32>,
) -> Vec<Rule> {
    let own_eni = own_eni.map(|group| Rule {
        matches: vec![Match::IifGroup {
            group,
            negate: false,
        }],
        action: Action::Return,
        comment: Some("eniipam: strict-egress profile pods keep their address".into()),
    });
    own_eni
        .into_iter()
        .chain([
            Rule {
                matches: vec![Match::DaddrIn {
                    nets: never.to_vec(),
                    negate: false,
                }],
                action: Action::Return,
                comment: Some(
                    "eniipam: VPC and excluded destinations keep the pod's address".into(),
                ),
            },
            Rule {
                matches: vec![Match::DaddrLocal {
                    on_iif: false,
                    negate: false,
                }],
                action: Action::Return,
                comment: None,
            },
            Rule {
                matches: vec![],
                action: Action::Snat { to, ports },
                comment: Some("eniipam: SNAT to the primary ENI's primary IP".into()),
            },
        ])
        .collect()
}

/// What keeps a strict-egress profile pod's packet from leaving by eth0 and missing from `table`
/// (an `nft list table ip eniipam` listing, or [`super::netfilter::Table::render`]'s text):
/// every egress mark rule must skip link group [`eniipam_api::OWN_ENI_EGRESS_LINK_GROUP`], and in
/// `pod-snat` a return for that group must come before every SNAT of pod traffic (the IPv6-only
/// pods' `169.254.172.0/22` rule aside). Empty when the table keeps them out of SNAT and the mark
/// (a table without SNAT keeps them out too). For the profiles soak's checker and the data-path
/// tests.
pub fn strict_egress_problems(table: &str) -> Vec<String> {
    let group = eniipam_api::OWN_ENI_EGRESS_LINK_GROUP;
    let (skip, exempt) = (
        format!("iifgroup != {group} "),
        format!("iifgroup {group} "),
    );
    let mut problems = Vec::new();
    let mut chain = "";
    let mut exempted = false;
    for line in table.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("chain ") {
            chain = name.trim_end_matches(" {").trim();
            exempted = false;
        } else if line.contains("ct mark set") && line.contains("ip daddr != ") {
            if !line.contains(&skip) {
                problems.push(format!(
                    "chain {chain}: the egress mark does not skip link group {group}: {line}"
                ));
            }
        } else if chain == SNAT_CHAIN && line.starts_with(&exempt) && line.contains(" return") {
            exempted = true;
        } else if chain == SNAT_CHAIN
            && line.contains("snat to")
            && !line.starts_with("ip saddr ")
            && !exempted
        {
            problems.push(format!(
                "chain {chain}: SNAT before any return for link group {group}: {line}"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn never_snat_merges_the_vpc_and_the_exclusions() {
        assert_eq!(
            never_snat(
                &[n("10.0.0.0/16"), n("10.1.0.0/16")],
                &[n("10.0.5.0/24"), n("192.168.7.9/24")]
            ),
            vec![n("10.0.0.0/15"), n("192.168.7.0/24")]
        );
        // Excluding everything leaves one network that covers everything: nothing is SNATed.
        assert_eq!(
            never_snat(&[n("10.0.0.0/16")], &[n("0.0.0.0/0")]),
            vec![n("0.0.0.0/0")]
        );
    }

    #[test]
    fn the_chain_returns_for_the_vpc_then_snats() {
        let c = snat_chain(
            "10.0.0.4".parse().unwrap(),
            &[n("10.0.0.0/16")],
            SnatPorts::Prng,
            None,
        );
        let lines: Vec<String> = c.rules.iter().map(|r| r.to_string()).collect();
        assert!(
            lines[0].starts_with("ip daddr { 10.0.0.0/16 } return"),
            "{lines:?}"
        );
        assert_eq!(lines[1], "fib daddr type local return");
        assert!(
            lines[2].starts_with("snat to 10.0.0.4 fully-random"),
            "{lines:?}"
        );
        assert_eq!(c.priority.value(), 110);
    }

    #[test]
    fn the_egress_rule_matches_the_egress_range_and_snats() {
        let r = egress_snat_rule("10.0.0.4".parse().unwrap(), SnatPorts::Hashrandom);
        assert!(
            r.to_string()
                .starts_with("ip saddr 169.254.172.0/22 snat to 10.0.0.4 random comment"),
            "{r}"
        );
    }
}
