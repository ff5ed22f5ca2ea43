//! Model-based property test of the pool: random sequences of acquires (plain, sticky, preferred,
//! concurrent bursts), releases (plain and sticky), clock advances, maintainer rounds and injected
//! cloud failures, run against the real pool on the in-memory cloud and checked against a simple
//! reference model of who holds which IP and when each IP was released.
//!
//! Checked after every step: no IP held twice; acquire is idempotent; capacity is never exceeded and
//! the token accounting balances; a released IP goes to another pod only after the cooldown, and a
//! sticky IP only to its key until the reservation ends (and to its key whenever it asks); a
//! preferred IP is the one given or the request fails. Checked once quiet: the idle count is within
//! `[min_idle, max_idle]` (as far as capacity allows; with prefixes, no whole free `/28` is kept
//! beyond it), and the pool's IPs are exactly EC2's.
//!
//! One pod is of a network profile: it gets IPs only on the profile's ENIs, and no other pod one
//! of them (the pool's invariants check both after every step).
//!
//! Each case runs in one of three supply modes: secondary IPs on secondary ENIs only, eth0 serving
//! pods too (the default), and prefix delegation (`/28`s on eth0 and secondary ENIs, in a subnet
//! small enough that prefixes run out and single addresses are packed in).

mod pool_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::cloud::{Cloud, CloudError, InstanceLimits, SubnetFilter};
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::{
    Acquire, AttachmentMeta, EniRole, IpState, Pool, PoolConfig, PoolError, PreferUnavailable,
    ProfileNetwork,
};
use pool_support::start;
use proptest::prelude::*;
use tokio::time::{Instant, advance};

const PODS: usize = 8;
/// Pods `0..STS` are StatefulSet pods: they carry a sticky key and release sticky.
const STS: usize = 3;
const COOLDOWN: Duration = Duration::from_secs(30);
const STICK: Duration = Duration::from_secs(120);

/// How the pool gets its addresses in a case.
#[derive(Clone, Copy, Debug)]
enum Supply {
    SecondaryEnis,
    WithEth0,
    Prefixes,
}

fn supply() -> impl Strategy<Value = Supply> {
    prop_oneof![
        Just(Supply::SecondaryEnis),
        Just(Supply::WithEth0),
        Just(Supply::Prefixes),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        pod: usize,
    },
    /// Acquire naming the IP of pod `of` (held or last released), or a foreign IP.
    AcquirePreferring {
        pod: usize,
        of: Option<usize>,
    },
    /// The same attachment again (CNI ADD retry).
    AcquireAgain {
        pod: usize,
    },
    Burst {
        pods: Vec<usize>,
    },
    Release {
        pod: usize,
    },
    Advance {
        secs: u64,
    },
    Maintain,
    Fail {
        action: usize,
        times: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..PODS).prop_map(|pod| Op::Acquire { pod }),
        1 => ((0..PODS), proptest::option::of(0..PODS)).prop_map(|(pod, of)| Op::AcquirePreferring { pod, of }),
        1 => (0..PODS).prop_map(|pod| Op::AcquireAgain { pod }),
        2 => proptest::collection::vec(0..PODS, 2..6).prop_map(|pods| Op::Burst { pods }),
        5 => (0..PODS).prop_map(|pod| Op::Release { pod }),
        3 => prop_oneof![Just(0u64), Just(1), Just(10), Just(31), Just(130)].prop_map(|secs| Op::Advance { secs }),
        2 => Just(Op::Maintain),
        1 => ((0..3usize), (1..3usize)).prop_map(|(action, times)| Op::Fail { action, times }),
    ]
}

const FAULTS: [Action; 3] = [
    Action::AssignPrivateIpAddresses,
    Action::CreateNetworkInterface,
    Action::UnassignPrivateIpAddresses,
];

/// The reference model.
#[derive(Default)]
struct Model {
    /// Generation of each pod's current attachment (a new container after each release).
    generation: [usize; PODS],
    held: HashMap<AttachmentKey, Ipv4Addr>,
    /// IP → when it was last released.
    released_at: HashMap<Ipv4Addr, Instant>,
    /// sticky key → (IP, until).
    reservations: HashMap<String, (Ipv4Addr, Instant)>,
    /// The last IP each pod held.
    last_ip: [Option<Ipv4Addr>; PODS],
}

impl Model {
    fn key(&self, pod: usize) -> AttachmentKey {
        AttachmentKey::new(format!("pod-{pod}-gen-{}", self.generation[pod]), "eth0")
    }
}

fn pod_ref(pod: usize) -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: format!("pod-{pod}"),
        uid: format!("uid-{pod}"),
    }
}

fn sticky_key(pod: usize) -> Option<String> {
    (pod < STS).then(|| format!("ns/pod-{pod}"))
}

/// The last pod is of network profile `db`: its IPs come from `db`'s ENIs only, and no other pod
/// ever gets one of them (the pool's invariants, checked after every step, say so too).
fn network(pod: usize) -> Option<&'static str> {
    (pod == PODS - 1).then_some(PROFILE)
}

const PROFILE: &str = "db";

async fn acquire(
    pool: &Pool,
    key: AttachmentKey,
    pod: usize,
    prefer: Option<Ipv4Addr>,
) -> Result<eniipam::pool::Allocation, PoolError> {
    pool.acquire_with(Acquire {
        key,
        pod: pod_ref(pod),
        prefer,
        sticky_key: sticky_key(pod),
        meta: AttachmentMeta::default(),
        wait: None,
        network: network(pod).map(str::to_owned),
    })
    .await
}

struct Run {
    pool: Pool,
    model: Model,
}

impl Run {
    /// Checks one acquire's outcome against the model and records it.
    fn check_acquire(
        &mut self,
        pod: usize,
        key: &AttachmentKey,
        prefer: Option<Ipv4Addr>,
        result: &Result<eniipam::pool::Allocation, PoolError>,
        now: Instant,
    ) -> Result<(), TestCaseError> {
        let m = &mut self.model;
        match result {
            Ok(a) => {
                prop_assert_eq!(a.network.as_deref(), network(pod), "the pod's network");
                if let Some(ip) = m.held.get(key) {
                    prop_assert_eq!(a.ip, *ip, "acquire is idempotent");
                    return Ok(());
                }
                for (other, ip) in &m.held {
                    prop_assert_ne!(*ip, a.ip, "{} already held by {}", a.ip, other);
                }
                let mine = sticky_key(pod);
                let reserved_for_me = mine
                    .as_ref()
                    .and_then(|k| m.reservations.get(k))
                    .filter(|(_, until)| *until > now)
                    .map(|(ip, _)| *ip);
                match (reserved_for_me, prefer) {
                    (Some(ip), _) => prop_assert_eq!(
                        a.ip,
                        ip,
                        "a sticky key gets its reserved IP back, prefer or not"
                    ),
                    (None, Some(p)) => prop_assert_eq!(a.ip, p, "a preferred IP or an error"),
                    (None, None) => {}
                }
                for (k, (ip, until)) in &m.reservations {
                    if *ip == a.ip && *until > now {
                        prop_assert_eq!(Some(k), mine.as_ref(), "{} is reserved for {}", ip, k);
                    }
                }
                if let Some(at) = m.released_at.get(&a.ip) {
                    let own = reserved_for_me == Some(a.ip);
                    prop_assert!(
                        own || now - *at >= COOLDOWN,
                        "{} reused {:?} after release",
                        a.ip,
                        now - *at
                    );
                }
                if let Some(k) = &mine {
                    m.reservations.remove(k);
                }
                m.held.insert(key.clone(), a.ip);
                m.last_ip[pod] = Some(a.ip);
            }
            Err(e) => {
                prop_assert!(
                    !m.held.contains_key(key),
                    "re-acquire of a held attachment failed: {}",
                    e
                );
                match e {
                    PoolError::PreferredUnavailable { ip, reason } => {
                        prop_assert_eq!(Some(*ip), prefer);
                        if *reason == PreferUnavailable::Assigned {
                            prop_assert!(m.held.values().any(|h| h == ip));
                        }
                    }
                    PoolError::ProfileUnavailable { profile, reason } => {
                        prop_assert_eq!(Some(profile.as_str()), network(pod));
                        prop_assert!(reason.is_retryable(), "{}", e);
                    }
                    PoolError::Exhausted { .. }
                    | PoolError::BackingOff { .. }
                    | PoolError::WaitedTooLong { .. }
                    | PoolError::Cloud(_) => {}
                    other => prop_assert!(false, "unexpected error {}", other),
                }
            }
        }
        Ok(())
    }

    fn check_state(&self) -> Result<(), TestCaseError> {
        let snap = self.pool.snapshot();
        prop_assert!(
            snap.tokens_used <= snap.capacity,
            "{} > {}",
            snap.tokens_used,
            snap.capacity
        );
        if let Err(e) = self.pool.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        prop_assert_eq!(snap.assigned as usize, self.model.held.len());
        for (key, ip) in &self.model.held {
            match snap.ip(*ip) {
                Some(IpState::Assigned { attachment, .. }) => prop_assert_eq!(attachment, key),
                other => prop_assert!(false, "{} should be held by {}, is {:?}", ip, key, other),
            }
        }
        Ok(())
    }
}

async fn run_case(
    supply: Supply,
    min_idle: u32,
    extra_idle: u32,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let spec = NodeSpec {
        limits: InstanceLimits::new(3, 4),
        // With prefixes: 4 aligned /28s, one of them broken by the reserved addresses and eth0's
        // primary, one by the broadcast address: two whole prefixes at most, then single addresses.
        subnet_cidr: match supply {
            Supply::Prefixes => "10.0.1.0/26".parse().expect("valid CIDR"),
            _ => NodeSpec::default().subnet_cidr,
        },
        ..NodeSpec::default()
    };
    let config = PoolConfig {
        min_idle,
        max_idle: min_idle + extra_idle,
        reuse_cooldown: COOLDOWN,
        ip_stick_time: STICK,
        maintainer_tick: Duration::from_secs(5),
        use_primary_eni: !matches!(supply, Supply::SecondaryEnis),
        prefix_delegation: matches!(supply, Supply::Prefixes),
        ..PoolConfig::default()
    };
    let node = start(config, spec).await;
    let subnet = node
        .cloud
        .describe_subnets(&SubnetFilter {
            ids: vec![node.node.subnet_id.clone()],
            ..SubnetFilter::default()
        })
        .await
        .expect("the subnet")
        .remove(0);
    node.pool.set_profiles(BTreeMap::from([(
        PROFILE.to_owned(),
        ProfileNetwork {
            subnet,
            security_groups: vec!["sg-db".into()],
            max_enis: None,
        },
    )]));
    let cloud = node.cloud.clone();
    let mut run = Run {
        pool: node.pool,
        model: Model::default(),
    };
    for op in ops {
        let now = Instant::now();
        match op {
            Op::Acquire { pod } | Op::AcquireAgain { pod } => {
                let key = run.model.key(pod);
                let r = acquire(&run.pool, key.clone(), pod, None).await;
                run.check_acquire(pod, &key, None, &r, Instant::now())?;
            }
            Op::AcquirePreferring { pod, of } => {
                let key = run.model.key(pod);
                let prefer = match of {
                    Some(o) => run.model.last_ip[o].unwrap_or(Ipv4Addr::new(192, 0, 2, 7)),
                    None => Ipv4Addr::new(192, 0, 2, 7),
                };
                let r = acquire(&run.pool, key.clone(), pod, Some(prefer)).await;
                if run.model.held.contains_key(&key) {
                    run.check_acquire(pod, &key, None, &r, Instant::now())?;
                } else {
                    run.check_acquire(pod, &key, Some(prefer), &r, Instant::now())?;
                }
            }
            Op::Burst { pods } => {
                let pods: Vec<usize> = pods
                    .into_iter()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let keys: Vec<AttachmentKey> = pods.iter().map(|p| run.model.key(*p)).collect();
                let results = futures::future::join_all(
                    pods.iter()
                        .zip(&keys)
                        .map(|(p, k)| acquire(&run.pool, k.clone(), *p, None)),
                )
                .await;
                let at = Instant::now();
                for ((p, k), r) in pods.iter().zip(&keys).zip(&results) {
                    run.check_acquire(*p, k, None, r, at)?;
                }
            }
            Op::Release { pod } => {
                let key = run.model.key(pod);
                let sticky = pod < STS;
                let released = run
                    .pool
                    .release(&key, sticky)
                    .expect("release never fails")
                    .map(|r| r.ip);
                let expected = run.model.held.remove(&key);
                prop_assert_eq!(released, expected);
                if let Some(ip) = expected {
                    run.model.released_at.insert(ip, now);
                    if let Some(k) = sticky_key(pod) {
                        run.model.reservations.insert(k, (ip, now + STICK));
                    }
                    run.model.generation[pod] += 1;
                }
            }
            Op::Advance { secs } => advance(Duration::from_secs(secs)).await,
            Op::Maintain => run.pool.maintain_now().await.expect("maintainer runs"),
            Op::Fail { action, times } => cloud.fail_next(
                FAULTS[action],
                times,
                CloudError::Transient {
                    api: FAULTS[action].as_str().into(),
                    message: "injected".into(),
                },
            ),
        }
        run.check_state()?;
    }

    // Quiet down: no faults, every cooldown, reservation and back-off over, a few rounds.
    cloud.clear_faults();
    for _ in 0..4 {
        advance(Duration::from_secs(150)).await;
        run.pool.maintain_now().await.expect("maintainer runs");
    }
    run.pool.maintain_now().await.expect("maintainer runs");
    run.check_state()?;
    let snap = run.pool.snapshot();
    // The warm levels are the default network's: the profile's idle IPs (held a while for its
    // pods, then given back) are not among them.
    let profile = run.pool.profile_capacity()[PROFILE].clone();
    let idle = snap.idle - snap.reserved - profile.idle;
    prop_assert_eq!(snap.reserved, 0, "every reservation has ended");
    // A prefix goes back only whole: the free addresses of a partly used one stay.
    let whole_free_prefixes = snap
        .enis
        .iter()
        .flat_map(|e| e.prefixes.iter())
        .filter(|p| {
            eniipam::pool::slots::prefix_addresses(**p)
                .all(|ip| matches!(snap.ip(ip), Some(IpState::Idle { .. })))
        })
        .count() as u32;
    let prefix_addresses = eniipam::pool::PREFIX_ADDRESSES;
    prop_assert!(
        idle <= snap.max_idle
            || (whole_free_prefixes == 0 || idle < snap.max_idle + prefix_addresses),
        "idle {} > max_idle {} with {} whole free prefixes",
        idle,
        snap.max_idle,
        whole_free_prefixes
    );
    // The default network's room: what no pod holds and the profile's total does not promise
    // (its spare device index is not the default network's: issue 44, case 2).
    let room = (snap.capacity + profile.assigned)
        .saturating_sub(snap.assigned)
        .saturating_sub(profile.total);
    // While the profile holds an ENI, the default network may be short of the device index it
    // takes: the floor is checked when it holds none.
    prop_assert!(
        profile.enis > 0 || idle >= snap.min_idle.min(room),
        "idle {} < min_idle {} (room {})",
        idle,
        snap.min_idle,
        room
    );
    // The pool's IPs and ENIs are exactly EC2's.
    let pool_ips: BTreeSet<Ipv4Addr> = snap.ips().map(|s| s.ip).collect();
    let eth0_serves = !matches!(supply, Supply::SecondaryEnis);
    let cloud_ips: BTreeSet<Ipv4Addr> = cloud
        .attached_enis()
        .iter()
        .filter(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.device_index > 0 || eth0_serves)
        })
        .flat_map(|e| e.pod_addresses())
        .collect();
    prop_assert_eq!(pool_ips, cloud_ips);
    let pool_enis: BTreeSet<String> = snap
        .enis
        .iter()
        .filter(|e| e.role == EniRole::Pods)
        .map(|e| e.id.to_string())
        .collect();
    let cloud_enis: BTreeSet<String> = cloud
        .enis()
        .iter()
        .filter(|e| e.attachment.as_ref().is_none_or(|a| a.device_index > 0))
        .map(|e| e.id.to_string())
        .collect();
    prop_assert_eq!(pool_enis, cloud_enis, "no leaked or unknown ENIs");
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_pool_matches_its_model(
        supply in supply(),
        min_idle in 0u32..3,
        extra_idle in 0u32..4,
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        runtime().block_on(run_case(supply, min_idle, extra_idle, ops))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// N concurrent acquires on an empty node cost ⌈N / IPs per ENI⌉ creates and no assign at all.
    #[test]
    fn a_burst_costs_the_fewest_calls(n in 1usize..19, per in 3u32..8) {
        runtime().block_on(async move {
            let spec = NodeSpec {
                limits: InstanceLimits::new(4, per + 1),
                ..NodeSpec::default()
            };
            let node = start(pool_support::quiet_config(), spec).await;
            let capacity = 3 * per as usize;
            let results = pool_support::acquire_many(&node.pool, 0..n).await;
            let ok = results.iter().filter(|r| r.is_ok()).count();
            prop_assert_eq!(ok, n.min(capacity));
            let ips: BTreeSet<Ipv4Addr> = results.iter().filter_map(|r| r.as_ref().ok()).map(|a| a.ip).collect();
            prop_assert_eq!(ips.len(), ok);
            prop_assert_eq!(node.cloud.call_count(Action::AssignPrivateIpAddresses), 0);
            let creates = n.min(capacity).div_ceil(per as usize);
            prop_assert_eq!(node.cloud.call_count(Action::CreateNetworkInterface), creates);
            Ok(())
        })?;
    }
}
