//! [`Ec2Cloud`]: the [`Cloud`] trait on `aws-sdk-ec2`.
//!
//! Every call goes limiter → retry → SDK: each attempt takes a token from the bucket of its class
//! (mutating or describe, see [`super::limiter`]), is counted and timed in [`CallStats`], and a
//! throttled or transient failure is retried with jittered backoff. The SDK's own retries are
//! disabled so that no attempt bypasses the buckets.
//!
//! Parts: this file (the client and the [`Cloud`] calls), [`classify`] (SDK errors → [`CloudError`],
//! once, by EC2 error code and HTTP status), [`convert`] (SDK types ⇄ domain types), `config`
//! ([`Ec2Config`] and building the client), `mutate` (the one loop every mutating call runs in),
//! `created` (a not-found about an ENI this client created lately is retried, as EC2 may not
//! show it yet), `ipv6` (AssignIpv6Addresses / UnassignIpv6Addresses for the node's `/80`), `describe` (the
//! describes of instances, instance types, subnets, subnet reservations and ENIs), `groups`
//! (DescribeSecurityGroups), `reservation` (CreateSubnetCidrReservation of type `prefix`).
//!
//! Calls that EC2 cannot make idempotent themselves are made safe after ambiguous failures
//! (timeouts and 5xx, where the request may have taken effect), all in `mutate`:
//! AssignPrivateIpAddresses (and AssignIpv6Addresses' `/80`s) compares the ENI's IPs with those it had before the first attempt
//! (known from this client's own calls, `holdings`; read from IMDS first, EC2 only when IMDS
//! lags), unassign/attach check the ENI's state before retrying, delete takes a later not-found as its
//! own lost success. CreateNetworkInterface is idempotent through its ClientToken.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::operation::unassign_private_ip_addresses::builders::UnassignPrivateIpAddressesFluentBuilder as UnassignPrivate;
use aws_sdk_ec2::types::{NetworkInterfaceAttachmentChanges, ResourceType, TagSpecification};
use ipnet::{Ipv4Net, Ipv6Net};

mod classify;
mod config;
mod convert;
mod created;
mod describe;
mod groups;
mod holdings;
mod ipv6;
mod mutate;
mod reservation;

pub use classify::{classify, classify_code};
pub use config::{DESCRIBE_PAGE_SIZE, Ec2BuildError, Ec2Config};
use convert::*;
use created::CreatedEnis;
use holdings::Holdings;
pub use mutate::AMBIGUOUS_IMDS_WAIT;
use mutate::{InstanceView, Verify, mutate};

use super::calls::CallStats;
use super::limiter::Limiter;
use super::{
    Cloud, CloudResult, CreateEni, Eni, EniFilter, Instance, InstanceLimits, Metadata,
    PrefixReservation, ReserveResult, SecurityGroup, Subnet, SubnetFilter,
};
use eniipam_api::model::EniId;

/// The [`Cloud`] on the real EC2 API (or anything speaking it, like mockcloud).
#[derive(Clone, Debug)]
pub struct Ec2Cloud {
    client: Client,
    limiter: Arc<Limiter>,
    page_size: i32,
    /// What each ENI holds, from this client's own calls (no describe before an assign).
    holdings: Arc<Holdings>,
    /// The ENIs this client created lately: a not-found about one of them may be EC2 not showing it
    /// yet, and is retried (`created`).
    created: Arc<CreatedEnis>,
    /// IMDS, to settle an ambiguous assign without a describe; `None`: EC2 settles it.
    view: Option<InstanceView>,
}

impl Ec2Cloud {
    /// The counters of this client's calls.
    pub fn stats(&self) -> &Arc<CallStats> {
        self.limiter.stats()
    }

    /// The limiter every call passes.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Settle an ambiguous assign (timeout, 5xx: did the lost attempt assign?) from the instance's
    /// own view first, `metadata`, for up to `settle` (default [`AMBIGUOUS_IMDS_WAIT`]), and only
    /// then with a DescribeNetworkInterfaces, which spends the account's describe budget.
    pub fn with_instance_view(mut self, metadata: Arc<dyn Metadata>, settle: Duration) -> Self {
        self.view = Some(InstanceView { metadata, settle });
        self
    }

    /// Describe one ENI (with retries); `None` when EC2 does not know it.
    async fn describe_one(&self, eni: &EniId) -> CloudResult<Option<Eni>> {
        let filter = EniFilter {
            ids: vec![eni.clone()],
            ..Default::default()
        };
        match self.describe_enis(&filter).await {
            Ok(enis) => Ok(enis.into_iter().find(|e| &e.id == eni)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn send_assign_count(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        const API: &str = "AssignPrivateIpAddresses";
        let out = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(eni.as_str())
            .secondary_private_ip_address_count(to_i32(count))
            .send()
            .await
            .map_err(|e| classify(API, e))?;
        out.assigned_private_ip_addresses()
            .iter()
            .filter_map(|a| a.private_ip_address())
            .map(|ip| parse_ip(API, ip))
            .collect()
    }

    /// One `UnassignPrivateIpAddresses` of IPv4 addresses or `/28` prefixes (`set` names the list),
    /// verified after an ambiguous failure ([`Ec2Cloud::unassign_verified`]).
    async fn unassign_private<T: holdings::Held + std::fmt::Display>(
        &self,
        eni: &EniId,
        gone: &[T],
        set: fn(UnassignPrivate, Option<Vec<String>>) -> UnassignPrivate,
    ) -> CloudResult<()> {
        const API: &str = "UnassignPrivateIpAddresses";
        if gone.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = gone.iter().map(T::to_string).collect();
        let send = || async {
            let call = self
                .client
                .unassign_private_ip_addresses()
                .network_interface_id(eni.as_str());
            set(call, Some(names.clone()))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        self.settling(API, [eni], || self.unassign_verified(API, eni, gone, send))
            .await
    }
}

#[async_trait]
impl Cloud for Ec2Cloud {
    async fn describe_instance(&self, instance_id: &str) -> CloudResult<Instance> {
        self.instance(instance_id).await
    }

    async fn instance_limits(&self, instance_type: &str) -> CloudResult<InstanceLimits> {
        self.limits(instance_type).await
    }

    async fn describe_subnet(&self, subnet_id: &str) -> CloudResult<Subnet> {
        self.subnet(subnet_id).await
    }

    async fn describe_security_groups(&self, ids: &[String]) -> CloudResult<Vec<SecurityGroup>> {
        self.security_groups(ids).await
    }

    async fn subnet_prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>> {
        self.prefix_reservations(subnet_id).await
    }

    async fn create_subnet_prefix_reservation(&self, req: &PrefixReservation) -> ReserveResult {
        self.create_prefix_reservation(req).await
    }

    async fn describe_subnets(&self, filter: &SubnetFilter) -> CloudResult<Vec<Subnet>> {
        self.subnets(filter).await
    }

    async fn describe_enis(&self, filter: &EniFilter) -> CloudResult<Vec<Eni>> {
        self.settling("DescribeNetworkInterfaces", &filter.ids, || {
            self.enis(filter)
        })
        .await
    }

    async fn describe_attached(
        &self,
        instance_id: &str,
        vpc_id: &str,
        known: &[EniId],
    ) -> CloudResult<Vec<Eni>> {
        self.attached(instance_id, vpc_id, known).await
    }

    async fn create_eni(&self, req: &CreateEni) -> CloudResult<Eni> {
        const API: &str = "CreateNetworkInterface";
        let tag_spec = TagSpecification::builder()
            .resource_type(ResourceType::NetworkInterface)
            .set_tags(Some(sdk_tags(&req.tags)))
            .build();
        // The same ClientToken on every attempt: EC2 returns the ENI of a lost attempt instead of
        // creating a second one. Its parameters must then be the same too: the count follows the
        // live one only while every attempt so far was throttled (EC2 acted on none of them).
        let frozen = AtomicBool::new(false);
        let asked = AtomicU32::new(req.secondary_ip_count);
        let (frozen, asked, tag_spec) = (&frozen, &asked, &tag_spec);
        // The request is built when the attempt goes, after the limiter's admission (the throttle
        // pause): the count then is the latest.
        let send = || async move {
            let count = match &req.live_ip_count {
                Some(live) if req.secondary_ip_count > 0 && !frozen.load(Ordering::Relaxed) => {
                    let n = live.get().max(req.secondary_ip_count);
                    asked.store(n, Ordering::Relaxed);
                    n
                }
                _ => asked.load(Ordering::Relaxed),
            };
            let mut b = self
                .client
                .create_network_interface()
                .subnet_id(&req.subnet_id)
                .set_groups(Some(req.security_groups.clone()))
                .description(&req.description)
                .tag_specifications(tag_spec.clone())
                .client_token(&req.client_token);
            if count > 0 {
                b = b.secondary_private_ip_address_count(to_i32(count));
            }
            if req.prefix_count > 0 {
                b = b.ipv4_prefix_count(to_i32(req.prefix_count));
            }
            if !req.private_ips.is_empty() {
                b = b.set_private_ip_addresses(Some(
                    req.private_ips
                        .iter()
                        .map(|ip| {
                            aws_sdk_ec2::types::PrivateIpAddressSpecification::builder()
                                .private_ip_address(ip.to_string())
                                .primary(false)
                                .build()
                        })
                        .collect(),
                ));
            }
            let result = b.send().await.map_err(|e| classify(API, e));
            if !matches!(result, Err(crate::CloudError::Throttled { .. })) {
                frozen.store(true, Ordering::Relaxed);
            }
            result
        };
        let out = mutate(&self.limiter, &self.holdings, API, send, Verify::nothing()).await?;
        let ni = out
            .network_interface()
            .ok_or_else(|| malformed(API, "no network interface in the reply"))?;
        let mut eni = eni_from_sdk(API, ni)?;
        if eni.tags.is_empty() {
            // Some endpoints do not echo TagSpecifications; the tags were part of the request.
            eni.tags = req.tags.clone();
        }
        self.holdings.record(&eni);
        self.created.record(&eni.id);
        Ok(eni)
    }

    async fn attach_eni(
        &self,
        eni: &EniId,
        instance_id: &str,
        device_index: u32,
    ) -> CloudResult<String> {
        const API: &str = "AttachNetworkInterface";
        let send = || async {
            let out = self
                .client
                .attach_network_interface()
                .network_interface_id(eni.as_str())
                .instance_id(instance_id)
                .device_index(to_i32(device_index))
                .send()
                .await
                .map_err(|e| classify(API, e))?;
            Ok(out.attachment_id().map(str::to_owned))
        };
        // A lost attempt may have attached it: then its attachment is the answer.
        let attached = || async {
            let found = self.describe_one(eni).await?.and_then(|d| d.attachment);
            Ok(found
                .filter(|a| a.instance_id == instance_id && a.device_index == device_index)
                .map(|a| {
                    tracing::info!(%eni, attachment = %a.attachment_id, "attach had succeeded despite the error");
                    Some(a.attachment_id)
                }))
        };
        self.settling(API, [eni], || {
            mutate(
                &self.limiter,
                &self.holdings,
                API,
                send,
                Verify::Describe(attached),
            )
        })
        .await?
        .ok_or_else(|| malformed(API, "no attachment id in the reply"))
    }

    async fn set_delete_on_termination(&self, eni: &EniId, attachment_id: &str) -> CloudResult<()> {
        const API: &str = "ModifyNetworkInterfaceAttribute";
        let changes = NetworkInterfaceAttachmentChanges::builder()
            .attachment_id(attachment_id)
            .delete_on_termination(true)
            .build();
        let send = || async {
            self.client
                .modify_network_interface_attribute()
                .network_interface_id(eni.as_str())
                .attachment(changes.clone())
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        self.settling(API, [eni], || {
            mutate(&self.limiter, &self.holdings, API, send, Verify::nothing())
        })
        .await
    }

    async fn set_security_groups(&self, eni: &EniId, groups: &[String]) -> CloudResult<()> {
        const API: &str = "ModifyNetworkInterfaceAttribute";
        let send = || async {
            self.client
                .modify_network_interface_attribute()
                .network_interface_id(eni.as_str())
                .set_groups(Some(groups.to_vec()))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        // Idempotent: a retry after an ambiguous failure sets the same groups again.
        self.settling(API, [eni], || {
            mutate(&self.limiter, &self.holdings, API, send, Verify::nothing())
        })
        .await
    }

    async fn detach_eni(&self, attachment_id: &str, force: bool) -> CloudResult<()> {
        const API: &str = "DetachNetworkInterface";
        let send = || async {
            self.client
                .detach_network_interface()
                .attachment_id(attachment_id)
                .force(force)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        mutate(&self.limiter, &self.holdings, API, send, Verify::nothing()).await
    }

    async fn delete_eni(&self, eni: &EniId) -> CloudResult<()> {
        const API: &str = "DeleteNetworkInterface";
        let send = || async {
            self.client
                .delete_network_interface()
                .network_interface_id(eni.as_str())
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        // A not-found after a lost attempt is that attempt's success, unless EC2 may not show the
        // ENI yet (just created): then the retries of `settling` go on until EC2 shows it or the
        // window ends.
        self.settling(API, [eni], || {
            let verify = if self.created.settling([eni]) {
                Verify::nothing()
            } else {
                Verify::not_found_after(())
            };
            mutate(&self.limiter, &self.holdings, API, send, verify)
        })
        .await?;
        self.holdings.forget(eni);
        self.created.forget(eni);
        Ok(())
    }

    async fn assign_ips(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        const API: &str = "AssignPrivateIpAddresses";
        if count == 0 {
            return Ok(Vec::new());
        }
        let found = |new: &[Ipv4Addr]| {
            tracing::info!(%eni, ips = ?new, "assign had succeeded despite the error; not assigning again");
        };
        let send = || self.send_assign_count(eni, count);
        self.settling(API, [eni], || {
            self.assign_counted(API, eni, count, send, found)
        })
        .await
    }

    async fn assign_specific_ips(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> CloudResult<Vec<Ipv4Addr>> {
        const API: &str = "AssignPrivateIpAddresses";
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<String> = ips.iter().map(Ipv4Addr::to_string).collect();
        let send = || async {
            self.client
                .assign_private_ip_addresses()
                .network_interface_id(eni.as_str())
                .set_private_ip_addresses(Some(wanted.clone()))
                .send()
                .await
                .map(|_| ips.to_vec())
                .map_err(|e| classify(API, e))
        };
        self.settling(API, [eni], || self.assign_named(API, eni, ips, send))
            .await
    }

    async fn unassign_ips(&self, eni: &EniId, ips: &[Ipv4Addr]) -> CloudResult<()> {
        self.unassign_private(eni, ips, UnassignPrivate::set_private_ip_addresses)
            .await
    }

    async fn assign_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Net>> {
        const API: &str = "AssignPrivateIpAddresses";
        if count == 0 {
            return Ok(Vec::new());
        }
        let found = |new: &[Ipv4Net]| {
            tracing::info!(%eni, prefixes = ?new, "prefix assign had succeeded despite the error; not assigning again");
        };
        let send = || async {
            let out = self
                .client
                .assign_private_ip_addresses()
                .network_interface_id(eni.as_str())
                .ipv4_prefix_count(to_i32(count))
                .send()
                .await
                .map_err(|e| classify(API, e))?;
            out.assigned_ipv4_prefixes()
                .iter()
                .filter_map(|p| p.ipv4_prefix())
                .map(|p| parse_prefix(API, p))
                .collect::<CloudResult<Vec<Ipv4Net>>>()
        };
        self.settling(API, [eni], || {
            self.assign_counted(API, eni, count, send, found)
        })
        .await
    }

    async fn unassign_prefixes(&self, eni: &EniId, prefixes: &[Ipv4Net]) -> CloudResult<()> {
        self.unassign_private(eni, prefixes, UnassignPrivate::set_ipv4_prefixes)
            .await
    }

    async fn assign_ipv6_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv6Net>> {
        self.settling("AssignIpv6Addresses", [eni], || {
            self.assign_ipv6_prefix_count(eni, count)
        })
        .await
    }

    async fn assign_specific_ipv6_prefixes(
        &self,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<Vec<Ipv6Net>> {
        self.settling("AssignIpv6Addresses", [eni], || {
            self.assign_ipv6_prefix_list(eni, prefixes)
        })
        .await
    }

    async fn unassign_ipv6_prefixes(&self, eni: &EniId, prefixes: &[Ipv6Net]) -> CloudResult<()> {
        self.settling("UnassignIpv6Addresses", [eni], || {
            self.unassign_ipv6_prefix_list(eni, prefixes)
        })
        .await
    }

    async fn create_tags(
        &self,
        resource_id: &str,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        const API: &str = "CreateTags";
        let sdk = sdk_tags(tags);
        let send = || async {
            self.client
                .create_tags()
                .resources(resource_id)
                .set_tags(Some(sdk.clone()))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        mutate(&self.limiter, &self.holdings, API, send, Verify::nothing()).await
    }

    fn throttled_within(&self, api: &str, window: Duration) -> bool {
        self.limiter.throttled_within(api, window)
    }

    async fn throttle_pause(&self, api: &'static str) {
        self.limiter.gate(api).pass().await;
    }

    fn changed_before_start(&self, at: tokio::time::Instant) {
        self.holdings.changed_before_start(at);
    }
}
