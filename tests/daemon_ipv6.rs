//! Issue 26, the daemon's IPv6 mode: the real daemon, the real AWS SDK, mockcloud enforcing the
//! shipped IAM policy. One /80 per node taken at startup with one mutating call; pods' addresses from
//! it with no EC2 call; durable records, sticky StatefulSet addresses and no address handed out twice
//! across restarts and a lost state file; dual-stack pods get both families and lose both together.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeSet;
use std::net::Ipv6Addr;

use daemon_support::ipv6::*;
use daemon_support::*;
use eniipam::ipv6::IpFamily;
use eniipam::rpc::{API_VERSION, pb};
use mockcloud::MockCloud;

/// Every successful mutating call mockcloud answered.
fn mutating_ok(mock: &MockCloud) -> u64 {
    mock.counters()
        .actions
        .iter()
        .filter(|(a, _)| !a.starts_with("Describe") && !a.starts_with("Get"))
        .map(|(_, c)| c.ok)
        .sum()
}

fn sticky_req(container: &str, pod: &str) -> pb::AllocateRequest {
    pb::AllocateRequest {
        sticky_key: format!("default/{pod}"),
        ..alloc_req(container, pod)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_node_takes_one_slash_80_and_a_100_pod_burst_makes_no_ec2_call() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-burst");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg).await;
    assert_eq!(
        action_ok(&mock, "AssignIpv6Addresses"),
        1,
        "one /80 at startup"
    );
    assert_eq!(
        action_ok(&mock, "DescribeInstances"),
        1,
        "node discovery's alone (issue 46): the rebuild's first look at the instance's ENIs and the \
         IPv6 step's at eth0 read node discovery's describe"
    );
    let prefixes = eth0_prefixes(&mock);
    assert_eq!(prefixes.len(), 1);
    assert_eq!(prefixes[0].prefix_len(), 80);
    let before = mutating_ok(&mock);

    let mut tasks = Vec::new();
    for i in 0..100 {
        let socket = d.socket_path.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = client(&socket).await;
            c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                .await
                .expect("allocate")
                .into_inner()
        }));
    }
    let mut seen = BTreeSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.ip_family, "ipv6");
        assert!(r.ip.is_empty(), "no IPv4 in ipv6 mode: {}", r.ip);
        let ip: Ipv6Addr = r.ipv6.parse().unwrap();
        assert!(prefixes[0].contains(&ip) && ip != prefixes[0].network());
        assert_eq!(r.ipv6_prefix, prefixes[0].to_string());
        assert!(!r.vpc_ipv6_cidrs.is_empty(), "the VPC's /56 from IMDS");
        assert!(seen.insert(ip), "{ip} handed out twice");
    }
    assert_eq!(
        mutating_ok(&mock) - before,
        0,
        "a 100-pod burst made no mutating EC2 call"
    );
    assert!(ec2_pod_ips(&mock).is_empty(), "no IPv4 was warmed for pods");

    let mut c = client(&d.socket_path).await;
    let status = c
        .status(pb::StatusRequest {
            api_version: API_VERSION,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            status.ip_family.as_str(),
            status.ipv6_prefix.as_str(),
            status.ipv6_assigned
        ),
        ("ipv6", prefixes[0].to_string().as_str(), 100)
    );
    // Release: the address comes back in the reply; a second DEL is a success that released nothing.
    let rel = c
        .release(release_req("c7", false))
        .await
        .unwrap()
        .into_inner();
    assert!(rel.released && rel.ip.is_empty());
    let freed: Ipv6Addr = rel.ipv6.parse().unwrap();
    let again = c
        .release(release_req("c7", false))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.released && again.ipv6.is_empty());
    // CHECK knows the pods that hold an address, and not the released one.
    let check = |container: &str, ipv6: String| pb::CheckRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        network: "eniipam".into(),
        ipv6,
        ..Default::default()
    };
    let ok = c
        .check(check("c8", String::new()))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.ok && !ok.ipv6.is_empty(), "{}", ok.message);
    let wrong = c
        .check(check("c8", freed.to_string()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !wrong.ok && wrong.message.contains("expects"),
        "{}",
        wrong.message
    );
    let gone = c
        .check(check("c7", String::new()))
        .await
        .unwrap()
        .into_inner();
    assert!(!gone.ok, "{}", gone.message);
    // A new pod never gets the released address.
    let next = c
        .allocate(alloc_req("c100", "p100"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(next.ipv6, freed.to_string());
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_keep_the_slash_80_and_the_pods_and_a_lost_file_never_reissues_an_address() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-restart");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut held = Vec::new();
    for i in 0..5 {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap();
        held.push(r.into_inner().ipv6);
    }
    let web = c
        .allocate(sticky_req("w0", "web-0"))
        .await
        .unwrap()
        .into_inner()
        .ipv6;
    c.release(release_req("w0", true)).await.unwrap();
    let plain = c
        .release(release_req("c4", false))
        .await
        .unwrap()
        .into_inner()
        .ipv6;
    d.shutdown().await;

    // Second life, same file: the same /80 (no second assign), the same pods, the sticky pod's address.
    let d = start(cfg.clone()).await;
    assert_eq!(action_ok(&mock, "AssignIpv6Addresses"), 1);
    let mut c = client(&d.socket_path).await;
    for (i, ip) in held.iter().enumerate().take(4) {
        let again = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap();
        assert_eq!(
            &again.into_inner().ipv6,
            ip,
            "a repeated ADD after a restart"
        );
    }
    let back = c
        .allocate(sticky_req("w1", "web-0"))
        .await
        .unwrap()
        .into_inner()
        .ipv6;
    assert_eq!(back, web, "the StatefulSet pod's address waited for it");
    let fresh = c
        .allocate(alloc_req("n0", "n0"))
        .await
        .unwrap()
        .into_inner()
        .ipv6;
    assert!(!held.contains(&fresh) && fresh != plain);
    d.shutdown().await;

    // Third life, the file lost: the /80 on eth0 is adopted (no new assign) and the cursor starts
    // from the clock, past every address handed out before.
    std::fs::remove_file(&cfg.state_path).unwrap();
    let d = start(cfg.clone()).await;
    assert_eq!(
        action_ok(&mock, "AssignIpv6Addresses"),
        1,
        "the /80 on eth0 adopted"
    );
    let mut c = client(&d.socket_path).await;
    let before: BTreeSet<Ipv6Addr> = held
        .iter()
        .chain([&web, &fresh, &plain])
        .map(|s| s.parse().unwrap())
        .collect();
    for i in 0..20 {
        let r = c
            .allocate(alloc_req(&format!("m{i}"), &format!("m{i}")))
            .await
            .unwrap();
        let ip: Ipv6Addr = r.into_inner().ipv6.parse().unwrap();
        assert!(
            before.iter().all(|b| ip > *b),
            "{ip} after a lost state file must be past every earlier address"
        );
    }
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_get_both_families_and_lose_both_together() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-dual");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Dual,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg).await;
    let mut c = client(&d.socket_path).await;
    let r = c
        .allocate(alloc_req("d0", "d0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.ip_family, "dual");
    assert!(r.ip.parse::<std::net::Ipv4Addr>().is_ok() && r.ipv6.parse::<Ipv6Addr>().is_ok());
    assert!(!r.eni_id.is_empty() && !r.gateway.is_empty());
    assert!(ec2_pod_ips(&mock).contains(&r.ip.parse().unwrap()));
    let rel = c
        .release(release_req("d0", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (rel.ip.as_str(), rel.ipv6.as_str()),
        (r.ip.as_str(), r.ipv6.as_str())
    );
    let s = d.ipam().store().load_ipv6().await.unwrap();
    assert!(s.assignments.is_empty());
    assert!(
        d.ipam()
            .store()
            .load()
            .await
            .unwrap()
            .assignments
            .is_empty()
    );
    // A preferred IPv6 outside the node's /80 with require_preferred: refused, nothing held.
    let bad = c
        .allocate(pb::AllocateRequest {
            preferred_ip: "2600:1f18:ffff::1".into(),
            require_preferred: true,
            ..alloc_req("d1", "d1")
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::FailedPrecondition, "{bad}");
    assert!(
        d.pool
            .allocation(&eniipam::model::AttachmentKey::new("d1", "eth0"))
            .is_none()
    );
    let junk = c
        .allocate(pb::AllocateRequest {
            preferred_ip: "2600:zz::1".into(),
            ..alloc_req("d2", "d2")
        })
        .await
        .unwrap_err();
    assert_eq!(junk.code(), tonic::Code::InvalidArgument, "{junk}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subnet_without_an_ipv6_block_stops_the_start_with_a_clear_error() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-nosubnet");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let subnet = mock.default_world().unwrap().subnet_id;
    mock.disassociate_subnet_ipv6_cidr_block(&subnet).unwrap();
    let clients = eniipam::daemon::CloudClients::from_config(
        &cfg,
        Some(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "test",
        )),
    )
    .await
    .unwrap();
    let err = match eniipam::daemon::Daemon::start_with(cfg, clients).await {
        Ok(_) => panic!("started without an IPv6 block"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&subnet) && err.contains("IPv6 CIDR"), "{err}");
    assert_eq!(action_ok(&mock, "AssignIpv6Addresses"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_reconcile_releases_dead_ipv6_pods() {
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-reconcile");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    let d = start(cfg).await;
    let mut c = client(&d.socket_path).await;
    let (live, dead) = (dir.0.join("netns-live"), dir.0.join("netns-dead"));
    for (container, ns) in [("live", &live), ("dead", &dead)] {
        std::fs::write(ns, b"").unwrap();
        c.allocate(pb::AllocateRequest {
            netns: ns.display().to_string(),
            ..alloc_req(container, container)
        })
        .await
        .unwrap();
    }
    // The dead pod's sandbox went away without a DEL.
    std::fs::remove_file(&dead).unwrap();
    let report = d.reconcile_now().await.expect("a pass");
    let released: Vec<String> = report
        .released_dead_ipv6
        .iter()
        .map(|(k, _)| k.container_id.clone())
        .collect();
    assert_eq!(released, vec!["dead".to_owned()]);
    assert!(!report.ipv6_prefix_missing);
    let key = |c: &str| eniipam::model::AttachmentKey::new(c, "eth0");
    assert!(d.ipam().check6(&key("dead")).unwrap().is_none());
    assert!(d.ipam().check6(&key("live")).unwrap().is_some());
    let stored = d.ipam().store().load_ipv6().await.unwrap();
    assert_eq!(stored.assignments.len(), 1);
    d.shutdown().await;
}

/// IPv4 egress (`ipv4_egress`, on by default in ipv6 mode): every pod gets its own node-local
/// address of 169.254.172.0/22 with its IPv6, a restart keeps each pod's, a released one is not handed
/// to the next pod, CHECK names it; off (or dual-stack) gives none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_pods_get_distinct_egress_addresses_that_survive_restarts_and_are_not_reused_at_once()
{
    let mock = ipv6_mock().await;
    let dir = TempDir::new("ipv6-egress");
    let cfg = eniipam::config::DaemonConfig {
        ip_family: IpFamily::Ipv6,
        ..config(&mock, &dir.0)
    };
    assert!(cfg.ipv4_egress, "on by default");
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut egress = Vec::new();
    for i in 0..100 {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap()
            .into_inner();
        assert!(r.ip.is_empty(), "no VPC IPv4 in ipv6 mode");
        let ip: std::net::Ipv4Addr = r.egress_ipv4.parse().unwrap();
        assert!(
            ip.octets()[..2] == [169, 254] && (172..=175).contains(&ip.octets()[2]),
            "{ip} in 169.254.172.0/22"
        );
        egress.push(ip);
    }
    let distinct: BTreeSet<_> = egress.iter().collect();
    assert_eq!(distinct.len(), 100, "no two live pods share one");
    let check = |container: &str| pb::CheckRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        network: "eniipam".into(),
        ..Default::default()
    };
    let checked = c.check(check("c7")).await.unwrap().into_inner();
    assert_eq!(checked.egress_ipv4, egress[7].to_string());
    // Released: the address is free, but the next pod gets a fresh one.
    let freed = egress[3];
    c.release(release_req("c3", false)).await.unwrap();
    let next: std::net::Ipv4Addr = c
        .allocate(alloc_req("n0", "n0"))
        .await
        .unwrap()
        .into_inner()
        .egress_ipv4
        .parse()
        .unwrap();
    assert!(next != freed && !egress.contains(&next), "{next}");
    d.shutdown().await;

    // Second life: each pod keeps its address (a repeated ADD, CHECK), and the cursor carries on.
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    for i in [0usize, 50, 99] {
        let again = c
            .allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.egress_ipv4, egress[i].to_string(), "pod {i}");
    }
    let after: std::net::Ipv4Addr = c
        .allocate(alloc_req("n1", "n1"))
        .await
        .unwrap()
        .into_inner()
        .egress_ipv4
        .parse()
        .unwrap();
    assert!(
        after != freed && after != next && !egress.contains(&after),
        "{after}"
    );
    d.shutdown().await;

    // Third life with ipv4_egress off: no address for new pods, and CHECK names none.
    let off = eniipam::config::DaemonConfig {
        ipv4_egress: false,
        ..cfg.clone()
    };
    let d = start(off).await;
    let mut c = client(&d.socket_path).await;
    let r = c
        .allocate(alloc_req("o0", "o0"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.ipv6.is_empty() && r.egress_ipv4.is_empty(), "{r:?}");
    let checked = c.check(check("c7")).await.unwrap().into_inner();
    assert!(checked.ok && checked.egress_ipv4.is_empty(), "{checked:?}");
    d.shutdown().await;

    // Dual-stack pods have a VPC IPv4: no egress address.
    let dir = TempDir::new("dual-egress");
    let d = start(eniipam::config::DaemonConfig {
        ip_family: IpFamily::Dual,
        ..config(&mock, &dir.0)
    })
    .await;
    let mut c = client(&d.socket_path).await;
    let r = c
        .allocate(alloc_req("d0", "d0"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.ip.is_empty() && r.egress_ipv4.is_empty(), "{r:?}");
    d.shutdown().await;
}
