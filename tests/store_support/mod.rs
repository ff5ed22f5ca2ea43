//! Builders shared by the `store_*` tests.

#![allow(dead_code)]

use std::net::Ipv4Addr;

use eniipam::store::{StoredAssignment, StoredEni, StoredIdle};

/// `10.0.x.y` for a small index.
pub fn ip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0000 + n)
}

/// An ENI with plausible fields derived from `n`.
pub fn eni(n: u32) -> StoredEni {
    StoredEni {
        eni_id: eni_id(n),
        mac: format!("02:00:00:00:00:{n:02x}"),
        device_index: n,
        subnet_id: format!("subnet-{n:08x}"),
        subnet_cidr: "10.0.0.0/16".to_owned(),
        primary_ip: Ipv4Addr::new(10, 1, 0, n as u8),
        created_by_us: n > 0,
        created_at_ms: 1_700_000_000_000 + u64::from(n),
    }
}

/// The id of [`eni`]`(n)`.
pub fn eni_id(n: u32) -> String {
    format!("eni-{n:08x}")
}

/// An assignment of `ip` on `eni_id` to container `container`, interface `eth0`.
pub fn assignment(ip: Ipv4Addr, eni_id: &str, container: &str) -> StoredAssignment {
    StoredAssignment {
        ip,
        eni_id: eni_id.to_owned(),
        network: "eniipam".to_owned(),
        container_id: container.to_owned(),
        ifname: "eth0".to_owned(),
        netns: format!("/var/run/netns/cni-{container}"),
        pod_namespace: "default".to_owned(),
        pod_name: format!("pod-{container}"),
        pod_uid: format!("uid-{container}"),
        sticky_key: None,
        assigned_at_ms: 1_700_000_000_000,
    }
}

/// An idle IP with no reservation.
pub fn idle(ip: Ipv4Addr, eni_id: &str, since: u64) -> StoredIdle {
    StoredIdle {
        ip,
        eni_id: eni_id.to_owned(),
        idle_since_ms: since,
        reservation: None,
    }
}
