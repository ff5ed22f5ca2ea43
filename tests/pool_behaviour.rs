//! Deterministic behaviour tests of the pool on the in-memory cloud (paused tokio time).

mod pool_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::cloud::CloudError;
use eniipam::cloud::lifecycle::{EniLifecycle, LifecycleConfig};
use eniipam::pool::{
    AllocationSeed, BackoffTarget, EniPhaseSnapshot, EniRole, ExhaustionReason, IpState, Pool,
    PoolConfig, PoolError, PoolSeed, PreferUnavailable,
};
use pool_support::{acquire_many, key, pod, quiet_config, settle, start, start_with_enis};
use tokio::time::advance;

fn transient(api: &str) -> CloudError {
    CloudError::Transient {
        api: api.into(),
        message: "injected".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn burst_on_an_existing_eni_costs_one_assign_call() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let results = acquire_many(&n.pool, 0..8).await;
    let ips: BTreeSet<Ipv4Addr> = results
        .iter()
        .map(|r| r.as_ref().expect("acquired").ip)
        .collect();
    assert_eq!(ips.len(), 8, "eight distinct IPs");
    let assigns = n.cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns.len(), 1, "one batched assign: {assigns:?}");
    assert!(assigns[0].args.contains("count=8"), "{}", assigns[0].args);
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    let a = results[0].as_ref().unwrap();
    assert_eq!(a.device_index, 1);
    assert_eq!(a.subnet_cidr, NodeSpec::default().subnet_cidr);
    assert_eq!(a.gateway, Ipv4Addr::new(10, 0, 1, 1));
    assert_eq!(n.pool.snapshot().assigned, 8);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn burst_on_an_empty_node_creates_enis_carrying_the_ips() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    // m5.large-like: 2 pod ENIs × 9 IPs. 12 pods: one ENI of 9, one of 3, no assign calls.
    let results = acquire_many(&n.pool, 0..12).await;
    let ips: BTreeSet<Ipv4Addr> = results
        .iter()
        .map(|r| r.as_ref().expect("acquired").ip)
        .collect();
    assert_eq!(ips.len(), 12);
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 0);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(
        creates[0].args.contains("secondary_ip_count=9"),
        "{}",
        creates[0].args
    );
    assert!(
        creates[1].args.contains("secondary_ip_count=3"),
        "{}",
        creates[1].args
    );
    assert_eq!(n.cloud.call_count(Action::AttachNetworkInterface), 2);
    let snap = n.pool.snapshot();
    let indexes: Vec<u32> = snap.pod_enis().map(|e| e.device_index).collect();
    assert_eq!(indexes, vec![1, 2]);
    assert_eq!(snap.assigned, 12);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_burst_needing_two_enis_creates_them_in_parallel() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.cloud
        .set_latency(Action::CreateNetworkInterface, Duration::from_secs(1));
    n.cloud
        .set_latency(Action::AttachNetworkInterface, Duration::from_secs(1));
    let started = tokio::time::Instant::now();
    // 12 pods, 9 per ENI: two ENIs. One after another would take 4 s of create+attach.
    let results = acquire_many(&n.pool, 0..12).await;
    let took = started.elapsed();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(
        took < Duration::from_secs(3),
        "both ENIs' create+attach chains ran at once: {took:?}"
    );
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn waiters_covered_by_an_eni_being_created_do_not_start_another() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.cloud
        .set_latency(Action::CreateNetworkInterface, Duration::from_secs(1));
    // 3 pods start an ENI with room for 9; 3 more arriving while it is created wait for its room.
    let (first, second) = tokio::join!(acquire_many(&n.pool, 0..3), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        acquire_many(&n.pool, 3..6).await
    });
    assert!(first.iter().chain(&second).all(Result::is_ok));
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        1,
        "{:?}",
        n.cloud.calls_of(Action::CreateNetworkInterface)
    );
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_device_index_taken_behind_the_pools_back_is_skipped() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    // An ENI attached at index 1 that the pool never heard of (an attach whose answer was lost).
    let other = EniLifecycle::new(
        n.cloud.clone(),
        n.cloud.clone(),
        n.node.clone(),
        LifecycleConfig::default(),
    );
    other.create_and_attach(0, 1).await.unwrap();
    n.cloud.reset_calls();

    let got = n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    assert_eq!(got.device_index, 2, "attached at the next free index");
    let attaches = n.cloud.calls_of(Action::AttachNetworkInterface);
    assert_eq!(attaches.len(), 2, "{attaches:?}");
    assert!(attaches[0].error.is_some() && attaches[1].error.is_none());
    assert_eq!(n.cloud.call_count(Action::DescribeInstances), 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn mixed_burst_fills_the_eni_then_creates_one_more() {
    // One ENI with 5 of 9 slots taken by seeded pods: 4 left. 10 pods: assign(4) + create(6).
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[5]).await;
    let seeded: Vec<Ipv4Addr> = n.cloud.attached_enis()[1].secondary_ips.clone();
    drop(n.pool);
    let interfaces = eniipam::cloud::Metadata::interfaces(&*n.cloud)
        .await
        .unwrap();
    let mut seed = PoolSeed::from_metadata(&interfaces, &[n.cloud.attached_enis()[1].id.clone()]);
    seed.allocations = seeded
        .iter()
        .enumerate()
        .map(|(i, ip)| AllocationSeed {
            ip: *ip,
            attachment: key(100 + i),
            pod: pod(100 + i),
            sticky_key: None,
            meta: Default::default(),
        })
        .collect();
    n.cloud.reset_calls();
    let pool = Pool::start(
        quiet_config(),
        n.cloud.clone(),
        n.cloud.clone(),
        n.node.clone(),
        seed,
    )
    .unwrap();
    assert_eq!(pool.snapshot().assigned, 5);
    let again = pool.acquire(key(100), pod(100), None, None).await.unwrap();
    assert_eq!(again.ip, seeded[0], "restored assignment is idempotent");

    let results = acquire_many(&pool, 0..10).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let assigns = n.cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns.len(), 1);
    assert!(assigns[0].args.contains("count=4"), "{}", assigns[0].args);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 1);
    assert!(
        creates[0].args.contains("secondary_ip_count=6"),
        "{}",
        creates[0].args
    );
    pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn acquire_is_idempotent_and_release_of_unknown_is_a_noop() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    // Two concurrent acquires for the same attachment: one IP, one call.
    let (a, b) = tokio::join!(
        n.pool.acquire(key(1), pod(1), None, None),
        n.pool.acquire(key(1), pod(1), None, None)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    let c = n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    assert_eq!(c.ip, a.ip);
    assert_eq!(n.pool.snapshot().assigned, 1);
    assert_eq!(n.pool.release(&key(99), false), Ok(None));
    assert_eq!(
        n.pool.release(&key(1), false).map(|r| r.map(|r| r.ip)),
        Ok(Some(a.ip))
    );
    assert_eq!(
        n.pool.release(&key(1), false),
        Ok(None),
        "second DEL is a no-op"
    );
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_released_ip_waits_out_its_cooldown() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let first = n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    n.pool.release(&key(1), false).unwrap();
    assert!(matches!(
        n.pool.snapshot().ip(first.ip),
        Some(IpState::Cooling { .. })
    ));
    let second = n.pool.acquire(key(2), pod(2), None, None).await.unwrap();
    assert_ne!(second.ip, first.ip, "a cooling IP goes to no other pod");
    advance(Duration::from_secs(29)).await;
    let third = n.pool.acquire(key(3), pod(3), None, None).await.unwrap();
    assert_ne!(third.ip, first.ip);
    advance(Duration::from_secs(2)).await;
    let calls = n.cloud.call_count(Action::AssignPrivateIpAddresses);
    let fourth = n.pool.acquire(key(4), pod(4), None, None).await.unwrap();
    assert_eq!(
        fourth.ip, first.ip,
        "past cooldown, the oldest idle IP is reused"
    );
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        calls,
        "no cloud call"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_ips_are_reused_oldest_first() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let got: Vec<Ipv4Addr> = acquire_many(&n.pool, 0..3)
        .await
        .into_iter()
        .map(|r| r.unwrap().ip)
        .collect();
    for i in [2, 0, 1] {
        n.pool.release(&key(i), false).unwrap();
        advance(Duration::from_secs(1)).await;
    }
    advance(Duration::from_secs(60)).await;
    let mut reused = Vec::new();
    for i in 10..13 {
        reused.push(n.pool.acquire(key(i), pod(i), None, None).await.unwrap().ip);
    }
    assert_eq!(
        reused,
        vec![got[2], got[0], got[1]],
        "released first, reused first"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sticky_ip_comes_back_to_its_key_and_nobody_else() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let web = Some("shop/web-0".to_owned());
    let first = n
        .pool
        .acquire(key(1), pod(1), None, web.clone())
        .await
        .unwrap();
    n.pool.release(&key(1), true).unwrap();
    advance(Duration::from_secs(60)).await; // past cooldown, within the stick time
    assert!(matches!(
        n.pool.snapshot().ip(first.ip),
        Some(IpState::Reserved { key, .. }) if key == "shop/web-0"
    ));
    let other = n.pool.acquire(key(2), pod(2), None, None).await.unwrap();
    assert_ne!(other.ip, first.ip, "reserved for its key");
    let err = n
        .pool
        .acquire(key(3), pod(3), Some(first.ip), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::PreferredUnavailable {
                reason: PreferUnavailable::ReservedForOther { .. },
                ..
            }
        ),
        "{err}"
    );
    let back = n
        .pool
        .acquire(key(4), pod(1), None, web.clone())
        .await
        .unwrap();
    assert_eq!(back.ip, first.ip, "the same pod name gets its IP back");

    // After the stick time the IP is anybody's.
    n.pool.release(&key(4), true).unwrap();
    advance(Duration::from_secs(5 * 60 + 1)).await;
    let anyone = n.pool.acquire(key(5), pod(5), None, None).await.unwrap();
    assert_eq!(anyone.ip, first.ip);
}

#[tokio::test(start_paused = true)]
async fn prefer_is_honoured_or_refused_with_a_typed_error() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let a = n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    let b = n.pool.acquire(key(2), pod(2), None, None).await.unwrap();
    let err = n
        .pool
        .acquire(key(3), pod(3), Some(a.ip), None)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        PoolError::PreferredUnavailable {
            ip: a.ip,
            reason: PreferUnavailable::Assigned
        }
    );
    n.pool.release(&key(2), false).unwrap();
    let err = n
        .pool
        .acquire(key(3), pod(3), Some(b.ip), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::PreferredUnavailable {
                reason: PreferUnavailable::Cooling { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = n
        .pool
        .acquire(key(3), pod(3), Some(Ipv4Addr::new(192, 0, 2, 1)), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::PreferredUnavailable {
                reason: PreferUnavailable::NotInPool,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_retryable());
    advance(Duration::from_secs(31)).await;
    let got = n
        .pool
        .acquire(key(3), pod(3), Some(b.ip), None)
        .await
        .unwrap();
    assert_eq!(got.ip, b.ip);
}

#[tokio::test(start_paused = true)]
async fn min_idle_prewarms_in_batches_to_halfway_to_max_idle() {
    let config = PoolConfig {
        min_idle: 4,
        max_idle: 8,
        ..quiet_config()
    };
    assert_eq!(config.refill_target(), 6);
    let n = start(config, NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    let snap = n.pool.snapshot();
    assert_eq!(
        snap.idle, 6,
        "filled to halfway between min_idle and max_idle"
    );
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 1);
    assert!(
        creates[0].args.contains("secondary_ip_count=6"),
        "{}",
        creates[0].args
    );
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 0);

    // Down to min_idle: no call (the batch left headroom).
    for i in 0..2 {
        n.pool.acquire(key(i), pod(i), None, None).await.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 0);
    assert_eq!(n.pool.snapshot().idle, 4);

    // Below it: one batch back up to 6.
    n.pool.acquire(key(2), pod(2), None, None).await.unwrap();
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        0,
        "served from idle"
    );
    n.pool.maintain_now().await.unwrap();
    let assigns = n.cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns.len(), 1, "one top-up batch: {assigns:?}");
    assert!(assigns[0].args.contains("count=3"), "{}", assigns[0].args);
    assert_eq!(n.pool.snapshot().idle, 6);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn max_idle_gives_back_the_longest_idle_in_one_call_per_eni() {
    let config = PoolConfig {
        max_idle: 2,
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    let ips: Vec<Ipv4Addr> = acquire_many(&n.pool, 0..6)
        .await
        .into_iter()
        .map(|r| r.unwrap().ip)
        .collect();
    for i in 0..6 {
        n.pool.release(&key(i), false).unwrap();
        advance(Duration::from_secs(1)).await;
    }
    // Cooling IPs are never given back.
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.cloud.call_count(Action::UnassignPrivateIpAddresses), 0);
    advance(Duration::from_secs(30)).await;
    n.pool.maintain_now().await.unwrap();
    let unassigns = n.cloud.calls_of(Action::UnassignPrivateIpAddresses);
    assert_eq!(unassigns.len(), 1, "{unassigns:?}");
    let given: Vec<String> = ips[..4].iter().map(|ip| ip.to_string()).collect();
    for ip in &given {
        assert!(
            unassigns[0].args.contains(ip.as_str()),
            "{ip} in {}",
            unassigns[0].args
        );
    }
    let snap = n.pool.snapshot();
    assert_eq!(snap.idle, 2);
    let left: BTreeSet<Ipv4Addr> = snap.ips().map(|s| s.ip).collect();
    assert_eq!(left, ips[4..].iter().copied().collect());
    assert_eq!(snap.tokens_used, 2);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_empty_eni_is_detached_and_deleted() {
    let config = PoolConfig {
        max_idle: 0,
        ..quiet_config()
    };
    let n = start(config, NodeSpec::default()).await;
    acquire_many(&n.pool, 0..2).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    let eni = n.pool.snapshot().pod_enis().next().unwrap().id.clone();
    n.pool.release(&key(0), false).unwrap();
    n.pool.release(&key(1), false).unwrap();
    advance(Duration::from_secs(31)).await;
    n.pool.maintain_now().await.unwrap(); // gives the IPs back
    assert_eq!(n.cloud.call_count(Action::UnassignPrivateIpAddresses), 1);
    n.pool.maintain_now().await.unwrap(); // the ENI is empty: release it
    assert_eq!(n.cloud.call_count(Action::DetachNetworkInterface), 1);
    assert_eq!(n.cloud.call_count(Action::DeleteNetworkInterface), 1);
    assert!(n.cloud.eni(&eni).is_none(), "deleted in EC2");
    let snap = n.pool.snapshot();
    assert!(
        snap.enis.iter().all(|e| e.role == EniRole::Primary),
        "{:?}",
        snap.enis
    );
    assert_eq!(snap.tokens_used, 0);

    // The next pod gets a new ENI at the freed device index.
    let a = n.pool.acquire(key(9), pod(9), None, None).await.unwrap();
    assert_eq!(a.device_index, 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn subnet_exhaustion_backs_off_with_a_typed_error() {
    let spec = NodeSpec {
        subnet_cidr: "10.0.1.0/28".parse().unwrap(),
        ..NodeSpec::default()
    };
    let n = start(quiet_config(), spec).await;
    let taken = n.cloud.take_subnet_ips(u32::MAX);
    let err = n
        .pool
        .acquire(key(1), pod(1), None, None)
        .await
        .unwrap_err();
    match &err {
        PoolError::Exhausted {
            reason: ExhaustionReason::Cloud { error, .. },
            retry_after,
        } => {
            assert!(matches!(**error, CloudError::SubnetFull { .. }), "{error}");
            assert_eq!(*retry_after, Some(Duration::from_secs(120)));
        }
        other => panic!("expected exhaustion, got {other}"),
    }
    assert!(err.is_retryable(), "CNI error 11");
    let snap = n.pool.snapshot();
    assert!(
        matches!(snap.exhaustion, Some(ExhaustionReason::Cloud { .. })),
        "{:?}",
        snap.exhaustion
    );
    assert!(
        snap.subnets
            .iter()
            .any(|s| s.backoff.as_ref().is_some_and(|b| b.exhausted))
    );

    // During the back-off: fail fast, no cloud call.
    let creates = n.cloud.call_count(Action::CreateNetworkInterface);
    let err = n
        .pool
        .acquire(key(2), pod(2), None, None)
        .await
        .unwrap_err();
    assert!(err.is_exhausted(), "{err}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), creates);

    n.cloud.free_subnet_ips(&taken);
    advance(Duration::from_secs(121)).await;
    assert_eq!(n.pool.snapshot().exhaustion, None);
    n.pool.acquire(key(3), pod(3), None, None).await.unwrap();
    n.pool.check_invariants().unwrap();
}

/// With `add_wait` zero (fail at once, the behaviour before ADDs waited): `tests/pool_add_wait.rs`
/// has the default, where the waiters wait out the back-off instead.
fn fail_fast() -> PoolConfig {
    PoolConfig {
        add_wait: Duration::ZERO,
        ..quiet_config()
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_fails_every_waiter_and_the_eni_recovers() {
    let n = start_with_enis(fail_fast(), NodeSpec::default(), &[0]).await;
    let injected = transient("AssignPrivateIpAddresses");
    n.cloud
        .fail_next(Action::AssignPrivateIpAddresses, 1, injected.clone());
    let results = acquire_many(&n.pool, 0..5).await;
    for r in &results {
        assert_eq!(r, &Err(PoolError::Cloud(injected.clone())));
    }
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    let snap = n.pool.snapshot();
    let eni = snap.pod_enis().next().unwrap();
    assert!(
        matches!(eni.phase, EniPhaseSnapshot::BackingOff { failures: 1, .. }),
        "{:?}",
        eni.phase
    );
    assert_eq!(snap.tokens_used, 0, "tokens came back");

    // While backing off: a typed error, no cloud call, no new ENI.
    let err = n
        .pool
        .acquire(key(9), pod(9), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PoolError::BackingOff { target: BackoffTarget::Eni(id), .. } if *id == eni.id),
        "{err}"
    );
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 1);
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);

    advance(PoolConfig::default().eni_backoff).await;
    let ok = n.pool.acquire(key(9), pod(9), None, None).await.unwrap();
    assert_eq!(ok.eni, eni.id);
    assert!(matches!(
        n.pool.snapshot().pod_enis().next().unwrap().phase,
        EniPhaseSnapshot::Serving
    ));
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_create_fails_its_waiters_and_backs_off_creation() {
    let n = start(fail_fast(), NodeSpec::default()).await;
    n.cloud.fail_next(
        Action::CreateNetworkInterface,
        1,
        transient("CreateNetworkInterface"),
    );
    let results = acquire_many(&n.pool, 0..3).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(PoolError::Cloud(_)))),
        "{results:?}"
    );
    let err = n
        .pool
        .acquire(key(5), pod(5), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::BackingOff {
                target: BackoffTarget::EniCreation { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    advance(Duration::from_secs(2)).await;
    n.pool.acquire(key(5), pod(5), None, None).await.unwrap();
    assert_eq!(n.pool.snapshot().tokens_used, 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn capacity_is_never_exceeded() {
    let config = PoolConfig {
        max_ips: Some(3),
        ..quiet_config()
    };
    let n = start(config, NodeSpec::default()).await;
    let results = acquire_many(&n.pool, 0..5).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
    for r in results.iter().filter(|r| r.is_err()) {
        assert!(
            matches!(
                r,
                Err(PoolError::Exhausted {
                    reason: ExhaustionReason::CapacityReached { capacity: 3, .. },
                    ..
                })
            ),
            "{r:?}"
        );
    }
    let snap = n.pool.snapshot();
    assert_eq!(snap.capacity, 3);
    assert_eq!(snap.tokens_used, 3);
    assert!(matches!(
        snap.exhaustion,
        Some(ExhaustionReason::CapacityReached { .. })
    ));
    assert_eq!(n.cloud.secondary_ips().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn capacity_leaves_out_eth0_and_secondary_primaries() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    // 3 ENIs × 10 IPv4: eth0 excluded, each secondary ENI's primary excluded.
    assert_eq!(n.pool.snapshot().capacity, 2 * 9);
    let results = acquire_many(&n.pool, 0..20).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 18);
    assert_eq!(n.cloud.attached_enis().len(), 3);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn invalid_config_names_the_field() {
    let (cloud, node) = pool_support::memory_cloud::MemoryCloud::with_node(NodeSpec::default());
    let config = PoolConfig {
        min_idle: 8,
        max_idle: 3,
        ..PoolConfig::default()
    };
    let err = Pool::start(config, cloud.clone(), cloud, node, PoolSeed::default()).unwrap_err();
    match err {
        PoolError::Config(e) => assert_eq!(e.field, "min_idle"),
        other => panic!("{other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_and_stops() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    n.pool.shutdown().await;
    settle().await;
    assert_eq!(
        n.pool.acquire(key(2), pod(2), None, None).await,
        Err(PoolError::ShuttingDown)
    );
    assert_eq!(n.pool.maintain_now().await, Err(PoolError::ShuttingDown));
}

/// Issue 13, case 6: an acquire cancelled while its request waits for room in a full ipBacklog gives
/// back its capacity token and its pending entry; the accounting stays exact and a repeated acquire of
/// the same attachment gets an IP.
#[tokio::test(start_paused = true)]
async fn an_acquire_cancelled_on_a_full_backlog_leaks_nothing() {
    let config = PoolConfig {
        backlog_depth: 1,
        min_idle: 0,
        ..quiet_config()
    };
    let n = start_with_enis(config, NodeSpec::default(), &[0]).await;
    // The ENI actor is busy in a slow assign, so its one-slot backlog fills up behind it.
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::from_secs(5));
    let first = {
        let pool = n.pool.clone();
        tokio::spawn(async move { pool.acquire(key(1), pod(1), None, None).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued = {
        let pool = n.pool.clone();
        tokio::spawn(async move { pool.acquire(key(2), pod(2), None, None).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // This one cannot even enqueue: cancel it while it waits.
    let cancelled = {
        let pool = n.pool.clone();
        tokio::spawn(async move { pool.acquire(key(3), pod(3), None, None).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!cancelled.is_finished());
    cancelled.abort();
    let _ = cancelled.await;
    n.pool.check_invariants().unwrap();
    let s = n.pool.snapshot();
    assert_eq!(s.in_flight, 2, "only the two live requests are in flight");
    // The live ones complete; the cancelled attachment can ask again and gets an IP.
    first.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::ZERO);
    let again = n.pool.acquire(key(3), pod(3), None, None).await.unwrap();
    assert_eq!(n.pool.allocation(&key(3)).map(|a| a.ip), Some(again.ip));
    n.pool.check_invariants().unwrap();
    assert_eq!(n.pool.snapshot().assigned, 3);
}

/// EC2 never assigns an address twice, so only a misread answer (an ambiguous assign settled from a
/// describe that lagged an earlier change) can name an IP the pool already holds. Here the in-memory
/// cloud is made to hand a pod's IP out again: the pool takes the others of the answer and never
/// gives that IP to a second pod.
#[tokio::test(start_paused = true)]
async fn an_assign_answer_naming_an_ip_the_pool_holds_does_not_hand_it_out_twice() {
    let n = start_with_enis(quiet_config(), NodeSpec::default(), &[0]).await;
    let first = acquire_many(&n.pool, 0..2).await;
    let taken: Vec<Ipv4Addr> = first.iter().map(|r| r.as_ref().unwrap().ip).collect();
    // The cloud forgets that the first pod's IP is in use: its next pick is that IP again.
    n.cloud.free_subnet_ips(&taken[..1]);
    let more = acquire_many(&n.pool, 2..5).await;
    let mut holders: BTreeSet<Ipv4Addr> = taken.iter().copied().collect();
    for r in more.iter().flatten() {
        assert!(holders.insert(r.ip), "{} handed out twice", r.ip);
    }
    assert!(
        more.iter().flatten().count() >= 2,
        "the rest of the answer serves: {more:?}"
    );
    n.pool.check_invariants().unwrap();
    assert_eq!(n.pool.snapshot().assigned as usize, holders.len());
}
