//! The [`Cloud`] calls of [`MemoryCloud`]: EC2's rules on the fake's state.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};

use eniipam_api::model::EniId;
use eniipam_cloud::{
    AttachmentStatus, Cloud, CloudError, CloudResult, CreateEni, Eni, EniAttachment, EniFilter,
    EniStatus, Instance, InstanceLimits, PrefixReservation, ReserveResult, SecurityGroup, Subnet,
    SubnetFilter,
};

use crate::state::{eni_not_found, rejected, remove_all};
use crate::{Action, MemoryCloud};

fn eni_matches(eni: &Eni, filter: &EniFilter) -> bool {
    (filter.ids.is_empty() || filter.ids.contains(&eni.id))
        && filter.attached_to.as_ref().is_none_or(|inst| {
            eni.attachment
                .as_ref()
                .is_some_and(|a| &a.instance_id == inst)
        })
        && filter.status.as_ref().is_none_or(|s| &eni.status == s)
        && filter.vpc_id.as_ref().is_none_or(|v| &eni.vpc_id == v)
        && filter
            .subnet_id
            .as_ref()
            .is_none_or(|s| &eni.subnet_id == s)
        && filter.tags.iter().all(|(k, v)| eni.tags.get(k) == Some(v))
        && filter.tag_keys.iter().all(|k| eni.tags.contains_key(k))
}

#[async_trait]
impl Cloud for MemoryCloud {
    async fn describe_instance(&self, instance_id: &str) -> CloudResult<Instance> {
        let api = Action::DescribeInstances;
        self.call(api, format!("instance={instance_id}"), |st| {
            let spec = &st.instance.spec;
            if spec.instance_id != instance_id {
                return Err(CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidInstanceID.NotFound".into(),
                    message: format!("the instance ID '{instance_id}' does not exist"),
                });
            }
            Ok(Instance {
                id: spec.instance_id.clone(),
                instance_type: spec.instance_type.clone(),
                availability_zone: spec.availability_zone.clone(),
                vpc_id: spec.vpc_id.clone(),
                subnet_id: spec.subnet_id.clone(),
                enis: st.attached().into_iter().cloned().collect(),
            })
        })
        .await
    }

    async fn instance_limits(&self, instance_type: &str) -> CloudResult<InstanceLimits> {
        let api = Action::DescribeInstanceTypes;
        self.call(api, format!("type={instance_type}"), |st| {
            if st.instance.spec.instance_type == instance_type {
                Ok(st.instance.spec.limits)
            } else {
                Err(rejected(
                    api.as_str(),
                    "InvalidInstanceType",
                    format!("unknown instance type {instance_type}"),
                ))
            }
        })
        .await
    }

    async fn describe_subnet(&self, subnet_id: &str) -> CloudResult<Subnet> {
        let api = Action::DescribeSubnets;
        self.call(api, format!("subnet={subnet_id}"), |st| {
            let s = &st.subnet;
            if s.id != subnet_id {
                return Err(CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidSubnetID.NotFound".into(),
                    message: format!("the subnet ID '{subnet_id}' does not exist"),
                });
            }
            Ok(Subnet {
                id: s.id.clone(),
                vpc_id: s.vpc_id.clone(),
                cidr: s.cidr,
                availability_zone: s.availability_zone.clone(),
                available_ips: s.free_count(),
                tags: BTreeMap::new(),
                ipv6_cidrs: s.ipv6.iter().map(|b| b.cidr).collect(),
            })
        })
        .await
    }

    async fn describe_enis(&self, filter: &EniFilter) -> CloudResult<Vec<Eni>> {
        let api = Action::DescribeNetworkInterfaces;
        self.call(api, format!("filter={filter:?}"), |st| {
            if let Some(missing) = filter.ids.iter().find(|id| !st.enis.contains_key(id)) {
                return Err(eni_not_found(api.as_str(), missing));
            }
            Ok(st
                .enis
                .values()
                .filter(|e| eni_matches(e, filter))
                .cloned()
                .collect())
        })
        .await
    }

    async fn create_eni(&self, req: &CreateEni) -> CloudResult<Eni> {
        let api = Action::CreateNetworkInterface;
        let args = format!(
            "subnet={} groups={} secondary_ip_count={} prefix_count={} private_ips={:?} client_token={} tags={:?}",
            req.subnet_id,
            req.security_groups.join(","),
            req.secondary_ip_count,
            req.prefix_count,
            req.private_ips,
            req.client_token,
            req.tags
        );
        self.call(api, args, |st| {
            let name = api.as_str();
            if let Some(id) = st.client_tokens.get(&req.client_token)
                && let Some(eni) = st.enis.get(id)
            {
                return Ok(eni.clone());
            }
            if st.subnet.id != req.subnet_id {
                return Err(CloudError::NotFound {
                    api: name.into(),
                    code: "InvalidSubnetID.NotFound".into(),
                    message: format!("the subnet ID '{}' does not exist", req.subnet_id),
                });
            }
            let per_eni = st.instance.spec.limits.ipv4_per_eni;
            let slots = req.secondary_ip_count + req.prefix_count + req.private_ips.len() as u32;
            if slots + 1 > per_eni {
                return Err(CloudError::IpLimitExceeded {
                    api: name.into(),
                    message: format!(
                        "{slots} secondary addresses or prefixes requested, the limit is {}",
                        per_eni - 1
                    ),
                });
            }
            if req.private_ips.iter().any(|ip| st.subnet.used.contains(ip)) {
                return Err(rejected(
                    name,
                    eniipam_cloud::ADDRESS_IN_USE,
                    format!("one of {:?} is in use", req.private_ips),
                ));
            }
            let primary = st.subnet.allocate(name, 1)?[0];
            let prefixes = match st.subnet.allocate_prefixes(name, req.prefix_count) {
                Ok(prefixes) => prefixes,
                Err(err) => {
                    st.subnet.used.remove(&primary);
                    return Err(err);
                }
            };
            let mut secondary = req.private_ips.clone();
            st.subnet.used.extend(secondary.iter().copied());
            match st.subnet.allocate(name, req.secondary_ip_count) {
                Ok(ips) => secondary.extend(ips),
                Err(err) => {
                    st.subnet.used.remove(&primary);
                    for ip in prefixes
                        .iter()
                        .flat_map(|p| eniipam_cloud::prefix_addresses(*p))
                    {
                        st.subnet.used.remove(&ip);
                    }
                    for ip in &req.private_ips {
                        st.subnet.used.remove(ip);
                    }
                    return Err(err);
                }
            }
            let id = st.new_eni_id();
            let mac = st.new_mac();
            let eni = Eni {
                id: id.clone(),
                mac,
                subnet_id: req.subnet_id.clone(),
                vpc_id: st.subnet.vpc_id.clone(),
                availability_zone: st.subnet.availability_zone.clone(),
                description: req.description.clone(),
                status: EniStatus::Available,
                primary_ip: primary,
                secondary_ips: secondary,
                ipv4_prefixes: prefixes,
                security_groups: req.security_groups.clone(),
                attachment: None,
                tags: req.tags.clone(),
                ipv6_addresses: Vec::new(),
                ipv6_prefixes: Vec::new(),
            };
            st.enis.insert(id.clone(), eni.clone());
            st.client_tokens.insert(req.client_token.clone(), id);
            Ok(eni)
        })
        .await
    }

    async fn attach_eni(
        &self,
        eni: &EniId,
        instance_id: &str,
        device_index: u32,
    ) -> CloudResult<String> {
        let api = Action::AttachNetworkInterface;
        let args = format!("eni={eni} instance={instance_id} device_index={device_index}");
        self.call(api, args, |st| {
            let name = api.as_str();
            if st.instance.spec.instance_id != instance_id {
                return Err(CloudError::NotFound {
                    api: name.into(),
                    code: "InvalidInstanceID.NotFound".into(),
                    message: format!("the instance ID '{instance_id}' does not exist"),
                });
            }
            let limits = st.instance.spec.limits;
            let attached = st.attached();
            if attached.len() as u32 >= limits.max_enis {
                return Err(CloudError::AttachmentLimitExceeded {
                    api: name.into(),
                    message: format!(
                        "instance {instance_id} already has {} interfaces",
                        limits.max_enis
                    ),
                });
            }
            if device_index >= limits.max_enis {
                return Err(rejected(
                    name,
                    "InvalidParameterValue",
                    format!("device index {device_index} is out of range"),
                ));
            }
            if attached.iter().any(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.device_index == device_index)
            }) {
                return Err(rejected(
                    name,
                    "InvalidParameterValue",
                    format!(
                        "Instance '{instance_id}' already has an interface attached at device index '{device_index}'."
                    ),
                ));
            }
            let attachment_id = format!("eni-attach-{:017x}", st.next_id());
            let instance = instance_id.to_owned();
            let e = st.eni_mut(name, eni)?;
            if e.attachment.is_some() {
                return Err(rejected(
                    name,
                    "InvalidNetworkInterface.InUse",
                    format!("interface {eni} is already attached"),
                ));
            }
            e.attachment = Some(EniAttachment {
                attachment_id: attachment_id.clone(),
                instance_id: instance,
                device_index,
                status: AttachmentStatus::Attached,
                delete_on_termination: false,
            });
            e.status = EniStatus::InUse;
            Ok(attachment_id)
        })
        .await
    }

    async fn set_delete_on_termination(&self, eni: &EniId, attachment_id: &str) -> CloudResult<()> {
        let api = Action::ModifyNetworkInterfaceAttribute;
        let args = format!("eni={eni} attachment={attachment_id} delete_on_termination=true");
        self.call(api, args, |st| {
            let e = st.eni_mut(api.as_str(), eni)?;
            match e.attachment.as_mut() {
                Some(a) if a.attachment_id == attachment_id => {
                    a.delete_on_termination = true;
                    Ok(())
                }
                _ => Err(CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidAttachmentID.NotFound".into(),
                    message: format!("attachment {attachment_id} does not exist on {eni}"),
                }),
            }
        })
        .await
    }

    async fn set_security_groups(&self, eni: &EniId, groups: &[String]) -> CloudResult<()> {
        let api = Action::ModifyNetworkInterfaceAttribute;
        let args = format!("eni={eni} groups={groups:?}");
        self.call(api, args, |st| {
            if groups.is_empty() || groups.len() > 5 {
                return Err(CloudError::Rejected {
                    api: api.as_str().into(),
                    code: if groups.is_empty() {
                        "MissingParameter".into()
                    } else {
                        "SecurityGroupsPerInterfaceLimitExceeded".into()
                    },
                    message: format!("{} security groups: an ENI carries 1 to 5", groups.len()),
                });
            }
            if let Some(g) = groups.iter().find(|g| !st.security_groups.contains_key(*g)) {
                return Err(CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidGroup.NotFound".into(),
                    message: format!("The security group '{g}' does not exist"),
                });
            }
            st.eni_mut(api.as_str(), eni)?.security_groups = groups.to_vec();
            Ok(())
        })
        .await
    }

    async fn detach_eni(&self, attachment_id: &str, force: bool) -> CloudResult<()> {
        let api = Action::DetachNetworkInterface;
        let args = format!("attachment={attachment_id} force={force}");
        self.call(api, args, |st| {
            let eni = st
                .enis
                .values_mut()
                .find(|e| {
                    e.attachment
                        .as_ref()
                        .is_some_and(|a| a.attachment_id == attachment_id)
                })
                .ok_or_else(|| CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidAttachmentID.NotFound".into(),
                    message: format!("attachment {attachment_id} does not exist"),
                })?;
            if eni.attachment.as_ref().is_some_and(|a| a.device_index == 0) {
                return Err(rejected(
                    api.as_str(),
                    "OperationNotPermitted",
                    "the primary network interface cannot be detached",
                ));
            }
            eni.attachment = None;
            eni.status = EniStatus::Available;
            Ok(())
        })
        .await
    }

    async fn delete_eni(&self, eni: &EniId) -> CloudResult<()> {
        let api = Action::DeleteNetworkInterface;
        self.call(api, format!("eni={eni}"), |st| {
            let e = st
                .enis
                .get(eni)
                .ok_or_else(|| eni_not_found(api.as_str(), eni))?;
            if e.attachment.is_some() {
                return Err(rejected(
                    api.as_str(),
                    "InvalidNetworkInterface.InUse",
                    format!("interface {eni} is currently in use"),
                ));
            }
            let e = st.enis.remove(eni).expect("present: checked above");
            st.release_ipv6(&e.ipv6_prefixes);
            st.subnet.used.remove(&e.primary_ip);
            for ip in &e.secondary_ips {
                st.subnet.used.remove(ip);
            }
            Ok(())
        })
        .await
    }

    async fn assign_ips(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        let api = Action::AssignPrivateIpAddresses;
        self.call(api, format!("eni={eni} count={count}"), |st| {
            let name = api.as_str();
            st.room_for(name, eni, count, "addresses")?;
            let ips = st.subnet.allocate(name, count)?;
            st.eni_mut(name, eni)?
                .secondary_ips
                .extend(ips.iter().copied());
            Ok(ips)
        })
        .await
    }

    async fn assign_specific_ips(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> CloudResult<Vec<Ipv4Addr>> {
        let api = Action::AssignSpecificPrivateIpAddresses;
        self.call(api, format!("eni={eni} ips={ips:?}"), |st| {
            let name = api.as_str();
            let per_eni = st.instance.spec.limits.ipv4_per_eni;
            let held = st.slots_held(name, eni)?;
            if held + ips.len() as u32 > per_eni {
                return Err(CloudError::IpLimitExceeded {
                    api: name.into(),
                    message: format!("{eni} holds {held} addresses, the limit is {per_eni}"),
                });
            }
            for ip in ips {
                if !st.subnet.cidr.contains(ip) || !st.subnet.is_usable(*ip) {
                    return Err(rejected(
                        name,
                        "InvalidParameterValue",
                        format!("{ip} is not a usable address of {}", st.subnet.id),
                    ));
                }
                if st.subnet.used.contains(ip) {
                    return Err(rejected(
                        name,
                        eniipam_cloud::ADDRESS_IN_USE,
                        format!("{ip} is in use"),
                    ));
                }
            }
            st.subnet.used.extend(ips.iter().copied());
            st.eni_mut(name, eni)?
                .secondary_ips
                .extend(ips.iter().copied());
            Ok(ips.to_vec())
        })
        .await
    }

    async fn unassign_ips(&self, eni: &EniId, ips: &[Ipv4Addr]) -> CloudResult<()> {
        let api = Action::UnassignPrivateIpAddresses;
        self.call(api, format!("eni={eni} ips={ips:?}"), |st| {
            let name = api.as_str();
            let e = st.eni_mut(name, eni)?;
            remove_all(name, eni, &mut e.secondary_ips, ips, "a secondary address")?;
            for ip in ips {
                st.subnet.used.remove(ip);
            }
            Ok(())
        })
        .await
    }

    async fn assign_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Net>> {
        let api = Action::AssignIpv4Prefixes;
        self.call(api, format!("eni={eni} prefix_count={count}"), |st| {
            let name = api.as_str();
            st.room_for(name, eni, count, "addresses and prefixes")?;
            let prefixes = st.subnet.allocate_prefixes(name, count)?;
            st.eni_mut(name, eni)?
                .ipv4_prefixes
                .extend(prefixes.iter().copied());
            Ok(prefixes)
        })
        .await
    }

    async fn unassign_prefixes(&self, eni: &EniId, prefixes: &[Ipv4Net]) -> CloudResult<()> {
        let api = Action::UnassignIpv4Prefixes;
        self.call(api, format!("eni={eni} prefixes={prefixes:?}"), |st| {
            let name = api.as_str();
            let e = st.eni_mut(name, eni)?;
            remove_all(name, eni, &mut e.ipv4_prefixes, prefixes, "a prefix")?;
            for ip in prefixes
                .iter()
                .flat_map(|p| eniipam_cloud::prefix_addresses(*p))
            {
                st.subnet.used.remove(&ip);
            }
            Ok(())
        })
        .await
    }

    async fn assign_ipv6_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv6Net>> {
        let api = Action::AssignIpv6Prefixes;
        self.call(api, format!("eni={eni} ipv6_prefix_count={count}"), |st| {
            st.assign_ipv6_prefixes(api.as_str(), eni, count)
        })
        .await
    }

    async fn assign_specific_ipv6_prefixes(
        &self,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<Vec<Ipv6Net>> {
        let api = Action::AssignSpecificIpv6Prefixes;
        self.call(api, format!("eni={eni} ipv6_prefixes={prefixes:?}"), |st| {
            st.assign_specific_ipv6_prefixes(api.as_str(), eni, prefixes)
        })
        .await
    }

    async fn unassign_ipv6_prefixes(&self, eni: &EniId, prefixes: &[Ipv6Net]) -> CloudResult<()> {
        let api = Action::UnassignIpv6Prefixes;
        self.call(api, format!("eni={eni} ipv6_prefixes={prefixes:?}"), |st| {
            st.unassign_ipv6_prefixes(api.as_str(), eni, prefixes)
        })
        .await
    }

    async fn describe_subnets(&self, filter: &SubnetFilter) -> CloudResult<Vec<Subnet>> {
        let api = Action::DescribeSubnets;
        self.call(api, format!("filter={filter:?}"), |st| {
            let s = &st.subnet;
            let matches = (filter.ids.is_empty() || filter.ids.contains(&s.id))
                && filter.vpc_id.as_ref().is_none_or(|v| *v == s.vpc_id)
                && filter
                    .availability_zone
                    .as_ref()
                    .is_none_or(|az| *az == s.availability_zone);
            Ok(if matches {
                vec![Subnet {
                    id: s.id.clone(),
                    vpc_id: s.vpc_id.clone(),
                    cidr: s.cidr,
                    availability_zone: s.availability_zone.clone(),
                    available_ips: s.free_count(),
                    tags: BTreeMap::new(),
                    ipv6_cidrs: s.ipv6.iter().map(|b| b.cidr).collect(),
                }]
            } else {
                Vec::new()
            })
        })
        .await
    }

    async fn describe_security_groups(&self, ids: &[String]) -> CloudResult<Vec<SecurityGroup>> {
        let api = Action::DescribeSecurityGroups;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.call(api, format!("ids={ids:?}"), |st| {
            ids.iter()
                .map(|id| {
                    st.security_groups
                        .get(id)
                        .cloned()
                        .ok_or_else(|| CloudError::NotFound {
                            api: api.as_str().into(),
                            code: "InvalidGroup.NotFound".into(),
                            message: format!("The security group '{id}' does not exist"),
                        })
                })
                .collect()
        })
        .await
    }

    async fn subnet_prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>> {
        self.prefix_reservations(subnet_id).await
    }

    async fn create_subnet_prefix_reservation(&self, req: &PrefixReservation) -> ReserveResult {
        self.create_prefix_reservation(req).await
    }

    async fn create_tags(
        &self,
        resource_id: &str,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        let api = Action::CreateTags;
        self.call(api, format!("resource={resource_id} tags={tags:?}"), |st| {
            let id: EniId = resource_id.parse().map_err(|_| {
                rejected(
                    api.as_str(),
                    "InvalidID",
                    format!("{resource_id} is not a resource this fake knows"),
                )
            })?;
            let e = st.eni_mut(api.as_str(), &id)?;
            e.tags
                .extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
            Ok(())
        })
        .await
    }

    fn throttled_within(&self, api: &str, window: std::time::Duration) -> bool {
        self.lock().throttled_at.iter().any(|(action, at)| {
            action.as_str() == api && *at + window > tokio::time::Instant::now()
        })
    }
}
