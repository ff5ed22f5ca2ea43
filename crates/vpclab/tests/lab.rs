//! The lab itself, without eniipam: nodes reach each other across the emulated VPC, pod addresses
//! (plumbed by hand) are routed to the ENI that holds them, EC2's source/destination check drops and
//! counts what leaves by the wrong ENI, `sync()` follows assigns, unassigns, attaches and detaches
//! (made through mockcloud's world or the real SDK), and the internet is reachable through the IGW
//! (node primary IPs only) or a NAT gateway. Needs root, `ip`, `nft` and `nsenter`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use mockcloud::world::{AssignArgs, CreateEniArgs};
use mockcloud::{Config, LaunchedInstance, MockCloud};
use vpclab::{
    EchoError, EchoOptions, EchoReply, EchoServer, INTERNET_SERVER, Lab, LabConfig,
    NAT_GATEWAY_PUBLIC_IP, NetNs, StateSource, echo,
};

const PORT: u16 = 7000;

/// A fast mockcloud with its default instance (subnet 10.0.0.0/20) and a second one beside it.
async fn cloud() -> (MockCloud, LaunchedInstance, LaunchedInstance) {
    let mock = MockCloud::start(Config::fast()).await.expect("mockcloud");
    let a = mock.default_instance();
    let b = mock
        .launch_instance("m5.large", &a.subnet_id)
        .await
        .expect("second instance");
    (mock, a, b)
}

fn assign(mock: &MockCloud, eni: &str, count: u32) -> Vec<Ipv4Addr> {
    mock.with_world(|w, now| w.assign_private_ip_addresses(eni, AssignArgs::Count(count), now))
        .expect("assign")
}

fn unassign(mock: &MockCloud, eni: &str, ips: &[Ipv4Addr]) {
    mock.with_world(|w, now| w.unassign_private_ip_addresses(eni, ips, now))
        .expect("unassign")
}

/// Creates an ENI in the instance's subnet and attaches it at `device_index`; returns (ENI id,
/// MAC, primary IP, attachment id).
fn attach_new_eni(
    mock: &MockCloud,
    inst: &LaunchedInstance,
    device_index: u32,
) -> (String, String, Ipv4Addr, String) {
    mock.with_world(|w, now| {
        let eni = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: inst.subnet_id.clone(),
                    description: "vpclab test".into(),
                    ..Default::default()
                },
                now,
            )
            .expect("create ENI");
        let att = w
            .attach_network_interface(&eni.id, &inst.instance_id, device_index, now)
            .expect("attach ENI");
        (eni.id, eni.mac, eni.primary_ip, att)
    })
}

async fn serve(ns: &NetNs) -> EchoServer {
    EchoServer::start(ns, SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT))).expect("echo server")
}

async fn reaches(ns: &NetNs, to: Ipv4Addr) -> EchoReply {
    echo(
        ns,
        SocketAddr::from((to, PORT)),
        &EchoOptions {
            timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{} → {to}: {e}", ns.name()))
}

/// The exchange gets no answer: a dropped packet.
async fn dropped(ns: &NetNs, to: Ipv4Addr) {
    match echo(
        ns,
        SocketAddr::from((to, PORT)),
        &EchoOptions {
            timeout: Duration::from_millis(700),
            ..Default::default()
        },
    )
    .await
    {
        Err(EchoError::Timeout(_)) => {}
        other => panic!("{} → {to}: expected a drop, got {other:?}", ns.name()),
    }
}

fn lab_namespaces(lab_name: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{lab_name}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// Every address and prefix any ENI holds now.
fn held(mock: &MockCloud) -> Vec<Ipv4Net> {
    mock.dump()["network_interfaces"]
        .as_array()
        .expect("enis")
        .iter()
        .flat_map(|e| {
            let ips = ["primary_ip"]
                .iter()
                .filter_map(|k| e[*k].as_str())
                .chain(
                    e["secondary_ips"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str()),
                )
                .map(|s| Ipv4Net::from(s.parse::<Ipv4Addr>().expect("ip")));
            let prefixes = e["ipv4_prefixes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .map(|s| s.parse::<Ipv4Net>().expect("cidr"));
            ips.chain(prefixes).collect::<Vec<_>>()
        })
        .collect()
}

/// A /28 of `subnet`, past its reserved first addresses, that holds no address of any ENI.
fn free_block(mock: &MockCloud, subnet: Ipv4Net) -> Ipv4Net {
    let held = held(mock);
    subnet
        .subnets(28)
        .expect("/28s")
        .skip(1)
        .find(|b| !held.iter().any(|h| b.contains(h) || h.contains(b)))
        .expect("a free /28")
}

fn net(ip: Ipv4Addr) -> Ipv4Net {
    Ipv4Net::from(ip)
}

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

fn sdk(mock: &MockCloud) -> aws_sdk_ec2::Client {
    use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(mock.ec2_url())
            .credentials_provider(Credentials::new("AKIDVPCLAB", "secret", None, None, "test"))
            .build(),
    )
}

#[tokio::test]
async fn sync_follows_unassign_attach_and_detach_made_through_the_sdk() {
    let (mock, a, b) = cloud().await;
    let ec2 = sdk(&mock);
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let na = lab.node(&a.instance_id).expect("node a");
    let nb = lab.node(&b.instance_id).expect("node b");
    assert_eq!(na.links.len(), 1);

    // Assign two, sync: routed; unassign one, sync: its route is gone from the kernel.
    let out = ec2
        .assign_private_ip_addresses()
        .network_interface_id(&a.primary_eni)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .expect("assign");
    let ips: Vec<Ipv4Addr> = out
        .assigned_private_ip_addresses()
        .iter()
        .map(|p| p.private_ip_address().expect("ip").parse().expect("ipv4"))
        .collect();
    lab.sync().await.expect("sync");
    let routes = lab.vpc_routes().await.expect("routes");
    for ip in &ips {
        assert_eq!(routes[&net(*ip)], a.primary_eni);
    }
    ec2.unassign_private_ip_addresses()
        .network_interface_id(&a.primary_eni)
        .private_ip_addresses(ips[0].to_string())
        .send()
        .await
        .expect("unassign");
    let report = lab.sync().await.expect("sync");
    assert_eq!(report.routes_removed, vec![net(ips[0])]);
    let routes = lab.vpc_routes().await.expect("routes");
    assert!(!routes.contains_key(&net(ips[0])));
    assert!(routes.contains_key(&net(ips[1])));
    assert!(
        lab.sync().await.expect("sync").is_empty(),
        "nothing left to do"
    );

    // Create + attach: the link appears in the node with the ENI's MAC, down and bare.
    let eni = ec2
        .create_network_interface()
        .subnet_id(&a.subnet_id)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .expect("create")
        .network_interface
        .expect("eni");
    let (eni_id, mac) = (
        eni.network_interface_id().expect("id").to_owned(),
        eni.mac_address().expect("mac").to_owned(),
    );
    let att = ec2
        .attach_network_interface()
        .network_interface_id(&eni_id)
        .instance_id(&a.instance_id)
        .device_index(1)
        .send()
        .await
        .expect("attach")
        .attachment_id
        .expect("attachment id");
    let report = lab.sync().await.expect("sync");
    assert_eq!(report.links_added, vec![eni_id.clone()]);
    let link = na
        .ns
        .link_by_mac(&mac)
        .await
        .expect("links")
        .expect("the new ENI's link");
    assert_eq!(link.name, "eth1");
    assert!(!link.up, "secondary ENIs are the daemon's to configure");
    assert!(
        !na.ns
            .ip(&["-j", "-4", "addr", "show", "dev", "eth1"])
            .await
            .expect("addr")
            .contains("\"local\""),
        "no address on a fresh secondary ENI"
    );
    let routes = lab.vpc_routes().await.expect("routes");
    let eni_primary = eni.private_ip_address().expect("ip").parse().expect("ipv4");
    assert_eq!(routes[&net(eni_primary)], eni_id);
    assert!(
        nb.ns.link_by_mac(&mac).await.expect("links").is_none(),
        "only in its own node"
    );

    // Detach: the link disappears and its addresses are no longer routed.
    ec2.detach_network_interface()
        .attachment_id(att)
        .send()
        .await
        .expect("detach");
    let report = lab.sync().await.expect("sync");
    assert_eq!(report.links_removed, vec![eni_id.clone()]);
    assert!(na.ns.link_by_mac(&mac).await.expect("links").is_none());
    assert!(
        na.ns
            .links()
            .await
            .expect("links")
            .iter()
            .all(|l| l.name != "eth1")
    );
    let routes = lab.vpc_routes().await.expect("routes");
    assert!(!routes.values().any(|e| *e == eni_id));
    assert!(lab.vpc().links().await.expect("links").len() < 10);
    assert!(
        !lab.src_dst_drops()
            .await
            .expect("counters")
            .contains_key(&eni_id)
    );

    // Instances come and go too.
    let c = mock
        .launch_instance("m5.large", &a.subnet_id)
        .await
        .expect("c");
    assert_eq!(
        lab.sync().await.expect("sync").nodes_added,
        vec![c.instance_id.clone()]
    );
    let nc = lab.node(&c.instance_id).expect("node c");
    let _on_c = serve(&nc.ns).await;
    assert_eq!(
        reaches(&na.ns, c.private_ip).await.server_saw.ip(),
        a.private_ip
    );
    mock.terminate_instance(&c.instance_id).expect("terminate");
    assert_eq!(
        lab.sync().await.expect("sync").nodes_removed,
        vec![c.instance_id.clone()]
    );
    assert!(!Path::new("/run/netns").join(nc.ns.name()).exists());
    assert!(lab.node(&c.instance_id).is_none());
}

#[tokio::test]
async fn the_follower_applies_cloud_changes_in_the_background() {
    let (mock, a, _b) = cloud().await;
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let mut follower = lab.follow(Duration::from_millis(20)).expect("follow");
    let (eni, mac, _ip, _att) = attach_new_eni(&mock, &a, 1);
    let ip = assign(&mock, &eni, 1)[0];
    follower.synced().await.expect("synced");
    let na = lab.node(&a.instance_id).expect("node a");
    assert_eq!(
        na.ns
            .link_by_mac(&mac)
            .await
            .expect("links")
            .expect("link")
            .name,
        "eth1"
    );
    assert_eq!(lab.vpc_routes().await.expect("routes")[&net(ip)], eni);
    unassign(&mock, &eni, &[ip]);
    follower.synced().await.expect("synced");
    assert!(
        !lab.vpc_routes()
            .await
            .expect("routes")
            .contains_key(&net(ip))
    );
    drop(lab);
    assert!(
        follower.synced().await.is_err(),
        "the loop ends with its lab"
    );
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

#[tokio::test]
async fn teardown_runs_when_a_test_panics() {
    let (mock, a, _b) = cloud().await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let lab = Lab::start(&mock, LabConfig::nat_gateway())
            .await
            .expect("lab");
        let node = lab.node(&a.instance_id).expect("node");
        let server = serve(&node.ns).await;
        tx.send(lab.name().to_owned()).expect("send");
        // The server outlives nothing: both are dropped while unwinding.
        let _keep = (server, lab);
        let _ = wait.await;
        panic!("a failing test");
    });
    let name = rx.await.expect("lab name");
    assert!(!lab_namespaces(&name).is_empty());
    go.send(()).expect("go");
    let err = task.await.expect_err("the task panicked");
    assert!(err.is_panic());
    assert!(lab_namespaces(&name).is_empty(), "every namespace is gone");
}

#[tokio::test]
async fn bad_input_gets_a_clear_error() {
    let mock = MockCloud::start(Config::fast()).await.expect("mockcloud");
    let err = Lab::start(
        &mock,
        LabConfig {
            vpc_id: Some("vpc-0000dead".into()),
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("unknown VPC");
    assert!(err.to_string().contains("no VPC vpc-0000dead"), "{err}");
    let err = Lab::start(
        &mock,
        LabConfig {
            eni_mtu: 20,
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("bad MTU");
    assert!(err.to_string().contains("eni_mtu 20"), "{err}");
    let err = Lab::start(
        StateSource::ControlApi("http://127.0.0.1:9/_mock".into()),
        LabConfig::default(),
    )
    .await
    .err()
    .expect("nothing listens");
    assert!(err.to_string().starts_with("mockcloud state: GET"), "{err}");

    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let node = lab
        .node(&mock.default_instance().instance_id)
        .expect("node");
    let err = node
        .ns
        .write_sysctls(&[("../etc/passwd".into(), "x".into())])
        .await
        .expect_err("escape");
    assert!(
        err.to_string().contains("expected a path under /proc/sys"),
        "{err}"
    );
    let err = lab
        .add_pod("i-00000000", Ipv4Addr::new(10, 0, 0, 99))
        .await
        .expect_err("no node");
    assert!(
        err.to_string().contains("no node for instance i-00000000"),
        "{err}"
    );
    assert!(lab.follow(Duration::ZERO).is_err());
    let err = lab.add_namespace("no/slashes").await.expect_err("bad tag");
    assert!(
        err.to_string().contains("use letters, digits and '-'"),
        "{err}"
    );
    let extra = lab.add_namespace("runtime").await.expect("extra namespace");
    assert!(extra.name().starts_with(lab.name()));
    let name = lab.name().to_owned();
    drop(lab);
    assert!(lab_namespaces(&name).is_empty());
}

/// Sends one HTTP/1.1 request from a socket made inside `ns`; returns the body of a 200 answer.
async fn http_in(ns: &NetNs, to: SocketAddr, request: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = ns
        .run_async(tokio::net::TcpSocket::new_v4)
        .await
        .expect("in the namespace")
        .expect("socket");
    let mut s = socket.connect(to).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("answer");
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

async fn imds_get(ns: &NetNs, path: &str) -> String {
    let imds = SocketAddr::from((vpclab::IMDS_ADDR, 80));
    let token = http_in(
        ns,
        imds,
        "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\n\
         X-aws-ec2-metadata-token-ttl-seconds: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .into(),
    )
    .await;
    http_in(
        ns,
        imds,
        format!(
            "GET /latest/meta-data/{path} HTTP/1.1\r\nHost: 169.254.169.254\r\n\
             X-aws-ec2-metadata-token: {token}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}

#[tokio::test]
async fn a_process_inside_a_node_reaches_its_instance_metadata_at_the_ec2_address() {
    let (mock, a, b) = cloud().await;
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let _imds_a = lab.expose_imds(&a.instance_id).await.expect("imds a");
    let _imds_b = lab.expose_imds(&b.instance_id).await.expect("imds b");
    let na = lab.node(&a.instance_id).expect("node a");
    let nb = lab.node(&b.instance_id).expect("node b");
    assert_eq!(imds_get(&na.ns, "instance-id").await, a.instance_id);
    assert_eq!(imds_get(&na.ns, "mac").await, a.mac);
    // Each node sees its own instance.
    assert_eq!(imds_get(&nb.ns, "instance-id").await, b.instance_id);
}

#[tokio::test]
async fn namespaces_of_a_killed_test_process_are_swept_and_live_ones_kept() {
    let mock = MockCloud::start(Config::fast()).await.expect("mockcloud");
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    // A pid above pid_max never runs: this namespace belongs to a process that is gone.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("number");
    let stale = format!("vpclab-{}-0beef-vpc", pid_max + 1);
    let out = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .output()
        .expect("ip");
    assert!(out.status.success(), "{out:?}");
    let removed = vpclab::remove_stale_namespaces().expect("sweep");
    assert!(removed.contains(&stale), "{removed:?}");
    assert!(!Path::new("/run/netns").join(&stale).exists());
    assert!(!lab_namespaces(lab.name()).is_empty(), "a live lab is kept");
}

#[tokio::test]
async fn an_eni_on_another_network_card_gets_its_own_link_name() {
    let mock = MockCloud::start(Config::fast()).await.expect("mockcloud");
    let world = mock.default_world().expect("default world");
    let big = mock
        .launch_instance("c6in.32xlarge", &world.subnet_id)
        .await
        .expect("a two-card instance");
    let (card0, card1) = mock.with_world(|w, now| {
        let mut attach = |card: u32| {
            let eni = w
                .create_network_interface(
                    &CreateEniArgs {
                        subnet_id: world.subnet_id.clone(),
                        ..Default::default()
                    },
                    now,
                )
                .expect("create ENI");
            w.attach_network_interface_on_card(&eni.id, &big.instance_id, 1, card, now)
                .expect("attach");
            (eni.id, eni.mac)
        };
        (attach(0), attach(1))
    });
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let node = lab.node(&big.instance_id).expect("node");
    let names: Vec<(u32, u32, String)> = node
        .links
        .iter()
        .map(|l| (l.network_card_index, l.device_index, l.ifname.clone()))
        .collect();
    assert_eq!(
        names,
        vec![
            (0, 0, "eth0".to_owned()),
            (0, 1, "eth1".to_owned()),
            (1, 1, "eth1d1".to_owned())
        ]
    );
    for (eni, mac) in [card0, card1] {
        let link = node
            .ns
            .link_by_mac(&mac)
            .await
            .expect("links")
            .expect("link");
        assert_eq!(link.name, node.link(&eni).expect("known").ifname);
    }
}
