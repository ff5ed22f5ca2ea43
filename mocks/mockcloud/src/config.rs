//! mockcloud's knobs: latency, throttling, IMDS lag, attach timing. Everything is adjustable at run
//! time through [`crate::MockCloud`] or the control API.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::new_eni_lag::NewEniLag;
use crate::throttling::Throttling;

/// How long EC2 takes to answer, per action, and how long state changes take to settle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencyProfile {
    /// Reply latency per action name; actions not listed use `default`.
    #[serde(with = "millis_map")]
    pub per_action: BTreeMap<String, Duration>,
    #[serde(with = "millis")]
    pub default: Duration,
    /// Each latency is scaled by a uniform factor in [1 - jitter, 1 + jitter].
    pub jitter: f64,
    /// An attachment stays `attaching` this long before it is `attached`.
    #[serde(with = "millis")]
    pub attach_delay: Duration,
    /// A detachment stays `detaching` this long before the ENI is `available`.
    #[serde(with = "millis")]
    pub detach_delay: Duration,
    /// Changes made through EC2 show in an instance's IMDS only after this long.
    #[serde(with = "millis")]
    pub imds_lag: Duration,
    /// EC2's own describes (`DescribeNetworkInterfaces`, `DescribeInstances`) show an ENI's addresses
    /// and prefixes as they were this long ago: EC2's API is eventually consistent (AWS's
    /// *Eventual consistency in the Amazon EC2 API*: a change may take seconds to minutes to show).
    /// An address assigned shows only after the lag; one unassigned shows until it has passed.
    #[serde(with = "millis", default)]
    pub describe_lag: Duration,
    /// What EC2 does not show yet of an ENI it has just created or attached: describes do not list
    /// it, and the first calls on it answer `InvalidNetworkInterfaceID.NotFound` ([`NewEniLag`]).
    #[serde(default)]
    pub new_eni_lag: NewEniLag,
    /// IMDS reply latency.
    #[serde(with = "millis")]
    pub imds_latency: Duration,
}

impl LatencyProfile {
    /// No latency and no lag: for unit and integration tests.
    pub fn fast() -> Self {
        Self {
            per_action: BTreeMap::new(),
            default: Duration::ZERO,
            jitter: 0.0,
            attach_delay: Duration::ZERO,
            detach_delay: Duration::ZERO,
            imds_lag: Duration::ZERO,
            describe_lag: Duration::ZERO,
            new_eni_lag: NewEniLag::none(),
            imds_latency: Duration::ZERO,
        }
    }

    /// Figures in line with what EC2 shows from inside a region: describe calls ~100 ms, ENI creation
    /// ~400 ms, attach answered in ~250 ms but `attaching` for ~2 s, IP assignment ~250 ms, IMDS
    /// catching up ~1 s after a change (the AWS VPC CNI documents "up to 10 seconds" for create+attach),
    /// EC2's describes ~2 s (EC2 publishes no figure; its guidance is "seconds to minutes"), a new
    /// ENI unlisted for as long and its first call refused ([`NewEniLag::realistic`]).
    pub fn realistic() -> Self {
        let ms = Duration::from_millis;
        let per_action = [
            ("DescribeInstances", ms(120)),
            ("DescribeInstanceTypes", ms(100)),
            ("DescribeSubnets", ms(80)),
            ("DescribeNetworkInterfaces", ms(100)),
            ("CreateNetworkInterface", ms(400)),
            ("AttachNetworkInterface", ms(250)),
            ("DetachNetworkInterface", ms(200)),
            ("DeleteNetworkInterface", ms(250)),
            ("ModifyNetworkInterfaceAttribute", ms(150)),
            ("AssignPrivateIpAddresses", ms(250)),
            ("UnassignPrivateIpAddresses", ms(200)),
            ("AssignIpv6Addresses", ms(250)),
            ("UnassignIpv6Addresses", ms(200)),
            ("CreateTags", ms(120)),
            ("DeleteTags", ms(120)),
            ("CreateSubnetCidrReservation", ms(200)),
            ("GetSubnetCidrReservations", ms(100)),
            ("DeleteSubnetCidrReservation", ms(200)),
        ]
        .into_iter()
        .map(|(a, d)| (a.to_owned(), d))
        .collect();
        Self {
            per_action,
            default: ms(150),
            jitter: 0.2,
            attach_delay: ms(2000),
            detach_delay: ms(2000),
            imds_lag: ms(1000),
            describe_lag: ms(2000),
            new_eni_lag: NewEniLag::realistic(),
            imds_latency: ms(1),
        }
    }

    /// The nominal (un-jittered) latency of an action.
    pub fn latency(&self, action: &str) -> Duration {
        self.per_action.get(action).copied().unwrap_or(self.default)
    }

    /// Parses a profile name: `fast` or `realistic`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "fast" => Some(Self::fast()),
            "realistic" => Some(Self::realistic()),
            _ => None,
        }
    }
}

/// Everything mockcloud starts with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub latency: LatencyProfile,
    pub throttling: Throttling,
    /// Create one VPC (10.0.0.0/16), one subnet (10.0.0.0/20) and one running instance at start.
    pub seed_default_world: bool,
    /// The instance type of the default instance.
    pub default_instance_type: String,
    /// Region reported in the default availability zone (`<region>a`).
    pub region: String,
    /// The account-wide IAM policy every EC2 call is evaluated against (None: no enforcement).
    #[serde(default)]
    pub iam_policy: Option<crate::iam::Policy>,
}

impl Config {
    /// Fast profile, throttling off, default world seeded: what most tests want.
    pub fn fast() -> Self {
        Self {
            latency: LatencyProfile::fast(),
            throttling: Throttling::disabled(),
            seed_default_world: true,
            default_instance_type: "m5.large".to_owned(),
            region: "us-east-1".to_owned(),
            iam_policy: None,
        }
    }

    /// Realistic latency and EC2's default throttling.
    pub fn realistic() -> Self {
        Self {
            latency: LatencyProfile::realistic(),
            throttling: Throttling::default(),
            ..Self::fast()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::fast()
    }
}

pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

mod millis_map {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<String, Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        m.iter()
            .map(|(k, v)| (k.clone(), v.as_millis() as u64))
            .collect::<BTreeMap<_, _>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Duration>, D::Error> {
        Ok(BTreeMap::<String, u64>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| (k, Duration::from_millis(v)))
            .collect())
    }
}
