//! The pool on the real cloud clients against mockcloud with EC2-like latency and throttling: a cold burst
//! of 100 pods on an empty c5.4xlarge must all get IPs, and cost at most 1.25 × the fewest mutating EC2
//! calls that can serve it.

#[path = "cloud_support/mod.rs"]
mod cloud_support;

use std::collections::BTreeSet;
use std::time::Duration;

use cloud_support::Env;
use eniipam::cloud::Metadata;
use eniipam::cloud::limiter::LimiterConfig;
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::{Pool, PoolConfig, PoolSeed};
use mockcloud::{ActionClass, Config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_of_100_pods_costs_the_fewest_calls() {
    let mock_config = Config {
        default_instance_type: "c5.4xlarge".into(),
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
        PoolConfig::default(),
        env.cloud.clone(),
        env.imds.clone(),
        env.node.clone(),
        PoolSeed::from_metadata(&interfaces, &[]),
    )
    .expect("pool starts");
    env.mock.reset_counters();

    let started = tokio::time::Instant::now();
    let acquires = (0..100).map(|i| {
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
    let mut ips = BTreeSet::new();
    for a in futures::future::join_all(acquires).await {
        let alloc = a.expect("task").expect("every pod gets an IP");
        assert!(ips.insert(alloc.ip), "{} handed out twice", alloc.ip);
        assert_ne!(alloc.device_index, 0, "pods never get eth0's IPs");
    }
    let elapsed = started.elapsed();
    assert_eq!(ips.len(), 100);

    // Every IP handed out is on an ENI of this instance in EC2.
    let inst = env.mock.instance(&env.instance.instance_id).unwrap();
    let ec2_ips: BTreeSet<_> = inst
        .enis
        .iter()
        .flat_map(|e| e.secondary_ips.clone())
        .collect();
    assert!(ips.is_subset(&ec2_ips), "EC2 holds every pod IP");

    // The fewest mutating calls: each new ENI costs Create + Attach + ModifyNetworkInterfaceAttribute
    // (DeleteOnTermination), and carries up to ipv4_per_eni - 1 pod IPs in the create call itself.
    let per_eni = u64::from(env.node.limits.ipv4_per_eni - 1);
    let enis_needed = 100_u64.div_ceil(per_eni);
    let minimum = enis_needed * 3;
    let counters = env.mock.counters();
    let mutating: u64 = counters
        .actions
        .iter()
        .filter(|(a, _)| ActionClass::of(a) == ActionClass::Mutating)
        .map(|(_, c)| c.calls)
        .sum();
    println!(
        "cold burst: 100 pods on c5.4xlarge in {elapsed:?}; mutating EC2 calls {mutating} (minimum {minimum}, {enis_needed} ENIs); \
         describe calls {}; throttled {}; by action {:?}",
        counters.total_calls() - mutating,
        counters.total_throttled(),
        counters
            .actions
            .iter()
            .map(|(a, c)| (a.as_str(), c.calls))
            .collect::<Vec<_>>()
    );
    assert!(
        mutating as f64 <= 1.25 * minimum as f64,
        "{mutating} mutating calls > 1.25 x minimum {minimum}"
    );
    assert_eq!(
        counters.total_throttled(),
        0,
        "the node's limiter keeps it under EC2's buckets"
    );
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}
