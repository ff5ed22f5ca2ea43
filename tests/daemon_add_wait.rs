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
