//! The account bound of a cold scale-up: the least time EC2's account buckets need to serve the
//! calls the pattern cannot do without, whatever the nodes do and however well they batch.
//!
//! Per node, from its state at the pattern's start: it must hold one address per pod, so it needs
//! `need = pods − free` more. The room left on its attached pod ENIs is served by one batched
//! `AssignPrivateIpAddresses`; what does not fit needs new ENIs, each one `CreateNetworkInterface`
//! (carrying its addresses: `SecondaryPrivateIpAddressCount` or `Ipv4PrefixCount` in the create
//! itself, so no assign), `AttachNetworkInterface` and `ModifyNetworkInterfaceAttribute`
//! (delete-on-termination). Summed over the nodes, that is `calls` per API. Each API has its own bucket (burst `b`,
//! refill `r`/s, mockcloud's defaults = EC2's table): the first `b` calls go at once, the rest at
//! `r` per second, so the account needs at least `max over APIs of max(0, (calls − b) / r)` seconds.
//! No pod of the last node served can start before then; latency (create, attach, IMDS) comes on
//! top and is not in the bound.

use std::collections::BTreeMap;

use eniipam::pool::snapshot::PoolSnapshot;
use mockcloud::Throttling;

/// The EC2 APIs a node's growth goes through, in the order they are made.
pub const GROWTH_APIS: [&str; 4] = [
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
];

/// A node at the pattern's start, as far as its growth needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStart {
    /// Free IPs any pod may take.
    pub free: u32,
    /// Addresses its attached pod ENIs can still take (whole `/28`s with prefix delegation).
    pub room: u32,
    /// Addresses one new ENI can take.
    pub per_new_eni: u32,
    /// ENIs it may still attach.
    pub enis_left: u32,
}

impl NodeStart {
    /// From a daemon's pool; `slots_per_eni` is the ENI's IPv4 addresses less its primary, each
    /// slot one address, or one `/28` of `prefix_len` addresses with prefix delegation.
    pub fn of(s: &PoolSnapshot, slots_per_eni: u32, prefix: bool) -> Self {
        Self::counted(s, slots_per_eni, prefix, false)
    }

    /// A node that has just booted, counted from empty: its pod ENIs (on a new instance, the
    /// primary one when the policy puts pods on it, else none) with nothing assigned and nothing
    /// free, whatever its warm-up has started by the time it is looked at. Node-boot's bound.
    pub fn empty(s: &PoolSnapshot, slots_per_eni: u32, prefix: bool) -> Self {
        Self::counted(s, slots_per_eni, prefix, true)
    }

    fn counted(s: &PoolSnapshot, slots_per_eni: u32, prefix: bool, empty: bool) -> Self {
        let slot = if prefix { 16 } else { 1 };
        let mut attached = 0;
        let mut room = 0;
        for e in s.pod_enis() {
            attached += 1;
            let used = if empty {
                0
            } else if prefix {
                e.prefixes.len() as u32
            } else {
                e.ips.len() as u32 + e.in_flight
            };
            room += slots_per_eni.saturating_sub(used) * slot;
        }
        let pod_eni_cap = s.max_enis.saturating_sub(1);
        Self {
            free: if empty { 0 } else { s.idle_eligible },
            room,
            per_new_eni: slots_per_eni * slot,
            enis_left: pod_eni_cap.saturating_sub(attached),
        }
    }
}

/// The calls per API a node cannot do without to hold `pods` addresses: one batched assign on its
/// attached ENIs if it needs them, and per new ENI a create (with its addresses), an attach and a
/// modify.
/// Needs beyond what the node can hold are not counted (no call can serve them).
pub fn node_min_calls(pods: u32, n: &NodeStart) -> BTreeMap<&'static str, u64> {
    let mut calls = BTreeMap::new();
    let need = pods.saturating_sub(n.free);
    if need == 0 {
        return calls;
    }
    let from_room = need.min(n.room);
    let rest = need - from_room;
    let new_enis = if rest == 0 || n.per_new_eni == 0 {
        0
    } else {
        rest.div_ceil(n.per_new_eni).min(n.enis_left)
    };
    if from_room > 0 {
        calls.insert("AssignPrivateIpAddresses", 1);
    }
    for api in &GROWTH_APIS[..3] {
        if new_enis > 0 {
            calls.insert(*api, u64::from(new_enis));
        }
    }
    calls
}

/// One API's share of the bound.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiBound {
    pub api: String,
    pub calls: u64,
    pub burst: f64,
    pub refill_per_sec: f64,
    /// max(0, (calls − burst) / refill), s.
    pub secs: f64,
}

/// The account bound: the least time, s, the buckets of `t` need to serve `calls`, and each API's
/// share, slowest first.
pub fn account_bound(calls: &BTreeMap<String, u64>, t: &Throttling) -> (f64, Vec<ApiBound>) {
    let mut per_api: Vec<ApiBound> = calls
        .iter()
        .map(|(api, &n)| {
            let b = t.bucket(api);
            ApiBound {
                api: api.clone(),
                calls: n,
                burst: b.capacity,
                refill_per_sec: b.refill_per_sec,
                secs: ((n as f64 - b.capacity) / b.refill_per_sec).max(0.0),
            }
        })
        .collect();
    per_api.sort_by(|a, b| b.secs.total_cmp(&a.secs).then(a.api.cmp(&b.api)));
    let bound = per_api.first().map_or(0.0, |a| a.secs);
    (bound, per_api)
}

/// The fleet's minimum calls per API: each node's, summed.
pub fn fleet_min_calls(pods: &[u32], nodes: &[NodeStart]) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for (p, n) in pods.iter().zip(nodes) {
        for (api, c) in node_min_calls(*p, n) {
            *sum.entry(api.to_owned()).or_default() += c;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use mockcloud::throttling::Bucket;

    const ENI: NodeStart = NodeStart {
        free: 3,
        room: 11,
        per_new_eni: 14,
        enis_left: 2,
    };

    #[test]
    fn a_node_needs_one_assign_on_its_room_and_a_whole_chain_per_new_eni() {
        // 20 pods, 3 free: 11 fit on the attached ENI (one assign), 6 need a new ENI, which the
        // create brings with it (no assign of its own).
        let c = node_min_calls(20, &ENI);
        assert_eq!(c["AssignPrivateIpAddresses"], 1);
        for api in [
            "CreateNetworkInterface",
            "AttachNetworkInterface",
            "ModifyNetworkInterfaceAttribute",
        ] {
            assert_eq!(c[api], 1, "{api}");
        }
        // Enough room: one assign, nothing else.
        assert_eq!(
            node_min_calls(14, &ENI).into_iter().collect::<Vec<_>>(),
            vec![("AssignPrivateIpAddresses", 1)]
        );
        // Enough free: no call at all.
        assert!(node_min_calls(3, &ENI).is_empty());
        // 40 pods: 11 on the room, 26 on two new ENIs; a third ENI is not there to attach.
        let c = node_min_calls(40, &ENI);
        assert_eq!(
            (c["AssignPrivateIpAddresses"], c["CreateNetworkInterface"]),
            (1, 2)
        );
        assert_eq!(node_min_calls(100, &ENI)["CreateNetworkInterface"], 2);
    }

    #[test]
    fn the_bound_is_the_slowest_bucket_past_its_burst() {
        let t = Throttling::default()
            .with("AssignPrivateIpAddresses", Bucket::new(100.0, 5.0))
            .with("AttachNetworkInterface", Bucket::new(50.0, 5.0))
            .with("CreateNetworkInterface", Bucket::new(100.0, 5.0));
        let nodes = vec![ENI; 500];
        let calls = fleet_min_calls(&[20; 500], &nodes);
        assert_eq!(calls["AssignPrivateIpAddresses"], 500);
        let (bound, per_api) = account_bound(&calls, &t);
        // Attaches (500 − 50) / 5 = 90 s; assigns and creates (500 − 100) / 5 = 80 s each.
        assert_eq!(bound, 90.0);
        assert_eq!(per_api[0].api, "AttachNetworkInterface");
        assert_eq!(per_api[1].secs, 80.0);
        assert_eq!(per_api[2].secs, 80.0);
        // Within every burst: no wait at all.
        let (small, _) = account_bound(&fleet_min_calls(&[20; 40], &nodes[..40]), &t);
        assert_eq!(small, 0.0);
    }
}
