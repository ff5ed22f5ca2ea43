//! The adaptive warm pool (the default policy) through the real pool on the in-memory cloud, on
//! tokio's paused clock: what an idle node holds, how a burst is warmed for, how slowly leftovers go
//! back, and that bad knobs are refused. The policy's arithmetic is unit-tested in
//! `src/pool/demand.rs`; these tests check the pool acts on it (calls made, IPs held).

mod pool_support;

use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::config::DaemonConfig;
use eniipam::pool::PoolConfig;
use eniipam::pool::config::WarmPolicy;
use pool_support::{acquire_many, key, pod, start};
use tokio::time::advance;

/// The shipped warm knobs on a node whose eth0 serves pods (m5.large-like: 9 pod IPs per ENI).
fn adaptive() -> PoolConfig {
    PoolConfig {
        maintainer_tick: Duration::from_secs(3600),
        ..PoolConfig::default()
    }
}

#[test]
fn adaptive_is_the_default_and_bad_knobs_name_themselves() {
    let c = PoolConfig::default();
    assert_eq!(c.warm_policy, WarmPolicy::Adaptive);
    assert_eq!((c.min_idle, c.max_idle), (2, 16));
    let err = PoolConfig {
        give_back_delay: Duration::from_secs(2 * 24 * 3600),
        ..PoolConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.field, "give_back_delay");
    assert_eq!("fixed".parse::<WarmPolicy>(), Ok(WarmPolicy::Fixed));
    let bad = "lazy".parse::<WarmPolicy>().unwrap_err();
    assert!(bad.contains("adaptive or fixed"), "{bad}");

    // Through the daemon's config: the env override is parsed and a wrong value is named.
    let env: std::collections::BTreeMap<String, String> =
        [("ENIIPAM_WARM_POLICY".to_owned(), "sometimes".to_owned())].into();
    let err = DaemonConfig::load(None, &env).unwrap_err();
    assert!(err.to_string().contains("warm_policy"), "{err}");
    let env: std::collections::BTreeMap<String, String> = [
        ("ENIIPAM_WARM_POLICY".to_owned(), "fixed".to_owned()),
        ("ENIIPAM_MINIMUM_IPS".to_owned(), "10".to_owned()),
    ]
    .into();
    let c = DaemonConfig::load(None, &env).unwrap().pool_config();
    assert_eq!((c.warm_policy, c.minimum_ips), (WarmPolicy::Fixed, 10));
}

#[tokio::test(start_paused = true)]
async fn an_idle_node_holds_a_few_ips_in_one_batch() {
    let n = start(adaptive(), NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!((s.warm_target, s.warm_fill), (2, 3));
    assert_eq!(s.idle, 3, "topped up to the fill level");
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        1,
        "one batch on eth0"
    );
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_burst_is_warmed_for_and_its_leftovers_go_back_slowly() {
    let n = start(adaptive(), NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    // Eight pods at once: a burst. The pool expects as many again.
    for r in acquire_many(&n.pool, 0..8).await {
        r.unwrap();
    }
    let s = n.pool.snapshot();
    assert_eq!(s.warm_target, 8, "{s:?}");
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert!(
        s.idle >= 8,
        "warmed for as many again as the burst brought: {} idle",
        s.idle
    );
    let idle_after_burst = s.idle;

    // The pods go; past the cooldown and the burst, idle IPs past max_idle go back, but only down
    // to halfway between the fill level and max_idle: the rest is held for a repeat.
    for i in 0..8 {
        n.pool.release(&key(i), false).unwrap();
    }
    advance(Duration::from_secs(31)).await;
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!((s.warm_fill, s.warm_keep), (6, 16), "{s:?}");
    assert_eq!(
        s.idle,
        11,
        "given back down to halfway between 6 and 16 ({} were idle)",
        idle_after_burst + 8
    );
    let unassigns = n.cloud.call_count(Action::UnassignPrivateIpAddresses);
    assert!(unassigns >= 1);

    // Nothing more goes back within give_back_delay...
    advance(Duration::from_secs(5 * 60)).await;
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.pool.snapshot().idle, 11);
    assert_eq!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses),
        unassigns
    );

    // ...and once the node has been quiet for it, the pool shrinks to its fill level.
    advance(Duration::from_secs(5 * 60)).await;
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!(s.idle, s.warm_fill, "{s:?}");
    assert_eq!(s.warm_fill, 3);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_trickle_is_served_in_batches_and_not_given_back_while_pods_keep_starting() {
    let n = start(adaptive(), NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    // One pod every 10 s for 5 minutes, each living a minute: no burst, steady churn.
    for i in 0..30 {
        n.pool
            .acquire(key(i), pool_support::pod(i), None, None)
            .await
            .unwrap();
        if i >= 6 {
            n.pool.release(&key(i - 6), false).unwrap();
        }
        n.pool.maintain_now().await.unwrap();
        advance(Duration::from_secs(10)).await;
    }
    let assigns = n.cloud.call_count(Action::AssignPrivateIpAddresses);
    assert!(
        assigns <= 8,
        "30 starts took {assigns} assign calls: a trickle must be batched"
    );
    assert_eq!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses),
        0,
        "nothing given back while pods keep starting (idle never passed max_idle)"
    );
    let s = n.pool.snapshot();
    assert!(s.idle + s.assigned <= 6 + 16, "{s:?}");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_fixed_policy_keeps_minimum_ips_pods_included() {
    let config = PoolConfig {
        warm_policy: WarmPolicy::Fixed,
        min_idle: 2,
        max_idle: 2,
        minimum_ips: 6,
        ..adaptive()
    };
    let n = start(config, NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    assert_eq!(
        n.pool.snapshot().idle,
        6,
        "MINIMUM_IP_TARGET on an empty node"
    );
    for r in acquire_many(&n.pool, 0..5).await {
        r.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!((s.assigned, s.idle), (5, 2), "five pods: min_idle rules");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn ips_still_cooling_do_not_push_warm_ones_back_to_ec2() {
    let config = PoolConfig {
        min_idle: 2,
        max_idle: 4,
        ..adaptive()
    };
    let n = start(config, NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    for r in acquire_many(&n.pool, 0..6).await {
        r.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    assert_eq!(
        n.pool.snapshot().idle,
        4,
        "warmed to max_idle for the burst"
    );
    // All six pods go at once: six IPs cool down beside four warm ones.
    for i in 0..6 {
        n.pool.release(&key(i), false).unwrap();
    }
    advance(Duration::from_secs(1)).await;
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!((s.idle, s.cooling), (10, 6), "{s:?}");
    assert_eq!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses),
        0,
        "the cooling IPs are on their way back into service: the warm ones stay"
    );
    // Past the cooldown the surplus goes back, down to max_idle.
    advance(Duration::from_secs(30)).await;
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.pool.snapshot().idle, 4);
    assert!(n.cloud.call_count(Action::UnassignPrivateIpAddresses) >= 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn leftovers_leave_the_pod_enis_first_and_a_remembered_burst_starts_no_eni_before_its_pods() {
    let n = start(adaptive(), NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    // The first burst: 20 pods, more than eth0 and one more ENI hold (9 each).
    for r in acquire_many(&n.pool, 0..20).await {
        r.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    for i in 0..20 {
        n.pool.release(&key(i), false).unwrap();
    }
    // An hour of quiet: the leftovers go back, the pod ENIs' first (no pod uses them), and the
    // emptied ENIs are released; the warm IPs stay on eth0.
    for _ in 0..7 {
        advance(Duration::from_secs(10 * 60)).await;
        n.pool.maintain_now().await.unwrap();
    }
    let s = n.pool.snapshot();
    assert_eq!(
        (s.enis.len(), s.idle),
        (1, 3),
        "eth0 kept with the warm IPs, the pod ENIs released: {s:?}"
    );
    assert_eq!(n.cloud.call_count(Action::DeleteNetworkInterface), 2);
    let creates = n.cloud.call_count(Action::CreateNetworkInterface);

    // The same scale-up again, its first four pods: a burst, and the node remembers the last one
    // (20). Its warm level expects it, but an ENI is not started for what is only remembered.
    for i in 100..104 {
        n.pool.acquire(key(i), pod(i), None, None).await.unwrap();
        advance(Duration::from_millis(200)).await;
    }
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!(
        s.warm_target, 16,
        "the remembered burst sets the level: {s:?}"
    );
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        creates,
        "no ENI started for warm-ups the node only remembers"
    );
    assert_eq!(s.idle, 5, "eth0's room topped up instead: {s:?}");

    // The rest of the burst: the pods beyond the room get their creates (two ENIs of 9), and the
    // remembered warm-ups ride along in them.
    for r in acquire_many(&n.pool, 104..120).await {
        r.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    let s = n.pool.snapshot();
    assert_eq!(
        n.cloud.call_count(Action::CreateNetworkInterface),
        creates + 2
    );
    assert_eq!((s.enis.len(), s.assigned), (3, 20), "{s:?}");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_give_back_waits_for_an_unused_pod_eni_that_backs_off_rather_than_take_eth0s_ips() {
    let n = start(adaptive(), NodeSpec::default()).await;
    n.pool.maintain_now().await.unwrap();
    for r in acquire_many(&n.pool, 0..20).await {
        r.unwrap();
    }
    n.pool.maintain_now().await.unwrap();
    let eth0 = n.pool.snapshot().enis[0].id.clone();
    let on_eth0 = |n: &pool_support::Node| {
        n.cloud
            .calls_of(Action::UnassignPrivateIpAddresses)
            .iter()
            .filter(|c| c.args.contains(&format!("eni={eth0} ")))
            .count()
    };
    // EC2 throttles every give-back; the pods leave. The leftovers beyond the last burst's level go
    // back from the pod ENIs (no pod uses them), which are throttled and back off.
    n.cloud.fail_rate(
        Action::UnassignPrivateIpAddresses,
        1.0,
        eniipam::cloud::CloudError::Throttled {
            api: "UnassignPrivateIpAddresses".into(),
            code: "RequestLimitExceeded".into(),
        },
    );
    for i in 0..20 {
        n.pool.release(&key(i), false).unwrap();
    }
    // Past the released IPs' cooldown.
    advance(Duration::from_secs(61)).await;
    n.pool.maintain_now().await.unwrap_or_default();
    assert!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses) >= 1,
        "a give-back was tried"
    );
    assert_eq!(on_eth0(&n), 0, "the unused pod ENIs' IPs go first");
    // Rounds while they back off: eth0's IPs do not go instead.
    for _ in 0..5 {
        advance(Duration::from_millis(500)).await;
        n.pool.maintain_now().await.unwrap_or_default();
    }
    assert_eq!(
        on_eth0(&n),
        0,
        "no give-back on eth0 while the pod ENIs back off"
    );
    // EC2 answers again: the pod ENIs empty and are released, eth0 keeps the warm IPs.
    n.cloud.clear_faults();
    for _ in 0..13 {
        advance(Duration::from_secs(60)).await;
        n.pool.maintain_now().await.unwrap_or_default();
    }
    let s = n.pool.snapshot();
    assert_eq!((s.enis.len(), s.enis[0].id.clone()), (1, eth0), "{s:?}");
    assert_eq!(n.cloud.call_count(Action::DeleteNetworkInterface), 2);
    n.pool.check_invariants().unwrap();
}
