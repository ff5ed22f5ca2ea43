//! Issue 26, the node's /80 unassigned out of band (the IPv6 soak's `oob-prefix-unassign`): while it
//! is still free in the subnet, the running reconcile and a restart assign the same /80 back and
//! every pod keeps its address; when EC2 refuses (another ENI took it), the pass asks no more (an
//! "in use" once the describe had a minute to show the /80 on eth0), and a restart takes a new /80 as
//! before. The real daemon, the real AWS SDK, mockcloud
//! enforcing the shipped IAM policy.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use daemon_support::ipv6::*;
use daemon_support::*;
use eniipam::daemon::DaemonHandle;
use eniipam::ipv6::IpFamily;
use eniipam::model::AttachmentKey;
use eniipam::rpc::pb;
use ipnet::Ipv6Net;
use mockcloud::MockCloud;

/// AssignIpv6Addresses calls mockcloud answered, and those it refused.
fn assigns(mock: &MockCloud) -> (u64, u64) {
    (
        action_ok(mock, "AssignIpv6Addresses"),
        action_refused(mock, "AssignIpv6Addresses"),
    )
}

/// Someone unassigns the node's /80 behind the daemon's back (the console, another tool).
async fn unassign_out_of_band(mock: &MockCloud, eni: &str, prefix: Ipv6Net) {
    operator_sdk(mock)
        .unassign_ipv6_addresses()
        .network_interface_id(eni)
        .ipv6_prefixes(prefix.to_string())
        .send()
        .await
        .expect("unassign the /80");
}

/// Two IPv6 pods with live network namespaces; returns their keys and addresses.
async fn two_pods(d: &DaemonHandle, dir: &std::path::Path) -> Vec<(AttachmentKey, String)> {
    let mut c = client(&d.socket_path).await;
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        let ns = dir.join(format!("netns-{name}"));
        std::fs::write(&ns, b"").unwrap();
        let ip = c
            .allocate(pb::AllocateRequest {
                netns: ns.display().to_string(),
                ..alloc_req(name, name)
            })
            .await
            .unwrap()
            .into_inner()
            .ipv6;
        pods.push((AttachmentKey::new(name, "eth0"), ip));
    }
    pods
}

fn assert_pods_kept(d: &DaemonHandle, pods: &[(AttachmentKey, String)]) {
    for (key, ip) in pods {
        let now = d
            .ipam()
            .check6(key)
            .unwrap()
            .expect("the pod kept its IPv6");
        assert_eq!(&now.to_string(), ip, "{key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_80_unassigned_out_of_band_is_assigned_back_by_the_reconcile_and_at_restart() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-reclaim");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let pods = two_pods(&d, &dir.0).await;
    let prefix = d.ipam().ipv6().unwrap().prefix();
    let eni = d.ipam().ipv6().unwrap().eni_id.clone();
    assert_eq!(assigns(&mock), (1, 0));

    // The running reconcile: one by-value assign, the /80 on eth0 again, the pods as they were.
    unassign_out_of_band(&mock, &eni, prefix).await;
    assert!(eth0_prefixes(&mock).is_empty());
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_reclaimed, "{report:?}");
    assert!(!report.ipv6_prefix_missing);
    assert_eq!(eth0_prefixes(&mock), vec![prefix]);
    assert_eq!(assigns(&mock), (2, 0));
    assert_pods_kept(&d, &pods);
    let metrics = metrics_text(d.metrics_addr).await;
    assert!(metrics.contains("eniipam_ipv6_prefixes 1"), "{metrics}");
    // The next pass finds it in place and asks nothing.
    let report = d.reconcile_now().await.expect("a pass");
    assert!(!report.ipv6_prefix_reclaimed && !report.ipv6_prefix_missing);
    assert_eq!(assigns(&mock), (2, 0));
    d.shutdown().await;

    // Gone while the daemon is down: the restart takes the same /80 back, with the pods.
    unassign_out_of_band(&mock, &eni, prefix).await;
    let d = start(cfg.clone()).await;
    assert_eq!(d.ipam().ipv6().unwrap().prefix(), prefix);
    assert_eq!(eth0_prefixes(&mock), vec![prefix]);
    assert_eq!(assigns(&mock), (3, 0));
    assert_pods_kept(&d, &pods);
    let stored = d.ipam().store().load_ipv6().await.unwrap();
    assert_eq!(stored.assignments.len(), 2);
    assert_eq!(stored.prefix.map(|p| p.prefix), Some(prefix));
    let metrics = metrics_text(d.metrics_addr).await;
    assert!(metrics.contains("eniipam_ipv6_prefixes 1"), "{metrics}");
    // A new pod gets an address none of the kept pods has.
    let mut c = client(&d.socket_path).await;
    let fresh = c
        .allocate(alloc_req("n", "n"))
        .await
        .unwrap()
        .into_inner()
        .ipv6;
    assert!(pods.iter().all(|(_, ip)| *ip != fresh), "{fresh}");
    d.shutdown().await;
}

/// On tokio's paused clock (the daemon, mockcloud and the client in this process; store waits hold
/// the clock): the restart waits out the minute an in-use answer may be the describe lagging, which
/// took a minute of real time.
#[tokio::test(start_paused = true)]
async fn a_slash_80_another_eni_took_is_asked_once_and_replaced_at_restart() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-reclaim-refused");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let pods = two_pods(&d, &dir.0).await;
    let prefix = d.ipam().ipv6().unwrap().prefix();
    let eni = d.ipam().ipv6().unwrap().eni_id.clone();
    unassign_out_of_band(&mock, &eni, prefix).await;
    // Another ENI of the subnet takes that very /80 before the daemon looks.
    let ec2 = operator_sdk(&mock);
    let subnet = mock.default_world().unwrap().subnet_id;
    let other = ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap();
    ec2.assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_prefixes(prefix.to_string())
        .send()
        .await
        .unwrap();
    let (ok_before, _) = assigns(&mock);

    // EC2 answers in use: within a minute of that answer it may be eth0's own, assigned moments
    // before and not described yet (EC2's describes lag), so the pass waits for the describe and
    // asks nothing more meanwhile. (A minute on, in use again is final and reported: the unit tests
    // of `reconcile::decide`'s prefix6 hold that on a clock of their own.)
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_settling && !report.ipv6_prefix_reclaimed);
    assert_eq!(assigns(&mock), (ok_before, 1));
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_settling);
    assert_eq!(
        assigns(&mock),
        (ok_before, 1),
        "an in-use /80 is asked once while the describe settles"
    );
    assert!(eth0_prefixes(&mock).is_empty());
    d.shutdown().await;

    // A restart: refused again, so a new /80; the pods' addresses (no longer routing) are forgotten.
    let d = start(cfg.clone()).await;
    let now = d.ipam().ipv6().unwrap().prefix();
    assert_ne!(now, prefix);
    assert_eq!(eth0_prefixes(&mock), vec![now]);
    assert_eq!(assigns(&mock), (ok_before + 1, 2));
    for (key, _) in &pods {
        assert!(d.ipam().check6(key).unwrap().is_none(), "{key:?} forgotten");
    }
    let metrics = metrics_text(d.metrics_addr).await;
    assert!(metrics.contains("eniipam_ipv6_prefixes 1"), "{metrics}");
    d.shutdown().await;
}

/// Issue 44 case 7: right after the /80 was assigned back, EC2's describe (eventually consistent)
/// does not show it on eth0 yet, and assigning it back again is answered "in use" — by eth0 itself.
/// The pass takes that as the describe lagging, not as a /80 lost for good: it does not ask again
/// while the describe settles, and once the describe shows the /80, a later real loss is assigned
/// back like the first. (It was remembered as refused: the daemon asked for a restart, and the
/// second loss was never taken back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_use_while_the_describe_lags_a_reclaim_is_eth0s_own_and_a_later_loss_is_taken_back() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-reclaim-lag");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg).await;
    let pods = two_pods(&d, &dir.0).await;
    let prefix = d.ipam().ipv6().unwrap().prefix();
    let eni = d.ipam().ipv6().unwrap().eni_id.clone();
    unassign_out_of_band(&mock, &eni, prefix).await;
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_reclaimed, "{report:?}");
    assert_eq!(assigns(&mock), (2, 0));

    // EC2's describe lags from here: the /80 assigned back moments ago is not in it.
    mock.set_describe_lag(std::time::Duration::from_secs(3600));
    let report = d.reconcile_now().await.expect("a pass");
    assert_eq!(assigns(&mock), (2, 1), "asked once, answered in use");
    assert!(
        report.ipv6_prefix_settling && !report.ipv6_prefix_missing,
        "in use by eth0 itself is not a lost /80: {report:?}"
    );
    let metrics = metrics_text(d.metrics_addr).await;
    assert!(metrics.contains("eniipam_ipv6_prefixes 1"), "{metrics}");
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_settling && !report.ipv6_prefix_missing);
    assert_eq!(
        assigns(&mock),
        (2, 1),
        "nothing asked while the describe settles"
    );

    // The describe catches up: the /80 is in place.
    mock.set_describe_lag(std::time::Duration::ZERO);
    let report = d.reconcile_now().await.expect("a pass");
    assert!(
        !report.ipv6_prefix_settling
            && !report.ipv6_prefix_missing
            && !report.ipv6_prefix_reclaimed
    );

    // A real loss later is taken back like the first.
    unassign_out_of_band(&mock, &eni, prefix).await;
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_reclaimed, "{report:?}");
    assert_eq!(eth0_prefixes(&mock), vec![prefix]);
    assert_eq!(assigns(&mock), (3, 1));
    assert_pods_kept(&d, &pods);
    d.shutdown().await;
}
