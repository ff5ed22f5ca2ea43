//! The EC2 Query API endpoint: decode the form, pass throttling and faults, act on the world, answer
//! EC2's XML (or EC2's error XML with EC2's status code).
//!
//! [`args`] turns parameters into the world's arguments; [`render`] writes the views as EC2's XML.

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
use crate::world::{Direction, ReservationType, World};
use crate::xml::{self, Xml};

pub(crate) mod args;
mod render;

use args::{
    AssignRequest, assign_request, create_eni_args, ip_list, ipv6_list, ipv6_prefix_list,
    ipv6_request, modify_args, prefix_list,
};
use render::{
    eni_xml, instance_type_xml, instance_xml, reservation_xml, security_group_xml, subnet_xml,
};

/// API version the SDK speaks.
pub const API_VERSION: &str = "2016-11-15";

/// The actions mockcloud implements.
pub use crate::actions::ACTIONS;

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

    let bucket = crate::throttling::bucket_for(&action, unfiltered(&params));
    let admission =
        mock.traffic
            .lock()
            .expect("traffic lock")
            .admit(&action, &bucket, Instant::now());
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
    // IAM is evaluated after the throttling bucket (a denied call still spends its token, as the
    // safe reading of EC2: never kinder) and before the action, under the same world lock so the
    // tags and VPCs it reads are the ones the action sees. DryRun is answered after it, as EC2 does.
    let caller = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .map(crate::iam::access_key_id)
        .unwrap_or_default();
    let policy = mock.iam.lock().expect("iam lock").policy_for(&caller);
    let result = {
        let mut world = mock.world.lock().expect("world lock");
        let now = Instant::now();
        let auth = match &policy {
            None => Ok(None),
            Some(p) => crate::iam::authorize(p, &mut world, &action, &params, &caller, now),
        };
        match auth {
            Ok(None) => perform(&mut world, &action, &params, &request_id, now),
            Ok(Some((denial, error))) => {
                mock.iam.lock().expect("iam lock").record(denial);
                Err(error)
            }
            Err(e) => Err(e),
        }
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

/// No filter, no IDs and no pagination: EC2's "unfiltered and unpaginated" call, which draws from
/// the smaller bucket where the API has one.
fn unfiltered(p: &Params) -> bool {
    !p.keys().any(|k| {
        k.starts_with("Filter.")
            || k == "MaxResults"
            || k == "NextToken"
            || k.split('.').next().is_some_and(|head| head.ends_with("Id"))
    })
}

/// The group an Authorize/Revoke call changes: `GroupId` (a `GroupName` alone addresses the
/// default VPC, which mockcloud's account does not have: EC2's answer then).
pub(crate) fn security_group_target(p: &Params) -> Ec2Result<&str> {
    match (
        p.get("GroupId").filter(|v| !v.is_empty()),
        p.get("GroupName"),
    ) {
        (Some(id), _) => Ok(id),
        (None, Some(name)) if !name.is_empty() => Err(Ec2Error::client(
            "InvalidGroup.NotFound",
            format!("The security group '{name}' does not exist in default VPC 'none'"),
        )),
        _ => Err(Ec2Error::missing("GroupId")),
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
            let names = p.list("InstanceType");
            let all = w.describe_instance_types(&names)?;
            let (page, next) = paginate(all, p, !names.is_empty())?;
            x.set("instanceTypeSet", page, |x, t| instance_type_xml(x, &t));
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "DescribeSubnets" => {
            let ids = p.list("SubnetId");
            let all = w.describe_subnets(&ids, &p.filters()?)?;
            let (page, next) = paginate(all, p, !ids.is_empty())?;
            x.set("subnetSet", page, |x, s| subnet_xml(x, &s, &owner));
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "DescribeNetworkInterfaces" => {
            let ids = p.list("NetworkInterfaceId");
            // EC2 pages over what the indexed filters (or the ids) select, then filters each page.
            let filters = p.filters()?;
            let selected = w.eni_candidates(&ids, &filters, now)?;
            let (page, next) = paginate(selected, p, !ids.is_empty())?;
            let page = w.eni_page(&page, &filters, now);
            x.set("networkInterfaceSet", page, |x, e| eni_xml(x, &e, &owner));
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "CreateNetworkInterface" => {
            let args = create_eni_args(p)?;
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
            let card = p.u32("NetworkCardIndex")?.unwrap_or(0);
            let id = w.attach_network_interface_on_card(eni, inst, idx, card, now)?;
            x.leaf("attachmentId", id).leaf("networkCardIndex", card);
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
            w.modify_network_interface_attribute(eni, modify_args(p)?, now)?;
            x.leaf("return", true);
        }
        "AssignPrivateIpAddresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            match assign_request(p)? {
                AssignRequest::Ips(args) => {
                    let new = w.assign_private_ip_addresses(&eni, args, now)?;
                    x.leaf("networkInterfaceId", &eni);
                    x.set("assignedPrivateIpAddressesSet", new, |x, ip| {
                        x.leaf("privateIpAddress", ip);
                    });
                }
                AssignRequest::Prefixes(args) => {
                    let new = w.assign_ipv4_prefixes(&eni, args, now)?;
                    x.leaf("networkInterfaceId", &eni);
                    x.set("assignedIpv4PrefixSet", new, |x, net| {
                        x.leaf("ipv4Prefix", net);
                    });
                }
            }
            x.leaf("return", true);
        }
        "UnassignPrivateIpAddresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            let ips = ip_list(p, "PrivateIpAddress")?;
            w.unassign_addresses(&eni, &ips, &prefix_list(p)?, now)?;
            x.leaf("return", true);
        }
        "AssignIpv6Addresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            let new = w.assign_ipv6(&eni, ipv6_request(p)?, now)?;
            x.set("assignedIpv6Addresses", new.addresses, |x, a| {
                x.text(a);
            });
            x.set("assignedIpv6PrefixSet", new.prefixes, |x, p| {
                x.text(p);
            });
            x.leaf("networkInterfaceId", &eni);
        }
        "UnassignIpv6Addresses" => {
            let eni = p.req("NetworkInterfaceId")?.to_owned();
            let (addresses, prefixes) = (ipv6_list(p)?, ipv6_prefix_list(p)?);
            w.unassign_ipv6(&eni, &addresses, &prefixes, now)?;
            x.leaf("networkInterfaceId", &eni);
            x.set("unassignedIpv6Addresses", addresses, |x, a| {
                x.text(a);
            });
            x.set("unassignedIpv6PrefixSet", prefixes, |x, p| {
                x.text(p);
            });
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
        "CreateSubnetCidrReservation" => {
            let subnet = p.req("SubnetId")?;
            let cidr_text = p.req("Cidr")?;
            let kind_text = p.req("ReservationType")?;
            let kind = ReservationType::parse(kind_text).ok_or_else(|| {
                Ec2Error::invalid_value(
                    "ReservationType",
                    kind_text,
                    "Valid values are prefix and explicit.",
                )
            })?;
            let cidr = cidr_text.parse().map_err(|_| {
                Ec2Error::invalid_value(
                    "Cidr",
                    cidr_text,
                    "Expected an IPv4 CIDR (mockcloud models IPv4 reservations only).",
                )
            })?;
            let tags = args::tag_specs(p, "subnet-cidr-reservation")?;
            let r = w.create_subnet_cidr_reservation(
                subnet,
                cidr,
                kind,
                p.get("Description").unwrap_or_default(),
                &tags,
            )?;
            x.open("subnetCidrReservation");
            reservation_xml(&mut x, &r);
            x.close("subnetCidrReservation");
        }
        "GetSubnetCidrReservations" => {
            let all = w.get_subnet_cidr_reservations(p.req("SubnetId")?, &p.filters()?)?;
            let (page, next) = paginate(all, p, false)?;
            x.set("subnetIpv4CidrReservationSet", page, |x, r| {
                reservation_xml(x, &r)
            });
            x.open("subnetIpv6CidrReservationSet")
                .close("subnetIpv6CidrReservationSet");
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "DeleteSubnetCidrReservation" => {
            let r = w.delete_subnet_cidr_reservation(p.req("SubnetCidrReservationId")?)?;
            x.open("deletedSubnetCidrReservation");
            reservation_xml(&mut x, &r);
            x.close("deletedSubnetCidrReservation");
        }
        "AssociateVpcCidrBlock" => {
            let vpc = p.req("VpcId")?;
            let Some(text) = p.get("CidrBlock") else {
                return Err(Ec2Error::missing(
                    "CidrBlock (mockcloud associates IPv4 blocks given by value only)",
                ));
            };
            let cidr = text.parse().map_err(|_| {
                Ec2Error::invalid_value("CidrBlock", text, "Expected an IPv4 CIDR block.")
            })?;
            let a = w.associate_vpc_cidr_block(vpc, cidr)?;
            x.open("cidrBlockAssociation")
                .leaf("associationId", &a.association_id)
                .leaf("cidrBlock", a.cidr)
                .open("cidrBlockState")
                .leaf("state", "associated")
                .close("cidrBlockState")
                .close("cidrBlockAssociation");
            x.leaf("vpcId", &a.vpc_id);
        }
        "DescribeSecurityGroups" => {
            let ids = p.list("GroupId");
            if !ids.is_empty() && p.get("MaxResults").is_some() {
                return Err(Ec2Error::combination(
                    "The parameter groupIds cannot be used with the parameter maxResults",
                ));
            }
            let all = w.describe_security_groups(&ids, &p.list("GroupName"), &p.filters()?)?;
            let (page, next) = paginate(all, p, false)?;
            x.set("securityGroupInfo", page, |x, g| {
                security_group_xml(x, &g, &owner, &w.arn("security-group", &g.id))
            });
            if let Some(n) = next {
                x.leaf("nextToken", n);
            }
        }
        "CreateSecurityGroup" => {
            let tags = args::tag_specs(p, "security-group")?;
            let id = w.create_security_group_named(
                p.get("VpcId"),
                p.req("GroupName")?,
                p.req("GroupDescription")?,
                &tags,
            )?;
            x.leaf("groupId", &id)
                .leaf("securityGroupArn", w.arn("security-group", &id));
            x.set("tagSet", &tags, |x, (k, v)| {
                x.leaf("key", k).leaf("value", v);
            });
        }
        "AuthorizeSecurityGroupIngress"
        | "RevokeSecurityGroupIngress"
        | "AuthorizeSecurityGroupEgress"
        | "RevokeSecurityGroupEgress" => {
            let group = security_group_target(p)?;
            let direction = if action.ends_with("Ingress") {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            if direction == Direction::Egress && p.get("CidrIp").is_some() {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    "The flat CidrIp/IpProtocol form is for ingress only: name egress rules in IpPermissions.N",
                ));
            }
            let perms = args::permissions(p)?;
            w.change_rules(group, direction, &perms, action.starts_with("Authorize"))?;
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
