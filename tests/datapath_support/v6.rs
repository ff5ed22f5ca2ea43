//! The IPv6 cells' harness: a cluster whose nodes hold an IPv6 address on eth0 and forward IPv6,
//! daemons in `ip_family = ipv6`, and pods made by the real plugin with an address from the node's
//! /80.

use std::net::{Ipv6Addr, SocketAddr};

use mockcloud::world::Ipv6Args;
use serde_json::Value;
use vpclab::{EchoOptions, EchoReply, EchoServer, Egress, NetNs, echo};

use super::{Cluster, CniPod, Daemon, ECHO_PORT, Placement, RpFilter};
use crate::bins::target_bin;

impl Cluster {
    /// [`Cluster::start_with`], then the IPv6 node's preparation: one IPv6 address on each node's
    /// primary ENI (an EKS IPv6 node has one; the lab puts it on eth0, as DHCPv6 would) and
    /// `net.ipv6.conf.all.forwarding=1` in each node (what `eniipamd --prepare-host` sets with
    /// `ip_family` ipv6; the daemon itself does not).
    pub async fn start_v6(test: &str, rp_filter: RpFilter) -> Option<Cluster> {
        let c = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await?;
        for inst in [&c.a, &c.b] {
            c.mock
                .with_world(|w, now| w.assign_ipv6(&inst.primary_eni, Ipv6Args::Count(1), now))
                .expect("a node IPv6 address");
            c.node_ns(&inst.instance_id)
                .write_sysctls(&[("net/ipv6/conf/all/forwarding".into(), "1".into())])
                .await
                .expect("IPv6 forwarding in the node");
        }
        c.lab.sync().await.expect("lab sync");
        Some(c)
    }

    /// A node's eth0 IPv6 address, as the lab put it there.
    pub fn node_v6(&self, instance_id: &str) -> Ipv6Addr {
        self.lab
            .node(instance_id)
            .and_then(|n| n.ipv6)
            .expect("the node has an IPv6 address on eth0")
    }
}

/// A pod made through the plugin in an IPv6 node.
#[derive(Clone, Debug)]
pub struct CniPod6 {
    pub name: String,
    pub container_id: String,
    pub ns: NetNs,
    pub ip: Ipv6Addr,
    pub result: Value,
}

impl Daemon {
    /// `eniipamd` on `instance_id` with `ip_family = ipv6` (pods on eth0's /80).
    pub async fn start_v6(cluster: &Cluster, instance_id: &str) -> Daemon {
        Daemon::start(
            cluster,
            instance_id,
            Placement::Eth0,
            &[("ENIIPAM_IP_FAMILY", "ipv6")],
        )
        .await
    }

    /// Runs the plugin's ADD for a new IPv6 pod; the lab syncs (the node's /80 routed) before
    /// it returns.
    pub async fn add_pod_v6(&self, cluster: &Cluster, name: &str) -> CniPod6 {
        let ns = cluster
            .lab
            .add_namespace("pod6")
            .await
            .expect("pod namespace");
        let pod = CniPod {
            name: name.to_owned(),
            container_id: format!("{name}-{:08x}", rand::random::<u32>()),
            ns,
            ip: std::net::Ipv4Addr::UNSPECIFIED,
            eni: String::new(),
            device_index: 0,
            result: Value::Null,
            host_port: None,
        };
        let conf = self.plugin_conf(0);
        let out = self.cni(&target_bin("eniipam"), "ADD", &pod, &conf).await;
        let result: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("eniipam ADD answered {out:?}: {e}"));
        let address = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no IP in {result}"));
        let ip: Ipv6Addr = address
            .strip_suffix("/128")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("not an IPv6 /128: {address}"));
        cluster.lab.sync().await.expect("lab sync");
        CniPod6 {
            name: pod.name,
            container_id: pod.container_id,
            ns: pod.ns,
            ip,
            result,
        }
    }
}

/// An echo server on `[::]:ECHO_PORT` in `ns`.
pub fn serve6(ns: &NetNs) -> EchoServer {
    EchoServer::start(ns, SocketAddr::from((Ipv6Addr::UNSPECIFIED, ECHO_PORT)))
        .expect("echo server")
}

/// One echo exchange from `from` to `[to]:ECHO_PORT` that must succeed.
pub async fn reaches6(from: &NetNs, to: Ipv6Addr) -> EchoReply {
    echo(
        from,
        SocketAddr::from((to, ECHO_PORT)),
        &EchoOptions {
            timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{} → [{to}]:{ECHO_PORT}: {e}", from.name()))
}
