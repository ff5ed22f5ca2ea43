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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_wait_out_throttled_assigns_and_all_get_an_ip() {
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let dir = daemon_support::TempDir::new("add-wait");
    let d = daemon_support::start(daemon_support::config(&mock, &dir.0)).await;
    // The next 8 assigns are throttled: more than one call's 6 attempts, so the first call gives up
    // and its pods wait in line for the next.
    mock.inject_fault(Fault::error(
        "AssignPrivateIpAddresses",
        "RequestLimitExceeded",
        8,
    ));
    let adds = (0..8).map(|i| {
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
    });
    let results = futures::future::join_all(adds).await;
    let ips: BTreeSet<String> = results
        .iter()
        .map(|r| r.as_ref().expect("every ADD gets an IP").ip.clone())
        .collect();
    assert_eq!(ips.len(), 8, "eight distinct IPs");
    // EC2 did throttle the node's assigns (one call's six attempts at least) while the ADDs waited.
    let throttled = mock.counters().throttled("AssignPrivateIpAddresses");
    assert!(throttled >= 6, "{throttled} throttled assigns");
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// A fleet booting together shares the account's buckets (the fleet benchmark's node-boot pattern
/// at 500 nodes): the startup's describes can be throttled past the limiter's six attempts. The
/// daemon rides that out and starts, rather than exiting into the kubelet's crash-loop back-off;
/// a failure EC2's slowness does not explain still ends the start at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_rides_out_throttled_describes_and_the_daemon_starts() {
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
