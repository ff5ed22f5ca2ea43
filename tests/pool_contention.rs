//! Account contention (issue 25): once EC2 has throttled the node's growth calls (create, attach),
//! the account's buckets of them are short, and an ENI started for warm-ups alone would spend
//! tokens that pods, here or on other nodes, are waiting on. For a minute after the last such
//! throttle the maintainer starts no ENI for warm-ups alone; a create that carries waiting pods
//! still goes (with the warm-ups riding along at no extra call), and warm-ups start ENIs again once
//! the minute has passed. In-memory cloud, paused clock.

mod pool_support;

use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::cloud::CloudError;
use eniipam::pool::PoolConfig;
use pool_support::{acquire_many, quiet_config, start};

fn throttled(api: &str) -> CloudError {
    CloudError::RetriesExhausted {
        api: api.into(),
        attempts: 5,
        last: format!("{api}: throttled by EC2 (RequestLimitExceeded)"),
        throttled: true,
    }
}

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

#[tokio::test(start_paused = true)]
async fn after_a_throttled_create_warm_ups_start_no_eni_until_a_quiet_minute() {
    let n = start(warm_config(), NodeSpec::default()).await;
    n.cloud.fail_next(
        Action::CreateNetworkInterface,
        1,
        throttled("CreateNetworkInterface"),
    );
    // The first round wants 6 warm IPs and no ENI has room: a create for them, throttled.
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    assert_eq!(n.pool.snapshot().pod_enis().count(), 0);

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
    let n = start(warm_config(), NodeSpec::default()).await;
    n.cloud.fail_next(
        Action::CreateNetworkInterface,
        1,
        throttled("CreateNetworkInterface"),
    );
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
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
