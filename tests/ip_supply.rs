//! Issue 15 through the real daemon on mockcloud (real AWS SDK): new ENIs go to a subnet tagged
//! `kubernetes.io/role/cni` with the security groups its `eniipam.io/security-groups` tag names when
//! the node's own subnet is full; with prefix delegation a fragmented subnet still serves pods
//! (single addresses packed into broken `/28`s) and a restart rebuilds the prefixes' addresses
//! exactly.
//!
//! Issue 45: the daemon and mockcloud run in-process on tokio's paused clock (the store's disk waits
//! hold it, see [`simulated_time`]), so the daemon's own timers (the maintainer's batch window and
//! tick, IMDS catching up with a prefix) run at the same simulated instants however loaded the
//! machine is.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use daemon_support::*;
use eniipam::model::AttachmentKey;
use eniipam::pool::config::WarmPolicy;
use eniipam::pool::slots::prefix_addresses;
use ipnet::Ipv4Net;
use mockcloud::world::OccupyPattern;
use mockcloud::{Config, MockCloud};

/// Each test runs on the paused clock of a `current_thread` runtime (`start_paused`); the store
/// answers from its own thread, so its waits must hold that clock, or it would jump to the next
/// timer on every disk write (process-wide: every test of this file runs so).
fn simulated_time() {
    eniipam::store::hold_the_clock_on_disk_waits(true);
}

async fn mock(instance_type: &str) -> MockCloud {
    simulated_time();
    MockCloud::start(Config {
        default_instance_type: instance_type.into(),
        ..Config::fast()
    })
    .await
    .unwrap()
}

async fn allocate_n(
    d: &eniipam::daemon::DaemonHandle,
    range: std::ops::Range<usize>,
) -> Vec<Ipv4Addr> {
    let mut c = client(&d.socket_path).await;
    let mut out = Vec::new();
    for i in range {
        let r = c
            .allocate(alloc_req(&format!("c{i}"), &format!("pod-{i}")))
            .await
            .unwrap_or_else(|e| panic!("pod {i}: {e}"))
            .into_inner();
        out.push(r.ip.parse().unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn new_enis_go_to_the_tagged_subnet_when_the_nodes_is_full() {
    let mock = mock("m5.large").await;
    let inst = mock.default_instance();
    let (tagged, sg) = mock.with_world(|w, _| {
        let sg = w.create_security_group(&inst.vpc_id).unwrap();
        let tags: BTreeMap<String, String> = [
            ("kubernetes.io/role/cni".to_owned(), "1".to_owned()),
            ("eniipam.io/security-groups".to_owned(), sg.clone()),
        ]
        .into();
        let id = w
            .create_subnet_with_tags(
                &inst.vpc_id,
                "10.0.32.0/24".parse().unwrap(),
                &inst.availability_zone,
                &tags,
            )
            .unwrap();
        // A subnet tagged 0 is never used, even with more room.
        let zero: BTreeMap<String, String> =
            [("kubernetes.io/role/cni".to_owned(), "0".to_owned())].into();
        w.create_subnet_with_tags(
            &inst.vpc_id,
            "10.0.64.0/20".parse().unwrap(),
            &inst.availability_zone,
            &zero,
        )
        .unwrap();
        // The node's own subnet has nothing left.
        w.occupy_addresses(
            &inst.subnet_id,
            &OccupyPattern::Range {
                cidr: "10.0.0.0/20".parse().unwrap(),
            },
        )
        .unwrap();
        (id, sg)
    });
    let dir = TempDir::new("tagged-subnet");
    let mut cfg = config(&mock, &dir.0);
    cfg.use_primary_eni = false;
    cfg.min_idle = 0;
    let d = start(cfg).await;
    let ips = allocate_n(&d, 0..3).await;
    let subnet: Ipv4Net = "10.0.32.0/24".parse().unwrap();
    assert!(ips.iter().all(|ip| subnet.contains(ip)), "{ips:?}");
    let alloc = d
        .pool
        .allocation(&AttachmentKey::new("c0", "eth0"))
        .unwrap();
    assert_eq!(alloc.subnet_id, tagged);
    assert_eq!(alloc.subnet_cidr, subnet);
    assert_eq!(alloc.gateway, "10.0.32.1".parse::<Ipv4Addr>().unwrap());
    let eni = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == alloc.eni.as_str())
        .unwrap();
    assert_eq!(eni.subnet_id, tagged);
    assert_eq!(
        eni.security_groups,
        vec![sg],
        "the subnet's security groups"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_subnet_outside_the_nodes_zone_is_refused_by_name() {
    let mock = mock("m5.large").await;
    let inst = mock.default_instance();
    let other = mock.with_world(|w, _| {
        w.create_subnet(&inst.vpc_id, "10.0.48.0/24".parse().unwrap(), "us-east-1f")
            .unwrap()
    });
    let dir = TempDir::new("bad-subnet");
    let mut cfg = config(&mock, &dir.0);
    cfg.subnet_ids = vec![other.clone()];
    let clients = eniipam::daemon::CloudClients::from_config(
        &cfg,
        Some(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "test",
        )),
    )
    .await
    .unwrap();
    let err = match eniipam::daemon::Daemon::start_with(cfg, clients).await {
        Ok(_) => panic!("a subnet in another zone must be refused"),
        Err(e) => e,
    };
    assert!(
        matches!(err, eniipam::daemon::DaemonError::Config(_)),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&other) && text.contains("us-east-1f"),
        "{text}"
    );
}

fn ec2_prefixes(mock: &MockCloud) -> Vec<Ipv4Net> {
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    inst.enis
        .iter()
        .flat_map(|e| e.ipv4_prefixes.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn prefixes_survive_a_restart_and_a_lost_state_file() {
    let mock = mock("m5.large").await;
    let dir = TempDir::new("pd-restart");
    let mut cfg = config(&mock, &dir.0);
    cfg.prefix_delegation = true;
    cfg.reuse_cooldown_secs = 0;
    // The fixed warm policy and no warm IPs: the prefixes counted are the pods' (the adaptive one
    // warms a burst's tail too, tests/pool_adaptive.rs). With the default min_idle a warm-up the
    // maintainer starts while the pods' second /28 is on the wire adds a third one: on the paused
    // clock always, on real time only when a loaded machine let the maintainer's timers run first
    // (issue 45).
    cfg.warm_policy = WarmPolicy::Fixed;
    cfg.min_idle = 0;
    let d = start(cfg.clone()).await;
    let ips = allocate_n(&d, 0..20).await;
    assert_eq!(ips.iter().collect::<BTreeSet<_>>().len(), 20);
    let prefixes = ec2_prefixes(&mock);
    assert_eq!(prefixes.len(), 2, "20 pods in two /28s: {prefixes:?}");
    for ip in &ips {
        assert!(prefixes.iter().any(|p| p.contains(ip)), "{ip}");
    }
    // Introspect (eniipamctl enis) shows each ENI's prefixes.
    let shown: Vec<String> = eniipam::rpc::pb::introspect_client::IntrospectClient::new(
        eniipam::rpc::connect(&d.socket_path).await.unwrap(),
    )
    .enis(eniipam::rpc::pb::EnisRequest {})
    .await
    .unwrap()
    .into_inner()
    .enis
    .into_iter()
    .flat_map(|e| e.prefixes)
    .collect();
    let mut want: Vec<String> = prefixes.iter().map(ToString::to_string).collect();
    want.sort();
    let mut shown = shown;
    shown.sort();
    assert_eq!(shown, want);
    d.pool.maintain_now().await.unwrap();
    let before: BTreeMap<AttachmentKey, Ipv4Addr> = d
        .pool
        .snapshot()
        .ips()
        .filter_map(|i| match &i.state {
            eniipam::pool::snapshot::IpState::Assigned { attachment, .. } => {
                Some((attachment.clone(), i.ip))
            }
            _ => None,
        })
        .collect();
    d.shutdown().await;

    // Restart with the file: the same assignments; the pool's addresses are exactly the prefixes'.
    let d = start(cfg.clone()).await;
    d.pool.maintain_now().await.unwrap();
    let snap = d.pool.snapshot();
    let pool_ips: BTreeSet<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    assert_eq!(pool_ips, ec2_pod_ips(&mock).into_iter().collect());
    let prefix_ips: BTreeSet<Ipv4Addr> = ec2_prefixes(&mock)
        .into_iter()
        .flat_map(prefix_addresses)
        .collect();
    assert!(prefix_ips.is_subset(&pool_ips));
    for (key, ip) in &before {
        assert_eq!(d.pool.allocation(key).map(|a| a.ip), Some(*ip), "{key:?}");
    }
    // Another ten pods: no second prefix call while the two have room.
    allocate_n(&d, 20..30).await;
    assert_eq!(ec2_prefixes(&mock).len(), 2);
    d.pool.check_invariants().unwrap();
    d.shutdown().await;

    // The file is lost but the plugin's cache is there: the rebuild from EC2 covers every prefix
    // address; nothing is handed out twice.
    std::fs::remove_file(&cfg.state_path).unwrap();
    let d = start(cfg.clone()).await;
    let snap = d.pool.snapshot();
    let pool_ips: BTreeSet<Ipv4Addr> = snap.ips().map(|i| i.ip).collect();
    assert_eq!(pool_ips, ec2_pod_ips(&mock).into_iter().collect());
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fragmented_subnet_still_serves_pods_with_prefix_delegation() {
    let mock = mock("m5.large").await;
    let inst = mock.default_instance();
    // One address taken in every /28: no prefix fits anywhere.
    mock.with_world(|w, _| {
        w.occupy_addresses(
            &inst.subnet_id,
            &OccupyPattern::Stride {
                stride: 16,
                offset: 8,
            },
        )
        .unwrap()
    });
    let dir = TempDir::new("pd-fragmented");
    let mut cfg = config(&mock, &dir.0);
    cfg.prefix_delegation = true;
    cfg.min_idle = 0;
    // The fixed warm policy: the blocks counted are the pods' (not a burst's warmed tail).
    cfg.warm_policy = WarmPolicy::Fixed;
    let d = start(cfg).await;
    let ips = allocate_n(&d, 0..5).await;
    assert_eq!(ips.iter().collect::<BTreeSet<_>>().len(), 5, "pods served");
    assert!(ec2_prefixes(&mock).is_empty());
    // Packed: all five in one /28 that was already broken.
    let blocks: BTreeSet<u32> = ips.iter().map(|ip| u32::from(*ip) & !0xf).collect();
    assert_eq!(blocks.len(), 1, "{ips:?}");
    let snap = d.pool.snapshot();
    assert!(
        snap.subnets
            .iter()
            .any(|s| s.prefixes_blocked_for.is_some()),
        "{:?}",
        snap.subnets
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// The VPC CNI's cluster-scoped subnet tags (`cni.networking.k8s.aws/cluster/<name>`): a subnet
/// tagged for another cluster is never discovered, however much room it has; one tagged for this
/// cluster is, like an untagged one. Two clusters in one VPC never share a pod subnet by accident.
#[tokio::test(start_paused = true)]
async fn a_subnet_tagged_for_another_cluster_is_not_discovered() {
    let mock = mock("m5.large").await;
    let inst = mock.default_instance();
    let role = ("kubernetes.io/role/cni".to_owned(), "1".to_owned());
    let ours = mock.with_world(|w, _| {
        // The other cluster's: the most room, so discovery would pick it first.
        let theirs: BTreeMap<String, String> = [
            role.clone(),
            (
                "cni.networking.k8s.aws/cluster/another-cluster".to_owned(),
                "1".to_owned(),
            ),
        ]
        .into();
        w.create_subnet_with_tags(
            &inst.vpc_id,
            "10.0.64.0/20".parse().unwrap(),
            &inst.availability_zone,
            &theirs,
        )
        .unwrap();
        let ours: BTreeMap<String, String> = [
            role.clone(),
            (
                format!("cni.networking.k8s.aws/cluster/{CLUSTER}"),
                "shared".to_owned(),
            ),
            (
                "cni.networking.k8s.aws/cluster/another-cluster".to_owned(),
                "shared".to_owned(),
            ),
        ]
        .into();
        let id = w
            .create_subnet_with_tags(
                &inst.vpc_id,
                "10.0.32.0/24".parse().unwrap(),
                &inst.availability_zone,
                &ours,
            )
            .unwrap();
        w.occupy_addresses(
            &inst.subnet_id,
            &OccupyPattern::Range {
                cidr: "10.0.0.0/20".parse().unwrap(),
            },
        )
        .unwrap();
        id
    });
    let dir = TempDir::new("cluster-tag");
    let mut cfg = config(&mock, &dir.0);
    cfg.use_primary_eni = false;
    cfg.min_idle = 0;
    let d = start(cfg).await;
    let pod_subnets: Vec<&str> = d.node.pod_subnets.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(pod_subnets, [inst.subnet_id.as_str(), ours.as_str()]);
    let ips = allocate_n(&d, 0..3).await;
    let subnet: Ipv4Net = "10.0.32.0/24".parse().unwrap();
    assert!(ips.iter().all(|ip| subnet.contains(ip)), "{ips:?}");
    d.shutdown().await;
}

#[test]
fn cluster_tags_open_a_subnet_only_to_the_clusters_they_name() {
    use eniipam::daemon::subnet_open_to_cluster as open;
    let tags = |keys: &[&str]| -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| ((*k).to_owned(), "1".to_owned()))
            .collect()
    };
    assert!(open(&tags(&[]), "a"), "untagged: any cluster");
    assert!(open(&tags(&["kubernetes.io/role/cni"]), ""));
    let a = "cni.networking.k8s.aws/cluster/a";
    assert!(open(&tags(&[a]), "a"));
    assert!(!open(&tags(&[a]), "b"));
    assert!(
        !open(&tags(&[a]), ""),
        "no cluster name: not a named cluster's subnet"
    );
    assert!(open(&tags(&[a, "cni.networking.k8s.aws/cluster/b"]), "b"));
}
