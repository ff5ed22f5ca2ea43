//! Whether a subnet and security groups that an object of the cluster names can serve this node's
//! new ENIs: the subnet exists in the node's VPC and availability zone, the groups exist in its VPC.
//! Custom networking (the node's ENIConfig) and network profiles (each `NetworkProfile`) ask the
//! same questions of EC2; the answers live here, below both, so neither feature's room reaches into
//! the other's.
//!
//! Each check answers `Ok(Err(why))` when the object is wrong for this node, naming `who` (the
//! object that chose it) and what is wrong, and `Err` only when EC2 failed transiently (throttled,
//! unreachable): the caller keeps its previous answer and tries again later.

use std::collections::BTreeMap;

use crate::{Cloud, CloudError, NodeContext, Subnet, SubnetFilter};

/// Where one network's new ENIs go, as checked against EC2 for this node: a network profile's (the
/// pool creates the profile's ENIs with it, `pool::profiles`) and what the profiles' controller
/// hands over. Here, below both, so the pool (the core) and the feature's crate share one type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileNetwork {
    /// Its subnet, as EC2 describes it (in the node's VPC and zone).
    pub subnet: Subnet,
    /// Its groups, each shown by EC2 in the node's VPC.
    pub security_groups: Vec<String>,
    /// At most this many ENIs of the node serve the profile (`None`: as many as the node has free).
    pub max_enis: Option<u32>,
}

/// One line for logs and status naming an ENIConfig's setting: `ENIConfig x (subnet … cidr,
/// security groups sg-…)`: the pool's and custom networking's wording for the same setting.
pub fn describe_eni_config(
    eni_config: &str,
    subnet: &Subnet,
    security_groups: &[String],
) -> String {
    format!(
        "ENIConfig {eni_config} (subnet {} {}, security groups {})",
        subnet.id,
        subnet.cidr,
        security_groups.join(",")
    )
}

/// Subnet `id` as EC2 describes it, if new ENIs of this node may use it: it exists, in the node's
/// VPC and availability zone.
pub async fn subnet_for_node(
    cloud: &dyn Cloud,
    node: &NodeContext,
    id: &str,
    who: &str,
) -> Result<Result<Subnet, String>, CloudError> {
    let filter = SubnetFilter {
        ids: vec![id.to_owned()],
        ..SubnetFilter::default()
    };
    let subnet = match cloud.describe_subnets(&filter).await {
        Ok(found) => found.into_iter().find(|s| s.id == id),
        Err(e) if e.is_transient() => return Err(e),
        Err(CloudError::NotFound { .. }) => None,
        Err(CloudError::Rejected { code, .. }) if code.contains("NotFound") => None,
        Err(e) => {
            return Ok(Err(format!(
                "{who}: EC2 refused to describe its subnet {id}: {e}"
            )));
        }
    };
    let Some(subnet) = subnet else {
        return Ok(Err(format!(
            "{who} names subnet {id}, which EC2 does not know"
        )));
    };
    Ok(in_node_zone(subnet, node, who))
}

/// `subnet` if it is in the node's VPC and availability zone, else why not.
fn in_node_zone(subnet: Subnet, node: &NodeContext, who: &str) -> Result<Subnet, String> {
    if subnet.vpc_id != node.vpc_id || subnet.availability_zone != node.availability_zone {
        return Err(format!(
            "{who} names subnet {} in {} ({}), but this node is in {} ({}): an ENI can only use a \
             subnet of the instance's own availability zone and VPC (one object per zone is the \
             usual layout)",
            subnet.id, subnet.availability_zone, subnet.vpc_id, node.availability_zone, node.vpc_id
        ));
    }
    Ok(subnet)
}

/// The subnets of the node's VPC and zone (one DescribeSubnets), for [`subnet_by_tags`] and for
/// checking many subnet ids with one call.
pub async fn zone_subnets(
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<Vec<Subnet>, CloudError> {
    let filter = SubnetFilter {
        vpc_id: Some(node.vpc_id.clone()),
        availability_zone: Some(node.availability_zone.clone()),
        ..SubnetFilter::default()
    };
    cloud.describe_subnets(&filter).await
}

/// Of `zone` (the subnets of the node's VPC and zone), the one that carries every one of `tags`
/// (several: the one with the most free addresses, then the lowest id, so every node of the zone
/// agrees while they are equal); else why none, naming `who`.
pub fn subnet_by_tags(
    zone: &[Subnet],
    node: &NodeContext,
    tags: &BTreeMap<String, String>,
    who: &str,
) -> Result<Subnet, String> {
    let best = zone
        .iter()
        .filter(|s| s.vpc_id == node.vpc_id && s.availability_zone == node.availability_zone)
        .filter(|s| tags.iter().all(|(k, v)| s.tags.get(k) == Some(v)))
        .max_by(|a, b| {
            a.available_ips
                .cmp(&b.available_ips)
                .then_with(|| b.id.cmp(&a.id))
        });
    best.cloned().ok_or_else(|| {
        let wanted: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "{who}: no subnet of {} in {} carries the tags {}",
            node.availability_zone,
            node.vpc_id,
            wanted.join(",")
        )
    })
}

/// `Ok(Ok(()))` when every one of `groups` exists in the node's VPC (one DescribeSecurityGroups),
/// else why not, naming `who`.
pub async fn groups_for_node(
    cloud: &dyn Cloud,
    node: &NodeContext,
    groups: &[String],
    who: &str,
) -> Result<Result<(), String>, CloudError> {
    let found = match cloud.describe_security_groups(groups).await {
        Ok(found) => found,
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => {
            return Ok(Err(format!(
                "{who} names security groups {} that EC2 does not show: {e}",
                groups.join(",")
            )));
        }
    };
    if let Some(missing) = groups.iter().find(|g| !found.iter().any(|f| &f.id == *g)) {
        return Ok(Err(format!(
            "{who} names security group {missing}, which EC2 does not show"
        )));
    }
    if let Some(g) = found.iter().find(|g| g.vpc_id != node.vpc_id) {
        return Ok(Err(format!(
            "{who} names security group {} of {}, but this node's VPC is {}",
            g.id, g.vpc_id, node.vpc_id
        )));
    }
    Ok(Ok(()))
}
