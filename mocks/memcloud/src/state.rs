//! The node [`NodeSpec`] describes, and the fake's state behind its one mutex: the subnet, the
//! instance, the ENIs, the recorded calls and the faults to inject.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use rand::Rng;
use rand::rngs::StdRng;

use eniipam_api::model::EniId;
use eniipam_cloud::{CloudError, CloudResult, Eni, InstanceLimits, MetadataEni};

use crate::ipv6_block::MemIpv6;
use crate::{Action, CallRecord};

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
    /// The VPC's IPv6 block (`None`: an IPv4-only VPC).
    pub vpc_ipv6_cidr: Option<Ipv6Net>,
    /// The subnet's IPv6 /64, from which ENIs take `/80` prefixes (`None`: an IPv4-only subnet).
    pub subnet_ipv6_cidr: Option<Ipv6Net>,
}

impl Default for NodeSpec {
    /// An `m5.large`-like node: 3 ENIs × 10 IPv4 each, in a /24 subnet of 10.0.0.0/16; the VPC
    /// has a /56 and the subnet a /64 of it, as mockcloud's default world does.
    fn default() -> Self {
        let (vpc6, subnet6) = crate::ipv6_block::default_blocks();
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
            vpc_ipv6_cidr: Some(vpc6),
            subnet_ipv6_cidr: Some(subnet6),
        }
    }
}

pub(crate) struct MemSubnet {
    pub(crate) id: String,
    pub(crate) vpc_id: String,
    pub(crate) cidr: Ipv4Net,
    pub(crate) availability_zone: String,
    /// Addresses in use (by our ENIs or taken by "others" through `take_subnet_ips`).
    pub(crate) used: BTreeSet<Ipv4Addr>,
    /// The subnet's IPv6 block and the `/80`s delegated from it (`None`: IPv4 only).
    pub(crate) ipv6: Option<MemIpv6>,
    /// Its `prefix` CIDR reservations (`reservations.rs`).
    pub(crate) reservations: Vec<crate::MemReservation>,
}

impl MemSubnet {
    pub(crate) fn usable(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        let first = u32::from(self.cidr.network()) + 4;
        let last = u32::from(self.cidr.broadcast()).saturating_sub(1);
        (first..=last).map(Ipv4Addr::from)
    }

    pub(crate) fn free_count(&self) -> u32 {
        let total = self.usable().count();
        let used = self.used.iter().filter(|ip| self.is_usable(**ip)).count();
        u32::try_from(total - used).unwrap_or(u32::MAX)
    }

    pub(crate) fn is_usable(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(ip);
        n >= u32::from(self.cidr.network()) + 4 && n < u32::from(self.cidr.broadcast())
    }

    /// Takes the `count` lowest free addresses outside every reservation, or fails without taking
    /// any.
    pub(crate) fn allocate(&mut self, api: &str, count: u32) -> CloudResult<Vec<Ipv4Addr>> {
        let free: Vec<Ipv4Addr> = self
            .usable()
            .filter(|ip| !self.used.contains(ip) && !self.in_reservation(*ip))
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

    /// Takes `count` aligned `/28` blocks with every address free (EC2 never hands out a prefix
    /// overlapping the subnet's reserved first four or last address), or none.
    pub(crate) fn allocate_prefixes(&mut self, api: &str, count: u32) -> CloudResult<Vec<Ipv4Net>> {
        let network = u32::from(self.cidr.network());
        let broadcast = u32::from(self.cidr.broadcast());
        let mut blocks = Vec::new();
        let mut start = network;
        while start + 15 <= broadcast {
            let all_free = (start..=start + 15).all(|n| {
                let ip = Ipv4Addr::from(n);
                self.is_usable(ip) && !self.used.contains(&ip)
            });
            if all_free {
                blocks.push(Ipv4Net::new(Ipv4Addr::from(start), 28).expect("a /28 is valid"));
            }
            start += 16;
        }
        // A reservation's blocks first (as EC2's automatic prefixes), each group lowest first.
        blocks.sort_by_key(|b| !self.inside_reservation(*b));
        blocks.truncate(count as usize);
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
            self.used.extend(eniipam_cloud::prefix_addresses(*block));
        }
        Ok(blocks)
    }
}

pub(crate) struct MemInstance {
    pub(crate) spec: NodeSpec,
    pub(crate) primary_mac: String,
}

#[derive(Default)]
pub(crate) struct Faults {
    pub(crate) next: HashMap<Action, VecDeque<CloudError>>,
    pub(crate) rate: HashMap<Action, (f64, CloudError)>,
}

pub(crate) struct MemoryState {
    pub(crate) instance: MemInstance,
    pub(crate) subnet: MemSubnet,
    pub(crate) enis: BTreeMap<EniId, Eni>,
    pub(crate) client_tokens: HashMap<String, EniId>,
    pub(crate) calls: Vec<CallRecord>,
    /// When each action last failed with a throttling error (for [`eniipam_cloud::Cloud::throttled_within`]).
    pub(crate) throttled_at: HashMap<Action, tokio::time::Instant>,
    pub(crate) faults: Faults,
    pub(crate) latency: HashMap<Action, Duration>,
    pub(crate) rng: StdRng,
    pub(crate) next_id: u64,
    /// The account's security groups by id: the node's ([`NodeSpec::security_groups`], in the
    /// node's VPC) and those [`crate::MemoryCloud::add_security_group`] adds.
    pub(crate) security_groups: BTreeMap<String, eniipam_cloud::SecurityGroup>,
}

impl MemoryState {
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn new_eni_id(&mut self) -> EniId {
        let n = self.next_id();
        format!("eni-{n:017x}")
            .parse()
            .expect("generated ENI ids are well formed")
    }

    pub(crate) fn new_mac(&mut self) -> String {
        let n = self.next_id();
        format!(
            "02:00:00:{:02x}:{:02x}:{:02x}",
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    pub(crate) fn eni_mut(&mut self, api: &str, id: &EniId) -> CloudResult<&mut Eni> {
        self.enis.get_mut(id).ok_or_else(|| eni_not_found(api, id))
    }

    /// What an ENI holds against its IPv4 limit: its primary, each secondary IP, each prefix.
    pub(crate) fn slots_held(&self, api: &str, id: &EniId) -> CloudResult<u32> {
        let e = self.enis.get(id).ok_or_else(|| eni_not_found(api, id))?;
        Ok(1 + e.secondary_ips.len() as u32 + e.ipv4_prefixes.len() as u32)
    }

    /// Whether an ENI has room for `count` more slots under the instance type's IPv4 limit;
    /// `IpLimitExceeded` naming what it holds (`what`) when not.
    pub(crate) fn room_for(
        &self,
        api: &str,
        id: &EniId,
        count: u32,
        what: &str,
    ) -> CloudResult<()> {
        let per_eni = self.instance.spec.limits.ipv4_per_eni;
        let held = self.slots_held(api, id)?;
        if held + count > per_eni {
            return Err(CloudError::IpLimitExceeded {
                api: api.into(),
                message: format!(
                    "{id} holds {held} {what}, {count} more would exceed the limit of {per_eni}"
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn attached(&self) -> Vec<&Eni> {
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
    pub(crate) fn check_fault(&mut self, action: Action) -> CloudResult<()> {
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

    pub(crate) fn metadata_eni(&self, eni: &Eni) -> MetadataEni {
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
            ipv6s: eni.ipv6_addresses.clone(),
            ipv6_prefixes: eni.ipv6_prefixes.clone(),
            subnet_ipv6_cidrs: self.subnet.ipv6.iter().map(|b| b.cidr).collect(),
            vpc_ipv6_cidrs: self.instance.spec.vpc_ipv6_cidr.into_iter().collect(),
        }
    }
}

pub(crate) fn eni_not_found(api: &str, id: &EniId) -> CloudError {
    CloudError::NotFound {
        api: api.into(),
        code: "InvalidNetworkInterfaceID.NotFound".into(),
        message: format!("the network interface {id} does not exist"),
    }
}

pub(crate) fn rejected(api: &str, code: &str, message: impl Into<String>) -> CloudError {
    CloudError::Rejected {
        api: api.into(),
        code: code.into(),
        message: message.into(),
    }
}

/// Removes every one of `gone` from `held`, or none: `InvalidParameterValue` naming the first that
/// `held` lacks (`what` says what `held` lists, as EC2's message does).
pub(crate) fn remove_all<T: PartialEq + std::fmt::Display>(
    api: &str,
    eni: &EniId,
    held: &mut Vec<T>,
    gone: &[T],
    what: &str,
) -> CloudResult<()> {
    if let Some(missing) = gone.iter().find(|g| !held.contains(g)) {
        return Err(rejected(
            api,
            "InvalidParameterValue",
            format!("{missing} is not {what} of {eni}"),
        ));
    }
    held.retain(|h| !gone.contains(h));
    Ok(())
}
