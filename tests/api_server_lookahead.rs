//! Issue 25, item 3, through the API-server double: pods bound to the node are warmed for before
//! their ADDs. The watch and the lookahead are the daemon's own (`PodWatch`, `spawn_lookahead`),
//! the pool is real on the in-memory cloud, the clock is tokio's paused one.

mod pool_support;

use std::time::Duration;

use eniipam::metrics::Metrics;
use eniipam::reconcile::api_server::{self, ApiServerTarget, PodWatch, spawn_lookahead};
use eniipam_kubeapi::{FakeApiServer, pod_json};
use pool_support::memory_cloud::Action;
use pool_support::{key, pod};
use tokio::time::advance;
use tokio_util::sync::CancellationToken;

const NODE: &str = "ip-10-0-1-10.ec2.internal";

#[tokio::test(start_paused = true)]
async fn pods_bound_here_get_warm_ips_before_their_adds() {
    let api = FakeApiServer::start().await;
    let (config, spec) = pool_support::roomy();
    let n = pool_support::start(config, spec).await;
    n.pool.maintain_now().await.unwrap();
    let assigns = n.cloud.call_count(Action::AssignPrivateIpAddresses);
    let metrics = Metrics::default();
    let lead = metrics.demand_lead_time.clone();
    n.pool
        .set_lead_time_observer(move |d| lead.observe(d.as_secs_f64()));

    let client = api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .expect("client");
    let cancel = CancellationToken::new();
    let (watch, _task) = PodWatch::spawn(client, NODE.into(), metrics.clone(), cancel.clone());
    let _lookahead = spawn_lookahead(watch.clone(), n.pool.clone(), cancel.clone());

    // A pod already running with its IP, a host-network pod, and one on another node.
    n.pool
        .acquire(key(100), pod(100), None, None)
        .await
        .unwrap();
    api.put_pod(pod_json("default", "pod-100", "uid-100", NODE, "Running"));
    let mut hostnet = pod_json("kube-system", "kube-proxy", "uid-kp", NODE, "Running");
    hostnet["spec"]["hostNetwork"] = true.into();
    api.put_pod(hostnet);
    api.put_pod(pod_json(
        "default",
        "pod-elsewhere",
        "uid-x",
        "other-node",
        "Pending",
    ));
    watch.wait_for(|v| v.synced && v.pods.len() == 2).await;

    // The scheduler binds twelve pods of a ReplicaSet here.
    for i in 0..12 {
        api.put_pod(pod_json(
            "default",
            &format!("pod-{i}"),
            &format!("uid-{i}"),
            NODE,
            "Pending",
        ));
    }
    watch.wait_for(|v| v.pods.len() == 14).await;
    // The lookahead runs on the view's change (its own task: on a loaded machine it may take more
    // than a few yields to run); the maintainer's round is the next thing.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while n.pool.snapshot().warm_target < 12 && std::time::Instant::now() < until {
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
    let s = n.pool.snapshot();
    assert_eq!(
        s.warm_target, 12,
        "twelve pods waiting, not the others: {s:?}"
    );
    n.pool.maintain_now().await.unwrap();
    // Batched: the view may change a few times while the events stream in, never once per pod.
    let warmed = n.cloud.call_count(Action::AssignPrivateIpAddresses);
    assert!(
        warmed - assigns <= 2,
        "{} assigns for twelve pods",
        warmed - assigns
    );
    let idle = n.pool.snapshot().idle;
    assert!(idle >= 12, "{idle} idle before any ADD");

    // The kubelet's ADDs, a second later: no EC2 call, every one served from the warm pool.
    advance(Duration::from_secs(1)).await;
    for i in 0..12 {
        n.pool.acquire(key(i), pod(i), None, None).await.unwrap();
    }
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), warmed);
    let mut text = String::new();
    let mut reg = prometheus_client::registry::Registry::default();
    metrics.register(&mut reg);
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
    assert!(
        text.contains("eniipam_demand_lead_seconds_count 12"),
        "every ADD's lead time is recorded:\n{text}"
    );
    n.pool.check_invariants().unwrap();
    cancel.cancel();
}
