//! [`MockCloud`]'s Rust methods for subnets and VPC blocks (and ENIs made outside the API): secondary IPv4 CIDR blocks of a VPC, several per VPC with tags, tags on any resource, subnet
//! CIDR reservations, each subnet's address usage (free addresses, free aligned /28 blocks),
//! occupying addresses from outside to build a fragmented subnet, and the allocation seed.
//! The control API (`/_mock/subnets/...`, `/_mock/allocation`) offers the same over HTTP.

use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use crate::MockCloud;
use crate::error::Ec2Error;
use crate::world::{
    OccupyPattern, ReservationType, ReservationView, SubnetUsage, SubnetView, VpcCidrAssociation,
};

impl MockCloud {
    /// `n` ENIs created in `subnet_id` outside the API (other nodes' or another tenant's): no
    /// new-ENI lag, not in the counters. For tests of what a describe costs in a region holding
    /// many ENIs. Returns their ids.
    pub fn create_enis_directly(&self, subnet_id: &str, n: usize) -> Result<Vec<String>, Ec2Error> {
        let args = crate::world::CreateEniArgs {
            subnet_id: subnet_id.to_owned(),
            description: "another node's ENI".into(),
            ..Default::default()
        };
        self.with_world(|w, now| {
            (0..n)
                .map(|_| w.create_network_interface_directly(&args, now))
                .collect()
        })
    }

    /// `AssociateVpcCidrBlock`: adds a secondary IPv4 block to a VPC under EC2's rules (size,
    /// overlap, the five-block quota, the ranges a primary block permits), e.g. 100.64.0.0/16 for
    /// custom networking. Subnets may then be created inside it.
    pub fn associate_vpc_cidr_block(
        &self,
        vpc_id: &str,
        cidr: Ipv4Net,
    ) -> Result<VpcCidrAssociation, Ec2Error> {
        self.with_world(|w, _| w.associate_vpc_cidr_block(vpc_id, cidr))
    }

    /// A VPC's IPv4 blocks, primary first (empty for an unknown VPC).
    pub fn vpc_ipv4_cidrs(&self, vpc_id: &str) -> Vec<Ipv4Net> {
        self.with_world(|w, _| w.vpc_ipv4_cidrs(vpc_id))
    }

    /// Creates a subnet carrying `tags` (e.g. `kubernetes.io/role/cni` = `1`).
    pub fn create_subnet_with_tags(
        &self,
        vpc_id: &str,
        cidr: Ipv4Net,
        az: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<String, Ec2Error> {
        self.with_world(|w, _| w.create_subnet_with_tags(vpc_id, cidr, az, tags))
    }

    /// `CreateTags` on ENIs, subnets or subnet CIDR reservations.
    pub fn create_tags(
        &self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), Ec2Error> {
        self.with_world(|w, _| w.create_tags(resources, tags))
    }

    /// Every subnet as `DescribeSubnets` shows it.
    pub fn subnets(&self) -> Vec<SubnetView> {
        self.with_world(|w, _| {
            w.describe_subnets(&[], &[])
                .expect("an unfiltered describe cannot fail")
        })
    }

    /// Free addresses and free aligned /28 blocks of a subnet.
    pub fn subnet_usage(&self, subnet_id: &str) -> Result<SubnetUsage, Ec2Error> {
        self.with_world(|w, _| w.subnet_usage(subnet_id))
    }

    /// Marks addresses of a subnet as used by something outside the simulated ENIs; returns how
    /// many. Explicit addresses must be assignable and free (all or nothing).
    pub fn occupy_addresses(
        &self,
        subnet_id: &str,
        pattern: &OccupyPattern,
    ) -> Result<u32, Ec2Error> {
        self.with_world(|w, _| w.occupy_addresses(subnet_id, pattern))
    }

    /// Frees every occupied address of a subnet; returns how many.
    pub fn release_occupied(&self, subnet_id: &str) -> Result<u32, Ec2Error> {
        self.with_world(|w, _| w.release_occupied(subnet_id))
    }

    /// `CreateSubnetCidrReservation`.
    pub fn create_subnet_cidr_reservation(
        &self,
        subnet_id: &str,
        cidr: Ipv4Net,
        kind: ReservationType,
        description: &str,
    ) -> Result<ReservationView, Ec2Error> {
        self.with_world(|w, _| {
            w.create_subnet_cidr_reservation(subnet_id, cidr, kind, description, &BTreeMap::new())
        })
    }

    /// `GetSubnetCidrReservations` without filters.
    pub fn subnet_cidr_reservations(
        &self,
        subnet_id: &str,
    ) -> Result<Vec<ReservationView>, Ec2Error> {
        self.with_world(|w, _| w.get_subnet_cidr_reservations(subnet_id, &[]))
    }

    /// `DeleteSubnetCidrReservation`.
    pub fn delete_subnet_cidr_reservation(&self, id: &str) -> Result<ReservationView, Ec2Error> {
        self.with_world(|w, _| w.delete_subnet_cidr_reservation(id))
    }

    /// Re-seeds EC2's random choice of free addresses and /28 blocks (for reproducible runs; the
    /// default seed is [`crate::DEFAULT_ALLOCATION_SEED`]).
    pub fn set_allocation_seed(&self, seed: u64) {
        self.with_world(|w, _: Instant| w.set_allocation_seed(seed));
    }
}

impl MockCloud {
    /// Takes a subnet's IPv6 /64 away (EC2's `DisassociateSubnetCidrBlock`): a subnet without
    /// IPv6, on which AssignIpv6Addresses fails. Refused while an ENI holds IPv6 from it.
    pub fn disassociate_subnet_ipv6_cidr_block(&self, subnet_id: &str) -> Result<(), Ec2Error> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .disassociate_subnet_ipv6(subnet_id)
    }
}
