//! The data path of the emulated VPC, without eniipam: nodes reach each other across subnets,
//! pod addresses (plumbed by hand) and /28 prefixes are routed to the ENI that holds them, EC2's
//! source/destination check drops and counts what leaves by the wrong ENI, and the internet is
//! reached through the IGW (node primary IPs only) or a NAT gateway. Needs root, `ip`, `nft` and
//! `nsenter`.

mod support;

use std::net::Ipv4Addr;
use std::path::Path;

use ipnet::Ipv4Net;
use support::*;
use vpclab::{INTERNET_SERVER, Lab, LabConfig, NAT_GATEWAY_PUBLIC_IP, StateSource};

#[tokio::test]
async fn nodes_reach_each_other_and_a_pod_on_eth0_across_the_vpc() {
    let (mock, a, b) = cloud().await;
    // A third node in another subnet: reached through the VPC routers, not on-link.
    let world = mock.default_world().expect("default world");
    let other = mock
        .create_subnet(
            &world.vpc_id,
            "10.0.16.0/20".parse().expect("cidr"),
            &a.availability_zone,
        )
        .expect("subnet");
    let c = mock.launch_instance("m5.large", &other).await.expect("c");

    let t = tokio::time::Instant::now(); // the real clock: this test is not paused
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    println!("lab setup (3 nodes): {:?}", t.elapsed());
    let (na, nb, nc) = (
        lab.node(&a.instance_id).expect("node a"),
        lab.node(&b.instance_id).expect("node b"),
        lab.node(&c.instance_id).expect("node c"),
    );

    // eth0 as EC2 + DHCP leave it: primary IP with the subnet prefix, default via the router.
    assert_eq!(nc.subnet, "10.0.16.0/20".parse::<Ipv4Net>().expect("cidr"));
    assert_eq!(nc.router, Ipv4Addr::new(10, 0, 16, 1));
    let eth0 = na
        .ns
        .link_by_mac(&a.mac)
        .await
        .expect("links")
        .expect("eth0");
    assert_eq!(
        (eth0.name.as_str(), eth0.up, eth0.mtu),
        ("eth0", true, 9001)
    );
    let default = na
        .ns
        .routes(None)
        .await
        .expect("routes")
        .into_iter()
        .find(|r| r.dst == vpclab::RouteDst::Default)
        .expect("a default route");
    assert_eq!(
        (default.via, default.dev.as_deref()),
        (Some(Ipv4Addr::new(10, 0, 0, 1)), Some("eth0"))
    );

    // The node sysctls are in place (read from a thread inside the node).
    let forwarding = na
        .ns
        .run(|| std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward"))
        .expect("in the node")
        .expect("read");
    assert_eq!(forwarding.trim(), "1");
    assert_eq!(
        lab.vpc()
            .read_sysctl("net/ipv4/ip_forward")
            .await
            .expect("vpc"),
        "1"
    );

    let _on_b = serve(&nb.ns).await;
    let _on_c = serve(&nc.ns).await;
    let r = reaches(&na.ns, b.private_ip).await;
    assert_eq!(r.server_saw.ip(), a.private_ip);
    let r = reaches(&nc.ns, b.private_ip).await;
    assert_eq!(
        r.server_saw.ip(),
        c.private_ip,
        "across subnets, no translation"
    );
    let r = reaches(&nb.ns, c.private_ip).await;
    assert_eq!(r.server_saw.ip(), b.private_ip);

    // A pod on B's eth0: a secondary IP of B's primary ENI, plumbed like the CNI plugin does.
    let pod_ip = assign(&mock, &b.primary_eni, 1)[0];
    let report = lab.sync().await.expect("sync");
    assert_eq!(report.routes_added, vec![net(pod_ip)]);
    let pod = lab.add_pod(&b.instance_id, pod_ip).await.expect("pod");
    let _in_pod = serve(&pod.ns).await;
    let r = reaches(&na.ns, pod_ip).await;
    assert_eq!(r.server_saw.ip(), a.private_ip);
    let r = reaches(&nc.ns, pod_ip).await;
    assert_eq!(r.server_saw.ip(), c.private_ip);
    // And the pod reaches out with its own address (it is on the ENI it leaves by).
    let _on_a = serve(&na.ns).await;
    let r = reaches(&pod.ns, a.private_ip).await;
    assert_eq!(r.server_saw.ip(), pod_ip);
    assert!(
        lab.src_dst_drops()
            .await
            .expect("counters")
            .values()
            .all(|n| *n == 0),
        "nothing left by the wrong ENI"
    );

    // A VPC address nobody holds: ARP is answered, the packet dropped and counted.
    let before = lab.unassigned_drops().await.expect("counter");
    let nobody = free_block(&mock, world.subnet_cidr).network();
    dropped(&na.ns, nobody).await;
    assert!(lab.unassigned_drops().await.expect("counter") > before);

    let name = lab.name().to_owned();
    assert_eq!(
        lab_namespaces(&name).len(),
        7,
        "vpc, igw, inet, 3 nodes, pod"
    );
    // A pod goes as it came: no namespace, no host veth, no host route left.
    drop(_in_pod);
    lab.remove_pod(&pod).await.expect("remove pod");
    assert!(!Path::new("/run/netns").join(pod.ns.name()).exists());
    assert!(
        nb.ns
            .links()
            .await
            .expect("links")
            .iter()
            .all(|l| l.name != pod.host_if)
    );
    assert!(
        nb.ns
            .routes(None)
            .await
            .expect("routes")
            .iter()
            .all(|r| r.dst != vpclab::RouteDst::Net(net(pod_ip)))
    );
    assert_eq!(lab_namespaces(&name).len(), 6);
    let t = tokio::time::Instant::now(); // the real clock: this test is not paused
    drop(lab);
    println!("lab teardown: {:?}", t.elapsed());
    assert!(lab_namespaces(&name).is_empty());
}

#[tokio::test]
async fn a_packet_leaving_by_an_eni_that_does_not_hold_its_source_is_dropped_and_counted() {
    let (mock, a, b) = cloud().await;
    let (eni2, _mac, eni2_ip, _att) = attach_new_eni(&mock, &a, 1);
    let pod_ip = assign(&mock, &eni2, 1)[0];
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let na = lab.node(&a.instance_id).expect("node a");
    let nb = lab.node(&b.instance_id).expect("node b");
    let eth1 = na.link(&eni2).expect("eth1").clone();
    assert_eq!(eth1.ifname, "eth1");
    assert_eq!(lab.vpc_routes().await.expect("routes")[&net(pod_ip)], eni2);

    let pod = lab.add_pod(&a.instance_id, pod_ip).await.expect("pod");
    let _on_b = serve(&nb.ns).await;

    // No policy rule yet: the pod's packets follow the main table out of eth0, whose ENI does
    // not hold the pod's address.
    dropped(&pod.ns, b.private_ip).await;
    let drops = lab.src_dst_drops().await.expect("counters");
    assert!(drops[&a.primary_eni] >= 1, "{drops:?}");
    assert_eq!(drops[&eni2], 0);
    let on_eth0 = drops[&a.primary_eni];

    // The daemon's job, by hand: eth1 up with its primary IP, a route table for it, and the
    // `from <pod ip> lookup <table>` rule that sends the pod's replies out of eth1.
    let table = "2";
    for cmd in [
        vec!["link", "set", "eth1", "up"],
        vec![
            "addr",
            "add",
            &format!("{eni2_ip}/{}", eth1.subnet.prefix_len()),
            "dev",
            "eth1",
            "noprefixroute",
        ],
        vec![
            "route",
            "add",
            &eth1.router.to_string(),
            "dev",
            "eth1",
            "scope",
            "link",
            "table",
            table,
        ],
        vec![
            "route",
            "add",
            "default",
            "via",
            &eth1.router.to_string(),
            "dev",
            "eth1",
            "table",
            table,
        ],
        vec![
            "rule",
            "add",
            "from",
            &pod_ip.to_string(),
            "lookup",
            table,
            "priority",
            "1536",
        ],
    ] {
        na.ns.ip(&cmd).await.expect("configure eth1");
    }
    let r = reaches(&pod.ns, b.private_ip).await;
    assert_eq!(r.server_saw.ip(), pod_ip);
    // And B reaches the pod: the reply leaves by eth1 too.
    let _in_pod = serve(&pod.ns).await;
    let r = reaches(&nb.ns, pod_ip).await;
    assert_eq!(r.server_saw.ip(), b.private_ip);
    let drops = lab.src_dst_drops().await.expect("counters");
    assert_eq!(
        drops[&a.primary_eni], on_eth0,
        "the right path is not dropped"
    );
    assert_eq!(drops[&eni2], 0);
}

#[tokio::test]
async fn the_internet_is_reached_from_a_primary_ip_and_a_pod_needs_snat_at_the_igw() {
    let (mock, a, _b) = cloud().await;
    let pod_ip = assign(&mock, &a.primary_eni, 1)[0];
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let na = lab.node(&a.instance_id).expect("node a");
    let _server = serve(lab.internet()).await;

    let r = reaches(&na.ns, INTERNET_SERVER).await;
    assert_eq!(r.server_saw.ip(), a.private_ip);
    assert_eq!(lab.igw_drops().await.expect("igw").egress_not_public, 0);

    // A pod's own address has no public IP: the IGW drops it (the VPC passes it: it is on eth0).
    let pod = lab.add_pod(&a.instance_id, pod_ip).await.expect("pod");
    dropped(&pod.ns, INTERNET_SERVER).await;
    assert!(lab.igw_drops().await.expect("igw").egress_not_public >= 1);
    assert_eq!(
        lab.src_dst_drops().await.expect("counters")[&a.primary_eni],
        0
    );

    // With SNAT to eth0's primary IP for destinations outside the VPC (what the daemon will
    // install), the pod reaches the internet and the server sees the node's address.
    na.ns
        .nft(&format!(
            "table ip podsnat {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    ip daddr != {} oifname \"eth0\" snat to {}
  }}
}}
",
            lab.vpc_cidr(),
            a.private_ip
        ))
        .await
        .expect("snat");
    let r = reaches(&pod.ns, INTERNET_SERVER).await;
    assert_eq!(r.server_saw.ip(), a.private_ip);
    // Traffic from the internet to a pod address never gets past the IGW.
    let _in_pod = serve(&pod.ns).await;
    dropped(lab.internet(), pod_ip).await;
    assert!(lab.igw_drops().await.expect("igw").ingress_not_public >= 1);
}

#[tokio::test]
async fn through_the_nat_gateway_a_pod_reaches_the_internet_without_snat() {
    let (mock, a, _b) = cloud().await;
    let pod_ip = assign(&mock, &a.primary_eni, 1)[0];
    let lab = Lab::start(&mock, LabConfig::nat_gateway())
        .await
        .expect("lab");
    assert!(lab.nat_gateway().is_some());
    let na = lab.node(&a.instance_id).expect("node a");
    let pod = lab.add_pod(&a.instance_id, pod_ip).await.expect("pod");
    let _server = serve(lab.internet()).await;

    let r = reaches(&pod.ns, INTERNET_SERVER).await;
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    let r = reaches(&na.ns, INTERNET_SERVER).await;
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    assert_eq!(lab.igw_drops().await.expect("igw").egress_not_public, 0);
    // A private subnet is not reachable from the internet, not even a node's primary IP.
    let _on_a = serve(&na.ns).await;
    dropped(lab.internet(), a.private_ip).await;
}

/// A /28 prefix assigned through the real SDK (prefix delegation) is routed to its ENI, serves
/// pods in both directions, and passes the source/destination check until it is unassigned. The
/// lab reads mockcloud over its control API here (`GET /_mock/state`), as it would a mockcloud in
/// another process.
#[tokio::test]
async fn delegated_prefixes_are_routed_and_pass_the_check_until_unassigned() {
    let (mock, a, b) = cloud().await;
    let ec2 = sdk(&mock);
    let lab = Lab::start(
        StateSource::ControlApi(mock.control_url()),
        LabConfig::default(),
    )
    .await
    .expect("lab");
    let out = ec2
        .assign_private_ip_addresses()
        .network_interface_id(&b.primary_eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .expect("assign a prefix");
    let prefix: Ipv4Net = out.assigned_ipv4_prefixes()[0]
        .ipv4_prefix()
        .expect("prefix")
        .parse()
        .expect("cidr");
    assert_eq!(prefix.prefix_len(), 28);
    assert_eq!(lab.sync().await.expect("sync").routes_added, vec![prefix]);
    assert_eq!(
        lab.vpc_routes().await.expect("routes")[&prefix],
        b.primary_eni
    );
    let na = lab.node(&a.instance_id).expect("node a");
    // Any address of the prefix serves a pod on B's eth0, in both directions.
    let pod_ip = prefix.hosts().nth(3).expect("an address of the prefix");
    let pod = lab.add_pod(&b.instance_id, pod_ip).await.expect("pod");
    let _in_pod = serve(&pod.ns).await;
    let _on_a = serve(&na.ns).await;
    assert_eq!(reaches(&na.ns, pod_ip).await.server_saw.ip(), a.private_ip);
    assert_eq!(reaches(&pod.ns, a.private_ip).await.server_saw.ip(), pod_ip);
    assert_eq!(
        lab.src_dst_drops().await.expect("counters")[&b.primary_eni],
        0
    );

    // Unassigned: route and permission go.
    ec2.unassign_private_ip_addresses()
        .network_interface_id(&b.primary_eni)
        .ipv4_prefixes(prefix.to_string())
        .send()
        .await
        .expect("unassign the prefix");
    assert_eq!(lab.sync().await.expect("sync").routes_removed, vec![prefix]);
    dropped(&pod.ns, a.private_ip).await;
    assert!(lab.src_dst_drops().await.expect("counters")[&b.primary_eni] >= 1);
}
