//! `eniipam-limits`: EC2 instance types' network limits, and the max-pods formulas that follow from
//! them — eniipam's and the AWS VPC CNI's — in one place, so `eniipamctl max-pods`, the daemon's
//! capacity and mockcloud's EC2 all use the same figures.
//!
//! - [`CATALOG`] / [`lookup`]: the instance types in `data/instance-types.csv` (73 types with EC2's
//!   `DescribeInstanceTypes` figures), turned into a `const` table by `build.rs`.
//! - [`EniLimits`]: the three numbers every formula needs (ENIs on the default network card, IPv4
//!   addresses per ENI, vCPUs); from a catalog entry or from `DescribeInstanceTypes` at run time.
//! - [`vpc_cni_max_pods`]: the VPC CNI's (`eni-max-pods.txt`, and `max-pods-calculator.sh` with
//!   prefix delegation).
//! - [`eniipam_pod_ips`] / [`eniipam_max_pods`]: eniipam's, with eth0's secondary IPs serving pods.
//!
//! A slot is one secondary IPv4 address, or one `/28` prefix (16 addresses) with prefix delegation.
//! The primary address of every ENI is never a pod's, hence `IPv4 per ENI − 1` slots per ENI.

use serde::Serialize;

/// EC2's hypervisor names.
pub const NITRO: &str = "nitro";
pub const XEN: &str = "xen";

/// Pods with `hostNetwork` (kube-proxy, the CNI's own DaemonSet) take no pod IP: both formulas add
/// this many to the address count, as the VPC CNI's table does.
pub const HOST_NETWORK_PODS: u32 = 2;

/// Addresses in one delegated prefix (`/28`).
pub const ADDRESSES_PER_PREFIX: u32 = 16;

/// The Kubernetes-recommended max-pods ceiling that EKS applies with prefix delegation
/// (`max-pods-calculator.sh`, managed node groups): 110 up to 30 vCPUs, 250 above.
pub fn prefix_delegation_cap(vcpus: u32) -> u32 {
    if vcpus > 30 { 250 } else { 110 }
}

/// Network limits of one instance type, as `DescribeInstanceTypes` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceType {
    pub name: &'static str,
    /// `MaximumNetworkInterfaces`: all cards together, eth0 included.
    pub max_enis: u32,
    /// `Ipv4AddressesPerInterface` (the primary included; a prefix counts as one).
    pub ipv4_per_eni: u32,
    /// `VCpuInfo.DefaultVCpus`.
    pub vcpus: u32,
    /// `Hypervisor`: `nitro` or `xen`; `None` on bare metal.
    pub hypervisor: Option<&'static str>,
    /// `BareMetal`.
    pub bare_metal: bool,
    /// `MaximumNetworkCards`.
    pub network_cards: u32,
    /// `DefaultNetworkCardIndex`.
    pub default_network_card: u32,
}

/// One entry of `NetworkInfo.NetworkCards`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NetworkCard {
    pub index: u32,
    /// ENIs this card can hold.
    pub max_enis: u32,
}

impl InstanceType {
    /// Nitro-based (prefix delegation works): `Hypervisor == nitro` or bare metal, the test the VPC
    /// CNI applies.
    pub fn is_nitro(&self) -> bool {
        self.hypervisor == Some(NITRO) || self.bare_metal
    }

    /// The network cards, index order (`max_enis` split evenly, as on every multi-card type).
    pub fn cards(&self) -> Vec<NetworkCard> {
        (0..self.network_cards)
            .filter_map(|i| self.card(i))
            .collect()
    }

    /// One card, if the type has it.
    pub fn card(&self, index: u32) -> Option<NetworkCard> {
        (index < self.network_cards).then(|| NetworkCard {
            index,
            max_enis: self.max_enis / self.network_cards,
        })
    }

    /// ENIs on the default card: what max-pods is computed from (pods use that card only).
    pub fn default_card_max_enis(&self) -> u32 {
        self.card(self.default_network_card)
            .map_or(self.max_enis, |c| c.max_enis)
    }

    /// The figures the max-pods formulas need.
    pub fn eni_limits(&self) -> EniLimits {
        EniLimits {
            enis: self.default_card_max_enis(),
            ipv4_per_eni: self.ipv4_per_eni,
            vcpus: self.vcpus,
        }
    }

    /// The VPC CNI's max-pods with secondary IPs (its `eni-max-pods.txt` value).
    pub fn max_pods(&self) -> u32 {
        vpc_cni_max_pods(&self.eni_limits(), AddressMode::SecondaryIps)
    }
}

include!(concat!(env!("OUT_DIR"), "/catalog.rs"));

/// The most IPv4 addresses any interface in the catalog can hold (EC2's limit for an ENI that is not
/// attached yet, when nothing else is known).
pub const MAX_IPV4_PER_ENI: u32 = 50;

/// Looks an instance type up by name.
pub fn lookup(name: &str) -> Option<InstanceType> {
    CATALOG.iter().copied().find(|t| t.name == name)
}

/// How pods get addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressMode {
    /// One secondary IPv4 address per slot.
    SecondaryIps,
    /// One `/28` prefix (16 addresses) per slot: `ENABLE_PREFIX_DELEGATION` in the VPC CNI.
    Prefixes,
}

/// The inputs of the max-pods formulas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EniLimits {
    /// ENIs on the default network card, eth0 included (`MaximumNetworkInterfaces` of that card).
    pub enis: u32,
    /// `Ipv4AddressesPerInterface`.
    pub ipv4_per_eni: u32,
    /// `VCpuInfo.DefaultVCpus` (only the prefix-delegation cap uses it).
    pub vcpus: u32,
}

/// Why [`EniLimits::new`] refused its inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLimits(pub String);

impl std::fmt::Display for BadLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadLimits {}

impl EniLimits {
    /// Checked construction, with generous sanity bounds (EC2 has at most 64 ENIs per card and 50 IPv4
    /// addresses per ENI today).
    pub fn new(enis: u32, ipv4_per_eni: u32, vcpus: u32) -> Result<Self, BadLimits> {
        if !(1..=128).contains(&enis) {
            return Err(BadLimits(format!(
                "ENIs per instance must be between 1 and 128, not {enis}"
            )));
        }
        if !(1..=256).contains(&ipv4_per_eni) {
            return Err(BadLimits(format!(
                "IPv4 addresses per ENI must be between 1 and 256, not {ipv4_per_eni}"
            )));
        }
        if !(1..=4096).contains(&vcpus) {
            return Err(BadLimits(format!(
                "vCPUs must be between 1 and 4096, not {vcpus}"
            )));
        }
        Ok(Self {
            enis,
            ipv4_per_eni,
            vcpus,
        })
    }

    /// Slots on one ENI: every address but the primary.
    pub fn slots_per_eni(&self) -> u32 {
        self.ipv4_per_eni.saturating_sub(1)
    }
}

impl AddressMode {
    /// Addresses one slot holds: 1, or 16 with prefixes.
    pub fn addresses_per_slot(self) -> u32 {
        match self {
            AddressMode::SecondaryIps => 1,
            AddressMode::Prefixes => ADDRESSES_PER_PREFIX,
        }
    }
}

/// The AWS VPC CNI's max-pods: `ENIs × (IPv4 per ENI − 1) + 2` with secondary IPs (its
/// `eni-max-pods.txt`: m5.large 29, t3.micro 4, p5.48xlarge 100); with prefix delegation
/// `ENIs × (IPv4 per ENI − 1) × 16 + 2`, capped at 110, or 250 above 30 vCPUs
/// (`max-pods-calculator.sh`). ENIs on the default network card only.
pub fn vpc_cni_max_pods(l: &EniLimits, mode: AddressMode) -> u32 {
    let addresses = eniipam_pod_ips(l, mode);
    let pods = addresses + HOST_NETWORK_PODS;
    match mode {
        AddressMode::SecondaryIps => pods,
        AddressMode::Prefixes => pods.min(prefix_delegation_cap(l.vcpus)),
    }
}

/// Pod addresses eniipam can hold on one node: `ENIs × (IPv4 per ENI − 1)` slots (eth0's secondary
/// IPs serve pods, a secondary ENI's primary never does), × 16 with prefixes.
///
/// The daemon's capacity (`src/pool/capacity.rs`) is this on the ENIs that serve pods (foreign ENIs,
/// and eth0 when it does not serve pods, left out), capped by its `max_ips`.
pub fn eniipam_pod_ips(l: &EniLimits, mode: AddressMode) -> u32 {
    l.enis
        .saturating_mul(l.slots_per_eni())
        .saturating_mul(mode.addresses_per_slot())
}

/// What kubelet's `maxPods` should be on an eniipam node: its pod addresses plus 2 host-network pods.
/// With prefixes the same Kubernetes ceiling as the VPC CNI applies (110, or 250 above 30 vCPUs): a
/// node has far more addresses than kubelet is tested for.
pub fn eniipam_max_pods(l: &EniLimits, mode: AddressMode) -> u32 {
    let pods = eniipam_pod_ips(l, mode) + HOST_NETWORK_PODS;
    match mode {
        AddressMode::SecondaryIps => pods,
        AddressMode::Prefixes => pods.min(prefix_delegation_cap(l.vcpus)),
    }
}

/// A nodeadm `maxPodsExpression` (CEL; variables `default_enis`, `ips_per_eni`, `max_pods`) that
/// computes [`eniipam_max_pods`] on the node itself, for a whole node group. With prefixes the cap
/// depends on vCPUs, which nodeadm does not expose: `cap` is the group's (110 or 250).
pub fn nodeadm_max_pods_expression(mode: AddressMode, cap: u32) -> String {
    match mode {
        AddressMode::SecondaryIps => "default_enis * (ips_per_eni - 1) + 2".to_owned(),
        AddressMode::Prefixes => format!(
            "default_enis * (ips_per_eni - 1) * 16 + 2 < {cap} ? default_enis * (ips_per_eni - 1) * 16 + 2 : {cap}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(name: &str) -> EniLimits {
        lookup(name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .eni_limits()
    }

    #[test]
    fn published_figures() {
        for (name, enis, ips) in [
            ("t3.medium", 3, 6),
            ("m5.large", 3, 10),
            ("m5.xlarge", 4, 15),
            ("c5.4xlarge", 8, 30),
            ("m5.24xlarge", 15, 50),
            ("m4.large", 2, 10),
            ("p4d.24xlarge", 60, 50),
            ("p5.48xlarge", 64, 50),
            ("c6in.32xlarge", 16, 50),
        ] {
            let t = lookup(name).unwrap();
            assert_eq!((t.max_enis, t.ipv4_per_eni), (enis, ips), "{name}");
        }
        assert!(lookup("x9.mega").is_none());
        assert_eq!(CATALOG.len(), 73);
        assert!(CATALOG.iter().all(|t| t.ipv4_per_eni <= MAX_IPV4_PER_ENI));
        let names: std::collections::BTreeSet<_> = CATALOG.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), CATALOG.len(), "no duplicate names");
    }

    /// The reference's examples of the VPC CNI's published values.
    #[test]
    fn vpc_cni_examples() {
        let secondary = |n: &str| vpc_cni_max_pods(&limits(n), AddressMode::SecondaryIps);
        assert_eq!(secondary("m5.large"), 29);
        assert_eq!(secondary("t3.micro"), 4);
        assert_eq!(secondary("p5.48xlarge"), 100, "default card only: 2 ENIs");
        assert_eq!(secondary("t3.small"), 11);
        assert_eq!(secondary("t3.medium"), 17);
        assert_eq!(secondary("m5.xlarge"), 58);
        assert_eq!(secondary("m5.24xlarge"), 737);
        assert_eq!(secondary("c5.18xlarge"), 737);
    }

    /// `max-pods-calculator.sh --cni-prefix-delegation-enabled`: ×16, then 110 (≤ 30 vCPUs) or 250.
    #[test]
    fn vpc_cni_prefix_delegation() {
        let pd = |n: &str| vpc_cni_max_pods(&limits(n), AddressMode::Prefixes);
        assert_eq!(pd("m5.large"), 110, "434 addresses, 2 vCPUs: 110");
        assert_eq!(pd("t3.micro"), 34, "2 × 1 × 16 + 2, below the cap");
        assert_eq!(pd("t3.nano"), 34);
        assert_eq!(pd("m5.24xlarge"), 250, "96 vCPUs: 250");
        assert_eq!(pd("c5.9xlarge"), 250, "36 vCPUs: 250");
        assert_eq!(pd("m5.8xlarge"), 250, "32 vCPUs: 250");
        assert_eq!(pd("c4.8xlarge"), 250);
        assert_eq!(pd("m5.4xlarge"), 110, "16 vCPUs: 110");
        assert_eq!(prefix_delegation_cap(30), 110);
        assert_eq!(prefix_delegation_cap(31), 250);
    }

    #[test]
    fn eniipam_formulas() {
        let m5 = limits("m5.large");
        assert_eq!(eniipam_pod_ips(&m5, AddressMode::SecondaryIps), 27);
        assert_eq!(eniipam_max_pods(&m5, AddressMode::SecondaryIps), 29);
        assert_eq!(eniipam_pod_ips(&m5, AddressMode::Prefixes), 432);
        assert_eq!(eniipam_max_pods(&m5, AddressMode::Prefixes), 110);
        let micro = limits("t3.micro");
        assert_eq!(eniipam_max_pods(&micro, AddressMode::SecondaryIps), 4);
        assert_eq!(eniipam_max_pods(&micro, AddressMode::Prefixes), 34);
        let p5 = limits("p5.48xlarge");
        assert_eq!(eniipam_pod_ips(&p5, AddressMode::SecondaryIps), 98);
    }

    /// With eth0's IPs serving pods, eniipam's secondary-IP figure is the VPC CNI's for every type,
    /// and with prefixes both apply the same cap.
    #[test]
    fn eniipam_equals_the_vpc_cni_on_every_type() {
        for t in CATALOG {
            for mode in [AddressMode::SecondaryIps, AddressMode::Prefixes] {
                let l = t.eni_limits();
                assert_eq!(
                    eniipam_max_pods(&l, mode),
                    vpc_cni_max_pods(&l, mode),
                    "{} {mode:?}",
                    t.name
                );
            }
        }
    }

    /// The first column of the VPC CNI's `misc/eni-max-pods.txt` for every type in the catalog.
    #[test]
    fn max_pods_match_the_vpc_cni_table() {
        let table: &[(&str, u32)] = &[
            ("t2.nano", 4),
            ("t2.micro", 4),
            ("t2.small", 11),
            ("t2.medium", 17),
            ("t2.large", 35),
            ("t2.xlarge", 44),
            ("t2.2xlarge", 44),
            ("t3.nano", 4),
            ("t3.micro", 4),
            ("t3.small", 11),
            ("t3.medium", 17),
            ("t3.large", 35),
            ("t3.xlarge", 58),
            ("t3.2xlarge", 58),
            ("m4.large", 20),
            ("m4.xlarge", 58),
            ("m4.2xlarge", 58),
            ("m4.4xlarge", 234),
            ("m4.10xlarge", 234),
            ("m4.16xlarge", 234),
            ("c4.large", 29),
            ("c4.xlarge", 58),
            ("c4.2xlarge", 58),
            ("c4.4xlarge", 234),
            ("c4.8xlarge", 234),
            ("m5.large", 29),
            ("m5.xlarge", 58),
            ("m5.2xlarge", 58),
            ("m5.4xlarge", 234),
            ("m5.8xlarge", 234),
            ("m5.12xlarge", 234),
            ("m5.16xlarge", 737),
            ("m5.24xlarge", 737),
            ("m5.metal", 737),
            ("m6i.large", 29),
            ("m6i.xlarge", 58),
            ("m6i.2xlarge", 58),
            ("m6i.4xlarge", 234),
            ("m6i.8xlarge", 234),
            ("m6i.12xlarge", 234),
            ("m6i.16xlarge", 737),
            ("m6i.24xlarge", 737),
            ("m6i.32xlarge", 737),
            ("m6i.metal", 737),
            ("c5.large", 29),
            ("c5.xlarge", 58),
            ("c5.2xlarge", 58),
            ("c5.4xlarge", 234),
            ("c5.9xlarge", 234),
            ("c5.12xlarge", 234),
            ("c5.18xlarge", 737),
            ("c5.24xlarge", 737),
            ("c5.metal", 737),
            ("c6in.large", 29),
            ("c6in.xlarge", 58),
            ("c6in.2xlarge", 58),
            ("c6in.4xlarge", 234),
            ("c6in.8xlarge", 234),
            ("c6in.12xlarge", 234),
            ("c6in.16xlarge", 737),
            ("c6in.24xlarge", 737),
            ("c6in.32xlarge", 394),
            ("r5.large", 29),
            ("r5.xlarge", 58),
            ("r5.2xlarge", 58),
            ("r5.4xlarge", 234),
            ("r5.8xlarge", 234),
            ("r5.12xlarge", 234),
            ("r5.16xlarge", 737),
            ("r5.24xlarge", 737),
            ("r5.metal", 737),
            ("p4d.24xlarge", 737),
            ("p5.48xlarge", 100),
        ];
        assert_eq!(table.len(), CATALOG.len(), "every type is cross-checked");
        for (name, pods) in table {
            let t = lookup(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(t.max_pods(), *pods, "{name}");
        }
    }

    #[test]
    fn nitro_and_cards() {
        assert!(lookup("m5.large").unwrap().is_nitro());
        assert!(lookup("m5.metal").unwrap().is_nitro(), "bare metal counts");
        assert!(!lookup("t2.medium").unwrap().is_nitro());
        assert!(!lookup("m4.large").unwrap().is_nitro());
        let p5 = lookup("p5.48xlarge").unwrap();
        assert_eq!(p5.cards().len(), 32);
        assert_eq!(p5.card(31).unwrap().max_enis, 2);
        assert!(p5.card(32).is_none());
        assert_eq!(p5.default_card_max_enis(), 2);
        let m5 = lookup("m5.large").unwrap();
        assert_eq!(
            m5.cards(),
            vec![NetworkCard {
                index: 0,
                max_enis: 3
            }]
        );
    }

    #[test]
    fn bad_limits_are_refused_by_name() {
        assert!(EniLimits::new(0, 10, 2).unwrap_err().0.contains("ENIs"));
        assert!(EniLimits::new(3, 0, 2).unwrap_err().0.contains("IPv4"));
        assert!(EniLimits::new(3, 10, 0).unwrap_err().0.contains("vCPUs"));
        assert_eq!(
            EniLimits::new(3, 10, 2).unwrap(),
            limits("m5.large"),
            "the same figures as the catalog's"
        );
    }

    #[test]
    fn nodeadm_expressions() {
        assert_eq!(
            nodeadm_max_pods_expression(AddressMode::SecondaryIps, 110),
            "default_enis * (ips_per_eni - 1) + 2"
        );
        assert!(nodeadm_max_pods_expression(AddressMode::Prefixes, 250).ends_with(": 250"));
    }
}
