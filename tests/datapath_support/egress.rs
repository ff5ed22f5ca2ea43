//! The IPv4 egress cells' harness (IPv6-only pods reaching IPv4, issue 26): a daemon in
//! `ip_family = ipv6` with extra knobs, and what a pod's IPv4 side looks like from inside it.

use std::net::Ipv4Addr;

use serde_json::Value;
use vpclab::NetNs;

use super::{Cluster, Daemon, Placement};

impl Daemon {
    /// `eniipamd` on `instance_id` with `ip_family = ipv6` and the `extra` knobs.
    pub async fn start_v6_with(
        cluster: &Cluster,
        instance_id: &str,
        extra: &[(&str, &str)],
    ) -> Daemon {
        let mut env = vec![("ENIIPAM_IP_FAMILY", "ipv6")];
        env.extend_from_slice(extra);
        Daemon::start(cluster, instance_id, Placement::Eth0, &env).await
    }

    /// The handle of the `pod-snat` rule whose listing contains `needle` (`nft -a`), if any.
    pub async fn snat_rule_handle(&self, needle: &str) -> Option<String> {
        let listing = self
            .ns
            .exec("nft", &["-a", "list", "chain", "ip", "eniipam", "pod-snat"])
            .await
            .ok()?;
        listing
            .lines()
            .find(|l| l.contains(needle))
            .and_then(|l| l.rsplit("# handle ").next())
            .map(|h| h.trim().to_owned())
    }
}

/// The IPv4 addresses on the pod's eth0.
pub async fn pod_ipv4s(ns: &NetNs) -> Vec<(Ipv4Addr, u64)> {
    let out = ns
        .ip(&["-j", "-4", "addr", "show", "dev", "eth0"])
        .await
        .expect("ip addr");
    let links: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
    links
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| Some((a["local"].as_str()?.parse().ok()?, a["prefixlen"].as_u64()?)))
        .collect()
}

/// The pod's IPv4 default route (`ip -j -4 route`), if it has one.
pub async fn pod_ipv4_default(ns: &NetNs) -> Option<Value> {
    let out = ns
        .ip(&["-j", "-4", "route", "show"])
        .await
        .expect("ip route");
    let routes: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
    routes.into_iter().find(|r| r["dst"] == "default")
}
