//! Issue 27, item 1: custom networking through the real daemon, with the cluster's ENIConfig objects
//! as the VPC CNI's users have them, served by the API-server double (`eniipam-kubeapi`: the
//! `eniconfigs.crd.k8s.amazonaws.com` resource and the Node, listed and watched by kube-rs) and EC2 by
//! mockcloud (real AWS SDK, the shipped IAM policy enforced).
//!
//! - The node's zone label names its ENIConfig: pods get addresses of its subnet (in the VPC's
//!   secondary block 100.64.0.0/16) on ENIs with its security groups; eth0 serves none.
//! - The ENIConfig changed: running pods keep their addresses; the next new ENI follows the change;
//!   the change is counted.
//! - A node naming no usable ENIConfig (missing, or a subnet of another zone) creates no ENI; ADDs
//!   fail with CNI error 11 naming the reason, and work once the ENIConfig is fixed.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::net::Ipv4Addr;

use daemon_support::*;
use eniipam::config::DaemonConfig;
use eniipam::daemon::DaemonHandle;
use eniipam::pool::PodNetwork;
use eniipam_kubeapi::{Crd, FakeApiServer, eniconfig_json};
use ipnet::Ipv4Net;
use mockcloud::{Config, MockCloud};

const NODE: &str = "ip-10-0-1-10.ec2.internal";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The VPC's second block, two pod subnets in the node's zone and one in another, two groups.
struct World {
    subnet_a: String,
    subnet_b: String,
    other_zone: String,
    sg_a: String,
    sg_b: String,
    zone: String,
}

async fn world(mock: &MockCloud) -> World {
    let inst = mock.default_instance();
    mock.associate_vpc_cidr_block(&inst.vpc_id, "100.64.0.0/16".parse().unwrap())
        .expect("the pod block");
    let zone = inst.availability_zone.clone();
    let subnet = |cidr: &str, az: &str| {
        mock.create_subnet(&inst.vpc_id, cidr.parse().unwrap(), az)
            .expect("a pod subnet")
    };
    let (sg_a, sg_b) = mock.with_world(|w, _| {
        (
            w.create_security_group(&inst.vpc_id).unwrap(),
            w.create_security_group(&inst.vpc_id).unwrap(),
        )
    });
    World {
        subnet_a: subnet("100.64.0.0/19", &zone),
        subnet_b: subnet("100.64.32.0/19", &zone),
        other_zone: subnet("100.64.64.0/19", "us-east-1f"),
        sg_a,
        sg_b,
        zone,
    }
}

async fn setup(test: &str) -> (MockCloud, FakeApiServer, World, TempDir, DaemonConfig) {
    let mock = MockCloud::start(Config {
        default_instance_type: "m5.large".into(),
        ..Config::fast()
    })
    .await
    .unwrap();
    let w = world(&mock).await;
    let api = FakeApiServer::start().await;
    api.install_crd(Crd::eniconfig());
    api.add_node(NODE, &[]);
    api.set_node_label(NODE, ZONE_LABEL, Some(&w.zone));
    let dir = TempDir::new(test);
    let mut cfg = config(&mock, &dir.0);
    cfg.custom_networking = true;
    cfg.eni_config_label = ZONE_LABEL.into();
    cfg.api_server_url = Some(api.url());
    cfg.api_server_gc = Some(false);
    cfg.node_condition = false;
    cfg.node_name = NODE.into();
    cfg.warm_policy = eniipam::pool::config::WarmPolicy::Fixed;
    cfg.min_idle = 0;
    (mock, api, w, dir, cfg)
}

async fn allocate(d: &DaemonHandle, i: usize) -> Result<Ipv4Addr, tonic::Status> {
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req(&format!("c{i}"), &format!("pod-{i}")))
        .await
        .map(|r| r.into_inner().ip.parse().unwrap())
}

fn custom_subnet(d: &DaemonHandle) -> Option<String> {
    match d.pool.pod_network() {
        PodNetwork::Custom { subnet, .. } => Some(subnet.id),
        _ => None,
    }
}

/// `(subnet, groups)` of the ENI holding `ip` in EC2.
fn eni_of(mock: &MockCloud, ip: Ipv4Addr) -> (String, Vec<String>, u32) {
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    let e = inst
        .enis
        .iter()
        .find(|e| e.secondary_ips.contains(&ip))
        .unwrap_or_else(|| panic!("{ip} is on none of the node's ENIs"));
    let index = e.attachment.as_ref().map_or(u32::MAX, |a| a.device_index);
    (e.subnet_id.clone(), e.security_groups.clone(), index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zones_eniconfig_puts_pods_in_its_subnet_and_a_change_applies_to_new_enis_only() {
    let (mock, api, w, _dir, cfg) = setup("cn-zone").await;
    let crd = Crd::eniconfig();
    // The ENIConfig as a cluster migrating from aws-node has it: named after the zone.
    api.put_object(&crd, eniconfig_json(&w.zone, &w.subnet_a, Some(&[&w.sg_a])));
    let d = start(cfg).await;
    assert_eq!(custom_subnet(&d).as_deref(), Some(w.subnet_a.as_str()));
    // m5.large: 3 ENIs × 9 slots; eth0 serves none, so one pod ENI holds 9 pods.
    assert_eq!(d.pool.snapshot().capacity, 18, "eth0 left out");
    let block_a: Ipv4Net = "100.64.0.0/19".parse().unwrap();
    let mut first = Vec::new();
    for i in 0..9 {
        let ip = allocate(&d, i)
            .await
            .unwrap_or_else(|e| panic!("pod {i}: {e}"));
        assert!(block_a.contains(&ip), "{ip}");
        let (subnet, groups, index) = eni_of(&mock, ip);
        assert_eq!(
            (subnet.as_str(), groups, index > 0),
            (w.subnet_a.as_str(), vec![w.sg_a.clone()], true)
        );
        first.push(ip);
    }
    let eth0 = eth0_in_ec2(&mock, &mock.default_instance().instance_id);
    assert!(
        eth0.secondary_ips.is_empty(),
        "eth0 serves no pods: {:?}",
        eth0.secondary_ips
    );
    let m = scrape(&d).await;
    assert_eq!(sample(&m, "eniipam_pod_network_ready"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "eniipam_pod_network_changes_total"), Some(0.0));

    // The ENIConfig changes: subnet and groups.
    api.put_object(&crd, eniconfig_json(&w.zone, &w.subnet_b, Some(&[&w.sg_b])));
    wait_until("the change reaches the pool", || {
        custom_subnet(&d).as_deref() == Some(w.subnet_b.as_str())
    })
    .await;
    // Running pods keep their addresses, on their ENI.
    for (i, ip) in first.iter().enumerate() {
        let alloc = d
            .pool
            .allocation(&eniipam::model::AttachmentKey::new(format!("c{i}"), "eth0"))
            .expect("kept");
        assert_eq!(alloc.ip, *ip);
        assert_eq!(eni_of(&mock, *ip).0, w.subnet_a);
    }
    // The first ENI is full: the next pod's ENI follows the ENIConfig.
    let ip = allocate(&d, 9).await.unwrap();
    assert!(
        "100.64.32.0/19".parse::<Ipv4Net>().unwrap().contains(&ip),
        "{ip}"
    );
    let (subnet, groups, _) = eni_of(&mock, ip);
    assert_eq!((subnet, groups), (w.subnet_b.clone(), vec![w.sg_b.clone()]));
    let m = scrape(&d).await;
    assert_eq!(
        sample(&m, "eniipam_pod_network_changes_total"),
        Some(1.0),
        "{m}"
    );

    // The node relabelled to a name no ENIConfig has: no ENI can be made, the ENIs there still serve.
    api.set_node_label(NODE, ZONE_LABEL, Some("us-east-1z"));
    wait_until("the missing ENIConfig reaches the pool", || {
        matches!(d.pool.pod_network(), PodNetwork::Unavailable { .. })
    })
    .await;
    let ip = allocate(&d, 10).await.expect("the second ENI has room");
    assert_eq!(eni_of(&mock, ip).0, w.subnet_b);
    let m = scrape(&d).await;
    assert_eq!(sample(&m, "eniipam_pod_network_ready"), Some(0.0), "{m}");
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_eniconfig_creates_no_eni_and_the_add_says_why_until_it_is_fixed() {
    let (mock, api, w, _dir, cfg) = setup("cn-missing").await;
    let crd = Crd::eniconfig();
    let d = start(cfg).await;
    let creates = || {
        mock.network_interfaces()
            .iter()
            .filter(|e| e.subnet_id != mock.default_instance().subnet_id)
            .count()
    };
    // The zone's ENIConfig does not exist: CNI error 11 (try again), naming it.
    let e = allocate(&d, 0).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains(&format!("ENIConfig \"{}\"", w.zone))
            && e.message().contains("exists"),
        "{e}"
    );
    assert_eq!(creates(), 0);
    assert_eq!(
        mock.network_interfaces().len(),
        1,
        "nothing in the node's subnet either"
    );
    // An ENIConfig whose subnet is in another zone: refused, naming both zones.
    api.put_object(&crd, eniconfig_json(&w.zone, &w.other_zone, None));
    wait_until("the other-zone ENIConfig is judged", || {
        matches!(&d.pool.pod_network(), PodNetwork::Unavailable { reason } if reason.contains("us-east-1f"))
    })
    .await;
    let e = allocate(&d, 1).await.unwrap_err();
    assert!(
        e.message().contains(&w.other_zone) && e.message().contains(&w.zone),
        "{e}"
    );
    assert_eq!(mock.network_interfaces().len(), 1);
    // A group EC2 does not have: named, nothing created.
    api.put_object(
        &crd,
        eniconfig_json(&w.zone, &w.subnet_a, Some(&["sg-0123456789abcdef0"])),
    );
    wait_until("the unknown group is judged", || {
        matches!(&d.pool.pod_network(), PodNetwork::Unavailable { reason } if reason.contains("sg-0123456789abcdef0"))
    })
    .await;
    assert!(
        allocate(&d, 3)
            .await
            .unwrap_err()
            .message()
            .contains("sg-0123456789abcdef0")
    );
    assert_eq!(mock.network_interfaces().len(), 1);
    // A malformed one: the field is named.
    api.put_object(&crd, eniconfig_json(&w.zone, "subnet-nothex!", None));
    wait_until("the invalid ENIConfig is judged", || {
        matches!(&d.pool.pod_network(), PodNetwork::Unavailable { reason } if reason.contains("spec.subnet"))
    })
    .await;
    // Fixed, with no groups listed: eth0's groups, as with the VPC CNI.
    api.put_object(&crd, eniconfig_json(&w.zone, &w.subnet_a, None));
    wait_until("the fixed ENIConfig reaches the pool", || {
        custom_subnet(&d).is_some()
    })
    .await;
    let ip = allocate(&d, 2).await.expect("served once fixed");
    let (subnet, groups, _) = eni_of(&mock, ip);
    assert_eq!(subnet, w.subnet_a);
    assert_eq!(groups, mock.default_instance().security_groups);
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}
