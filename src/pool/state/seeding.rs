//! Building the pool's state from the startup seed: ENIs with their roles, allocations, idle IPs with
//! their cooldowns and reservations, and the capacity tokens they hold.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;

use tokio::time::{Duration, Instant};

use super::{EniRecord, EniRole, PoolState, Quarantine, SubnetRecord};
use crate::cloud::{NodeContext, Subnet};
use crate::model::EniId;
use crate::pool::capacity::{CapacityTokens, node_capacity};
use crate::pool::config::PoolConfig;
use crate::pool::demand::Demand;
use crate::pool::idle::{IdleQueue, Reservation};
use crate::pool::pod_network::PodNetwork;
use crate::pool::profiles::profile_of;
use crate::pool::seed::{PoolSeed, SeedError};
use crate::pool::slots::prefix_addresses;
use crate::pool::types::{AllocationRecord, EniPhase};

impl PoolState {
    /// Builds the state from a startup seed, without actors (the caller spawns them).
    pub fn from_seed(
        config: PoolConfig,
        node: NodeContext,
        seed: PoolSeed,
        now: Instant,
    ) -> Result<Self, SeedError> {
        let max_enis = config
            .max_enis
            .map_or(node.limits.max_enis, |cap| cap.min(node.limits.max_enis));
        let per_eni = node.limits.eni_limits().slots_per_eni();
        let mut st = Self {
            capacity: CapacityTokens::new(0),
            idle: IdleQueue::new(),
            allocations: HashMap::new(),
            assigned: HashMap::new(),
            pending: HashMap::new(),
            enis: BTreeMap::new(),
            creating: BTreeMap::new(),
            create_waiters: VecDeque::new(),
            warm_waiters: VecDeque::new(),
            subnets: BTreeMap::new(),
            releasing: BTreeMap::new(),
            quarantined: BTreeMap::new(),
            held_back: BTreeMap::new(),
            unconfirmed: Default::default(),
            warming: 0,
            demand: Demand::default(),
            max_enis,
            per_eni,
            pod_subnets: if node.pod_subnets.is_empty() {
                vec![node.subnet_id.clone()]
            } else {
                node.pod_subnets.iter().map(|s| s.id.clone()).collect()
            },
            pod_network: if config.custom_networking {
                PodNetwork::Unavailable {
                    reason: "custom networking is on and the node's ENIConfig is not known yet"
                        .into(),
                }
            } else {
                PodNetwork::Discovered
            },
            profiles: BTreeMap::new(),
            next_create_id: 0,
            growth_contended: false,
            assign_contended: false,
            first_warm_pending: true,
            launch_floor: 0,
            shutting_down: false,
            config,
            node,
        };
        for subnet in st.node.pod_subnets.clone() {
            st.learn_subnet(subnet);
        }
        let mut ip_owner: HashMap<Ipv4Addr, EniId> = HashMap::new();
        let mut by_index: HashMap<u32, EniId> = HashMap::new();
        let mut foreign = 0;
        for e in seed.enis {
            if let Some(first) = by_index.insert(e.device_index, e.id.clone()) {
                return Err(SeedError::DuplicateDeviceIndex {
                    device_index: e.device_index,
                    first,
                    second: e.id,
                });
            }
            let role = if e.device_index == 0 {
                EniRole::Primary
            } else if e.managed {
                EniRole::Pods
            } else {
                foreign += 1;
                EniRole::Foreign
            };
            let in_prefixes: Vec<Ipv4Addr> = e
                .prefixes
                .iter()
                .flat_map(|p| prefix_addresses(*p))
                .collect();
            // An address listed both as a secondary IP and inside one of the same ENI's prefixes
            // (a source that lists a prefix's addresses one by one, such as the journal) is one
            // address of that ENI; only another ENI's claim is a conflict.
            for ip in std::iter::once(e.primary_ip)
                .chain(e.secondary_ips.iter().copied())
                .chain(in_prefixes.iter().copied())
            {
                if ip_owner
                    .insert(ip, e.id.clone())
                    .is_some_and(|owner| owner != e.id)
                {
                    return Err(SeedError::DuplicateIp { ip });
                }
            }
            let serves =
                role == EniRole::Pods || (role == EniRole::Primary && st.config.use_primary_eni);
            st.subnets.entry(e.subnet_id.clone()).or_insert_with(|| {
                SubnetRecord::new(Some(Subnet {
                    id: e.subnet_id.clone(),
                    vpc_id: st.node.vpc_id.clone(),
                    cidr: e.subnet_cidr,
                    availability_zone: st.node.availability_zone.clone(),
                    available_ips: 0,
                    tags: Default::default(),
                    ipv6_cidrs: Vec::new(),
                }))
            });
            let (ips, prefixes) = if serves {
                (
                    e.secondary_ips.iter().copied().chain(in_prefixes).collect(),
                    e.prefixes.iter().copied().collect(),
                )
            } else {
                (BTreeSet::new(), BTreeSet::new())
            };
            st.enis.insert(
                e.id.clone(),
                EniRecord {
                    id: e.id,
                    mac: e.mac,
                    device_index: e.device_index,
                    subnet_id: e.subnet_id,
                    primary_ip: e.primary_ip,
                    role,
                    serves,
                    profile: e.profile.or_else(|| e.eni.as_ref().and_then(profile_of)),
                    ips,
                    prefixes,
                    inflight: 0,
                    phase: EniPhase::Serving,
                    release_retry_at: None,
                    cloud: e.eni,
                    handle: None,
                    task: None,
                },
            );
        }
        st.capacity = CapacityTokens::new(node_capacity(st.node.limits, &st.config, foreign));
        let pod_eni_of = |st: &Self, ip: Ipv4Addr| {
            ip_owner
                .get(&ip)
                .filter(|id| {
                    st.enis
                        .get(*id)
                        .is_some_and(|r| r.serves && r.ips.contains(&ip))
                })
                .cloned()
        };
        for a in seed.allocations {
            let Some(eni) = pod_eni_of(&st, a.ip) else {
                return Err(SeedError::UnknownIp {
                    ip: a.ip,
                    attachment: a.attachment,
                });
            };
            if let Some(first) = st.assigned.get(&a.ip) {
                return Err(SeedError::IpAssignedTwice {
                    ip: a.ip,
                    first: first.clone(),
                    second: a.attachment,
                });
            }
            if let Some(first) = st.allocations.get(&a.attachment) {
                return Err(SeedError::DuplicateAttachment {
                    attachment: a.attachment,
                    first: first.ip,
                    second: a.ip,
                });
            }
            st.assigned.insert(a.ip, a.attachment.clone());
            let network = st.enis.get(&eni).and_then(|r| r.profile.clone());
            st.allocations.insert(
                a.attachment,
                AllocationRecord {
                    ip: a.ip,
                    eni,
                    pod: a.pod,
                    sticky_key: a.sticky_key,
                    meta: a.meta,
                    since: now,
                    network,
                },
            );
        }
        for q in seed.quarantined {
            let Some(eni) = pod_eni_of(&st, q.ip) else {
                return Err(SeedError::UnknownQuarantined { ip: q.ip });
            };
            if st.assigned.contains_key(&q.ip) || st.quarantined.contains_key(&q.ip) {
                return Err(SeedError::QuarantinedTwice { ip: q.ip });
            }
            st.quarantined.insert(
                q.ip,
                Quarantine {
                    eni,
                    since: q.since,
                    reason: q.reason,
                },
            );
        }
        st.launch_floor = seed.idle.iter().filter(|i| i.fresh).count() as u32;
        let idle_info: HashMap<Ipv4Addr, _> = seed.idle.into_iter().map(|i| (i.ip, i)).collect();
        let cooldown = st.config.reuse_cooldown;
        let mut held = 0;
        let pod_ips: Vec<(Ipv4Addr, EniId)> = st
            .enis
            .values()
            .filter(|r| r.serves)
            .flat_map(|r| r.ips.iter().map(|ip| (*ip, r.id.clone())))
            .collect();
        for (ip, eni) in pod_ips {
            held += 1;
            if st.assigned.contains_key(&ip) || st.quarantined.contains_key(&ip) {
                continue;
            }
            match idle_info.get(&ip) {
                Some(info) => {
                    let reservation = info.reserved.as_ref().map(|(key, until)| Reservation {
                        key: key.clone(),
                        until: *until,
                    });
                    let cooldown = if info.fresh { Duration::ZERO } else { cooldown };
                    st.idle
                        .push(ip, eni, info.idle_since, cooldown, reservation);
                }
                None => st.idle.push(ip, eni, now, cooldown, None),
            }
        }
        st.capacity.take_existing(held);
        Ok(st)
    }
}
