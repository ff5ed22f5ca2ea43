//! The faults the soak injects and when: a schedule that depends only on the seed and the step number,
//! so a seed names one sequence of faults (the daemon's timing may still differ between runs).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL eniipamd at a random moment of a step's batch of operations, then restart it.
    Kill,
    /// The next few calls of one EC2 action fail (InternalError, RequestLimitExceeded, Unavailable).
    Ec2Error,
    /// Every EC2 call fails with some probability for a few steps.
    Ec2ErrorRate,
    /// The next calls of one EC2 action hang for seconds, then fail unperformed.
    Ec2Hang,
    /// The next calls of one EC2 action are performed, the reply held back for seconds.
    Ec2SlowReply,
    /// The account's throttling buckets shrink to a trickle for a few steps.
    ThrottleBurst,
    /// A live pod's IP is unassigned from its ENI through EC2, behind the daemon's back; once the
    /// running reconcile has had its time to report it lost, a SIGKILL and restart (a restart took
    /// the lost IP back, beyond the node's capacity on a full node: issue 44 case 8).
    OobUnassign,
    /// A secondary ENI is detached from the instance through EC2, behind the daemon's back.
    OobDetach,
    /// IMDS lags EC2 by seconds for a few steps.
    ImdsLag,
    /// The state file (and its WAL) removed while the daemon is down (once).
    StateFileRemoved,
    /// The state directory's disk full for a while (once).
    DiskFull,
    /// A rack of pod network namespaces hidden from the daemon for a while (sometimes across a restart).
    NetnsHidden,
    /// A pod's netns removed without a DEL (the pod died); GC or a late DEL cleans up.
    PodDeath,
    /// The IAM policy edited to revoke one action the daemon needs for a few steps, then granted
    /// back (the shipped policy is enforced for the whole run).
    IamRevoke,
    /// The node's IPv6 /80 unassigned from eth0 through EC2, behind the daemon's back (ipv6, dual):
    /// the running reconcile (or a restart) assigns the same /80 back, and every pod keeps its IPv6.
    OobPrefixUnassign,
}

impl FaultKind {
    pub const ALL: [FaultKind; 15] = [
        FaultKind::Kill,
        FaultKind::Ec2Error,
        FaultKind::Ec2ErrorRate,
        FaultKind::Ec2Hang,
        FaultKind::Ec2SlowReply,
        FaultKind::ThrottleBurst,
        FaultKind::OobUnassign,
        FaultKind::OobDetach,
        FaultKind::ImdsLag,
        FaultKind::StateFileRemoved,
        FaultKind::DiskFull,
        FaultKind::NetnsHidden,
        FaultKind::PodDeath,
        FaultKind::IamRevoke,
        FaultKind::OobPrefixUnassign,
    ];

    /// Kinds only a named list turns on (none now: `oob-prefix-unassign` was one until the daemon
    /// took a /80 unassigned behind its back back, issue 26).
    pub const OPT_IN: [FaultKind; 0] = [];

    /// Whether the kind means anything with `family`.
    pub fn applies(self, family: super::IpFamily) -> bool {
        match self {
            Self::OobUnassign | Self::OobDetach => family.has_ipv4(),
            Self::OobPrefixUnassign => family.has_ipv6(),
            _ => true,
        }
    }

    /// Why the kind does not apply to a family it does not apply to.
    pub fn moot_why(self) -> &'static str {
        match self {
            Self::OobUnassign | Self::OobDetach => {
                "pods hold no IPv4 (the pool is held empty: no secondary IPs, no secondary ENIs); \
                 the /80's out-of-band unassign is oob-prefix-unassign"
            }
            Self::OobPrefixUnassign => "pods hold no IPv6",
            _ => "",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Ec2Error => "ec2-error",
            Self::Ec2ErrorRate => "ec2-error-rate",
            Self::Ec2Hang => "ec2-hang",
            Self::Ec2SlowReply => "ec2-slow-reply",
            Self::ThrottleBurst => "throttle-burst",
            Self::OobUnassign => "oob-unassign",
            Self::OobDetach => "oob-detach",
            Self::ImdsLag => "imds-lag",
            Self::StateFileRemoved => "state-file-removed",
            Self::DiskFull => "disk-full",
            Self::NetnsHidden => "netns-hidden",
            Self::PodDeath => "pod-death",
            Self::IamRevoke => "iam-revoke",
            Self::OobPrefixUnassign => "oob-prefix-unassign",
        }
    }

    /// Injected once per run, in the first cycle of the schedule.
    pub fn once(self) -> bool {
        matches!(self, Self::StateFileRemoved | Self::DiskFull)
    }

    /// Drawn per step (kill) or per pod end (pod death) rather than from the cycle.
    fn per_event(self) -> bool {
        matches!(self, Self::Kill | Self::PodDeath)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .chain(Self::OPT_IN)
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault {s:?}; known: {}",
                    Self::ALL
                        .into_iter()
                        .chain(Self::OPT_IN)
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

/// Parses `all` (every kind but the opt-in ones), `none`, or a comma-separated list of fault names (`-name` removes one from all).
pub fn parse_fault_set(s: &str) -> Result<BTreeSet<FaultKind>, String> {
    let s = s.trim();
    match s {
        "all" | "" => return Ok(FaultKind::ALL.into_iter().collect()),
        "none" => return Ok(BTreeSet::new()),
        _ => {}
    }
    let parts: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.iter().all(|p| p.starts_with('-')) {
        let mut set: BTreeSet<FaultKind> = FaultKind::ALL.into_iter().collect();
        for p in parts {
            set.remove(&p[1..].parse()?);
        }
        return Ok(set);
    }
    parts.into_iter().map(str::parse).collect()
}

/// Steps between two scheduled faults.
pub const PERIOD: u64 = 4;
/// Steps at the start with no fault (the pool warms up).
pub const WARM_UP: u64 = 4;
/// Chance a step's batch is cut by a SIGKILL.
pub const KILL_CHANCE: f64 = 0.08;
/// Chance a pod ends by dying (netns removed, no DEL) rather than by DEL.
pub const DEATH_CHANCE: f64 = 0.12;

/// The RNG of one step: a function of the seed and the step only.
pub fn step_rng(seed: u64, step: u64, stream: u64) -> rand::rngs::StdRng {
    let mix = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    rand::rngs::StdRng::seed_from_u64(mix)
}

/// The cycle of scheduled kinds, in the seed's order.
fn cycle(seed: u64, enabled: &BTreeSet<FaultKind>) -> Vec<FaultKind> {
    let mut kinds: Vec<FaultKind> = enabled.iter().copied().filter(|k| !k.per_event()).collect();
    kinds.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x50AC));
    kinds
}

/// The faults planned for `step`: at most one from the cycle (every [`PERIOD`] steps, each kind in
/// turn, the once-only kinds in the first cycle only), and possibly a kill.
pub fn planned(seed: u64, step: u64, enabled: &BTreeSet<FaultKind>) -> Vec<FaultKind> {
    let mut out = Vec::new();
    if step < WARM_UP {
        return out;
    }
    let kinds = cycle(seed, enabled);
    if !kinds.is_empty() && (step - WARM_UP) % PERIOD == PERIOD / 2 {
        let slot = (step - WARM_UP) / PERIOD;
        let k = kinds[(slot % kinds.len() as u64) as usize];
        if !k.once() || slot < kinds.len() as u64 {
            out.push(k);
        }
    }
    if enabled.contains(&FaultKind::Kill) && step_rng(seed, step, 7).random_bool(KILL_CHANCE) {
        out.push(FaultKind::Kill);
    }
    out
}

/// Steps until every scheduled kind has come once.
pub fn first_cycle_steps(enabled: &BTreeSet<FaultKind>) -> u64 {
    let n = enabled.iter().filter(|k| !k.per_event()).count() as u64;
    WARM_UP + n * PERIOD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_in_the_first_cycle_and_once_kinds_only_then() {
        let all: BTreeSet<FaultKind> = FaultKind::ALL.into_iter().collect();
        let first = first_cycle_steps(&all);
        let mut seen = BTreeSet::new();
        for s in 0..first {
            seen.extend(planned(9, s, &all));
        }
        for k in FaultKind::ALL {
            if k != FaultKind::PodDeath && k != FaultKind::Kill {
                assert!(seen.contains(&k), "{k} missing");
            }
        }
        for s in first..first * 5 {
            for k in planned(9, s, &all) {
                assert!(!k.once(), "{k} again at {s}");
            }
        }
        assert_eq!(planned(9, 40, &all), planned(9, 40, &all));
    }

    #[test]
    fn fault_sets_parse() {
        assert_eq!(parse_fault_set("all").unwrap().len(), FaultKind::ALL.len());
        assert_eq!(
            parse_fault_set("kill,disk-full").unwrap(),
            [FaultKind::Kill, FaultKind::DiskFull].into_iter().collect()
        );
        assert!(!parse_fault_set("-kill").unwrap().contains(&FaultKind::Kill));
        assert!(parse_fault_set("kil").is_err());
        assert!(
            parse_fault_set("all")
                .unwrap()
                .contains(&FaultKind::OobPrefixUnassign)
        );
        assert_eq!(
            parse_fault_set("oob-prefix-unassign").unwrap(),
            [FaultKind::OobPrefixUnassign].into_iter().collect()
        );
    }
}
