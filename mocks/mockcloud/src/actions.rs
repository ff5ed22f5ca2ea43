//! The EC2 actions mockcloud serves, and whether an action changes anything: the names the endpoint
//! ([`crate::ec2`]), the throttling buckets ([`crate::throttling`]) and the counters share.

use serde::{Deserialize, Serialize};

/// The actions mockcloud implements.
pub const ACTIONS: &[&str] = &[
    "DescribeInstances",
    "DescribeInstanceTypes",
    "DescribeSubnets",
    "DescribeNetworkInterfaces",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "AssignIpv6Addresses",
    "UnassignIpv6Addresses",
    "CreateTags",
    "DeleteTags",
    "CreateSubnetCidrReservation",
    "GetSubnetCidrReservations",
    "DeleteSubnetCidrReservation",
    "AssociateVpcCidrBlock",
    "DescribeSecurityGroups",
    "CreateSecurityGroup",
    "AuthorizeSecurityGroupIngress",
    "RevokeSecurityGroupIngress",
    "AuthorizeSecurityGroupEgress",
    "RevokeSecurityGroupEgress",
];

/// Whether an action changes anything (what a pool spends) or only reads. EC2's throttling
/// categories refine this ([`crate::throttling::Category`]); counters and reports use the two classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionClass {
    /// Create/Attach/Detach/Delete/Modify/Assign/Unassign/CreateTags/DeleteTags.
    Mutating,
    /// Describe*, Get*, List* and Search* (non-mutating).
    Describe,
}

impl ActionClass {
    pub fn of(action: &str) -> Self {
        if ["Describe", "Get", "List", "Search"]
            .iter()
            .any(|p| action.starts_with(p))
        {
            Self::Describe
        } else {
            Self::Mutating
        }
    }
}
