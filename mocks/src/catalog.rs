//! Instance types with EC2's published network figures, as `DescribeInstanceTypes` reports them.
//!
//! `max_enis` is `NetworkInfo.MaximumNetworkInterfaces`: every network interface of the instance, on
//! all its network cards (eth0 included). `ipv4_per_eni` counts every IPv4 address of one interface
//! (its primary included; an IPv4 prefix counts as one). Multi-card types (p4d.24xlarge, p5.48xlarge,
//! c6in.32xlarge) split `max_enis` evenly over `network_cards` cards, card 0 being the default; the
//! VPC CNI and nodeadm compute max-pods from the default card only.
//!
//! Figures: the AWS VPC CNI's generated `pkg/vpc/vpc_ip_resource_limit.go` (ENIs per card, IPv4 per
//! ENI, hypervisor, bare metal) and `misc/eni-max-pods.txt` (cross-checked in the tests below); vCPUs
//! from EC2's instance type pages. Bare-metal types report no hypervisor, as EC2 does.

use serde::Serialize;

/// EC2's hypervisor names.
pub const NITRO: &str = "nitro";
pub const XEN: &str = "xen";

/// Network limits of one instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceType {
    pub name: &'static str,
    /// `MaximumNetworkInterfaces`: all cards together.
    pub max_enis: u32,
    /// `Ipv4AddressesPerInterface`.
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
    /// Nitro-based (prefix delegation and IPv6 prefixes work): `Hypervisor == nitro` or bare metal, the
    /// test the VPC CNI applies.
    pub fn is_nitro(&self) -> bool {
        self.hypervisor == Some(NITRO) || self.bare_metal
    }

    /// The network cards, index order.
    pub fn cards(&self) -> Vec<NetworkCard> {
        (0..self.network_cards)
            .map(|index| NetworkCard {
                index,
                max_enis: self.max_enis / self.network_cards,
            })
            .collect()
    }

    /// One card, if the type has it.
    pub fn card(&self, index: u32) -> Option<NetworkCard> {
        (index < self.network_cards).then(|| NetworkCard {
            index,
            max_enis: self.max_enis / self.network_cards,
        })
    }

    /// ENIs on the default card (what max-pods is computed from).
    pub fn default_card_max_enis(&self) -> u32 {
        self.card(self.default_network_card)
            .map_or(self.max_enis, |c| c.max_enis)
    }

    /// The VPC CNI's max-pods: `ENIs × (IPv4 per ENI − 1) + 2` on the default card.
    pub fn max_pods(&self) -> u32 {
        self.default_card_max_enis() * (self.ipv4_per_eni - 1) + 2
    }
}

const fn it(
    name: &'static str,
    vcpus: u32,
    hypervisor: Option<&'static str>,
    max_enis: u32,
    ipv4_per_eni: u32,
) -> InstanceType {
    InstanceType {
        name,
        max_enis,
        ipv4_per_eni,
        vcpus,
        hypervisor,
        bare_metal: false,
        network_cards: 1,
        default_network_card: 0,
    }
}

const fn nitro(name: &'static str, vcpus: u32, max_enis: u32, ipv4_per_eni: u32) -> InstanceType {
    it(name, vcpus, Some(NITRO), max_enis, ipv4_per_eni)
}

const fn xen(name: &'static str, vcpus: u32, max_enis: u32, ipv4_per_eni: u32) -> InstanceType {
    it(name, vcpus, Some(XEN), max_enis, ipv4_per_eni)
}

const fn metal(name: &'static str, vcpus: u32, max_enis: u32, ipv4_per_eni: u32) -> InstanceType {
    InstanceType {
        bare_metal: true,
        ..it(name, vcpus, None, max_enis, ipv4_per_eni)
    }
}

/// A Nitro type with `cards` network cards of `per_card` ENIs each.
const fn multi_card(
    name: &'static str,
    vcpus: u32,
    cards: u32,
    per_card: u32,
    ipv4_per_eni: u32,
) -> InstanceType {
    InstanceType {
        network_cards: cards,
        ..nitro(name, vcpus, cards * per_card, ipv4_per_eni)
    }
}

/// The built-in catalog.
pub const CATALOG: &[InstanceType] = &[
    // Burstable, Xen (no prefix delegation).
    xen("t2.nano", 1, 2, 2),
    xen("t2.micro", 1, 2, 2),
    xen("t2.small", 1, 3, 4),
    xen("t2.medium", 2, 3, 6),
    xen("t2.large", 2, 3, 12),
    xen("t2.xlarge", 4, 3, 15),
    xen("t2.2xlarge", 8, 3, 15),
    // Burstable, Nitro.
    nitro("t3.nano", 2, 2, 2),
    nitro("t3.micro", 2, 2, 2),
    nitro("t3.small", 2, 3, 4),
    nitro("t3.medium", 2, 3, 6),
    nitro("t3.large", 2, 3, 12),
    nitro("t3.xlarge", 4, 4, 15),
    nitro("t3.2xlarge", 8, 4, 15),
    // Previous generation, Xen.
    xen("m4.large", 2, 2, 10),
    xen("m4.xlarge", 4, 4, 15),
    xen("m4.2xlarge", 8, 4, 15),
    xen("m4.4xlarge", 16, 8, 30),
    xen("m4.10xlarge", 40, 8, 30),
    xen("m4.16xlarge", 64, 8, 30),
    xen("c4.large", 2, 3, 10),
    xen("c4.xlarge", 4, 4, 15),
    xen("c4.2xlarge", 8, 4, 15),
    xen("c4.4xlarge", 16, 8, 30),
    xen("c4.8xlarge", 36, 8, 30),
    // General purpose, Nitro.
    nitro("m5.large", 2, 3, 10),
    nitro("m5.xlarge", 4, 4, 15),
    nitro("m5.2xlarge", 8, 4, 15),
    nitro("m5.4xlarge", 16, 8, 30),
    nitro("m5.8xlarge", 32, 8, 30),
    nitro("m5.12xlarge", 48, 8, 30),
    nitro("m5.16xlarge", 64, 15, 50),
    nitro("m5.24xlarge", 96, 15, 50),
    metal("m5.metal", 96, 15, 50),
    nitro("m6i.large", 2, 3, 10),
    nitro("m6i.xlarge", 4, 4, 15),
    nitro("m6i.2xlarge", 8, 4, 15),
    nitro("m6i.4xlarge", 16, 8, 30),
    nitro("m6i.8xlarge", 32, 8, 30),
    nitro("m6i.12xlarge", 48, 8, 30),
    nitro("m6i.16xlarge", 64, 15, 50),
    nitro("m6i.24xlarge", 96, 15, 50),
    nitro("m6i.32xlarge", 128, 15, 50),
    metal("m6i.metal", 128, 15, 50),
    // Compute optimised, Nitro.
    nitro("c5.large", 2, 3, 10),
    nitro("c5.xlarge", 4, 4, 15),
    nitro("c5.2xlarge", 8, 4, 15),
    nitro("c5.4xlarge", 16, 8, 30),
    nitro("c5.9xlarge", 36, 8, 30),
    nitro("c5.12xlarge", 48, 8, 30),
    nitro("c5.18xlarge", 72, 15, 50),
    nitro("c5.24xlarge", 96, 15, 50),
    metal("c5.metal", 96, 15, 50),
    nitro("c6in.large", 2, 3, 10),
    nitro("c6in.xlarge", 4, 4, 15),
    nitro("c6in.2xlarge", 8, 4, 15),
    nitro("c6in.4xlarge", 16, 8, 30),
    nitro("c6in.8xlarge", 32, 8, 30),
    nitro("c6in.12xlarge", 48, 8, 30),
    nitro("c6in.16xlarge", 64, 15, 50),
    nitro("c6in.24xlarge", 96, 15, 50),
    multi_card("c6in.32xlarge", 128, 2, 8, 50),
    // Memory optimised, Nitro.
    nitro("r5.large", 2, 3, 10),
    nitro("r5.xlarge", 4, 4, 15),
    nitro("r5.2xlarge", 8, 4, 15),
    nitro("r5.4xlarge", 16, 8, 30),
    nitro("r5.8xlarge", 32, 8, 30),
    nitro("r5.12xlarge", 48, 8, 30),
    nitro("r5.16xlarge", 64, 15, 50),
    nitro("r5.24xlarge", 96, 15, 50),
    metal("r5.metal", 96, 15, 50),
    // Accelerated, several network cards.
    multi_card("p4d.24xlarge", 96, 4, 15, 50),
    multi_card("p5.48xlarge", 192, 32, 2, 50),
];

/// The most IPv4 addresses any interface in the catalog can hold (limits creating unattached ENIs).
pub const MAX_IPV4_PER_ENI: u32 = 50;

/// Looks an instance type up by name.
pub fn lookup(name: &str) -> Option<InstanceType> {
    CATALOG.iter().copied().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(CATALOG.iter().all(|t| t.ipv4_per_eni <= MAX_IPV4_PER_ENI));
        let names: std::collections::BTreeSet<_> = CATALOG.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), CATALOG.len(), "no duplicate names");
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
}
