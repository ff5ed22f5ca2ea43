//! Issue 25, item 3: the demand the pool learned is written to the state file and read back by the
//! next life of the daemon, with its ages, so the warm levels after a restart are those before it.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use daemon_support::*;
use eniipam::store::{Store, StoredDemand};
use mockcloud::{Config, MockCloud};

/// Start times equal within a few milliseconds (the tokio and wall clocks are read apart).
fn assert_same_memory(a: &StoredDemand, b: &StoredDemand) {
    let close = |x: u64, y: u64| x.abs_diff(y) <= 5;
    assert_eq!(a.starts_ms.len(), b.starts_ms.len(), "{a:?} vs {b:?}");
    assert!(
        a.starts_ms
            .iter()
            .zip(&b.starts_ms)
            .all(|(x, y)| close(*x, *y)),
        "{a:?} vs {b:?}"
    );
    let burst = |d: &StoredDemand| d.last_burst.map(|b| b.starts);
    assert_eq!(burst(a), burst(b));
    assert_eq!(a.run_is_burst, b.run_is_burst);
    assert!(close(a.last_start_ms.unwrap(), b.last_start_ms.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_demand_survives_a_restart() {
    let mock = MockCloud::start(Config {
        default_instance_type: "c5.4xlarge".into(),
        ..Config::fast()
    })
    .await
    .unwrap();
    let dir = TempDir::new("demand-restart");
    let cfg = config(&mock, &dir.0);

    let d = start(cfg.clone()).await;
    let idle_node = d.pool.snapshot();
    // A burst of eight pods.
    let mut c = client(&cfg.socket_path).await;
    let calls = (0..8).map(|i| {
        let mut c = c.clone();
        async move {
            c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                .await
        }
    });
    for r in futures::future::join_all(calls).await {
        r.expect("allocate");
    }
    c.allocate(alloc_req("c0", "p0"))
        .await
        .expect("a retry is not a start");
    let before = d.pool.snapshot();
    let (_, learned) = d.pool.demand_memory();
    assert_eq!(learned.starts_ms.len(), 8);
    assert_eq!(learned.last_burst.map(|b| b.starts), Some(8));
    assert_ne!(
        (idle_node.warm_fill, idle_node.warm_keep),
        (before.warm_fill, before.warm_keep),
        "the burst moved the levels"
    );
    d.shutdown().await;

    // The state file holds it.
    {
        let (store, _) = Store::open(&cfg.state_path).await.unwrap();
        let stored = store
            .load_demand()
            .await
            .unwrap()
            .expect("written at shutdown");
        assert_same_memory(&stored, &learned);
        store.close().await;
    }

    // The next life warms as the last one had learned to.
    let d = start(cfg.clone()).await;
    let (_, restored) = d.pool.demand_memory();
    assert_same_memory(&restored, &learned);
    let after = d.pool.snapshot();
    // Give-back waits for the quiet delay, as before the restart, and the trickle of the last
    // minute still raises the fill level (the burst's own level lasts 10 s: the restart may be
    // slower than that on a loaded machine).
    assert_eq!(after.warm_keep, before.warm_keep, "{after:?}");
    assert!(after.warm_fill > idle_node.warm_fill, "{after:?}");
    d.shutdown().await;
}
