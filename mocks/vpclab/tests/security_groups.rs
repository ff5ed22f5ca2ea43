//! Security groups in the emulated VPC: node B's ENI in group `db` (ingress tcp PORT from group
//! `app`), node A's in `app`, node C's in the VPC's default group only. App reaches db on PORT and
//! db's replies come back; default → db is dropped and counted at db's ENI; app → db on another
//! port is dropped; a CIDR rule (an ipBlock) lets C in on that port; revoking the app rule drops
//! new connections after a sync. Needs root, `ip`, `nft` and `nsenter`.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use mockcloud::world::{Direction, IpPermission, ModifyArgs};
use support::*;
use vpclab::{EchoError, EchoOptions, EchoServer, Lab, LabConfig, NetNs, echo};

const OTHER: u16 = PORT + 1;

fn tcp_from(port: u16, groups: Vec<String>, cidrs: Vec<Ipv4Net>) -> IpPermission {
    IpPermission {
        ip_protocol: "tcp".into(),
        from_port: Some(i32::from(port)),
        to_port: Some(i32::from(port)),
        ip_ranges: cidrs,
        ipv6_ranges: vec![],
        groups,
    }
}

async fn exchange(ns: &NetNs, to: impl Into<IpAddr>, port: u16) -> Result<(), EchoError> {
    echo(
        ns,
        SocketAddr::from((to.into(), port)),
        &EchoOptions {
            timeout: Duration::from_millis(900),
            ..Default::default()
        },
    )
    .await
    .map(drop)
}

#[tokio::test]
async fn ingress_rules_by_group_and_cidr_are_enforced_statefully() {
    let (mock, a, b) = cloud().await;
    let c = mock
        .launch_instance("m5.large", &a.subnet_id)
        .await
        .expect("c");
    let vpc = mock.default_world().expect("world").vpc_id;
    let (app, db) = mock.with_world(|w, now| {
        let none = Default::default();
        let app = w
            .create_security_group_named(Some(&vpc), "app", "app tier", &none)
            .expect("app");
        let db = w
            .create_security_group_named(Some(&vpc), "db", "db tier", &none)
            .expect("db");
        w.change_rules(
            &db,
            Direction::Ingress,
            &[tcp_from(PORT, vec![app.clone()], vec![])],
            true,
        )
        .expect("db rule");
        w.modify_network_interface_attribute(
            &a.primary_eni,
            ModifyArgs::Groups(vec![app.clone()]),
            now,
        )
        .expect("a in app");
        w.modify_network_interface_attribute(
            &b.primary_eni,
            ModifyArgs::Groups(vec![db.clone()]),
            now,
        )
        .expect("b in db");
        (app, db)
    });
    let lab = Lab::start(&mock, LabConfig::default()).await.expect("lab");
    let (na, nb, nc) = (
        lab.node(&a.instance_id).expect("a"),
        lab.node(&b.instance_id).expect("b"),
        lab.node(&c.instance_id).expect("c"),
    );
    let _db = serve(&nb.ns).await;
    let _db_other = EchoServer::start(
        &nb.ns,
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, OTHER)),
    )
    .expect("second server");

    // app → db:PORT connects, and db's replies pass (stateful).
    let r = reaches(&na.ns, b.private_ip).await;
    assert_eq!(r.server_saw.ip(), IpAddr::from(a.private_ip));
    assert_eq!(lab.sg_drops(&b.primary_eni).await.expect("counter"), 0);
    // default → db is dropped and counted at db's ENI.
    dropped(&nc.ns, b.private_ip).await;
    let after_c = lab.sg_drops(&b.primary_eni).await.expect("counter");
    assert!(after_c > 0, "the SYNs from C are counted");
    // app → db on another port: no rule.
    assert!(matches!(
        exchange(&na.ns, b.private_ip, OTHER).await,
        Err(EchoError::Timeout(_))
    ));
    // A CIDR rule lets C (by its address) in on that port.
    mock.with_world(|w, _| {
        w.change_rules(
            &db,
            Direction::Ingress,
            &[tcp_from(OTHER, vec![], vec![Ipv4Net::from(c.private_ip)])],
            true,
        )
    })
    .expect("cidr rule");
    lab.sync().await.expect("sync");
    exchange(&nc.ns, b.private_ip, OTHER)
        .await
        .expect("C by CIDR");
    // Db's own egress (all) lets it reach app's node; app's ingress has no rule for db: dropped.
    dropped(&nb.ns, a.private_ip).await;
    assert!(lab.sg_drops(&a.primary_eni).await.expect("counter") > 0);

    // Revoking the app rule drops new connections after a sync.
    mock.with_world(|w, _| {
        w.change_rules(
            &db,
            Direction::Ingress,
            &[tcp_from(PORT, vec![app.clone()], vec![])],
            false,
        )
    })
    .expect("revoke");
    lab.sync().await.expect("sync");
    dropped(&na.ns, b.private_ip).await;
}
