//! The pool on the real cloud clients against mockcloud with EC2-like latency and throttling: a cold
//! burst of 100 pods on an empty node must all get IPs, and cost at most 1.25 × the fewest mutating
//! EC2 calls that can serve it — with secondary IPs (eth0 first, then new ENIs, on a c5.4xlarge) and
//! with prefix delegation (on an m5.large, where 100 pods fit in eth0's prefixes). The count is of
//! the calls EC2 performed: the `realistic` profile's new-ENI lag refuses the first call on one new
//! ENI in four as `InvalidNetworkInterfaceID.NotFound` (EC2's eventual consistency, which no call
//! structure avoids); those refusals are printed, and `tests/cloud_leak.rs` tests riding them out.

#[path = "cloud_support/mod.rs"]
mod cloud_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use cloud_support::Env;
use eniipam::cloud::limiter::LimiterConfig;
use eniipam::cloud::{Cloud, Metadata};
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::{Pool, PoolConfig, PoolSeams, PoolSeed};
use mockcloud::{ActionClass, Config};

struct Burst {
    env: Env,
    pool: Pool,
    allocations: Vec<eniipam::pool::Allocation>,
    /// Mutating calls EC2 performed (not those it refused, see the module docs).
    mutating: u64,
}

async fn cold_burst(instance_type: &str, config: PoolConfig, pods: usize) -> Burst {
    let mock_config = Config {
        default_instance_type: instance_type.into(),
        ..Config::realistic()
    };
    let env = Env::start_with(
        mock_config,
        LimiterConfig::default(),
        Duration::from_secs(10),
    )
    .await;
    let interfaces = env.imds.interfaces().await.expect("IMDS interfaces");
    assert_eq!(interfaces.len(), 1, "an empty node: only eth0");
    let pool = env.pool(config).await;

    let started = tokio::time::Instant::now();
    let acquires = (0..pods).map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.acquire(
                AttachmentKey::new(format!("container-{i}"), "eth0"),
                PodRef {
                    namespace: "default".into(),
                    name: format!("pod-{i}"),
                    uid: format!("uid-{i}"),
                },
                None,
                None,
            )
            .await
        })
    });
    let mut allocations = Vec::new();
    let mut ips = BTreeSet::new();
    for a in futures::future::join_all(acquires).await {
        let alloc = a.expect("task").expect("every pod gets an IP");
        assert!(ips.insert(alloc.ip), "{} handed out twice", alloc.ip);
        allocations.push(alloc);
    }
    let elapsed = started.elapsed();

    // Every IP handed out is on an ENI of this instance in EC2 (a secondary IP or inside a prefix).
    let inst = env.mock.instance(&env.instance.instance_id).unwrap();
    let ec2_ips: BTreeSet<Ipv4Addr> = inst
        .enis
        .iter()
        .flat_map(|e| {
            e.secondary_ips.iter().copied().chain(
                e.ipv4_prefixes
                    .iter()
                    .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p)),
            )
        })
        .collect();
    assert!(ips.is_subset(&ec2_ips), "EC2 holds every pod IP");

    let counters = env.mock.counters();
    let sent: u64 = counters
        .actions
        .iter()
        .filter(|(a, _)| ActionClass::of(a) == ActionClass::Mutating)
        .map(|(_, c)| c.calls)
        .sum();
    let mutating = counters.mutating_ok();
    println!(
        "cold burst: {pods} pods on {instance_type} in {elapsed:?}; mutating EC2 calls performed \
         {mutating} (sent {sent}, refused {}); describe calls {}; throttled {}; by action {:?}",
        sent - mutating,
        counters.total_calls() - sent,
        counters.total_throttled(),
        counters
            .actions
            .iter()
            .map(|(a, c)| (a.as_str(), c.calls))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        counters.total_throttled(),
        0,
        "the node's limiter keeps it under EC2's buckets"
    );
    pool.check_invariants().expect("pool invariants");
    Burst {
        env,
        pool,
        allocations,
        mutating,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_of_100_pods_with_burst_prefixes_costs_one_call() {
    // The shipped default on a Nitro type, burst prefixes: eth0's free slots take whole /28s.
    assert!(
        PoolConfig::default().burst_prefixes,
        "burst prefixes are shipped"
    );
    let b = cold_burst("c5.4xlarge", PoolConfig::default(), 100).await;
    // One AssignPrivateIpAddresses of whole /28s when every acquire is in the actor's first batch
    // (the cold-burst benchmark, on a quiet machine: 1). On a loaded machine the acquires come
    // spread out and the tail takes a second call: never an ENI.
    assert!(
        (1..=2).contains(&b.mutating),
        "{} mutating calls for the burst",
        b.mutating
    );
    let inst = b.env.mock.instance(&b.env.instance.instance_id).unwrap();
    assert_eq!(
        inst.enis.len(),
        1,
        "no new ENI: eth0's slots hold the burst"
    );
    let prefixes = inst.enis[0].ipv4_prefixes.len();
    // 100 pods in seven /28s; one more when the adaptive warm-ups ride along.
    assert!((7..=8).contains(&prefixes), "{prefixes} /28s for 100 pods");
    assert!(b.allocations.iter().all(|a| a.device_index == 0));
    // The node's capacity (tokens) counts each slot as a /28, as with prefix delegation.
    assert_eq!(b.pool.snapshot().capacity, 8 * 29 * 16);
    b.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_of_100_pods_costs_the_fewest_calls() {
    // Single secondary IPs (burst prefixes off, as on a non-Nitro type).
    let config = PoolConfig {
        burst_prefixes: false,
        ..PoolConfig::default()
    };
    let b = cold_burst("c5.4xlarge", config, 100).await;
    // eth0 first: one AssignPrivateIpAddresses for its 29 slots. Then each new ENI costs Create +
    // Attach + ModifyNetworkInterfaceAttribute (DeleteOnTermination) and carries up to
    // ipv4_per_eni - 1 pod IPs in the create call itself.
    let per_eni = b.env.node.limits.ipv4_per_eni - 1;
    // eth0 is filled in one call. Which waiter gets which IP depends on timing (a pod may take a new
    // ENI's IP while eth0's assign is answered), so the count is taken in EC2, not per pod.
    let inst = b.env.mock.instance(&b.env.instance.instance_id).unwrap();
    let eth0 = inst
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .expect("eth0");
    assert_eq!(
        eth0.secondary_ips.len(),
        per_eni as usize,
        "eth0's slots serve pods first"
    );
    assert!(
        b.allocations.iter().any(|a| a.device_index == 0),
        "pods on eth0"
    );
    let enis_needed = u64::from((100 - per_eni).div_ceil(per_eni));
    let minimum = 1 + enis_needed * 3;
    assert!(
        b.mutating as f64 <= 1.25 * minimum as f64,
        "{} mutating calls > 1.25 x minimum {minimum}",
        b.mutating
    );
    b.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_of_100_pods_with_prefixes_costs_at_most_three_calls() {
    let config = PoolConfig {
        prefix_delegation: true,
        ..PoolConfig::default()
    };
    let b = cold_burst("m5.large", config, 100).await;
    assert!(
        b.mutating <= 3,
        "{} mutating calls for 100 pods with prefix delegation",
        b.mutating
    );
    // m5.large: 110 pods with prefixes (the VPC CNI's max-pods), where secondary IPs give 27.
    assert!(b.pool.snapshot().capacity >= 110);
    let inst = b.env.mock.instance(&b.env.instance.instance_id).unwrap();
    let prefixes: usize = inst.enis.iter().map(|e| e.ipv4_prefixes.len()).sum();
    // 100 pods in seven /28s; an eighth is warmed for the burst's tail (the adaptive policy
    // expects as many again during a burst, up to max_idle 16) when the maintainer's top-up goes
    // out before the burst's last pods have taken the warm-ups already in flight. On a loaded
    // machine the ADDs arrive spread out and a ninth was seen once (CI, two builds running beside
    // it): still within the three calls above, and the give-back returns the excess after the
    // burst. What this test holds fixed is the calls; the /28 count only bounds the over-warming.
    assert!((7..=9).contains(&prefixes), "{prefixes} /28s for 100 pods");
    b.pool.shutdown().await;
}

/// With burst prefixes, pods whose assign EC2 throttles (the account's AssignPrivateIpAddresses
/// bucket kept dry by another tenant) fall over to one new ENI that carries them in its create, in
/// the round that follows the throttle: they neither wait out eth0's back-off nor try the assign
/// again, and the create bucket, which has tokens, serves the burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_assign_falls_over_to_a_create_within_one_round() {
    let mock_config = Config {
        default_instance_type: "m5.xlarge".into(),
        ..Config::realistic()
    };
    let env = Env::start_with(
        mock_config,
        LimiterConfig::default(),
        Duration::from_secs(10),
    )
    .await;
    // No warm-ups at start: the pods' own assign is the first, and the one throttled.
    let pool = env
        .pool(PoolConfig {
            min_idle: 0,
            burst_prefixes: true,
            ..PoolConfig::default()
        })
        .await;
    let mock = env.mock.clone();
    let tenant = tokio::spawn(async move {
        loop {
            let _ = mock.spend_tokens("AssignPrivateIpAddresses", 1_000);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let allocations = tokio::time::timeout(Duration::from_secs(60), acquire_range(&pool, 0..20))
        .await
        .expect("the burst is served while the assign bucket stays dry");
    tenant.abort();
    let counters = env.mock.counters();
    println!("fall-over: {:?}", counters.actions);
    assert_eq!(
        counters.ok("AssignPrivateIpAddresses"),
        0,
        "the assign bucket stayed dry"
    );
    // One throttled assign, then the pods go the create's way at once. On a loaded machine the
    // pods still queued at eth0's actor when the throttle came back join in the next round, after
    // the create was planned for those it had: the new ENI's room takes them, and an assign on it
    // for the rest meets the dry bucket too (a second throttle, and at most one more create).
    let throttled = counters.throttled("AssignPrivateIpAddresses");
    assert!(
        (1..=3).contains(&throttled),
        "{throttled} throttled assigns: the pods went the create's way"
    );
    let creates = counters.ok("CreateNetworkInterface");
    assert!(
        (1..=2).contains(&creates),
        "{creates} new ENIs carry the burst"
    );
    assert!(
        allocations.iter().all(|a| a.device_index >= 1),
        "every pod got its IP from a new ENI"
    );
    let inst = env.mock.instance(&env.instance.instance_id).unwrap();
    let new_eni = inst
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 1))
        .expect("the new ENI is attached");
    assert!(
        !new_eni.ipv4_prefixes.is_empty(),
        "its create carried the burst in whole /28s"
    );
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}

fn pod_key(i: usize) -> (AttachmentKey, PodRef) {
    (
        AttachmentKey::new(format!("container-{i}"), "eth0"),
        PodRef {
            namespace: "default".into(),
            name: format!("pod-{i}"),
            uid: format!("uid-{i}"),
        },
    )
}

async fn acquire_range(
    pool: &Pool,
    range: std::ops::Range<usize>,
) -> Vec<eniipam::pool::Allocation> {
    let all = range.map(|i| {
        let (key, pod) = pod_key(i);
        let pool = pool.clone();
        async move { pool.acquire(key, pod, None, None).await }
    });
    futures::future::join_all(all)
        .await
        .into_iter()
        .map(|r| r.expect("acquired"))
        .collect()
}

/// Every address EC2 shows on the instance's ENIs (secondary IPs and every address of their prefixes).
fn ec2_addresses(env: &Env) -> BTreeSet<Ipv4Addr> {
    let inst = env.mock.instance(&env.instance.instance_id).unwrap();
    inst.enis
        .iter()
        .flat_map(|e| {
            e.secondary_ips.iter().copied().chain(
                e.ipv4_prefixes
                    .iter()
                    .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p)),
            )
        })
        .collect()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issue 23, case 5: a give-back whose single addresses EC2 took back but whose prefixes' call (the
/// second UnassignPrivateIpAddresses) failed. The singles are gone from EC2: they must leave the pool
/// (tokens returned), never go idle and then to a pod; the prefix's addresses stay idle, as EC2 still
/// has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_whose_prefix_call_fails_keeps_no_address_ec2_took_back() {
    let env = Env::start_with(
        Config::fast(),
        cloud_support::fast_limiter(),
        Duration::from_secs(10),
    )
    .await;
    let config = PoolConfig {
        prefix_delegation: true,
        use_primary_eni: true,
        warm_policy: eniipam::pool::config::WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 0,
        maintainer_tick: Duration::from_secs(3600),
        reuse_cooldown: Duration::from_millis(500),
        prefix_retry: Duration::from_millis(200),
        eni_backoff: Duration::from_millis(100),
        ..PoolConfig::default()
    };
    let interfaces = env.imds.interfaces().await.expect("IMDS interfaces");
    let pool = Pool::start(
        config,
        env.cloud.clone(),
        env.imds.clone(),
        env.node.clone(),
        PoolSeed::from_metadata(&interfaces, &[]),
    )
    .expect("pool starts");
    let subnet = env.instance.subnet_id.clone();

    // eth0 gets three single addresses while the subnet has no free /28, then a prefix.
    env.mock
        .occupy_addresses(
            &subnet,
            &mockcloud::world::OccupyPattern::Stride {
                stride: 16,
                offset: 8,
            },
        )
        .unwrap();
    acquire_range(&pool, 0..3).await;
    env.mock.release_occupied(&subnet).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    acquire_range(&pool, 3..19).await;
    let inst = env.mock.instance(&env.instance.instance_id).unwrap();
    let eth0 = &inst.enis[0];
    assert_eq!(
        (eth0.secondary_ips.len(), eth0.ipv4_prefixes.len()),
        (3, 1),
        "three singles and a prefix on eth0: {eth0:?}"
    );

    // Give everything back: the singles' call goes through (its reply held a moment), the prefix's
    // call, the second, is refused.
    env.mock.inject_fault(mockcloud::Fault::slow_reply(
        "UnassignPrivateIpAddresses",
        Duration::from_millis(300),
        1,
    ));
    env.mock.reset_counters();
    for i in 0..19 {
        pool.release(&pod_key(i).0, false).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let maintain = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.maintain_now().await })
    };
    let unassigns = |env: &Env| {
        env.mock
            .counters()
            .actions
            .iter()
            .find(|(a, _)| a.as_str() == "UnassignPrivateIpAddresses")
            .map_or(0, |(_, c)| c.calls)
    };
    until("the singles' unassign arrives", || unassigns(&env) >= 1).await;
    env.mock.inject_fault(mockcloud::Fault::error(
        "UnassignPrivateIpAddresses",
        "UnauthorizedOperation",
        1,
    ));
    maintain.await.unwrap().unwrap();
    until("both unassigns settled", || {
        unassigns(&env) >= 2 && pool.snapshot().releasing == 0
    })
    .await;

    let ec2 = ec2_addresses(&env);
    assert_eq!(ec2.len(), 16, "EC2 took the singles back, kept the prefix");
    let snap = pool.snapshot();
    let held: BTreeSet<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    assert!(
        held.is_subset(&ec2),
        "the pool holds addresses EC2 took back: {:?}",
        held.difference(&ec2).collect::<Vec<_>>()
    );
    assert_eq!(snap.idle, 16, "the prefix's addresses are idle again");
    assert_eq!(snap.tokens_used, 16);
    pool.check_invariants().expect("pool invariants");

    // Pods after the ENI's back-off: none gets an address EC2 does not hold for this node.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = acquire_range(&pool, 100..119).await;
    let ec2 = ec2_addresses(&env);
    for a in &got {
        assert!(
            ec2.contains(&a.ip),
            "{} went to a pod; EC2 does not have it",
            a.ip
        );
    }
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}

/// A pool on eth0's secondary addresses that gives back every idle IP at its next round.
async fn eth0_pool_giving_back_at_once() -> (Env, Pool) {
    eth0_pool_giving_back_at_once_with(PoolSeams::default()).await
}

/// [`eth0_pool_giving_back_at_once`] built with `seams` (a journal).
async fn eth0_pool_giving_back_at_once_with(seams: PoolSeams) -> (Env, Pool) {
    let env = Env::start_with(
        Config::fast(),
        cloud_support::fast_limiter(),
        Duration::from_secs(10),
    )
    .await;
    // Single secondary IPs (burst prefixes off): what these tests give back is single addresses.
    let config = PoolConfig {
        use_primary_eni: true,
        burst_prefixes: false,
        warm_policy: eniipam::pool::config::WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 0,
        maintainer_tick: Duration::from_secs(3600),
        reuse_cooldown: Duration::from_millis(100),
        eni_backoff: Duration::from_millis(100),
        ..PoolConfig::default()
    };
    let interfaces = env.imds.interfaces().await.expect("IMDS interfaces");
    let pool = Pool::start_with_seams(
        config,
        env.cloud.clone(),
        env.imds.clone(),
        env.node.clone(),
        PoolSeed::from_metadata(&interfaces, &[]),
        seams,
    )
    .expect("pool starts");
    (env, pool)
}

/// The UnassignPrivateIpAddresses calls mockcloud counted.
fn unassign_calls(env: &Env) -> u64 {
    env.mock
        .counters()
        .actions
        .iter()
        .find(|(a, _)| a.as_str() == "UnassignPrivateIpAddresses")
        .map_or(0, |(_, c)| c.calls)
}

/// Issue 44 (the profiles soak, seed 27): a give-back naming an address taken out of band (not yet
/// found by the running reconcile) is refused whole by EC2 ("not assigned to interface"), which
/// changes nothing. The pool kept every address of it idle, the one EC2 no longer has included,
/// while the journal said they were going back; a pod handed one of them lost it at a restart
/// within the minute. Now each address goes back in a call of its own: what EC2 holds goes back,
/// what is gone is gone, and the pool holds neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_naming_an_address_gone_out_of_band_still_gives_back_the_rest() {
    let (env, pool) = eth0_pool_giving_back_at_once().await;
    let got = acquire_range(&pool, 0..3).await;
    let ips: Vec<Ipv4Addr> = got.iter().map(|a| a.ip).collect();
    let eth0 = env.mock.instance(&env.instance.instance_id).unwrap().enis[0]
        .id
        .clone();
    assert_eq!(ec2_addresses(&env), ips.iter().copied().collect());
    // One of them is taken out of band while its pod runs.
    let gone = ips[1];
    env.mock.with_world(|w, now| {
        w.unassign_private_ip_addresses(&eth0, &[gone], now)
            .unwrap()
    });
    env.mock.reset_counters();
    for i in 0..3 {
        pool.release(&pod_key(i).0, false).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    pool.maintain_now().await.unwrap();
    until("the give-back settled", || pool.snapshot().releasing == 0).await;

    let unassigns = unassign_calls(&env);
    assert_eq!(unassigns, 4, "the refused call, then one per address");
    assert!(ec2_addresses(&env).is_empty(), "EC2 took back what it held");
    let snap = pool.snapshot();
    let held: Vec<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    assert!(held.is_empty(), "the pool still holds {held:?}");
    assert_eq!(snap.tokens_used, 0);
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}

/// A journal whose writes fail (the state file's disk is full).
struct FullDisk;

#[async_trait::async_trait]
impl eniipam::pool::ChangeJournal for FullDisk {
    async fn assigned(&self, _: &eniipam::model::EniId, _: &[Ipv4Addr], _: &[ipnet::Ipv4Net]) {}
    async fn unassigning(
        &self,
        _: &eniipam::model::EniId,
        _: &[Ipv4Addr],
        _: &[ipnet::Ipv4Net],
    ) -> bool {
        false
    }
}

/// Issue 44 (the profiles soak, seed 27, a full disk then a SIGKILL): a give-back the state file
/// cannot journal is not sent. Sent unjournalled, a restart within EC2's describe lag read the
/// addresses as still the node's (the describe still showed them) and handed them to pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_the_journal_cannot_record_is_not_sent() {
    let seams = PoolSeams {
        journal: Some(std::sync::Arc::new(FullDisk)),
        ..PoolSeams::default()
    };
    let (env, pool) = eth0_pool_giving_back_at_once_with(seams).await;
    let got = acquire_range(&pool, 0..3).await;
    let ips: BTreeSet<Ipv4Addr> = got.iter().map(|a| a.ip).collect();
    env.mock.reset_counters();
    for i in 0..3 {
        pool.release(&pod_key(i).0, false).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = pool.maintain_now().await;
    until("the give-back settled", || pool.snapshot().releasing == 0).await;
    let unassigns = unassign_calls(&env);
    assert_eq!(unassigns, 0, "nothing sent unjournalled");
    assert_eq!(ec2_addresses(&env), ips, "EC2 keeps them");
    let snap = pool.snapshot();
    let held: BTreeSet<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    assert_eq!(held, ips, "idle in the pool, as EC2 holds them");
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}

/// A pool on `instance` (its own IMDS) whose new ENIs may go to `pod_subnets`.
async fn pool_on(
    env: &Env,
    instance: &mockcloud::LaunchedInstance,
    pod_subnets: &[String],
    config: PoolConfig,
) -> Pool {
    let imds = std::sync::Arc::new(
        eniipam::cloud::imds::ImdsMetadata::new(
            &eniipam::cloud::imds::ImdsConfig {
                endpoint: Some(instance.imds_url.clone()),
                ..Default::default()
            },
            env.stats.clone(),
        )
        .expect("IMDS client"),
    );
    let mut subnets = Vec::new();
    for id in pod_subnets {
        subnets.push(env.cloud.describe_subnet(id).await.expect("subnet"));
    }
    let node = eniipam::cloud::NodeContext {
        instance_id: instance.instance_id.clone(),
        subnet_id: instance.subnet_id.clone(),
        pod_subnets: subnets,
        ..env.node.clone()
    };
    let interfaces = imds.interfaces().await.expect("IMDS interfaces");
    Pool::start(
        config,
        env.cloud.clone(),
        imds,
        node,
        PoolSeed::from_metadata(&interfaces, &[]),
    )
    .expect("pool starts")
}

/// Secondary ENIs only (the first pod needs a new ENI), no warm pool.
fn new_eni_config() -> PoolConfig {
    PoolConfig {
        use_primary_eni: false,
        warm_policy: eniipam::pool::config::WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 100,
        ..PoolConfig::default()
    }
}

fn subnet_of_new_eni(env: &Env, instance_id: &str) -> String {
    let inst = env.mock.instance(instance_id).unwrap();
    inst.enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index > 0))
        .map(|e| e.subnet_id.clone())
        .expect("a new ENI")
}

/// Issue 23, case 4: the pod subnets' free counts are read again while the pool runs (here every
/// 300 ms, jittered to 150–450 ms). A subnet other nodes drain behind the pool's back is seen at
/// zero free within the bound, and the next new ENI goes to the other subnet instead of failing in
/// the drained one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subnet_drained_behind_the_pools_back_is_seen_and_new_enis_go_elsewhere() {
    let env = Env::start_with(
        Config::fast(),
        cloud_support::fast_limiter(),
        Duration::from_secs(10),
    )
    .await;
    let a = env.instance.subnet_id.clone();
    let b = env
        .mock
        .create_subnet(
            &env.instance.vpc_id,
            "10.0.16.0/21".parse().unwrap(),
            &env.instance.availability_zone,
        )
        .unwrap();
    let refresh = Duration::from_millis(300);
    let config = PoolConfig {
        subnet_refresh: refresh,
        ..new_eni_config()
    };
    let pool = pool_on(&env, &env.instance, &[a.clone(), b.clone()], config).await;
    let free = |pool: &Pool, id: &str| {
        pool.snapshot()
            .subnets
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.free)
    };
    assert!(
        free(&pool, &a).unwrap() > free(&pool, &b).unwrap(),
        "the larger subnet leads"
    );

    // Other nodes take every free address of the node's own subnet.
    let taken = env
        .mock
        .occupy_addresses(
            &a,
            &mockcloud::world::OccupyPattern::Range {
                cidr: "10.0.0.0/20".parse().unwrap(),
            },
        )
        .unwrap();
    assert!(taken > 4000);
    tokio::time::sleep(refresh * 3 / 2 + Duration::from_millis(200)).await;
    assert_eq!(free(&pool, &a), Some(0), "the drained subnet is seen empty");

    let got = acquire_range(&pool, 0..3).await;
    assert_eq!(got.len(), 3);
    assert_eq!(
        subnet_of_new_eni(&env, &env.instance.instance_id),
        b,
        "the new ENI goes to the subnet with room"
    );
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}

/// Issue 23, case 4: nodes that boot together read the same free counts; with two subnets of about
/// the same room they do not all put their first ENI in the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_booting_together_spread_their_enis_over_equal_subnets() {
    let env = Env::start_with(
        Config::fast(),
        cloud_support::fast_limiter(),
        Duration::from_secs(10),
    )
    .await;
    let a = env.instance.subnet_id.clone();
    let b = env
        .mock
        .create_subnet(
            &env.instance.vpc_id,
            "10.0.16.0/20".parse().unwrap(),
            &env.instance.availability_zone,
        )
        .unwrap();
    let mut instances = vec![env.instance.clone()];
    for _ in 0..3 {
        instances.push(env.mock.launch_instance("m5.large", &a).await.unwrap());
    }
    let mut pools = Vec::new();
    for inst in &instances {
        pools.push(pool_on(&env, inst, &[a.clone(), b.clone()], new_eni_config()).await);
    }
    let firsts = pools.iter().map(|p| acquire_range(p, 0..1));
    futures::future::join_all(firsts).await;
    let picked: Vec<String> = instances
        .iter()
        .map(|i| subnet_of_new_eni(&env, &i.instance_id))
        .collect();
    assert!(
        picked.contains(&a) && picked.contains(&b),
        "four nodes booting together all chose one subnet: {picked:?}"
    );
    for p in pools {
        p.check_invariants().expect("pool invariants");
        p.shutdown().await;
    }
}
