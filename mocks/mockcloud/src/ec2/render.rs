//! EC2's XML for the world's views: network interfaces (with `ipv4PrefixSet` and the attachment's
//! `networkCardIndex`), instances, instance types (`hypervisor`, `bareMetal`, `vCpuInfo`,
//! `networkInfo.networkCards`), subnets (with `tagSet`), subnet CIDR reservations and security
//! groups (with their `ipPermissions` / `ipPermissionsEgress`).

use std::collections::BTreeMap;

use crate::catalog::InstanceType;
use crate::world::{
    EniView, InstanceView, IpPermission, ReservationView, SecurityGroupView, SubnetView,
};
use crate::xml::Xml;

fn groups_xml(x: &mut Xml, groups: &[String]) {
    x.set("groupSet", groups, |x, g| {
        x.leaf("groupId", g).leaf("groupName", format!("group-{g}"));
    });
}

fn tags_xml(x: &mut Xml, tags: &BTreeMap<String, String>) {
    x.set("tagSet", tags, |x, (k, v)| {
        x.leaf("key", k).leaf("value", v);
    });
}

fn ips_xml(x: &mut Xml, e: &EniView) {
    let all =
        std::iter::once((e.primary_ip, true)).chain(e.secondary_ips.iter().map(|ip| (*ip, false)));
    x.set("privateIpAddressesSet", all, |x, (ip, primary)| {
        x.leaf("privateIpAddress", ip).leaf("primary", primary);
    });
    x.set("ipv4PrefixSet", &e.ipv4_prefixes, |x, p| {
        x.leaf("ipv4Prefix", p);
    });
    x.set("ipv6AddressesSet", &e.ipv6_addresses, |x, a| {
        x.leaf("ipv6Address", a).leaf("isPrimaryIpv6", false);
    });
    x.set("ipv6PrefixSet", &e.ipv6_prefixes, |x, p| {
        x.leaf("ipv6Prefix", p);
    });
}

pub(super) fn eni_xml(x: &mut Xml, e: &EniView, owner: &str) {
    x.leaf("networkInterfaceId", &e.id)
        .leaf("subnetId", &e.subnet_id)
        .leaf("vpcId", &e.vpc_id)
        .leaf("availabilityZone", &e.availability_zone)
        .leaf("description", &e.description)
        .leaf("ownerId", owner)
        .leaf("requesterManaged", e.requester_managed)
        .leaf("status", e.status)
        .leaf("macAddress", &e.mac)
        .leaf("privateIpAddress", e.primary_ip)
        .leaf("sourceDestCheck", true)
        .leaf("interfaceType", "interface");
    groups_xml(x, &e.security_groups);
    if let Some(a) = &e.attachment {
        x.open("attachment")
            .leaf("attachmentId", &a.id)
            .leaf("instanceId", &a.instance_id)
            .leaf("instanceOwnerId", owner)
            .leaf("deviceIndex", a.device_index)
            .leaf("networkCardIndex", a.network_card_index)
            .leaf("status", a.status)
            .leaf("deleteOnTermination", a.delete_on_termination)
            .close("attachment");
    }
    ips_xml(x, e);
    tags_xml(x, &e.tags);
}

pub(super) fn instance_xml(x: &mut Xml, i: &InstanceView, owner: &str) {
    let code = if i.state == "running" { 16 } else { 48 };
    x.leaf("instanceId", &i.id)
        .leaf("instanceType", &i.instance_type)
        .open("placement")
        .leaf("availabilityZone", &i.availability_zone)
        .leaf("tenancy", "default")
        .close("placement")
        .leaf("privateIpAddress", i.private_ip)
        .leaf("subnetId", &i.subnet_id)
        .leaf("vpcId", &i.vpc_id)
        .open("instanceState")
        .leaf("code", code)
        .leaf("name", i.state)
        .close("instanceState");
    groups_xml(x, &i.security_groups);
    x.set("networkInterfaceSet", &i.enis, |x, e| {
        x.leaf("networkInterfaceId", &e.id)
            .leaf("subnetId", &e.subnet_id)
            .leaf("vpcId", &e.vpc_id)
            .leaf("description", &e.description)
            .leaf("ownerId", owner)
            .leaf("status", e.status)
            .leaf("macAddress", &e.mac)
            .leaf("privateIpAddress", e.primary_ip)
            .leaf("sourceDestCheck", true)
            .leaf("interfaceType", "interface");
        groups_xml(x, &e.security_groups);
        if let Some(a) = &e.attachment {
            x.open("attachment")
                .leaf("attachmentId", &a.id)
                .leaf("deviceIndex", a.device_index)
                .leaf("networkCardIndex", a.network_card_index)
                .leaf("status", a.status)
                .leaf("deleteOnTermination", a.delete_on_termination)
                .close("attachment");
        }
        ips_xml(x, e);
    });
}

pub(super) fn instance_type_xml(x: &mut Xml, t: &InstanceType) {
    x.leaf("instanceType", t.name)
        .leaf("bareMetal", t.bare_metal);
    if let Some(h) = t.hypervisor {
        x.leaf("hypervisor", h);
    }
    x.open("vCpuInfo")
        .leaf("defaultVCpus", t.vcpus)
        .close("vCpuInfo")
        .open("networkInfo")
        .leaf("maximumNetworkInterfaces", t.max_enis)
        .leaf("ipv4AddressesPerInterface", t.ipv4_per_eni)
        .leaf("maximumNetworkCards", t.network_cards)
        .leaf("defaultNetworkCardIndex", t.default_network_card);
    x.set("networkCards", t.cards(), |x, c| {
        x.leaf("networkCardIndex", c.index)
            .leaf("maximumNetworkInterfaces", c.max_enis);
    });
    x.leaf("ipv6Supported", true).close("networkInfo");
}

pub(super) fn subnet_xml(x: &mut Xml, s: &SubnetView, owner: &str) {
    x.leaf("subnetId", &s.id)
        .leaf("state", "available")
        .leaf("vpcId", &s.vpc_id)
        .leaf("cidrBlock", s.cidr)
        .leaf("availableIpAddressCount", s.available_ips)
        .leaf("availabilityZone", &s.availability_zone)
        .leaf("defaultForAz", false)
        .leaf("mapPublicIpOnLaunch", false)
        .leaf("assignIpv6AddressOnCreation", false)
        .leaf("ownerId", owner);
    if let Some(cidr) = s.ipv6_cidr {
        // One association per subnet; its id is derived from the subnet's so it is stable.
        let assoc = format!("subnet-cidr-assoc-{}", &s.id["subnet-".len()..]);
        x.set("ipv6CidrBlockAssociationSet", [cidr], |x, c| {
            x.leaf("associationId", &assoc)
                .leaf("ipv6CidrBlock", c)
                .open("ipv6CidrBlockState")
                .leaf("state", "associated")
                .close("ipv6CidrBlockState")
                .leaf("ipSource", "amazon")
                .leaf("ipv6AddressAttribute", "public");
        });
    } else {
        x.open("ipv6CidrBlockAssociationSet")
            .close("ipv6CidrBlockAssociationSet");
    }
    tags_xml(x, &s.tags);
}

pub(super) fn reservation_xml(x: &mut Xml, r: &ReservationView) {
    x.leaf("subnetCidrReservationId", &r.id)
        .leaf("subnetId", &r.subnet_id)
        .leaf("cidr", r.cidr)
        .leaf("reservationType", r.reservation_type.as_str())
        .leaf("ownerId", &r.owner_id)
        .leaf("description", &r.description);
    tags_xml(x, &r.tags);
}

fn permissions_xml(x: &mut Xml, tag: &str, perms: &[IpPermission], owner: &str) {
    x.set(tag, perms, |x, p| {
        x.leaf("ipProtocol", &p.ip_protocol);
        if let (Some(f), Some(t)) = (p.from_port, p.to_port) {
            x.leaf("fromPort", f).leaf("toPort", t);
        }
        x.set("groups", &p.groups, |x, g| {
            x.leaf("userId", owner).leaf("groupId", g);
        });
        x.set("ipRanges", &p.ip_ranges, |x, c| {
            x.leaf("cidrIp", c);
        });
        x.set("ipv6Ranges", &p.ipv6_ranges, |x, c| {
            x.leaf("cidrIpv6", c);
        });
        x.open("prefixListIds").close("prefixListIds");
    });
}

/// One `securityGroupInfo` item.
pub(super) fn security_group_xml(x: &mut Xml, g: &SecurityGroupView, owner: &str, arn: &str) {
    x.leaf("ownerId", owner)
        .leaf("groupId", &g.id)
        .leaf("groupName", &g.name)
        .leaf("groupDescription", &g.description)
        .leaf("vpcId", &g.vpc_id)
        .leaf("securityGroupArn", arn);
    permissions_xml(x, "ipPermissions", &g.ingress, owner);
    permissions_xml(x, "ipPermissionsEgress", &g.egress, owner);
    tags_xml(x, &g.tags);
}
