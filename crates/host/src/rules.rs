//! The node's netfilter rules and the routing pieces that go with them: what they should be for a
//! configuration and the primary interface's facts ([`desired_table`]), and [`HostRules`], which
//! installs, reads back and removes them.
//!
//! Everything lives in one nftables table, `ip eniipam` ([`TABLE`]), with base chains of its own:
//!
//! | chain | hook, priority | holds |
//! | --- | --- | --- |
//! | `mark-primary` | filter prerouting, mangle (-150) | NodePort/hostPort mark ([`super::nodeport`]) |
//! | `mark-pods` | filter prerouting, dstnat + 10 (-90) | egress mark ([`super::snat`]), mark restore |
//! | `pod-snat` | nat postrouting, srcnat + 10 (110) | SNAT to eth0's primary IP ([`super::snat`]), the IPv6-only pods' IPv4 egress first |
//!
//! plus the policy rule `1024: fwmark <mark>/<mark> lookup main` and loose `rp_filter` on the primary
//! interface, whenever SNAT or NodePort support is on.
//!
//! **Why nftables, in a table of our own.** EKS AL2023 nodes run `iptables-nft`: kube-proxy's iptables
//! mode writes nf_tables tables named `nat`, `filter`, `mangle`; its nftables mode writes the table
//! `kube-proxy`; portmap writes `nat` through iptables. A table of our own is never flushed or
//! rewritten by any of them, and ours never touches theirs; the order between us and them is the
//! chains' priorities, not rule positions in shared chains that each side inserts into (the VPC CNI's
//! `AWS-SNAT-CHAIN-0` jump must stay behind `KUBE-POSTROUTING`). `nft -f` replaces the whole table in
//! one kernel transaction, so an update never leaves a window with half the rules. Next to
//! `iptables-legacy` rules it works by the same priorities (both attach to the same netfilter hooks;
//! only the `iptables-nft` pairing is tested here). What it costs: the rules show in
//! `nft list ruleset`, not in `iptables-save`, and the node needs the `nft` binary (package
//! `nftables`).

use eniipam_netlink::{LinkFacts, Netlink};
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

use super::netfilter::{Chain, ChainType, Family, Hook, Nft, NftError, Priority, SnatPorts, Table};
use super::nodeport;
use super::snat::{self, Snat};

/// The table eniipam owns.
pub const TABLE: &str = "eniipam";

/// What the node's rules are for (from the daemon's configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRulesConfig {
    /// SNAT of pod egress, or none (`external_snat`).
    pub snat: Snat,
    /// Mark connections arriving on the primary interface (`node_port_support`).
    pub node_port_support: bool,
    /// The mark bit(s) used on connections and packets (`connmark`, the VPC CNI's 0x80).
    pub connmark: u32,
    /// The host veth prefix the plugin uses (`veth_prefix` in the conflist).
    pub veth_prefix: String,
    /// SNAT of IPv6-only pods' node-local IPv4 egress addresses, with these source ports
    /// (`ip_family = ipv6` with `ipv4_egress`; `snat_randomize`), whatever `snat` says.
    pub ipv4_egress: Option<SnatPorts>,
    /// Network profiles are on: pods whose host veth is in link group
    /// [`eniipam_api::OWN_ENI_EGRESS_LINK_GROUP`] (a profile in the `strict` egress mode) are
    /// neither marked nor SNATed, so they leave by their own ENI with their own address.
    pub own_eni_egress: bool,
}

impl Default for HostRulesConfig {
    fn default() -> Self {
        Self {
            snat: Snat::Node {
                ports: SnatPorts::Prng,
                exclude: Vec::new(),
            },
            node_port_support: true,
            connmark: 0x80,
            veth_prefix: "eni".into(),
            ipv4_egress: None,
            own_eni_egress: false,
        }
    }
}

impl HostRulesConfig {
    /// Whether anything is installed at all (the fwmark rule and rp_filter go with the table).
    pub fn wants_rules(&self) -> bool {
        self.snat.is_on() || self.node_port_support || self.ipv4_egress.is_some()
    }

    /// Whether the primary interface needs a loose `rp_filter` (2): when SNAT is on (the replies of
    /// SNATed connections of pods on secondary ENIs arrive on the primary interface, and their reverse
    /// route, by the pod's `from <ip> lookup <table>` rule, leaves by the pod's ENI), and when NodePort
    /// support is on (a DNATed SYN to such a pod has the same reverse route). Only with
    /// `external_snat` and NodePort support both off does nothing arrive on the primary interface for
    /// a pod on a secondary ENI.
    pub fn needs_loose_rp_filter(&self) -> bool {
        self.snat.is_on() || self.node_port_support
    }
}

/// The primary interface, as the rules need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryInterface {
    /// Its name on this host (found by its MAC).
    pub ifname: String,
    /// Its primary private IP (the SNAT source).
    pub primary_ip: Ipv4Addr,
    /// The VPC's IPv4 CIDRs (never SNATed).
    pub vpc_cidrs: Vec<Ipv4Net>,
}

/// The table for `config` on a node whose primary interface is `primary`; `None` when neither SNAT
/// nor NodePort support is on (the table should not exist).
pub fn desired_table(config: &HostRulesConfig, primary: &PrimaryInterface) -> Option<Table> {
    if !config.wants_rules() {
        return None;
    }
    let mark = config.connmark;
    let mut chains = Vec::new();
    if config.node_port_support {
        chains.push(nodeport::mark_primary_chain(&primary.ifname, mark));
    }
    let mut pods = Chain {
        name: nodeport::MARK_PODS_CHAIN.into(),
        kind: ChainType::Filter,
        hook: Hook::Prerouting,
        // After kube-proxy's and portmap's DNAT (dstnat, -100): see `snat`'s module docs.
        priority: Priority::DstNat(10),
        rules: Vec::new(),
    };
    let mut nat_rules = Vec::new();
    if let Some(ports) = config.ipv4_egress {
        nat_rules.push(snat::egress_snat_rule(primary.primary_ip, ports));
    }
    if let Snat::Node { ports, exclude } = &config.snat {
        let never = snat::never_snat(&primary.vpc_cidrs, exclude);
        let own_eni = config
            .own_eni_egress
            .then_some(eniipam_api::OWN_ENI_EGRESS_LINK_GROUP);
        pods.rules.push(snat::egress_mark_rule(
            &config.veth_prefix,
            &never,
            mark,
            own_eni,
        ));
        nat_rules.extend(snat::snat_rules(
            primary.primary_ip,
            &never,
            *ports,
            own_eni,
        ));
    }
    let snat_chain = (!nat_rules.is_empty()).then(|| snat::nat_chain(nat_rules));
    pods.rules
        .push(nodeport::restore_rule(&config.veth_prefix, mark));
    chains.push(pods);
    chains.extend(snat_chain);
    Some(Table {
        family: Family::Ip,
        name: TABLE.into(),
        chains,
    })
}

/// Why the node's rules could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error(transparent)]
    Netlink(#[from] eniipam_netlink::Error),
    /// No link has the primary interface's MAC.
    #[error("no host link has the primary interface's MAC {mac}")]
    PrimaryLinkNotFound { mac: String },
    /// IMDS could not be read, or does not describe the primary interface.
    #[error("instance metadata: {0}")]
    Metadata(String),
    /// Reading or writing a sysctl file.
    #[error("{path}: {source}")]
    Sysctl {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What [`HostRules::uninstall`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Uninstalled {
    /// The `ip eniipam` table was there and is gone.
    pub table: bool,
    /// `fwmark` rules removed.
    pub fwmark_rules: usize,
}

/// Installs, reads back and removes the node's rules, in the network namespace the daemon runs in
/// (`nft` runs as a child process; the netlink socket is opened in the calling thread's namespace).
#[derive(Clone, Debug)]
pub struct HostRules {
    nft: Nft,
    nl: Netlink,
}

impl HostRules {
    /// Opens a netlink connection in the current namespace. Needs a tokio runtime.
    pub fn new(nft: Nft) -> Result<Self, RulesError> {
        Ok(Self {
            nft,
            nl: Netlink::current()?,
        })
    }

    /// The `nft` this uses.
    pub fn nft(&self) -> &Nft {
        &self.nft
    }

    /// The link with `mac` (the primary interface).
    pub async fn primary_link(&self, mac: &str) -> Result<LinkFacts, RulesError> {
        let mac = mac.to_ascii_lowercase();
        self.nl
            .link_by_mac(&mac)
            .await?
            .ok_or(RulesError::PrimaryLinkNotFound { mac })
    }

    /// The kernel's listing of our table (`nft list table ip eniipam`), `None` when absent.
    pub async fn listing(&self) -> Result<Option<String>, RulesError> {
        Ok(self.nft.list_table(Family::Ip, TABLE).await?)
    }

    /// Makes our table `table` (replaced in one transaction) or absent (`None`); returns the
    /// kernel's listing afterwards.
    pub async fn load(&self, table: Option<&Table>) -> Result<Option<String>, RulesError> {
        match table {
            Some(t) => {
                debug_assert_eq!(t.name, TABLE);
                self.nft.replace_table(t).await?;
            }
            None => {
                self.nft.delete_table(Family::Ip, TABLE).await?;
            }
        }
        self.listing().await
    }

    /// Adds (`wanted`) or removes the `fwmark` policy rule; returns whether it changed anything.
    pub async fn ensure_fwmark_rule(&self, mark: u32, wanted: bool) -> Result<bool, RulesError> {
        let rule = nodeport::fwmark_rule(mark);
        let present = self.nl.has_rule(&rule).await?;
        match (wanted, present) {
            (true, false) => {
                self.nl.add_rule(&rule).await?;
                Ok(true)
            }
            (false, true) => {
                let removed = self
                    .nl
                    .remove_rules(|m| rule.matches(m), &rule.to_string())
                    .await?;
                Ok(removed > 0)
            }
            _ => Ok(false),
        }
    }

    /// Whether the `fwmark` rule is in place.
    pub async fn has_fwmark_rule(&self, mark: u32) -> Result<bool, RulesError> {
        Ok(self.nl.has_rule(&nodeport::fwmark_rule(mark)).await?)
    }

    /// Sets the primary interface's `rp_filter` to loose when it is strict; returns whether it
    /// changed.
    pub fn loosen_rp_filter(&self, ifname: &str) -> Result<bool, RulesError> {
        nodeport::loosen_rp_filter(ifname).map_err(|source| RulesError::Sysctl {
            path: format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter"),
            source,
        })
    }

    /// Removes our table and the `fwmark` rule for `connmark` (`eniipamd --uninstall-host-rules`).
    /// `rp_filter` stays loose: the previous value is not known, and loose is what EKS nodes run.
    pub async fn uninstall(&self, connmark: u32) -> Result<Uninstalled, RulesError> {
        let table = self.nft.delete_table(Family::Ip, TABLE).await?;
        let rule = nodeport::fwmark_rule(connmark);
        let fwmark_rules = self
            .nl
            .remove_rules(|m| rule.matches(m), &rule.to_string())
            .await?;
        Ok(Uninstalled {
            table,
            fwmark_rules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn primary() -> PrimaryInterface {
        PrimaryInterface {
            ifname: "ens5".into(),
            primary_ip: "10.0.0.4".parse().unwrap(),
            vpc_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
        }
    }

    fn chain_names(t: &Table) -> Vec<&str> {
        t.chains.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn the_default_has_every_chain() {
        let t = desired_table(&HostRulesConfig::default(), &primary()).unwrap();
        assert_eq!(chain_names(&t), ["mark-primary", "mark-pods", "pod-snat"]);
        let pods = &t.chains[1];
        assert_eq!(pods.rules.len(), 2, "egress mark, then restore");
        assert!(
            pods.rules[0]
                .to_string()
                .contains("ip daddr != { 10.0.0.0/16 }")
        );
        let script = t.render().unwrap();
        assert!(script.contains("snat to 10.0.0.4 fully-random"), "{script}");
        assert!(
            script.contains("iifname \"ens5\" fib daddr . iif type local"),
            "{script}"
        );
    }

    #[test]
    fn external_snat_keeps_only_the_node_port_marks() {
        let config = HostRulesConfig {
            snat: Snat::External,
            ..HostRulesConfig::default()
        };
        let t = desired_table(&config, &primary()).unwrap();
        assert_eq!(chain_names(&t), ["mark-primary", "mark-pods"]);
        assert_eq!(t.chains[1].rules.len(), 1, "the restore rule only");
        assert!(!t.render().unwrap().contains("snat to"));
    }

    #[test]
    fn snat_without_node_ports_keeps_the_egress_mark_and_its_restore() {
        let config = HostRulesConfig {
            node_port_support: false,
            snat: Snat::Node {
                ports: SnatPorts::None,
                exclude: vec!["192.168.0.0/16".parse().unwrap()],
            },
            ..HostRulesConfig::default()
        };
        let t = desired_table(&config, &primary()).unwrap();
        assert_eq!(chain_names(&t), ["mark-pods", "pod-snat"]);
        let script = t.render().unwrap();
        assert!(
            script.contains("{ 10.0.0.0/16, 192.168.0.0/16 }"),
            "{script}"
        );
        assert!(script.contains("snat to 10.0.0.4 comment"), "{script}");
    }

    #[test]
    fn loose_rp_filter_is_needed_for_snat_or_node_ports() {
        let with = |snat: Snat, node_port_support: bool| HostRulesConfig {
            snat,
            node_port_support,
            ..HostRulesConfig::default()
        };
        let node = || Snat::Node {
            ports: SnatPorts::Prng,
            exclude: Vec::new(),
        };
        assert!(with(node(), true).needs_loose_rp_filter());
        assert!(
            with(node(), false).needs_loose_rp_filter(),
            "SNAT alone needs it (issue 23)"
        );
        assert!(with(Snat::External, true).needs_loose_rp_filter());
        assert!(!with(Snat::External, false).needs_loose_rp_filter());
    }

    #[test]
    fn ipv4_egress_comes_first_and_stays_with_external_snat() {
        let config = HostRulesConfig {
            ipv4_egress: Some(SnatPorts::Prng),
            ..HostRulesConfig::default()
        };
        let t = desired_table(&config, &primary()).unwrap();
        let snat = t.chains.iter().find(|c| c.name == "pod-snat").unwrap();
        let lines: Vec<String> = snat.rules.iter().map(|r| r.to_string()).collect();
        assert!(
            lines[0].starts_with("ip saddr 169.254.172.0/22 snat to 10.0.0.4 fully-random"),
            "before the VPC return: {lines:?}"
        );
        assert!(lines[1].starts_with("ip daddr { 10.0.0.0/16 } return"));
        assert_eq!(lines.len(), 4);
        // A NAT gateway cannot translate 169.254: external_snat keeps the egress rule alone.
        let config = HostRulesConfig {
            snat: Snat::External,
            node_port_support: false,
            ipv4_egress: Some(SnatPorts::None),
            ..HostRulesConfig::default()
        };
        assert!(config.wants_rules());
        let t = desired_table(&config, &primary()).unwrap();
        assert_eq!(chain_names(&t), ["mark-pods", "pod-snat"]);
        let script = t.render().unwrap();
        assert!(
            script.contains("ip saddr 169.254.172.0/22 snat to 10.0.0.4 comment"),
            "{script}"
        );
        assert_eq!(script.matches("snat to").count(), 1, "{script}");
    }

    /// Issue 44, case 3: with network profiles, strict-egress profile pods (host veth in the
    /// link group) are neither marked to leave by eth0 nor SNATed to its address.
    #[test]
    fn profiles_keep_strict_egress_pods_out_of_the_mark_and_the_snat() {
        let plain = desired_table(&HostRulesConfig::default(), &primary()).unwrap();
        let problems = snat::strict_egress_problems(&plain.render().unwrap());
        assert_eq!(problems.len(), 2, "{problems:?}");
        let config = HostRulesConfig {
            own_eni_egress: true,
            ..HostRulesConfig::default()
        };
        let t = desired_table(&config, &primary()).unwrap();
        let script = t.render().unwrap();
        assert_eq!(
            snat::strict_egress_problems(&script),
            Vec::<String>::new(),
            "{script}"
        );
        let group = eniipam_api::OWN_ENI_EGRESS_LINK_GROUP;
        assert!(
            script.contains(&format!(
                "iifname \"eni*\" iifgroup != {group} ct state new"
            )),
            "{script}"
        );
        let snat = t.chains.iter().find(|c| c.name == "pod-snat").unwrap();
        assert!(
            snat.rules[0]
                .to_string()
                .starts_with(&format!("iifgroup {group} return")),
            "first: {}",
            snat.rules[0]
        );
        // The NodePort restore still sees every pod: replies to eth0's connections leave by eth0.
        let pods = t.chains.iter().find(|c| c.name == "mark-pods").unwrap();
        assert!(!pods.rules[1].to_string().contains("iifgroup"));
        // external_snat: nothing to skip.
        let config = HostRulesConfig {
            snat: Snat::External,
            own_eni_egress: true,
            ..HostRulesConfig::default()
        };
        let t = desired_table(&config, &primary()).unwrap();
        assert!(snat::strict_egress_problems(&t.render().unwrap()).is_empty());
    }

    #[test]
    fn nothing_wanted_means_no_table() {
        let config = HostRulesConfig {
            snat: Snat::External,
            node_port_support: false,
            ..HostRulesConfig::default()
        };
        assert!(!config.wants_rules());
        assert_eq!(desired_table(&config, &primary()), None);
    }
}
