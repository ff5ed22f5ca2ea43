//! What a describe call asks for: the filters of DescribeSubnets and DescribeNetworkInterfaces.

use std::collections::BTreeMap;

use eniipam_api::model::EniId;

use crate::EniStatus;

/// Which subnets a describe call asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubnetFilter {
    pub ids: Vec<String>,
    pub vpc_id: Option<String>,
    pub availability_zone: Option<String>,
}

/// Which ENIs a describe call asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EniFilter {
    pub ids: Vec<EniId>,
    pub attached_to: Option<String>,
    pub status: Option<EniStatus>,
    pub vpc_id: Option<String>,
    pub subnet_id: Option<String>,
    /// `tag:KEY=VALUE` filters (all must match).
    pub tags: BTreeMap<String, String>,
    /// `tag-key` filters: the tag must exist.
    pub tag_keys: Vec<String>,
}

impl EniFilter {
    /// Every ENI attached to `instance_id` in `vpc_id` (an empty `vpc_id`: any VPC). The `vpc-id`
    /// filter is one EC2 narrows by before it pages; `attachment.instance-id` is applied per page.
    pub fn attached(instance_id: &str, vpc_id: &str) -> Self {
        Self {
            attached_to: Some(instance_id.to_owned()),
            vpc_id: (!vpc_id.is_empty()).then(|| vpc_id.to_owned()),
            ..Self::default()
        }
    }
}
