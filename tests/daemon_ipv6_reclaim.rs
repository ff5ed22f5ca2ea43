//! Issue 26, the node's /80 unassigned out of band (the IPv6 soak's `oob-prefix-unassign`): while it
//! is still free in the subnet, the running reconcile and a restart assign the same /80 back and
//! every pod keeps its address; when EC2 refuses (another ENI took it), the pass reports it and asks
//! no more, and a restart takes a new /80 as before. The real daemon, the real AWS SDK, mockcloud
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_80_another_eni_took_is_reported_asked_once_and_replaced_at_restart() {
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

    // EC2 refuses (in use): reported, the metric 0, and the next pass does not ask again.
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_missing && !report.ipv6_prefix_reclaimed);
    assert_eq!(assigns(&mock), (ok_before, 1));
    let metrics = metrics_text(d.metrics_addr).await;
    assert!(metrics.contains("eniipam_ipv6_prefixes 0"), "{metrics}");
    let report = d.reconcile_now().await.expect("a pass");
    assert!(report.ipv6_prefix_missing);
    assert_eq!(
        assigns(&mock),
        (ok_before, 1),
        "a refused /80 is asked once"
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
