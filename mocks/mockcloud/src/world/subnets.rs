//! VPCs, security groups and subnets (several per VPC, in several AZs, with tags), DescribeSubnets
//! and its filters, tags on ENIs / subnets / reservations, and subnet CIDR reservations
//! (CreateSubnetCidrReservation, GetSubnetCidrReservations, DeleteSubnetCidrReservation).

use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use serde::Serialize;

use super::addresses::{Reservation, ReservationType, Subnet};
use super::views::SubnetView;
use super::{
    Ec2Error, Ec2Result, Filter, Vpc, World, bad_filter, check_tags, glob, malformed, not_found,
    tag_filter_matches, well_formed,
};

/// A subnet CIDR reservation as `GetSubnetCidrReservations` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReservationView {
    pub id: String,
    pub subnet_id: String,
    pub cidr: Ipv4Net,
    pub reservation_type: ReservationType,
    pub description: String,
    pub owner_id: String,
    pub tags: BTreeMap<String, String>,
}

impl World {
    /// Creates a VPC with one default security group; returns (vpc id, security group id).
    pub fn create_vpc(&mut self, cidr: Ipv4Net) -> Ec2Result<(String, String)> {
        if !(16..=28).contains(&cidr.prefix_len()) {
            return Err(Ec2Error::client(
                "InvalidVpc.Range",
                format!("The CIDR '{cidr}' is invalid: the prefix must be between /16 and /28."),
            ));
        }
        let id = self.new_id("vpc");
        let sg = self.new_id("sg");
        self.vpcs.insert(
            id.clone(),
            Vpc {
                cidr: cidr.trunc(),
                secondary_cidrs: Vec::new(),
                ipv6_cidr: super::ipv6::vpc_block(self.vpcs.len()),
                security_groups: [sg.clone()].into(),
            },
        );
        self.add_default_group(&id, &sg);
        Ok((id, sg))
    }

    /// Adds a security group to a VPC under a generated name (`mockcloud-N`), with EC2's rules
    /// for a new group: all egress, no ingress.
    pub fn create_security_group(&mut self, vpc_id: &str) -> Ec2Result<String> {
        if !self.vpcs.contains_key(vpc_id) {
            return Err(not_found("InvalidVpcID.NotFound", "vpc", vpc_id));
        }
        let n = self.vpcs[vpc_id].security_groups.len();
        let name = format!("mockcloud-{n}-{}", self.next_id);
        self.create_security_group_named(
            Some(vpc_id),
            &name,
            "created through mockcloud's control API",
            &BTreeMap::new(),
        )
    }

    pub fn create_subnet(&mut self, vpc_id: &str, cidr: Ipv4Net, az: &str) -> Ec2Result<String> {
        self.create_subnet_with_tags(vpc_id, cidr, az, &BTreeMap::new())
    }

    /// Creates a subnet carrying `tags` (e.g. `kubernetes.io/role/cni=1`).
    pub fn create_subnet_with_tags(
        &mut self,
        vpc_id: &str,
        cidr: Ipv4Net,
        az: &str,
        tags: &BTreeMap<String, String>,
    ) -> Ec2Result<String> {
        let vpc = self
            .vpcs
            .get(vpc_id)
            .ok_or_else(|| not_found("InvalidVpcID.NotFound", "vpc", vpc_id))?;
        let cidr = cidr.trunc();
        let vpc_ipv6 = vpc.ipv6_cidr;
        // A subnet lies inside one of the VPC's IPv4 blocks, primary or secondary.
        let blocks = self.vpc_ipv4_cidrs(vpc_id);
        if !(16..=28).contains(&cidr.prefix_len()) || !blocks.iter().any(|b| b.contains(&cidr)) {
            let blocks: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
            return Err(Ec2Error::client(
                "InvalidSubnet.Range",
                format!(
                    "The CIDR '{cidr}' is invalid for VPC {vpc_id} ({}).",
                    blocks.join(", ")
                ),
            ));
        }
        if self
            .subnets
            .values()
            .any(|s| s.vpc_id == vpc_id && (s.cidr.contains(&cidr) || cidr.contains(&s.cidr)))
        {
            return Err(Ec2Error::client(
                "InvalidSubnet.Conflict",
                format!("The CIDR '{cidr}' conflicts with another subnet"),
            ));
        }
        check_tags(tags)?;
        let id = self.new_id("subnet");
        let mut subnet = Subnet::new(vpc_id, cidr, az);
        subnet.tags = tags.clone();
        let k = self.subnets.values().filter(|s| s.vpc_id == vpc_id).count();
        subnet.ipv6 = super::ipv6::subnet_block(vpc_ipv6, k).map(super::ipv6::Ipv6Book::new);
        self.subnets.insert(id.clone(), subnet);
        Ok(id)
    }

    pub fn describe_subnets(
        &self,
        ids: &[String],
        filters: &[Filter],
    ) -> Ec2Result<Vec<SubnetView>> {
        for id in ids {
            self.subnet_ref(id)?;
        }
        for f in filters {
            let known = [
                "subnet-id",
                "vpc-id",
                "availability-zone",
                "cidr-block",
                "state",
                "tag-key",
            ];
            if !known.contains(&f.name.as_str()) && !f.name.starts_with("tag:") {
                return Err(bad_filter(&f.name));
            }
        }
        Ok(self
            .subnets
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .map(|id| self.subnet_view(id))
            .filter(|v| filters.iter().all(|f| subnet_matches(v, f)))
            .collect())
    }

    // ---------------------------------------------------------------- subnet CIDR reservations

    /// `CreateSubnetCidrReservation`: the CIDR must be canonical, inside the subnet, clear of other
    /// reservations and of every address in use.
    pub fn create_subnet_cidr_reservation(
        &mut self,
        subnet_id: &str,
        cidr: Ipv4Net,
        kind: ReservationType,
        description: &str,
        tags: &BTreeMap<String, String>,
    ) -> Ec2Result<ReservationView> {
        let s = self.subnet_ref(subnet_id)?;
        if cidr.trunc() != cidr {
            return Err(Ec2Error::invalid_value(
                "Cidr",
                &cidr.to_string(),
                &format!(
                    "The CIDR is not a network address: did you mean {}?",
                    cidr.trunc()
                ),
            ));
        }
        if !s.cidr.contains(&cidr) {
            return Err(Ec2Error::invalid_value(
                "Cidr",
                &cidr.to_string(),
                &format!("The CIDR must lie within the subnet's range ({}).", s.cidr),
            ));
        }
        if let Some((rid, r)) = s
            .reservations
            .iter()
            .find(|(_, r)| r.cidr.contains(&cidr) || cidr.contains(&r.cidr))
        {
            return Err(Ec2Error::invalid_value(
                "Cidr",
                &cidr.to_string(),
                &format!("The CIDR overlaps the reservation {rid} ({}).", r.cidr),
            ));
        }
        if let Some((ip, _)) = s.used_in(cidr).next() {
            return Err(Ec2Error::invalid_value(
                "Cidr",
                &cidr.to_string(),
                &format!(
                    "The CIDR covers {}, which is in use.",
                    std::net::Ipv4Addr::from(ip)
                ),
            ));
        }
        check_tags(tags)?;
        let id = self.new_id("scr");
        self.subnets
            .get_mut(subnet_id)
            .expect("checked")
            .reservations
            .insert(
                id.clone(),
                Reservation {
                    cidr,
                    kind,
                    description: description.to_owned(),
                    tags: tags.clone(),
                },
            );
        Ok(self.reservation_view(subnet_id, &id))
    }

    /// `GetSubnetCidrReservations` (IPv4 ones) with filters `reservationType`, `subnet-id`,
    /// `owner-id`, `tag-key`, `tag:KEY`.
    pub fn get_subnet_cidr_reservations(
        &self,
        subnet_id: &str,
        filters: &[Filter],
    ) -> Ec2Result<Vec<ReservationView>> {
        let s = self.subnet_ref(subnet_id)?;
        for f in filters {
            let known = ["reservationType", "subnet-id", "owner-id", "tag-key"];
            if !known.contains(&f.name.as_str()) && !f.name.starts_with("tag:") {
                return Err(bad_filter(&f.name));
            }
        }
        Ok(s.reservations
            .keys()
            .map(|id| self.reservation_view(subnet_id, id))
            .filter(|v| {
                filters.iter().all(|f| {
                    let any = |field: &str| f.values.iter().any(|p| glob(p, field));
                    match f.name.as_str() {
                        "reservationType" => any(v.reservation_type.as_str()),
                        "subnet-id" => any(&v.subnet_id),
                        "owner-id" => any(&v.owner_id),
                        _ => tag_filter_matches(f, &v.tags).unwrap_or(false),
                    }
                })
            })
            .collect())
    }

    /// `DeleteSubnetCidrReservation`: returns the deleted reservation.
    pub fn delete_subnet_cidr_reservation(&mut self, id: &str) -> Ec2Result<ReservationView> {
        let subnet_id = self.reservation_subnet(id)?;
        let view = self.reservation_view(&subnet_id, id);
        self.subnets
            .get_mut(&subnet_id)
            .expect("found")
            .reservations
            .remove(id);
        Ok(view)
    }

    pub(super) fn reservation_subnet(&self, id: &str) -> Ec2Result<String> {
        if !well_formed(id, "scr") {
            return Err(malformed(
                "InvalidSubnetCidrReservationID.Malformed",
                "scr",
                id,
            ));
        }
        self.subnets
            .iter()
            .find(|(_, s)| s.reservations.contains_key(id))
            .map(|(sid, _)| sid.clone())
            .ok_or_else(|| {
                not_found(
                    "InvalidSubnetCidrReservationID.NotFound",
                    "subnet CIDR reservation",
                    id,
                )
            })
    }

    pub(super) fn reservation_view(&self, subnet_id: &str, id: &str) -> ReservationView {
        let r = &self.subnets[subnet_id].reservations[id];
        ReservationView {
            id: id.to_owned(),
            subnet_id: subnet_id.to_owned(),
            cidr: r.cidr,
            reservation_type: r.kind,
            description: r.description.clone(),
            owner_id: self.owner_id.clone(),
            tags: r.tags.clone(),
        }
    }

    // ---------------------------------------------------------------- tags

    fn tag_target(&mut self, id: &str) -> Ec2Result<&mut BTreeMap<String, String>> {
        if id.starts_with("eni-") && !id.starts_with("eni-attach") {
            self.eni_ref(id)?;
            return Ok(&mut self.enis.get_mut(id).expect("checked").tags);
        }
        if id.starts_with("subnet-") {
            self.subnet_ref(id)?;
            return Ok(&mut self.subnets.get_mut(id).expect("checked").tags);
        }
        if id.starts_with("sg-") {
            return self.group_tags_mut(id);
        }
        if id.starts_with("scr-") {
            let subnet = self.reservation_subnet(id)?;
            let s = self.subnets.get_mut(&subnet).expect("found");
            return Ok(&mut s.reservations.get_mut(id).expect("found").tags);
        }
        Err(Ec2Error::client(
            "InvalidID",
            format!(
                "The ID '{id}' is not valid (mockcloud tags network interfaces, subnets, security groups and subnet CIDR reservations)"
            ),
        ))
    }

    pub fn create_tags(
        &mut self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Ec2Result<()> {
        if resources.is_empty() {
            return Err(Ec2Error::missing("ResourceId"));
        }
        if tags.is_empty() {
            return Err(Ec2Error::missing("Tag"));
        }
        check_tags(tags)?;
        for r in resources {
            self.tag_target(r)?;
        }
        for r in resources {
            self.tag_target(r)?.extend(tags.clone());
        }
        Ok(())
    }

    pub fn delete_tags(
        &mut self,
        resources: &[String],
        tags: &[(String, Option<String>)],
    ) -> Ec2Result<()> {
        if resources.is_empty() {
            return Err(Ec2Error::missing("ResourceId"));
        }
        for r in resources {
            self.tag_target(r)?;
        }
        for r in resources {
            let t = self.tag_target(r)?;
            if tags.is_empty() {
                t.clear();
            }
            for (k, v) in tags {
                if v.as_ref().is_none_or(|v| t.get(k) == Some(v)) {
                    t.remove(k);
                }
            }
        }
        Ok(())
    }
}

fn subnet_matches(v: &SubnetView, f: &Filter) -> bool {
    if let Some(m) = tag_filter_matches(f, &v.tags) {
        return m;
    }
    let field = match f.name.as_str() {
        "subnet-id" => v.id.clone(),
        "vpc-id" => v.vpc_id.clone(),
        "availability-zone" => v.availability_zone.clone(),
        "state" => "available".to_owned(),
        _ => v.cidr.to_string(),
    };
    f.values.iter().any(|p| glob(p, &field))
}
