//! The warm-pool policies the fleet compares: eniipam's own, and the AWS VPC CNI's three warm modes
//! emulated by the same daemon with different knobs (`DaemonConfig`), so what differs between two
//! rows of the matrix is the policy alone, never the code that carries it out.

use std::fmt;
use std::str::FromStr;

use eniipam::config::DaemonConfig;
use eniipam::pool::config::WarmPolicy;

/// The node rate limit the VPC CNI emulations get: ipamd has no client-side rate limiter of its own
/// (reference §4.2), so the node's buckets are opened wide and only the account's buckets pace it.
const WIDE_OPEN: u32 = 10_000;

/// One warm-pool policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    /// eniipam as shipped: `DaemonConfig::default()`'s knobs (the adaptive warm pool, the node rate
    /// limiter, burst prefixes on Nitro types: a burst beyond the idle IPs takes whole `/28`s in one
    /// assign, or one new ENI when the assign bucket is dry; issue 46 item 1).
    Eniipam,
    /// As shipped with burst prefixes off: single secondary IPs, the structure non-Nitro types
    /// keep (an assign for eth0's room, a create + attach + modify per new ENI).
    EniipamSecondary,
    /// eniipam as shipped with prefix delegation on: slots are `/28`s, counts stay in addresses.
    EniipamPd,
    /// eniipam's adaptive pool set leaner than shipped: `min_idle` 1, `max_idle` 8. A point of its
    /// Pareto curve (p99 wait against free IPs held).
    EniipamLean,
    /// Warmer than shipped: `min_idle` 6, `max_idle` 24.
    EniipamWarm,
    /// Warmer still, one ENI's worth at the floor: `min_idle` = one ENI's pod IPs, `max_idle` three
    /// ENIs' worth (the `warm-eni` emulation's levels, but adaptive and rate-limited).
    EniipamHot,
    /// The VPC CNI's default, `WARM_ENI_TARGET=1`: ipamd keeps one whole spare ENI's IPs free, so a
    /// node's free IPs swing between one and two ENIs' worth (it attaches another when the spare one
    /// gets its first pod, and frees an ENI only when a whole spare one is beyond the target).
    /// Emulated: the fixed policy with `min_idle` = one ENI's pod IPs (14 on an m5.xlarge),
    /// `max_idle` = three ENIs' worth; below `min_idle` the pool tops up halfway, to two ENIs' worth,
    /// and above three it gives back. No node rate limiter.
    WarmEni,
    /// `WARM_IP_TARGET=5` with `MINIMUM_IP_TARGET=10`: five free IPs, at least ten held in all
    /// (used + free), surplus given back. Emulated: the fixed policy with `min_idle` = `max_idle` = 5
    /// and `minimum_ips` = 10. No node rate limiter.
    WarmIp,
    /// `WARM_PREFIX_TARGET=1` with prefix delegation: one whole free `/28` beyond what pods use.
    /// Emulated: the fixed policy with prefix delegation, `min_idle` 16 (one prefix) and `max_idle` 48
    /// (it tops up to two prefixes' worth, gives back above three). No node rate limiter.
    WarmPrefix,
}

impl Policy {
    /// Every policy, in the matrix's order.
    pub const ALL: [Policy; 9] = [
        Policy::Eniipam,
        Policy::EniipamSecondary,
        Policy::EniipamPd,
        Policy::EniipamLean,
        Policy::EniipamWarm,
        Policy::EniipamHot,
        Policy::WarmEni,
        Policy::WarmIp,
        Policy::WarmPrefix,
    ];

    /// The name on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Eniipam => "eniipam",
            Policy::EniipamSecondary => "eniipam-secondary",
            Policy::EniipamPd => "eniipam-pd",
            Policy::EniipamLean => "eniipam-lean",
            Policy::EniipamWarm => "eniipam-warm",
            Policy::EniipamHot => "eniipam-hot",
            Policy::WarmEni => "warm-eni",
            Policy::WarmIp => "warm-ip",
            Policy::WarmPrefix => "warm-prefix",
        }
    }

    /// One of the AWS VPC CNI's policies (the anchors), as opposed to eniipam's.
    pub fn is_vpc_cni(self) -> bool {
        matches!(self, Policy::WarmEni | Policy::WarmIp | Policy::WarmPrefix)
    }

    /// One of eniipam's single-IP settings (its default and the knob variants): the points of its
    /// Pareto curve.
    pub fn on_eniipam_curve(self) -> bool {
        matches!(
            self,
            Policy::Eniipam | Policy::EniipamLean | Policy::EniipamWarm | Policy::EniipamHot
        )
    }

    /// `base` with this policy's knobs; `pod_ips_per_eni` is one ENI's pod IPs on the fleet's
    /// instance type (its IPv4 addresses less the ENI's primary).
    pub fn apply(self, base: DaemonConfig, pod_ips_per_eni: u32) -> DaemonConfig {
        let shipped = DaemonConfig::default();
        let ours = DaemonConfig {
            warm_policy: shipped.warm_policy,
            min_idle: shipped.min_idle,
            max_idle: shipped.max_idle,
            minimum_ips: shipped.minimum_ips,
            prefix_delegation: false,
            burst_prefixes: shipped.burst_prefixes,
            ec2_mutating_qps: shipped.ec2_mutating_qps,
            ec2_mutating_burst: shipped.ec2_mutating_burst,
            ec2_describe_qps: shipped.ec2_describe_qps,
            ec2_describe_burst: shipped.ec2_describe_burst,
            ..base
        };
        let ours_with = |min_idle: u32, max_idle: u32| DaemonConfig {
            min_idle,
            max_idle,
            ..ours.clone()
        };
        let theirs = |min_idle: u32, max_idle: u32, minimum_ips: u32, pd: bool| DaemonConfig {
            warm_policy: WarmPolicy::Fixed,
            min_idle,
            max_idle,
            minimum_ips,
            prefix_delegation: pd,
            // ipamd has no burst prefixes: secondary IPs, or prefixes with prefix delegation.
            burst_prefixes: false,
            ec2_mutating_qps: f64::from(WIDE_OPEN),
            ec2_mutating_burst: WIDE_OPEN,
            ec2_describe_qps: f64::from(WIDE_OPEN),
            ec2_describe_burst: WIDE_OPEN,
            ..ours.clone()
        };
        match self {
            Policy::Eniipam => ours,
            Policy::EniipamSecondary => DaemonConfig {
                burst_prefixes: false,
                ..ours
            },
            Policy::EniipamPd => DaemonConfig {
                prefix_delegation: true,
                ..ours
            },
            Policy::EniipamLean => ours_with(1, 8),
            Policy::EniipamWarm => ours_with(6, 24),
            Policy::EniipamHot => ours_with(pod_ips_per_eni, 3 * pod_ips_per_eni),
            Policy::WarmEni => theirs(pod_ips_per_eni, 3 * pod_ips_per_eni, 0, false),
            Policy::WarmIp => theirs(5, 5, 10, false),
            Policy::WarmPrefix => theirs(16, 48, 0, true),
        }
    }

    /// Whether this policy's nodes hold `/28`s on the fleet's Nitro type (burst prefixes or prefix
    /// delegation), so a launch template's prefixes serve its pods.
    pub fn takes_prefixes(self) -> bool {
        let c = self.apply(DaemonConfig::default(), 14);
        c.prefix_delegation || c.burst_prefixes
    }

    /// The knobs as a phrase for the report's set-up lines.
    pub fn knobs(self, pod_ips_per_eni: u32) -> String {
        let c = self.apply(DaemonConfig::default(), pod_ips_per_eni);
        let mut s = format!(
            "{:?}, min_idle {}, max_idle {}",
            c.warm_policy, c.min_idle, c.max_idle
        );
        if c.minimum_ips > 0 {
            s.push_str(&format!(", minimum_ips {}", c.minimum_ips));
        }
        if c.prefix_delegation {
            s.push_str(", prefix delegation");
        } else if c.burst_prefixes {
            s.push_str(", burst prefixes (Nitro)");
        }
        if self.is_vpc_cni() {
            s.push_str(", no node rate limiter");
        } else {
            s.push_str(&format!(
                ", node buckets mutating {}/s burst {}, describe {}/s burst {}",
                c.ec2_mutating_qps, c.ec2_mutating_burst, c.ec2_describe_qps, c.ec2_describe_burst
            ));
        }
        s
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown policy {s:?} (known: {}, or all)",
                    Policy::ALL.map(Policy::name).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vpc_cni_emulations_have_their_knobs_and_no_node_limiter() {
        let base = DaemonConfig::default();
        let eni = Policy::WarmEni.apply(base.clone(), 14);
        assert_eq!((eni.min_idle, eni.max_idle), (14, 42));
        assert_eq!(eni.warm_policy, WarmPolicy::Fixed);
        assert_eq!(eni.ec2_mutating_burst, WIDE_OPEN);
        let ip = Policy::WarmIp.apply(base.clone(), 14);
        assert_eq!((ip.min_idle, ip.max_idle, ip.minimum_ips), (5, 5, 10));
        let prefix = Policy::WarmPrefix.apply(base.clone(), 14);
        assert!(prefix.prefix_delegation);
        assert_eq!((prefix.min_idle, prefix.max_idle), (16, 48));
        let ours = Policy::Eniipam.apply(base.clone(), 14);
        assert_eq!(ours.warm_policy, base.warm_policy);
        assert_eq!(ours.ec2_mutating_burst, base.ec2_mutating_burst);
        assert!(Policy::EniipamPd.apply(base.clone(), 14).prefix_delegation);
        let hot = Policy::EniipamHot.apply(base.clone(), 14);
        assert_eq!((hot.min_idle, hot.max_idle), (14, 42));
        assert_eq!(hot.warm_policy, base.warm_policy);
        assert_eq!(hot.ec2_mutating_burst, base.ec2_mutating_burst);
        let lean = Policy::EniipamLean.apply(base, 14);
        assert_eq!((lean.min_idle, lean.max_idle), (1, 8));
        assert_eq!("warm-ip".parse::<Policy>(), Ok(Policy::WarmIp));
    }
}
