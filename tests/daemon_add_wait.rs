//! ADDs that wait, through the real daemon and the plugin's own gRPC client (issue 25, item 2): the
//! client sends its deadline (`grpc-timeout`), EC2 (mockcloud, through the real SDK) throttles the
//! node's assigns, and every ADD is answered with an IP, none with an error the runtime would have to
//! retry. The pool-level rules (budget, deadlines, what waits and what fails) are in
//! `tests/pool_add_wait.rs` on the paused clock.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeSet;
use std::time::Duration;

use eniipam_cni::client::DaemonClient;
use mockcloud::Fault;

/// On tokio's paused clock, as the startup test below: the pods that come while the throttled
/// assign backs off come within the back-off on any machine, however loaded.
#[tokio::test(start_paused = true)]
async fn adds_wait_out_throttled_assigns_and_one_call_serves_the_pods_that_came_meanwhile() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let dir = daemon_support::TempDir::new("add-wait");
    // No warm IPs: every pod needs an assign, and nothing rides along.
    let config = eniipam::config::DaemonConfig {
        warm_policy: eniipam::pool::config::WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 0,
        ..daemon_support::config(&mock, &dir.0)
    };
    let d = daemon_support::start(config).await;
    // The next 3 assigns are throttled.
    mock.inject_fault(Fault::error(
        "AssignPrivateIpAddresses",
        "RequestLimitExceeded",
        3,
    ));
    mock.reset_counters();
    let add = |i: usize| {
        let socket = d.socket_path.clone();
        async move {
            let mut client = DaemonClient::connect(&socket, Duration::from_secs(60))
                .await
                .expect("connect");
            client
                .allocate(daemon_support::alloc_req(
                    &format!("ctr{i}"),
                    &format!("web-{i}"),
                ))
                .await
        }
    };
    // The first pod's assign is throttled; seven more pods come while the node waits.
    let first = tokio::spawn(add(0));
    while mock.counters().throttled("AssignPrivateIpAddresses") == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rest = futures::future::join_all((1..8).map(add)).await;
    let mut results = vec![first.await.unwrap()];
    results.extend(rest);
    let ips: BTreeSet<String> = results
        .iter()
        .map(|r| r.as_ref().expect("every ADD gets an IP").ip.clone())
        .collect();
    assert_eq!(ips.len(), 8, "eight distinct IPs");
    let c = mock.counters();
    assert_eq!(c.throttled("AssignPrivateIpAddresses"), 3);
    // A throttled assign is not retried as it was (one pod): the pods wait in line, and the try
    // after the throttles carries all eight in one call.
    assert_eq!(
        c.ok("AssignPrivateIpAddresses"),
        1,
        "one successful assign for the eight pods: {c:?}"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// A fleet booting together shares the account's buckets (the fleet benchmark's node-boot pattern
/// at 500 nodes): the startup's describes can be throttled past the limiter's six attempts. The
/// daemon rides that out and starts, rather than exiting into the kubelet's crash-loop back-off;
/// a failure EC2's slowness does not explain still ends the start at once. On tokio's paused clock
/// (daemon, mockcloud and client in this process; store waits hold the clock): the back-offs took
/// 40 s of real time.
#[tokio::test(start_paused = true)]
async fn the_startup_rides_out_throttled_describes_and_the_daemon_starts() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let dir = daemon_support::TempDir::new("startup-throttled");
    // Nine throttled describes: the rebuild's first call gives up after six attempts.
    mock.inject_fault(Fault::error(
        "DescribeNetworkInterfaces",
        "RequestLimitExceeded",
        9,
    ));
    let d = daemon_support::start(daemon_support::config(&mock, &dir.0)).await;
    assert!(mock.counters().throttled("DescribeNetworkInterfaces") >= 9);
    let mut c = daemon_support::client(&d.socket_path).await;
    let ip = c
        .allocate(daemon_support::alloc_req("ctr0", "web-0"))
        .await
        .expect("served after the throttled startup")
        .into_inner()
        .ip;
    assert!(!ip.is_empty());
    d.shutdown().await;

    // Refused outright (not slow): the start fails at once, with EC2's answer.
    let dir = daemon_support::TempDir::new("startup-refused");
    mock.inject_fault(Fault::error(
        "DescribeNetworkInterfaces",
        "UnauthorizedOperation",
        1,
    ));
    let config = daemon_support::config(&mock, &dir.0);
    let clients = eniipam::daemon::CloudClients::from_config(
        &config,
        Some(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "test",
        )),
    )
    .await
    .expect("clients");
    let started = tokio::time::Instant::now();
    let err = match eniipam::daemon::Daemon::start_with(config, clients).await {
        Ok(_) => panic!("the start must fail on a refused describe"),
        Err(e) => e,
    };
    assert!(
        format!("{err:#} {err:?}").contains("UnauthorizedOperation"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no patience for a refusal"
    );
}
