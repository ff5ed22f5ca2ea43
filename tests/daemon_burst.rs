//! Burst prefixes through the real daemon (issue 46, item 1): on a Nitro type, with the shipped
//! defaults and the shipped IAM policy enforced, a burst beyond the idle IPs is served by one
//! AssignPrivateIpAddresses of whole `/28`s on eth0, no ENI is created for it, and the `/28`s
//! survive a restart: the rebuild from IMDS and EC2 takes them back with the pods that hold their
//! addresses, and the next pods are served from their idle addresses without a call.

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

fn shipped(mock: &mockcloud::MockCloud, dir: &std::path::Path) -> DaemonConfig {
    DaemonConfig {
        // The shipped default, which the daemon tests' base config turns off.
        burst_prefixes: DaemonConfig::default().burst_prefixes,
        ..config(mock, dir)
    }
}

async fn allocate_all(socket: &std::path::Path, range: std::ops::Range<usize>) -> Vec<Ipv4Addr> {
    // Every client connected first, then every ADD at once: one burst.
    let mut clients = Vec::new();
    for i in range {
        clients.push((i, client(socket).await));
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, mut c) in clients {
        set.spawn(async move {
            c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                .await
                .map(|r| r.into_inner().ip.parse::<Ipv4Addr>().unwrap())
        });
    }
    let mut ips = Vec::new();
    while let Some(r) = set.join_next().await {
        ips.push(r.unwrap().expect("every pod of the burst is served"));
    }
    ips
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_whole_prefixes_on_eth0_in_one_call_and_keeps_them_across_a_restart() {
    assert!(
        DaemonConfig::default().burst_prefixes,
        "burst prefixes are the shipped default"
    );
    let mock = mock().await;
    let dir = TempDir::new("burst-prefixes");
    let cfg = shipped(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let inst = mock.default_instance();
    mock.reset_counters();

    let ips = allocate_all(&d.socket_path, 0..PODS).await;
    let unique: BTreeSet<Ipv4Addr> = ips.iter().copied().collect();
    assert_eq!(unique.len(), PODS, "no IP handed out twice");
    let counters = mock.counters();
    assert_eq!(
        counters.ok(ASSIGN),
        1,
        "one assign serves the burst: {:?}",
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
    let eth0 = mock
        .instance(&inst.instance_id)
        .unwrap()
        .enis
        .into_iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .unwrap();
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
    assert!(s.idle >= idle_before.min(1), "the prefixes' idle addresses are back: {s:?}");
    d.pool.check_invariants().unwrap();
    mock.reset_counters();
    // The next pods are served from the prefixes' idle addresses (idle as before), no call needed.
    let more = s.idle.min(4) as usize;
    let next = allocate_all(&d.socket_path, PODS..PODS + more).await;
    assert!(next.iter().all(|ip| !unique.contains(ip)));
    assert_eq!(
        mock.counters().ok(ASSIGN),
        0,
        "served from idle addresses of the /28s"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}
