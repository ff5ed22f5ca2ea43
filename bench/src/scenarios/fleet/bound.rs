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
//!
//! That is the last-call time of one call structure, eniipam's (an assign for the room, a chain per
//! new ENI), not a bound on every design (issue 46). [`least_bound`] takes the least over every
//! structure EC2 allows a node: on a Nitro type, one `AssignPrivateIpAddresses` with
//! `Ipv4PrefixCount` whose whole `/28`s fit the free slots of its attached ENIs, or one chain whose
//! create carries the addresses, whichever bucket has the tokens, or both when the need exceeds
//! either alone. It is still counted from each node's free IPs at the start, which the policy's
//! posture sets; no design can do with fewer calls than one per node that needs any.

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
    /// Addresses its attached pod ENIs could still take as whole `/28`s, one per free slot (what
    /// secondaries and prefixes leave), whatever the policy's mode: the room of one prefix assign.
    pub prefix_room: u32,
    /// Addresses one new ENI can carry as `/28`s in its create.
    pub prefix_per_new_eni: u32,
}

impl NodeStart {
    /// From a daemon's pool; `slots_per_eni` is the ENI's IPv4 addresses less its primary, each
    /// slot one address, or one `/28` of 16 addresses when the policy's nodes take `/28`s
    /// (`prefix`: prefix delegation, or burst prefixes on a Nitro type). A slot is used by a single
    /// secondary IP or by a `/28`, whichever the ENI holds there.
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
        let mut prefix_room = 0;
        for e in s.pod_enis() {
            attached += 1;
            let used = if empty {
                0
            } else {
                slots_used(&e.prefixes, e.ips.iter().map(|i| i.ip), e.in_flight)
            };
            room += slots_per_eni.saturating_sub(used) * slot;
            prefix_room += slots_per_eni.saturating_sub(used) * 16;
        }
        let pod_eni_cap = s.max_enis.saturating_sub(1);
        Self {
            free: if empty { 0 } else { s.idle_eligible },
            room,
            per_new_eni: slots_per_eni * slot,
            enis_left: pod_eni_cap.saturating_sub(attached),
            prefix_room,
            prefix_per_new_eni: slots_per_eni * 16,
        }
    }
}

/// The slots an ENI uses: one per single secondary IP (those in none of its `/28`s, and those
/// being assigned), one per `/28`. Burst prefixes put both on one ENI.
fn slots_used(
    prefixes: &[ipnet::Ipv4Net],
    ips: impl Iterator<Item = std::net::Ipv4Addr>,
    in_flight: u32,
) -> u32 {
    let singles = ips
        .filter(|ip| !prefixes.iter().any(|p| p.contains(ip)))
        .count() as u32;
    singles + prefixes.len() as u32 + in_flight
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

/// Calls per API of one way to serve a node.
pub type Calls = BTreeMap<&'static str, u64>;

/// Every call structure that serves a node's `pods` in one burst on a Nitro type, fewest calls
/// first: one prefix assign on its attached ENIs, or new ENIs carrying their `/28`s in the create
/// (each a create, an attach and a modify), or, when neither alone holds the need, the assign for
/// the room and chains for the rest. Empty when the node needs nothing; a need beyond what the node
/// can hold is cut to what it can.
pub fn node_alternatives(pods: u32, n: &NodeStart) -> Vec<Calls> {
    let need = pods.saturating_sub(n.free);
    if need == 0 {
        return Vec::new();
    }
    let chains = |k: u32| -> Calls {
        GROWTH_APIS[..3]
            .iter()
            .map(|api| (*api, u64::from(k)))
            .collect()
    };
    let per_eni = n.prefix_per_new_eni.max(1);
    let mut out = Vec::new();
    if need <= n.prefix_room {
        out.push(Calls::from([("AssignPrivateIpAddresses", 1)]));
    }
    let k = need.div_ceil(per_eni);
    if k <= n.enis_left {
        out.push(chains(k));
    }
    if out.is_empty() {
        // Neither alone: the assign for the room, chains for the rest (as many as attach).
        let rest = need.saturating_sub(n.prefix_room);
        let k = rest.div_ceil(per_eni).min(n.enis_left);
        let mut both = chains(k);
        if n.prefix_room > 0 {
            both.insert("AssignPrivateIpAddresses", 1);
        }
        both.retain(|_, c| *c > 0);
        out.push(both);
    }
    out
}

/// The least time, s, the buckets of `t` need to serve every node, each by one of its
/// `alternatives` ([`node_alternatives`]), and the calls per API of the choice that reaches it.
///
/// Searched on the time `T` (to 0.1 s): at `T` each API can serve `burst + refill × T` calls. Nodes
/// with one way take it; the others take their first way (the assign) while its bucket has room,
/// those whose other way costs the most chains first, and the chains otherwise. With the two ways a
/// node has here (one assign, or chains), that choice fits whenever any choice fits.
pub fn least_bound(alternatives: &[Vec<Calls>], t: &Throttling) -> (f64, BTreeMap<String, u64>) {
    let fits = |secs: f64| -> Option<BTreeMap<String, u64>> {
        let cap = |api: &str| {
            let b = t.bucket(api);
            b.capacity + b.refill_per_sec * secs
        };
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        let add = |c: &Calls, used: &mut BTreeMap<String, u64>| {
            for (api, n) in c {
                *used.entry((*api).to_owned()).or_default() += n;
            }
        };
        let mut flexible: Vec<&Vec<Calls>> = Vec::new();
        for a in alternatives {
            match a.len() {
                0 => {}
                1 => add(&a[0], &mut used),
                _ => flexible.push(a),
            }
        }
        let chains = |c: &Calls| c.get("CreateNetworkInterface").copied().unwrap_or(0);
        flexible.sort_by_key(|a| std::cmp::Reverse(a[1..].iter().map(chains).min().unwrap_or(0)));
        for a in flexible {
            let first_fits = a[0]
                .iter()
                .all(|(api, n)| (used.get(*api).copied().unwrap_or(0) + n) as f64 <= cap(api));
            add(if first_fits { &a[0] } else { &a[1] }, &mut used);
        }
        used.iter()
            .all(|(api, n)| *n as f64 <= cap(api))
            .then_some(used)
    };
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    if let Some(used) = fits(0.0) {
        return (0.0, used);
    }
    while fits(hi).is_none() {
        hi *= 2.0;
        if hi > 1e7 {
            return (f64::INFINITY, BTreeMap::new());
        }
    }
    while hi - lo > 0.05 {
        let mid = (lo + hi) / 2.0;
        if fits(mid).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let secs = (hi * 10.0).ceil() / 10.0;
    (secs, fits(secs).unwrap_or_default())
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
        prefix_room: 11 * 16,
        prefix_per_new_eni: 14 * 16,
    };

    #[test]
    fn an_eni_uses_a_slot_per_single_ip_and_per_prefix() {
        let p: ipnet::Ipv4Net = "10.0.1.16/28".parse().unwrap();
        let ip = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap();
        // eth0 with burst prefixes: 3 single IPs beside a /28 of which 5 addresses are in use,
        // and one single IP being assigned: 5 slots, not 9 (counting addresses) nor 1 (prefixes).
        let ips = ["10.0.0.5", "10.0.0.6", "10.0.0.7"]
            .map(ip)
            .into_iter()
            .chain((17..22).map(|i| ip(&format!("10.0.1.{i}"))));
        assert_eq!(slots_used(&[p], ips, 1), 5);
        // Single IPs only, and prefixes only.
        assert_eq!(slots_used(&[], ["10.0.0.5"].map(ip).into_iter(), 0), 1);
        assert_eq!(
            slots_used(&[p], (16..32).map(|i| ip(&format!("10.0.1.{i}"))), 0),
            1
        );
    }

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

    /// Issue 46's scale-up: 500 m5.xlarge nodes, each one growth call. All on assigns: (500 − 100)
    /// / 5 = 80 s; all on chains: the attach bucket's (500 − 50) / 5 = 90 s; split so both
    /// buckets end together: x assigns with (x − 100) / 5 = (500 − x − 50) / 5, x = 275, 35 s.
    #[test]
    fn the_least_bound_splits_nodes_between_the_assign_and_the_create_buckets() {
        let t = Throttling::default();
        let ways = vec![node_alternatives(20, &ENI); 500];
        assert_eq!(ways[0].len(), 2, "{:?}", ways[0]);
        let (secs, used) = least_bound(&ways, &t);
        assert!((34.9..=35.1).contains(&secs), "{secs}");
        assert_eq!(used["AssignPrivateIpAddresses"], 275);
        assert_eq!(used["AttachNetworkInterface"], 225);
        // eniipam's structure (an assign for the room, a chain for the rest) takes 90 s there.
        let (theirs, _) = account_bound(&fleet_min_calls(&[20; 500], &vec![ENI; 500]), &t);
        assert_eq!(theirs, 90.0);
        // Mixed: 50 busy nodes of 36 pods fit the assign burst: no wait at all.
        let (mixed, used) = least_bound(&vec![node_alternatives(36, &ENI); 50], &t);
        assert_eq!(mixed, 0.0);
        assert_eq!(used["AssignPrivateIpAddresses"], 50);
    }

    #[test]
    fn a_node_with_no_slot_free_has_only_chains_and_one_with_no_eni_left_only_the_assign() {
        let full = NodeStart {
            prefix_room: 0,
            room: 0,
            ..ENI
        };
        assert_eq!(
            node_alternatives(20, &full),
            vec![Calls::from([
                ("AttachNetworkInterface", 1),
                ("CreateNetworkInterface", 1),
                ("ModifyNetworkInterfaceAttribute", 1)
            ])]
        );
        let no_eni = NodeStart {
            enis_left: 0,
            ..ENI
        };
        assert_eq!(
            node_alternatives(20, &no_eni),
            vec![Calls::from([("AssignPrivateIpAddresses", 1)])]
        );
        // More than the room and no ENI to attach: the assign alone, cut to what fits.
        let small = NodeStart {
            prefix_room: 16,
            enis_left: 0,
            ..ENI
        };
        assert_eq!(
            node_alternatives(40, &small),
            vec![Calls::from([("AssignPrivateIpAddresses", 1)])]
        );
        assert!(node_alternatives(3, &ENI).is_empty());
        // Forced nodes past every burst: the bound is their own bucket's.
        let t = Throttling::default();
        let (secs, _) = least_bound(&vec![node_alternatives(20, &full); 150], &t);
        assert!(
            (19.9..=20.1).contains(&secs),
            "attach: (150 − 50) / 5 = 20 s, got {secs}"
        );
    }
}
