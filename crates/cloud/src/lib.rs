//! `eniipam-cloud`, the cloud seam: everything eniipamd asks of EC2 and of the instance metadata
//! service, in domain types. It depends on the model (`eniipam-api`) and `eniipam-limits` only; the
//! daemon reads it as `crate::cloud` (`src/lib.rs` re-exports it).
//!
//! - [`Cloud`]: the EC2 calls the pool needs, in domain types. Real implementation on `aws-sdk-ec2` in
//!   [`ec2`], where every mutating call goes through one helper (`ec2/mutate.rs`) that verifies, after
//!   an ambiguous failure, whether the lost attempt took effect; every call passes the rate limiter
//!   and the retry policy in [`limiter`] (buckets; [`backoff`]) and the throttle gate
//!   (`throttle.rs`), and is counted in [`calls`].
//! - [`Metadata`]: IMDSv2, real implementation on the `aws-config` IMDS client in [`imds`].
//! - [`Purpose`]: what a call is for (pod, refill, give-back, reconcile, startup), a task-local set
//!   with [`with_purpose`] where the work starts; counted per call, and refills yield to pods under
//!   throttling ([`purpose`]).
//! - [`lifecycle`]: an ENI's create, attach and release; [`leak`]: the leaked-ENI collector.
//! - [`node_fit`]: whether a subnet and security groups an object names can serve this node's new
//!   ENIs (custom networking's ENIConfig and network profiles both ask).
//!
//! Errors are classified once, here, into [`CloudError`]: callers decide on kinds (throttled, capacity,
//! not found), never on strings.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use eniipam_api::model::EniId;

pub mod backoff;
pub mod calls;
pub mod deadline;
pub mod ec2;
mod filters;
pub mod imds;
mod instance_limits;
pub mod leak;
pub mod lifecycle;
pub mod limiter;
pub mod node_fit;
pub mod purpose;
pub mod reservation;
mod throttle;

pub use deadline::{current_deadline, with_deadline, without_throttle_retries};
pub use filters::{EniFilter, SubnetFilter};
pub use instance_limits::InstanceLimits;
pub use purpose::{Purpose, current_purpose, with_purpose};
pub use reservation::{PrefixReservation, ReserveError, ReserveResult};

/// Tag keys eniipam writes on the ENIs it creates.
pub mod tags {
    /// Owner tag: every ENI eniipam creates carries `eniipam.io/owner=eniipam`.
    pub const OWNER: &str = "eniipam.io/owner";
    pub const OWNER_VALUE: &str = "eniipam";
    /// The cluster the node belongs to.
    pub const CLUSTER: &str = "eniipam.io/cluster";
    /// The instance the ENI was created for.
    pub const INSTANCE_ID: &str = "eniipam.io/instance-id";
    /// RFC 3339 creation time, used by the leaked-ENI collector's grace period.
    pub const CREATED_AT: &str = "eniipam.io/created-at";
    /// Opt-out: an ENI carrying `eniipam.io/no-manage=true` is never touched.
    pub const NO_MANAGE: &str = "eniipam.io/no-manage";
    /// The AWS VPC CNI's opt-out tag. Every ENI eniipam creates carries it set to `true`, so an
    /// aws-node still running on the node (during a migration, or a rollback) never takes it over.
    /// It does not stop eniipam: ownership is [`OWNER`].
    pub const AWS_VPC_CNI_NO_MANAGE: &str = "node.k8s.amazonaws.com/no_manage";
}

/// Lifecycle state of an ENI as EC2 reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EniStatus {
    Available,
    Attaching,
    InUse,
    Detaching,
    Other(String),
}

/// State of an ENI's attachment to an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttachmentStatus {
    Attaching,
    Attached,
    Detaching,
    Detached,
    Other(String),
}

/// An ENI's attachment to an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniAttachment {
    pub attachment_id: String,
    pub instance_id: String,
    pub device_index: u32,
    pub status: AttachmentStatus,
    pub delete_on_termination: bool,
}

/// An ENI as EC2 describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eni {
    pub id: EniId,
    pub mac: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub description: String,
    pub status: EniStatus,
    /// The ENI's primary private IP.
    pub primary_ip: Ipv4Addr,
    /// Secondary private IPs (not including the primary).
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Delegated `/28` prefixes (each counts as one address against the per-ENI limit).
    pub ipv4_prefixes: Vec<Ipv4Net>,
    pub security_groups: Vec<String>,
    pub attachment: Option<EniAttachment>,
    pub tags: BTreeMap<String, String>,
    /// IPv6 addresses assigned to the ENI (AssignIpv6Addresses without prefixes).
    #[serde(default)]
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated IPv6 `/80` prefixes (each counts as one address against the per-ENI limit, as a
    /// `/28` does).
    #[serde(default)]
    pub ipv6_prefixes: Vec<Ipv6Net>,
}

impl Eni {
    /// The addresses this ENI can give pods: its secondary IPs, and every address of its prefixes.
    pub fn pod_addresses(&self) -> Vec<Ipv4Addr> {
        self.secondary_ips
            .iter()
            .copied()
            .chain(
                self.ipv4_prefixes
                    .iter()
                    .copied()
                    .flat_map(prefix_addresses),
            )
            .collect()
    }

    /// Whether eniipam created this ENI (owner tag) and may manage it (no opt-out tag).
    pub fn is_managed_by_us(&self) -> bool {
        self.tags.get(tags::OWNER).map(String::as_str) == Some(tags::OWNER_VALUE)
            && self.tags.get(tags::NO_MANAGE).map(String::as_str) != Some("true")
    }
}

/// A subnet as EC2 describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subnet {
    pub id: String,
    pub vpc_id: String,
    pub cidr: Ipv4Net,
    pub availability_zone: String,
    pub available_ips: u32,
    pub tags: BTreeMap<String, String>,
    /// The subnet's associated IPv6 blocks (DescribeSubnets' `ipv6CidrBlockAssociationSet`, the
    /// `associated` ones only: a block being disassociated gives no more addresses); empty for an
    /// IPv4-only subnet.
    #[serde(default)]
    pub ipv6_cidrs: Vec<Ipv6Net>,
}

/// A security group as DescribeSecurityGroups shows it: the parts eniipam checks before it
/// creates ENIs with the group (that it exists, in the node's VPC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityGroup {
    pub id: String,
    pub vpc_id: String,
    /// `GroupName` (unique per VPC).
    pub name: String,
}

impl Subnet {
    /// The VPC router's address in this subnet ([`vpc_router`]).
    pub fn gateway(&self) -> Ipv4Addr {
        vpc_router(self.cidr)
    }
}

/// Every address of a prefix, network and broadcast included (a delegated `/28` routes all 16 to its
/// ENI).
pub fn prefix_addresses(prefix: Ipv4Net) -> impl Iterator<Item = Ipv4Addr> {
    let start = u32::from(prefix.network());
    let end = u32::from(prefix.broadcast());
    (start..=end).map(Ipv4Addr::from)
}

/// The VPC router of a subnet: its network address plus one, the gateway for routes out of an ENI.
pub fn vpc_router(cidr: Ipv4Net) -> Ipv4Addr {
    eniipam_api::model::vpc_router(cidr.network())
}

/// EC2's error code when an address asked for by name is taken (`AssignPrivateIpAddresses` or
/// `CreateNetworkInterface` with `PrivateIpAddresses`).
pub const ADDRESS_IN_USE: &str = "InvalidIPAddress.InUse";

/// How long after a change EC2's describes are taken to show it. EC2's API is eventually
/// consistent: AWS's guidance (*Eventual consistency in the Amazon EC2 API*) is to wait from a
/// couple of seconds up to a few minutes after a change before trusting a describe. The client's
/// holdings learn from a describe only when this long has passed since its last change; the state
/// file journals each change of the pool's for this long, so a restart within it reads the change
/// from the file, not from a describe that may not show it yet.
pub const DESCRIBE_SETTLES: std::time::Duration = std::time::Duration::from_secs(60);

/// An instance as EC2 describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub vpc_id: String,
    pub subnet_id: String,
    /// ENIs attached to the instance, with their device indexes.
    pub enis: Vec<Eni>,
}

/// A request to create an ENI with its secondary IPs and tags in one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateEni {
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub description: String,
    pub secondary_ip_count: u32,
    /// `/28` prefixes delegated in the create call (never together with `secondary_ip_count`).
    pub prefix_count: u32,
    /// Specific secondary IPs (never together with the counts).
    pub private_ips: Vec<Ipv4Addr>,
    pub tags: BTreeMap<String, String>,
    /// Idempotency token: a retried create with the same token returns the same ENI.
    pub client_token: String,
    /// A count of secondary IPs the caller may raise while the create waits out EC2's throttling:
    /// each attempt asks for the larger of it and `secondary_ip_count`, as long as EC2 has acted
    /// on no attempt before (each was throttled, so the token is unused); from the first attempt
    /// EC2 may have acted on, the count is frozen, as the token requires. The pool raises it for
    /// the pods that came while the create waited (`None`: `secondary_ip_count` only).
    pub live_ip_count: Option<LiveCount>,
}

/// A count shared between its owner, who may change it, and a call that reads it at each attempt
/// (see [`CreateEni::live_ip_count`]). Equal only to itself (a clone).
#[derive(Clone, Debug, Default)]
pub struct LiveCount(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl LiveCount {
    pub fn new(n: u32) -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicU32::new(n)))
    }

    pub fn set(&self, n: u32) {
        self.0.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl PartialEq for LiveCount {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LiveCount {}

/// The instance's own view of itself from IMDSv2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceIdentity {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    /// MAC of the primary interface (eth0).
    pub mac: String,
}

/// One interface as IMDS lists it under `network/interfaces/macs/<mac>/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataEni {
    pub mac: String,
    pub eni_id: EniId,
    pub device_number: u32,
    pub subnet_id: String,
    pub vpc_id: String,
    pub subnet_cidr: Ipv4Net,
    pub vpc_cidrs: Vec<Ipv4Net>,
    pub security_groups: Vec<String>,
    /// `local-ipv4s`: the primary IP first, then the secondaries.
    pub ips: Vec<Ipv4Addr>,
    /// `ipv4-prefix`: delegated `/28` prefixes.
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// `ipv6s`: the interface's IPv6 addresses (none: IMDS answers 404, as for an IPv4-only ENI).
    #[serde(default)]
    pub ipv6s: Vec<Ipv6Addr>,
    /// `ipv6-prefix`: delegated IPv6 `/80` prefixes.
    #[serde(default)]
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// `subnet-ipv6-cidr-blocks`: the subnet's IPv6 blocks (none for an IPv4-only subnet).
    #[serde(default)]
    pub subnet_ipv6_cidrs: Vec<Ipv6Net>,
    /// `vpc-ipv6-cidr-blocks`: the VPC's IPv6 blocks (none for an IPv4-only VPC).
    #[serde(default)]
    pub vpc_ipv6_cidrs: Vec<Ipv6Net>,
}

/// What went wrong talking to the cloud, classified once.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CloudError {
    /// EC2 said `RequestLimitExceeded` / `Throttling`: retried with backoff by the limiter.
    #[error("{api}: throttled by EC2 ({code})")]
    Throttled { api: String, code: String },
    /// 5xx, timeout or a failure to reach the endpoint: retried with backoff.
    #[error("{api}: transient failure: {message}")]
    Transient { api: String, message: String },
    /// The subnet has no free addresses left (`InsufficientFreeAddressesInSubnet`).
    #[error("{api}: subnet has no free addresses: {message}")]
    SubnetFull { api: String, message: String },
    /// The ENI holds as many IPs as the instance type allows (`PrivateIpAddressLimitExceeded`).
    #[error("{api}: per-ENI IP limit reached: {message}")]
    IpLimitExceeded { api: String, message: String },
    /// The instance has as many ENIs as its type allows (`AttachmentLimitExceeded`).
    #[error("{api}: ENI attachment limit reached: {message}")]
    AttachmentLimitExceeded { api: String, message: String },
    /// The subnet has no free aligned `/28` left for a prefix (`InsufficientCidrBlocks`): it may
    /// still have single addresses.
    #[error("{api}: subnet has no free /28 block for a prefix: {message}")]
    NoFreePrefix { api: String, message: String },
    /// The ENI's subnet has no IPv6 CIDR block, so EC2 can give it no IPv6 address or prefix
    /// (`InvalidParameterValue` naming the missing block). Not capacity: no wait fixes it, an
    /// operator must associate a block with the subnet (or run the node in IPv4).
    #[error(
        "{api}: the subnet has no IPv6 CIDR block (associate one with the subnet, or use ip_family ipv4): {message}"
    )]
    NoIpv6Cidr { api: String, message: String },
    /// The resource does not exist (`*.NotFound`).
    #[error("{api}: not found ({code}): {message}")]
    NotFound {
        api: String,
        code: String,
        message: String,
    },
    /// The credentials lack a permission (`UnauthorizedOperation`). `permission` is the action EC2
    /// names as refused, which is not always `api`'s own: a CreateNetworkInterface that tags the new
    /// ENI also needs `ec2:CreateTags`.
    #[error("{api}: not authorized: the IAM role needs {permission}: {message}")]
    Unauthorized {
        api: String,
        permission: String,
        message: String,
    },
    /// We asked for something EC2 will not do (bad parameter, ENI in use, ...). Not retried.
    #[error("{api}: rejected ({code}): {message}")]
    Rejected {
        api: String,
        code: String,
        message: String,
    },
    /// Retries ran out (tries or total time) on throttled or transient failures.
    #[error("{api}: gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        api: String,
        attempts: u32,
        last: String,
        /// The last failure was EC2 throttling (not a transient fault).
        throttled: bool,
    },
    /// IMDS failed or returned something unparseable.
    #[error("instance metadata: {0}")]
    Metadata(String),
    /// We refused to act: the ENI is not ours or carries the opt-out tag.
    #[error("refusing to touch {eni}: {reason}")]
    NotOurs { eni: String, reason: String },
}

impl CloudError {
    /// Throttled or transient: worth retrying with backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Throttled { .. } | Self::Transient { .. })
    }

    /// EC2 was only slow: throttled or a transient failure, on this attempt or on the last of the
    /// attempts whose retries ran out. Trying again later can succeed; the caller keeps what it had.
    pub fn is_transient(&self) -> bool {
        self.is_retryable() || matches!(self, Self::RetriesExhausted { .. })
    }

    /// EC2 throttled the call: this attempt, or the last of the attempts whose retries ran out.
    pub fn is_throttle(&self) -> bool {
        matches!(
            self,
            Self::Throttled { .. }
                | Self::RetriesExhausted {
                    throttled: true,
                    ..
                }
        )
    }

    /// Capacity exhausted: the pool backs off the subnet/instance for minutes.
    pub fn is_capacity(&self) -> bool {
        matches!(
            self,
            Self::SubnetFull { .. }
                | Self::IpLimitExceeded { .. }
                | Self::AttachmentLimitExceeded { .. }
                | Self::NoFreePrefix { .. }
        )
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

pub type CloudResult<T> = Result<T, CloudError>;

/// The EC2 calls eniipam makes, in domain types.
///
/// Implementations rate-limit and retry internally; an error returned here is final for this call.
#[async_trait]
pub trait Cloud: Send + Sync + 'static {
    /// DescribeInstances for one instance, with its attached ENIs.
    async fn describe_instance(&self, instance_id: &str) -> CloudResult<Instance>;
    /// DescribeInstanceTypes: ENI and IPv4 limits of a type.
    async fn instance_limits(&self, instance_type: &str) -> CloudResult<InstanceLimits>;
    /// DescribeSubnets for one subnet.
    async fn describe_subnet(&self, subnet_id: &str) -> CloudResult<Subnet>;
    /// DescribeNetworkInterfaces with filters, all pages.
    async fn describe_enis(&self, filter: &EniFilter) -> CloudResult<Vec<Eni>>;
    /// The ENIs EC2's describe shows attached to `instance_id`, in `vpc_id`, asked by the ids the
    /// caller knows (`known`: IMDS's, the pool's, the state file's, DescribeInstances'): one call
    /// however many ENIs the region holds. EC2 narrows a describe before it pages only by ids and a
    /// few indexed filters (`vpc-id`, `subnet-id`, addresses); `attachment.instance-id` it applies
    /// to each page of 1,000 after, so a describe by it alone costs a call per 1,000 ENIs of the
    /// region. An ENI attached here that no id of `known` names is not in the answer: the caller
    /// names every source it has. When EC2 knows one of `known` no more (deleted: IMDS lingers),
    /// or `known` is empty, the answer comes from the paged describe by `vpc-id` and
    /// `attachment.instance-id`, every ENI attached here. The default is that paged describe.
    async fn describe_attached(
        &self,
        instance_id: &str,
        vpc_id: &str,
        known: &[EniId],
    ) -> CloudResult<Vec<Eni>> {
        let _ = known;
        self.describe_enis(&EniFilter::attached(instance_id, vpc_id))
            .await
    }
    /// CreateNetworkInterface with its secondary IPs and tags in the same call.
    async fn create_eni(&self, req: &CreateEni) -> CloudResult<Eni>;
    /// AttachNetworkInterface at `device_index`; returns the attachment id.
    async fn attach_eni(
        &self,
        eni: &EniId,
        instance_id: &str,
        device_index: u32,
    ) -> CloudResult<String>;
    /// ModifyNetworkInterfaceAttribute: DeleteOnTermination=true for the attachment.
    async fn set_delete_on_termination(&self, eni: &EniId, attachment_id: &str) -> CloudResult<()>;
    /// ModifyNetworkInterfaceAttribute: the ENI's security groups become exactly `groups` (1 to 5,
    /// in the ENI's VPC). A network profile whose groups changed brings its ENIs to the new set.
    async fn set_security_groups(&self, eni: &EniId, groups: &[String]) -> CloudResult<()>;
    /// DetachNetworkInterface.
    async fn detach_eni(&self, attachment_id: &str, force: bool) -> CloudResult<()>;
    /// DeleteNetworkInterface.
    async fn delete_eni(&self, eni: &EniId) -> CloudResult<()>;
    /// AssignPrivateIpAddresses with SecondaryPrivateIpAddressCount; returns only the new IPs.
    ///
    /// EC2 takes no ClientToken here: an implementation that retries after an ambiguous failure
    /// must find out which IPs the lost attempt assigned (from IMDS, or by describing the ENI), so
    /// a retry never leaves unknown IPs behind. The normal path is one call: EC2's reply names the
    /// new IPs.
    async fn assign_ips(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Addr>>;
    /// AssignPrivateIpAddresses with explicit PrivateIpAddresses (sticky IPs coming back).
    async fn assign_specific_ips(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> CloudResult<Vec<Ipv4Addr>>;
    /// UnassignPrivateIpAddresses.
    async fn unassign_ips(&self, eni: &EniId, ips: &[Ipv4Addr]) -> CloudResult<()>;
    /// AssignPrivateIpAddresses with Ipv4PrefixCount; returns only the new `/28` prefixes. Like
    /// [`Cloud::assign_ips`], a retry after an ambiguous failure first looks at what the lost attempt
    /// assigned.
    async fn assign_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv4Net>>;
    /// UnassignPrivateIpAddresses with Ipv4Prefix.N.
    async fn unassign_prefixes(&self, eni: &EniId, prefixes: &[Ipv4Net]) -> CloudResult<()>;
    /// AssignIpv6Addresses with Ipv6PrefixCount; returns only the new `/80` prefixes. Like
    /// [`Cloud::assign_prefixes`], a retry after an ambiguous failure first looks (describe) at what
    /// the lost attempt assigned, so a retry never leaves an unknown prefix behind.
    async fn assign_ipv6_prefixes(&self, eni: &EniId, count: u32) -> CloudResult<Vec<Ipv6Net>>;
    /// AssignIpv6Addresses with explicit Ipv6Prefix.N: the node's /80 taken back after it was
    /// unassigned out of band (while it is free in the subnet, its pods' addresses route again).
    /// Same action and bucket as [`Cloud::assign_ipv6_prefixes`]; a retry after an ambiguous failure
    /// first looks whether the lost attempt put them on the ENI. EC2 refuses a prefix another ENI
    /// holds (`InvalidIPAddress.InUse`) or one outside the subnet's /64 ([`CloudError::Rejected`]).
    async fn assign_specific_ipv6_prefixes(
        &self,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<Vec<Ipv6Net>>;
    /// UnassignIpv6Addresses with Ipv6Prefix.N.
    async fn unassign_ipv6_prefixes(&self, eni: &EniId, prefixes: &[Ipv6Net]) -> CloudResult<()>;
    /// DescribeSubnets with filters (tags included).
    async fn describe_subnets(&self, filter: &SubnetFilter) -> CloudResult<Vec<Subnet>>;
    /// DescribeSecurityGroups by `GroupId.N`: each group's VPC and name, so that the groups an
    /// ENIConfig names can be checked to exist in the node's VPC before ENIs are created with
    /// them. EC2 fails the whole call when one of them does not exist ([`CloudError::NotFound`],
    /// `InvalidGroup.NotFound`). No ids: no call and no groups (an unfiltered describe would list
    /// the account's groups from the smaller unfiltered bucket).
    async fn describe_security_groups(&self, ids: &[String]) -> CloudResult<Vec<SecurityGroup>>;
    /// GetSubnetCidrReservations: the subnet's `prefix`-type reservations (kept for prefixes: single
    /// addresses are never packed into them).
    async fn subnet_prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>>;
    /// CreateSubnetCidrReservation of type `prefix`, on its own bucket; EC2's refusals of the block
    /// (overlap, addresses in use) are typed ([`ReserveError`]). Made only, never deleted.
    async fn create_subnet_prefix_reservation(&self, req: &PrefixReservation) -> ReserveResult;
    /// CreateTags on one resource.
    async fn create_tags(
        &self,
        resource_id: &str,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()>;
    /// Whether EC2 throttled a call of `api` from this node within `window` (even one that a retry
    /// then got through): the account's bucket of that API is short, and the tokens a call for
    /// warm-ups alone would spend are ones other nodes' pods may be waiting on. A cloud that never
    /// throttles answers no.
    fn throttled_within(&self, _api: &str, _window: Duration) -> bool {
        false
    }
    /// Waits out the node's throttling pause of `api`, if EC2 throttled it lately (the limiter's
    /// throttle gate): a caller that gathers work into one call gathers what comes meanwhile too.
    /// A cloud that never throttles returns at once.
    async fn throttle_pause(&self, _api: &'static str) {}
    /// An earlier process changed this node's ENIs at `at` (the state file's journal says so): a
    /// describe sent within [`DESCRIBE_SETTLES`] of it may not show the change, so it teaches the
    /// client nothing it keeps, and what such describes taught already is forgotten. A cloud that
    /// keeps nothing from describes ignores it.
    fn changed_before_start(&self, _at: tokio::time::Instant) {}
}

/// What eniipamd reads from the instance metadata service (IMDSv2).
#[async_trait]
pub trait Metadata: Send + Sync + 'static {
    /// instance-id, instance-type, placement/availability-zone, mac.
    async fn identity(&self) -> CloudResult<InstanceIdentity>;
    /// Every interface under `network/interfaces/macs/`, ordered by device number.
    async fn interfaces(&self) -> CloudResult<Vec<MetadataEni>>;
    /// One interface by MAC; `None` when IMDS does not (yet) list it.
    async fn interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>>;
    /// The primary interface (device number 0), with the VPC's CIDR blocks of both families;
    /// `None` when IMDS does not list it.
    async fn primary_interface(&self) -> CloudResult<Option<MetadataEni>> {
        Ok(self
            .interfaces()
            .await?
            .into_iter()
            .find(|m| m.device_number == 0))
    }
}

/// Who this node is, as the pool and the ENI lifecycle need it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeContext {
    pub cluster_name: String,
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub vpc_id: String,
    /// The subnet new ENIs are created in (the primary ENI's, unless configured).
    pub subnet_id: String,
    /// Security groups for new ENIs (the primary ENI's, unless configured).
    pub security_groups: Vec<String>,
    pub limits: InstanceLimits,
    /// The subnets new ENIs may go to, discovered by tag in the node's availability zone or
    /// configured (`subnet_ids`); empty: `subnet_id` alone.
    #[serde(default)]
    pub pod_subnets: Vec<Subnet>,
}
