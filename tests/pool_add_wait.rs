//! ADDs that wait (issue 25): when EC2 is slow to serve (throttled, an ENI or ENI creation backing
//! off after a transient failure) an acquire keeps its place and its token for up to `add_wait` (or
//! the caller's own budget), and the node's waiters go in one batched call once EC2 takes calls
//! again; past the budget it fails with `WaitedTooLong`, tokens back. In-memory cloud, paused clock.

mod pool_support;

use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::cloud::CloudError;
use eniipam::pool::{Acquire, AttachmentMeta, EniPhaseSnapshot, IpState, PoolConfig, PoolError};
use pool_support::{acquire_many, key, pod, quiet_config, start, start_with_enis, throttled};
use tokio::time::Instant;

fn transient(api: &str) -> CloudError {
    CloudError::Transient {
        api: api.into(),
        message: "injected".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn throttled_waiters_wait_out_the_back_off_and_one_call_serves_them_all() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1,
        throttled("AssignPrivateIpAddresses"),
    );
    let started = Instant::now();
    let results = acquire_many(&n.pool, 0..6).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // One throttled call, then one call for all six: no call per waiter, no retry per pod.
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 2);
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        0,
        "the ENI had room"
    );
    let waited = started.elapsed();
    let backoff = PoolConfig::default().eni_backoff;
    assert!(waited >= backoff, "served after the back-off: {waited:?}");
    assert!(
        waited < backoff + Duration::from_secs(1),
        "served as the back-off ended, not at the maintainer's tick (an hour): {waited:?}"
    );
    let snap = n.pool.snapshot();
    assert!(matches!(
        snap.pod_enis().next().unwrap().phase,
        EniPhaseSnapshot::Serving
    ));
    assert_eq!(snap.tokens_used, 6);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_request_arriving_during_the_back_off_joins_the_line_instead_of_failing() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1,
        transient("AssignPrivateIpAddresses"),
    );
    let first = n.pool.acquire(key(0), pod(0), None, None);
    let second = async {
        // The first request's call fails; the ENI backs off; this one arrives during it.
        while n.cloud.call_count(Action::AssignPrivateIpAddresses) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let phase = n.pool.snapshot().pod_enis().next().unwrap().phase.clone();
        assert!(
            matches!(phase, EniPhaseSnapshot::BackingOff { .. }),
            "{phase:?}"
        );
        n.pool.acquire(key(1), pod(1), None, None).await
    };
    let (first, second) = tokio::join!(first, second);
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_ne!(first.ip, second.ip);
    // One call failed; one call served both.
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 2);
    n.pool.check_invariants().unwrap();
}

/// The budget is spent: answered with `WaitedTooLong` (CNI error 11), naming what it waited for, as
/// soon as the next try cannot come within it, and its token back.
fn assert_gave_up(r: &Result<eniipam::pool::Allocation, PoolError>) {
    match r {
        Err(e @ PoolError::WaitedTooLong { last_error, .. }) => {
            assert!(e.is_retryable(), "CNI error 11: {e}");
            assert!(last_error.to_string().contains("throttled"), "{e}");
        }
        other => panic!("expected WaitedTooLong, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn past_its_budget_a_waiter_fails_with_what_it_waited_for_and_gives_its_token_back() {
    let config = PoolConfig {
        add_wait: Duration::from_secs(20),
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    // EC2 throttles every assign for the whole test.
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1_000,
        throttled("AssignPrivateIpAddresses"),
    );
    let started = Instant::now();
    let results = acquire_many(&n.pool, 0..3).await;
    let waited = started.elapsed();
    results.iter().for_each(assert_gave_up);
    // Back-offs double: tries at 0, 1, 3, 7 and 15 s; the next would come at 31 s, past the budget,
    // so the waiters are told at 15 s rather than held to 20 s for nothing.
    assert!(
        waited >= Duration::from_secs(15) && waited < Duration::from_secs(16),
        "answered when the next try could not come within the budget: {waited:?}"
    );
    // One call per try for all three waiters.
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 5);
    let snap = n.pool.snapshot();
    assert_eq!(snap.tokens_used, 0, "every token came back");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slow_failing_call_still_answers_its_waiters_by_their_deadline() {
    let config = PoolConfig {
        add_wait: Duration::from_secs(10),
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    // Each throttled call takes 4 s (the limiter's own retries); every one fails.
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::from_secs(4));
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1_000,
        throttled("AssignPrivateIpAddresses"),
    );
    let started = Instant::now();
    let results = acquire_many(&n.pool, 0..2).await;
    results.iter().for_each(assert_gave_up);
    let waited = started.elapsed();
    // Tries at 0 (fails at 4 s) and 5 s (fails at 9 s); the next back-off (2 s) ends past 10 s.
    assert!(
        waited >= Duration::from_secs(9) && waited <= Duration::from_secs(10),
        "{waited:?}"
    );
    assert_eq!(n.pool.snapshot().tokens_used, 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_budget_shortens_the_wait() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1_000,
        throttled("AssignPrivateIpAddresses"),
    );
    let started = Instant::now();
    let result = n
        .pool
        .acquire_with(Acquire {
            key: key(0),
            pod: pod(0),
            prefer: None,
            sticky_key: None,
            meta: AttachmentMeta::default(),
            wait: Some(Duration::from_secs(5)),
            network: None,
        })
        .await;
    assert_gave_up(&result);
    // Tries at 0, 1 and 3 s; the next (7 s) is past the caller's 5 s, not the pool's 100 s.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_back_off_longer_than_the_budget_fails_at_once() {
    let config = PoolConfig {
        add_wait: Duration::from_secs(3),
        eni_backoff: Duration::from_secs(10),
        eni_backoff_max: Duration::from_secs(60),
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1,
        transient("AssignPrivateIpAddresses"),
    );
    // The first request's call fails, and the ENI backs off for 10 s, beyond its 3 s budget: it is
    // told at once.
    let started = Instant::now();
    let err = n
        .pool
        .acquire(key(0), pod(0), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PoolError::WaitedTooLong { last_error, .. } if matches!(**last_error, PoolError::BackingOff { .. })),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_millis(100));
    // A request that meets the back-off is told so at once, without waiting.
    let err = n
        .pool
        .acquire(key(1), pod(1), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PoolError::BackingOff { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(n.pool.snapshot().tokens_used, 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn failures_that_waiting_cannot_mend_fail_at_once() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let denied = CloudError::Unauthorized {
        api: "AssignPrivateIpAddresses".into(),
        permission: "ec2:AssignPrivateIpAddresses".into(),
        message: "injected".into(),
    };
    n.cloud
        .fail_next(Action::AssignPrivateIpAddresses, 1, denied.clone());
    let started = Instant::now();
    let results = acquire_many(&n.pool, 0..3).await;
    for r in &results {
        assert_eq!(r, &Err(PoolError::Cloud(denied.clone())));
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    // And while the ENI backs off after it, a new request is told so at once, not held.
    let err = n
        .pool
        .acquire(key(7), pod(7), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PoolError::BackingOff { .. }), "{err}");
    assert_eq!(n.pool.snapshot().tokens_used, 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_throttled_create_keeps_its_waiters_and_the_next_create_carries_them() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.cloud.fail_next(
        Action::CreateNetworkInterface,
        1,
        throttled("CreateNetworkInterface"),
    );
    let results = acquire_many(&n.pool, 0..4).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        0,
        "the second create carried the four IPs"
    );
    assert_eq!(n.pool.snapshot().tokens_used, 4);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_goes_away_while_waiting_gives_its_token_back() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    n.cloud.fail_next(
        Action::AssignPrivateIpAddresses,
        1_000,
        throttled("AssignPrivateIpAddresses"),
    );
    let gone = tokio::time::timeout(
        Duration::from_secs(2),
        n.pool.acquire(key(0), pod(0), None, None),
    )
    .await;
    assert!(gone.is_err(), "still waiting when the caller left");
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.pool.snapshot().tokens_used, 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_ip_is_still_on_the_way_is_answered_by_its_budget_and_the_ip_is_kept() {
    let config = PoolConfig {
        add_wait: Duration::from_secs(10),
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    // EC2 takes 30 s to answer the assign: no throttle, no back-off, the call is just on the wire
    // (a limiter retrying it, an ENI's create and attach, look the same from the waiter).
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::from_secs(30));
    let started = Instant::now();
    let r = n.pool.acquire(key(0), pod(0), None, None).await;
    let waited = started.elapsed();
    match &r {
        Err(e @ PoolError::WaitedTooLong { last_error, .. }) => {
            assert!(e.is_retryable(), "CNI error 11: {e}");
            assert_eq!(**last_error, PoolError::StillComing, "{e}");
            assert!(e.to_string().contains("still on the way"), "{e}");
        }
        other => panic!("expected WaitedTooLong, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "answered by its budget, not at the caller's deadline: {waited:?}"
    );

    // The assign lands later: its IP is the pool's, idle, not lost; the pod's retry is served
    // without another call.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let _ = n.pool.maintain_now().await;
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    let again = n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    let snap = n.pool.snapshot();
    assert_eq!(snap.assigned, 1);
    assert!(
        matches!(snap.ip(again.ip), Some(IpState::Assigned { attachment, .. }) if *attachment == key(0)),
        "{snap:?}"
    );
    n.pool.check_invariants().unwrap();
}
