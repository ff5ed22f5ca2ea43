//! Account contention (issue 25): once EC2 has throttled the node's growth calls (create, attach),
//! the account's buckets of them are short, and an ENI started for warm-ups alone would spend
//! tokens that pods, here or on other nodes, are waiting on. For a minute after the last such
//! throttle the maintainer starts no ENI for warm-ups alone; a create that carries waiting pods
//! still goes (with the warm-ups riding along at no extra call), and warm-ups start ENIs again once
//! the minute has passed. Likewise, once EC2 has throttled its assigns, warm-ups make no assign of
//! their own: they ride along in the pods' calls, which bring the node's warm-ups with them anyway
//! (an assign carrying pods tops the node up to its fill level at no extra call), and so do the IPs
//! of pods bound here that have not ADDed yet (the lookahead). In-memory cloud, paused clock.

mod pool_support;

use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::pool::PoolConfig;
use eniipam::pool::config::WarmPolicy;
use pool_support::{
    Node, acquire_many, key, pod, quiet_config, roomy, start, start_with_enis, throttled,
};

/// Warm-ups of 6 on a node that serves pods from new ENIs only (9 pod IPs each), rounds run by
/// hand (the tick is an hour), EC2 creates ENIs after a short back-off.
fn warm_config() -> PoolConfig {
    PoolConfig {
        min_idle: 6,
        max_idle: 12,
        subnet_backoff: Duration::from_secs(1),
        ..quiet_config()
    }
}

/// A node of [`warm_config`] whose first round's create, for warm-ups alone (no ENI has room), EC2
/// throttled.
async fn after_a_throttled_warm_up_create() -> Node {
    let n = start(warm_config(), NodeSpec::default()).await;
    n.cloud.fail_next(
        Action::CreateNetworkInterface,
        1,
        throttled("CreateNetworkInterface"),
    );
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    assert_eq!(n.pool.snapshot().pod_enis().count(), 0);
    n
}

#[tokio::test(start_paused = true)]
async fn after_a_throttled_create_warm_ups_start_no_eni_until_a_quiet_minute() {
    let n = after_a_throttled_warm_up_create().await;

    // Well past the back-off, still within the minute: rounds start no ENI for warm-ups alone.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let _ = n.pool.maintain_now().await;
    }
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        1,
        "no warm-up create within a minute of the throttle"
    );

    // A minute after the throttle the account has had time to refill: warm-ups start an ENI.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    let snap = n.pool.snapshot();
    assert_eq!(snap.pod_enis().count(), 1);
    assert!(snap.idle_eligible >= 6, "warm IPs held: {snap:?}");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn pods_waiting_still_get_a_create_under_contention_with_the_warm_ups_riding_along() {
    let n = after_a_throttled_warm_up_create().await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Three pods arrive while the node is contended: one create carries them and the warm-ups.
    let results = acquire_many(&n.pool, 0..3).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        0,
        "the create carried the pods' IPs and the warm-ups: no assign after it"
    );
    let snap = n.pool.snapshot();
    assert_eq!(snap.pod_enis().count(), 1);
    assert_eq!(snap.pod_enis().next().unwrap().ips.len(), 9);
    n.pool.check_invariants().unwrap();
}

/// The adaptive pool as shipped (2 idle at least), on pod ENIs only, rounds run by hand.
fn adaptive() -> PoolConfig {
    PoolConfig {
        warm_policy: WarmPolicy::Adaptive,
        min_idle: 2,
        max_idle: 16,
        ..quiet_config()
    }
}

#[tokio::test(start_paused = true)]
async fn a_pods_assign_brings_the_warm_ups_along_in_the_same_call() {
    // One ENI with room, nothing idle: the first pod's assign tops the node up too.
    let n = start_with_enis(adaptive(), NodeSpec::default(), &[0]).await;
    let a = n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    let _ = n.pool.maintain_now().await;
    let assigns = n.cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns.len(), 1, "one call: {assigns:?}");
    let snap = n.pool.snapshot();
    let held = snap.pod_enis().next().unwrap().ips.len();
    assert!(
        held >= 3,
        "the pod's IP and at least min_idle warm-ups: {held}"
    );
    assert!(snap.idle_eligible >= 2, "{snap:?}");
    assert!(
        snap.pod_enis()
            .next()
            .unwrap()
            .ips
            .iter()
            .any(|s| s.ip == a.ip)
    );
    n.pool.check_invariants().unwrap();
}

/// An adaptive node on an ENI of 49 pod IPs (room to spare after every call of the tests), whose
/// first pod's assign EC2 throttled; the pod waited out the back-off and its second call brought the
/// warm-ups (under contention up to the give-back level, 16 during a burst). Then pods took every
/// idle IP: the node is below its low mark, with nobody waiting. Returns the node and the number of
/// pods it serves (keys `0..n`).
async fn contended_with_nothing_idle() -> (Node, usize) {
    let (_, spec) = roomy();
    let n = start_with_enis(adaptive(), spec, &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1,
        throttled("AssignPrivateIpAddresses"),
    );
    n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 2);
    let idle = n.pool.snapshot().idle_eligible as usize;
    assert!(idle >= 2, "warm-ups rode along: {idle} idle");
    let took = acquire_many(&n.pool, 1..1 + idle).await;
    assert!(took.iter().all(Result::is_ok), "{took:?}");
    assert_eq!(n.pool.snapshot().idle_eligible, 0);
    (n, 1 + idle)
}

#[tokio::test(start_paused = true)]
async fn after_a_throttled_assign_warm_ups_wait_for_pods_or_a_quiet_minute() {
    // Within the minute after the throttle no call is made for warm-ups alone.
    let (n, next) = contended_with_nothing_idle().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let _ = n.pool.maintain_now().await;
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        2,
        "no assign for warm-ups alone within a minute of the throttle"
    );
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        0,
        "nor an ENI instead, while the attached one has room"
    );

    // A pod now: its call brings the warm-ups along.
    n.pool
        .acquire(key(next), pod(next), None, None)
        .await
        .unwrap();
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 3);
    assert!(n.pool.snapshot().idle_eligible >= 2);

    // Pods take them again; a minute after the throttle, warm-ups make a call of their own.
    let more = n.pool.snapshot().idle_eligible as usize;
    let took = acquire_many(&n.pool, next + 1..next + 1 + more).await;
    assert!(took.iter().all(Result::is_ok), "{took:?}");
    tokio::time::sleep(Duration::from_secs(45)).await;
    let _ = n.pool.maintain_now().await;
    let own_calls = n.cloud.call_count(Action::AssignPrivateIpAddresses) - 3
        + n.cloud.call_count(Action::CreateNetworkInterface);
    assert!(own_calls >= 1, "{:?}", n.cloud.calls());
    assert!(n.pool.snapshot().idle_eligible >= 2);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn pods_arriving_while_a_top_up_is_on_the_wire_take_its_ips_instead_of_a_new_eni() {
    // An ENI with room, nothing idle; assigns take a second to come back.
    let n = start_with_enis(warm_config(), NodeSpec::default(), &[0]).await;
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::from_secs(1));
    // The first pod's assign carries the node's top-up: every slot of the ENI is on the wire.
    let pool = n.pool.clone();
    let first = tokio::spawn(async move { pool.acquire(key(0), pod(0), None, None).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let in_flight = n.pool.snapshot().pod_enis().next().unwrap().in_flight;
    assert_eq!(in_flight, 9, "the pod and its ride-along top-up");

    // Two pods now: no slot left on the ENI, but the warm-ups in flight serve them when they land
    // (and leave the node at its low mark); no ENI is created for them.
    let results = acquire_many(&n.pool, 1..3).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    first.await.unwrap().unwrap();
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_warm_up_ec2_throttled_backs_off_no_eni_and_a_pod_after_it_is_served_at_once() {
    // An ENI with room and a long back-off after a failure: a pod held by one would wait 30 s.
    let config = PoolConfig {
        eni_backoff: Duration::from_secs(30),
        ..warm_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1,
        throttled("AssignPrivateIpAddresses"),
    );
    let _ = n.pool.maintain_now().await;
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        1,
        "the warm-up's call, throttled"
    );
    assert_eq!(n.pool.snapshot().idle_eligible, 0);

    // The throttle is the account's, not the ENI's: a pod now is served by a call of its own at
    // once (the gate, in the real client, paces it), not after the ENI's back-off.
    let start = tokio::time::Instant::now();
    n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 2);
    // And no warm-up call of its own follows within the minute: they rode along in the pod's call.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 2);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn under_assign_contention_pods_bound_here_wait_for_their_adds_and_one_call_serves_them() {
    let (n, _) = contended_with_nothing_idle().await;
    let before = n.cloud.call_count(Action::AssignPrivateIpAddresses);

    // Ten pods bound here (the lookahead), their ADDs not come yet, within the minute after the
    // throttle: their IPs wait for the pods' own call, as a warm-up's would. A call of their own
    // would spend a token of the account's assign bucket that pods are waiting on, and carry only
    // the pods bound so far; at a fleet's scale-up that made every node's first assign a small one.
    let bound: Vec<_> = (100..110).map(pod).collect();
    let seen = n.pool.announce_bound_pods(&bound);
    assert_eq!((seen.new, seen.waiting), (10, 10));
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = n.pool.maintain_now().await;
    }
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        before,
        "no call for pods only bound, under contention"
    );

    // Their ADDs: one call serves them all.
    let served = acquire_many(&n.pool, 100..110).await;
    assert!(served.iter().all(Result::is_ok), "{served:?}");
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        before + 1
    );
    n.pool.check_invariants().unwrap();
}
