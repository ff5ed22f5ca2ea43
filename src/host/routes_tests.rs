//! Unit tests of the ENI route tables (the netlink side is tested in `tests/host_routes.rs`).

use super::*;

fn eni(device_index: u32) -> EniRoute {
    EniRoute {
        mac: "02:AB:00:00:00:01".into(),
        device_index,
        subnet_cidr: "10.1.2.0/24".parse().unwrap(),
        gateway: "10.1.2.1".parse().unwrap(),
        primary_ip: "10.1.2.10".parse().unwrap(),
        mtu: Some(9001),
    }
}

#[test]
fn tables_follow_the_plugin_convention() {
    assert_eq!(table_of(0), None);
    assert_eq!(table_of(1), Some(2));
    assert_eq!(table_of(14), Some(15));
    for i in 1..16 {
        assert_eq!(table_of(i), Some(i + 1), "device index {i}");
    }
    assert_eq!(eni(3).table(), Some(4));
}

#[test]
fn gateway_is_the_subnet_router() {
    assert_eq!(
        vpc_router("10.1.2.0/24".parse().unwrap()),
        Ipv4Addr::new(10, 1, 2, 1)
    );
    assert_eq!(
        vpc_router("172.31.32.0/20".parse().unwrap()),
        Ipv4Addr::new(172, 31, 32, 1)
    );
}

#[test]
fn validation_normalises_and_refuses() {
    assert_eq!(
        eni(1).validate().unwrap(),
        (2, "02:ab:00:00:00:01".to_owned())
    );
    assert!(matches!(eni(0).validate(), Err(HostError::PrimaryEni)));
    let mut bad = eni(1);
    bad.primary_ip = "10.9.9.9".parse().unwrap();
    let err = bad.validate().unwrap_err();
    assert!(
        err.to_string().contains("outside subnet 10.1.2.0/24"),
        "{err}"
    );
    let mut bad = eni(1);
    bad.mac = "02:ab:00:00:01".into();
    assert!(matches!(bad.validate(), Err(HostError::Invalid { .. })));
    let mut bad = eni(1);
    bad.mac = "02:ab:00:00:00:zz".into();
    assert!(matches!(bad.validate(), Err(HostError::Invalid { .. })));
}

#[test]
fn pool_enis_map_to_routes() {
    use crate::pool::EniPhaseSnapshot;
    let snap = |role: EniRole, device_index: u32, cidr: Option<&str>| EniSnapshot {
        id: "eni-0123abcd".parse().unwrap(),
        mac: "02:AB:00:00:00:01".into(),
        device_index,
        subnet_id: "subnet-1".into(),
        subnet_cidr: cidr.map(|c| c.parse().unwrap()),
        primary_ip: "10.1.2.10".parse().unwrap(),
        role,
        serves_pods: role == EniRole::Pods,
        prefixes: Vec::new(),
        phase: EniPhaseSnapshot::Serving,
        in_flight: 0,
        ips: Vec::new(),
    };
    let route =
        EniRoute::from_snapshot(&snap(EniRole::Pods, 2, Some("10.1.2.0/24")), Some(9001)).unwrap();
    assert_eq!(
        route,
        EniRoute {
            mac: "02:ab:00:00:00:01".into(),
            device_index: 2,
            subnet_cidr: "10.1.2.0/24".parse().unwrap(),
            gateway: "10.1.2.1".parse().unwrap(),
            primary_ip: "10.1.2.10".parse().unwrap(),
            mtu: Some(9001),
        }
    );
    assert_eq!(
        EniRoute::from_snapshot(&snap(EniRole::Primary, 0, Some("10.1.2.0/24")), None),
        None
    );
    assert_eq!(
        EniRoute::from_snapshot(&snap(EniRole::Foreign, 1, Some("10.1.2.0/24")), None),
        None
    );
    assert_eq!(
        EniRoute::from_snapshot(&snap(EniRole::Pods, 0, Some("10.1.2.0/24")), None),
        None
    );
    assert_eq!(
        EniRoute::from_snapshot(&snap(EniRole::Pods, 1, None), None),
        None
    );
}

#[test]
fn routes_display_like_ip() {
    let r = TableRoute {
        table: 3,
        destination: "0.0.0.0/0".parse().unwrap(),
        gateway: Some(Ipv4Addr::new(10, 1, 2, 1)),
        oif: Some(7),
        link_scope: false,
        onlink: true,
    };
    assert_eq!(r.to_string(), "default via 10.1.2.1 dev #7 onlink");
    let r = TableRoute {
        table: 3,
        destination: "10.1.2.0/24".parse().unwrap(),
        gateway: None,
        oif: Some(7),
        link_scope: true,
        onlink: false,
    };
    assert_eq!(r.to_string(), "10.1.2.0/24 dev #7 scope link");
}
