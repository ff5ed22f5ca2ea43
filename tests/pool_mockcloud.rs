//! The pool on the real cloud clients against mockcloud with EC2-like latency and throttling: a cold
//! burst of 100 pods on an empty node must all get IPs, and cost at most 1.25 × the fewest mutating
//! EC2 calls that can serve it — with secondary IPs (eth0 first, then new ENIs, on a c5.4xlarge) and
//! with prefix delegation (on an m5.large, where 100 pods fit in eth0's prefixes).

#[path = "cloud_support/mod.rs"]
mod cloud_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use cloud_support::Env;
use eniipam::cloud::Metadata;
use eniipam::cloud::limiter::LimiterConfig;
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::{Pool, PoolConfig, PoolSeed};
use mockcloud::{ActionClass, Config};

struct Burst {
    env: Env,
    pool: Pool,
    allocations: Vec<eniipam::pool::Allocation>,
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
    let pool = Pool::start(
        config,
        env.cloud.clone(),
        env.imds.clone(),
        env.node.clone(),
        PoolSeed::from_metadata(&interfaces, &[]),
    )
    .expect("pool starts");
    env.mock.reset_counters();

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
    let mutating: u64 = counters
        .actions
        .iter()
        .filter(|(a, _)| ActionClass::of(a) == ActionClass::Mutating)
        .map(|(_, c)| c.calls)
        .sum();
    println!(
        "cold burst: {pods} pods on {instance_type} in {elapsed:?}; mutating EC2 calls {mutating}; \
         describe calls {}; throttled {}; by action {:?}",
        counters.total_calls() - mutating,
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
async fn a_cold_burst_of_100_pods_costs_the_fewest_calls() {
    let b = cold_burst("c5.4xlarge", PoolConfig::default(), 100).await;
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
    assert_eq!(
        prefixes, 8,
        "100 pods in seven /28s, and one more warmed for the burst's tail (the adaptive policy \
         expects as many again during a burst, up to max_idle 16)"
    );
    b.pool.shutdown().await;
}
