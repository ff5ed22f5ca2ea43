//! The nftables objects the daemon owns, typed, validated and rendered to `nft` syntax.

use std::fmt::{self, Display, Write as _};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::NftError;

/// An nftables address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip`: IPv4.
    Ip,
    /// `inet`: IPv4 and IPv6 (the NetworkPolicy table, `eniipam-netpol`'s `nft`).
    Inet,
}

impl Family {
    /// The keyword in `nft` syntax.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Inet => "inet",
        }
    }
}

/// One table and everything in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub chains: Vec<Chain>,
}

/// The type of a base chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainType {
    /// Sees every packet.
    Filter,
    /// Sees the first packet of each connection; may NAT it.
    Nat,
}

/// The netfilter hook a base chain is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Prerouting,
    Postrouting,
}

/// Where a base chain runs on its hook, relative to the standard priorities (lower runs first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// iptables' mangle table (-150): before destination NAT.
    Mangle(i32),
    /// Destination NAT (-100), where kube-proxy and portmap DNAT.
    DstNat(i32),
    /// Source NAT (100), where kube-proxy and portmap masquerade.
    SrcNat(i32),
}

impl Priority {
    /// The numeric priority.
    pub fn value(self) -> i32 {
        match self {
            Self::Mangle(d) => -150 + d,
            Self::DstNat(d) => -100 + d,
            Self::SrcNat(d) => 100 + d,
        }
    }
}

impl Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, delta) = match *self {
            Self::Mangle(d) => ("mangle", d),
            Self::DstNat(d) => ("dstnat", d),
            Self::SrcNat(d) => ("srcnat", d),
        };
        match delta {
            0 => write!(f, "{name}"),
            d if d > 0 => write!(f, "{name} + {d}"),
            d => write!(f, "{name} - {}", d.unsigned_abs()),
        }
    }
}

/// A base chain (attached to a hook, policy accept) and its rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: Priority,
    pub rules: Vec<Rule>,
}

/// One rule: every match must hold, then the action runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub action: Action,
    /// Shown by `nft list`, so an operator can tell what a rule is for.
    pub comment: Option<String>,
}

/// What a rule can test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// The packet came in on this interface (by name).
    IifName(String),
    /// The packet came in on an interface whose name starts with this prefix (`iifname "eni*"`).
    IifNamePrefix(String),
    /// The packet leaves by an interface whose name does (`negate: false`) or does not start with
    /// this prefix.
    OifNamePrefix { prefix: String, negate: bool },
    /// The packet came in on an interface of link group `group` (`negate: false`) or of another
    /// group (`iifgroup`; seen in postrouting too, for forwarded packets).
    IifGroup { group: u32, negate: bool },
    /// The destination is (`negate: false`) or is not in one of these networks.
    DaddrIn { nets: Vec<Ipv4Net>, negate: bool },
    /// The source is in this network.
    SaddrIn(Ipv4Net),
    /// The destination is (`negate: false`) or is not an address of this host. `on_iif`: an address
    /// of the interface the packet came in on (iptables' `--limit-iface-in`).
    DaddrLocal { on_iif: bool, negate: bool },
    /// The packet opens a new connection.
    CtStateNew,
    /// Every bit of this mask is set in the connection's mark.
    CtMarkHas(u32),
}

/// What a rule does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave this chain.
    Return,
    /// Set these bits in the connection's mark.
    CtMarkSet(u32),
    /// Set these bits in the packet's mark (what `ip rule fwmark` reads).
    MetaMarkSet(u32),
    /// Rewrite the source address.
    Snat { to: Ipv4Addr, ports: SnatPorts },
}

/// How SNAT picks source ports (the AWS VPC CNI's `AWS_VPC_K8S_CNI_RANDOMIZESNAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnatPorts {
    /// `fully-random`: a pseudo-random port for every connection (`prng`, the default).
    #[default]
    Prng,
    /// `random`: a hash-based random port offset (`hashrandom`).
    Hashrandom,
    /// Keep the pod's source port when it is free (`none`).
    None,
}

impl SnatPorts {
    /// The knob's value as written in config (`prng`, `hashrandom`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prng => "prng",
            Self::Hashrandom => "hashrandom",
            Self::None => "none",
        }
    }
}

impl std::str::FromStr for SnatPorts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "prng" => Ok(Self::Prng),
            "hashrandom" => Ok(Self::Hashrandom),
            "none" => Ok(Self::None),
            other => Err(format!("{other:?} is not prng, hashrandom or none")),
        }
    }
}

/// Linux interface names: 1-15 bytes, no `/`, whitespace, quotes or wildcard.
pub fn check_ifname(what: &str, name: &str) -> Result<(), NftError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b':'));
    if ok {
        Ok(())
    } else {
        Err(NftError::Invalid(format!(
            "{what} {name:?} is not an interface name (1-15 of [A-Za-z0-9._@:-])"
        )))
    }
}

/// Table and chain names: 1-64 of `[A-Za-z0-9_-]`, starting with a letter.
pub(super) fn check_name(what: &str, name: &str) -> Result<(), NftError> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NftError::Invalid(format!(
            "{what} name {name:?}: 1-64 of [A-Za-z0-9_-], starting with a letter"
        )))
    }
}

fn check_comment(comment: &str) -> Result<(), NftError> {
    let ok = comment.len() <= 128
        && comment
            .chars()
            .all(|c| c != '"' && c != '\\' && !c.is_control());
    if ok {
        Ok(())
    } else {
        Err(NftError::Invalid(format!(
            "comment {comment:?}: at most 128 characters, no quotes, backslashes or control characters"
        )))
    }
}

fn nets(list: &[Ipv4Net]) -> String {
    let all: Vec<String> = list.iter().map(|n| n.trunc().to_string()).collect();
    all.join(", ")
}

impl Match {
    fn validate(&self) -> Result<(), NftError> {
        match self {
            Self::IifName(n) => check_ifname("interface", n),
            Self::IifNamePrefix(p) | Self::OifNamePrefix { prefix: p, .. } => {
                // The prefix plus at least one character must still fit a name.
                check_ifname("interface prefix", p).and_then(|()| {
                    if p.len() < 15 {
                        Ok(())
                    } else {
                        Err(NftError::Invalid(format!(
                            "interface prefix {p:?} leaves no room for a name"
                        )))
                    }
                })
            }
            Self::DaddrIn { nets, .. } if nets.is_empty() => Err(NftError::Invalid(
                "a destination match needs at least one network".into(),
            )),
            Self::CtMarkHas(0) => Err(NftError::Invalid("a mark test needs a mask".into())),
            _ => Ok(()),
        }
    }
}

impl Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::IifName(n) => write!(f, "iifname \"{n}\""),
            Self::IifNamePrefix(p) => write!(f, "iifname \"{p}*\""),
            Self::OifNamePrefix { prefix, negate } => {
                write!(
                    f,
                    "oifname {}\"{prefix}*\"",
                    if *negate { "!= " } else { "" }
                )
            }
            Self::IifGroup { group, negate } => {
                write!(f, "iifgroup {}{group}", if *negate { "!= " } else { "" })
            }
            Self::SaddrIn(net) => write!(f, "ip saddr {net}"),
            Self::DaddrIn { nets: list, negate } => write!(
                f,
                "ip daddr {}{{ {} }}",
                if *negate { "!= " } else { "" },
                nets(list)
            ),
            Self::DaddrLocal { on_iif, negate } => write!(
                f,
                "fib daddr{} type {}local",
                if *on_iif { " . iif" } else { "" },
                if *negate { "!= " } else { "" }
            ),
            Self::CtStateNew => write!(f, "ct state new"),
            Self::CtMarkHas(m) => write!(f, "ct mark & {m:#x} == {m:#x}"),
        }
    }
}

impl Action {
    fn validate(&self) -> Result<(), NftError> {
        match self {
            Self::CtMarkSet(0) | Self::MetaMarkSet(0) => Err(NftError::Invalid(
                "setting a mark needs a non-zero mask".into(),
            )),
            _ => Ok(()),
        }
    }
}

impl Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Return => write!(f, "return"),
            Self::CtMarkSet(m) => write!(f, "ct mark set ct mark | {m:#x}"),
            Self::MetaMarkSet(m) => write!(f, "meta mark set meta mark | {m:#x}"),
            Self::Snat { to, ports } => {
                write!(f, "snat to {to}")?;
                match ports {
                    SnatPorts::Prng => write!(f, " fully-random"),
                    SnatPorts::Hashrandom => write!(f, " random"),
                    SnatPorts::None => Ok(()),
                }
            }
        }
    }
}

impl Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.matches {
            write!(f, "{m} ")?;
        }
        write!(f, "{}", self.action)?;
        if let Some(c) = &self.comment {
            write!(f, " comment \"{c}\"")?;
        }
        Ok(())
    }
}

impl Rule {
    fn validate(&self, chain: &Chain) -> Result<(), NftError> {
        for m in &self.matches {
            m.validate()?;
        }
        self.action.validate()?;
        if matches!(self.action, Action::Snat { .. })
            && (chain.kind != ChainType::Nat || chain.hook != Hook::Postrouting)
        {
            return Err(NftError::Invalid(format!(
                "chain {}: SNAT belongs in a nat chain on postrouting",
                chain.name
            )));
        }
        if let Some(c) = &self.comment {
            check_comment(c)?;
        }
        Ok(())
    }
}

impl Table {
    /// Checks every name and string, then renders the table's definition (`table ip <name> { … }`).
    pub fn render(&self) -> Result<String, NftError> {
        check_name("table", &self.name)?;
        let mut s = String::new();
        let _ = writeln!(s, "table {} {} {{", self.family.keyword(), self.name);
        for chain in &self.chains {
            check_name("chain", &chain.name)?;
            let kind = match chain.kind {
                ChainType::Filter => "filter",
                ChainType::Nat => "nat",
            };
            let hook = match chain.hook {
                Hook::Prerouting => "prerouting",
                Hook::Postrouting => "postrouting",
            };
            let _ = writeln!(s, "  chain {} {{", chain.name);
            let _ = writeln!(
                s,
                "    type {kind} hook {hook} priority {}; policy accept;",
                chain.priority
            );
            for rule in &chain.rules {
                rule.validate(chain)?;
                let _ = writeln!(s, "    {rule}");
            }
            let _ = writeln!(s, "  }}");
        }
        let _ = writeln!(s, "}}");
        Ok(s)
    }

    /// The script that makes the kernel's table exactly this one, atomically: declare it (a no-op
    /// when it exists), delete it, define it.
    pub fn replace_script(&self) -> Result<String, NftError> {
        let body = self.render()?;
        let (family, name) = (self.family.keyword(), &self.name);
        Ok(format!(
            "table {family} {name} {{}}\ndelete table {family} {name}\n{body}"
        ))
    }
}
