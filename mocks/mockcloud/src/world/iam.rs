//! What IAM needs to know about a resource EC2 authorizes a call on: its ARN, its tags and the
//! resource-level condition keys EC2 supplies for it (`ec2:Vpc`, `ec2:Subnet`, …). A resource that
//! does not exist answers the world's own NotFound / Malformed error.

use std::collections::BTreeMap;

use super::{Ec2Error, Ec2Result, World, malformed, well_formed};

/// One resource as IAM sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IamFacts {
    pub arn: String,
    pub tags: BTreeMap<String, String>,
    /// Resource-level condition keys (`ec2:Vpc`, `ec2:Subnet`, `ec2:AvailabilityZone`, …).
    pub keys: Vec<(String, String)>,
}

impl World {
    /// `arn:aws:ec2:<region>:<account>:<kind>/<id>`.
    pub fn arn(&self, kind: &str, id: &str) -> String {
        format!("arn:aws:ec2:{}:{}:{kind}/{id}", self.region, self.owner_id)
    }

    pub fn iam_eni(&self, id: &str) -> Ec2Result<IamFacts> {
        let e = self.eni_ref(id)?;
        Ok(IamFacts {
            arn: self.arn("network-interface", id),
            tags: e.tags.clone(),
            keys: vec![
                ("ec2:Vpc".into(), self.arn("vpc", &e.vpc_id)),
                ("ec2:Subnet".into(), self.arn("subnet", &e.subnet_id)),
                ("ec2:AvailabilityZone".into(), e.az.clone()),
                ("ec2:NetworkInterfaceID".into(), id.to_owned()),
            ],
        })
    }

    pub fn iam_subnet(&self, id: &str) -> Ec2Result<IamFacts> {
        let s = self.subnet_ref(id)?;
        Ok(IamFacts {
            arn: self.arn("subnet", id),
            tags: s.tags.clone(),
            keys: vec![
                ("ec2:Vpc".into(), self.arn("vpc", &s.vpc_id)),
                ("ec2:AvailabilityZone".into(), s.az.clone()),
                ("ec2:SubnetID".into(), id.to_owned()),
            ],
        })
    }

    /// A security group of `vpc_id` (EC2's `InvalidGroup.NotFound` when it is not that VPC's).
    pub fn iam_security_group(&self, vpc_id: &str, id: &str) -> Ec2Result<IamFacts> {
        self.check_groups(vpc_id, &[id.to_owned()])?;
        let (_, tags) = self.group_vpc_and_tags(id)?;
        Ok(IamFacts {
            arn: self.arn("security-group", id),
            tags,
            keys: vec![
                ("ec2:Vpc".into(), self.arn("vpc", vpc_id)),
                ("ec2:SecurityGroupID".into(), id.to_owned()),
            ],
        })
    }

    /// The VPC's default security group (what CreateNetworkInterface uses when given none).
    pub fn iam_default_group(&self, vpc_id: &str) -> Option<String> {
        self.default_group(vpc_id)
    }

    /// A security group wherever it is (Authorize/Revoke on it name no VPC).
    pub fn iam_group(&self, id: &str) -> Ec2Result<IamFacts> {
        let (vpc_id, _) = self.group_vpc_and_tags(id)?;
        self.iam_security_group(&vpc_id, id)
    }

    /// A VPC as a resource (CreateSecurityGroup, AssociateVpcCidrBlock): `ec2:Vpc`, `ec2:VpcID`,
    /// `ec2:Tenancy` (mockcloud's VPCs carry no tags and have default tenancy).
    pub fn iam_vpc(&self, id: &str) -> Ec2Result<IamFacts> {
        if !well_formed(id, "vpc") {
            return Err(malformed("InvalidVpcID.Malformed", "vpc", id));
        }
        if !self.vpcs.contains_key(id) {
            return Err(super::not_found("InvalidVpcID.NotFound", "vpc", id));
        }
        Ok(IamFacts {
            arn: self.arn("vpc", id),
            tags: BTreeMap::new(),
            keys: vec![
                ("ec2:Vpc".into(), self.arn("vpc", id)),
                ("ec2:VpcID".into(), id.to_owned()),
                ("ec2:Tenancy".into(), "default".into()),
            ],
        })
    }

    pub fn iam_instance(&self, id: &str) -> Ec2Result<IamFacts> {
        if !well_formed(id, "i") {
            return Err(malformed("InvalidInstanceID.Malformed", "i", id));
        }
        let i = self
            .instances
            .get(id)
            .ok_or_else(|| super::not_found("InvalidInstanceID.NotFound", "instance", id))?;
        Ok(IamFacts {
            arn: self.arn("instance", id),
            tags: i.tags.clone(),
            keys: vec![
                ("ec2:AvailabilityZone".into(), i.az.clone()),
                ("ec2:InstanceType".into(), i.instance_type.name.to_owned()),
                ("ec2:InstanceID".into(), id.to_owned()),
            ],
        })
    }

    /// The (ENI, instance) of an attachment id, as DetachNetworkInterface resolves it.
    pub fn iam_attachment(&self, attachment_id: &str) -> Ec2Result<(String, String)> {
        if !well_formed(attachment_id, "eni-attach") {
            return Err(malformed(
                "InvalidAttachmentID.Malformed",
                "eni-attach",
                attachment_id,
            ));
        }
        let eni = self.find_attachment(attachment_id)?;
        let instance = self.enis[&eni]
            .attachment
            .as_ref()
            .map(|a| a.instance_id.clone())
            .unwrap_or_default();
        Ok((eni, instance))
    }

    /// The subnet of a subnet CIDR reservation.
    pub fn iam_reservation_subnet(&self, id: &str) -> Ec2Result<String> {
        self.reservation_subnet(id)
    }

    /// A CreateTags / DeleteTags target (ENI, subnet or subnet CIDR reservation).
    pub fn iam_tag_target(&self, id: &str) -> Ec2Result<IamFacts> {
        if id.starts_with("eni-") && !id.starts_with("eni-attach") {
            return self.iam_eni(id);
        }
        if id.starts_with("subnet-") {
            return self.iam_subnet(id);
        }
        if id.starts_with("sg-") {
            return self.iam_group(id);
        }
        if id.starts_with("scr-") {
            let subnet = self.reservation_subnet(id)?;
            let s = &self.subnets[&subnet];
            return Ok(IamFacts {
                arn: self.arn("subnet-cidr-reservation", id),
                tags: s.reservations[id].tags.clone(),
                keys: vec![
                    ("ec2:Vpc".into(), self.arn("vpc", &s.vpc_id)),
                    ("ec2:Subnet".into(), self.arn("subnet", &subnet)),
                ],
            });
        }
        Err(Ec2Error::client(
            "InvalidID",
            format!(
                "The ID '{id}' is not valid (mockcloud tags network interfaces, subnets, security groups and subnet CIDR reservations)"
            ),
        ))
    }
}
