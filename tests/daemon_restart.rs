//! Issue 5: the daemon restarted with an intact state file, none, a corrupt one, and one that disagrees
//! with EC2 (IPs removed and an ENI detached out of band). Each time the rebuilt pool equals the truth
//! and no IP is handed out twice; cooldown and sticky reservations survive.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use daemon_support::*;
use eniipam::model::AttachmentKey;
use eniipam::pool::snapshot::IpState;
use eniipam_api::cache::CacheEntry;
use mockcloud::{Config, MockCloud};

/// What the plugin caches after an ADD of `container` (ifname eth0) on network `eniipam`.
fn cached(container: &str, netns: &std::path::Path, ip: Ipv4Addr, eni_id: String) -> CacheEntry {
    CacheEntry {
        format: eniipam_api::cache::CACHE_FORMAT,
        network: "eniipam".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: netns.display().to_string(),
        pod: None,
        sticky_key: None,
        ip,
        route_table: 2,
        eni_id,
        host_veth: None,
        egress_ipv4: None,
        own_eni_egress: false,
        result: serde_json::json!({}),
    }
}

async fn mock() -> MockCloud {
    MockCloud::start(Config {
        default_instance_type: "c5.4xlarge".into(),
        ..Config::fast()
    })
    .await
    .unwrap()
}

/// Pool IPs (all states) must equal EC2's pod IPs on the node; returns the assigned map.
async fn assert_pool_is_truth(
    d: &eniipam::daemon::DaemonHandle,
    mock: &MockCloud,
) -> BTreeMap<AttachmentKey, Ipv4Addr> {
    // Let the warm pool finish what it started: an IP EC2 has just handed out is not drift.
    d.pool.maintain_now().await.expect("maintainer round");
    let snap = d.pool.snapshot();
    let mut pool_ips: Vec<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    pool_ips.sort();
    assert_eq!(
        pool_ips,
        ec2_pod_ips(mock),
        "the pool holds exactly EC2's pod IPs"
    );
    let mut assigned = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for i in snap.ips() {
        if let IpState::Assigned { attachment, .. } = &i.state {
            assert!(seen.insert(i.ip), "{} twice", i.ip);
            assert!(assigned.insert(attachment.clone(), i.ip).is_none());
        }
    }
    d.pool.check_invariants().expect("pool invariants");
    assigned
}

/// Moves the state file's journal of EC2 changes (`store::changes`) two minutes into the past, as if
/// the daemon had been down that long: a describe is then EC2's settled view.
fn age_the_journal(state: &std::path::Path) {
    let conn = rusqlite::Connection::open(state).unwrap();
    conn.execute("UPDATE ec2_changes SET at_ms = at_ms - 120000", [])
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_rebuild_the_truth() {
    let mock = mock().await;
    let dir = TempDir::new("restart");
    let mut cfg = config(&mock, &dir.0);
    // Step 5 detaches a secondary ENI: the pods must be on one, not on eth0.
    cfg.use_primary_eni = false;

    // First life: 6 pods; pod-0 released plainly (cooling), pod-1 released sticky.
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut ips = BTreeMap::new();
    for i in 0..6 {
        ips.insert(
            i,
            add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await,
        );
    }
    c.release(release_req("c0", false)).await.unwrap();
    c.release(release_req("c1", true)).await.unwrap();
    let before = assert_pool_is_truth(&d, &mock).await;
    assert_eq!(before.len(), 4);
    d.shutdown().await;

    // 1. Intact file: same assignments; the cooling IP is not handed to a new pod; the sticky one goes
    //    back to its pod only.
    let d = start(cfg.clone()).await;
    assert_eq!(assert_pool_is_truth(&d, &mock).await, before);
    assert_eq!(d.report.kept, 4);
    let mut c = client(&d.socket_path).await;
    let mut fresh = BTreeSet::new();
    for i in 0..5 {
        fresh.insert(add_ip(&mut c, &format!("n{i}"), &format!("new-{i}")).await);
    }
    assert!(!fresh.contains(&ips[&0]), "cooldown survived the restart");
    assert!(
        !fresh.contains(&ips[&1]),
        "the sticky reservation survived the restart"
    );
    let mut sticky = alloc_req("c1-again", "pod-1");
    sticky.sticky_key = "default/pod-1".into();
    let back = c.allocate(sticky).await.unwrap().into_inner();
    assert_eq!(
        back.ip.parse::<Ipv4Addr>().unwrap(),
        ips[&1],
        "the sticky pod got its IP back"
    );
    // Idempotent ADD after restart.
    assert_eq!(add_ip(&mut c, "c2", "pod-2").await, ips[&2]);
    let before = assert_pool_is_truth(&d, &mock).await;
    d.shutdown().await;

    // 2. Out-of-band changes: one assigned IP unassigned in EC2; then the restart drops it. A minute
    //    on: the journal of the pool's own changes no longer outweighs EC2's describe (within the
    //    minute it would, and the running reconcile would drop the IP at its second miss).
    age_the_journal(&cfg.state_path);
    let victim = ips[&3];
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&victim))
        .unwrap()
        .id;
    mock.with_world(|w, now| {
        w.unassign_private_ip_addresses(&eni, &[victim], now)
            .unwrap()
    });
    let d = start(cfg.clone()).await;
    let after = assert_pool_is_truth(&d, &mock).await;
    assert_eq!(d.report.dropped_gone.len(), 1);
    assert_eq!(d.report.dropped_gone[0].1, victim);
    assert_eq!(after.len(), before.len() - 1);
    assert!(!after.values().any(|ip| *ip == victim));
    d.shutdown().await;

    // 3. No file: rebuilt from EC2 and the host. Two pods still show in the plugin's result cache with a
    //    live network namespace: they are adopted with their IPs. Every other IP is held (quarantined)
    //    until a describe a minute later still shows it, since EC2's describe may lag the node's last
    //    changes and no journal survived: none of the old pods' IPs goes to a new pod.
    std::fs::remove_file(&cfg.state_path).unwrap();
    let netns = dir.0.join("fake-netns");
    std::fs::write(&netns, b"").unwrap();
    let cache = eniipam_api::cache::ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let mut on_host: Vec<(AttachmentKey, Ipv4Addr)> = after
        .iter()
        .map(|(k, ip)| (k.clone(), *ip))
        .take(2)
        .collect();
    for (k, ip) in &on_host {
        cache
            .write(&cached(&k.container_id, &netns, *ip, String::new()))
            .unwrap();
    }
    // A cache entry whose namespace is gone is no evidence.
    let (gone_key, gone_ip) = after.iter().nth(2).map(|(k, ip)| (k.clone(), *ip)).unwrap();
    cache
        .write(&cached(
            &gone_key.container_id,
            &dir.0.join("gone-netns"),
            gone_ip,
            String::new(),
        ))
        .unwrap();
    let on_enis = ec2_pod_ips(&mock);
    let d = start(cfg.clone()).await;
    let adopted = assert_pool_is_truth(&d, &mock).await;
    on_host.sort();
    let mut got: Vec<(AttachmentKey, Ipv4Addr)> = adopted.into_iter().collect();
    got.sort();
    assert_eq!(
        got, on_host,
        "the host's live pods were adopted with their IPs"
    );
    assert_eq!(d.report.adopted.len(), 2);
    let held: Vec<Ipv4Addr> = d
        .pool
        .snapshot()
        .ips()
        .filter(|i| {
            matches!(&i.state, IpState::Quarantined { reason, .. }
                if reason == eniipam::reconcile::QUARANTINE_UNSETTLED)
        })
        .map(|i| i.ip)
        .collect();
    let unclaimed: Vec<Ipv4Addr> = on_enis
        .into_iter()
        .filter(|ip| !on_host.iter().any(|(_, h)| h == ip))
        .collect();
    assert_eq!(held, unclaimed);
    assert_eq!(d.report.quarantined, held);
    let mut c = client(&d.socket_path).await;
    let x1: Ipv4Addr = add_ip(&mut c, "x1", "x-1").await;
    assert!(
        !after.values().any(|ip| *ip == x1),
        "no in-use IP handed out after losing the file"
    );
    // Idempotent ADD of an adopted pod returns its IP.
    assert_eq!(
        add_ip(&mut c, &on_host[0].0.container_id, "adopted").await,
        on_host[0].1
    );
    d.shutdown().await;
    std::fs::remove_dir_all(&cfg.cni_cache_dir).unwrap();

    // 4. Corrupt file: moved aside, rebuilt.
    std::fs::write(&cfg.state_path, b"this is not a database, it is a pumpkin").unwrap();
    let d = start(cfg.clone()).await;
    assert_pool_is_truth(&d, &mock).await;
    let aside: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
        .collect();
    assert_eq!(aside.len(), 1, "the corrupt file is kept for inspection");
    d.shutdown().await;

    // 5. An ENI detached out of band: its IPs leave the pool.
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    let att = inst
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().unwrap().device_index == 1)
        .unwrap();
    let att_id = att.attachment.clone().unwrap().id;
    mock.with_world(|w, now| w.detach_network_interface(&att_id, true, now).unwrap());
    let d = start(cfg.clone()).await;
    let snap_ips: BTreeSet<Ipv4Addr> = d.pool.snapshot().ips().map(|i| i.ip).collect();
    assert!(
        att.secondary_ips.iter().all(|ip| !snap_ips.contains(ip)),
        "the detached ENI's IPs are gone"
    );
    assert_pool_is_truth(&d, &mock).await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_bad_requests_change_nothing() {
    let mock = mock().await;
    let dir = TempDir::new("schema");
    let cfg = config(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    // Bad requests get clear errors and change nothing.
    let before = d.pool.snapshot().assigned;
    let mut bad = alloc_req("", "p");
    let e = c.allocate(bad.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    bad.container_id = "c".into();
    bad.api_version = 99;
    let e = c.allocate(bad.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("v99") && e.message().contains("v1"),
        "{}",
        e.message()
    );
    bad.api_version = eniipam::rpc::API_VERSION;
    bad.preferred_ip = "not-an-ip".into();
    let e = c.allocate(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let r = c
        .release(release_req("never-seen", false))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !r.released,
        "releasing an unknown attachment succeeds and does nothing"
    );
    assert_eq!(d.pool.snapshot().assigned, before);
    // A second daemon on the same socket is refused (the socket is live).
    let clients = eniipam::daemon::CloudClients::from_config(
        &cfg,
        Some(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "t",
        )),
    )
    .await
    .unwrap();
    let mut cfg2 = cfg.clone();
    cfg2.state_path = dir.0.join("other.db");
    let err = eniipam::daemon::Daemon::start_with(cfg2, clients)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("already serving"), "{err}");
    d.shutdown().await;

    // A file from a newer schema: refused with a clear message, left untouched.
    {
        let conn = rusqlite::Connection::open(&cfg.state_path).unwrap();
        conn.execute_batch("UPDATE meta SET schema_version = 999")
            .unwrap();
    }
    let bytes = std::fs::read(&cfg.state_path).unwrap();
    let clients = eniipam::daemon::CloudClients::from_config(
        &cfg,
        Some(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "t",
        )),
    )
    .await
    .unwrap();
    let err = eniipam::daemon::Daemon::start_with(cfg.clone(), clients)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("999"), "{err}");
    assert_eq!(std::fs::read(&cfg.state_path).unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_reconcile_releases_dead_pods_and_reports_drift() {
    let mock = mock().await;
    let dir = TempDir::new("pass");
    let d = start(config(&mock, &dir.0)).await;
    let mut c = client(&d.socket_path).await;
    let netns = dir.0.join("netns-a");
    std::fs::write(&netns, b"").unwrap();
    let mut live = alloc_req("alive", "alive");
    live.netns = dir.0.join("netns-b").display().to_string();
    std::fs::write(dir.0.join("netns-b"), b"").unwrap();
    c.allocate(live).await.unwrap();
    let mut dying = alloc_req("dying", "dying");
    dying.netns = netns.display().to_string();
    let ip: Ipv4Addr = c
        .allocate(dying)
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();

    d.pool.maintain_now().await.unwrap(); // let the warm pool settle: its EC2 calls are not drift
    let r = d.reconcile_now().await.unwrap();
    assert!(
        r.released_dead.is_empty() && r.missing_in_ec2.is_empty() && r.unknown_to_pool.is_empty(),
        "{r:?}"
    );

    // The pod dies without a DEL: its netns disappears.
    std::fs::remove_file(&netns).unwrap();
    d.pool.maintain_now().await.unwrap(); // let the warm pool settle: its EC2 calls are not drift
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(
        r.released_dead,
        vec![(AttachmentKey::new("dying", "eth0"), ip)]
    );
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("dying", "eth0"))
            .is_none()
    );
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("alive", "eth0"))
            .is_some()
    );

    // Someone unassigns the live pod's IP in EC2: drift is reported.
    let alive_ip = d
        .pool
        .allocation(&AttachmentKey::new("alive", "eth0"))
        .unwrap()
        .ip;
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&alive_ip))
        .unwrap()
        .id;
    mock.with_world(|w, now| {
        w.unassign_private_ip_addresses(&eni, &[alive_ip], now)
            .unwrap()
    });
    d.pool.maintain_now().await.unwrap(); // let the warm pool settle: its EC2 calls are not drift
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.missing_in_ec2, vec![alive_ip]);
    // EC2 is eventually consistent: one describe that misses the IP is not enough (issue 13).
    assert!(r.lost.is_empty(), "{r:?}");
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("alive", "eth0"))
            .is_some()
    );
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.missing_in_ec2, vec![alive_ip]);
    assert_eq!(
        r.lost,
        vec![(AttachmentKey::new("alive", "eth0"), alive_ip)],
        "the pod lost its IP"
    );
    // Fixed: the pool and the state file forgot it, and the pool matches EC2 again.
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("alive", "eth0"))
            .is_none()
    );
    assert!(
        !d.store
            .load()
            .await
            .unwrap()
            .assignments
            .iter()
            .any(|a| a.ip == alive_ip)
    );
    assert_pool_is_truth(&d, &mock).await;
    d.pool.maintain_now().await.unwrap(); // let the warm pool settle: its EC2 calls are not drift
    let r = d.reconcile_now().await.unwrap();
    assert!(r.missing_in_ec2.is_empty() && r.lost.is_empty(), "{r:?}");
    d.shutdown().await;
}

/// EC2's describes are eventually consistent (mockcloud's describe lag): a restart right after the
/// pool gave IPs back and took new ones reads a describe that still shows the given-back IPs and not
/// yet the new ones. The rebuilt pool holds what EC2 holds, from the state file's journal of the
/// pool's own changes: no given-back IP returns to the pool (EC2 may hand it to another node), and
/// no pod loses its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_within_the_describe_lag_rebuilds_the_truth_not_the_describe() {
    let mock = mock().await;
    // Longer than the test: every describe shows the world as it was when the test began.
    mock.set_describe_lag(std::time::Duration::from_secs(3600));
    let dir = TempDir::new("restart-describe-lag");
    let mut cfg = config(&mock, &dir.0);
    cfg.warm_policy = eniipam::pool::config::WarmPolicy::Fixed;
    cfg.min_idle = 0;
    cfg.max_idle = 1;
    cfg.reuse_cooldown_secs = 0;

    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut ips = BTreeMap::new();
    for i in 0..6 {
        ips.insert(
            i,
            add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await,
        );
    }
    for i in 0..4 {
        c.release(release_req(&format!("c{i}"), false))
            .await
            .unwrap();
    }
    // The pool gives back what is past the ceiling of one idle IP.
    let before = assert_pool_is_truth(&d, &mock).await;
    assert_eq!(before.len(), 2);
    let given_back: Vec<Ipv4Addr> = (0..4)
        .map(|i| ips[&i])
        .filter(|ip| !ec2_pod_ips(&mock).contains(ip))
        .collect();
    assert_eq!(
        given_back.len(),
        3,
        "three of the four released IPs went back"
    );
    d.shutdown().await;
    // What the restart's describe will show: the given-back IPs, none of the pods'.
    let shown = mock.with_world(|w, now| {
        let inst = w.instance_ids();
        w.describe_instances(&inst, &[], now).unwrap()[0].enis[0]
            .secondary_ips
            .clone()
    });
    for ip in &given_back {
        assert!(shown.contains(ip), "the describe still shows {ip}");
    }
    assert!(!shown.contains(&ips[&4]) && !shown.contains(&ips[&5]));

    let d = start(cfg.clone()).await;
    assert_eq!(
        assert_pool_is_truth(&d, &mock).await,
        before,
        "the pods keep their IPs"
    );
    assert!(
        d.report.dropped_gone.is_empty(),
        "{:?}",
        d.report.dropped_gone
    );
    assert!(d.report.journal_corrections >= 5, "{:?}", d.report);
    let mut c = client(&d.socket_path).await;
    let mut fresh = BTreeSet::new();
    for i in 0..4 {
        fresh.insert(add_ip(&mut c, &format!("n{i}"), &format!("new-{i}")).await);
    }
    for ip in &given_back {
        assert!(
            !fresh.contains(ip),
            "{ip} was given back: it is EC2's, not the pool's"
        );
    }
    assert_pool_is_truth(&d, &mock).await;

    // A give-back EC2 refuses: the IPs stay on the ENI and in the pool, and a restart still holds
    // them, though the describe does not show them yet.
    mock.deny("UnassignPrivateIpAddresses", true);
    for i in 0..4 {
        c.release(release_req(&format!("n{i}"), false))
            .await
            .unwrap();
    }
    let kept = assert_pool_is_truth(&d, &mock).await;
    let held = ec2_pod_ips(&mock);
    for ip in &fresh {
        assert!(held.contains(ip), "EC2 refused to take {ip} back");
    }
    d.shutdown().await;
    mock.deny("UnassignPrivateIpAddresses", false);
    let d = start(cfg.clone()).await;
    assert_eq!(assert_pool_is_truth(&d, &mock).await, kept);
    assert!(
        d.report.dropped_gone.is_empty(),
        "{:?}",
        d.report.dropped_gone
    );
    d.shutdown().await;
}

/// A lost state file right after pods' ADDs, within EC2's describe lag: the describe does not show
/// the pods' new IPs yet, but the plugin's cache does, with the ENI each came from. The live pods
/// keep them; nothing they hold is handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_file_within_the_describe_lag_keeps_the_live_pods_ips() {
    let mock = mock().await;
    mock.set_describe_lag(std::time::Duration::from_secs(3600));
    let dir = TempDir::new("restart-lost-lag");
    let cfg = config(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let netns = dir.0.join("live-netns");
    std::fs::write(&netns, b"").unwrap();
    let cache = eniipam_api::cache::ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let mut live = BTreeMap::new();
    for i in 0..3 {
        let ip: Ipv4Addr = add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await;
        let eni = mock
            .network_interfaces()
            .into_iter()
            .find(|e| e.secondary_ips.contains(&ip))
            .unwrap()
            .id;
        cache
            .write(&cached(&format!("c{i}"), &netns, ip, eni))
            .unwrap();
        live.insert(AttachmentKey::new(format!("c{i}"), "eth0"), ip);
    }
    d.shutdown().await;
    std::fs::remove_file(&cfg.state_path).unwrap();

    let d = start(cfg.clone()).await;
    assert_eq!(d.report.adopted.len(), 3, "{:?}", d.report);
    assert_eq!(d.report.journal_corrections, 3, "{:?}", d.report);
    // The pool holds nothing EC2 does not (the warm IPs of the first life, in neither the file
    // nor the lagging describe, stay off the pool until a later look finds them).
    let ec2 = ec2_pod_ips(&mock);
    let snap = d.pool.snapshot();
    assert!(snap.ips().all(|i| ec2.contains(&i.ip)), "{snap:?}");
    d.pool.check_invariants().expect("pool invariants");
    for (k, ip) in &live {
        let held = snap.ips().find(|i| i.ip == *ip).map(|i| &i.state);
        assert!(
            matches!(held, Some(IpState::Assigned { attachment, .. }) if attachment == k),
            "{k} keeps {ip}: {held:?}"
        );
    }
    let mut c = client(&d.socket_path).await;
    for i in 0..4 {
        let ip: Ipv4Addr = add_ip(&mut c, &format!("n{i}"), &format!("new-{i}")).await;
        assert!(!live.values().any(|l| *l == ip), "{ip} handed out twice");
    }
    d.shutdown().await;
}

/// A restart seconds after the pool created an ENI and handed out its addresses, while EC2's
/// describes do not list the new ENI yet (issue 44: its eventual consistency about a new ENI, which
/// the soak found with mockcloud's new-ENI lag: the rebuild read the ENI as gone, dropped its pods'
/// records, and the running reconcile then adopted its addresses idle, to be handed out twice).
/// The rebuild asks again until the describe shows the ENI, and the pods keep their IPs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_right_after_an_eni_create_waits_for_the_describe_to_show_it() {
    let mock = mock().await;
    // Describes do not list a new ENI (nor show its attachment) for this long; no call is refused.
    let window = std::time::Duration::from_secs(8);
    mock.set_new_eni_lag(mockcloud::NewEniLag {
        window,
        refusals: 0,
        refused_share: 1.0,
    });
    let dir = TempDir::new("restart-new-eni");
    let mut cfg = config(&mock, &dir.0);
    // The pods' IPs come from a secondary ENI the daemon creates.
    cfg.use_primary_eni = false;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut live = BTreeMap::new();
    for i in 0..3 {
        let ip = add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await;
        live.insert(AttachmentKey::new(format!("c{i}"), "eth0"), ip);
    }
    let first = *live.values().next().unwrap();
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&first))
        .expect("the pod's ENI")
        .id;
    d.shutdown().await;
    let listed = mock.with_world(|w, now| {
        w.describe_network_interfaces(&[], &[], now)
            .unwrap()
            .iter()
            .any(|e| e.id == eni)
    });
    assert!(
        !listed,
        "the restart must come within the describe's lag of {eni}'s create: this machine was too \
         slow for the test to prove anything"
    );

    let restarted = tokio::time::Instant::now();
    let d = start(cfg.clone()).await;
    assert!(
        d.report.dropped_gone.is_empty(),
        "no pod lost its IP: {:?}",
        d.report.dropped_gone
    );
    assert!(
        restarted.elapsed() < window + std::time::Duration::from_secs(20),
        "the rebuild waits for the describe, not for ever: {:?}",
        restarted.elapsed()
    );
    let snap = d.pool.snapshot();
    for (k, ip) in &live {
        let held = snap.ips().find(|i| i.ip == *ip).map(|i| &i.state);
        assert!(
            matches!(held, Some(IpState::Assigned { attachment, .. }) if attachment == k),
            "{k} keeps {ip}: {held:?}"
        );
    }
    assert_pool_is_truth(&d, &mock).await;
    let mut c = client(&d.socket_path).await;
    for i in 0..4 {
        let ip: Ipv4Addr = add_ip(&mut c, &format!("n{i}"), &format!("new-{i}")).await;
        assert!(!live.values().any(|l| *l == ip), "{ip} handed out twice");
    }
    assert_pool_is_truth(&d, &mock).await;
    d.shutdown().await;
}

/// Issue 44 case 8 (the dual-stack soak, seed 8675309, step 146: `tokens used 57 > capacity 56`): a
/// live pod's IP is unassigned out of band, the running reconcile reports it lost (the pool and the
/// file forget it, its token returns) and a new pod takes the node's last slot. A restart within the
/// minute must not take the lost IP back: neither from the journal's assign of it (EC2's answer of
/// moments before, which outweighs a describe that does not show it) nor from the plugin's cache
/// (the pod still runs). It did, from both: an address no ENI has, holding a token beyond the
/// node's capacity, handed to the next pod once its holder left, and back again at every restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_does_not_take_back_an_ip_the_reconcile_found_lost() {
    let mock = mock().await;
    let dir = TempDir::new("restart-lost-ip");
    let mut cfg = config(&mock, &dir.0);
    // A full node: four pod IPs, no warm ones.
    cfg.max_ips = Some(4);
    cfg.warm_policy = eniipam::pool::config::WarmPolicy::Fixed;
    cfg.min_idle = 0;
    cfg.max_idle = 0;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let netns = dir.0.join("live-netns");
    std::fs::write(&netns, b"").unwrap();
    let cache = eniipam_api::cache::ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let eni_of = |ip: Ipv4Addr| {
        mock.network_interfaces()
            .into_iter()
            .find(|e| e.secondary_ips.contains(&ip))
            .unwrap()
            .id
    };
    let mut ips = Vec::new();
    for i in 0..4 {
        let ip = add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await;
        cache
            .write(&cached(&format!("c{i}"), &netns, ip, eni_of(ip)))
            .unwrap();
        ips.push(ip);
    }
    let lost = ips[0];
    let eni = eni_of(lost);
    mock.with_world(|w, now| w.unassign_private_ip_addresses(&eni, &[lost], now).unwrap());
    d.reconcile_now().await.unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.lost, vec![(AttachmentKey::new("c0", "eth0"), lost)]);
    // The slot it left goes to a new pod: EC2 holds four pod IPs again, the pool four tokens.
    let fresh = add_ip(&mut c, "c4", "pod-4").await;
    assert_ne!(fresh, lost);
    assert_eq!(ec2_pod_ips(&mock).len(), 4);
    d.pool.check_invariants().expect("pool invariants");
    d.shutdown().await;

    let d = start(cfg.clone()).await;
    d.pool
        .check_invariants()
        .expect("pool invariants after the restart");
    let snap = d.pool.snapshot();
    assert!(snap.tokens_used <= snap.capacity, "{snap:?}");
    assert!(
        snap.ip(lost).is_none(),
        "the lost IP is back: {:?}",
        snap.ip(lost)
    );
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("c0", "eth0"))
            .is_none(),
        "the pod that lost its IP holds it again"
    );
    let ec2 = ec2_pod_ips(&mock);
    assert!(snap.ips().all(|i| ec2.contains(&i.ip)), "{snap:?}");
    assert!(d.report.adopted.is_empty(), "{:?}", d.report.adopted);
    d.shutdown().await;
}

/// The other side of the wait above: an ENI detached out of band moments after the pool gave its
/// pods addresses, then a restart. EC2 lists the ENI by id, unattached: it was detached, not
/// lagging, so the start does not wait the journal's minute for it (the profiles soak: 13 starts
/// of 43–60 s each before), and its pods' records go (their IPs are gone with the ENI).
///
/// On tokio's paused clock (daemon, mockcloud and client in this process; store waits hold the
/// clock): its waits on EC2's describe lag cost simulated seconds, not real ones.
#[tokio::test(start_paused = true)]
async fn a_restart_right_after_an_out_of_band_detach_does_not_wait_the_minute() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let mock = mock().await;
    let dir = TempDir::new("restart-detached");
    let mut cfg = config(&mock, &dir.0);
    cfg.use_primary_eni = false;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut ips = Vec::new();
    for i in 0..3 {
        ips.push(add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await);
    }
    d.shutdown().await;
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    let eni = inst
        .enis
        .iter()
        .find(|e| e.secondary_ips.contains(&ips[0]))
        .expect("the pods' ENI");
    let att_id = eni.attachment.clone().unwrap().id;
    mock.with_world(|w, now| w.detach_network_interface(&att_id, true, now).unwrap());

    let restarted = tokio::time::Instant::now();
    let d = start(cfg.clone()).await;
    let took = restarted.elapsed();
    assert!(
        took < std::time::Duration::from_secs(40),
        "the start waited {took:?} for an ENI EC2 lists detached"
    );
    let mut dropped: Vec<Ipv4Addr> = d.report.dropped_gone.iter().map(|(_, ip)| *ip).collect();
    dropped.sort();
    ips.sort();
    assert_eq!(dropped, ips, "{:?}", d.report);
    assert_pool_is_truth(&d, &mock).await;
    d.shutdown().await;
}

/// A state file that no rebuild ever completed in: the first life after the file's loss was killed
/// between creating the new file and writing its first rebuild (the CI soak, seed 8: a SIGKILL
/// right after `state-file-removed`). It holds nothing a rebuild may trust: the next start treats
/// it as lost, and the live pods the plugin's cache shows keep their IPs. Read as an intact file
/// whose silence means "no pods", it dropped them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_no_rebuild_completed_in_counts_as_lost() {
    let mock = mock().await;
    mock.set_describe_lag(std::time::Duration::from_secs(3600));
    let dir = TempDir::new("restart-unfinished-file");
    let cfg = config(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let netns = dir.0.join("live-netns");
    std::fs::write(&netns, b"").unwrap();
    let cache = eniipam_api::cache::ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let mut live = BTreeMap::new();
    for i in 0..3 {
        let ip: Ipv4Addr = add_ip(&mut c, &format!("c{i}"), &format!("pod-{i}")).await;
        let eni = mock
            .network_interfaces()
            .into_iter()
            .find(|e| e.secondary_ips.contains(&ip))
            .unwrap()
            .id;
        cache
            .write(&cached(&format!("c{i}"), &netns, ip, eni))
            .unwrap();
        live.insert(AttachmentKey::new(format!("c{i}"), "eth0"), ip);
    }
    d.shutdown().await;
    // The file is lost, and the next life dies right after creating its new one.
    std::fs::remove_file(&cfg.state_path).unwrap();
    let (store, opened) = eniipam::store::Store::open(&cfg.state_path).await.unwrap();
    assert!(opened.created);
    store.close().await;

    let d = start(cfg.clone()).await;
    assert!(d.report.state_lost, "{:?}", d.report);
    assert!(d.report.dropped_gone.is_empty(), "{:?}", d.report);
    assert_eq!(d.report.adopted.len(), 3, "{:?}", d.report);
    let snap = d.pool.snapshot();
    for (k, ip) in &live {
        let held = snap.ips().find(|i| i.ip == *ip).map(|i| &i.state);
        assert!(
            matches!(held, Some(IpState::Assigned { attachment, .. }) if attachment == k),
            "{k} keeps {ip}: {held:?}"
        );
    }
    d.pool.check_invariants().expect("pool invariants");
    // The rebuild recorded the instance: the next start trusts the file.
    d.shutdown().await;
    let d = start(cfg.clone()).await;
    assert!(!d.report.state_lost, "{:?}", d.report);
    assert_eq!(d.report.kept, 3, "{:?}", d.report);
    d.shutdown().await;
}

/// A pod's IP taken out of band seconds after the pool assigned it, then a restart: the journal
/// still vouches for the assign, so the rebuild keeps the IP on its ENI though the describe does
/// not show it (it may be EC2's lag). That silence is the IP's first miss: the first running pass
/// that misses it again reports it lost. Before, each restart gave a lost address two more passes,
/// and under repeated restarts its pod's release put it back in circulation (the profiles soak,
/// seed 27: live-ip-not-in-ec2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_counts_the_describes_silence_as_a_journalled_ips_first_miss() {
    let mock = mock().await;
    let dir = TempDir::new("restart-unconfirmed");
    let cfg = config(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let ip = add_ip(&mut c, "c0", "pod-0").await;
    d.shutdown().await;
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&ip))
        .unwrap()
        .id;
    mock.with_world(|w, now| w.unassign_private_ip_addresses(&eni, &[ip], now).unwrap());

    let d = start(cfg.clone()).await;
    assert!(
        d.report.unconfirmed.contains(&ip),
        "the journal placed {ip}: {:?}",
        d.report
    );
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("c0", "eth0"))
            .is_some()
    );
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(
        r.lost,
        vec![(AttachmentKey::new("c0", "eth0"), ip)],
        "one pass after the start"
    );
    assert!(d.pool.snapshot().ip(ip).is_none());
    d.pool.check_invariants().expect("pool invariants");
    d.shutdown().await;
}

/// What a restart places without EC2's describe showing it goes to no new pod until a describe
/// does: an IP taken out of band and an IP the describe merely lags look alike at the start, and
/// the first, handed to a new pod once its holder left, would be an address no ENI has (the
/// profiles soak, seed 27; the CI soak, seed 8 dual). The lost one is forgotten at the first pass;
/// the lagging one serves again once a describe shows it.
///
/// On tokio's paused clock (daemon, mockcloud and client in this process; store waits hold the
/// clock): its waits on EC2's describe lag cost simulated seconds, not real ones.
#[tokio::test(start_paused = true)]
async fn an_ip_placed_without_the_describe_goes_to_no_new_pod_until_ec2_shows_it() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let mock = mock().await;
    let dir = TempDir::new("restart-held-unconfirmed");
    let mut cfg = config(&mock, &dir.0);
    cfg.reuse_cooldown_secs = 0;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let lost = add_ip(&mut c, "c0", "pod-0").await;
    let lagging = add_ip(&mut c, "c1", "pod-1").await;
    d.shutdown().await;
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&lost))
        .unwrap()
        .id;
    mock.with_world(|w, now| w.unassign_private_ip_addresses(&eni, &[lost], now).unwrap());
    // EC2 holds `lagging`, but its describe (3 s behind) does not show it yet: taken away and
    // given back 3.5 s apart, the describe sees the gap.
    mock.set_describe_lag(std::time::Duration::from_secs(3));
    mock.with_world(|w, now| {
        w.unassign_private_ip_addresses(&eni, &[lagging], now)
            .unwrap()
    });
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    mock.with_world(|w, now| {
        let back = mockcloud::world::AssignArgs::Addresses {
            ips: vec![lagging],
            allow_reassignment: false,
        };
        w.assign_private_ip_addresses(&eni, back, now).unwrap();
    });

    let d = start(cfg.clone()).await;
    for ip in [lost, lagging] {
        assert!(d.report.unconfirmed.contains(&ip), "{ip}: {:?}", d.report);
    }
    let mut c = client(&d.socket_path).await;
    for k in ["c0", "c1"] {
        c.release(release_req(k, false)).await.unwrap();
    }
    let snap = d.pool.snapshot();
    assert_eq!(snap.held_back, 2, "{snap:?}");
    let mut fresh = Vec::new();
    for i in 0..4 {
        fresh.push(add_ip(&mut c, &format!("n{i}"), &format!("new-{i}")).await);
    }
    assert!(
        !fresh.contains(&lost) && !fresh.contains(&lagging),
        "an unconfirmed IP went to a new pod: {fresh:?}"
    );
    // Once the describe shows `lagging` (its lag over), the pass confirms it; `lost` is forgotten.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    d.reconcile_now().await.unwrap();
    let snap = d.pool.snapshot();
    assert!(snap.ip(lost).is_none(), "{:?}", snap.ip(lost));
    assert!(
        matches!(snap.ip(lagging), Some(IpState::Idle { .. })),
        "{:?}",
        snap.ip(lagging)
    );
    assert_eq!(snap.held_back, 0);
    d.pool.check_invariants().expect("pool invariants");
    d.shutdown().await;
}
