//! An instance type's network limits: from `DescribeInstanceTypes`, or from the shipped catalogue.

use serde::{Deserialize, Serialize};

/// ENI and IP limits of an instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceLimits {
    /// Maximum network interfaces on the default network card, the primary (eth0) included (the
    /// card every ENI is attached to; multi-card types have more on other cards, as the VPC CNI's
    /// max-pods counts them too).
    pub max_enis: u32,
    /// IPv4 addresses per interface, the ENI's primary IP included (a `/28` prefix counts as one).
    pub ipv4_per_eni: u32,
    /// Default vCPUs (the kubelet's max-pods cap with prefix delegation: 110 up to 30 vCPUs, else 250).
    pub vcpus: u32,
    /// Built on the Nitro system (or bare metal): prefix delegation is possible.
    pub nitro: bool,
}

impl InstanceLimits {
    /// Limits with nothing known beyond ENIs and IPs (a non-Nitro type with 2 vCPUs).
    pub fn new(max_enis: u32, ipv4_per_eni: u32) -> Self {
        Self {
            max_enis,
            ipv4_per_eni,
            vcpus: 2,
            nitro: false,
        }
    }

    /// The shipped catalogue's figures for `instance_type` (`eniipam-limits`, EC2's
    /// `DescribeInstanceTypes` figures): the same as [`Cloud::instance_limits`] would answer, without
    /// the call. `None` for a type the catalogue does not know (ask EC2 then).
    pub fn from_catalog(instance_type: &str) -> Option<Self> {
        eniipam_limits::lookup(instance_type).map(|t| Self {
            max_enis: t.default_card_max_enis(),
            ipv4_per_eni: t.ipv4_per_eni,
            vcpus: t.vcpus,
            nitro: t.is_nitro(),
        })
    }

    /// The figures `eniipam-limits`' formulas take (the ENIs are the default card's already).
    pub fn eni_limits(&self) -> eniipam_limits::EniLimits {
        eniipam_limits::EniLimits {
            enis: self.max_enis,
            ipv4_per_eni: self.ipv4_per_eni,
            vcpus: self.vcpus,
        }
    }
}
