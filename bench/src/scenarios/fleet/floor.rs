//! The modelled p99 floor of a pattern: the p99 pod wait one schedule of the least call structure
//! gives once the pods' own arrival spread, EC2's latencies and the account's bucket refill are
//! counted. It is a model, not a bound: the account bound ([`super::bound::least_bound`]) says when
//! the last growth call can be served at best, and says nothing of the waits of the pods behind it;
//! the floor answers "what p99 would the least structure reach, scheduled sensibly?".
//!
//! What it assumes (the report's legend says the same):
//! - each node makes **one** growth call structure for its whole first wave (one of its
//!   [`super::bound::node_alternatives`]: a prefix assign on its attached ENIs, or creates that carry
//!   their addresses, or both), sized to the wave from the start, asked for at `ask_at`: when the
//!   first pod beyond its free IPs is bound (a pod watch sees it then), or at its launch in node-boot;
//! - the calls are served by the account's token buckets (burst, refill), in the order the nodes ask,
//!   FIFO per bucket; each node takes the way whose addresses are usable sooner given the tokens the
//!   nodes before it took (greedy, earliest ask first: a sensible schedule, not the best one);
//! - an address is usable when EC2's reply is in: the assign's latency, or a create's, then an
//!   attach's and the attachment's `attaching` time (the nominal latencies the harness gives
//!   mockcloud, jitter left out). The modify (delete-on-termination) is off the critical path; IMDS
//!   and describe lag, the daemon's own work and gRPC are not counted (a design may learn its
//!   addresses from EC2's replies);
//! - a pod that finds a free IP waits nothing; one beyond the node's free IPs waits from its ADD until
//!   its node's addresses are usable. With the startup taint modelled (node-boot), a node's pods are
//!   bound only once its addresses are usable (the taint lifted at once, no check period) and waits
//!   run from the node's launch, so the arrival spread after the binding is part of every wait;
//! - no ADD fails: no kubelet back-off is counted.

use std::collections::BTreeMap;
use std::time::Duration;

use mockcloud::{LatencyProfile, Throttling};

use super::bound::{Calls, NodeStart};
use super::pods::{bind_to_add, pod_rng};
use super::spec::PairSpec;
use super::traffic::{KUBELET_READY, Plan, TAINT_TO_BIND};
use crate::stats::percentile;

/// How long each growth path takes from its call being served to its addresses being usable, s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathLatency {
    /// `AssignPrivateIpAddresses`' reply.
    pub assign: f64,
    /// `CreateNetworkInterface`'s reply (the attach can be asked for then).
    pub create: f64,
    /// `AttachNetworkInterface`'s reply plus the time the attachment stays `attaching`.
    pub attach: f64,
}

impl PathLatency {
    /// The nominal latencies of `profile` (jitter left out).
    pub fn of(profile: &LatencyProfile) -> Self {
        Self {
            assign: profile.latency("AssignPrivateIpAddresses").as_secs_f64(),
            create: profile.latency("CreateNetworkInterface").as_secs_f64(),
            attach: (profile.latency("AttachNetworkInterface") + profile.attach_delay)
                .as_secs_f64(),
        }
    }
}

/// When a node's pods come, and from when their waits are counted.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// ADDs at these instants (s, the pattern's clock), whatever the node holds; each pod's wait runs
    /// from its ADD.
    Fixed { adds: Vec<f64> },
    /// The startup taint: the node's pods are bound at `max(ready_at, usable + bind_after)` and each
    /// ADD comes `offsets[k]` later (arrival spread plus the binding's lead to the ADD); waits run
    /// from `since` (the node's launch).
    Gated {
        ready_at: f64,
        bind_after: f64,
        offsets: Vec<f64>,
        since: f64,
    },
}

/// One node as the floor sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct FloorNode {
    /// Free IPs any pod may take at the start (the first pods take them and wait nothing).
    pub free: u32,
    /// When it asks for its growth, s.
    pub ask_at: f64,
    /// Its ways to grow (none: it needs nothing).
    pub ways: Vec<Calls>,
    pub arrivals: Arrivals,
}

/// The modelled floor of a fleet: its p99 pod wait and how the nodes grew.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Floor {
    /// p99 of the modelled waits, s (nearest rank, as the measured p99).
    pub p99_s: f64,
    /// Nodes served by an assign alone, by creates alone, by both.
    pub by_assign: usize,
    pub by_chains: usize,
    pub by_both: usize,
}

/// One API's bucket, spent FIFO.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    cap: f64,
    rate: f64,
    tokens: f64,
    at: f64,
}

impl Bucket {
    fn of(t: &Throttling, api: &str) -> Self {
        let b = t.bucket(api);
        Self {
            cap: b.capacity,
            rate: b.refill_per_sec,
            tokens: b.capacity,
            at: 0.0,
        }
    }

    /// Takes one token for a call made at `t`; when it is served. A call never overtakes an earlier
    /// one on the same bucket.
    fn take(&mut self, t: f64) -> f64 {
        let t = t.max(self.at);
        let tokens = (self.tokens + self.rate * (t - self.at)).min(self.cap);
        if tokens >= 1.0 {
            self.tokens = tokens - 1.0;
            self.at = t;
            return t;
        }
        if self.rate <= 0.0 {
            self.at = f64::INFINITY;
            return f64::INFINITY;
        }
        let served = t + (1.0 - tokens) / self.rate;
        self.tokens = 0.0;
        self.at = served;
        served
    }
}

type Buckets = BTreeMap<&'static str, Bucket>;

/// When `way`'s addresses are usable if asked for at `ask`, spending `buckets`.
fn usable(way: &Calls, ask: f64, buckets: &mut Buckets, t: &Throttling, lat: &PathLatency) -> f64 {
    let mut bucket = |api: &'static str| *buckets.entry(api).or_insert_with(|| Bucket::of(t, api));
    let mut assign = bucket("AssignPrivateIpAddresses");
    let mut create = bucket("CreateNetworkInterface");
    let mut attach = bucket("AttachNetworkInterface");
    let mut done = ask;
    for _ in 0..way.get("AssignPrivateIpAddresses").copied().unwrap_or(0) {
        done = done.max(assign.take(ask) + lat.assign);
    }
    for _ in 0..way.get("CreateNetworkInterface").copied().unwrap_or(0) {
        let created = create.take(ask) + lat.create;
        done = done.max(attach.take(created) + lat.attach);
    }
    buckets.insert("AssignPrivateIpAddresses", assign);
    buckets.insert("CreateNetworkInterface", create);
    buckets.insert("AttachNetworkInterface", attach);
    done
}

/// Each pod's modelled wait, s, node by node in the order given, and how the nodes grew.
pub fn floor_waits(nodes: &[FloorNode], t: &Throttling, lat: &PathLatency) -> (Vec<f64>, Floor) {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[a].ask_at.total_cmp(&nodes[b].ask_at).then(a.cmp(&b)));
    let mut buckets = Buckets::new();
    let mut ready = vec![0.0; nodes.len()];
    let mut floor = Floor::default();
    for i in order {
        let n = &nodes[i];
        ready[i] = n.ask_at;
        let mut best: Option<(f64, Buckets, &Calls)> = None;
        for way in &n.ways {
            let mut tried = buckets.clone();
            let at = usable(way, n.ask_at, &mut tried, t, lat);
            if best.as_ref().is_none_or(|b| at < b.0) {
                best = Some((at, tried, way));
            }
        }
        if let Some((at, spent, way)) = best {
            ready[i] = at;
            buckets = spent;
            match (
                way.contains_key("AssignPrivateIpAddresses"),
                way.contains_key("CreateNetworkInterface"),
            ) {
                (true, true) => floor.by_both += 1,
                (true, false) => floor.by_assign += 1,
                _ => floor.by_chains += 1,
            }
        }
    }
    let mut waits = Vec::new();
    for (n, usable_at) in nodes.iter().zip(ready) {
        match &n.arrivals {
            Arrivals::Fixed { adds } => {
                let mut adds = adds.clone();
                adds.sort_by(f64::total_cmp);
                for (k, add) in adds.iter().enumerate() {
                    let free = k < n.free as usize;
                    waits.push(if free {
                        0.0
                    } else {
                        (usable_at - add).max(0.0)
                    });
                }
            }
            Arrivals::Gated {
                ready_at,
                bind_after,
                offsets,
                since,
            } => {
                let bound = ready_at.max(usable_at + bind_after);
                waits.extend(offsets.iter().map(|o| bound + o - since));
            }
        }
    }
    floor.p99_s = percentile(&waits, 99.0).unwrap_or(0.0);
    (waits, floor)
}

/// The modelled floor: [`floor_waits`]' p99 and how the nodes grew.
pub fn model_floor(nodes: &[FloorNode], t: &Throttling, lat: &PathLatency) -> Floor {
    floor_waits(nodes, t, lat).1
}

/// The floor model's view of the first wave (`floor`): each node's free IPs and ways to grow from
/// its start, when it asks (the binding of its first pod beyond its free IPs; node-boot: its
/// launch), and its pods' ADDs with the leads the drivers draw (`pods::pod_rng`).
pub fn nodes_of(
    spec: &PairSpec,
    plan: &Plan,
    starts: &[NodeStart],
    ways: &[Vec<Calls>],
) -> Vec<FloorNode> {
    let mut pods: Vec<Vec<(f64, f64)>> = vec![Vec::new(); starts.len()];
    let mut index = vec![0usize; starts.len()];
    for p in &plan.pods {
        let i = index[p.node];
        index[p.node] += 1;
        if p.wave != 0 {
            continue;
        }
        let lead = bind_to_add(&mut pod_rng(spec.seed, p.node, i)).as_secs_f64();
        pods[p.node].push((p.start.as_secs_f64(), lead));
    }
    let boot = spec.pattern.boots_in_pattern();
    let ready = KUBELET_READY.as_secs_f64();
    starts
        .iter()
        .zip(ways)
        .zip(pods)
        .enumerate()
        .map(|(n, ((start, ways), mut pods))| {
            pods.sort_by(|a, b| a.0.total_cmp(&b.0));
            let launch = plan.launches.get(n).map_or(0.0, Duration::as_secs_f64);
            let (ask_at, arrivals) = if boot && spec.startup_taint {
                let arrivals = Arrivals::Gated {
                    ready_at: launch + ready,
                    bind_after: TAINT_TO_BIND.as_secs_f64(),
                    offsets: pods.iter().map(|(s, l)| s + l).collect(),
                    since: launch,
                };
                (launch, arrivals)
            } else if boot {
                let adds = pods.iter().map(|(s, l)| launch + ready + s + l).collect();
                (launch, Arrivals::Fixed { adds })
            } else {
                let ask = pods.get(start.free as usize).map_or(0.0, |p| p.0);
                (
                    ask,
                    Arrivals::Fixed {
                        adds: pods.iter().map(|(s, l)| s + l).collect(),
                    },
                )
            };
            FloorNode {
                free: start.free,
                ask_at,
                ways: ways.clone(),
                arrivals,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mockcloud::throttling::Bucket as Size;

    const LAT: PathLatency = PathLatency {
        assign: 0.25,
        create: 0.4,
        attach: 2.25,
    };

    fn assign() -> Calls {
        Calls::from([("AssignPrivateIpAddresses", 1)])
    }

    fn chain() -> Calls {
        Calls::from([
            ("CreateNetworkInterface", 1),
            ("AttachNetworkInterface", 1),
            ("ModifyNetworkInterfaceAttribute", 1),
        ])
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9),
            "{got:?} != {want:?}"
        );
    }

    fn node(free: u32, ask_at: f64, ways: Vec<Calls>, adds: Vec<f64>) -> FloorNode {
        FloorNode {
            free,
            ask_at,
            ways,
            arrivals: Arrivals::Fixed { adds },
        }
    }

    #[test]
    fn the_latencies_are_the_profiles_nominal_ones() {
        let l = PathLatency::of(&LatencyProfile::realistic());
        assert_eq!((l.assign, l.create, l.attach), (0.25, 0.4, 2.25));
    }

    #[test]
    fn pods_on_free_ips_wait_nothing_and_the_rest_wait_for_the_assign() {
        let t = Throttling::default();
        // 3 free, 5 pods at once: the first 3 wait nothing, the other 2 the assign's 0.25 s.
        let (waits, floor) = floor_waits(
            &[node(3, 0.0, vec![assign(), chain()], vec![0.0; 5])],
            &t,
            &LAT,
        );
        assert_eq!(waits, vec![0.0, 0.0, 0.0, 0.25, 0.25]);
        assert_eq!(
            (floor.p99_s, floor.by_assign, floor.by_chains),
            (0.25, 1, 0)
        );
        // Enough free: nothing to wait for, no call.
        let floor = model_floor(&[node(5, 0.0, vec![], vec![0.0; 5])], &t, &LAT);
        assert_eq!((floor.p99_s, floor.by_assign + floor.by_chains), (0.0, 0));
    }

    #[test]
    fn a_pod_arriving_after_its_addresses_are_usable_waits_nothing() {
        let t = Throttling::default();
        let (waits, _) = floor_waits(
            &[node(0, 0.0, vec![assign()], vec![0.1, 0.2, 1.0, 5.0])],
            &t,
            &LAT,
        );
        assert_close(&waits, &[0.15, 0.05, 0.0, 0.0]);
    }

    /// Past the assign bucket's burst, calls wait for its refill; the chain then wins when its
    /// latency is shorter than the refill's wait.
    #[test]
    fn the_refill_paces_the_calls_and_the_nodes_move_to_the_other_bucket() {
        let t = Throttling::default()
            .with("AssignPrivateIpAddresses", Size::new(2.0, 1.0))
            .with("CreateNetworkInterface", Size::new(100.0, 5.0))
            .with("AttachNetworkInterface", Size::new(100.0, 5.0));
        // Assign only: the third node waits 1 s for a token, the fourth 2 s.
        let only = vec![node(0, 0.0, vec![assign()], vec![0.0]); 4];
        let (waits, _) = floor_waits(&only, &t, &LAT);
        assert_eq!(waits, vec![0.25, 0.25, 1.25, 2.25]);
        // Either way: the third and fourth take the assign (1.25 s and 2.25 s, sooner than the
        // chain's 2.65 s); the fifth's assign would be usable at 3.25 s, so it takes the chain.
        let either = vec![node(0, 0.0, vec![assign(), chain()], vec![0.0]); 5];
        let (waits, floor) = floor_waits(&either, &t, &LAT);
        assert_eq!(waits, vec![0.25, 0.25, 1.25, 2.25, 2.65]);
        assert_eq!((floor.by_assign, floor.by_chains), (4, 1));
        assert_eq!(floor.p99_s, 2.65);
    }

    #[test]
    fn nodes_are_served_in_the_order_they_ask() {
        let t = Throttling::default().with("AssignPrivateIpAddresses", Size::new(1.0, 1.0));
        // Node 0 asks late (at 3 s), node 1 at once: node 1 takes the burst; node 0's token has
        // refilled by then.
        let nodes = vec![
            node(0, 3.0, vec![assign()], vec![3.0]),
            node(0, 0.0, vec![assign()], vec![0.0]),
        ];
        let (waits, _) = floor_waits(&nodes, &t, &LAT);
        assert_eq!(waits, vec![0.25, 0.25]);
    }

    #[test]
    fn with_the_taint_pods_are_bound_once_the_addresses_are_usable_and_wait_from_the_launch() {
        let t = Throttling::default();
        let gated = |ready_at: f64| FloorNode {
            free: 0,
            ask_at: 10.0,
            ways: vec![chain()],
            arrivals: Arrivals::Gated {
                ready_at,
                bind_after: 1.0,
                offsets: vec![0.5, 4.0],
                since: 10.0,
            },
        };
        // Launched at 10 s; the chain is usable at 10 + 0.4 + 2.25 = 12.65 s; bound at 13.65 s.
        let (waits, _) = floor_waits(&[gated(0.0)], &t, &LAT);
        assert_close(&waits, &[4.15, 7.65]);
        // The node is not Ready before 20 s: the binding waits for it.
        let (waits, _) = floor_waits(&[gated(20.0)], &t, &LAT);
        assert!((waits[0] - 10.5).abs() < 1e-9, "{waits:?}");
    }

    /// Issue 46's scale-up, all asking at once: the greedy schedule splits the nodes between the
    /// assign and the create buckets as the least bound does, so the last pods wait about the bound
    /// (35 s) plus an assign's or a chain's latency.
    #[test]
    fn at_five_hundred_nodes_the_floor_lies_near_the_least_bound() {
        use super::super::bound::{NodeStart, least_bound, node_alternatives};
        let start = NodeStart {
            free: 3,
            room: 11,
            per_new_eni: 14,
            enis_left: 2,
            prefix_room: 11 * 16,
            prefix_per_new_eni: 14 * 16,
        };
        let t = Throttling::default();
        let ways = node_alternatives(20, &start);
        let nodes = vec![node(3, 0.0, ways.clone(), vec![0.0; 20]); 500];
        let floor = model_floor(&nodes, &t, &LAT);
        let (bound, _) = least_bound(&vec![ways; 500], &t);
        assert!((34.9..=35.1).contains(&bound), "{bound}");
        assert!(
            (bound..=bound + LAT.create + LAT.attach).contains(&floor.p99_s),
            "floor {} against the bound {bound}",
            floor.p99_s
        );
        assert_eq!(floor.by_assign + floor.by_chains, 500);
        assert!(floor.by_chains > 150, "{floor:?}");
    }

    #[test]
    fn a_node_needing_both_waits_for_the_slower_part() {
        let t = Throttling::default();
        let mut both = chain();
        both.insert("AssignPrivateIpAddresses", 1);
        let (waits, floor) = floor_waits(&[node(0, 0.0, vec![both], vec![0.0])], &t, &LAT);
        assert!((waits[0] - 2.65).abs() < 1e-9);
        assert_eq!(floor.by_both, 1);
    }
}
