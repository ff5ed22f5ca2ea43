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
        vpc_router("10.1.2.0/24".parse::<Ipv4Net>().unwrap().network()),
        Ipv4Addr::new(10, 1, 2, 1)
    );
    assert_eq!(
        vpc_router("172.31.32.0/20".parse::<Ipv4Net>().unwrap().network()),
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
