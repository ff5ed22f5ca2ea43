//! A typed wrapper over the system's `nft` binary (package `nftables`): the few nftables objects the
//! daemon owns (one table of base chains holding simple rules), rendered to `nft` syntax, loaded in one
//! atomic transaction (`nft -f -`), listed back and deleted. No hand-built netlink for netfilter: the
//! `nft` binary is the kernel's supported front end, and `nft -f` applies a whole script or nothing.
//!
//! Names and strings that reach a script are validated (interface names, wildcard prefixes, comments),
//! so no caller-supplied text can change a script's meaning.

use std::fmt::{self, Display, Write as _};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ipnet::Ipv4Net;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Why an `nft` command failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The binary could not be started.
    #[error("cannot run `{program}` (install the `nftables` package): {source}")]
    Missing {
        /// The program as configured.
        program: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// `nft` ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line (with `-f -`: the script follows after `<<<`).
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Talking to the child process failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A name or a string cannot be put in a script.
    #[error("{0}")]
    Invalid(String),
}

impl NftError {
    /// Whether `nft` said the object does not exist (`No such file or directory`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Failed { stderr, .. } if stderr.contains("No such file or directory"))
    }
}

/// The system's `nft`, run as a child process in the daemon's own network namespace.
#[derive(Clone, Debug)]
pub struct Nft {
    program: PathBuf,
}

impl Default for Nft {
    fn default() -> Self {
        Self::new("nft")
    }
}

impl Nft {
    /// `nft` at `program` (a bare name is looked up in `PATH`).
    pub fn new(program: impl AsRef<Path>) -> Self {
        Self {
            program: program.as_ref().to_path_buf(),
        }
    }

    /// `nft <args>`, with `stdin` fed when given; returns stdout.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let program = self.program.display().to_string();
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| NftError::Missing {
                program: program.clone(),
                source,
            })?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin is piped");
            pipe.write_all(input.as_bytes())
                .await
                .map_err(|source| NftError::Io {
                    what: format!("writing a script to `{program}`"),
                    source,
                })?;
            drop(pipe);
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|source| NftError::Io {
                what: format!("waiting for `{program}`"),
                source,
            })?;
        if !out.status.success() {
            let mut command = format!("{program} {}", args.join(" "));
            if let Some(input) = stdin {
                command.push_str(" <<< ");
                command.push_str(&input.replace('\n', "; "));
            }
            return Err(NftError::Failed {
                command,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The version line (`nftables v1.0.6 (Lester Gooch #5)`).
    pub async fn version(&self) -> Result<String, NftError> {
        Ok(self.run(&["--version"], None).await?.trim().to_owned())
    }

    /// Loads `script` with `nft -f -`: every command in it applies, or none does.
    pub async fn apply(&self, script: &str) -> Result<(), NftError> {
        self.run(&["-f", "-"], Some(script)).await.map(drop)
    }

    /// Makes the kernel's table `table.name` exactly `table`, in one transaction (created if missing,
    /// replaced if present): no packet ever sees a half-built table, and connections keep their NAT
    /// bindings and marks (those live in conntrack, not in the rules).
    pub async fn replace_table(&self, table: &Table) -> Result<(), NftError> {
        self.apply(&table.replace_script()?).await
    }

    /// `nft list table <family> <name>`; `None` when there is no such table.
    pub async fn list_table(&self, family: Family, name: &str) -> Result<Option<String>, NftError> {
        check_name("table", name)?;
        match self
            .run(&["list", "table", family.keyword(), name], None)
            .await
        {
            Ok(listing) => Ok(Some(listing)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the table; `false` when it was not there.
    pub async fn delete_table(&self, family: Family, name: &str) -> Result<bool, NftError> {
        check_name("table", name)?;
        match self
            .run(&["delete", "table", family.keyword(), name], None)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// An nftables address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip`: IPv4.
    Ip,
}

impl Family {
    /// The keyword in `nft` syntax.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Ip => "ip",
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
    /// The destination is (`negate: false`) or is not in one of these networks.
    DaddrIn { nets: Vec<Ipv4Net>, negate: bool },
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
fn check_name(what: &str, name: &str) -> Result<(), NftError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rules: Vec<Rule>, kind: ChainType, hook: Hook) -> Table {
        Table {
            family: Family::Ip,
            name: "t".into(),
            chains: vec![Chain {
                name: "c".into(),
                kind,
                hook,
                priority: Priority::SrcNat(10),
                rules,
            }],
        }
    }

    #[test]
    fn rules_render_in_nft_syntax() {
        let r = Rule {
            matches: vec![
                Match::IifNamePrefix("eni".into()),
                Match::CtStateNew,
                Match::DaddrIn {
                    nets: vec![
                        "10.0.0.0/16".parse().unwrap(),
                        "100.64.1.7/10".parse().unwrap(),
                    ],
                    negate: true,
                },
                Match::DaddrLocal {
                    on_iif: false,
                    negate: true,
                },
            ],
            action: Action::CtMarkSet(0x80),
            comment: Some("eniipam: egress".into()),
        };
        assert_eq!(
            r.to_string(),
            "iifname \"eni*\" ct state new ip daddr != { 10.0.0.0/16, 100.64.0.0/10 } \
             fib daddr type != local ct mark set ct mark | 0x80 comment \"eniipam: egress\""
        );
        let r = Rule {
            matches: vec![
                Match::IifName("ens5".into()),
                Match::DaddrLocal {
                    on_iif: true,
                    negate: false,
                },
            ],
            action: Action::CtMarkSet(0x80),
            comment: None,
        };
        assert_eq!(
            r.to_string(),
            "iifname \"ens5\" fib daddr . iif type local ct mark set ct mark | 0x80"
        );
        let restore = Rule {
            matches: vec![Match::CtMarkHas(0x80)],
            action: Action::MetaMarkSet(0x80),
            comment: None,
        };
        assert_eq!(
            restore.to_string(),
            "ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80"
        );
        let to: Ipv4Addr = "10.0.0.4".parse().unwrap();
        for (ports, text) in [
            (SnatPorts::Prng, "snat to 10.0.0.4 fully-random"),
            (SnatPorts::Hashrandom, "snat to 10.0.0.4 random"),
            (SnatPorts::None, "snat to 10.0.0.4"),
        ] {
            assert_eq!(Action::Snat { to, ports }.to_string(), text);
        }
        assert_eq!(Priority::Mangle(0).to_string(), "mangle");
        assert_eq!(Priority::DstNat(10).to_string(), "dstnat + 10");
        assert_eq!(Priority::SrcNat(-5).to_string(), "srcnat - 5");
        assert_eq!(Priority::DstNat(10).value(), -90);
    }

    #[test]
    fn the_replace_script_declares_deletes_and_defines() {
        let t = table(
            vec![Rule {
                matches: vec![],
                action: Action::Return,
                comment: None,
            }],
            ChainType::Filter,
            Hook::Prerouting,
        );
        let s = t.replace_script().unwrap();
        assert_eq!(
            s,
            "table ip t {}\ndelete table ip t\ntable ip t {\n  chain c {\n    \
             type filter hook prerouting priority srcnat + 10; policy accept;\n    return\n  }\n}\n"
        );
    }

    #[test]
    fn what_cannot_go_in_a_script_is_refused() {
        let bad_names = [
            "",
            "eth0\"; flush ruleset",
            "a b",
            "sixteen-chars-xx",
            "eth*",
        ];
        for name in bad_names {
            let t = table(
                vec![Rule {
                    matches: vec![Match::IifName(name.into())],
                    action: Action::Return,
                    comment: None,
                }],
                ChainType::Filter,
                Hook::Prerouting,
            );
            assert!(t.render().is_err(), "{name:?}");
        }
        let snat_in_filter = table(
            vec![Rule {
                matches: vec![],
                action: Action::Snat {
                    to: Ipv4Addr::new(10, 0, 0, 4),
                    ports: SnatPorts::Prng,
                },
                comment: None,
            }],
            ChainType::Filter,
            Hook::Prerouting,
        );
        assert!(
            snat_in_filter
                .render()
                .unwrap_err()
                .to_string()
                .contains("nat chain")
        );
        let quote = table(
            vec![Rule {
                matches: vec![],
                action: Action::Return,
                comment: Some("say \"hi\"".into()),
            }],
            ChainType::Filter,
            Hook::Prerouting,
        );
        assert!(quote.render().is_err());
        let empty_set = table(
            vec![Rule {
                matches: vec![Match::DaddrIn {
                    nets: vec![],
                    negate: false,
                }],
                action: Action::Return,
                comment: None,
            }],
            ChainType::Filter,
            Hook::Prerouting,
        );
        assert!(empty_set.render().is_err());
        let mut bad_table = empty_set.clone();
        bad_table.name = "1table".into();
        assert!(bad_table.render().is_err());
    }

    #[test]
    fn snat_ports_parse_like_the_vpc_cni_knob() {
        assert_eq!("prng".parse::<SnatPorts>(), Ok(SnatPorts::Prng));
        assert_eq!("hashrandom".parse::<SnatPorts>(), Ok(SnatPorts::Hashrandom));
        assert_eq!("none".parse::<SnatPorts>(), Ok(SnatPorts::None));
        assert!("random".parse::<SnatPorts>().is_err());
        for p in [SnatPorts::Prng, SnatPorts::Hashrandom, SnatPorts::None] {
            assert_eq!(p.as_str().parse::<SnatPorts>(), Ok(p));
        }
    }
}
