//! The lab's life: `sync()` and the follower apply cloud changes (assigns, unassigns, attaches,
//! detaches, network cards, instances coming and going) made through mockcloud's world or the real
//! SDK; a process in a node reaches its IMDS; teardown also on panic; stale namespaces swept; bad
//! input refused. Needs root, `ip`, `nft` and `nsenter`.

mod support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use mockcloud::world::CreateEniArgs;
use mockcloud::{Config, MockCloud};
use support::*;
use vpclab::{Lab, LabConfig, StateSource};

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
