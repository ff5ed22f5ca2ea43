//! Test support: an in-memory [`Cloud`] and [`Metadata`] over one shared state, for the pool tests (the
//! integration tests run the real SDK against mockcloud instead). Not part of the shipped daemon.
//!
//! [`MemoryCloud`] models one VPC with one subnet and one instance (the node). It enforces what EC2
//! enforces and what the pool depends on: the instance type's ENI and per-ENI IPv4 limits
//! ([`CloudError::AttachmentLimitExceeded`], [`CloudError::IpLimitExceeded`]), a finite subnet
//! ([`CloudError::SubnetFull`]), unique IPs, in-use deletes and `ClientToken` idempotency. An ENI created
//! and attached through [`Cloud`] shows up at once in the [`Metadata`] view (no IMDS lag).
//!
//! Like the fakes STYLE.md points at, it records every call (action and arguments) and can be told to
//! fail: the next N calls of an action with a given [`CloudError`] ([`MemoryCloud::fail_next`]), or a
//! seeded random fraction of them ([`MemoryCloud::fail_rate`]). [`MemoryCloud::set_latency`] adds a
//! tokio sleep to an action, so `tokio::time::pause` drives it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use ipnet::Ipv4Net;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use eniipam::cloud::{
    AttachmentStatus, Cloud, CloudError, CloudResult, CreateEni, Eni, EniAttachment, EniFilter,
    EniStatus, Instance, InstanceIdentity, InstanceLimits, Metadata, MetadataEni, NodeContext,
    Subnet, SubnetFilter,
};
use eniipam::model::EniId;

/// One call the fake can record, fail or delay: the EC2 action it stands for, or an IMDS read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    DescribeInstances,
    DescribeInstanceTypes,
    DescribeSubnets,
    DescribeNetworkInterfaces,
    CreateNetworkInterface,
    AttachNetworkInterface,
    ModifyNetworkInterfaceAttribute,
    DetachNetworkInterface,
    DeleteNetworkInterface,
    /// `assign_ips` (by count).
    AssignPrivateIpAddresses,
    /// `assign_specific_ips` (explicit addresses). Same EC2 action, counted apart.
    AssignSpecificPrivateIpAddresses,
    UnassignPrivateIpAddresses,
    /// `assign_prefixes` (AssignPrivateIpAddresses with Ipv4PrefixCount). Counted apart.
    AssignIpv4Prefixes,
    /// `unassign_prefixes` (UnassignPrivateIpAddresses with Ipv4Prefix.N). Counted apart.
    UnassignIpv4Prefixes,
    /// GetSubnetCidrReservations.
    GetSubnetCidrReservations,
    CreateTags,
    /// IMDS `identity()`.
    MetadataIdentity,
    /// IMDS `interfaces()`.
    MetadataInterfaces,
    /// IMDS `interface(mac)`.
    MetadataInterface,
}

impl Action {
    /// The EC2 action name (or `imds:...` for metadata reads).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DescribeInstances => "DescribeInstances",
            Self::DescribeInstanceTypes => "DescribeInstanceTypes",
            Self::DescribeSubnets => "DescribeSubnets",
            Self::DescribeNetworkInterfaces => "DescribeNetworkInterfaces",
            Self::CreateNetworkInterface => "CreateNetworkInterface",
            Self::AttachNetworkInterface => "AttachNetworkInterface",
            Self::ModifyNetworkInterfaceAttribute => "ModifyNetworkInterfaceAttribute",
            Self::DetachNetworkInterface => "DetachNetworkInterface",
            Self::DeleteNetworkInterface => "DeleteNetworkInterface",
            Self::AssignPrivateIpAddresses => "AssignPrivateIpAddresses",
            Self::AssignSpecificPrivateIpAddresses => "AssignPrivateIpAddresses(specific)",
            Self::UnassignPrivateIpAddresses => "UnassignPrivateIpAddresses",
            Self::AssignIpv4Prefixes => "AssignPrivateIpAddresses(prefix)",
            Self::UnassignIpv4Prefixes => "UnassignPrivateIpAddresses(prefix)",
            Self::GetSubnetCidrReservations => "GetSubnetCidrReservations",
            Self::CreateTags => "CreateTags",
            Self::MetadataIdentity => "imds:identity",
            Self::MetadataInterfaces => "imds:interfaces",
            Self::MetadataInterface => "imds:interface",
        }
    }

    /// Whether this is an EC2 API call (as opposed to an IMDS read).
    pub fn is_ec2(self) -> bool {
        !matches!(
            self,
            Self::MetadataIdentity | Self::MetadataInterfaces | Self::MetadataInterface
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded call: what was asked, with which arguments, and the error it returned, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    pub action: Action,
    /// The arguments, rendered as `key=value` pairs.
    pub args: String,
    /// `Some` when the call failed (injected or a real rejection by the fake).
    pub error: Option<CloudError>,
}

/// The node [`MemoryCloud::with_node`] builds: instance type, limits, subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub cluster_name: String,
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub vpc_id: String,
    pub vpc_cidr: Ipv4Net,
    pub subnet_id: String,
    /// The subnet's CIDR. AWS reserves the first four addresses and the last one; the rest are usable.
    pub subnet_cidr: Ipv4Net,
    pub security_groups: Vec<String>,
    pub limits: InstanceLimits,
    /// Seed of the random generator behind [`MemoryCloud::fail_rate`].
    pub seed: u64,
}

impl Default for NodeSpec {
    /// An `m5.large`-like node: 3 ENIs × 10 IPv4 each, in a /24 subnet of 10.0.0.0/16.
    fn default() -> Self {
        Self {
            cluster_name: "test-cluster".into(),
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: "m5.large".into(),
            availability_zone: "us-east-1a".into(),
            vpc_id: "vpc-0a1b2c3d".into(),
            vpc_cidr: "10.0.0.0/16".parse().expect("valid CIDR"),
            subnet_id: "subnet-0a1b2c3d".into(),
            subnet_cidr: "10.0.1.0/24".parse().expect("valid CIDR"),
            security_groups: vec!["sg-0a1b2c3d".into()],
            limits: InstanceLimits::new(3, 10),
            seed: 0x5eed,
        }
    }
}

struct MemSubnet {
    id: String,
    vpc_id: String,
    cidr: Ipv4Net,
    availability_zone: String,
    /// Addresses in use (by our ENIs or taken by "others" through `take_subnet_ips`).
    used: BTreeSet<Ipv4Addr>,
}

impl MemSubnet {
    fn usable(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        let first = u32::from(self.cidr.network()) + 4;
        let last = u32::from(self.cidr.broadcast()).saturating_sub(1);
        (first..=last).map(Ipv4Addr::from)
    }

    fn free_count(&self) -> u32 {
        let total = self.usable().count();
        let used = self.used.iter().filter(|ip| self.is_usable(**ip)).count();
        u32::try_from(total - used).unwrap_or(u32::MAX)
    }

    fn is_usable(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(ip);
        n >= u32::from(self.cidr.network()) + 4 && n < u32::from(self.cidr.broadcast())
    }

    /// Takes the `count` lowest free addresses, or fails without taking any.
    fn allocate(&mut self, api: &str, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        let free: Vec<Ipv4Addr> = self
            .usable()
            .filter(|ip| !self.used.contains(ip))
            .take(count as usize)
            .collect();
        if free.len() < count as usize {
            return Err(CloudError::SubnetFull {
                api: api.into(),
                message: format!(
                    "subnet {} has {} free addresses, {count} requested",
                    self.id,
                    free.len()
                ),
            });
        }
        self.used.extend(free.iter().copied());
        Ok(free)
    }

    /// Takes the `count` lowest aligned `/28` blocks with every address free (EC2 never hands out
    /// a prefix overlapping the subnet's reserved first four or last address), or none.
    fn allocate_prefixes(&mut self, api: &str, count: u32) -> CloudResult<Vec<Ipv4Net>> {
        let network = u32::from(self.cidr.network());
        let broadcast = u32::from(self.cidr.broadcast());
        let mut blocks = Vec::new();
        let mut start = network;
        while start + 15 <= broadcast && blocks.len() < count as usize {
            let all_free = (start..=start + 15).all(|n| {
                let ip = Ipv4Addr::from(n);
                self.is_usable(ip) && !self.used.contains(&ip)
            });
            if all_free {
                blocks.push(Ipv4Net::new(Ipv4Addr::from(start), 28).expect("a /28 is valid"));
            }
            start += 16;
        }
        if blocks.len() < count as usize {
            return Err(CloudError::NoFreePrefix {
                api: api.into(),
                message: format!(
                    "subnet {} has {} free /28 blocks, {count} requested",
                    self.id,
                    blocks.len()
                ),
            });
        }
        for block in &blocks {
            self.used
                .extend(eniipam::pool::slots::prefix_addresses(*block));
        }
        Ok(blocks)
    }
}

struct MemInstance {
    spec: NodeSpec,
    primary_mac: String,
}

#[derive(Default)]
struct Faults {
    next: HashMap<Action, VecDeque<CloudError>>,
    rate: HashMap<Action, (f64, CloudError)>,
}

struct MemoryState {
    instance: MemInstance,
    subnet: MemSubnet,
    enis: BTreeMap<EniId, Eni>,
    client_tokens: HashMap<String, EniId>,
    calls: Vec<CallRecord>,
    faults: Faults,
    latency: HashMap<Action, Duration>,
    rng: StdRng,
    next_id: u64,
}

impl MemoryState {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn new_eni_id(&mut self) -> EniId {
        let n = self.next_id();
        format!("eni-{n:017x}")
            .parse()
            .expect("generated ENI ids are well formed")
    }

    fn new_mac(&mut self) -> String {
        let n = self.next_id();
        format!(
            "02:00:00:{:02x}:{:02x}:{:02x}",
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    fn eni_mut(&mut self, api: &str, id: &EniId) -> CloudResult<&mut Eni> {
        self.enis.get_mut(id).ok_or_else(|| eni_not_found(api, id))
    }

    fn attached(&self) -> Vec<&Eni> {
        let mut enis: Vec<&Eni> = self
            .enis
            .values()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == self.instance.spec.instance_id)
            })
            .collect();
        enis.sort_by_key(|e| e.attachment.as_ref().map(|a| a.device_index));
        enis
    }

    /// Injected faults first (fail-next queue, then the rate), then the call is recorded.
    fn check_fault(&mut self, action: Action) -> CloudResult<()> {
        if let Some(err) = self
            .faults
            .next
            .get_mut(&action)
            .and_then(VecDeque::pop_front)
        {
            return Err(err);
        }
        if let Some((rate, err)) = self.faults.rate.get(&action).cloned()
            && self.rng.random::<f64>() < rate
        {
            return Err(err);
        }
        Ok(())
    }

    fn metadata_eni(&self, eni: &Eni) -> MetadataEni {
        MetadataEni {
            mac: eni.mac.clone(),
            eni_id: eni.id.clone(),
            device_number: eni.attachment.as_ref().map_or(0, |a| a.device_index),
            subnet_id: eni.subnet_id.clone(),
            vpc_id: eni.vpc_id.clone(),
            subnet_cidr: self.subnet.cidr,
            vpc_cidrs: vec![self.instance.spec.vpc_cidr],
            security_groups: eni.security_groups.clone(),
            ips: std::iter::once(eni.primary_ip)
                .chain(eni.secondary_ips.iter().copied())
                .collect(),
            ipv4_prefixes: eni.ipv4_prefixes.clone(),
        }
    }
}

fn eni_not_found(api: &str, id: &EniId) -> CloudError {
    CloudError::NotFound {
        api: api.into(),
        code: "InvalidNetworkInterfaceID.NotFound".into(),
        message: format!("the network interface {id} does not exist"),
    }
}

fn rejected(api: &str, code: &str, message: impl Into<String>) -> CloudError {
    CloudError::Rejected {
        api: api.into(),
        code: code.into(),
        message: message.into(),
    }
}

/// An in-memory EC2 + IMDS for one node. See the module docs.
pub struct MemoryCloud {
    state: Mutex<MemoryState>,
}

impl fmt::Debug for MemoryCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("MemoryCloud")
            .field("instance_id", &st.instance.spec.instance_id)
            .field("enis", &st.enis.len())
            .field("calls", &st.calls.len())
            .finish()
    }
}

impl MemoryCloud {
    /// Builds the VPC, the subnet and the instance of `spec`, with its primary ENI (eth0, device 0)
    /// attached, and returns the cloud with the node's [`NodeContext`].
    pub fn with_node(spec: NodeSpec) -> (Arc<Self>, NodeContext) {
        let mut subnet = MemSubnet {
            id: spec.subnet_id.clone(),
            vpc_id: spec.vpc_id.clone(),
            cidr: spec.subnet_cidr,
            availability_zone: spec.availability_zone.clone(),
            used: BTreeSet::new(),
        };
        let primary_ip = subnet
            .allocate("RunInstances", 1)
            .expect("the node's subnet has room for the primary ENI")[0];
        let node = NodeContext {
            cluster_name: spec.cluster_name.clone(),
            instance_id: spec.instance_id.clone(),
            instance_type: spec.instance_type.clone(),
            availability_zone: spec.availability_zone.clone(),
            vpc_id: spec.vpc_id.clone(),
            subnet_id: spec.subnet_id.clone(),
            security_groups: spec.security_groups.clone(),
            limits: spec.limits,
            pod_subnets: Vec::new(),
        };
        let mut state = MemoryState {
            instance: MemInstance {
                spec: spec.clone(),
                primary_mac: String::new(),
            },
            subnet,
            enis: BTreeMap::new(),
            client_tokens: HashMap::new(),
            calls: Vec::new(),
            faults: Faults::default(),
            latency: HashMap::new(),
            rng: StdRng::seed_from_u64(spec.seed),
            next_id: 0,
        };
        let id = state.new_eni_id();
        let mac = state.new_mac();
        state.instance.primary_mac = mac.clone();
        let attachment_id = format!("eni-attach-{:017x}", state.next_id());
        state.enis.insert(
            id.clone(),
            Eni {
                id,
                mac,
                subnet_id: spec.subnet_id.clone(),
                vpc_id: spec.vpc_id.clone(),
                availability_zone: spec.availability_zone.clone(),
                description: "primary network interface".into(),
                status: EniStatus::InUse,
                primary_ip,
                secondary_ips: Vec::new(),
                ipv4_prefixes: Vec::new(),
                security_groups: spec.security_groups.clone(),
                attachment: Some(EniAttachment {
                    attachment_id,
                    instance_id: spec.instance_id.clone(),
                    device_index: 0,
                    status: AttachmentStatus::Attached,
                    delete_on_termination: true,
                }),
                tags: BTreeMap::new(),
            },
        );
        (
            Arc::new(Self {
                state: Mutex::new(state),
            }),
            node,
        )
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // A panic while holding the lock is a test failure already; keep serving the state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next `times` calls of `action` fail with `error` (queued after any already injected).
    pub fn fail_next(&self, action: Action, times: usize, error: CloudError) {
        let mut st = self.lock();
        let queue = st.faults.next.entry(action).or_default();
        queue.extend(std::iter::repeat_n(error, times));
    }

    /// A random fraction `rate` (0.0..=1.0) of the calls of `action` fail with `error`.
    pub fn fail_rate(&self, action: Action, rate: f64, error: CloudError) {
        self.lock()
            .faults
            .rate
            .insert(action, (rate.clamp(0.0, 1.0), error));
    }

    /// Forgets every injected fault.
    pub fn clear_faults(&self) {
        self.lock().faults = Faults::default();
    }

    /// Every call of `action` sleeps `latency` (tokio time) before it runs.
    pub fn set_latency(&self, action: Action, latency: Duration) {
        self.lock().latency.insert(action, latency);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.clone()
    }

    /// The calls of one action so far, in order.
    pub fn calls_of(&self, action: Action) -> Vec<CallRecord> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.action == action)
            .cloned()
            .collect()
    }

    /// How many times `action` was called (failed calls included).
    pub fn call_count(&self, action: Action) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.action == action)
            .count()
    }

    /// How many EC2 API calls were made (IMDS reads excluded).
    pub fn ec2_call_count(&self) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.action.is_ec2())
            .count()
    }

    /// Forgets the recorded calls.
    pub fn reset_calls(&self) {
        self.lock().calls.clear();
    }

    /// One ENI as EC2 would describe it.
    pub fn eni(&self, id: &EniId) -> Option<Eni> {
        self.lock().enis.get(id).cloned()
    }

    /// Every ENI in the VPC, attached or not.
    pub fn enis(&self) -> Vec<Eni> {
        self.lock().enis.values().cloned().collect()
    }

    /// The ENIs attached to the node, by device index.
    pub fn attached_enis(&self) -> Vec<Eni> {
        self.lock().attached().into_iter().cloned().collect()
    }

    /// Every secondary IP on every ENI.
    pub fn secondary_ips(&self) -> BTreeSet<Ipv4Addr> {
        self.lock()
            .enis
            .values()
            .flat_map(|e| e.secondary_ips.iter().copied())
            .collect()
    }

    /// Free addresses left in the subnet.
    pub fn subnet_free(&self) -> u32 {
        self.lock().subnet.free_count()
    }

    /// Marks `count` free subnet addresses as used by someone else (other nodes), to make the subnet
    /// run out; returns them. Takes as many as there are when fewer are free.
    pub fn take_subnet_ips(&self, count: u32) -> Vec<Ipv4Addr> {
        let mut st = self.lock();
        let free = st.subnet.free_count();
        st.subnet
            .allocate("test", count.min(free))
            .expect("taking no more than what is free")
    }

    /// Puts these addresses on an ENI of another node (attached to `i-another`), as EC2's
    /// automatic picks spread over a subnet would: one in a `/28` breaks the whole block for
    /// prefixes. Unlike [`Self::take_subnet_ips`], DescribeNetworkInterfaces shows them.
    pub fn another_node_takes(&self, ips: &[Ipv4Addr]) -> EniId {
        let mut st = self.lock();
        for ip in ips {
            assert!(st.subnet.used.insert(*ip), "{ip} is already in use");
        }
        let id = st.new_eni_id();
        let mac = st.new_mac();
        let attachment_id = format!("eni-attach-{:017x}", st.next_id());
        let spec = st.instance.spec.clone();
        let eni = Eni {
            id: id.clone(),
            mac,
            subnet_id: spec.subnet_id.clone(),
            vpc_id: spec.vpc_id.clone(),
            availability_zone: spec.availability_zone.clone(),
            description: "another node's ENI".into(),
            status: EniStatus::InUse,
            primary_ip: ips[0],
            secondary_ips: ips[1..].to_vec(),
            ipv4_prefixes: Vec::new(),
            security_groups: spec.security_groups.clone(),
            attachment: Some(EniAttachment {
                attachment_id,
                instance_id: "i-another".into(),
                device_index: 1,
                status: AttachmentStatus::Attached,
                delete_on_termination: true,
            }),
            tags: BTreeMap::new(),
        };
        st.enis.insert(id.clone(), eni);
        id
    }

    /// Marks these addresses used with no ENI showing them (taken between a describe and an
    /// assign, as far as the pool can tell).
    pub fn take_specific_hidden(&self, ips: &[Ipv4Addr]) {
        let mut st = self.lock();
        for ip in ips {
            assert!(st.subnet.used.insert(*ip), "{ip} is already in use");
        }
    }

    /// Another node's ENI goes away with its addresses.
    pub fn another_node_leaves(&self, eni: &EniId) {
        let mut st = self.lock();
        if let Some(e) = st.enis.remove(eni) {
            st.subnet.used.remove(&e.primary_ip);
            for ip in e.pod_addresses() {
                st.subnet.used.remove(&ip);
            }
        }
    }

    /// Gives back addresses taken with [`Self::take_subnet_ips`].
    pub fn free_subnet_ips(&self, ips: &[Ipv4Addr]) {
        let mut st = self.lock();
        for ip in ips {
            st.subnet.used.remove(ip);
        }
    }

    /// Runs one call: latency, injected fault, then `f` on the state; records it either way.
    async fn call<T>(
        &self,
        action: Action,
        args: String,
        f: impl FnOnce(&mut MemoryState) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let latency = self.lock().latency.get(&action).copied();
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.lock();
        let result = st.check_fault(action).and_then(|()| f(&mut st));
        st.calls.push(CallRecord {
            action,
            args,
            error: result.as_ref().err().cloned(),
        });
        result
    }
}

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
            "subnet={} secondary_ip_count={} prefix_count={} private_ips={:?} client_token={} tags={:?}",
            req.subnet_id,
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
                    eniipam::cloud::ADDRESS_IN_USE,
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
                        .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p))
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
            let per_eni = st.instance.spec.limits.ipv4_per_eni;
            let held = {
                let e = st.enis.get(eni).ok_or_else(|| eni_not_found(name, eni))?;
                1 + e.secondary_ips.len() as u32 + e.ipv4_prefixes.len() as u32
            };
            if held + count > per_eni {
                return Err(CloudError::IpLimitExceeded {
                    api: name.into(),
                    message: format!(
                        "{eni} holds {held} addresses, {count} more would exceed the limit of {per_eni}"
                    ),
                });
            }
            let ips = st.subnet.allocate(name, count)?;
            st.eni_mut(name, eni)?.secondary_ips.extend(ips.iter().copied());
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
            let held = {
                let e = st.enis.get(eni).ok_or_else(|| eni_not_found(name, eni))?;
                1 + e.secondary_ips.len() as u32 + e.ipv4_prefixes.len() as u32
            };
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
                        eniipam::cloud::ADDRESS_IN_USE,
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
            if let Some(ip) = ips.iter().find(|ip| !e.secondary_ips.contains(ip)) {
                return Err(rejected(
                    name,
                    "InvalidParameterValue",
                    format!("{ip} is not a secondary address of {eni}"),
                ));
            }
            e.secondary_ips.retain(|ip| !ips.contains(ip));
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
            let per_eni = st.instance.spec.limits.ipv4_per_eni;
            let held = {
                let e = st.enis.get(eni).ok_or_else(|| eni_not_found(name, eni))?;
                1 + e.secondary_ips.len() as u32 + e.ipv4_prefixes.len() as u32
            };
            if held + count > per_eni {
                return Err(CloudError::IpLimitExceeded {
                    api: name.into(),
                    message: format!(
                        "{eni} holds {held} addresses and prefixes, {count} more would exceed the limit of {per_eni}"
                    ),
                });
            }
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
            if let Some(p) = prefixes.iter().find(|p| !e.ipv4_prefixes.contains(p)) {
                return Err(rejected(
                    name,
                    "InvalidParameterValue",
                    format!("{p} is not a prefix of {eni}"),
                ));
            }
            e.ipv4_prefixes.retain(|p| !prefixes.contains(p));
            for ip in prefixes
                .iter()
                .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p))
            {
                st.subnet.used.remove(&ip);
            }
            Ok(())
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
                }]
            } else {
                Vec::new()
            })
        })
        .await
    }

    async fn subnet_prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>> {
        let api = Action::GetSubnetCidrReservations;
        self.call(api, format!("subnet={subnet_id}"), |_| Ok(Vec::new()))
            .await
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
}

#[async_trait]
impl Metadata for MemoryCloud {
    async fn identity(&self) -> CloudResult<InstanceIdentity> {
        self.call(Action::MetadataIdentity, String::new(), |st| {
            let spec = &st.instance.spec;
            Ok(InstanceIdentity {
                instance_id: spec.instance_id.clone(),
                instance_type: spec.instance_type.clone(),
                availability_zone: spec.availability_zone.clone(),
                mac: st.instance.primary_mac.clone(),
            })
        })
        .await
    }

    async fn interfaces(&self) -> CloudResult<Vec<MetadataEni>> {
        self.call(Action::MetadataInterfaces, String::new(), |st| {
            Ok(st
                .attached()
                .into_iter()
                .map(|e| st.metadata_eni(e))
                .collect())
        })
        .await
    }

    async fn interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>> {
        self.call(Action::MetadataInterface, format!("mac={mac}"), |st| {
            Ok(st
                .attached()
                .into_iter()
                .find(|e| e.mac == mac)
                .map(|e| st.metadata_eni(e)))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_req(count: u32, token: &str) -> CreateEni {
        CreateEni {
            subnet_id: NodeSpec::default().subnet_id,
            security_groups: vec![],
            description: "test".into(),
            secondary_ip_count: count,
            prefix_count: 0,
            private_ips: Vec::new(),
            tags: BTreeMap::new(),
            client_token: token.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn created_enis_show_in_metadata_and_limits_hold() {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
        let eni = cloud.create_eni(&create_req(3, "t1")).await.unwrap();
        assert_eq!(eni.secondary_ips.len(), 3);
        let again = cloud.create_eni(&create_req(3, "t1")).await.unwrap();
        assert_eq!(again.id, eni.id, "client token makes create idempotent");
        let attachment = cloud
            .attach_eni(&eni.id, &node.instance_id, 1)
            .await
            .unwrap();
        cloud
            .set_delete_on_termination(&eni.id, &attachment)
            .await
            .unwrap();
        let md = cloud
            .interface(&eni.mac)
            .await
            .unwrap()
            .expect("listed in IMDS");
        assert_eq!(md.device_number, 1);
        assert_eq!(md.ips.len(), 4);
        assert_eq!(md.ips[0], eni.primary_ip);

        let err = cloud.assign_ips(&eni.id, 7).await.unwrap_err();
        assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");
        let more = cloud.assign_ips(&eni.id, 6).await.unwrap();
        assert_eq!(more.len(), 6);

        let e2 = cloud.create_eni(&create_req(1, "t2")).await.unwrap();
        cloud
            .attach_eni(&e2.id, &node.instance_id, 2)
            .await
            .unwrap();
        let e3 = cloud.create_eni(&create_req(1, "t3")).await.unwrap();
        let err = cloud
            .attach_eni(&e3.id, &node.instance_id, 3)
            .await
            .unwrap_err();
        assert!(
            matches!(err, CloudError::AttachmentLimitExceeded { .. }),
            "{err}"
        );

        let err = cloud.delete_eni(&eni.id).await.unwrap_err();
        assert!(
            matches!(err, CloudError::Rejected { .. }),
            "in-use delete: {err}"
        );
        cloud.detach_eni(&attachment, false).await.unwrap();
        cloud.delete_eni(&eni.id).await.unwrap();
        assert!(cloud.eni(&eni.id).is_none());
        assert_eq!(cloud.call_count(Action::CreateNetworkInterface), 3 + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn subnet_runs_out_and_faults_are_injected() {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec {
            subnet_cidr: "10.0.1.0/28".parse().unwrap(),
            ..NodeSpec::default()
        });
        // /28: 16 addresses, 5 reserved, 1 taken by eth0.
        assert_eq!(cloud.subnet_free(), 10);
        let eni = cloud.create_eni(&create_req(9, "t")).await.unwrap();
        assert_eq!(cloud.subnet_free(), 0);
        cloud
            .attach_eni(&eni.id, &node.instance_id, 1)
            .await
            .unwrap();
        let err = cloud.create_eni(&create_req(1, "u")).await.unwrap_err();
        assert!(err.is_capacity(), "{err}");

        cloud
            .unassign_ips(&eni.id, &eni.secondary_ips[..2])
            .await
            .unwrap();
        assert_eq!(cloud.subnet_free(), 2);
        let injected = CloudError::Transient {
            api: "AssignPrivateIpAddresses".into(),
            message: "boom".into(),
        };
        cloud.fail_next(Action::AssignPrivateIpAddresses, 2, injected.clone());
        assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap_err(), injected);
        assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap_err(), injected);
        assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap().len(), 1);
        let calls = cloud.calls_of(Action::AssignPrivateIpAddresses);
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].error.as_ref(), Some(&injected));
        assert!(calls[2].error.is_none());
        assert!(calls[2].args.contains("count=1"));

        cloud.fail_rate(Action::DescribeSubnets, 1.0, injected.clone());
        assert!(cloud.describe_subnet(&node.subnet_id).await.is_err());
        cloud.clear_faults();
        assert_eq!(
            cloud
                .describe_subnet(&node.subnet_id)
                .await
                .unwrap()
                .available_ips,
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn latency_uses_tokio_time() {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
        cloud.set_latency(Action::DescribeInstances, Duration::from_secs(2));
        let start = tokio::time::Instant::now();
        let inst = cloud.describe_instance(&node.instance_id).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(inst.enis.len(), 1);
        assert_eq!(inst.enis[0].attachment.as_ref().unwrap().device_index, 0);
    }
}
