//! Issue 25, item 3: pods bound to the node and not ADDed yet are demand before their ADDs, through
//! the real pool on the in-memory cloud, on tokio's paused clock. What the watch shows is handed to
//! the pool as the lookahead hands it (`pods_wanting_ip` of a view), so host-network, finished and
//! deleted pods are dropped the way the daemon drops them.

mod pool_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eniipam::model::PodRef;
use eniipam::pool::PoolConfig;
use eniipam::pool::demand::ANNOUNCED_FOR;
use eniipam::reconcile::api_server::{BoundPod, BoundPods, PodKey, PodPhase, pods_wanting_ip};
use pool_support::memory_cloud::Action;
use pool_support::{key, pod, roomy, start};
use tokio::time::advance;

fn bound(n: usize) -> BoundPod {
    BoundPod {
        key: PodKey::new("default", format!("pod-{n}")),
        uid: format!("uid-{n}"),
        mirror_of: None,
        host_network: false,
        phase: PodPhase::Pending,
        deleting: false,
        network: None,
    }
}

fn view(pods: impl IntoIterator<Item = BoundPod>) -> BoundPods {
    let pods: BTreeMap<String, BoundPod> =
        pods.into_iter().map(|p| (p.key.to_string(), p)).collect();
    BoundPods {
        synced: true,
        pods: Arc::new(pods),
        generation: 1,
    }
}

fn announced(range: std::ops::Range<usize>) -> Vec<PodRef> {
    pods_wanting_ip(&view(range.map(bound)))
}

#[tokio::test(start_paused = true)]
async fn a_replicaset_bound_here_is_warmed_for_in_one_batch_before_its_adds() {
    let (config, spec) = roomy();
    let n = start(config, spec).await;
    n.pool.maintain_now().await.unwrap();
    let assigns = n.cloud.call_count(Action::AssignPrivateIpAddresses);
    assert_eq!(
        n.pool.snapshot().idle,
        3,
        "an idle node holds its fill level"
    );
    let leads = Arc::new(Mutex::new(Vec::new()));
    let seen = leads.clone();
    n.pool
        .set_lead_time_observer(move |d| seen.lock().unwrap().push(d));

    // Twenty pods bound within a second: a burst of twenty, and twenty pods waiting.
    let bound_at = tokio::time::Instant::now();
    let out = n.pool.announce_bound_pods(&announced(0..20));
    assert_eq!((out.new, out.waiting), (20, 20));
    let s = n.pool.snapshot();
    assert_eq!(s.warm_target, 20, "{s:?}");
    assert_eq!(s.warm_fill, 30, "20 and half the minute's 20 starts: {s:?}");
    n.pool.maintain_now().await.unwrap();
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        assigns + 1,
        "one batched assign, before any ADD"
    );
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    assert_eq!(n.pool.snapshot().idle, 30);

    // The ADDs come two seconds later: every one finds an IP, no call is made.
    advance(Duration::from_secs(2)).await;
    let lead = bound_at.elapsed();
    assert!(lead >= Duration::from_secs(2));
    for i in 0..20 {
        n.pool.acquire(key(i), pod(i), None, None).await.unwrap();
    }
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        assigns + 1
    );
    let leads = leads.lock().unwrap().clone();
    assert_eq!(leads.len(), 20, "each ADD's lead time");
    assert!(
        leads
            .iter()
            .all(|l| *l >= lead && *l < lead + Duration::from_millis(100)),
        "about the two seconds between binding and ADD: {leads:?}"
    );
    // Each pod counted once: the burst is twenty starts, not forty.
    let s = n.pool.snapshot();
    assert_eq!(s.warm_target, 20, "{s:?}");
    // The watch still shows them without an IP for a moment: they hold one, they are not demand.
    let out = n.pool.announce_bound_pods(&announced(0..20));
    assert_eq!((out.new, out.waiting), (0, 0));
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_add_in_flight_while_the_watch_still_shows_the_pod_is_counted_once() {
    let (config, spec) = roomy();
    let n = start(config, spec).await;
    n.pool.maintain_now().await.unwrap();
    // The first view, then an ADD before the watch's next view (its pod has no IP in the view).
    n.pool.announce_bound_pods(&announced(0..1));
    n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    // A pod the watch has not shown yet ADDs, then the watch shows it.
    n.pool.acquire(key(1), pod(1), None, None).await.unwrap();
    n.pool.release(&key(1), false).unwrap();
    let out = n.pool.announce_bound_pods(&announced(0..2));
    assert_eq!(out.new, 0, "both ADDed already: {out:?}");
    // Two starts, not a burst: the levels are an idle node's with a trickle.
    advance(Duration::from_secs(11)).await;
    let s = n.pool.snapshot();
    assert_eq!((s.warm_target, s.warm_fill), (2, 3), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn host_network_finished_and_deleted_pods_stop_counting() {
    let (config, spec) = roomy();
    let n = start(config, spec).await;
    let out = n.pool.announce_bound_pods(&announced(0..8));
    assert_eq!(out.waiting, 8);
    // Past the burst, what holds the level up is the pods waiting.
    advance(Duration::from_secs(11)).await;
    assert_eq!(n.pool.snapshot().warm_target, 8);

    // pod-0 turns out host-network, pod-1 finished, pod-2 is being deleted, pod-3 is gone.
    let mut pods: Vec<BoundPod> = (4..8).map(bound).collect();
    pods.push(BoundPod {
        host_network: true,
        ..bound(0)
    });
    pods.push(BoundPod {
        phase: PodPhase::Failed,
        ..bound(1)
    });
    pods.push(BoundPod {
        deleting: true,
        ..bound(2)
    });
    let out = n.pool.announce_bound_pods(&pods_wanting_ip(&view(pods)));
    assert_eq!((out.new, out.withdrawn, out.waiting), (0, 4, 4));
    assert_eq!(n.pool.snapshot().warm_target, 4);

    // A stale view (the watch re-listing) announces nothing: the lookahead skips it.
    let mut stale = view((0..8).map(bound));
    stale.synced = false;
    assert!(
        !pods_wanting_ip(&stale).is_empty(),
        "the view itself is kept"
    );

    // A host-network pod is never demand, even on its own.
    let hostnet = view([BoundPod {
        host_network: true,
        ..bound(9)
    }]);
    assert!(pods_wanting_ip(&hostnet).is_empty());
}

#[tokio::test(start_paused = true)]
async fn pods_that_never_add_stop_counting_after_a_while() {
    let (config, spec) = roomy();
    let n = start(config, spec).await;
    n.pool.announce_bound_pods(&announced(0..6));
    advance(Duration::from_secs(11)).await;
    assert_eq!(n.pool.snapshot().warm_target, 6);
    advance(ANNOUNCED_FOR - Duration::from_secs(12)).await;
    assert_eq!(n.pool.snapshot().warm_target, 6, "still within the bound");
    advance(Duration::from_secs(2)).await;
    let s = n.pool.snapshot();
    assert_eq!(s.warm_target, 2, "decayed to min_idle: {s:?}");
    // The same view again does not count them anew.
    let out = n.pool.announce_bound_pods(&announced(0..6));
    assert_eq!((out.new, out.waiting), (0, 0));
    assert_eq!(n.pool.snapshot().warm_target, 2);
    // When one of them ADDs at last, it is not a new start either.
    n.pool.acquire(key(0), pod(0), None, None).await.unwrap();
    assert_eq!(n.pool.snapshot().warm_target, 2);
}

#[tokio::test(start_paused = true)]
async fn the_announced_count_is_bounded_by_max_idle_and_the_fixed_policy_ignores_it() {
    let (config, spec) = roomy();
    let n = start(
        PoolConfig {
            max_idle: 16,
            ..config.clone()
        },
        spec.clone(),
    )
    .await;
    n.pool.announce_bound_pods(&announced(0..30));
    let s = n.pool.snapshot();
    assert_eq!((s.warm_target, s.warm_fill), (16, 16), "{s:?}");

    let fixed = PoolConfig {
        warm_policy: eniipam::pool::config::WarmPolicy::Fixed,
        ..config
    };
    let n = start(fixed, spec).await;
    let before = n.pool.snapshot();
    n.pool.announce_bound_pods(&announced(0..30));
    let after = n.pool.snapshot();
    assert_eq!(
        (before.warm_target, before.warm_fill),
        (after.warm_target, after.warm_fill)
    );
}
