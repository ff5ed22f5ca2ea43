//! The emulated VPC's IPv6 data path, without eniipam: each node holds an IPv6 address and a /80
//! on its primary ENI (as an IPv6 cluster's node does), pods are plumbed by hand from the /80 as the
//! CNI plugin wires them (a `/128`, `fe80::1` gateway, a host route), and the VPC routes, checks
//! and sinks IPv6 as EC2 does; the internet is reached through the egress-only gateway. Needs root,
//! `ip`, `nft` and `nsenter`.

mod support;

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use support::v6::*;
use support::*;
use vpclab::{INTERNET_SERVER_V6, Lab, LabConfig, StateSource};

/// Pod ↔ pod across two nodes, node → pod on its own node and across, with the real sources, and
/// the fabric's IPv6 routes and eth0 addresses as sync leaves them.
async fn pods_across_nodes(config: LabConfig) {
    let (mock, a, b) = cloud().await;
    let lab = Lab::start(&mock, config).await.expect("lab");
    let block = lab.vpc_ipv6().expect("the VPC has an IPv6 /56");
    assert_eq!(block.prefix_len(), 56);
    let na = lab.node(&a.instance_id).expect("node a");
    assert_eq!(na.ipv6, None, "mockcloud gives no IPv6 at launch");
    let subnet = na.subnet_v6.expect("the subnet has a /64");
    assert!(block.contains(&subnet));

    // Assigned after launch: sync routes them and gives eth0 its address.
    let (a6, a80) = address_and_prefix(&mock, &a.primary_eni);
    let (b6, b80) = address_and_prefix(&mock, &b.primary_eni);
    let report = lab.sync().await.expect("sync");
    let mut added = report.routes_added_v6.clone();
    added.sort();
    let mut want = vec![Ipv6Net::from(a6), a80, Ipv6Net::from(b6), b80];
    want.sort();
    assert_eq!(added, want);
    let routes = lab.vpc_routes_v6().await.expect("routes");
    assert_eq!(routes[&a80], a.primary_eni);
    assert_eq!(routes[&Ipv6Net::from(b6)], b.primary_eni);
    let (na, nb) = (
        lab.node(&a.instance_id).expect("node a"),
        lab.node(&b.instance_id).expect("node b"),
    );
    assert_eq!((na.ipv6, nb.ipv6), (Some(a6), Some(b6)));
    let default = na
        .ns
        .routes_v6()
        .await
        .expect("routes")
        .into_iter()
        .find(|r| r.dst.is_none())
        .expect("an IPv6 default route");
    assert_eq!(
        (default.via, default.dev.as_deref()),
        (Some(vpclab::VPC_ROUTER_V6), Some("eth0"))
    );

    let pa = lab
        .add_pod_v6(&a.instance_id, nth(a80, 5))
        .await
        .expect("pa");
    let pb = lab
        .add_pod_v6(&b.instance_id, nth(b80, 9))
        .await
        .expect("pb");
    let _in_pa = serve6(&pa.ns);
    let _in_pb = serve6(&pb.ns);
    assert_eq!(reaches(&pa.ns, pb.ip).await.server_saw.ip(), pa.ip);
    assert_eq!(reaches(&pb.ns, pa.ip).await.server_saw.ip(), pb.ip);
    // Node → pod (kubelet probes), on its own node and across: the node's eth0 address.
    assert_eq!(reaches(&na.ns, pa.ip).await.server_saw.ip(), a6);
    assert_eq!(reaches(&na.ns, pb.ip).await.server_saw.ip(), a6);
    // Node ↔ node over IPv6.
    let _on_b = serve6(&nb.ns);
    assert_eq!(reaches(&na.ns, b6).await.server_saw.ip(), a6);
    assert!(
        lab.src_dst_drops()
            .await
            .expect("counters")
            .values()
            .all(|n| *n == 0),
        "nothing left by the wrong ENI"
    );
    assert_eq!(lab.unassigned_drops().await.expect("counter"), 0);

    // A hand-made IPv6 pod goes as it came.
    lab.remove_pod_v6(&pa).await.expect("remove pod");
    assert!(
        na.ns
            .routes_v6()
            .await
            .expect("routes")
            .iter()
            .all(|r| r.dst != Some(Ipv6Net::from(pa.ip)))
    );
}

#[tokio::test]
async fn ipv6_pods_reach_each_other_across_nodes_and_nodes_reach_pods() {
    pods_across_nodes(config(false)).await;
}

#[tokio::test]
async fn ipv6_pods_reach_each_other_under_strict_rp_filter() {
    pods_across_nodes(config(true)).await;
}

/// A pod reaches the IPv6 internet with its own address (no NAT, also in a lab whose IPv4 goes
/// through a NAT gateway); the internet cannot open a connection to it.
#[tokio::test]
async fn the_ipv6_internet_is_reached_through_the_egress_only_gateway() {
    for config in [
        config(false),
        LabConfig {
            egress: vpclab::Egress::NatGateway,
            ..config(false)
        },
    ] {
        let (mock, a, _b) = cloud().await;
        let (a6, a80) = address_and_prefix(&mock, &a.primary_eni);
        let lab = Lab::start(&mock, config).await.expect("lab");
        let na = lab.node(&a.instance_id).expect("node a");
        let pod = lab
            .add_pod_v6(&a.instance_id, nth(a80, 7))
            .await
            .expect("pod");
        let _server = serve6(lab.internet());
        assert_eq!(
            reaches(&pod.ns, INTERNET_SERVER_V6).await.server_saw.ip(),
            pod.ip
        );
        assert_eq!(
            reaches(&na.ns, INTERNET_SERVER_V6).await.server_saw.ip(),
            a6
        );
        assert_eq!(lab.eigw_drops().await.expect("eigw"), 0);

        // Egress-only: a connection from the internet is dropped and counted, to a pod or a node.
        let _in_pod = serve6(&pod.ns);
        let _on_a = serve6(&na.ns);
        dropped(lab.internet(), pod.ip).await;
        let after_pod = lab.eigw_drops().await.expect("eigw");
        assert!(after_pod >= 1, "{after_pod}");
        dropped(lab.internet(), a6).await;
        assert!(lab.eigw_drops().await.expect("eigw") > after_pod);
    }
}

/// A pod whose address its node's ENI does not hold is dropped and counted when it leaves; a VPC
/// IPv6 address no ENI holds is sunk and counted.
#[tokio::test]
async fn a_spoofed_ipv6_source_and_an_unassigned_ipv6_destination_are_dropped_and_counted() {
    let (mock, a, b) = cloud().await;
    let (a6, a80) = address_and_prefix(&mock, &a.primary_eni);
    let (b6, b80) = address_and_prefix(&mock, &b.primary_eni);
    let lab = Lab::start(&mock, config(false)).await.expect("lab");
    let na = lab.node(&a.instance_id).expect("node a");
    let nb = lab.node(&b.instance_id).expect("node b");
    let subnet = na.subnet_v6.expect("a /64");
    let _on_b = serve6(&nb.ns);

    // A /80 of the subnet that holds nothing any ENI holds: inside the VPC, held by nobody.
    let held = [Ipv6Net::from(a6), a80, Ipv6Net::from(b6), b80];
    let nobody = (1..)
        .map(|k: u128| {
            Ipv6Net::new(Ipv6Addr::from(u128::from(a80.network()) ^ (k << 48)), 80).expect("/80")
        })
        .find(|c| !held.iter().any(|h| c.contains(h) || h.contains(c)))
        .expect("a free /80");
    assert!(subnet.contains(&nobody));
    let spoofer = lab
        .add_pod_v6(&a.instance_id, nth(nobody, 3))
        .await
        .expect("spoofing pod");
    let before = lab.src_dst_drops().await.expect("counters")[&a.primary_eni];
    dropped(&spoofer.ns, b6).await;
    let drops = lab.src_dst_drops().await.expect("counters");
    assert!(drops[&a.primary_eni] > before, "{drops:?}");
    assert_eq!(drops[&b.primary_eni], 0);
    // The same node's real pod passes.
    let pod = lab
        .add_pod_v6(&a.instance_id, nth(a80, 3))
        .await
        .expect("pod");
    assert_eq!(reaches(&pod.ns, b6).await.server_saw.ip(), pod.ip);

    // Unassigned: in the subnet, and in the VPC's /56 outside any subnet.
    let before = lab.unassigned_drops().await.expect("counter");
    // (Not the spoofer's own address: node A routes that one to the spoofer's veth.)
    dropped(&na.ns, nth(nobody, 0x99)).await;
    let mid = lab.unassigned_drops().await.expect("counter");
    assert!(mid > before, "{before} → {mid}");
    let block = lab.vpc_ipv6().expect("/56");
    let outside = block
        .subnets(64)
        .expect("/64s")
        .find(|s| *s != subnet)
        .expect("another /64");
    dropped(&na.ns, nth(outside, 0x10)).await;
    assert!(lab.unassigned_drops().await.expect("counter") > mid);
}

/// A /80 assigned and unassigned through the real SDK after the lab started: sync routes it, pods
/// in it work both ways, and after it is unassigned and synced traffic stops (the route and the
/// source permission go). The lab reads mockcloud over its control API here.
#[tokio::test]
async fn an_ipv6_prefix_unassigned_in_mockcloud_stops_carrying_traffic_after_sync() {
    let (mock, a, b) = cloud().await;
    let (a6, _a80) = address_and_prefix(&mock, &a.primary_eni);
    let ec2 = sdk(&mock);
    let lab = Lab::start(StateSource::ControlApi(mock.control_url()), config(false))
        .await
        .expect("lab");
    let out = ec2
        .assign_ipv6_addresses()
        .network_interface_id(&b.primary_eni)
        .ipv6_prefix_count(1)
        .send()
        .await
        .expect("assign a /80");
    let prefix: Ipv6Net = out.assigned_ipv6_prefixes()[0].parse().expect("cidr");
    assert_eq!(prefix.prefix_len(), 80);
    assert_eq!(
        lab.sync().await.expect("sync").routes_added_v6,
        vec![prefix]
    );
    let na = lab.node(&a.instance_id).expect("node a");
    let pod = lab
        .add_pod_v6(&b.instance_id, nth(prefix, 0x42))
        .await
        .expect("pod");
    let _in_pod = serve6(&pod.ns);
    let _on_a = serve6(&na.ns);
    assert_eq!(reaches(&na.ns, pod.ip).await.server_saw.ip(), a6);
    assert_eq!(reaches(&pod.ns, a6).await.server_saw.ip(), pod.ip);

    ec2.unassign_ipv6_addresses()
        .network_interface_id(&b.primary_eni)
        .ipv6_prefixes(prefix.to_string())
        .send()
        .await
        .expect("unassign the /80");
    assert_eq!(
        lab.sync().await.expect("sync").routes_removed_v6,
        vec![prefix]
    );
    assert!(
        !lab.vpc_routes_v6()
            .await
            .expect("routes")
            .contains_key(&prefix)
    );
    let unassigned = lab.unassigned_drops().await.expect("counter");
    dropped(&na.ns, pod.ip).await;
    assert!(lab.unassigned_drops().await.expect("counter") > unassigned);
    let spoofed = lab.src_dst_drops().await.expect("counters")[&b.primary_eni];
    dropped(&pod.ns, a6).await;
    assert!(lab.src_dst_drops().await.expect("counters")[&b.primary_eni] > spoofed);
}
