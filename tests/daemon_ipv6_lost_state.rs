//! Issue 26, a lost state file in IPv6 mode: the real daemon, the real AWS SDK, mockcloud. The
//! rebuild takes back the IPv6 (and the node-local egress IPv4) of every pod the plugin's result
//! cache shows with a live network namespace, as the IPv4 rebuild does for IPv4 pods
//! (`tests/daemon_restart.rs`); pods whose namespace is gone are forgotten, and no address is handed
//! to a second pod. Found by the IPv6 soak (`live-lost-ipv6` when the state file went).

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use daemon_support::ipv6::*;
use daemon_support::*;
use eniipam::ipv6::IpFamily;
use eniipam_api::cache::{CACHE_FORMAT, CacheEntry, ResultCache};

/// What the plugin caches after an IPv6-only ADD: the IPv4 field unspecified, the IPv6 in the
/// result's `ips`, the egress address beside it.
fn cached(container: &str, netns: &Path, ipv6: &str, egress: Option<Ipv4Addr>) -> CacheEntry {
    CacheEntry {
        format: CACHE_FORMAT,
        network: "eniipam".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: netns.display().to_string(),
        pod: None,
        sticky_key: None,
        ip: Ipv4Addr::UNSPECIFIED,
        route_table: 0,
        eni_id: String::new(),
        host_veth: None,
        egress_ipv4: egress,
        own_eni_egress: false,
        result: serde_json::json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": netns.display().to_string()}],
            "ips": [{"address": format!("{ipv6}/128"), "interface": 0}],
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_file_gives_live_ipv6_pods_their_addresses_back() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-lost-state");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut held = Vec::new();
    for i in 0..3 {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap()
            .into_inner();
        let ipv6: Ipv6Addr = r.ipv6.parse().unwrap();
        let egress: Ipv4Addr = r.egress_ipv4.parse().unwrap();
        held.push((ipv6, egress));
    }
    d.shutdown().await;

    // The file goes. c0 and c1 still run (their netns exists); c2's netns is gone. c1 was cached
    // by a plugin from before the egress field: its IPv6 comes back, its egress address does not.
    std::fs::remove_file(&cfg.state_path).unwrap();
    let alive = dir.0.join("live-netns");
    std::fs::write(&alive, b"").unwrap();
    let gone = dir.0.join("gone-netns");
    let cache = ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let entries = [
        cached("c0", &alive, &held[0].0.to_string(), Some(held[0].1)),
        cached("c1", &alive, &held[1].0.to_string(), None),
        cached("c2", &gone, &held[2].0.to_string(), Some(held[2].1)),
    ];
    for e in &entries {
        cache.write(e).unwrap();
    }
    let d = start(cfg.clone()).await;
    assert_eq!(
        action_ok(&mock, "AssignIpv6Addresses"),
        1,
        "the /80 on eth0 adopted, not a second one"
    );
    let mut c = client(&d.socket_path).await;
    // A repeated ADD of a live pod returns what it holds.
    let r0 = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r0.ipv6.parse::<Ipv6Addr>().unwrap(), held[0].0);
    assert_eq!(r0.egress_ipv4.parse::<Ipv4Addr>().unwrap(), held[0].1);
    let r1 = c
        .allocate(alloc_req("c1", "p1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r1.ipv6.parse::<Ipv6Addr>().unwrap(), held[1].0);
    // The dead pod's address is not on record: its repeated ADD gets a new one, past every old one.
    let r2 = c
        .allocate(alloc_req("c2", "p2"))
        .await
        .unwrap()
        .into_inner();
    let r2v6: Ipv6Addr = r2.ipv6.parse().unwrap();
    assert!(held.iter().all(|(old, _)| r2v6 > *old), "{r2v6} reissued");
    // New pods never get an address a live pod holds.
    let mut fresh = Vec::new();
    for i in 0..10 {
        let r = c
            .allocate(alloc_req(&format!("n{i}"), &format!("n{i}")))
            .await
            .unwrap()
            .into_inner();
        fresh.push((
            r.ipv6.parse::<Ipv6Addr>().unwrap(),
            r.egress_ipv4.parse::<Ipv4Addr>().unwrap(),
        ));
    }
    for (v6, v4) in &fresh {
        assert!(
            *v6 != held[0].0 && *v6 != held[1].0,
            "{v6} handed out twice"
        );
        assert_ne!(*v4, held[0].1, "c0's egress address handed out twice");
    }
    d.shutdown().await;

    // The rebuilt records are durable: a plain restart keeps the adopted pods.
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let r0 = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r0.ipv6.parse::<Ipv6Addr>().unwrap(), held[0].0);
    d.shutdown().await;
}

/// Starts an IPv6 daemon, gives two pods addresses, stops it and loses its state file with the pods
/// still running (their cache entries written, their netns alive). Returns the config, the pods'
/// addresses and the node's /80 then.
async fn two_live_pods_and_a_lost_file(
    mock: &mockcloud::MockCloud,
    dir: &TempDir,
) -> (eniipam::config::DaemonConfig, Vec<Ipv6Addr>, ipnet::Ipv6Net) {
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let alive = dir.0.join("live-netns");
    std::fs::write(&alive, b"").unwrap();
    let cache = ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let mut held = Vec::new();
    for i in 0..2 {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap()
            .into_inner();
        held.push(r.ipv6.parse::<Ipv6Addr>().unwrap());
        cache
            .write(&cached(&format!("c{i}"), &alive, &r.ipv6, None))
            .unwrap();
    }
    d.shutdown().await;
    std::fs::remove_file(&cfg.state_path).unwrap();
    let prefix = eth0_prefixes(mock)[0];
    (cfg, held, prefix)
}

/// The /80 was unassigned behind the daemon's back, and the state file is lost: the live pods'
/// addresses (the plugin's cache) name the node's /80, which is assigned back, not a new one taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_file_assigns_the_live_pods_80_back() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-lost-80");
    let (cfg, held, prefix) = two_live_pods_and_a_lost_file(&mock, &dir).await;
    let eth0 = mock.default_instance().primary_eni;
    mock.with_world(|w, now| w.unassign_ipv6(&eth0, &[], &[prefix], now).unwrap());
    assert!(eth0_prefixes(&mock).is_empty());
    let d = start(cfg.clone()).await;
    assert_eq!(
        eth0_prefixes(&mock),
        vec![prefix],
        "the same /80, back on eth0"
    );
    let mut c = client(&d.socket_path).await;
    for (i, ip) in held.iter().enumerate() {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.ipv6.parse::<Ipv6Addr>().unwrap(),
            *ip,
            "c{i} keeps its address"
        );
    }
    d.shutdown().await;
}

/// EC2's describe lags its changes: right after the node's first start took its /80, a restart with
/// the state file lost and no pod evidence reads a describe that does not show the /80 yet. IMDS
/// does: the /80 is adopted, not a second one taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_within_the_describe_lag_adopts_the_80_imds_shows() {
    let mock = ipv6_mock().await;
    mock.set_describe_lag(std::time::Duration::from_secs(3600));
    let dir = TempDir::new("ipv6-lag-80");
    let (cfg, _, prefix) = two_live_pods_and_a_lost_file(&mock, &dir).await;
    std::fs::remove_dir_all(&cfg.cni_cache_dir).unwrap();
    let d = start(cfg.clone()).await;
    assert_eq!(action_ok(&mock, "AssignIpv6Addresses"), 1, "no second /80");
    assert_eq!(eth0_prefixes(&mock), vec![prefix]);
    let mut c = client(&d.socket_path).await;
    let r = c
        .allocate(alloc_req("n0", "n0"))
        .await
        .unwrap()
        .into_inner();
    let v6: Ipv6Addr = r.ipv6.parse().unwrap();
    assert!(prefix.contains(&v6), "{v6} outside {prefix}");
    d.shutdown().await;
}

/// A restart moments after the node's /80 was assigned, with both EC2's describe and IMDS lagging:
/// neither shows the /80 on eth0, and taking the recorded one back is refused as in use, by eth0
/// itself. The daemon describes eth0 again until the /80 shows, and keeps it: one /80 in the node's
/// life (the IPv6 soak, seed 4242, took a second one here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_within_both_lags_keeps_the_recorded_80() {
    let mock = ipv6_mock().await;
    let lag = std::time::Duration::from_secs(3);
    mock.set_describe_lag(lag);
    mock.set_imds_lag(lag);
    let dir = TempDir::new("ipv6-both-lags");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let first = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    d.shutdown().await;
    let prefix = eth0_prefixes(&mock)[0];
    let d = start(cfg.clone()).await;
    assert_eq!(action_ok(&mock, "AssignIpv6Addresses"), 1, "no second /80");
    assert_eq!(eth0_prefixes(&mock), vec![prefix]);
    let mut c = client(&d.socket_path).await;
    let again = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.ipv6, first.ipv6, "the pod keeps its address");
    d.shutdown().await;
}

/// A state file whose IPv4 half is intact but whose /80 was never recorded: a life wrote its IPv4
/// rebuild and died (or hit a full disk) before the /80's (the dual soak, seed 8: every live pod
/// lost its IPv6). The next start reads the empty IPv6 half as lost, not as "no pods": the live
/// pods the plugin's cache shows get their addresses back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_no_80_on_record_gives_live_ipv6_pods_their_addresses_back() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-no-80-on-record");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let r = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    let ipv6: Ipv6Addr = r.ipv6.parse().unwrap();
    let egress: Ipv4Addr = r.egress_ipv4.parse().unwrap();
    d.shutdown().await;
    let alive = dir.0.join("live-netns");
    std::fs::write(&alive, b"").unwrap();
    ResultCache::new(&cfg.cni_cache_dir, "eniipam")
        .write(&cached("c0", &alive, &ipv6.to_string(), Some(egress)))
        .unwrap();
    // The IPv6 half as a life cut short left it: no /80, no address.
    let conn = rusqlite::Connection::open(&cfg.state_path).unwrap();
    conn.execute_batch("DELETE FROM ipv6_ips; DELETE FROM ipv6_prefix;")
        .unwrap();
    drop(conn);

    let d = start(cfg.clone()).await;
    assert_eq!(
        action_ok(&mock, "AssignIpv6Addresses"),
        1,
        "the /80 on eth0 adopted"
    );
    let mut c = client(&d.socket_path).await;
    let again = c
        .allocate(alloc_req("c0", "p0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.ipv6.parse::<Ipv6Addr>().unwrap(),
        ipv6,
        "the live pod keeps its IPv6"
    );
    let fresh = c
        .allocate(alloc_req("n0", "new-0"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        fresh.ipv6.parse::<Ipv6Addr>().unwrap(),
        ipv6,
        "handed out twice"
    );
    d.shutdown().await;
}
