//! The simulated account: VPCs, subnets, instances and ENIs, and EC2's rules over them.
//!
//! Everything here is synchronous and deterministic (randomness comes from a seedable generator);
//! the HTTP front ([`crate::ec2`]) holds the lock and passes the current time, so attach/detach
//! progress and IMDS lag follow tokio's clock.
//!
//! This module owns the types and the [`World`] itself; the rules live in parts:
//! - [`addresses`]: each subnet's address book (who holds which address, /28 blocks, reservations)
//!   and EC2's random spread for automatic assignment;
//! - [`subnets`]: VPCs, subnets, their tags and filters, subnet CIDR reservations;
//! - [`instances`]: launch, terminate, the instance-type catalog, time passing (`settle`);
//! - [`enis`]: ENI lifecycle (create, attach on a network card, detach, delete, modify, describe);
//! - [`assign`]: secondary IPs and /28 prefixes on an ENI;
//! - [`security_groups`]: groups with their ingress/egress rules, DescribeSecurityGroups;
//! - [`ipv6`]: the VPC's /56 and the subnets' /64s, IPv6 addresses and /80 prefixes on an ENI;
//! - [`views`]: what Describe calls, IMDS and the control API show;
//! - [`settling`]: what describes do not show yet of an ENI just created or attached, and the calls
//!   on a new ENI refused as not found;
//! - [`vpc_cidrs`]: a VPC's secondary IPv4 blocks (AssociateVpcCidrBlock) and EC2's rules on them.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use crate::catalog::InstanceType;
use crate::error::{Ec2Error, Ec2Result};
use crate::new_eni_lag::NewEniLag;
use crate::splitmix::splitmix;

mod addresses;
mod assign;
mod eni_describe;
mod enis;
mod iam;
mod instances;
mod ipv6;
mod rng;
mod security_groups;
mod settling;
mod subnets;
#[cfg(test)]
mod tests;
mod views;
mod vpc_cidrs;

pub use addresses::{OccupyPattern, ReservationType, SubnetUsage};
pub use eni_describe::SERVER_SIDE_ENI_FILTERS;
pub use iam::IamFacts;
pub use instances::LaunchAddresses;
pub use ipv6::{IPV6_PREFIX_LEN, Ipv6Args, Ipv6Assigned};
pub use security_groups::{
    Direction, GROUPS_PER_INTERFACE, IpPermission, Peer, RULES_PER_DIRECTION, SecurityGroupView,
};
pub use subnets::ReservationView;
pub use views::{AttachmentView, EniView, ImdsEni, ImdsInstance, InstanceView, SubnetView};
pub use vpc_cidrs::{VPC_IPV4_CIDR_LIMIT, VpcCidrAssociation};

use addresses::Subnet;
use rng::Rng;

/// The allocation seed mockcloud starts with (reproducible runs unless told otherwise).
pub const DEFAULT_ALLOCATION_SEED: u64 = 0x6d6f_636b_636c_6f75;

/// How long state changes take to settle.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub attach_delay: Duration,
    pub detach_delay: Duration,
    pub imds_lag: Duration,
    /// EC2's describes show addresses and prefixes as they were this long ago (eventual
    /// consistency; [`crate::LatencyProfile::describe_lag`]).
    pub describe_lag: Duration,
    /// What describes do not show yet of an ENI just created or attached, and the first calls on a
    /// new ENI refused ([`NewEniLag`], `settling`).
    pub new_eni_lag: NewEniLag,
}

impl Timing {
    /// The timing of a latency profile.
    pub fn of(profile: &crate::LatencyProfile) -> Self {
        Self {
            attach_delay: profile.attach_delay,
            detach_delay: profile.detach_delay,
            imds_lag: profile.imds_lag,
            describe_lag: profile.describe_lag,
            new_eni_lag: profile.new_eni_lag,
        }
    }

    /// How long an unassigned address is remembered: until neither IMDS nor a describe shows it.
    fn linger(&self) -> Duration {
        self.imds_lag.max(self.describe_lag)
    }
}

#[derive(Debug)]
struct Vpc {
    /// The primary IPv4 block (the one the VPC was created with).
    cidr: Ipv4Net,
    /// Secondary IPv4 blocks with their association ids ([`vpc_cidrs`]).
    secondary_cidrs: Vec<(String, Ipv4Net)>,
    /// The Amazon-provided IPv6 /56 ([`ipv6::vpc_block`]).
    ipv6_cidr: ipnet::Ipv6Net,
    security_groups: std::collections::BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InstanceState {
    Running,
    Terminated,
}

#[derive(Debug)]
struct Instance {
    instance_type: InstanceType,
    subnet_id: String,
    vpc_id: String,
    az: String,
    security_groups: Vec<String>,
    state: InstanceState,
    primary_mac: String,
    primary_ip: Ipv4Addr,
    /// Its tags (IAM's `aws:ResourceTag/…` on the instance: Attach, Detach, and Modify with an
    /// attachment).
    tags: BTreeMap<String, String>,
    /// ENIs detached from this instance that IMDS still shows until the lag passes.
    gone: Vec<(ImdsEni, Instant)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttState {
    Attaching { until: Instant },
    Attached { since: Instant },
    Detaching { until: Instant, since: Instant },
}

#[derive(Debug, Clone)]
struct Attachment {
    id: String,
    instance_id: String,
    device_index: u32,
    network_card: u32,
    delete_on_termination: bool,
    state: AttState,
    /// When AttachNetworkInterface made it (describes lag it, `settling`); `None`: an instance's
    /// primary interface, there from launch.
    attached_by_call: Option<Instant>,
}

impl Attachment {
    /// The instance's primary interface: device 0 on card 0 (cannot be detached, in IMDS from boot).
    fn is_primary(&self) -> bool {
        self.device_index == 0 && self.network_card == 0
    }
}

#[derive(Debug)]
struct Eni {
    mac: String,
    subnet_id: String,
    vpc_id: String,
    az: String,
    description: String,
    security_groups: Vec<String>,
    primary_ip: Ipv4Addr,
    /// Secondary IPs with the time they were assigned (IMDS shows them after the lag).
    secondaries: Vec<(Ipv4Addr, Instant)>,
    /// Secondary IPs unassigned recently, with when (IMDS still shows them until the lag passes).
    removed: Vec<(Ipv4Addr, Instant)>,
    /// /28 prefixes with the time they were assigned.
    prefixes: Vec<(Ipv4Net, Instant)>,
    /// Prefixes unassigned recently (IMDS lag).
    removed_prefixes: Vec<(Ipv4Net, Instant)>,
    /// IPv6 addresses and /80 prefixes (with their IMDS lag bookkeeping).
    ipv6: ipv6::EniIpv6,
    tags: BTreeMap<String, String>,
    attachment: Option<Attachment>,
    requester_managed: bool,
    /// When CreateNetworkInterface made it (describes lag it, `settling`); `None`: an instance's
    /// primary interface, there from launch.
    created_by_call: Option<Instant>,
    /// Calls on it still to be refused as not found while it is new (`settling`).
    refusals_left: u32,
}

impl Eni {
    /// What counts against `Ipv4AddressesPerInterface`: the primary, each secondary, each prefix.
    fn ip_count(&self) -> u32 {
        1 + self.secondaries.len() as u32 + self.prefixes.len() as u32
    }
}

/// A filter from a Describe call: `Filter.N.Name` with its `Filter.N.Value.M`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub name: String,
    pub values: Vec<String>,
}

/// What `CreateNetworkInterface` asks for.
#[derive(Clone, Debug, Default)]
pub struct CreateEniArgs {
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub description: String,
    pub secondary_count: u32,
    /// Explicit addresses with their `Primary` flag.
    pub addresses: Vec<(Ipv4Addr, bool)>,
    /// `Ipv4PrefixCount`: automatic /28 prefixes.
    pub prefix_count: u32,
    /// `Ipv4Prefix.N.Ipv4Prefix`: explicit /28 prefixes.
    pub prefixes: Vec<Ipv4Net>,
    pub tags: BTreeMap<String, String>,
    pub client_token: Option<String>,
}

/// What `AssignPrivateIpAddresses` asks for, for /32 addresses.
#[derive(Clone, Debug)]
pub enum AssignArgs {
    Count(u32),
    Addresses {
        ips: Vec<Ipv4Addr>,
        allow_reassignment: bool,
    },
}

/// What `AssignPrivateIpAddresses` asks for, for /28 prefixes.
#[derive(Clone, Debug)]
pub enum PrefixArgs {
    /// `Ipv4PrefixCount`.
    Count(u32),
    /// `Ipv4Prefix.N`.
    Prefixes(Vec<Ipv4Net>),
}

/// What `ModifyNetworkInterfaceAttribute` changes (exactly one).
#[derive(Clone, Debug)]
pub enum ModifyArgs {
    DeleteOnTermination { attachment_id: String, value: bool },
    Groups(Vec<String>),
    Description(String),
}

/// The whole simulated account.
#[derive(Debug)]
pub struct World {
    region: String,
    owner_id: String,
    next_id: u64,
    pub(crate) timing: Timing,
    vpcs: BTreeMap<String, Vpc>,
    subnets: BTreeMap<String, Subnet>,
    instances: BTreeMap<String, Instance>,
    enis: BTreeMap<String, Eni>,
    /// Security groups by id, with their rules ([`security_groups`]).
    groups: BTreeMap<String, security_groups::SecurityGroup>,
    /// Tags every instance carries from launch ([`World::tag_nodes`]).
    node_tags: BTreeMap<String, String>,
    client_tokens: HashMap<String, (String, EniView)>,
    /// Drives EC2's random choice of free addresses and /28 blocks.
    rng: Rng,
}

/// Whether `id` looks like `<prefix>-` followed by 8 or 17 hex digits.
pub fn well_formed(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|hex| {
            (hex.len() == 8 || hex.len() == 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
}

fn not_found(code: &str, what: &str, id: &str) -> Ec2Error {
    Ec2Error::client(code, format!("The {what} ID '{id}' does not exist"))
}

/// EC2's answer for an ENI it does not know (or does not show yet).
fn eni_not_found(id: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidNetworkInterfaceID.NotFound",
        format!("The networkInterface ID '{id}' does not exist"),
    )
}

fn malformed(code: &str, what: &str, id: &str) -> Ec2Error {
    Ec2Error::client(
        code,
        format!("Invalid id: \"{id}\" (expecting \"{what}-...\")"),
    )
}

fn insufficient(subnet_id: &str) -> Ec2Error {
    Ec2Error::client(
        "InsufficientFreeAddressesInSubnet",
        format!(
            "The specified subnet {subnet_id} does not have enough free addresses to satisfy the request."
        ),
    )
}

/// EC2's answer when no free aligned /28 is left for an automatic prefix.
fn insufficient_cidr_blocks() -> Ec2Error {
    Ec2Error::client(
        "InsufficientCidrBlocks",
        "The specified subnet does not have enough free cidr blocks to satisfy the request.",
    )
}

fn bad_filter(name: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidParameterValue",
        format!("The filter '{name}' is invalid"),
    )
}

fn limit_exceeded(count: u32, limit: u32, what: &str) -> Ec2Error {
    Ec2Error::client(
        "PrivateIpAddressLimitExceeded",
        format!(
            "Number of private addresses ({count}) exceeds the limit of {limit} per interface{what}"
        ),
    )
}

fn check_tags(tags: &BTreeMap<String, String>) -> Ec2Result<()> {
    for (k, v) in tags {
        if k.is_empty() || k.len() > 128 || k.to_ascii_lowercase().starts_with("aws:") {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Tag key '{k}' is invalid: keys are 1 to 128 characters and may not start with 'aws:'"
                ),
            ));
        }
        if v.len() > 256 {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!("Tag value for '{k}' is longer than 256 characters"),
            ));
        }
    }
    Ok(())
}

/// Whether `pattern` (with EC2's `*` and `?` wildcards) matches `value`.
fn glob(pattern: &str, value: &str) -> bool {
    fn go(p: &[u8], v: &[u8]) -> bool {
        match (p.first(), v.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], v) || (!v.is_empty() && go(p, &v[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &v[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &v[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), value.as_bytes())
}

/// Whether a tag filter (`tag-key` or `tag:KEY`) matches `tags`; `None` if `f` is not a tag filter.
fn tag_filter_matches(f: &Filter, tags: &BTreeMap<String, String>) -> Option<bool> {
    let any = |field: &str| f.values.iter().any(|p| glob(p, field));
    if f.name == "tag-key" {
        return Some(tags.keys().any(|k| any(k)));
    }
    let key = f.name.strip_prefix("tag:")?;
    Some(tags.get(key).is_some_and(|v| any(v)))
}

impl World {
    pub fn new(region: &str, timing: Timing) -> Self {
        Self {
            region: region.to_owned(),
            owner_id: "123456789012".to_owned(),
            next_id: 1,
            timing,
            vpcs: BTreeMap::new(),
            subnets: BTreeMap::new(),
            instances: BTreeMap::new(),
            enis: BTreeMap::new(),
            groups: BTreeMap::new(),
            node_tags: BTreeMap::new(),
            client_tokens: HashMap::new(),
            rng: Rng::new(DEFAULT_ALLOCATION_SEED),
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn owner_id(&self) -> &str {
        &self.owner_id
    }

    /// Re-seeds the generator behind automatic address and prefix choice (reproducible runs).
    pub fn set_allocation_seed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    fn new_id(&mut self, prefix: &str) -> String {
        let n = splitmix(self.next_id);
        self.next_id += 1;
        format!("{prefix}-0{:016x}", n)
    }

    fn new_mac(&mut self) -> String {
        let n = splitmix(self.next_id ^ 0x6d61_6300);
        self.next_id += 1;
        let b = n.to_be_bytes();
        format!(
            "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[3], b[4], b[5], b[6], b[7]
        )
    }

    fn eni_ref(&self, id: &str) -> Ec2Result<&Eni> {
        if !well_formed(id, "eni") {
            return Err(malformed("InvalidNetworkInterfaceID.Malformed", "eni", id));
        }
        self.enis.get(id).ok_or_else(|| eni_not_found(id))
    }

    fn subnet_ref(&self, id: &str) -> Ec2Result<&Subnet> {
        if !well_formed(id, "subnet") {
            return Err(malformed("InvalidSubnetID.Malformed", "subnet", id));
        }
        self.subnets
            .get(id)
            .ok_or_else(|| not_found("InvalidSubnetID.NotFound", "subnet", id))
    }

    fn check_groups(&self, vpc_id: &str, groups: &[String]) -> Ec2Result<()> {
        if groups.len() > GROUPS_PER_INTERFACE {
            return Err(Ec2Error::client(
                "SecurityGroupsPerInterfaceLimitExceeded",
                format!(
                    "The maximum number of security groups per interface has been reached ({} given, the limit is {GROUPS_PER_INTERFACE}).",
                    groups.len()
                ),
            ));
        }
        for g in groups {
            if !well_formed(g, "sg") {
                return Err(malformed("InvalidGroupId.Malformed", "sg", g));
            }
            if !self.vpcs[vpc_id].security_groups.contains(g) {
                return Err(Ec2Error::client(
                    "InvalidGroup.NotFound",
                    format!("The security group '{g}' does not exist in VPC '{vpc_id}'"),
                ));
            }
        }
        Ok(())
    }

    /// The instance type an ENI's attachment limits it by, if attached.
    fn attached_type(&self, eni: &Eni) -> Option<InstanceType> {
        eni.attachment
            .as_ref()
            .map(|a| self.instances[&a.instance_id].instance_type)
    }
}
