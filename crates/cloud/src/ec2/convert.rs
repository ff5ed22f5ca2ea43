//! The SDK's types in domain terms and back: ENIs, statuses, attachments, filters, tags.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use aws_sdk_ec2::types::{
    Filter, NetworkInterface, NetworkInterfaceStatus, SubnetCidrBlockStateCode, Tag,
};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::{
    AttachmentStatus, CloudError, CloudResult, Eni, EniAttachment, EniFilter, EniStatus,
    InstanceLimits, Subnet,
};
use eniipam_api::model::EniId;

pub(super) fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(super) fn malformed(api: &str, what: impl std::fmt::Display) -> CloudError {
    CloudError::Rejected {
        api: api.to_owned(),
        code: "MalformedResponse".into(),
        message: what.to_string(),
    }
}

pub(super) fn parse_prefix(api: &str, s: &str) -> CloudResult<Ipv4Net> {
    s.parse()
        .map_err(|_| malformed(api, format!("not an IPv4 prefix: {s:?}")))
}

pub(super) fn parse_ipv6_prefix(api: &str, s: &str) -> CloudResult<Ipv6Net> {
    s.parse()
        .map_err(|_| malformed(api, format!("not an IPv6 prefix: {s:?}")))
}

pub(super) fn parse_ipv6(api: &str, s: &str) -> CloudResult<Ipv6Addr> {
    s.parse()
        .map_err(|_| malformed(api, format!("not an IPv6 address: {s:?}")))
}

/// The subnet's IPv6 blocks in the `associated` state: one being associated or disassociated
/// (or failed) gives no addresses. A reply without a state (not EC2's shape) counts as associated.
fn subnet_ipv6_cidrs(api: &str, s: &aws_sdk_ec2::types::Subnet) -> CloudResult<Vec<Ipv6Net>> {
    s.ipv6_cidr_block_association_set()
        .iter()
        .filter(|a| {
            a.ipv6_cidr_block_state()
                .and_then(|st| st.state())
                .is_none_or(|st| *st == SubnetCidrBlockStateCode::Associated)
        })
        .filter_map(|a| a.ipv6_cidr_block())
        .map(|c| parse_ipv6_prefix(api, c))
        .collect()
}

/// An SDK subnet in domain terms.
pub(super) fn subnet_from_sdk(api: &str, s: &aws_sdk_ec2::types::Subnet) -> CloudResult<Subnet> {
    let id = s.subnet_id().unwrap_or_default();
    let cidr_s = s.cidr_block().unwrap_or_default();
    let cidr: Ipv4Net = cidr_s
        .parse()
        .map_err(|_| malformed(api, format!("{id}: bad CIDR {cidr_s:?}")))?;
    Ok(Subnet {
        id: id.to_owned(),
        vpc_id: s.vpc_id().unwrap_or_default().to_owned(),
        cidr,
        availability_zone: s.availability_zone().unwrap_or_default().to_owned(),
        available_ips: s
            .available_ip_address_count()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        tags: tags_from_sdk(s.tags()),
        ipv6_cidrs: subnet_ipv6_cidrs(api, s)?,
    })
}

pub(super) fn parse_ip(api: &str, s: &str) -> CloudResult<Ipv4Addr> {
    s.parse()
        .map_err(|_| malformed(api, format!("not an IPv4 address: {s:?}")))
}

pub(super) fn status_from_sdk(s: Option<&NetworkInterfaceStatus>) -> EniStatus {
    match s {
        Some(NetworkInterfaceStatus::Available) => EniStatus::Available,
        Some(NetworkInterfaceStatus::Attaching) => EniStatus::Attaching,
        Some(NetworkInterfaceStatus::InUse) => EniStatus::InUse,
        Some(NetworkInterfaceStatus::Detaching) => EniStatus::Detaching,
        Some(other) => EniStatus::Other(other.as_str().to_owned()),
        None => EniStatus::Other(String::new()),
    }
}

pub(super) fn status_to_filter(s: &EniStatus) -> &str {
    match s {
        EniStatus::Available => "available",
        EniStatus::Attaching => "attaching",
        EniStatus::InUse => "in-use",
        EniStatus::Detaching => "detaching",
        EniStatus::Other(s) => s,
    }
}

pub(super) fn attachment_status_from_sdk(
    s: Option<&aws_sdk_ec2::types::AttachmentStatus>,
) -> AttachmentStatus {
    use aws_sdk_ec2::types::AttachmentStatus as S;
    match s {
        Some(S::Attaching) => AttachmentStatus::Attaching,
        Some(S::Attached) => AttachmentStatus::Attached,
        Some(S::Detaching) => AttachmentStatus::Detaching,
        Some(S::Detached) => AttachmentStatus::Detached,
        Some(other) => AttachmentStatus::Other(other.as_str().to_owned()),
        None => AttachmentStatus::Other(String::new()),
    }
}

/// An SDK `NetworkInterface` in domain terms.
pub(super) fn eni_from_sdk(api: &str, ni: &NetworkInterface) -> CloudResult<Eni> {
    let id_s = ni
        .network_interface_id()
        .ok_or_else(|| malformed(api, "network interface without an id"))?;
    let id: EniId = id_s.parse().map_err(|e| malformed(api, e))?;
    let mut primary = ni
        .private_ip_address()
        .map(|s| parse_ip(api, s))
        .transpose()?;
    let mut secondary = Vec::new();
    for a in ni.private_ip_addresses() {
        let Some(ip) = a.private_ip_address() else {
            continue;
        };
        let ip = parse_ip(api, ip)?;
        if a.primary() == Some(true) {
            primary.get_or_insert(ip);
        } else if Some(ip) != primary {
            secondary.push(ip);
        }
    }
    let primary_ip = primary.ok_or_else(|| malformed(api, format!("{id} has no primary IP")))?;
    secondary.retain(|ip| *ip != primary_ip);
    let attachment = match ni.attachment() {
        Some(a) if a.attachment_id().is_some() => Some(EniAttachment {
            attachment_id: a.attachment_id().unwrap_or_default().to_owned(),
            instance_id: a.instance_id().unwrap_or_default().to_owned(),
            device_index: a
                .device_index()
                .and_then(|d| u32::try_from(d).ok())
                .unwrap_or(0),
            status: attachment_status_from_sdk(a.status()),
            delete_on_termination: a.delete_on_termination().unwrap_or(false),
        }),
        _ => None,
    };
    Ok(Eni {
        id,
        mac: ni.mac_address().unwrap_or_default().to_owned(),
        subnet_id: ni.subnet_id().unwrap_or_default().to_owned(),
        vpc_id: ni.vpc_id().unwrap_or_default().to_owned(),
        availability_zone: ni.availability_zone().unwrap_or_default().to_owned(),
        description: ni.description().unwrap_or_default().to_owned(),
        status: status_from_sdk(ni.status()),
        primary_ip,
        secondary_ips: secondary,
        ipv4_prefixes: ni
            .ipv4_prefixes()
            .iter()
            .filter_map(|p| p.ipv4_prefix())
            .map(|p| parse_prefix(api, p))
            .collect::<CloudResult<Vec<_>>>()?,
        security_groups: ni
            .groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect(),
        attachment,
        tags: tags_from_sdk(ni.tag_set()),
        ipv6_addresses: ni
            .ipv6_addresses()
            .iter()
            .filter_map(|a| a.ipv6_address())
            .map(|a| parse_ipv6(api, a))
            .collect::<CloudResult<Vec<_>>>()?,
        ipv6_prefixes: ni
            .ipv6_prefixes()
            .iter()
            .filter_map(|p| p.ipv6_prefix())
            .map(|p| parse_ipv6_prefix(api, p))
            .collect::<CloudResult<Vec<_>>>()?,
    })
}

pub(super) fn filters(f: &EniFilter) -> Vec<Filter> {
    let mut out = Vec::new();
    let one = |name: &str, value: &str| Filter::builder().name(name).values(value).build();
    if let Some(i) = &f.attached_to {
        out.push(one("attachment.instance-id", i));
    }
    if let Some(s) = &f.status {
        out.push(one("status", status_to_filter(s)));
    }
    if let Some(v) = &f.vpc_id {
        out.push(one("vpc-id", v));
    }
    if let Some(s) = &f.subnet_id {
        out.push(one("subnet-id", s));
    }
    for (k, v) in &f.tags {
        out.push(one(&format!("tag:{k}"), v));
    }
    // Values of one filter are OR'ed by EC2; separate filters are AND'ed: one filter per key.
    for k in &f.tag_keys {
        out.push(one("tag-key", k));
    }
    out
}

/// EC2's tags as a map (a tag without a key is dropped, one without a value is empty).
fn tags_from_sdk(tags: &[Tag]) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|t| {
            Some((
                t.key()?.to_owned(),
                t.value().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

pub(super) fn sdk_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// An instance type's limits from `DescribeInstanceTypes`' `InstanceTypeInfo`.
pub(super) fn limits_from_sdk(
    api: &str,
    instance_type: &str,
    info: &aws_sdk_ec2::types::InstanceTypeInfo,
) -> CloudResult<InstanceLimits> {
    let net = info
        .network_info()
        .ok_or_else(|| malformed(api, format!("{instance_type}: no network info")))?;
    // The default card's ENIs: every ENI eniipam attaches goes there (the VPC CNI's max-pods
    // counts the same), and a multi-card type's instance-wide figure would overshoot it.
    let default_card = net.default_network_card_index().unwrap_or(0);
    let card_max = net
        .network_cards()
        .iter()
        .find(|c| c.network_card_index() == Some(default_card))
        .and_then(|c| c.maximum_network_interfaces())
        .and_then(|n| u32::try_from(n).ok());
    let max_enis = card_max
        .or_else(|| {
            net.maximum_network_interfaces()
                .and_then(|n| u32::try_from(n).ok())
        })
        .ok_or_else(|| malformed(api, format!("{instance_type}: no MaximumNetworkInterfaces")))?;
    let ipv4_per_eni = net
        .ipv4_addresses_per_interface()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            malformed(
                api,
                format!("{instance_type}: no Ipv4AddressesPerInterface"),
            )
        })?;
    let nitro = info.bare_metal() == Some(true)
        || info.hypervisor().map(|h| h.as_str()) == Some(eniipam_limits::NITRO);
    let vcpus = info
        .v_cpu_info()
        .and_then(|v| v.default_v_cpus())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    Ok(InstanceLimits {
        max_enis,
        ipv4_per_eni,
        vcpus,
        nitro,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_one_per_condition() {
        let f = EniFilter {
            status: Some(EniStatus::Available),
            vpc_id: Some("vpc-1".into()),
            tags: BTreeMap::from([("eniipam.io/cluster".into(), "c".into())]),
            tag_keys: vec!["eniipam.io/owner".into(), "other".into()],
            ..Default::default()
        };
        let names: Vec<_> = filters(&f)
            .iter()
            .map(|f| f.name().unwrap().to_owned())
            .collect();
        assert_eq!(
            names,
            vec![
                "status",
                "vpc-id",
                "tag:eniipam.io/cluster",
                "tag-key",
                "tag-key"
            ]
        );
        assert_eq!(filters(&f)[0].values(), ["available"]);
    }
}
