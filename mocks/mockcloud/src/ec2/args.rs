//! Turning Query API parameters into the world's arguments, with EC2's errors for bad or conflicting
//! parameters: private IPs vs `Ipv4Prefix`/`Ipv4PrefixCount`, tag specifications, modify requests.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::error::{Ec2Error, Ec2Result};
use crate::query::Params;
use crate::world::{AssignArgs, CreateEniArgs, IpPermission, Ipv6Args, ModifyArgs, PrefixArgs};

pub(super) fn ip_list(p: &Params, prefix: &str) -> Ec2Result<Vec<Ipv4Addr>> {
    p.list(prefix)
        .iter()
        .map(|s| {
            s.parse()
                .map_err(|_| Ec2Error::invalid_value(prefix, s, "Expected an IPv4 address."))
        })
        .collect()
}

fn parse_prefix(param: &str, s: &str) -> Ec2Result<Ipv4Net> {
    s.parse().map_err(|_| {
        Ec2Error::invalid_value(param, s, "Expected an IPv4 CIDR such as 10.0.0.16/28.")
    })
}

/// `Ipv4Prefix.N` as a list of strings (AssignPrivateIpAddresses, UnassignPrivateIpAddresses).
pub(super) fn prefix_list(p: &Params) -> Ec2Result<Vec<Ipv4Net>> {
    p.list("Ipv4Prefix")
        .iter()
        .map(|s| parse_prefix("Ipv4Prefix", s))
        .collect()
}

/// Tags of the `TagSpecification.N` entries for `resource_type`.
pub(crate) fn tag_specs(p: &Params, resource_type: &str) -> Ec2Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    for spec in p.structs("TagSpecification") {
        let rt = spec.get("ResourceType").unwrap_or(resource_type);
        if rt != resource_type {
            return Err(Ec2Error::invalid_value(
                "TagSpecification.ResourceType",
                rt,
                &format!("This action tags only {resource_type} resources."),
            ));
        }
        for (k, v) in spec.tags("Tag")? {
            tags.insert(k, v.unwrap_or_default());
        }
    }
    Ok(tags)
}

pub(super) fn create_eni_args(p: &Params) -> Ec2Result<CreateEniArgs> {
    let mut addresses = Vec::new();
    for a in p.structs("PrivateIpAddresses") {
        let ip = a
            .ip("PrivateIpAddress")?
            .ok_or_else(|| Ec2Error::missing("PrivateIpAddresses.N.PrivateIpAddress"))?;
        addresses.push((ip, a.bool("Primary")?.unwrap_or(false)));
    }
    if let Some(ip) = p.ip("PrivateIpAddress")? {
        if addresses.iter().any(|(_, primary)| *primary) {
            return Err(Ec2Error::combination(
                "PrivateIpAddress and a primary PrivateIpAddresses entry both set",
            ));
        }
        addresses.insert(0, (ip, true));
    }
    let mut prefixes = Vec::new();
    for s in p.structs("Ipv4Prefix") {
        let v = s
            .req("Ipv4Prefix")
            .map_err(|_| Ec2Error::missing("Ipv4Prefix.N.Ipv4Prefix"))?;
        prefixes.push(parse_prefix("Ipv4Prefix.N.Ipv4Prefix", v)?);
    }
    let args = CreateEniArgs {
        subnet_id: p.req("SubnetId")?.to_owned(),
        security_groups: p.list("SecurityGroupId"),
        description: p.get("Description").unwrap_or_default().to_owned(),
        secondary_count: p.u32("SecondaryPrivateIpAddressCount")?.unwrap_or(0),
        addresses,
        prefix_count: p.u32("Ipv4PrefixCount")?.unwrap_or(0),
        prefixes,
        tags: tag_specs(p, "network-interface")?,
        client_token: p
            .get("ClientToken")
            .filter(|t| !t.is_empty())
            .map(str::to_owned),
    };
    if args.client_token.as_ref().is_some_and(|t| t.len() > 64) {
        return Err(Ec2Error::invalid_value(
            "ClientToken",
            "(too long)",
            "At most 64 characters.",
        ));
    }
    Ok(args)
}

/// What one AssignPrivateIpAddresses asks for: /32s or /28 prefixes, never both.
pub(super) enum AssignRequest {
    Ips(AssignArgs),
    Prefixes(PrefixArgs),
}

pub(super) fn assign_request(p: &Params) -> Ec2Result<AssignRequest> {
    let ips = ip_list(p, "PrivateIpAddress")?;
    let count = p.u32("SecondaryPrivateIpAddressCount")?;
    let prefixes = prefix_list(p)?;
    let prefix_count = p.u32("Ipv4PrefixCount")?;
    let wants_ips = count.is_some() || !ips.is_empty();
    let wants_prefixes = prefix_count.is_some() || !prefixes.is_empty();
    if wants_ips && wants_prefixes {
        return Err(Ec2Error::combination(
            "IPv4 prefixes (Ipv4Prefix, Ipv4PrefixCount) cannot be combined with private IP addresses (PrivateIpAddress, SecondaryPrivateIpAddressCount)",
        ));
    }
    if wants_prefixes {
        return match (prefix_count, prefixes.is_empty()) {
            (Some(_), false) => Err(Ec2Error::combination(
                "Specify either Ipv4PrefixCount or Ipv4Prefix, not both",
            )),
            (Some(n), true) => Ok(AssignRequest::Prefixes(PrefixArgs::Count(n))),
            (None, _) => Ok(AssignRequest::Prefixes(PrefixArgs::Prefixes(prefixes))),
        };
    }
    match (count, ips.is_empty()) {
        (Some(_), false) => Err(Ec2Error::combination(
            "Specify either SecondaryPrivateIpAddressCount or PrivateIpAddress, not both",
        )),
        (Some(n), true) => Ok(AssignRequest::Ips(AssignArgs::Count(n))),
        (None, false) => Ok(AssignRequest::Ips(AssignArgs::Addresses {
            ips,
            allow_reassignment: p.bool("AllowReassignment")?.unwrap_or(false),
        })),
        (None, true) => Err(Ec2Error::missing(
            "SecondaryPrivateIpAddressCount, PrivateIpAddress, Ipv4PrefixCount or Ipv4Prefix",
        )),
    }
}

pub(super) fn modify_args(p: &Params) -> Ec2Result<ModifyArgs> {
    let mut changes = Vec::new();
    if let Some(a) = p.member("Attachment") {
        let value = a
            .bool("DeleteOnTermination")?
            .ok_or_else(|| Ec2Error::missing("Attachment.DeleteOnTermination"))?;
        changes.push(ModifyArgs::DeleteOnTermination {
            attachment_id: a
                .req("AttachmentId")
                .map_err(|_| Ec2Error::missing("Attachment.AttachmentId"))?
                .to_owned(),
            value,
        });
    }
    let groups = p.list("SecurityGroupId");
    if !groups.is_empty() {
        changes.push(ModifyArgs::Groups(groups));
    }
    if let Some(d) = p.get("Description.Value") {
        changes.push(ModifyArgs::Description(d.to_owned()));
    }
    if changes.len() != 1 {
        return Err(Ec2Error::combination(
            "Exactly one attribute (Attachment, SecurityGroupId or Description) must be specified",
        ));
    }
    Ok(changes.remove(0))
}

/// `Ipv6Addresses.N` (the Query name of AssignIpv6Addresses / UnassignIpv6Addresses' list).
pub(super) fn ipv6_list(p: &Params) -> Ec2Result<Vec<Ipv6Addr>> {
    p.list("Ipv6Addresses")
        .iter()
        .map(|s| {
            s.parse().map_err(|_| {
                Ec2Error::invalid_value("Ipv6Addresses", s, "Expected an IPv6 address.")
            })
        })
        .collect()
}

/// `Ipv6Prefix.N`: /80 CIDRs.
pub(super) fn ipv6_prefix_list(p: &Params) -> Ec2Result<Vec<Ipv6Net>> {
    p.list("Ipv6Prefix")
        .iter()
        .map(|s| {
            s.parse().map_err(|_| {
                Ec2Error::invalid_value(
                    "Ipv6Prefix",
                    s,
                    "Expected an IPv6 CIDR such as 2600:1f18:6d00:100:1::/80.",
                )
            })
        })
        .collect()
}

/// What one AssignIpv6Addresses asks for: exactly one of `Ipv6AddressCount`, `Ipv6Addresses.N`,
/// `Ipv6PrefixCount`, `Ipv6Prefix.N` (EC2: "You can't use this option if ...").
pub(super) fn ipv6_request(p: &Params) -> Ec2Result<Ipv6Args> {
    let addresses = ipv6_list(p)?;
    let prefixes = ipv6_prefix_list(p)?;
    let mut given = Vec::new();
    if let Some(n) = p.u32("Ipv6AddressCount")? {
        given.push(("Ipv6AddressCount", Ipv6Args::Count(n)));
    }
    if !addresses.is_empty() {
        given.push(("Ipv6Addresses", Ipv6Args::Addresses(addresses)));
    }
    if let Some(n) = p.u32("Ipv6PrefixCount")? {
        given.push(("Ipv6PrefixCount", Ipv6Args::PrefixCount(n)));
    }
    if !prefixes.is_empty() {
        given.push(("Ipv6Prefixes", Ipv6Args::Prefixes(prefixes)));
    }
    match given.len() {
        0 => Err(Ec2Error::missing(
            "Ipv6AddressCount, Ipv6Addresses, Ipv6PrefixCount or Ipv6Prefixes",
        )),
        1 => Ok(given.remove(0).1),
        _ => Err(Ec2Error::combination(format!(
            "Specify only one of Ipv6AddressCount, Ipv6Addresses, Ipv6PrefixCount and Ipv6Prefixes (got {})",
            given.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn parse_port(p: &Params, key: &str) -> Ec2Result<Option<i32>> {
    p.parsed(key, "an integer port (or -1 for ICMP)")
}

fn malformed_cidr(s: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidParameterValue",
        format!("CIDR block {s} is malformed"),
    )
}

fn cidr4(s: &str) -> Ec2Result<Ipv4Net> {
    match s.parse::<Ipv4Net>() {
        Ok(n) if n == n.trunc() => Ok(n),
        _ => Err(malformed_cidr(s)),
    }
}

fn cidr6(s: &str) -> Ec2Result<Ipv6Net> {
    match s.parse::<Ipv6Net>() {
        Ok(n) if n == n.trunc() => Ok(n),
        _ => Err(malformed_cidr(s)),
    }
}

/// One `IpPermissions.N` entry, or the flat `IpProtocol`/`FromPort`/`ToPort`/`CidrIp` form of
/// Authorize/Revoke. CIDRs must be canonical (`10.0.0.0/16`, not `10.0.0.1/16`).
fn permission(p: &Params, what: &str) -> Ec2Result<IpPermission> {
    let protocol = p
        .get("IpProtocol")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Ec2Error::missing(&format!("{what}IpProtocol")))?;
    let mut ip_ranges = Vec::new();
    for r in p.structs("IpRanges") {
        ip_ranges.push(cidr4(r.req("CidrIp")?)?);
    }
    let mut ipv6_ranges = Vec::new();
    for r in p.structs("Ipv6Ranges") {
        ipv6_ranges.push(cidr6(r.req("CidrIpv6")?)?);
    }
    let mut groups = Vec::new();
    for g in p.structs("Groups") {
        match g.get("GroupId").filter(|v| !v.is_empty()) {
            Some(id) => groups.push(id.to_owned()),
            None => {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    "A UserIdGroupPair of a VPC security group must name its GroupId (GroupName is EC2-Classic and default-VPC only)",
                ));
            }
        }
    }
    if !p.list("PrefixListIds").is_empty() || !p.structs("PrefixListIds").is_empty() {
        return Err(Ec2Error::client(
            "InvalidParameterValue",
            "mockcloud models no managed prefix lists: PrefixListIds are not supported",
        ));
    }
    Ok(IpPermission {
        ip_protocol: protocol.to_owned(),
        from_port: parse_port(p, "FromPort")?,
        to_port: parse_port(p, "ToPort")?,
        ip_ranges,
        ipv6_ranges,
        groups,
    })
}

/// The permissions of Authorize/Revoke SecurityGroupIngress/Egress: `IpPermissions.N`, or (ingress
/// only, as EC2 has it) the flat `IpProtocol` + ports + `CidrIp`; both at once is EC2's error.
pub(super) fn permissions(p: &Params) -> Ec2Result<Vec<IpPermission>> {
    let structured: Vec<IpPermission> = p
        .structs("IpPermissions")
        .iter()
        .map(|s| permission(s, "IpPermissions.N."))
        .collect::<Ec2Result<_>>()?;
    let flat = ["IpProtocol", "FromPort", "ToPort", "CidrIp"]
        .iter()
        .any(|k| p.get(k).is_some());
    if p.get("SourceSecurityGroupName").is_some() {
        return Err(Ec2Error::client(
            "InvalidParameterValue",
            "SourceSecurityGroupName is EC2-Classic and default-VPC only: name the source group in IpPermissions.N.Groups.N.GroupId",
        ));
    }
    match (structured.is_empty(), flat) {
        (false, true) => Err(Ec2Error::combination(
            "The parameter IpPermissions cannot be used with the parameters IpProtocol, FromPort, ToPort or CidrIp",
        )),
        (true, true) => {
            let mut one = permission(p, "")?;
            one.ip_ranges = vec![cidr4(p.req("CidrIp")?)?];
            Ok(vec![one])
        }
        (_, false) => Ok(structured),
    }
}
