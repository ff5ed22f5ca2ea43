//! The describes the pool and the reconcile read EC2 through: the instance (its ENIs from
//! DescribeNetworkInterfaces by the ids DescribeInstances lists, which carries their tags), the
//! ENIs attached to an instance by the ids known of them (`attached`), its type's limits, subnets and their
//! prefix reservations, and ENIs (paginated, except by id, which EC2 does not paginate). Each is one
//! limiter call per page on the API's own bucket; a thing asked for by id and missing from EC2's
//! reply is a `NotFound` named after EC2's own code.

use aws_sdk_ec2::types::{Filter, InstanceType};
use ipnet::Ipv4Net;

use super::Ec2Cloud;
use super::classify;
use super::convert::*;
use crate::limiter::CallClass;
use crate::{
    CloudError, CloudResult, Eni, EniFilter, EniId, Instance, InstanceLimits, Subnet, SubnetFilter,
};

impl Ec2Cloud {
    pub(super) async fn instance(&self, instance_id: &str) -> CloudResult<Instance> {
        const API: &str = "DescribeInstances";
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .describe_instances()
                    .instance_ids(instance_id)
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        let inst = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(instance_id))
            .ok_or_else(|| CloudError::NotFound {
                api: API.into(),
                code: "InvalidInstanceID.NotFound".into(),
                message: format!("{instance_id} not in the reply"),
            })?;
        // DescribeInstances lists interfaces without tags; the pool needs the tags (ownership), so
        // the ENIs come from DescribeNetworkInterfaces, by the ids DescribeInstances lists: one
        // call, where a filter on the instance alone would walk every ENI of the region.
        let listed: Vec<EniId> = inst
            .network_interfaces()
            .iter()
            .filter_map(|n| n.network_interface_id()?.parse().ok())
            .collect();
        let mut enis = self
            .attached(instance_id, inst.vpc_id().unwrap_or_default(), &listed)
            .await?;
        enis.sort_by_key(|e| e.attachment.as_ref().map(|a| a.device_index));
        Ok(Instance {
            id: instance_id.to_owned(),
            instance_type: inst
                .instance_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            availability_zone: inst
                .placement()
                .and_then(|p| p.availability_zone())
                .unwrap_or_default()
                .to_owned(),
            vpc_id: inst.vpc_id().unwrap_or_default().to_owned(),
            subnet_id: inst.subnet_id().unwrap_or_default().to_owned(),
            enis,
        })
    }

    pub(super) async fn limits(&self, instance_type: &str) -> CloudResult<InstanceLimits> {
        const API: &str = "DescribeInstanceTypes";
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .describe_instance_types()
                    .instance_types(InstanceType::from(instance_type))
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        let info = out
            .instance_types()
            .first()
            .ok_or_else(|| CloudError::NotFound {
                api: API.into(),
                code: "InvalidInstanceType.NotFound".into(),
                message: format!("no limits for instance type {instance_type}"),
            })?;
        limits_from_sdk(API, instance_type, info)
    }

    pub(super) async fn subnet(&self, subnet_id: &str) -> CloudResult<Subnet> {
        const API: &str = "DescribeSubnets";
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .describe_subnets()
                    .subnet_ids(subnet_id)
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        let s = out
            .subnets()
            .iter()
            .find(|s| s.subnet_id() == Some(subnet_id))
            .ok_or_else(|| CloudError::NotFound {
                api: API.into(),
                code: "InvalidSubnetID.NotFound".into(),
                message: format!("{subnet_id} not in the reply"),
            })?;
        subnet_from_sdk(API, s)
    }

    pub(super) async fn prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>> {
        const API: &str = "GetSubnetCidrReservations";
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .get_subnet_cidr_reservations()
                    .subnet_id(subnet_id)
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        out.subnet_ipv4_cidr_reservations()
            .iter()
            .filter(|r| r.reservation_type().map(|t| t.as_str()) == Some("prefix"))
            .filter_map(|r| r.cidr())
            .map(|c| parse_prefix(API, c))
            .collect()
    }

    pub(super) async fn subnets(&self, filter: &SubnetFilter) -> CloudResult<Vec<Subnet>> {
        const API: &str = "DescribeSubnets";
        let one = |name: &str, value: &str| Filter::builder().name(name).values(value).build();
        let mut sdk_filters = Vec::new();
        if let Some(v) = &filter.vpc_id {
            sdk_filters.push(one("vpc-id", v));
        }
        if let Some(az) = &filter.availability_zone {
            sdk_filters.push(one("availability-zone", az));
        }
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .describe_subnets()
                    .set_subnet_ids((!filter.ids.is_empty()).then(|| filter.ids.clone()))
                    .set_filters((!sdk_filters.is_empty()).then(|| sdk_filters.clone()))
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        out.subnets()
            .iter()
            .map(|s| subnet_from_sdk(API, s))
            .collect()
    }

    /// [`crate::Cloud::describe_attached`]: by the `known` ids with the instance and VPC filters
    /// (one unpaginated call); when EC2 knows one of them no more, or none is known, the paged
    /// describe by `vpc-id` and `attachment.instance-id`. Not through `settling`: a not-found here is
    /// answered by the paged describe, not waited out.
    pub(super) async fn attached(
        &self,
        instance_id: &str,
        vpc_id: &str,
        known: &[EniId],
    ) -> CloudResult<Vec<Eni>> {
        let every = EniFilter::attached(instance_id, vpc_id);
        let mut ids: Vec<EniId> = known.to_vec();
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return self.enis(&every).await;
        }
        match self
            .enis(&EniFilter {
                ids,
                ..every.clone()
            })
            .await
        {
            Err(e) if e.is_not_found() => {
                tracing::debug!(error = %e, instance_id,
                    "an ENI known here is gone from EC2: describing the instance's ENIs by filter");
                self.enis(&every).await
            }
            other => other,
        }
    }

    pub(super) async fn enis(&self, filter: &EniFilter) -> CloudResult<Vec<Eni>> {
        const API: &str = "DescribeNetworkInterfaces";
        let sdk_filters = filters(filter);
        let ids: Vec<String> = filter.ids.iter().map(|i| i.as_str().to_owned()).collect();
        let mut enis = Vec::new();
        let mut token: Option<String> = None;
        let sent = self.holdings.sending();
        loop {
            let page = self
                .limiter
                .call(API, CallClass::Describe, || {
                    let mut req = self
                        .client
                        .describe_network_interfaces()
                        .set_filters((!sdk_filters.is_empty()).then(|| sdk_filters.clone()))
                        .set_next_token(token.clone());
                    // EC2 refuses MaxResults together with explicit ids (ids are not paginated).
                    if ids.is_empty() {
                        req = req.max_results(self.page_size);
                    } else {
                        req = req.set_network_interface_ids(Some(ids.clone()));
                    }
                    async move { req.send().await.map_err(|e| classify(API, e)) }
                })
                .await?;
            for ni in page.network_interfaces() {
                enis.push(eni_from_sdk(API, ni)?);
            }
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => break,
            }
        }
        let learned = self.holdings.quiet(sent, &enis);
        if learned > 0 {
            tracing::debug!(
                learned,
                "a quiet describe taught the holdings of ENIs not known yet"
            );
        }
        Ok(enis)
    }
}
