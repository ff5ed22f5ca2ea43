//! The EC2 Query API endpoint: decode the form, pass throttling and faults, act on the world, answer
//! EC2's XML (or EC2's error XML with EC2's status code).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use tokio::time::Instant;

use crate::Inner;
use crate::error::{Ec2Error, Ec2Result};
use crate::query::Params;
use crate::traffic::Admission;
use crate::world::{AssignArgs, CreateEniArgs, EniView, InstanceView, ModifyArgs, World};
use crate::xml::{self, Xml};

/// API version the SDK speaks.
pub const API_VERSION: &str = "2016-11-15";

/// The actions mockcloud implements.
pub const ACTIONS: &[&str] = &[
    "DescribeInstances",
    "DescribeInstanceTypes",
    "DescribeSubnets",
    "DescribeNetworkInterfaces",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "CreateTags",
    "DeleteTags",
];

fn reply(status: u16, body: String) -> Response {
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
        body,
    )
        .into_response()
}

/// `POST /`: one EC2 Query API request.
pub async fn handle(State(mock): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let request_id = format!(
        "{:08x}-0000-4000-8000-{:012x}",
        mock.next_request.fetch_add(1, Ordering::Relaxed),
        rand::rng().random::<u64>() & 0xffff_ffff_ffff
    );
    let params = match Params::parse(&body) {
        Ok(p) => p,
        Err(e) => return reply(e.status, xml::error(&e, &request_id)),
    };
    let action = match params.get("Action") {
        Some(a) if !a.is_empty() => a.to_owned(),
        _ => {
            let e = Ec2Error::client(
                "MissingAction",
                "The request must contain the parameter Action",
            );
            return reply(e.status, xml::error(&e, &request_id));
        }
    };
    if !ACTIONS.contains(&action.as_str()) {
        let e = Ec2Error::client(
            "InvalidAction",
            format!("The action {action} is not valid for this web service."),
        );
        return reply(e.status, xml::error(&e, &request_id));
    }
    if params.get("Version").is_none_or(str::is_empty) {
        let e = Ec2Error::missing("Version");
        return reply(e.status, xml::error(&e, &request_id));
    }
    if !headers.contains_key(header::AUTHORIZATION) {
        let e = Ec2Error::new(
            401,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
        );
        return reply(e.status, xml::error(&e, &request_id));
    }

    let admission = mock
        .traffic
        .lock()
        .expect("traffic lock")
        .admit(&action, Instant::now());
    let slow_reply = match admission {
        Admission::Reject { after, error } => {
            tokio::time::sleep(after).await;
            mock.traffic
                .lock()
                .expect("traffic lock")
                .record(&action, Err(&error), Instant::now());
            return reply(error.status, xml::error(&error, &request_id));
        }
        Admission::Proceed { slow_reply } => slow_reply,
    };
    let delay = mock.latency_for(&action);
    tokio::time::sleep(delay).await;
    let result = {
        let mut world = mock.world.lock().expect("world lock");
        perform(&mut world, &action, &params, &request_id, Instant::now())
    };
    if let Some(d) = slow_reply {
        tokio::time::sleep(d).await;
    }
    mock.traffic.lock().expect("traffic lock").record(
        &action,
        result.as_ref().map(|_| ()),
        Instant::now(),
    );
    match result {
        Ok(body) => reply(200, body),
        Err(e) => reply(e.status, xml::error(&e, &request_id)),
    }
}

/// Pagination over a described list: `MaxResults` (5..=1000) and an opaque `NextToken`.
fn paginate<T>(items: Vec<T>, p: &Params, has_ids: bool) -> Ec2Result<(Vec<T>, Option<String>)> {
    let max = p.u32("MaxResults")?;
    let start = match p.get("NextToken") {
        None | Some("") => 0usize,
        Some(t) => t
            .strip_prefix("mocktoken-")
            .and_then(|n| n.parse().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| {
                Ec2Error::invalid_value("NextToken", t, "The token is invalid or expired.")
            })?,
    };
    let Some(max) = max else {
        return Ok((items.into_iter().skip(start).collect(), None));
    };
    if has_ids {
        return Err(Ec2Error::combination(
            "The parameter MaxResults cannot be used with the parameter NetworkInterfaceId/InstanceId/SubnetId",
        ));
    }
    if !(5..=1000).contains(&max) {
        return Err(Ec2Error::invalid_value(
            "MaxResults",
            &max.to_string(),
            "Must be between 5 and 1000.",
        ));
    }
    let end = (start + max as usize).min(items.len());
    let next = (end < items.len()).then(|| format!("mocktoken-{end}"));
    Ok((
        items.into_iter().skip(start).take(max as usize).collect(),
        next,
    ))
}

fn ip_list(p: &Params, prefix: &str) -> Ec2Result<Vec<std::net::Ipv4Addr>> {
    p.list(prefix)
        .iter()
        .map(|s| {
            s.parse()
                .map_err(|_| Ec2Error::invalid_value(prefix, s, "Expected an IPv4 address."))
        })
        .collect()
}

fn perform(
    w: &mut World,
    action: &str,
    p: &Params,
    request_id: &str,
    now: Instant,
) -> Ec2Result<String> {
    if p.bool("DryRun")? == Some(true) {
        return Err(Ec2Error::new(
            412,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        ));
    }
    let owner = w.owner_id().to_owned();
    let mut x = Xml::response(action, request_id);
    match action {
        "DescribeInstances" => {
            let ids = p.list("InstanceId");
            let all = w.describe_instances(&ids, &p.filters()?, now)?;
            let (page, next) = paginate(all, p, !ids.is_empty())?;
            x.set("reservationSet", page, |x, i| {
                x.leaf("reservationId", format!("r-{}", &i.id[2..]))
                    .leaf("ownerId", &owner)
                    .open("groupSet")
                    .close("groupSet");
                x.set("instancesSet", [i], |x, i| instance_xml(x, &i, &owner));
            });
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "DescribeInstanceTypes" => {
            let types = w.describe_instance_types(&p.list("InstanceType"))?;
            x.set("instanceTypeSet", types, |x, t| {
                x.leaf("instanceType", t.name)
                    .leaf("currentGeneration", true)
                    .open("networkInfo")
                    .leaf("maximumNetworkInterfaces", t.max_enis)
                    .leaf("ipv4AddressesPerInterface", t.ipv4_per_eni)
                    .leaf("maximumNetworkCards", 1)
                    .leaf("defaultNetworkCardIndex", 0)
                    .leaf("ipv6Supported", true)
                    .close("networkInfo");
            });
        }
        "DescribeSubnets" => {
            let ids = p.list("SubnetId");
            let all = w.describe_subnets(&ids, &p.filters()?)?;
            let (page, next) = paginate(all, p, !ids.is_empty())?;
            x.set("subnetSet", page, |x, s| {
                x.leaf("subnetId", &s.id)
                    .leaf("state", "available")
                    .leaf("vpcId", &s.vpc_id)
                    .leaf("cidrBlock", s.cidr)
                    .leaf("availableIpAddressCount", s.available_ips)
                    .leaf("availabilityZone", &s.availability_zone)
                    .leaf("defaultForAz", false)
                    .leaf("mapPublicIpOnLaunch", false)
                    .leaf("ownerId", &owner);
            });
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "DescribeNetworkInterfaces" => {
            let ids = p.list("NetworkInterfaceId");
            let all = w.describe_network_interfaces(&ids, &p.filters()?, now)?;
            let (page, next) = paginate(all, p, !ids.is_empty())?;
            x.set("networkInterfaceSet", page, |x, e| eni_xml(x, &e, &owner));
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "CreateNetworkInterface" => {
            let mut tags = BTreeMap::new();
            for spec in p.structs("TagSpecification") {
                let rt = spec.get("ResourceType").unwrap_or("network-interface");
                if rt != "network-interface" {
                    return Err(Ec2Error::invalid_value(
                        "TagSpecification.ResourceType",
                        rt,
                        "CreateNetworkInterface tags only network-interface resources.",
                    ));
                }
                for (k, v) in spec.tags("Tag")? {
                    tags.insert(k, v.unwrap_or_default());
                }
            }
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
            let args = CreateEniArgs {
                subnet_id: p.req("SubnetId")?.to_owned(),
                security_groups: p.list("SecurityGroupId"),
                description: p.get("Description").unwrap_or_default().to_owned(),
                secondary_count: p.u32("SecondaryPrivateIpAddressCount")?.unwrap_or(0),
                addresses,
                tags,
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
            let eni = w.create_network_interface(&args, now)?;
            x.open("networkInterface");
            eni_xml(&mut x, &eni, &owner);
            x.close("networkInterface");
            if let Some(t) = &args.client_token {
                x.leaf("clientToken", t);
            }
        }
        "AttachNetworkInterface" => {
            let eni = p.req("NetworkInterfaceId")?;
            let inst = p.req("InstanceId")?;
            let idx = p
                .u32("DeviceIndex")?
                .ok_or_else(|| Ec2Error::missing("DeviceIndex"))?;
            if p.u32("NetworkCardIndex")?.unwrap_or(0) != 0 {
                return Err(Ec2Error::invalid_value(
                    "NetworkCardIndex",
                    p.get("NetworkCardIndex").unwrap_or_default(),
                    "Only network card 0 exists.",
                ));
            }
            let id = w.attach_network_interface(eni, inst, idx, now)?;
            x.leaf("attachmentId", id).leaf("networkCardIndex", 0);
        }
        "DetachNetworkInterface" => {
            w.detach_network_interface(
                p.req("AttachmentId")?,
                p.bool("Force")?.unwrap_or(false),
                now,
            )?;
            x.leaf("return", true);
        }
        "DeleteNetworkInterface" => {
            w.delete_network_interface(p.req("NetworkInterfaceId")?, now)?;
            x.leaf("return", true);
        }
        "ModifyNetworkInterfaceAttribute" => {
            let eni = p.req("NetworkInterfaceId")?;
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
            w.modify_network_interface_attribute(eni, changes.remove(0), now)?;
            x.leaf("return", true);
        }
        "AssignPrivateIpAddresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            let ips = ip_list(p, "PrivateIpAddress")?;
            let count = p.u32("SecondaryPrivateIpAddressCount")?;
            let args = match (count, ips.is_empty()) {
                (Some(_), false) => {
                    return Err(Ec2Error::combination(
                        "Specify either SecondaryPrivateIpAddressCount or PrivateIpAddress, not both",
                    ));
                }
                (Some(n), true) => AssignArgs::Count(n),
                (None, false) => AssignArgs::Addresses {
                    ips,
                    allow_reassignment: p.bool("AllowReassignment")?.unwrap_or(false),
                },
                (None, true) => {
                    return Err(Ec2Error::missing(
                        "SecondaryPrivateIpAddressCount or PrivateIpAddress",
                    ));
                }
            };
            let new = w.assign_private_ip_addresses(&eni, args, now)?;
            x.leaf("networkInterfaceId", &eni);
            x.set("assignedPrivateIpAddressesSet", new, |x, ip| {
                x.leaf("privateIpAddress", ip);
            });
            x.leaf("return", true);
        }
        "UnassignPrivateIpAddresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            w.unassign_private_ip_addresses(&eni, &ip_list(p, "PrivateIpAddress")?, now)?;
            x.leaf("return", true);
        }
        "CreateTags" => {
            let tags = p
                .tags("Tag")?
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or_default()))
                .collect();
            w.create_tags(&p.list("ResourceId"), &tags)?;
            x.leaf("return", true);
        }
        "DeleteTags" => {
            w.delete_tags(&p.list("ResourceId"), &p.tags("Tag")?)?;
            x.leaf("return", true);
        }
        other => {
            return Err(Ec2Error::client(
                "InvalidAction",
                format!("The action {other} is not valid for this web service."),
            ));
        }
    }
    Ok(x.finish(action))
}

fn groups_xml(x: &mut Xml, groups: &[String]) {
    x.set("groupSet", groups, |x, g| {
        x.leaf("groupId", g).leaf("groupName", format!("group-{g}"));
    });
}

fn ips_xml(x: &mut Xml, e: &EniView) {
    let all =
        std::iter::once((e.primary_ip, true)).chain(e.secondary_ips.iter().map(|ip| (*ip, false)));
    x.set("privateIpAddressesSet", all, |x, (ip, primary)| {
        x.leaf("privateIpAddress", ip).leaf("primary", primary);
    });
}

fn eni_xml(x: &mut Xml, e: &EniView, owner: &str) {
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
            .leaf("networkCardIndex", 0)
            .leaf("status", a.status)
            .leaf("deleteOnTermination", a.delete_on_termination)
            .close("attachment");
    }
    ips_xml(x, e);
    x.set("tagSet", &e.tags, |x, (k, v)| {
        x.leaf("key", k).leaf("value", v);
    });
}

fn instance_xml(x: &mut Xml, i: &InstanceView, owner: &str) {
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
                .leaf("networkCardIndex", 0)
                .leaf("status", a.status)
                .leaf("deleteOnTermination", a.delete_on_termination)
                .close("attachment");
        }
        ips_xml(x, e);
    });
}
