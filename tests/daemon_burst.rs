//! Burst prefixes through the real daemon (issue 46, item 1): on a Nitro type, with the shipped
//! default (`burst_prefixes` on) and the shipped IAM policy enforced, a burst beyond the idle IPs is served by one
//! AssignPrivateIpAddresses of whole `/28`s on eth0, no ENI is created for it, and the `/28`s
//! survive a restart: the rebuild from IMDS and EC2 takes them back with the pods that hold their
//! addresses and the unused ones as idle, and gives none back.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use daemon_support::*;
use eniipam::config::DaemonConfig;

const PODS: usize = 30;
const ASSIGN: &str = "AssignPrivateIpAddresses";

async fn mock() -> mockcloud::MockCloud {
    mockcloud::MockCloud::start(mockcloud::Config {
        default_instance_type: "m5.xlarge".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .unwrap()
}

/// The shipped default, which the daemon tests' base config turns off.
fn shipped(mock: &mockcloud::MockCloud, dir: &std::path::Path) -> DaemonConfig {
    DaemonConfig {
        burst_prefixes: DaemonConfig::default().burst_prefixes,
        ..config(mock, dir)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_whole_prefixes_on_eth0_in_one_call_and_keeps_them_across_a_restart() {
    let mock = mock().await;
    let dir = TempDir::new("burst-prefixes");
    assert!(
        DaemonConfig::default().burst_prefixes,
        "burst prefixes are the shipped default"
    );
    let cfg = shipped(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let inst = mock.default_instance();
    // The start's warm-up (the posture of single IPs) lands before the burst.
    let warm = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let s = d.pool.snapshot();
        if s.in_flight == 0 && s.creating_enis == 0 && s.idle > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < warm,
            "the node never warmed: {s:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    mock.reset_counters();

    let ips = allocate_all(&d.socket_path, 0..PODS).await;
    let unique: BTreeSet<Ipv4Addr> = ips.iter().copied().collect();
    assert_eq!(unique.len(), PODS, "no IP handed out twice");
    let counters = mock.counters();
    // One assign when every ADD is in the actor's first batch; when the ADDs come spread out, at
    // most one per /28 the burst needs (each call takes whole prefixes for the pods it has).
    let assigns = counters.ok(ASSIGN);
    assert!(
        (1..=PODS.div_ceil(16) as u64).contains(&assigns),
        "{assigns} assigns for a burst of {PODS}: {:?}",
        counters.actions
    );
    assert_eq!(
        counters.calls("CreateNetworkInterface"),
        0,
        "no ENI is created for a burst eth0's free slots hold"
    );
    assert!(
        counters
            .actions
            .values()
            .all(|a| !a.errors.contains_key("UnauthorizedOperation")),
        "the shipped IAM policy allows the prefix assign: {:?}",
        counters.actions
    );
    let eth0 = eth0_in_ec2(&mock, &inst.instance_id);
    assert!(
        eth0.ipv4_prefixes.len() >= PODS.div_ceil(16) - 1,
        "eth0 holds the burst in /28s: {:?}",
        eth0.ipv4_prefixes
    );
    let in_prefixes = |ip: &Ipv4Addr| eth0.ipv4_prefixes.iter().any(|p| p.contains(ip));
    let held: BTreeSet<Ipv4Addr> = eth0
        .secondary_ips
        .iter()
        .copied()
        .filter(|ip| unique.contains(ip))
        .collect();
    assert!(
        unique.iter().all(|ip| in_prefixes(ip) || held.contains(ip)),
        "every pod IP is on eth0, in a /28 or a secondary IP of its posture"
    );
    let idle_before = d.pool.snapshot().idle;
    d.pool.check_invariants().unwrap();
    d.shutdown().await;

    // A restart rebuilds the /28s from IMDS and EC2 with the pods that hold their addresses.
    let d = start(cfg).await;
    let s = d.pool.snapshot();
    assert_eq!(s.assigned as usize, PODS, "every pod kept its IP: {s:?}");
    assert!(
        s.idle >= idle_before.min(1),
        "the prefixes' idle addresses are back: {s:?}"
    );
    d.pool.check_invariants().unwrap();
    let eth0_after = eth0_in_ec2(&mock, &inst.instance_id);
    assert!(
        eth0.ipv4_prefixes
            .iter()
            .all(|p| eth0_after.ipv4_prefixes.contains(p)),
        "the restart gave no /28 back: {:?} then {:?}",
        eth0.ipv4_prefixes,
        eth0_after.ipv4_prefixes
    );
    // The /28s' unused addresses are the pool's again (idle; after a restart they first cool
    // down, as any address the rebuild cannot date), and new pods never get a held one.
    assert!(
        s.idle > 0,
        "the /28s' unused addresses are back as idle: {s:?}"
    );
    let next = allocate_all(&d.socket_path, PODS..PODS + 4).await;
    assert!(next.iter().all(|ip| !unique.contains(ip)));
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// `Ipv4PrefixCount` of the shipped launch template's primary interface
/// (`deploy/launch-template-network.json`), as an operator applies it.
fn shipped_launch_prefixes() -> u32 {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/launch-template-network.json");
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the shipped template"))
            .expect("JSON");
    let eth0 = &data["NetworkInterfaces"][0];
    assert_eq!(eth0["DeviceIndex"], 0, "the template sets eth0: {data}");
    assert!(
        eth0.get("SecondaryPrivateIpAddressCount").is_none(),
        "EC2 refuses secondary IPs beside a prefix count: {data}"
    );
    eth0["Ipv4PrefixCount"].as_u64().expect("a prefix count") as u32
}

/// Issue 46, item 3: a node launched with the shipped launch template's `/28`s on eth0 serves its
/// first pods from them. The daemon's first start on the instance, with no pod on the host, takes
/// them as idle at once (no cooldown, no quarantine: no pod ever held them), makes no mutating EC2
/// call for them or for its warm pool, and never gives them back while its pods are fewer. A later
/// start that finds the state file lost is no first start: the same addresses are then held until a
/// settled describe vouches for them, as any lost file's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_launched_with_the_templates_prefixes_serves_its_first_pods_without_a_call() {
    let mock = mock().await;
    let dir = TempDir::new("launch-prefixes");
    let prefixes = shipped_launch_prefixes();
    let subnet = mock.default_instance().subnet_id;
    mock.enforce_shipped_policy(CLUSTER).unwrap();
    let launched = mock
        .launch_instance_carrying(
            "m5.xlarge",
            &subnet,
            &[],
            mockcloud::LaunchAddresses {
                secondary_count: 0,
                prefix_count: prefixes,
            },
        )
        .await
        .expect("EC2 launches it");
    let cfg = DaemonConfig {
        imds_endpoint: Some(launched.imds_url.clone()),
        ..shipped(&mock, &dir.0)
    };
    mock.reset_counters();
    let d = start(cfg.clone()).await;
    let launch_addresses = prefixes * 16;
    let s = d.pool.snapshot();
    assert_eq!(s.quarantined, 0, "{s:?}");
    assert_eq!(s.idle, launch_addresses, "{s:?}");
    assert_eq!(s.idle_eligible, launch_addresses, "eligible at once: {s:?}");

    let pods = launch_addresses as usize - 4;
    let ips = allocate_all(&d.socket_path, 0..pods).await;
    assert_eq!(ips.iter().collect::<BTreeSet<_>>().len(), pods);
    // The warm levels keep every idle address of the launch (pods included, the node holds what
    // it launched with) and need no top-up: no maintainer round will call EC2 for them.
    let s = d.pool.snapshot();
    assert!(
        s.warm_keep >= s.idle,
        "the launch's addresses are kept: {s:?}"
    );
    assert!(s.idle >= s.warm_target, "no top-up needed: {s:?}");
    let counters = mock.counters();
    for action in [
        ASSIGN,
        "UnassignPrivateIpAddresses",
        "CreateNetworkInterface",
        "AttachNetworkInterface",
    ] {
        assert_eq!(
            counters.calls(action),
            0,
            "{action}: the launch's /28s serve the pods and the warm pool: {:?}",
            counters.actions
        );
    }
    let eth0 = eth0_in_ec2(&mock, &launched.instance_id);
    assert_eq!(
        eth0.ipv4_prefixes.len(),
        prefixes as usize,
        "none given back"
    );
    assert!(
        ips.iter()
            .all(|ip| eth0.ipv4_prefixes.iter().any(|p| p.contains(ip))),
        "every pod IP is from the launch's /28s"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;

    // The state file lost: the instance was served before (its start marker), so this is a loss.
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(dir.0.join(f));
    }
    let d = start(cfg).await;
    let s = d.pool.snapshot();
    assert_eq!(
        s.idle_eligible, 0,
        "a lost file's addresses are not fresh: {s:?}"
    );
    assert!(s.quarantined > 0, "held until a settled describe: {s:?}");
    d.shutdown().await;
}
