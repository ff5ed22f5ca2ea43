//! The authorization requests EC2 makes for one API call: for each resource the action touches, the
//! IAM action, the resource's ARN and the request context (following the AWS Service Authorization
//! Reference for Amazon EC2). Every one of them must be allowed for the call to go ahead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::condition::Context;
use crate::ec2::args::tag_specs;
use crate::error::{Ec2Error, Ec2Result};
use crate::query::Params;
use crate::world::{IamFacts, World};

/// One authorization request: may the caller do `action` on `resource` in `context`?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthRequest {
    /// `ec2:AssignPrivateIpAddresses`.
    pub action: String,
    /// The resource ARN, `…:network-interface/*` for one being created, or `*` for actions without
    /// resource-level permissions.
    pub resource: String,
    pub context: Context,
}

impl AuthRequest {
    /// A request with the keys every EC2 request carries (`aws:RequestedRegion`, `ec2:Region`).
    pub fn new(action: &str, resource: &str, region: &str) -> Self {
        let mut context = Context::new();
        context.set("aws:RequestedRegion", region);
        context.set("ec2:Region", region);
        Self {
            action: if action.contains(':') {
                action.to_owned()
            } else {
                format!("ec2:{action}")
            },
            resource: resource.to_owned(),
            context,
        }
    }

    /// Adds an existing resource's tags (`aws:ResourceTag/k`, `ec2:ResourceTag/k`) and keys.
    pub fn with_resource(mut self, facts: &IamFacts) -> Self {
        for (k, v) in &facts.tags {
            self.context.set(format!("aws:ResourceTag/{k}"), v.clone());
            self.context.set(format!("ec2:ResourceTag/{k}"), v.clone());
        }
        for (k, v) in &facts.keys {
            self.context.set(k.clone(), v.clone());
        }
        self
    }

    /// Adds the tags of the request (`aws:RequestTag/k`, `aws:TagKeys`).
    pub fn with_request_tags(mut self, tags: &BTreeMap<String, Option<String>>) -> Self {
        for (k, v) in tags {
            if let Some(v) = v {
                self.context.set(format!("aws:RequestTag/{k}"), v.clone());
            }
        }
        self.context
            .set_many("aws:TagKeys", tags.keys().cloned().collect());
        self
    }
}

fn on(action: &str, facts: &IamFacts, region: &str) -> AuthRequest {
    AuthRequest::new(action, &facts.arn, region).with_resource(facts)
}

/// The id in a resource's ARN-valued key (`ec2:Vpc` → `vpc-…`, `ec2:Subnet` → `subnet-…`).
fn id_in(facts: &IamFacts, key: &str) -> String {
    facts
        .keys
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.rsplit('/').next())
        .unwrap_or_default()
        .to_owned()
}

fn vpc_of(facts: &IamFacts) -> String {
    id_in(facts, "ec2:Vpc")
}

fn some(tags: BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
    tags.into_iter().map(|(k, v)| (k, Some(v))).collect()
}

/// The tag-on-create authorization: `ec2:CreateTags` on the new resource with `ec2:CreateAction`.
fn tag_on_create(
    created: &str,
    action: &str,
    tags: &BTreeMap<String, String>,
    region: &str,
) -> Option<AuthRequest> {
    if tags.is_empty() {
        return None;
    }
    let mut r =
        AuthRequest::new("CreateTags", created, region).with_request_tags(&some(tags.clone()));
    r.context.set("ec2:CreateAction", action);
    Some(r)
}

/// Every authorization request `action` makes with these parameters. A resource that does not
/// exist answers the world's error (NotFound, Malformed, MissingParameter), as the call would.
pub fn requests(
    w: &mut World,
    action: &str,
    p: &Params,
    now: Instant,
) -> Ec2Result<Vec<AuthRequest>> {
    w.settle(now);
    let region = w.region().to_owned();
    let region = region.as_str();
    let mut out = Vec::new();
    match action {
        a if a.starts_with("Describe") || a == "GetSubnetCidrReservations" => {
            out.push(AuthRequest::new(a, "*", region));
        }
        "AssignPrivateIpAddresses"
        | "UnassignPrivateIpAddresses"
        | "AssignIpv6Addresses"
        | "UnassignIpv6Addresses"
        | "DeleteNetworkInterface" => {
            let eni = w.iam_eni(p.req("NetworkInterfaceId")?)?;
            out.push(on(action, &eni, region));
        }
        "ModifyNetworkInterfaceAttribute" => {
            let eni_id = p.req("NetworkInterfaceId")?;
            let eni = w.iam_eni(eni_id)?;
            out.push(on(action, &eni, region));
            // An attachment change (DeleteOnTermination) also touches the instance the attachment
            // is to and the ENI's subnet: the reference lists both as resources of the action
            // (the VPC CNI's scoped policy grants it on `instance/*`). The subnet carries the keys
            // the reference lists for it here, which leave out `ec2:SubnetID`.
            let attachment = p.member("Attachment");
            if let Some(id) = attachment.as_ref().and_then(|a| a.get("AttachmentId")) {
                let (_, instance) = w.iam_attachment(id)?;
                out.push(on(action, &w.iam_instance(&instance)?, region));
                let mut subnet = w.iam_subnet(&id_in(&eni, "ec2:Subnet"))?;
                subnet.keys.retain(|(k, _)| k != "ec2:SubnetID");
                out.push(on(action, &subnet, region));
            }
            let groups = p.list("SecurityGroupId");
            if !groups.is_empty() {
                let vpc = vpc_of(&eni);
                for g in groups {
                    out.push(on(action, &w.iam_security_group(&vpc, &g)?, region));
                }
            }
        }
        "AttachNetworkInterface" => {
            let eni = w.iam_eni(p.req("NetworkInterfaceId")?)?;
            let inst = w.iam_instance(p.req("InstanceId")?)?;
            out.push(on(action, &inst, region));
            out.push(on(action, &eni, region));
        }
        "DetachNetworkInterface" => {
            let (eni, inst) = w.iam_attachment(p.req("AttachmentId")?)?;
            out.push(on(action, &w.iam_instance(&inst)?, region));
            out.push(on(action, &w.iam_eni(&eni)?, region));
        }
        "CreateNetworkInterface" => {
            let subnet = w.iam_subnet(p.req("SubnetId")?)?;
            let tags = tag_specs(p, "network-interface")?;
            let created = w.arn("network-interface", "*");
            // The new ENI carries only the request's tags: the reference lists `aws:RequestTag`,
            // `aws:TagKeys` and `ec2:NetworkInterfaceID` for it (the last is left out: no id yet).
            // Its VPC, subnet and zone are the subnet's keys, on the subnet's own request.
            let new =
                AuthRequest::new(action, &created, region).with_request_tags(&some(tags.clone()));
            out.push(new);
            out.push(on(action, &subnet, region));
            let vpc = vpc_of(&subnet);
            let mut groups = p.list("SecurityGroupId");
            if groups.is_empty() {
                groups.extend(w.iam_default_group(&vpc));
            }
            for g in groups {
                out.push(on(action, &w.iam_security_group(&vpc, &g)?, region));
            }
            out.extend(tag_on_create(&created, action, &tags, region));
        }
        "CreateTags" | "DeleteTags" => {
            let ids = p.list("ResourceId");
            if ids.is_empty() {
                return Err(Ec2Error::missing("ResourceId"));
            }
            let mut tags: BTreeMap<String, Option<String>> = BTreeMap::new();
            for (k, v) in p.tags("Tag")? {
                let v = match (action, v) {
                    ("CreateTags", v) => Some(v.unwrap_or_default()),
                    (_, v) => v,
                };
                tags.insert(k, v);
            }
            for id in ids {
                let facts = w.iam_tag_target(&id)?;
                let mut t = tags.clone();
                if action == "DeleteTags" && t.is_empty() {
                    // No Tag.N: every tag of the resource goes.
                    t = facts.tags.keys().map(|k| (k.clone(), None)).collect();
                }
                out.push(on(action, &facts, region).with_request_tags(&t));
            }
        }
        "CreateSubnetCidrReservation" => {
            let subnet = w.iam_subnet(p.req("SubnetId")?)?;
            out.push(on(action, &subnet, region));
            let tags = tag_specs(p, "subnet-cidr-reservation")?;
            let created = w.arn("subnet-cidr-reservation", "*");
            out.extend(tag_on_create(&created, action, &tags, region));
        }
        "DeleteSubnetCidrReservation" => {
            let subnet = w.iam_reservation_subnet(p.req("SubnetCidrReservationId")?)?;
            out.push(on(action, &w.iam_subnet(&subnet)?, region));
        }
        "AssociateVpcCidrBlock" => {
            let vpc = w.iam_vpc(p.req("VpcId")?)?;
            out.push(on(action, &vpc, region));
        }
        "CreateSecurityGroup" => {
            let created = w.arn("security-group", "*");
            let tags = tag_specs(p, "security-group")?;
            // The new group, as the new ENI, carries only the request's tags (the reference lists
            // `aws:RequestTag`, `aws:TagKeys`, `ec2:SecurityGroupID`); the VPC is its own request.
            out.push(
                AuthRequest::new(action, &created, region).with_request_tags(&some(tags.clone())),
            );
            if let Some(vpc) = p.get("VpcId").filter(|v| !v.is_empty()) {
                out.push(on(action, &w.iam_vpc(vpc)?, region));
            }
            out.extend(tag_on_create(&created, action, &tags, region));
        }
        "AuthorizeSecurityGroupIngress"
        | "RevokeSecurityGroupIngress"
        | "AuthorizeSecurityGroupEgress"
        | "RevokeSecurityGroupEgress" => {
            let group = crate::ec2::security_group_target(p)?;
            out.push(on(action, &w.iam_group(group)?, region));
        }
        // Anything else is answered by the endpoint (InvalidAction) before it gets here.
        other => out.push(AuthRequest::new(other, "*", region)),
    }
    Ok(out)
}
