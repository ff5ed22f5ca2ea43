//! [`Ec2Cloud`]: the [`Cloud`] trait on `aws-sdk-ec2`.
//!
//! Every call goes limiter → retry → SDK: each attempt takes a token from the bucket of its class
//! (mutating or describe, see [`super::limiter`]), is counted and timed in [`CallStats`], and a
//! throttled or transient failure is retried with jittered backoff. The SDK's own retries are
//! disabled so that no attempt bypasses the buckets.
//!
//! SDK errors are classified once, in [`classify`], by the EC2 error code
//! (`ProvideErrorMetadata::code()`) and the raw HTTP status.
//!
//! Calls that EC2 cannot make idempotent themselves are made safe after ambiguous failures
//! (timeouts and 5xx, where the request may have taken effect): AssignPrivateIpAddresses compares
//! the ENI's IPs with those it had before the first attempt, unassign/attach/delete check the
//! ENI's state before retrying. CreateNetworkInterface is idempotent through its ClientToken.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, InstanceType, NetworkInterface, NetworkInterfaceAttachmentChanges,
    NetworkInterfaceStatus, ResourceType, Tag, TagSpecification,
};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use ipnet::Ipv4Net;

use super::calls::CallStats;
use super::limiter::{CallClass, Limiter, LimiterConfig, LimiterConfigError};
use super::{
    AttachmentStatus, Cloud, CloudError, CloudResult, CreateEni, Eni, EniAttachment, EniFilter,
    EniStatus, Instance, InstanceLimits, Subnet,
};
use crate::model::EniId;

/// Default page size of DescribeNetworkInterfaces (the API's maximum; EC2 accepts 5..=1000).
pub const DESCRIBE_PAGE_SIZE: u32 = 1000;

/// How to reach EC2.
#[derive(Clone, Debug)]
pub struct Ec2Config {
    /// AWS region; `None` uses the standard chain (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// Endpoint override (mockcloud, a VPC endpoint). Without it, aws-config's standard loading
    /// applies, including `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL`.
    pub endpoint_url: Option<String>,
    /// Static credentials (tests, `--simulate`); `None` uses the standard credentials chain
    /// (environment, web identity / IRSA, profile, container, IMDS instance profile).
    pub credentials: Option<Credentials>,
    /// Time limit of one attempt, connect included. Default 10 s (the AWS VPC CNI's HTTP timeout):
    /// a timed-out attempt is retried like a 5xx.
    pub call_timeout: Duration,
    /// Time limit to open a connection. Default 3 s.
    pub connect_timeout: Duration,
    /// Page size (MaxResults) of filtered DescribeNetworkInterfaces calls, 5..=1000. Default 1000.
    pub describe_page_size: u32,
    /// Rates and retry policy.
    pub limiter: LimiterConfig,
}

impl Default for Ec2Config {
    fn default() -> Self {
        Self {
            region: None,
            endpoint_url: None,
            credentials: None,
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            describe_page_size: DESCRIBE_PAGE_SIZE,
            limiter: LimiterConfig::default(),
        }
    }
}

/// Why an [`Ec2Cloud`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Ec2BuildError {
    /// The rate or retry settings are invalid.
    #[error("EC2 rate limiter: {0}")]
    Limiter(#[from] LimiterConfigError),
    /// Neither the config nor the standard chain names a region.
    #[error("no AWS region: set it in the config, AWS_REGION, or run on EC2")]
    NoRegion,
}

/// The [`Cloud`] on the real EC2 API (or anything speaking it, like mockcloud).
#[derive(Clone, Debug)]
pub struct Ec2Cloud {
    client: Client,
    limiter: Arc<Limiter>,
    page_size: i32,
}

impl Ec2Cloud {
    /// Load the SDK configuration (standard chain plus `config`'s overrides) and build the client.
    /// Calls are counted in `stats`.
    pub async fn new(config: &Ec2Config, stats: Arc<CallStats>) -> Result<Self, Ec2BuildError> {
        let limiter = Arc::new(Limiter::new(&config.limiter, stats)?);
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.connect_timeout)
                    .operation_attempt_timeout(config.call_timeout)
                    .operation_timeout(config.call_timeout)
                    .build(),
            );
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        if let Some(creds) = &config.credentials {
            loader = loader.credentials_provider(creds.clone());
        }
        let sdk_config = loader.load().await;
        if sdk_config.region().is_none() {
            return Err(Ec2BuildError::NoRegion);
        }
        Ok(Self {
            client: Client::new(&sdk_config),
            limiter,
            page_size: to_i32(config.describe_page_size.clamp(5, 1000)),
        })
    }

    /// The counters of this client's calls.
    pub fn stats(&self) -> &Arc<CallStats> {
        self.limiter.stats()
    }

    /// The limiter every call passes.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
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

    /// Every private IP (primary and secondary) of an ENI, as EC2 sees it now.
    async fn eni_ips(&self, api: &'static str, eni: &EniId) -> CloudResult<BTreeSet<Ipv4Addr>> {
        let found = self
            .describe_one(eni)
            .await?
            .ok_or_else(|| CloudError::NotFound {
                api: api.to_owned(),
                code: "InvalidNetworkInterfaceID.NotFound".into(),
                message: format!("{eni} does not exist"),
            })?;
        Ok(std::iter::once(found.primary_ip)
            .chain(found.secondary_ips)
            .collect())
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
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Transient failures may have taken effect on EC2's side (the request was possibly sent).
fn is_ambiguous(err: &CloudError) -> bool {
    matches!(err, CloudError::Transient { .. })
}

fn malformed(api: &str, what: impl std::fmt::Display) -> CloudError {
    CloudError::Rejected {
        api: api.to_owned(),
        code: "MalformedResponse".into(),
        message: what.to_string(),
    }
}

fn parse_ip(api: &str, s: &str) -> CloudResult<Ipv4Addr> {
    s.parse()
        .map_err(|_| malformed(api, format!("not an IPv4 address: {s:?}")))
}

/// Classify an SDK error into a [`CloudError`] by EC2 error code and HTTP status.
pub fn classify<E>(api: &str, err: SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let api_s = api.to_owned();
    match &err {
        SdkError::TimeoutError(_) => {
            return CloudError::Transient {
                api: api_s,
                message: "timed out".into(),
            };
        }
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                "timed out connecting"
            } else if d.is_io() {
                "I/O failure"
            } else {
                "dispatch failure"
            };
            return CloudError::Transient {
                api: api_s,
                message: format!("{kind}: {}", error_chain(&err)),
            };
        }
        SdkError::ResponseError(_) => {
            return CloudError::Transient {
                api: api_s,
                message: format!("unreadable response: {}", error_chain(&err)),
            };
        }
        SdkError::ConstructionFailure(_) => {
            return CloudError::Rejected {
                api: api_s,
                code: "ConstructionFailure".into(),
                message: error_chain(&err),
            };
        }
        _ => {}
    }
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().unwrap_or_default().to_owned();
    let message = err.message().unwrap_or_default().to_owned();
    classify_code(api, &code, &message, status)
}

/// The classification of a service error by its `code`, `message` and HTTP `status`.
pub fn classify_code(api: &str, code: &str, message: &str, status: Option<u16>) -> CloudError {
    let api = api.to_owned();
    let message = message.to_owned();
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => CloudError::Throttled {
            api,
            code: code.to_owned(),
        },
        "InsufficientFreeAddressesInSubnet" => CloudError::SubnetFull { api, message },
        "PrivateIpAddressLimitExceeded" => CloudError::IpLimitExceeded { api, message },
        "AttachmentLimitExceeded" => CloudError::AttachmentLimitExceeded { api, message },
        "UnauthorizedOperation" => CloudError::Unauthorized { api, message },
        c if c.ends_with(".NotFound") => CloudError::NotFound {
            api,
            code: code.to_owned(),
            message,
        },
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            CloudError::Transient {
                api,
                message: format!("{code}: {message}"),
            }
        }
        _ => match status {
            Some(s) if s >= 500 => CloudError::Transient {
                api,
                message: format!("HTTP {s} {code}: {message}"),
            },
            Some(429) => CloudError::Throttled {
                api,
                code: if code.is_empty() {
                    "HTTP 429".into()
                } else {
                    code.to_owned()
                },
            },
            Some(s) if (400..500).contains(&s) => CloudError::Rejected {
                api,
                code: if code.is_empty() {
                    format!("HTTP {s}")
                } else {
                    code.to_owned()
                },
                message,
            },
            other => CloudError::Transient {
                api,
                message: format!("unexpected reply (status {other:?}) {code}: {message}"),
            },
        },
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        s.push_str(": ");
        s.push_str(&e.to_string());
        cur = e.source();
    }
    s
}

fn status_from_sdk(s: Option<&NetworkInterfaceStatus>) -> EniStatus {
    match s {
        Some(NetworkInterfaceStatus::Available) => EniStatus::Available,
        Some(NetworkInterfaceStatus::Attaching) => EniStatus::Attaching,
        Some(NetworkInterfaceStatus::InUse) => EniStatus::InUse,
        Some(NetworkInterfaceStatus::Detaching) => EniStatus::Detaching,
        Some(other) => EniStatus::Other(other.as_str().to_owned()),
        None => EniStatus::Other(String::new()),
    }
}

fn status_to_filter(s: &EniStatus) -> &str {
    match s {
        EniStatus::Available => "available",
        EniStatus::Attaching => "attaching",
        EniStatus::InUse => "in-use",
        EniStatus::Detaching => "detaching",
        EniStatus::Other(s) => s,
    }
}

fn attachment_status_from_sdk(
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
fn eni_from_sdk(api: &str, ni: &NetworkInterface) -> CloudResult<Eni> {
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
        security_groups: ni
            .groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect(),
        attachment,
        tags: ni
            .tag_set()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_owned(),
                    t.value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    })
}

fn filters(f: &EniFilter) -> Vec<Filter> {
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

fn sdk_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

#[async_trait]
impl Cloud for Ec2Cloud {
    async fn describe_instance(&self, instance_id: &str) -> CloudResult<Instance> {
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
        // the ENIs come from DescribeNetworkInterfaces.
        let mut enis = self
            .describe_enis(&EniFilter {
                attached_to: Some(instance_id.to_owned()),
                ..Default::default()
            })
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

    async fn instance_limits(&self, instance_type: &str) -> CloudResult<InstanceLimits> {
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
        let net = info
            .network_info()
            .ok_or_else(|| malformed(API, format!("{instance_type}: no network info")))?;
        let max_enis = net
            .maximum_network_interfaces()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                malformed(API, format!("{instance_type}: no MaximumNetworkInterfaces"))
            })?;
        let ipv4_per_eni = net
            .ipv4_addresses_per_interface()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                malformed(
                    API,
                    format!("{instance_type}: no Ipv4AddressesPerInterface"),
                )
            })?;
        Ok(InstanceLimits {
            max_enis,
            ipv4_per_eni,
        })
    }

    async fn describe_subnet(&self, subnet_id: &str) -> CloudResult<Subnet> {
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
        let cidr_s = s.cidr_block().unwrap_or_default();
        let cidr: Ipv4Net = cidr_s
            .parse()
            .map_err(|_| malformed(API, format!("{subnet_id}: bad CIDR {cidr_s:?}")))?;
        Ok(Subnet {
            id: subnet_id.to_owned(),
            vpc_id: s.vpc_id().unwrap_or_default().to_owned(),
            cidr,
            availability_zone: s.availability_zone().unwrap_or_default().to_owned(),
            available_ips: s
                .available_ip_address_count()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
        })
    }

    async fn describe_enis(&self, filter: &EniFilter) -> CloudResult<Vec<Eni>> {
        const API: &str = "DescribeNetworkInterfaces";
        let sdk_filters = filters(filter);
        let ids: Vec<String> = filter.ids.iter().map(|i| i.as_str().to_owned()).collect();
        let mut enis = Vec::new();
        let mut token: Option<String> = None;
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
        Ok(enis)
    }

    async fn create_eni(&self, req: &CreateEni) -> CloudResult<Eni> {
        const API: &str = "CreateNetworkInterface";
        let tag_spec = TagSpecification::builder()
            .resource_type(ResourceType::NetworkInterface)
            .set_tags(Some(sdk_tags(&req.tags)))
            .build();
        // The same ClientToken on every attempt: EC2 returns the ENI of a lost attempt instead of
        // creating a second one.
        let out = self
            .limiter
            .call(API, CallClass::Mutating, || {
                let mut b = self
                    .client
                    .create_network_interface()
                    .subnet_id(&req.subnet_id)
                    .set_groups(Some(req.security_groups.clone()))
                    .description(&req.description)
                    .tag_specifications(tag_spec.clone())
                    .client_token(&req.client_token);
                if req.secondary_ip_count > 0 {
                    b = b.secondary_private_ip_address_count(to_i32(req.secondary_ip_count));
                }
                async move { b.send().await.map_err(|e| classify(API, e)) }
            })
            .await?;
        let ni = out
            .network_interface()
            .ok_or_else(|| malformed(API, "no network interface in the reply"))?;
        let mut eni = eni_from_sdk(API, ni)?;
        if eni.tags.is_empty() {
            // Some endpoints do not echo TagSpecifications; the tags were part of the request.
            eni.tags = req.tags.clone();
        }
        Ok(eni)
    }

    async fn attach_eni(
        &self,
        eni: &EniId,
        instance_id: &str,
        device_index: u32,
    ) -> CloudResult<String> {
        const API: &str = "AttachNetworkInterface";
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            let attempt = self
                .limiter
                .attempt(API, CallClass::Mutating, async {
                    self.client
                        .attach_network_interface()
                        .network_interface_id(eni.as_str())
                        .instance_id(instance_id)
                        .device_index(to_i32(device_index))
                        .send()
                        .await
                        .map_err(|e| classify(API, e))
                })
                .await;
            match attempt {
                Ok(out) => {
                    return out
                        .attachment_id()
                        .map(str::to_owned)
                        .ok_or_else(|| malformed(API, "no attachment id in the reply"));
                }
                Err(e) => {
                    ambiguous |= is_ambiguous(&e);
                    let final_err = retry.after_failure(e).await.err();
                    if ambiguous {
                        // A lost attempt may have attached it: then its attachment is the answer.
                        if let Some(a) = self.describe_one(eni).await?.and_then(|d| d.attachment)
                            && a.instance_id == instance_id
                            && a.device_index == device_index
                        {
                            tracing::info!(%eni, attachment = %a.attachment_id, "attach had succeeded despite the error");
                            return Ok(a.attachment_id);
                        }
                    }
                    if let Some(e) = final_err {
                        return Err(e);
                    }
                }
            }
        }
    }

    async fn set_delete_on_termination(&self, eni: &EniId, attachment_id: &str) -> CloudResult<()> {
        const API: &str = "ModifyNetworkInterfaceAttribute";
        let changes = NetworkInterfaceAttachmentChanges::builder()
            .attachment_id(attachment_id)
            .delete_on_termination(true)
            .build();
        self.limiter
            .call(API, CallClass::Mutating, || async {
                self.client
                    .modify_network_interface_attribute()
                    .network_interface_id(eni.as_str())
                    .attachment(changes.clone())
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await
            .map(|_| ())
    }

    async fn detach_eni(&self, attachment_id: &str, force: bool) -> CloudResult<()> {
        const API: &str = "DetachNetworkInterface";
        self.limiter
            .call(API, CallClass::Mutating, || async {
                self.client
                    .detach_network_interface()
                    .attachment_id(attachment_id)
                    .force(force)
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await
            .map(|_| ())
    }

    async fn delete_eni(&self, eni: &EniId) -> CloudResult<()> {
        const API: &str = "DeleteNetworkInterface";
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            let attempt = self
                .limiter
                .attempt(API, CallClass::Mutating, async {
                    self.client
                        .delete_network_interface()
                        .network_interface_id(eni.as_str())
                        .send()
                        .await
                        .map_err(|e| classify(API, e))
                })
                .await;
            match attempt {
                Ok(_) => return Ok(()),
                // Our own lost attempt deleted it.
                Err(e) if ambiguous && e.is_not_found() => return Ok(()),
                Err(e) => {
                    ambiguous |= is_ambiguous(&e);
                    retry.after_failure(e).await?;
                }
            }
        }
    }

    async fn assign_ips(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        const API: &str = "AssignPrivateIpAddresses";
        if count == 0 {
            return Ok(Vec::new());
        }
        // What the ENI had before the first attempt: after an ambiguous failure, whatever appeared
        // since is what the lost attempt assigned. Callers serialise calls per ENI (the ENI actor
        // owns all of them), so nothing else adds IPs to this ENI meanwhile.
        let before = self.eni_ips(API, eni).await?;
        let appeared = |now: &BTreeSet<Ipv4Addr>| -> Vec<Ipv4Addr> {
            now.difference(&before).copied().collect()
        };
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            match self
                .limiter
                .attempt(API, CallClass::Mutating, self.send_assign_count(eni, count))
                .await
            {
                Ok(ips) if !ips.is_empty() => return Ok(ips),
                Ok(_) => {
                    // The reply did not list the IPs (older API shape): EC2's view tells.
                    let now = self.eni_ips(API, eni).await?;
                    return Ok(appeared(&now));
                }
                Err(e) => {
                    ambiguous |= is_ambiguous(&e);
                    let final_err = retry.after_failure(e).await.err();
                    if ambiguous {
                        let new = appeared(&self.eni_ips(API, eni).await?);
                        if !new.is_empty() {
                            tracing::info!(%eni, ips = ?new, "assign had succeeded despite the error; not assigning again");
                            return Ok(new);
                        }
                    }
                    if let Some(e) = final_err {
                        return Err(e);
                    }
                }
            }
        }
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
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            let attempt = self
                .limiter
                .attempt(API, CallClass::Mutating, async {
                    self.client
                        .assign_private_ip_addresses()
                        .network_interface_id(eni.as_str())
                        .set_private_ip_addresses(Some(wanted.clone()))
                        .send()
                        .await
                        .map_err(|e| classify(API, e))
                })
                .await;
            match attempt {
                Ok(_) => return Ok(ips.to_vec()),
                Err(e) => {
                    ambiguous |= is_ambiguous(&e);
                    let final_err = retry.after_failure(e).await.err();
                    if ambiguous {
                        let now = self.eni_ips(API, eni).await?;
                        if ips.iter().all(|ip| now.contains(ip)) {
                            return Ok(ips.to_vec());
                        }
                    }
                    if let Some(e) = final_err {
                        return Err(e);
                    }
                }
            }
        }
    }

    async fn unassign_ips(&self, eni: &EniId, ips: &[Ipv4Addr]) -> CloudResult<()> {
        const API: &str = "UnassignPrivateIpAddresses";
        if ips.is_empty() {
            return Ok(());
        }
        let gone: Vec<String> = ips.iter().map(Ipv4Addr::to_string).collect();
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            let attempt = self
                .limiter
                .attempt(API, CallClass::Mutating, async {
                    self.client
                        .unassign_private_ip_addresses()
                        .network_interface_id(eni.as_str())
                        .set_private_ip_addresses(Some(gone.clone()))
                        .send()
                        .await
                        .map_err(|e| classify(API, e))
                })
                .await;
            match attempt {
                Ok(_) => return Ok(()),
                Err(e) => {
                    ambiguous |= is_ambiguous(&e);
                    let final_err = retry.after_failure(e).await.err();
                    if ambiguous {
                        let now = self.eni_ips(API, eni).await?;
                        if ips.iter().all(|ip| !now.contains(ip)) {
                            return Ok(());
                        }
                    }
                    if let Some(e) = final_err {
                        return Err(e);
                    }
                }
            }
        }
    }

    async fn create_tags(
        &self,
        resource_id: &str,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        const API: &str = "CreateTags";
        let sdk = sdk_tags(tags);
        self.limiter
            .call(API, CallClass::Mutating, || async {
                self.client
                    .create_tags()
                    .resources(resource_id)
                    .set_tags(Some(sdk.clone()))
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        let c = |code, status| classify_code("Op", code, "msg", status);
        assert!(matches!(
            c("RequestLimitExceeded", Some(503)),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            c("Throttling", Some(400)),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            c("InsufficientFreeAddressesInSubnet", Some(400)),
            CloudError::SubnetFull { .. }
        ));
        assert!(matches!(
            c("PrivateIpAddressLimitExceeded", Some(400)),
            CloudError::IpLimitExceeded { .. }
        ));
        assert!(matches!(
            c("AttachmentLimitExceeded", Some(400)),
            CloudError::AttachmentLimitExceeded { .. }
        ));
        assert!(matches!(
            c("InvalidNetworkInterfaceID.NotFound", Some(400)),
            CloudError::NotFound { .. }
        ));
        assert!(matches!(
            c("InvalidAttachmentID.NotFound", Some(400)),
            CloudError::NotFound { .. }
        ));
        assert!(matches!(
            c("InternalError", Some(500)),
            CloudError::Transient { .. }
        ));
        assert!(matches!(
            c("Whatever", Some(502)),
            CloudError::Transient { .. }
        ));
        assert!(matches!(
            c("InvalidParameterValue", Some(400)),
            CloudError::Rejected { .. }
        ));
        assert!(matches!(c("", None), CloudError::Transient { .. }));
        let unauthorized = c("UnauthorizedOperation", Some(403));
        assert!(matches!(unauthorized, CloudError::Unauthorized { .. }));
        assert!(
            unauthorized.to_string().contains("ec2:Op"),
            "{unauthorized}"
        );
    }

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
