//! Instance-type network limits, with EC2's published figures.
//!
//! `max_enis` counts every network interface (eth0 included); `ipv4_per_eni` counts every IPv4 address
//! on one interface (its primary included). These are the numbers `DescribeInstanceTypes` reports as
//! `maximumNetworkInterfaces` and `ipv4AddressesPerInterface`.

/// Network limits of one instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InstanceType {
    pub name: &'static str,
    pub max_enis: u32,
    pub ipv4_per_eni: u32,
}

const fn t(name: &'static str, max_enis: u32, ipv4_per_eni: u32) -> InstanceType {
    InstanceType {
        name,
        max_enis,
        ipv4_per_eni,
    }
}

/// The built-in catalog (EC2 documentation, "IP addresses per network interface per instance type").
pub const CATALOG: &[InstanceType] = &[
    t("t3.nano", 2, 2),
    t("t3.micro", 2, 2),
    t("t3.small", 3, 4),
    t("t3.medium", 3, 6),
    t("t3.large", 3, 12),
    t("t3.xlarge", 4, 15),
    t("t3.2xlarge", 4, 15),
    t("m5.large", 3, 10),
    t("m5.xlarge", 4, 15),
    t("m5.2xlarge", 4, 15),
    t("m5.4xlarge", 8, 30),
    t("m5.8xlarge", 8, 30),
    t("m5.12xlarge", 8, 30),
    t("m5.16xlarge", 15, 50),
    t("m5.24xlarge", 15, 50),
    t("c5.large", 3, 10),
    t("c5.xlarge", 4, 15),
    t("c5.2xlarge", 4, 15),
    t("c5.4xlarge", 8, 30),
    t("c5.9xlarge", 8, 30),
    t("c5.12xlarge", 8, 30),
    t("c5.18xlarge", 15, 50),
    t("c5.24xlarge", 15, 50),
    t("r5.large", 3, 10),
    t("r5.xlarge", 4, 15),
    t("r5.4xlarge", 8, 30),
    t("r5.24xlarge", 15, 50),
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
        ] {
            let t = lookup(name).unwrap();
            assert_eq!((t.max_enis, t.ipv4_per_eni), (enis, ips), "{name}");
        }
        assert!(lookup("x9.mega").is_none());
        assert!(CATALOG.iter().all(|t| t.ipv4_per_eni <= MAX_IPV4_PER_ENI));
    }
}
