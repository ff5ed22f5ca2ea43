//! The simulated account: VPCs, subnets, instances and ENIs, and EC2's rules over them.
//!
//! Everything here is synchronous and deterministic; the HTTP front ([`crate::ec2`]) holds the lock, and
//! passes the current time so attach/detach progress and IMDS lag follow tokio's clock.
//!
//! Rules enforced, each with EC2's error code: instance-type ENI and IP limits, subnet capacity (CIDR
//! size minus the five addresses AWS reserves), VPC-wide unique addresses, deleting attached ENIs,
//! device-index collisions, unknown and malformed ids, and ClientToken idempotency.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use serde::Serialize;
use tokio::time::Instant;

use crate::catalog::{self, InstanceType, MAX_IPV4_PER_ENI};
use crate::error::{Ec2Error, Ec2Result};

/// How long state changes take to settle.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub attach_delay: Duration,
    pub detach_delay: Duration,
    pub imds_lag: Duration,
}

#[derive(Debug)]
struct Vpc {
    cidr: Ipv4Net,
    security_groups: BTreeSet<String>,
}

#[derive(Debug)]
struct Subnet {
    vpc_id: String,
    cidr: Ipv4Net,
    az: String,
    used: u32,
    cursor: u32,
}

impl Subnet {
    /// Addresses EC2 can hand out: the CIDR minus network, router, DNS, reserved and broadcast.
    fn usable(&self) -> u32 {
        (1u32 << (32 - self.cidr.prefix_len())).saturating_sub(5)
    }

    fn free(&self) -> u32 {
        self.usable() - self.used
    }

    /// Whether `ip` is inside the subnet and not one of the five reserved addresses.
    fn assignable(&self, ip: Ipv4Addr) -> bool {
        let (net, bcast, ip) = (
            u32::from(self.cidr.network()),
            u32::from(self.cidr.broadcast()),
            u32::from(ip),
        );
        ip >= net + 4 && ip < bcast
    }
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
    delete_on_termination: bool,
    state: AttState,
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
    tags: BTreeMap<String, String>,
    attachment: Option<Attachment>,
    requester_managed: bool,
}

impl Eni {
    fn ip_count(&self) -> u32 {
        1 + self.secondaries.len() as u32
    }
}

/// An ENI as `DescribeNetworkInterfaces` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EniView {
    pub id: String,
    pub mac: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub description: String,
    /// `available`, `attaching`, `in-use` or `detaching`.
    pub status: &'static str,
    pub primary_ip: Ipv4Addr,
    pub secondary_ips: Vec<Ipv4Addr>,
    pub security_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub attachment: Option<AttachmentView>,
    pub requester_managed: bool,
}

/// An attachment as EC2 shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttachmentView {
    pub id: String,
    pub instance_id: String,
    pub device_index: u32,
    /// `attaching`, `attached` or `detaching`.
    pub status: &'static str,
    pub delete_on_termination: bool,
}

/// An instance as `DescribeInstances` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceView {
    pub id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub private_ip: Ipv4Addr,
    /// `running` or `terminated`.
    pub state: &'static str,
    pub security_groups: Vec<String>,
    pub enis: Vec<EniView>,
}

/// A subnet as `DescribeSubnets` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SubnetView {
    pub id: String,
    pub vpc_id: String,
    pub cidr: Ipv4Net,
    pub availability_zone: String,
    pub available_ips: u32,
}

/// One interface in an instance's IMDS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImdsEni {
    pub mac: String,
    pub eni_id: String,
    pub device_number: u32,
    pub subnet_id: String,
    pub vpc_id: String,
    pub subnet_cidr: Ipv4Net,
    pub vpc_cidr: Ipv4Net,
    pub security_groups: Vec<String>,
    /// Primary first.
    pub ips: Vec<Ipv4Addr>,
}

/// What an instance's IMDS shows at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImdsInstance {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub region: String,
    pub mac: String,
    pub local_ipv4: Ipv4Addr,
    pub interfaces: Vec<ImdsEni>,
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
    pub tags: BTreeMap<String, String>,
    pub client_token: Option<String>,
}

/// What `AssignPrivateIpAddresses` asks for.
#[derive(Clone, Debug)]
pub enum AssignArgs {
    Count(u32),
    Addresses {
        ips: Vec<Ipv4Addr>,
        allow_reassignment: bool,
    },
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
    ip_owner: HashMap<(String, Ipv4Addr), String>,
    client_tokens: HashMap<String, (String, EniView)>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
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

fn malformed(code: &str, what: &str, id: &str) -> Ec2Error {
    Ec2Error::client(
        code,
        format!("Invalid id: \"{id}\" (expecting \"{what}-...\")"),
    )
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
            ip_owner: HashMap::new(),
            client_tokens: HashMap::new(),
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn owner_id(&self) -> &str {
        &self.owner_id
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

    // ---------------------------------------------------------------- topology (control API)

    /// Creates a VPC with one default security group; returns (vpc id, security group id).
    pub fn create_vpc(&mut self, cidr: Ipv4Net) -> Ec2Result<(String, String)> {
        if !(16..=28).contains(&cidr.prefix_len()) {
            return Err(Ec2Error::client(
                "InvalidVpc.Range",
                format!("The CIDR '{cidr}' is invalid: the prefix must be between /16 and /28."),
            ));
        }
        let id = self.new_id("vpc");
        let sg = self.new_id("sg");
        self.vpcs.insert(
            id.clone(),
            Vpc {
                cidr: cidr.trunc(),
                security_groups: [sg.clone()].into(),
            },
        );
        Ok((id, sg))
    }

    /// Adds a security group to a VPC.
    pub fn create_security_group(&mut self, vpc_id: &str) -> Ec2Result<String> {
        if !self.vpcs.contains_key(vpc_id) {
            return Err(not_found("InvalidVpcID.NotFound", "vpc", vpc_id));
        }
        let sg = self.new_id("sg");
        self.vpcs
            .get_mut(vpc_id)
            .expect("checked")
            .security_groups
            .insert(sg.clone());
        Ok(sg)
    }

    pub fn create_subnet(&mut self, vpc_id: &str, cidr: Ipv4Net, az: &str) -> Ec2Result<String> {
        let vpc = self
            .vpcs
            .get(vpc_id)
            .ok_or_else(|| not_found("InvalidVpcID.NotFound", "vpc", vpc_id))?;
        let cidr = cidr.trunc();
        if !(16..=28).contains(&cidr.prefix_len()) || !vpc.cidr.contains(&cidr) {
            return Err(Ec2Error::client(
                "InvalidSubnet.Range",
                format!(
                    "The CIDR '{cidr}' is invalid for VPC {vpc_id} ({}).",
                    vpc.cidr
                ),
            ));
        }
        if self
            .subnets
            .values()
            .any(|s| s.vpc_id == vpc_id && (s.cidr.contains(&cidr) || cidr.contains(&s.cidr)))
        {
            return Err(Ec2Error::client(
                "InvalidSubnet.Conflict",
                format!("The CIDR '{cidr}' conflicts with another subnet"),
            ));
        }
        let id = self.new_id("subnet");
        self.subnets.insert(
            id.clone(),
            Subnet {
                vpc_id: vpc_id.to_owned(),
                cidr,
                az: az.to_owned(),
                used: 0,
                cursor: 0,
            },
        );
        Ok(id)
    }

    /// Launches a running instance with its primary ENI (device 0) in `subnet_id`.
    pub fn launch_instance(
        &mut self,
        instance_type: &str,
        subnet_id: &str,
        security_groups: &[String],
        now: Instant,
    ) -> Ec2Result<String> {
        let itype = catalog::lookup(instance_type).ok_or_else(|| {
            Ec2Error::client(
                "InvalidInstanceType",
                format!("The instance type '{instance_type}' is not supported."),
            )
        })?;
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| not_found("InvalidSubnetID.NotFound", "subnet", subnet_id))?;
        let (vpc_id, az) = (subnet.vpc_id.clone(), subnet.az.clone());
        let sgs = if security_groups.is_empty() {
            vec![
                self.vpcs[&vpc_id]
                    .security_groups
                    .iter()
                    .next()
                    .cloned()
                    .unwrap_or_default(),
            ]
        } else {
            security_groups.to_vec()
        };
        let id = self.new_id("i");
        let eni = self.create_eni_inner(
            &CreateEniArgs {
                subnet_id: subnet_id.to_owned(),
                security_groups: sgs.clone(),
                description: "Primary network interface".to_owned(),
                ..Default::default()
            },
            now,
        )?;
        let attachment_id = self.new_id("eni-attach");
        let e = self.enis.get_mut(&eni).expect("just created");
        e.attachment = Some(Attachment {
            id: attachment_id,
            instance_id: id.clone(),
            device_index: 0,
            delete_on_termination: true,
            state: AttState::Attached { since: now },
        });
        let (mac, ip) = (e.mac.clone(), e.primary_ip);
        self.instances.insert(
            id.clone(),
            Instance {
                instance_type: itype,
                subnet_id: subnet_id.to_owned(),
                vpc_id,
                az,
                security_groups: sgs,
                state: InstanceState::Running,
                primary_mac: mac,
                primary_ip: ip,
                gone: Vec::new(),
            },
        );
        Ok(id)
    }

    /// Terminates an instance: ENIs with DeleteOnTermination are deleted, the others detached.
    pub fn terminate_instance(&mut self, instance_id: &str, now: Instant) -> Ec2Result<()> {
        self.settle(now);
        let inst = self
            .instances
            .get_mut(instance_id)
            .ok_or_else(|| not_found("InvalidInstanceID.NotFound", "instance", instance_id))?;
        inst.state = InstanceState::Terminated;
        let attached: Vec<(String, bool)> = self
            .enis
            .iter()
            .filter_map(|(id, e)| {
                e.attachment
                    .as_ref()
                    .filter(|a| a.instance_id == instance_id)
                    .map(|a| (id.clone(), a.delete_on_termination))
            })
            .collect();
        for (eni, delete) in attached {
            self.enis.get_mut(&eni).expect("listed").attachment = None;
            if delete {
                self.remove_eni(&eni);
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- time

    /// Moves attachments along (attaching → attached, detaching → gone) and forgets IMDS ghosts.
    pub fn settle(&mut self, now: Instant) {
        let lag = self.timing.imds_lag;
        let mut gone = Vec::new();
        for (id, eni) in &mut self.enis {
            if let Some(att) = &mut eni.attachment {
                match att.state {
                    AttState::Attaching { until } if now >= until => {
                        att.state = AttState::Attached { since: until };
                    }
                    AttState::Detaching { until, .. } if now >= until => {
                        gone.push((id.clone(), att.instance_id.clone(), until));
                    }
                    _ => {}
                }
            }
            eni.removed.retain(|(_, at)| *at + lag > now);
        }
        for (eni_id, instance_id, at) in gone {
            let view = self.imds_eni(&eni_id, true, now);
            self.enis.get_mut(&eni_id).expect("listed").attachment = None;
            if let (Some(inst), Some(view)) = (self.instances.get_mut(&instance_id), view) {
                inst.gone.push((view, at));
            }
        }
        for inst in self.instances.values_mut() {
            inst.gone.retain(|(_, at)| *at + lag > now);
        }
    }

    // ---------------------------------------------------------------- views

    fn eni_view(&self, id: &str) -> EniView {
        let e = &self.enis[id];
        let attachment = e.attachment.as_ref().map(|a| AttachmentView {
            id: a.id.clone(),
            instance_id: a.instance_id.clone(),
            device_index: a.device_index,
            status: match a.state {
                AttState::Attaching { .. } => "attaching",
                AttState::Attached { .. } => "attached",
                AttState::Detaching { .. } => "detaching",
            },
            delete_on_termination: a.delete_on_termination,
        });
        let status = match e.attachment.as_ref().map(|a| a.state) {
            None => "available",
            Some(AttState::Attaching { .. }) => "attaching",
            Some(AttState::Attached { .. }) => "in-use",
            Some(AttState::Detaching { .. }) => "detaching",
        };
        EniView {
            id: id.to_owned(),
            mac: e.mac.clone(),
            subnet_id: e.subnet_id.clone(),
            vpc_id: e.vpc_id.clone(),
            availability_zone: e.az.clone(),
            description: e.description.clone(),
            status,
            primary_ip: e.primary_ip,
            secondary_ips: e.secondaries.iter().map(|(ip, _)| *ip).collect(),
            security_groups: e.security_groups.clone(),
            tags: e.tags.clone(),
            attachment,
            requester_managed: e.requester_managed,
        }
    }

    fn instance_view(&self, id: &str) -> InstanceView {
        let i = &self.instances[id];
        let mut enis: Vec<EniView> = self
            .enis
            .iter()
            .filter(|(_, e)| e.attachment.as_ref().is_some_and(|a| a.instance_id == id))
            .map(|(eid, _)| self.eni_view(eid))
            .collect();
        enis.sort_by_key(|e| e.attachment.as_ref().map(|a| a.device_index));
        InstanceView {
            id: id.to_owned(),
            instance_type: i.instance_type.name.to_owned(),
            availability_zone: i.az.clone(),
            subnet_id: i.subnet_id.clone(),
            vpc_id: i.vpc_id.clone(),
            private_ip: i.primary_ip,
            state: match i.state {
                InstanceState::Running => "running",
                InstanceState::Terminated => "terminated",
            },
            security_groups: i.security_groups.clone(),
            enis,
        }
    }

    /// The ENI as IMDS would show it now; `ignore_lag` shows everything attached.
    fn imds_eni(&self, id: &str, ignore_lag: bool, now: Instant) -> Option<ImdsEni> {
        let e = self.enis.get(id)?;
        let a = e.attachment.as_ref()?;
        let lag = self.timing.imds_lag;
        // The primary interface (device 0) is there from boot.
        let visible = ignore_lag
            || a.device_index == 0
            || match a.state {
                AttState::Attaching { .. } => false,
                AttState::Attached { since } | AttState::Detaching { since, .. } => {
                    since + lag <= now
                }
            };
        if !visible {
            return None;
        }
        let mut ips = vec![e.primary_ip];
        ips.extend(
            e.secondaries
                .iter()
                .filter(|(_, at)| ignore_lag || *at + lag <= now)
                .map(|(ip, _)| *ip),
        );
        if !ignore_lag {
            ips.extend(
                e.removed
                    .iter()
                    .filter(|(_, at)| *at + lag > now)
                    .map(|(ip, _)| *ip),
            );
        }
        let subnet = &self.subnets[&e.subnet_id];
        Some(ImdsEni {
            mac: e.mac.clone(),
            eni_id: id.to_owned(),
            device_number: a.device_index,
            subnet_id: e.subnet_id.clone(),
            vpc_id: e.vpc_id.clone(),
            subnet_cidr: subnet.cidr,
            vpc_cidr: self.vpcs[&e.vpc_id].cidr,
            security_groups: e.security_groups.clone(),
            ips,
        })
    }

    /// What the instance's IMDS shows at `now` (changes appear after the configured lag).
    pub fn imds(&mut self, instance_id: &str, now: Instant) -> Option<ImdsInstance> {
        self.settle(now);
        let inst = self.instances.get(instance_id)?;
        let mut interfaces: Vec<ImdsEni> = self
            .enis
            .iter()
            .filter(|(_, e)| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance_id)
            })
            .filter_map(|(id, _)| self.imds_eni(id, false, now))
            .collect();
        for (ghost, _) in &inst.gone {
            if !interfaces.iter().any(|i| i.mac == ghost.mac) {
                interfaces.push(ghost.clone());
            }
        }
        interfaces.sort_by_key(|i| i.device_number);
        Some(ImdsInstance {
            instance_id: instance_id.to_owned(),
            instance_type: inst.instance_type.name.to_owned(),
            availability_zone: inst.az.clone(),
            region: self.region.clone(),
            mac: inst.primary_mac.clone(),
            local_ipv4: inst.primary_ip,
            interfaces,
        })
    }

    /// Ids of every instance (running or not).
    pub fn instance_ids(&self) -> Vec<String> {
        self.instances.keys().cloned().collect()
    }

    /// One instance's view (control API and tests).
    pub fn instance(&mut self, id: &str, now: Instant) -> Option<InstanceView> {
        self.settle(now);
        self.instances
            .contains_key(id)
            .then(|| self.instance_view(id))
    }

    /// Everything, for the control API's state dump.
    pub fn dump(&mut self, now: Instant) -> serde_json::Value {
        self.settle(now);
        let subnets: Vec<SubnetView> = self.subnets.keys().map(|id| self.subnet_view(id)).collect();
        let instances: Vec<InstanceView> = self
            .instances
            .keys()
            .map(|id| self.instance_view(id))
            .collect();
        let enis: Vec<EniView> = self.enis.keys().map(|id| self.eni_view(id)).collect();
        let vpcs: Vec<serde_json::Value> = self
            .vpcs
            .iter()
            .map(|(id, v)| serde_json::json!({"id": id, "cidr": v.cidr, "security_groups": v.security_groups}))
            .collect();
        serde_json::json!({
            "vpcs": vpcs, "subnets": subnets, "instances": instances, "network_interfaces": enis,
            "assigned_ips": self.ip_owner.len(),
        })
    }

    fn subnet_view(&self, id: &str) -> SubnetView {
        let s = &self.subnets[id];
        SubnetView {
            id: id.to_owned(),
            vpc_id: s.vpc_id.clone(),
            cidr: s.cidr,
            availability_zone: s.az.clone(),
            available_ips: s.free(),
        }
    }

    // ---------------------------------------------------------------- address bookkeeping

    fn take_ip(&mut self, subnet_id: &str, eni_id: &str) -> Ec2Result<Ipv4Addr> {
        let s = self
            .subnets
            .get_mut(subnet_id)
            .expect("subnet checked by caller");
        if s.free() == 0 {
            return Err(insufficient(subnet_id));
        }
        let base = u32::from(s.cidr.network()) + 4;
        let span = s.usable();
        for step in 0..span {
            let off = (s.cursor + step) % span;
            let ip = Ipv4Addr::from(base + off);
            let key = (s.vpc_id.clone(), ip);
            if let std::collections::hash_map::Entry::Vacant(v) = self.ip_owner.entry(key) {
                v.insert(eni_id.to_owned());
                s.cursor = (off + 1) % span;
                s.used += 1;
                return Ok(ip);
            }
        }
        Err(insufficient(subnet_id))
    }

    fn claim_ip(&mut self, subnet_id: &str, ip: Ipv4Addr, eni_id: &str) {
        let s = self
            .subnets
            .get_mut(subnet_id)
            .expect("subnet checked by caller");
        s.used += 1;
        self.ip_owner
            .insert((s.vpc_id.clone(), ip), eni_id.to_owned());
    }

    fn free_ip(&mut self, subnet_id: &str, ip: Ipv4Addr) {
        if let Some(s) = self.subnets.get_mut(subnet_id)
            && self.ip_owner.remove(&(s.vpc_id.clone(), ip)).is_some()
        {
            s.used -= 1;
        }
    }

    fn remove_eni(&mut self, eni_id: &str) {
        if let Some(e) = self.enis.remove(eni_id) {
            self.free_ip(&e.subnet_id, e.primary_ip);
            for (ip, _) in e.secondaries {
                self.free_ip(&e.subnet_id, ip);
            }
        }
    }

    /// Checks an explicit address for `subnet_id`: inside, not reserved, and free (or, with
    /// `allow_reassignment`, owned by another ENI, which is returned).
    fn check_explicit(
        &self,
        subnet_id: &str,
        ip: Ipv4Addr,
        eni_id: Option<&str>,
        allow_reassignment: bool,
    ) -> Ec2Result<Option<String>> {
        let s = &self.subnets[subnet_id];
        if !s.assignable(ip) {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Address {ip} does not fall within the subnet's address range or is reserved"
                ),
            ));
        }
        match self.ip_owner.get(&(s.vpc_id.clone(), ip)) {
            None => Ok(None),
            Some(owner) if Some(owner.as_str()) == eni_id => Err(Ec2Error::client(
                "InvalidParameterValue",
                format!("Address {ip} is already assigned to {owner}"),
            )),
            Some(owner) if allow_reassignment && !self.is_primary_ip(owner, ip) => {
                Ok(Some(owner.clone()))
            }
            Some(_) => Err(Ec2Error::client(
                "InvalidIPAddress.InUse",
                format!("Address {ip} is in use."),
            )),
        }
    }

    fn is_primary_ip(&self, eni: &str, ip: Ipv4Addr) -> bool {
        self.enis.get(eni).is_some_and(|e| e.primary_ip == ip)
    }

    // ---------------------------------------------------------------- lookups

    fn eni_ref(&self, id: &str) -> Ec2Result<&Eni> {
        if !well_formed(id, "eni") {
            return Err(malformed("InvalidNetworkInterfaceID.Malformed", "eni", id));
        }
        self.enis.get(id).ok_or_else(|| {
            Ec2Error::client(
                "InvalidNetworkInterfaceID.NotFound",
                format!("The networkInterface ID '{id}' does not exist"),
            )
        })
    }

    fn check_groups(&self, vpc_id: &str, groups: &[String]) -> Ec2Result<()> {
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

    // ---------------------------------------------------------------- EC2 actions

    pub fn describe_instances(
        &mut self,
        ids: &[String],
        filters: &[Filter],
        now: Instant,
    ) -> Ec2Result<Vec<InstanceView>> {
        self.settle(now);
        for id in ids {
            if !well_formed(id, "i") {
                return Err(malformed("InvalidInstanceID.Malformed", "i", id));
            }
            if !self.instances.contains_key(id) {
                return Err(not_found("InvalidInstanceID.NotFound", "instance", id));
            }
        }
        for f in filters {
            if ![
                "instance-id",
                "instance-type",
                "vpc-id",
                "subnet-id",
                "instance-state-name",
            ]
            .contains(&f.name.as_str())
            {
                return Err(bad_filter(&f.name));
            }
        }
        let views = self
            .instances
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .map(|id| self.instance_view(id))
            .filter(|v| {
                filters.iter().all(|f| {
                    let field = match f.name.as_str() {
                        "instance-id" => &v.id,
                        "instance-type" => &v.instance_type,
                        "vpc-id" => &v.vpc_id,
                        "subnet-id" => &v.subnet_id,
                        _ => v.state,
                    };
                    f.values.iter().any(|x| x == field)
                })
            })
            .collect();
        Ok(views)
    }

    pub fn describe_instance_types(&self, names: &[String]) -> Ec2Result<Vec<InstanceType>> {
        if names.is_empty() {
            return Ok(catalog::CATALOG.to_vec());
        }
        names
            .iter()
            .map(|n| {
                catalog::lookup(n).ok_or_else(|| {
                    Ec2Error::client(
                        "InvalidInstanceType",
                        format!("The following supplied instance types do not exist: [{n}]"),
                    )
                })
            })
            .collect()
    }

    pub fn describe_subnets(
        &self,
        ids: &[String],
        filters: &[Filter],
    ) -> Ec2Result<Vec<SubnetView>> {
        for id in ids {
            if !well_formed(id, "subnet") {
                return Err(malformed("InvalidSubnetID.Malformed", "subnet", id));
            }
            if !self.subnets.contains_key(id) {
                return Err(not_found("InvalidSubnetID.NotFound", "subnet", id));
            }
        }
        for f in filters {
            if !["subnet-id", "vpc-id", "availability-zone", "cidr-block"]
                .contains(&f.name.as_str())
            {
                return Err(bad_filter(&f.name));
            }
        }
        Ok(self
            .subnets
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .map(|id| self.subnet_view(id))
            .filter(|v| {
                filters.iter().all(|f| {
                    let field = match f.name.as_str() {
                        "subnet-id" => v.id.clone(),
                        "vpc-id" => v.vpc_id.clone(),
                        "availability-zone" => v.availability_zone.clone(),
                        _ => v.cidr.to_string(),
                    };
                    f.values.contains(&field)
                })
            })
            .collect())
    }

    pub fn describe_network_interfaces(
        &mut self,
        ids: &[String],
        filters: &[Filter],
        now: Instant,
    ) -> Ec2Result<Vec<EniView>> {
        self.settle(now);
        for id in ids {
            self.eni_ref(id)?;
        }
        for f in filters {
            let known = [
                "network-interface-id",
                "attachment.instance-id",
                "attachment.status",
                "attachment.attachment-id",
                "status",
                "subnet-id",
                "vpc-id",
                "description",
                "tag-key",
                "mac-address",
            ];
            if !known.contains(&f.name.as_str()) && !f.name.starts_with("tag:") {
                return Err(bad_filter(&f.name));
            }
        }
        Ok(self
            .enis
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .map(|id| self.eni_view(id))
            .filter(|v| filters.iter().all(|f| eni_matches(v, f)))
            .collect())
    }

    pub fn create_network_interface(
        &mut self,
        args: &CreateEniArgs,
        now: Instant,
    ) -> Ec2Result<EniView> {
        self.settle(now);
        let fingerprint = format!(
            "{}|{:?}|{}|{}|{:?}|{:?}",
            args.subnet_id,
            args.security_groups,
            args.description,
            args.secondary_count,
            args.addresses,
            args.tags
        );
        if let Some(token) = &args.client_token
            && let Some((fp, view)) = self.client_tokens.get(token)
        {
            if *fp != fingerprint {
                return Err(Ec2Error::client(
                    "IdempotentParameterMismatch",
                    format!("The client token '{token}' was used with different parameters"),
                ));
            }
            return Ok(if self.enis.contains_key(&view.id) {
                self.eni_view(&view.id)
            } else {
                view.clone()
            });
        }
        let id = self.create_eni_inner(args, now)?;
        let view = self.eni_view(&id);
        if let Some(token) = &args.client_token {
            self.client_tokens
                .insert(token.clone(), (fingerprint, view.clone()));
        }
        Ok(view)
    }

    fn create_eni_inner(&mut self, args: &CreateEniArgs, now: Instant) -> Ec2Result<String> {
        if !well_formed(&args.subnet_id, "subnet") {
            return Err(malformed(
                "InvalidSubnetID.Malformed",
                "subnet",
                &args.subnet_id,
            ));
        }
        let subnet = self
            .subnets
            .get(&args.subnet_id)
            .ok_or_else(|| not_found("InvalidSubnetID.NotFound", "subnet", &args.subnet_id))?;
        let (vpc_id, az, free) = (subnet.vpc_id.clone(), subnet.az.clone(), subnet.free());
        let sgs = if args.security_groups.is_empty() {
            vec![
                self.vpcs[&vpc_id]
                    .security_groups
                    .iter()
                    .next()
                    .cloned()
                    .unwrap_or_default(),
            ]
        } else {
            args.security_groups.clone()
        };
        self.check_groups(&vpc_id, &sgs)?;
        if args.addresses.iter().filter(|(_, p)| *p).count() > 1 {
            return Err(Ec2Error::combination(
                "Only one private IP address can be designated as primary",
            ));
        }
        let total = args.addresses.len() as u32
            + args.secondary_count
            + u32::from(!args.addresses.iter().any(|(_, p)| *p));
        if total > MAX_IPV4_PER_ENI {
            return Err(Ec2Error::client(
                "PrivateIpAddressLimitExceeded",
                format!(
                    "Number of private addresses ({total}) exceeds the limit of {MAX_IPV4_PER_ENI} per interface"
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (ip, _) in &args.addresses {
            if !seen.insert(*ip) {
                return Err(Ec2Error::invalid_value(
                    "PrivateIpAddresses",
                    &ip.to_string(),
                    "Duplicate address.",
                ));
            }
            self.check_explicit(&args.subnet_id, *ip, None, false)?;
        }
        let needed = total - args.addresses.len() as u32;
        if needed > free {
            return Err(insufficient(&args.subnet_id));
        }
        check_tags(&args.tags)?;
        // All checks passed: from here on nothing fails.
        let id = self.new_id("eni");
        let mac = self.new_mac();
        let mut addrs: Vec<Ipv4Addr> = Vec::new();
        let mut primary = args.addresses.iter().find(|(_, p)| *p).map(|(ip, _)| *ip);
        for (ip, _) in &args.addresses {
            self.claim_ip(&args.subnet_id, *ip, &id);
            if Some(*ip) != primary {
                addrs.push(*ip);
            }
        }
        if primary.is_none() {
            primary = Some(self.take_ip(&args.subnet_id, &id)?);
        }
        for _ in 0..args.secondary_count {
            addrs.push(self.take_ip(&args.subnet_id, &id)?);
        }
        self.enis.insert(
            id.clone(),
            Eni {
                mac,
                subnet_id: args.subnet_id.clone(),
                vpc_id,
                az,
                description: args.description.clone(),
                security_groups: sgs,
                primary_ip: primary.expect("set above"),
                secondaries: addrs.into_iter().map(|ip| (ip, now)).collect(),
                removed: Vec::new(),
                tags: args.tags.clone(),
                attachment: None,
                requester_managed: false,
            },
        );
        Ok(id)
    }

    pub fn attach_network_interface(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        now: Instant,
    ) -> Ec2Result<String> {
        self.settle(now);
        let eni = self.eni_ref(eni_id)?;
        if !well_formed(instance_id, "i") {
            return Err(malformed("InvalidInstanceID.Malformed", "i", instance_id));
        }
        let inst = self
            .instances
            .get(instance_id)
            .ok_or_else(|| not_found("InvalidInstanceID.NotFound", "instance", instance_id))?;
        if inst.state != InstanceState::Running {
            return Err(Ec2Error::client(
                "IncorrectInstanceState",
                format!("The instance '{instance_id}' is not in the 'running' state."),
            ));
        }
        if eni.attachment.is_some() {
            return Err(Ec2Error::client(
                "InvalidNetworkInterface.InUse",
                format!("Interface: [{eni_id}] in use."),
            ));
        }
        if eni.az != inst.az {
            return Err(Ec2Error::combination(format!(
                "You may not attach a network interface to an instance if they are not in the same availability zone ({} vs {})",
                eni.az, inst.az
            )));
        }
        let limits = inst.instance_type;
        let attached: Vec<u32> = self
            .enis
            .values()
            .filter_map(|e| {
                e.attachment
                    .as_ref()
                    .filter(|a| a.instance_id == instance_id)
            })
            .map(|a| a.device_index)
            .collect();
        if attached.len() as u32 >= limits.max_enis {
            return Err(Ec2Error::client(
                "AttachmentLimitExceeded",
                format!(
                    "Interface count {} exceeds the limit for {}",
                    attached.len() + 1,
                    limits.name
                ),
            ));
        }
        if device_index >= limits.max_enis {
            return Err(Ec2Error::invalid_value(
                "DeviceIndex",
                &device_index.to_string(),
                &format!(
                    "Instance type {} supports device indexes 0 to {}.",
                    limits.name,
                    limits.max_enis - 1
                ),
            ));
        }
        if attached.contains(&device_index) {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Instance '{instance_id}' already has an interface attached at device index '{device_index}'."
                ),
            ));
        }
        if eni.ip_count() > limits.ipv4_per_eni {
            return Err(Ec2Error::client(
                "PrivateIpAddressLimitExceeded",
                format!(
                    "Number of private addresses ({}) exceeds the limit of {} per interface for {}",
                    eni.ip_count(),
                    limits.ipv4_per_eni,
                    limits.name
                ),
            ));
        }
        let attachment_id = self.new_id("eni-attach");
        let delay = self.timing.attach_delay;
        self.enis.get_mut(eni_id).expect("checked").attachment = Some(Attachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            delete_on_termination: false,
            state: if delay.is_zero() {
                AttState::Attached { since: now }
            } else {
                AttState::Attaching { until: now + delay }
            },
        });
        Ok(attachment_id)
    }

    fn find_attachment(&self, attachment_id: &str) -> Ec2Result<String> {
        if !well_formed(attachment_id, "eni-attach") {
            return Err(malformed(
                "InvalidAttachmentID.Malformed",
                "eni-attach",
                attachment_id,
            ));
        }
        self.enis
            .iter()
            .find(|(_, e)| e.attachment.as_ref().is_some_and(|a| a.id == attachment_id))
            .map(|(id, _)| id.clone())
            .ok_or_else(|| {
                Ec2Error::client(
                    "InvalidAttachmentID.NotFound",
                    format!("The attachment ID '{attachment_id}' does not exist"),
                )
            })
    }

    pub fn detach_network_interface(
        &mut self,
        attachment_id: &str,
        _force: bool,
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        let eni_id = self.find_attachment(attachment_id)?;
        let delay = self.timing.detach_delay;
        let att = self
            .enis
            .get_mut(&eni_id)
            .and_then(|e| e.attachment.as_mut())
            .expect("found above");
        if att.device_index == 0 {
            return Err(Ec2Error::client(
                "OperationNotPermitted",
                "The network interface at device index 0 cannot be detached.",
            ));
        }
        let since = match att.state {
            AttState::Detaching { .. } => return Ok(()),
            AttState::Attaching { until } => until.min(now),
            AttState::Attached { since } => since,
        };
        att.state = AttState::Detaching {
            until: now + delay,
            since,
        };
        self.settle(now);
        Ok(())
    }

    pub fn delete_network_interface(&mut self, eni_id: &str, now: Instant) -> Ec2Result<()> {
        self.settle(now);
        let eni = self.eni_ref(eni_id)?;
        if eni.attachment.is_some() {
            return Err(Ec2Error::client(
                "InvalidNetworkInterface.InUse",
                format!("The network interface '{eni_id}' is currently in use."),
            ));
        }
        self.remove_eni(eni_id);
        Ok(())
    }

    pub fn modify_network_interface_attribute(
        &mut self,
        eni_id: &str,
        change: ModifyArgs,
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        let eni = self.eni_ref(eni_id)?;
        let vpc = eni.vpc_id.clone();
        match change {
            ModifyArgs::DeleteOnTermination {
                attachment_id,
                value,
            } => {
                if !well_formed(&attachment_id, "eni-attach") {
                    return Err(malformed(
                        "InvalidAttachmentID.Malformed",
                        "eni-attach",
                        &attachment_id,
                    ));
                }
                let att = self
                    .enis
                    .get_mut(eni_id)
                    .and_then(|e| e.attachment.as_mut())
                    .filter(|a| a.id == attachment_id)
                    .ok_or_else(|| {
                        Ec2Error::client(
                            "InvalidAttachmentID.NotFound",
                            format!(
                                "The attachment ID '{attachment_id}' does not exist for {eni_id}"
                            ),
                        )
                    })?;
                att.delete_on_termination = value;
            }
            ModifyArgs::Groups(groups) => {
                if groups.is_empty() {
                    return Err(Ec2Error::missing("SecurityGroupId"));
                }
                self.check_groups(&vpc, &groups)?;
                self.enis.get_mut(eni_id).expect("checked").security_groups = groups;
            }
            ModifyArgs::Description(d) => {
                self.enis.get_mut(eni_id).expect("checked").description = d;
            }
        }
        Ok(())
    }

    pub fn assign_private_ip_addresses(
        &mut self,
        eni_id: &str,
        args: AssignArgs,
        now: Instant,
    ) -> Ec2Result<Vec<Ipv4Addr>> {
        self.settle(now);
        let eni = self.eni_ref(eni_id)?;
        let limit = match &eni.attachment {
            Some(a) => self.instances[&a.instance_id].instance_type.ipv4_per_eni,
            None => MAX_IPV4_PER_ENI,
        };
        let subnet_id = eni.subnet_id.clone();
        let have = eni.ip_count();
        let adding = match &args {
            AssignArgs::Count(n) => *n,
            AssignArgs::Addresses { ips, .. } => ips.len() as u32,
        };
        if adding == 0 {
            return Err(Ec2Error::invalid_value(
                "SecondaryPrivateIpAddressCount",
                "0",
                "Must be at least 1.",
            ));
        }
        if have + adding > limit {
            return Err(Ec2Error::client(
                "PrivateIpAddressLimitExceeded",
                format!(
                    "Number of private addresses ({}) exceeds the limit of {limit} per interface",
                    have + adding
                ),
            ));
        }
        match args {
            AssignArgs::Count(n) => {
                if n > self.subnets[&subnet_id].free() {
                    return Err(insufficient(&subnet_id));
                }
                let mut new = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    new.push(self.take_ip(&subnet_id, eni_id)?);
                }
                let e = self.enis.get_mut(eni_id).expect("checked");
                e.secondaries.extend(new.iter().map(|ip| (*ip, now)));
                e.removed.retain(|(ip, _)| !new.contains(ip));
                Ok(new)
            }
            AssignArgs::Addresses {
                ips,
                allow_reassignment,
            } => {
                let mut seen = BTreeSet::new();
                let mut moves = Vec::new();
                for ip in &ips {
                    if !seen.insert(*ip) {
                        return Err(Ec2Error::invalid_value(
                            "PrivateIpAddress",
                            &ip.to_string(),
                            "Duplicate address.",
                        ));
                    }
                    if let Some(owner) =
                        self.check_explicit(&subnet_id, *ip, Some(eni_id), allow_reassignment)?
                    {
                        moves.push((*ip, owner));
                    }
                }
                for (ip, owner) in moves {
                    if let Some(o) = self.enis.get_mut(&owner) {
                        o.secondaries.retain(|(x, _)| *x != ip);
                        o.removed.push((ip, now));
                    }
                    self.free_ip(&subnet_id, ip);
                }
                for ip in &ips {
                    self.claim_ip(&subnet_id, *ip, eni_id);
                }
                let e = self.enis.get_mut(eni_id).expect("checked");
                e.secondaries.extend(ips.iter().map(|ip| (*ip, now)));
                e.removed.retain(|(ip, _)| !ips.contains(ip));
                Ok(ips)
            }
        }
    }

    pub fn unassign_private_ip_addresses(
        &mut self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        let eni = self.eni_ref(eni_id)?;
        if ips.is_empty() {
            return Err(Ec2Error::missing("PrivateIpAddress"));
        }
        for ip in ips {
            if *ip == eni.primary_ip {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!("The primary private IP address {ip} of {eni_id} cannot be unassigned"),
                ));
            }
            if !eni.secondaries.iter().any(|(x, _)| x == ip) {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Some of the specified addresses are not assigned to interface {eni_id}"
                    ),
                ));
            }
        }
        let subnet_id = eni.subnet_id.clone();
        let e = self.enis.get_mut(eni_id).expect("checked");
        e.secondaries.retain(|(x, _)| !ips.contains(x));
        e.removed.extend(ips.iter().map(|ip| (*ip, now)));
        for ip in ips {
            self.free_ip(&subnet_id, *ip);
        }
        Ok(())
    }

    fn tag_target(&mut self, id: &str) -> Ec2Result<&mut BTreeMap<String, String>> {
        if id.starts_with("eni-") && !id.starts_with("eni-attach") {
            self.eni_ref(id)?;
            return Ok(&mut self.enis.get_mut(id).expect("checked").tags);
        }
        Err(Ec2Error::client(
            "InvalidID",
            format!("The ID '{id}' is not valid (mockcloud tags network interfaces only)"),
        ))
    }

    pub fn create_tags(
        &mut self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Ec2Result<()> {
        if resources.is_empty() {
            return Err(Ec2Error::missing("ResourceId"));
        }
        if tags.is_empty() {
            return Err(Ec2Error::missing("Tag"));
        }
        check_tags(tags)?;
        for r in resources {
            self.tag_target(r)?;
        }
        for r in resources {
            self.tag_target(r)?.extend(tags.clone());
        }
        Ok(())
    }

    pub fn delete_tags(
        &mut self,
        resources: &[String],
        tags: &[(String, Option<String>)],
    ) -> Ec2Result<()> {
        if resources.is_empty() {
            return Err(Ec2Error::missing("ResourceId"));
        }
        for r in resources {
            self.tag_target(r)?;
        }
        for r in resources {
            let t = self.tag_target(r)?;
            if tags.is_empty() {
                t.clear();
            }
            for (k, v) in tags {
                if v.as_ref().is_none_or(|v| t.get(k) == Some(v)) {
                    t.remove(k);
                }
            }
        }
        Ok(())
    }
}

fn insufficient(subnet_id: &str) -> Ec2Error {
    Ec2Error::client(
        "InsufficientFreeAddressesInSubnet",
        format!(
            "The specified subnet {subnet_id} does not have enough free addresses to satisfy the request."
        ),
    )
}

fn bad_filter(name: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidParameterValue",
        format!("The filter '{name}' is invalid"),
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

fn eni_matches(v: &EniView, f: &Filter) -> bool {
    let any = |field: &str| f.values.iter().any(|p| glob(p, field));
    match f.name.as_str() {
        "network-interface-id" => any(&v.id),
        "attachment.instance-id" => v.attachment.as_ref().is_some_and(|a| any(&a.instance_id)),
        "attachment.status" => v.attachment.as_ref().is_some_and(|a| any(a.status)),
        "attachment.attachment-id" => v.attachment.as_ref().is_some_and(|a| any(&a.id)),
        "status" => any(v.status),
        "subnet-id" => any(&v.subnet_id),
        "vpc-id" => any(&v.vpc_id),
        "description" => any(&v.description),
        "mac-address" => any(&v.mac),
        "tag-key" => v.tags.keys().any(|k| any(k)),
        name => {
            let key = name.strip_prefix("tag:").unwrap_or_default();
            v.tags.get(key).is_some_and(|val| any(val))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> (World, String, String, Instant) {
        let now = Instant::now();
        let mut w = World::new(
            "us-east-1",
            Timing {
                attach_delay: Duration::ZERO,
                detach_delay: Duration::ZERO,
                imds_lag: Duration::ZERO,
            },
        );
        let (vpc, _) = w.create_vpc("10.0.0.0/16".parse().unwrap()).unwrap();
        let subnet = w
            .create_subnet(&vpc, "10.0.0.0/28".parse().unwrap(), "us-east-1a")
            .unwrap();
        let inst = w.launch_instance("t3.medium", &subnet, &[], now).unwrap();
        (w, subnet, inst, now)
    }

    #[test]
    fn small_subnet_runs_out_and_never_hands_out_reserved_addresses() {
        let (mut w, subnet, _inst, now) = world();
        // /28 = 16 addresses, 11 usable, 1 used by the instance's primary ENI.
        let eni = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: subnet.clone(),
                    secondary_count: 5,
                    ..Default::default()
                },
                now,
            )
            .unwrap();
        let err = w
            .assign_private_ip_addresses(&eni.id, AssignArgs::Count(5), now)
            .unwrap_err();
        assert_eq!(err.code, "InsufficientFreeAddressesInSubnet");
        let got = w
            .assign_private_ip_addresses(&eni.id, AssignArgs::Count(4), now)
            .unwrap();
        assert_eq!(got.len(), 4);
        let all = w.describe_network_interfaces(&[], &[], now).unwrap();
        let mut ips: Vec<Ipv4Addr> = all
            .iter()
            .flat_map(|e| std::iter::once(e.primary_ip).chain(e.secondary_ips.clone()))
            .collect();
        ips.sort();
        let n = ips.len();
        ips.dedup();
        assert_eq!(ips.len(), n, "no duplicates");
        assert_eq!(n, 11);
        for ip in ips {
            let o = ip.octets()[3];
            assert!((4..15).contains(&o), "{ip} is reserved");
        }
    }

    #[test]
    fn glob_matches_like_ec2() {
        assert!(glob("eni-*", "eni-123"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("*", ""));
    }
}
