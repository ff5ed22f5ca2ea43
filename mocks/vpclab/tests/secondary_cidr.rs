//! A VPC secondary IPv4 block (100.64.0.0/16, as custom networking uses) on the fabric: an ENI in
//! a subnet of it is routed to its node like any other, the block's subnet router answers, an
//! unassigned address in it is sunk and counted, and the NAT gateway treats its sources as the
//! VPC's own (masqueraded to its public address), while the IGW lets none of them out untranslated.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use mockcloud::world::{AssignArgs, CreateEniArgs};
use mockcloud::{LaunchedInstance, MockCloud};
use vpclab::{EchoOptions, INTERNET_SERVER, Lab, LabConfig, NAT_GATEWAY_PUBLIC_IP, echo};

mod support;
use support::{PORT, cloud, dropped, reaches, serve};

const POD_SUBNET: &str = "100.64.0.0/19";

/// Associates 100.64.0.0/16, makes a pod subnet in it (in `a`'s AZ) and attaches an ENI of it to
/// `a` at device 1 with one secondary address; returns (ENI primary, secondary).
fn pod_eni(mock: &MockCloud, a: &LaunchedInstance) -> (Ipv4Addr, Ipv4Addr) {
    mock.associate_vpc_cidr_block(&a.vpc_id, "100.64.0.0/16".parse().unwrap())
        .expect("associate");
    let subnet = mock
        .create_subnet(&a.vpc_id, POD_SUBNET.parse().unwrap(), &a.availability_zone)
        .expect("pod subnet");
    mock.with_world(|w, now| {
        let eni = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: subnet,
                    description: "custom networking".into(),
                    ..Default::default()
                },
                now,
            )
            .expect("create ENI");
        w.attach_network_interface(&eni.id, &a.instance_id, 1, now)
            .expect("attach");
        let ip = w
            .assign_private_ip_addresses(&eni.id, AssignArgs::Count(1), now)
            .expect("assign")[0];
        (eni.primary_ip, ip)
    })
}

/// On node `a`, puts `ip` on eth1 and sends what it sources by eth1 to the pod subnet's router,
/// as the daemon's per-ENI table does.
async fn use_eth1(lab: &Lab, a: &LaunchedInstance, ip: Ipv4Addr) {
    let net: Ipv4Net = POD_SUBNET.parse().unwrap();
    let router = vpclab::subnet_router(net);
    lab.node(&a.instance_id)
        .unwrap()
        .ns
        .ip_batch(&[
            "link set eth1 up".to_owned(),
            format!("addr add {ip}/32 dev eth1"),
            format!("route add {router} dev eth1 table 101"),
            format!("route add default via {router} dev eth1 table 101"),
            format!("rule add from {ip} lookup 101 priority 100"),
        ])
        .await
        .expect("eth1");
}

#[tokio::test]
async fn a_secondary_block_is_routed_sunk_and_kept_inside() {
    let (mock, a, b) = cloud().await;
    let (_, ip) = pod_eni(&mock, &a);
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    assert_eq!(
        lab.vpc_cidrs(),
        [a_vpc_primary(), "100.64.0.0/16".parse().unwrap()]
    );
    use_eth1(&lab, &a, ip).await;
    let na = lab.node(&a.instance_id).unwrap();
    let nb = lab.node(&b.instance_id).unwrap();

    // Node b (10.0.0.0/20) → the 100.64 address on node a's eth1, and back: no translation.
    let _on_a = serve(&na.ns).await;
    let r = reaches(&nb.ns, ip).await;
    assert_eq!(r.server_saw.ip(), b.private_ip);
    // And from the 100.64 address towards node b: the server sees it as it is.
    let _on_b = serve(&nb.ns).await;
    let r = echo(
        &na.ns,
        (b.private_ip, PORT).into(),
        &EchoOptions {
            bind: Some(ip.into()),
            timeout: Duration::from_secs(5),
        },
    )
    .await
    .expect("100.64 → node b");
    assert_eq!(r.server_saw.ip(), ip);
    assert!(lab.src_dst_drops().await.unwrap().values().all(|n| *n == 0));

    // An address of the block that no ENI holds is sunk and counted.
    let before = lab.unassigned_drops().await.unwrap();
    dropped(&nb.ns, "100.64.20.20".parse::<Ipv4Addr>().unwrap()).await;
    assert!(lab.unassigned_drops().await.unwrap() > before);

    // The IGW lets no 100.64 source out untranslated (it has no public IP).
    let _server = serve(lab.internet()).await;
    let e = echo(
        &na.ns,
        (INTERNET_SERVER, PORT).into(),
        &EchoOptions {
            bind: Some(ip.into()),
            timeout: Duration::from_millis(700),
        },
    )
    .await;
    assert!(e.is_err(), "{e:?}");
    assert!(lab.igw_drops().await.unwrap().egress_not_public >= 1);
}

#[tokio::test]
async fn the_nat_gateway_masquerades_the_secondary_block() {
    let (mock, a, _b) = cloud().await;
    let (_, ip) = pod_eni(&mock, &a);
    let lab = Lab::start(&mock, LabConfig::nat_gateway())
        .await
        .expect("lab");
    use_eth1(&lab, &a, ip).await;
    let na = lab.node(&a.instance_id).unwrap();
    let _server = serve(lab.internet()).await;
    let r = echo(
        &na.ns,
        (INTERNET_SERVER, PORT).into(),
        &EchoOptions {
            bind: Some(ip.into()),
            timeout: Duration::from_secs(5),
        },
    )
    .await
    .expect("100.64 → internet through the NAT gateway");
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    assert!(lab.src_dst_drops().await.unwrap().values().all(|n| *n == 0));
}

/// A block associated after the lab started is a clear sync error (the gateways are wired once).
#[tokio::test]
async fn a_block_associated_after_the_start_is_a_clear_error() {
    let (mock, a, _b) = cloud().await;
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    mock.associate_vpc_cidr_block(&a.vpc_id, "100.64.0.0/16".parse().unwrap())
        .unwrap();
    let e = lab.sync().await.expect_err("changed blocks");
    assert!(e.to_string().contains("before Lab::start"), "{e}");
}

fn a_vpc_primary() -> Ipv4Net {
    "10.0.0.0/16".parse().unwrap()
}
