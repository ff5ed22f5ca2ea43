//! A CreateNetworkInterface that EC2 throttles carries, at its next attempt, the pods that came
//! while it waited: the cloud layer asks for the live count while EC2 has acted on no attempt, and
//! freezes it from the first attempt EC2 may have acted on (its ClientToken holds the parameters).
//! The pool raises the count for the waiters in line, so they are served by the create itself, not
//! by an assign on the new ENI after it attaches. mockcloud with the real SDK clients, on loopback.

mod cloud_support;

use std::collections::BTreeSet;
use std::time::Duration;

use eniipam::cloud::{Cloud, CreateEni, LiveCount};
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::PoolConfig;
use eniipam::pool::config::WarmPolicy;
use mockcloud::Fault;

use cloud_support::*;

const CREATE: &str = "CreateNetworkInterface";
const ASSIGN: &str = "AssignPrivateIpAddresses";

fn request(env: &Env, live: &LiveCount) -> CreateEni {
    CreateEni {
        subnet_id: env.node.subnet_id.clone(),
        security_groups: env.node.security_groups.clone(),
        description: "live count".into(),
        secondary_ip_count: 2,
        prefix_count: 0,
        private_ips: Vec::new(),
        tags: Default::default(),
        client_token: uuid::Uuid::new_v4().to_string(),
        live_ip_count: Some(live.clone()),
    }
}

/// A create of 2 IPs with `live` as its live count, started; once its first attempt has reached
/// mockcloud, `live` is raised to 5. Returns the create's task.
async fn raised_after_the_first_attempt(
    env: &Env,
    live: &LiveCount,
) -> tokio::task::JoinHandle<eniipam::cloud::CloudResult<eniipam::cloud::Eni>> {
    let create = {
        let (cloud, req) = (env.cloud.clone(), request(env, live));
        tokio::spawn(async move { cloud.create_eni(&req).await })
    };
    until_calls(env, CREATE, 1).await;
    live.set(5);
    create
}

/// Waits (real time, at most 5 s) until mockcloud has seen `n` calls of `action`.
async fn until_calls(env: &Env, action: &str, n: u64) {
    for _ in 0..500 {
        if env.mock.counters().calls(action) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("mockcloud never saw {n} {action} calls");
}

#[tokio::test]
async fn a_throttled_create_asks_for_the_count_raised_meanwhile() {
    let env = Env::start().await;
    env.mock
        .inject_fault(Fault::error(CREATE, "RequestLimitExceeded", 1));
    let live = LiveCount::new(2);
    let create = raised_after_the_first_attempt(&env, &live).await;
    let eni = create.await.unwrap().expect("created on the next attempt");
    assert_eq!(eni.secondary_ips.len(), 5, "the raised count");
    assert_eq!(env.mock.counters().calls(CREATE), 2);
}

#[tokio::test]
async fn a_create_ec2_may_have_acted_on_keeps_its_count() {
    // The first attempt is performed, but its reply comes after the 300 ms attempt timeout: the
    // retry carries the same ClientToken, and so must carry the same count (EC2 answers
    // IdempotentParameterMismatch otherwise), however the live count moved.
    let env = Env::start_with(
        mockcloud::Config::fast(),
        fast_limiter(),
        Duration::from_millis(300),
    )
    .await;
    env.mock
        .inject_fault(Fault::slow_reply(CREATE, Duration::from_millis(800), 1));
    let before = env.eni_ids().len();
    let live = LiveCount::new(2);
    let create = raised_after_the_first_attempt(&env, &live).await;
    let eni = create.await.unwrap().expect("the lost attempt's ENI");
    assert_eq!(
        eni.secondary_ips.len(),
        2,
        "the count the token was used with"
    );
    assert_eq!(
        env.eni_ids().len(),
        before + 1,
        "exactly one ENI was created"
    );
    assert_eq!(env.mock.counters().calls(CREATE), 2);
}

#[tokio::test]
async fn pods_that_come_while_the_create_is_throttled_ride_in_it() {
    let env = Env::start().await;
    // Secondary ENIs only (the first pod needs a new ENI), no warm pool; single IPs, as on a
    // non-Nitro type (with burst prefixes the create carries a whole /28 and has no count to grow).
    let config = PoolConfig {
        use_primary_eni: false,
        burst_prefixes: false,
        warm_policy: WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 100,
        ..PoolConfig::default()
    };
    let pool = env.pool(config).await;
    // EC2 throttles the create's first attempt (its account bucket is dry). The next waits out the
    // node's throttle pause, and is built after it: with the pods that came meanwhile.
    env.mock
        .inject_fault(Fault::error(CREATE, "RequestLimitExceeded", 1));
    let acquire = |i: usize| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let key = AttachmentKey::new(format!("container-{i}"), "eth0");
            let pod = PodRef {
                namespace: "default".into(),
                name: format!("pod-{i}"),
                uid: format!("uid-{i}"),
            };
            pool.acquire(key, pod, None, None).await
        })
    };
    let mut tasks: Vec<_> = (0..2).map(acquire).collect();
    until_calls(&env, CREATE, 1).await;
    // Five more pods while the create waits out the throttle.
    tasks.extend((2..7).map(acquire));
    let mut ips = BTreeSet::new();
    let mut enis = BTreeSet::new();
    for t in tasks {
        let a = t.await.unwrap().expect("every pod gets an IP");
        assert!(ips.insert(a.ip), "{} handed out twice", a.ip);
        enis.insert(a.eni);
    }
    assert_eq!(enis.len(), 1, "one new ENI serves them all");
    let c = env.mock.counters();
    assert_eq!(c.ok(CREATE), 1);
    assert_eq!(
        c.calls(CREATE),
        2,
        "the throttled attempt and the one that landed"
    );
    assert_eq!(
        c.calls(ASSIGN),
        0,
        "the create carried every pod: no assign on the new ENI"
    );
    let eni = enis.into_iter().next().unwrap();
    assert_eq!(
        ips_on(&env, &eni).len(),
        1 + 7,
        "its primary and the 7 pods' IPs"
    );
    pool.check_invariants().expect("pool invariants");
    pool.shutdown().await;
}
