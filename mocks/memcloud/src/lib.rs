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
//!
//! Parts: [`MemoryCloud`] and its controls (this file), [`Action`] and [`CallRecord`] (`action.rs`),
//! [`NodeSpec`] and the fake's state (`state.rs`), the [`Cloud`] calls (`ec2.rs`), the [`Metadata`]
//! reads (`metadata.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use eniipam_api::model::EniId;
use eniipam_cloud::{
    AttachmentStatus, CloudError, CloudResult, Eni, EniAttachment, EniStatus, NodeContext,
};

mod action;
mod ec2;
mod ipv6;
mod ipv6_block;
mod metadata;
mod reservations;
mod state;
#[cfg(test)]
mod tests;

pub use action::{Action, CallRecord};
pub use reservations::MemReservation;
pub use state::NodeSpec;
use state::{Faults, MemInstance, MemSubnet, MemoryState};

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
            ipv6: spec.subnet_ipv6_cidr.map(|cidr| ipv6_block::MemIpv6 {
                cidr,
                held: BTreeSet::new(),
            }),
            reservations: Vec::new(),
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
            throttled_at: HashMap::new(),
            faults: Faults::default(),
            latency: HashMap::new(),
            rng: StdRng::seed_from_u64(spec.seed),
            next_id: 0,
            security_groups: spec
                .security_groups
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let name = if i == 0 {
                        "default".to_owned()
                    } else {
                        format!("node-{i}")
                    };
                    let g = eniipam_cloud::SecurityGroup {
                        id: id.clone(),
                        vpc_id: spec.vpc_id.clone(),
                        name,
                    };
                    (id.clone(), g)
                })
                .collect(),
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
                ipv6_addresses: Vec::new(),
                ipv6_prefixes: Vec::new(),
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

    /// Adds a security group to the account (in any VPC: one of another VPC lets a test see the
    /// daemon refuse it).
    pub fn add_security_group(&self, id: &str, vpc_id: &str, name: &str) {
        let g = eniipam_cloud::SecurityGroup {
            id: id.to_owned(),
            vpc_id: vpc_id.to_owned(),
            name: name.to_owned(),
        };
        self.lock().security_groups.insert(id.to_owned(), g);
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
            ipv6_addresses: Vec::new(),
            ipv6_prefixes: Vec::new(),
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
        if let Err(
            CloudError::Throttled { .. }
            | CloudError::RetriesExhausted {
                throttled: true, ..
            },
        ) = &result
        {
            st.throttled_at.insert(action, tokio::time::Instant::now());
        }
        st.calls.push(CallRecord {
            action,
            args,
            error: result.as_ref().err().cloned(),
        });
        result
    }
}
