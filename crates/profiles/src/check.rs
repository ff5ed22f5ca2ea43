//! The profiles checked against EC2 for this node ([`judge`]), and the ENIs of a usable profile
//! brought to its groups ([`sync_groups`]).
//!
//! - **Checking**: a profile is usable here when its subnet is in the node's VPC and zone (by id, or
//!   the zone's subnet carrying its tags) and its groups exist in the node's VPC. The whole set is
//!   checked with two EC2 calls per node and change (one DescribeSubnets of the node's zone, one
//!   DescribeSecurityGroups of every group named), not two per profile: a profile applied to a
//!   cluster reaches every node at once. Only when a call fails for a reason that belongs to one
//!   profile (a group EC2 does not show, a subnet outside the zone) is that profile checked alone, so
//!   the reason names it.
//! - **Groups follow the profile**: every ENI tagged with a usable profile whose groups differ from
//!   the profile's is brought to them (ModifyNetworkInterfaceAttribute), so a profile's changed
//!   groups reach its running pods, not only its next ENIs (a changed subnet cannot: it applies to
//!   new ENIs).

use std::collections::{BTreeMap, BTreeSet};

use eniipam_cloud::lifecycle::NETWORK_TAG;
use eniipam_cloud::node_fit::{groups_for_node, subnet_by_tags, subnet_for_node, zone_subnets};
use eniipam_cloud::{Cloud, CloudError, NodeContext, Subnet};

use crate::{ProfileSpec, Profiles, SubnetChoice};

/// A profile usable on this node, as checked against EC2: what the pool creates its ENIs with (the
/// cloud crate's type, which the pool takes as it is).
pub use eniipam_cloud::node_fit::ProfileNetwork as CheckedProfile;

/// Each profile the cluster has, as this node judged it: usable here, or why not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// The profiles have been listed once.
    pub known: bool,
    pub profiles: BTreeMap<String, Result<CheckedProfile, String>>,
}

impl Judged {
    /// The usable profiles, by name.
    pub fn usable(&self) -> BTreeMap<String, CheckedProfile> {
        let usable = self.profiles.iter();
        usable
            .filter_map(|(n, v)| Some((n.clone(), v.as_ref().ok()?.clone())))
            .collect()
    }
}

/// Judges every profile for this node: two EC2 calls for the whole set when all is well (see the
/// module docs). `Err` only when EC2 failed transiently.
pub async fn judge(
    profiles: &Profiles,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<Judged, CloudError> {
    let mut out = Judged {
        known: profiles.known,
        profiles: BTreeMap::new(),
    };
    for (name, why) in &profiles.invalid {
        out.profiles.insert(name.clone(), Err(why.clone()));
    }
    if profiles.valid.is_empty() {
        return Ok(out);
    }
    let zone = zone_subnets(cloud, node).await?;
    let groups: BTreeSet<String> = profiles
        .valid
        .values()
        .flat_map(|p| p.security_groups.iter().cloned())
        .collect();
    let groups: Vec<String> = groups.into_iter().collect();
    let all_groups_ok = groups_for_node(cloud, node, &groups, "the NetworkProfiles")
        .await?
        .is_ok();
    for (name, spec) in &profiles.valid {
        let who = format!("NetworkProfile {name:?}");
        let subnet = match &spec.subnet {
            SubnetChoice::Id(id) => match zone.iter().find(|s| &s.id == id) {
                Some(s) => Ok(s.clone()),
                // Not in the node's zone: described alone, so the reason says where it is.
                None => subnet_for_node(cloud, node, id, &who).await?,
            },
            SubnetChoice::Tags(tags) => subnet_by_tags(&zone, node, tags, &who),
        };
        let verdict = match subnet {
            Err(why) => Err(why),
            Ok(subnet) => {
                let groups_ok = if all_groups_ok {
                    Ok(())
                } else {
                    groups_for_node(cloud, node, &spec.security_groups, &who).await?
                };
                groups_ok.map(|()| network(spec, subnet))
            }
        };
        out.profiles.insert(name.clone(), verdict);
    }
    Ok(out)
}

/// Brings every ENI of a usable profile to exactly the profile's groups (one DescribeInstances of
/// the node; one ModifyNetworkInterfaceAttribute per ENI that differs): a profile is the groups its
/// pods get, so changing them must reach the pods already running, not only new ENIs. How many
/// ENIs were changed; `Err` when EC2 failed transiently (the next try comes after back-off).
pub async fn sync_groups(
    judged: &Judged,
    cloud: &dyn Cloud,
    node: &NodeContext,
) -> Result<usize, CloudError> {
    if !judged.profiles.values().any(Result::is_ok) {
        return Ok(0);
    }
    let instance = cloud.describe_instance(&node.instance_id).await?;
    let mut changed = 0;
    for eni in &instance.enis {
        let Some(profile) = eni.tags.get(NETWORK_TAG) else {
            continue;
        };
        let Some(Ok(net)) = judged.profiles.get(profile) else {
            continue;
        };
        let has: BTreeSet<&String> = eni.security_groups.iter().collect();
        let wants: BTreeSet<&String> = net.security_groups.iter().collect();
        if has == wants {
            continue;
        }
        match cloud
            .set_security_groups(&eni.id, &net.security_groups)
            .await
        {
            Ok(()) => {
                changed += 1;
                tracing::warn!(eni = %eni.id, %profile, from = ?eni.security_groups,
                    to = ?net.security_groups,
                    "network profile's security groups changed: its ENI (and the pods on it) now carries the new ones");
            }
            Err(e) if e.is_transient() => {
                return Err(e);
            }
            Err(e) => {
                tracing::error!(eni = %eni.id, %profile, error = %e,
                    "cannot bring the ENI to its network profile's security groups");
            }
        }
    }
    Ok(changed)
}

fn network(spec: &ProfileSpec, subnet: Subnet) -> CheckedProfile {
    CheckedProfile {
        subnet,
        security_groups: spec.security_groups.clone(),
        max_enis: spec.max_enis,
    }
}

#[cfg(test)]
mod tests;
