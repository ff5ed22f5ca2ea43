//! What the table reports of its decisions besides the chains' two counters (per-rule counters,
//! NFLOG statements), as [`super::render_with`] writes it into each isolated chain. It is the
//! kernel's side of `super::super::decisions`, which reads these back (the log prefix, the
//! counters): here, under `nft`, so the renderer does not import the module that reads its output.

use serde::Serialize;

use super::PolicyType;
use crate::compile::RuleSource;

/// The prefix every log line of the table starts with.
pub(crate) const PREFIX: &str = "eniipam";

/// Which new connections are logged (`network_policy_log`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Logged {
    /// None: no log statement in the table.
    Off,
    /// Those the rules denied (the default).
    #[default]
    Denied,
    /// Denied and allowed ones (one netlink message per new allowed connection).
    All,
}

impl Logged {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(Self::Off),
            "denied" => Ok(Self::Denied),
            "all" => Ok(Self::All),
            other => Err(format!("{other:?} is not off, denied or all")),
        }
    }
}

/// What the table reports of its decisions besides the chains' two counters: rendered into each
/// isolated chain (see `super::super::decisions`'s module docs). The default reports nothing more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reporting {
    /// A named counter per policy rule (`<chain>_r<j>`).
    pub rule_counters: bool,
    /// Logging: which decisions, to which NFLOG group, at most how many a second per chain.
    pub log: Option<LogTap>,
}

/// The NFLOG statements' settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogTap {
    pub group: u16,
    pub allowed: bool,
    /// Denied packets copied per second and chain, at most (the burst is twice this).
    pub per_second: u32,
}

impl Reporting {
    /// The daemon's: per-rule counters always, logging as configured.
    pub fn new(logged: Logged, group: u16, per_second: u32) -> Self {
        Self {
            rule_counters: true,
            log: (logged != Logged::Off).then_some(LogTap {
                group,
                allowed: logged == Logged::All,
                per_second,
            }),
        }
    }

    /// The counter of rule `j` of `chain`, and its comment (the veth first, as the chain's
    /// counters; the rule's source, so a rule whose meaning changed is a counter declared anew).
    pub fn rule_counter(
        &self,
        chain: &str,
        veth: &str,
        dir: PolicyType,
        j: usize,
        source: &RuleSource,
    ) -> Option<(String, String)> {
        self.rule_counters.then(|| {
            (
                format!("{chain}_r{j}"),
                format!(
                    "{veth} {} r{j} {} {}[{}]",
                    dir.word(),
                    source.policy,
                    dir.word(),
                    source.index
                ),
            )
        })
    }

    /// The statements an allowing line of rule `j` carries before its `return` (empty, or ending
    /// in a space).
    pub fn allow_statements(&self, chain: &str, veth: &str, dir: PolicyType, j: usize) -> String {
        let mut s = String::new();
        if self.rule_counters {
            s.push_str(&format!("counter name \"{chain}_r{j}\" "));
        }
        if let Some(tap) = self.log.filter(|t| t.allowed) {
            s.push_str(&format!(
                "log prefix \"{PREFIX} allow {veth} {} r{j}\" group {} ",
                dir.short(),
                tap.group
            ));
        }
        s
    }

    /// The line before a chain's `drop` that logs it, if denials are logged.
    pub fn deny_line(&self, veth: &str, dir: PolicyType) -> Option<String> {
        self.log.map(|tap| {
            format!(
                "limit rate {}/second burst {} packets log prefix \"{PREFIX} deny {veth} {}\" group {}",
                tap.per_second,
                tap.per_second.saturating_mul(2).max(1),
                dir.short(),
                tap.group
            )
        })
    }
}
