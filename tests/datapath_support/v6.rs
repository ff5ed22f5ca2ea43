//! The IPv6 cells' harness: a cluster whose nodes hold an IPv6 address on eth0 and forward IPv6,
//! daemons in `ip_family = ipv6` or `dual`, pods made by the real plugin (chained with the reference
//! `portmap` for hostPorts) with an address from the node's /80 (and, dual, an IPv4 from the ENI
//! pool), and one echo server per pod that answers both families.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use mockcloud::world::Ipv6Args;
use serde_json::{Value, json};
use vpclab::{EchoError, EchoOptions, EchoReply, EchoServer, Egress, NetNs, echo};

use super::{Cluster, CniPod, Daemon, ECHO_PORT, PORTMAP, Placement, RpFilter, have};
use crate::bins::target_bin;

pub mod kube_proxy;

impl Cluster {
    /// [`Cluster::start_with`], then the IPv6 node's preparation: one IPv6 address on each node's
    /// primary ENI (an EKS IPv6 node has one; the lab puts it on eth0, as DHCPv6 would) and
    /// `net.ipv6.conf.all.forwarding=1` in each node (what `eniipamd --prepare-host` sets with
    /// `ip_family` ipv6; the daemon itself does not).
    /// `None`, with a notice, where the lab cannot run, also without `ip6tables` (kube-proxy's
    /// and portmap's IPv6 rules).
    pub async fn start_v6(test: &str, rp_filter: RpFilter) -> Option<Cluster> {
        for tool in ["ip6tables", "ip6tables-restore", "ip6tables-save"] {
            if !have(tool) {
                mockcloud::ci::skip(test, &format!("`{tool}` is not installed"));
                return None;
            }
        }
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

/// The daemons' `ip_family` in a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// IPv6-only pods: one address from the node's /80.
    Ipv6,
    /// Dual-stack pods: an IPv4 from the ENI pool (eth0's secondary IPs) and an IPv6 from the /80.
    Dual,
}

impl Family {
    fn env(self) -> &'static str {
        match self {
            Family::Ipv6 => "ipv6",
            Family::Dual => "dual",
        }
    }
}

/// A pod made through the plugin in an IPv6 or dual-stack node.
#[derive(Clone, Debug)]
pub struct CniPod6 {
    pub name: String,
    pub container_id: String,
    pub ns: NetNs,
    pub ip: Ipv6Addr,
    /// Its IPv4 (dual-stack pods only).
    pub ip4: Option<Ipv4Addr>,
    /// The chain's result (what a runtime caches).
    pub result: Value,
    pub host_port: Option<u16>,
}

impl CniPod6 {
    /// The pod as the IPv4 harness's [`Daemon::del_pod`] takes it (it runs the same chain).
    fn as_cni_pod(&self) -> CniPod {
        CniPod {
            name: self.name.clone(),
            namespace: "default".into(),
            container_id: self.container_id.clone(),
            ns: self.ns.clone(),
            ip: self.ip4.unwrap_or(Ipv4Addr::UNSPECIFIED),
            eni: String::new(),
            device_index: 0,
            result: self.result.clone(),
            host_port: self.host_port,
        }
    }

    /// Every address the pod has: its IPv6, then its IPv4 if dual-stack.
    pub fn ips(&self) -> Vec<IpAddr> {
        std::iter::once(IpAddr::V6(self.ip))
            .chain(self.ip4.map(IpAddr::V4))
            .collect()
    }
}

/// The pod's addresses in a CNI result, by family; more than one of a family is an error.
fn result_ips(result: &Value) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let (mut v4, mut v6) = (None, None);
    for ip in result["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in {result}"))
    {
        let address = ip["address"]
            .as_str()
            .unwrap_or_else(|| panic!("an ip without an address in {result}"));
        match address.split_once('/') {
            Some((a, "32")) if v4.is_none() => {
                v4 = Some(a.parse().unwrap_or_else(|_| panic!("bad IPv4 {address}")))
            }
            Some((a, "128")) if v6.is_none() => {
                v6 = Some(a.parse().unwrap_or_else(|_| panic!("bad IPv6 {address}")))
            }
            _ => panic!("unexpected address {address} in {result}"),
        }
    }
    (v4, v6)
}

impl Daemon {
    /// `eniipamd` on `instance_id` with `ip_family = ipv6` (pods on eth0's /80).
    pub async fn start_v6(cluster: &Cluster, instance_id: &str) -> Daemon {
        Self::start_family(cluster, instance_id, Family::Ipv6).await
    }

    /// `eniipamd` on `instance_id` with `ip_family` = `family`; dual-stack pods' IPv4 come from
    /// eth0's secondary IPs.
    pub async fn start_family(cluster: &Cluster, instance_id: &str, family: Family) -> Daemon {
        Daemon::start(
            cluster,
            instance_id,
            Placement::Eth0,
            &[("ENIIPAM_IP_FAMILY", family.env())],
        )
        .await
    }

    /// Runs the plugin's ADD for a new IPv6 pod; the lab syncs (the node's /80 routed) before
    /// it returns.
    pub async fn add_pod_v6(&self, cluster: &Cluster, name: &str) -> CniPod6 {
        self.add_pod6(cluster, name, None).await
    }

    /// Runs the chain's ADD for a new pod of this daemon's family (the plugin, then `portmap`
    /// mapping `host_port` → `ECHO_PORT` if given), and checks the result holds the family's
    /// addresses: an IPv6 alone, or an IPv4 and an IPv6 with `ip_family = dual`.
    pub async fn add_pod6(&self, cluster: &Cluster, name: &str, host_port: Option<u16>) -> CniPod6 {
        let ns = cluster
            .lab
            .add_namespace("pod6")
            .await
            .expect("pod namespace");
        let mut pod = CniPod {
            name: name.to_owned(),
            namespace: "default".into(),
            container_id: format!("{name}-{:08x}", rand::random::<u32>()),
            ns,
            ip: Ipv4Addr::UNSPECIFIED,
            eni: String::new(),
            device_index: 0,
            result: Value::Null,
            host_port,
        };
        let conf = self.plugin_conf(0);
        let out = self.cni(&target_bin("eniipam"), "ADD", &pod, &conf).await;
        let result: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("eniipam ADD answered {out:?}: {e}"));
        let (ip4, ip) = result_ips(&result);
        let ip = ip.unwrap_or_else(|| panic!("no IPv6 in {result}"));
        let dual = self
            .env
            .iter()
            .any(|(k, v)| k == "ENIIPAM_IP_FAMILY" && v == "dual");
        assert_eq!(
            ip4.is_some(),
            dual,
            "the pod's IPv4 (dual: {dual}): {result}"
        );
        pod.result = result;
        if let Some(host_port) = host_port {
            let mut pm = self.plugin_conf(1);
            pm["runtimeConfig"] = json!({"portMappings": [
                {"hostPort": host_port, "containerPort": ECHO_PORT, "protocol": "tcp"}
            ]});
            pm["prevResult"] = pod.result.clone();
            let out = self.cni(Path::new(PORTMAP), "ADD", &pod, &pm).await;
            pod.result = serde_json::from_str(&out).expect("portmap's result");
        }
        cluster.lab.sync().await.expect("lab sync");
        CniPod6 {
            name: pod.name,
            container_id: pod.container_id,
            ns: pod.ns,
            ip,
            ip4,
            result: pod.result,
            host_port,
        }
    }

    /// Runs the chain's DEL (portmap first) and deletes the pod's namespace.
    pub async fn del_pod6(&self, pod: &CniPod6) {
        self.del_pod(&pod.as_cni_pod()).await;
    }

    /// `ip6tables-save -t nat` in the node.
    pub async fn ip6tables_nat(&self) -> String {
        self.ns
            .exec("ip6tables-save", &["-t", "nat"])
            .await
            .expect("ip6tables-save")
    }
}

/// An echo server on `[::]:ECHO_PORT` in `ns`. It answers IPv4 too (a dual-stack socket: IPv4
/// peers show as `::ffff:a.b.c.d`, which [`reach`] maps back).
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

/// One echo exchange from `from` to `to:port` (either family) that must succeed; the source
/// address the server saw, an IPv4-mapped IPv6 made IPv4 again.
pub async fn reach(from: &NetNs, to: IpAddr, port: u16) -> IpAddr {
    echo(
        from,
        SocketAddr::new(to, port),
        &EchoOptions {
            timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{} → {}: {e}", from.name(), SocketAddr::new(to, port)))
    .server_saw
    .ip()
    .to_canonical()
}

/// One exchange from `from` to `to:port` that must get no answer (a dropped packet).
pub async fn dropped6(from: &NetNs, to: IpAddr, port: u16) {
    let to = SocketAddr::new(to, port);
    match echo(
        from,
        to,
        &EchoOptions {
            timeout: std::time::Duration::from_millis(800),
            ..Default::default()
        },
    )
    .await
    {
        Err(EchoError::Timeout(_)) => {}
        other => panic!("{} → {to}: expected a drop, got {other:?}", from.name()),
    }
}
