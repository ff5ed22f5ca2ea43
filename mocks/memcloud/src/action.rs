//! What the fake records, fails or delays: [`Action`], one per EC2 action or IMDS read, and
//! [`CallRecord`], one per call made.

use std::fmt;

use eniipam_cloud::CloudError;

/// One call the fake can record, fail or delay: the EC2 action it stands for, or an IMDS read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    DescribeInstances,
    DescribeInstanceTypes,
    DescribeSubnets,
    DescribeNetworkInterfaces,
    CreateNetworkInterface,
    AttachNetworkInterface,
    ModifyNetworkInterfaceAttribute,
    DetachNetworkInterface,
    DeleteNetworkInterface,
    /// `assign_ips` (by count).
    AssignPrivateIpAddresses,
    /// `assign_specific_ips` (explicit addresses). Same EC2 action, counted apart.
    AssignSpecificPrivateIpAddresses,
    UnassignPrivateIpAddresses,
    /// `assign_prefixes` (AssignPrivateIpAddresses with Ipv4PrefixCount). Counted apart.
    AssignIpv4Prefixes,
    /// `unassign_prefixes` (UnassignPrivateIpAddresses with Ipv4Prefix.N). Counted apart.
    UnassignIpv4Prefixes,
    /// `assign_ipv6_prefixes` (AssignIpv6Addresses with Ipv6PrefixCount).
    AssignIpv6Prefixes,
    /// `assign_specific_ipv6_prefixes` (AssignIpv6Addresses with Ipv6Prefix.N). Counted apart.
    AssignSpecificIpv6Prefixes,
    /// `unassign_ipv6_prefixes` (UnassignIpv6Addresses with Ipv6Prefix.N).
    UnassignIpv6Prefixes,
    /// GetSubnetCidrReservations.
    GetSubnetCidrReservations,
    /// CreateSubnetCidrReservation (of type `prefix`).
    CreateSubnetCidrReservation,
    /// DescribeSecurityGroups (by id).
    DescribeSecurityGroups,
    CreateTags,
    /// IMDS `identity()`.
    MetadataIdentity,
    /// IMDS `interfaces()`.
    MetadataInterfaces,
    /// IMDS `interface(mac)`.
    MetadataInterface,
}

impl Action {
    /// The EC2 action name (or `imds:...` for metadata reads).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DescribeInstances => "DescribeInstances",
            Self::DescribeInstanceTypes => "DescribeInstanceTypes",
            Self::DescribeSubnets => "DescribeSubnets",
            Self::DescribeNetworkInterfaces => "DescribeNetworkInterfaces",
            Self::CreateNetworkInterface => "CreateNetworkInterface",
            Self::AttachNetworkInterface => "AttachNetworkInterface",
            Self::ModifyNetworkInterfaceAttribute => "ModifyNetworkInterfaceAttribute",
            Self::DetachNetworkInterface => "DetachNetworkInterface",
            Self::DeleteNetworkInterface => "DeleteNetworkInterface",
            Self::AssignPrivateIpAddresses => "AssignPrivateIpAddresses",
            Self::AssignSpecificPrivateIpAddresses => "AssignPrivateIpAddresses(specific)",
            Self::UnassignPrivateIpAddresses => "UnassignPrivateIpAddresses",
            Self::AssignIpv4Prefixes => "AssignPrivateIpAddresses(prefix)",
            Self::UnassignIpv4Prefixes => "UnassignPrivateIpAddresses(prefix)",
            Self::AssignIpv6Prefixes => "AssignIpv6Addresses(prefix)",
            Self::AssignSpecificIpv6Prefixes => "AssignIpv6Addresses(specific prefix)",
            Self::UnassignIpv6Prefixes => "UnassignIpv6Addresses(prefix)",
            Self::GetSubnetCidrReservations => "GetSubnetCidrReservations",
            Self::CreateSubnetCidrReservation => "CreateSubnetCidrReservation",
            Self::DescribeSecurityGroups => "DescribeSecurityGroups",
            Self::CreateTags => "CreateTags",
            Self::MetadataIdentity => "imds:identity",
            Self::MetadataInterfaces => "imds:interfaces",
            Self::MetadataInterface => "imds:interface",
        }
    }

    /// Whether this is an EC2 API call (as opposed to an IMDS read).
    pub fn is_ec2(self) -> bool {
        !matches!(
            self,
            Self::MetadataIdentity | Self::MetadataInterfaces | Self::MetadataInterface
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded call: what was asked, with which arguments, and the error it returned, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    pub action: Action,
    /// The arguments, rendered as `key=value` pairs.
    pub args: String,
    /// `Some` when the call failed (injected or a real rejection by the fake).
    pub error: Option<CloudError>,
}
