//! The data-path matrix's harness: an emulated VPC (`vpclab`) following an in-process mockcloud,
//! the real `eniipamd` binary run inside a node namespace (`nsenter --net`), configured only by
//! `ENIIPAM_*` variables, reaching mockcloud's EC2 through a port forward on the node's 127.0.0.1
//! and IMDS at 169.254.169.254 (`Lab::expose_imds`), and pods made as a runtime makes them: a
//! namespace, then the real plugin binary run in the node namespace with the shipped conflist's
//! plugin configuration and a CNI environment, chained with the reference `portmap` for hostPorts.
//!
//! Nothing runs in, or sends from, the machine's own namespace: the daemon, the plugin and portmap
//! run in the node namespaces; traffic runs between lab namespaces. Dropping a [`Cluster`] deletes
//! every namespace (and so every rule and route in them); a [`Daemon`] is killed when dropped.

#![allow(dead_code)] // each test binary uses its own subset

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mockcloud::{LaunchedInstance, MockCloud};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use vpclab::{
    EchoError, EchoOptions, EchoReply, EchoServer, Egress, Follower, Lab, LabConfig, NetNs,
    PortForward, echo,
};

use crate::bins::target_bin;

/// The cluster name of the data-path daemons (`ENIIPAM_CLUSTER_NAME`).
const CLUSTER: &str = "datapath";

/// Where pods' echo servers listen.
pub const ECHO_PORT: u16 = 7000;

/// Two tests of `$case(test_name, rp_filter)`: one under strict `rp_filter`, one under loose.
#[allow(unused_macros)]
macro_rules! both_rp_filters {
    ($case:ident: $strict:ident, $loose:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $strict() {
            $case(stringify!($strict), RpFilter::Strict).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $loose() {
            $case(stringify!($loose), RpFilter::Loose).await;
        }
    };
}

mod daemon;
pub mod egress;
pub mod policy;
pub mod profiles;
pub mod v6;
/// The NodePort the emulated kube-proxy DNATs.
pub const NODE_PORT: u16 = 30080;
/// The hostPort portmap maps.
pub const HOST_PORT: u16 = 8080;
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
const PORTMAP: &str = "/usr/lib/cni/portmap";

/// Where a pod's IP should come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A secondary IP of eth0 (the primary ENI).
    Eth0,
    /// A secondary IP of a secondary ENI.
    SecondaryEni,
}

impl Placement {
    /// The knob that puts pods there: eth0 serves pods unless told not to (`use_primary_eni`).
    fn env(self) -> (&'static str, &'static str) {
        match self {
            Placement::Eth0 => ("ENIIPAM_USE_PRIMARY_ENI", "true"),
            Placement::SecondaryEni => ("ENIIPAM_USE_PRIMARY_ENI", "false"),
        }
    }
}

fn have(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The nodes' reverse-path filtering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpFilter {
    /// 1: the reverse route of a packet's source must leave by the interface it came in on.
    Strict,
    /// 2: the source must be routable at all (EKS's AL2023 default).
    Loose,
}

impl RpFilter {
    fn value(self) -> &'static str {
        match self {
            RpFilter::Strict => "1",
            RpFilter::Loose => "2",
        }
    }
}

/// Two instances (A and B) in one subnet of mockcloud's default VPC, as lab nodes.
pub struct Cluster {
    pub mock: MockCloud,
    pub lab: Lab,
    pub a: LaunchedInstance,
    pub b: LaunchedInstance,
    pub dir: tempfile::TempDir,
    _follow: Follower,
}

impl Cluster {
    /// `None`, with a notice, where the lab cannot run (not root, a tool missing).
    pub async fn start(test: &str, egress: Egress) -> Option<Cluster> {
        Self::start_with(test, egress, RpFilter::Strict).await
    }

    /// [`Cluster::start`] with the nodes' `rp_filter` (`all`, `default`) set to `rp_filter`.
    pub async fn start_with(test: &str, egress: Egress, rp_filter: RpFilter) -> Option<Cluster> {
        Self::start_prepared(test, egress, rp_filter, |_, _| {}).await
    }

    /// [`Cluster::start_with`], with `prepare` run on mockcloud (given instance A) after both
    /// instances are launched and before the lab starts: what the lab must know from the start,
    /// such as a secondary VPC block (custom networking's 100.64.0.0/16) and its subnets.
    pub async fn start_prepared(
        test: &str,
        egress: Egress,
        rp_filter: RpFilter,
        prepare: impl FnOnce(&MockCloud, &LaunchedInstance),
    ) -> Option<Cluster> {
        for tool in ["ip", "nft", "nsenter", "iptables", "iptables-restore"] {
            if !have(tool) {
                mockcloud::ci::skip(test, &format!("`{tool}` is not installed"));
                return None;
            }
        }
        if !Path::new(PORTMAP).exists() {
            mockcloud::ci::skip(
                test,
                &format!("{PORTMAP} is absent (containernetworking-plugins)"),
            );
            return None;
        }
        let can = std::process::Command::new("ip")
            .args([
                "netns",
                "add",
                &format!("eniipam-dp-probe-{}-{test}", std::process::id()),
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        let _ = std::process::Command::new("ip")
            .args([
                "netns",
                "del",
                &format!("eniipam-dp-probe-{}-{test}", std::process::id()),
            ])
            .output();
        if !can {
            mockcloud::ci::skip(test, "cannot create network namespaces (needs root)");
            return None;
        }
        let _ = vpclab::remove_stale_namespaces();
        let mock = MockCloud::start(mockcloud::Config::fast())
            .await
            .expect("mockcloud");
        // The shipped IAM policy for the daemons' cluster, enforced as EC2 would.
        mock.enforce_shipped_policy(CLUSTER)
            .expect("a default world");
        let a = mock.default_instance();
        let b = mock
            .launch_instance("m5.large", &a.subnet_id)
            .await
            .expect("instance B");
        prepare(&mock, &a);
        let config = LabConfig {
            egress,
            // Strict reverse-path filtering everywhere by default: the daemon must loosen eth0
            // itself.
            node_sysctls: [
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", rp_filter.value()),
                ("net/ipv4/conf/default/rp_filter", rp_filter.value()),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
            ..LabConfig::default()
        };
        let lab = Lab::start(&mock, config).await.expect("lab");
        let follow = lab.follow(Duration::from_millis(200)).expect("follow");
        Some(Cluster {
            mock,
            lab,
            a,
            b,
            dir: tempfile::tempdir().expect("temp dir"),
            _follow: follow,
        })
    }

    pub fn node_ns(&self, instance_id: &str) -> NetNs {
        self.lab.node(instance_id).expect("a lab node").ns
    }

    /// The ENI holding `ip` (its primary, a secondary IP, or inside one of its `/28` prefixes) and
    /// its device index, in EC2.
    pub fn eni_of(&self, ip: Ipv4Addr) -> (String, u32) {
        self.mock
            .network_interfaces()
            .into_iter()
            .find(|e| {
                e.primary_ip == ip
                    || e.secondary_ips.contains(&ip)
                    || e.ipv4_prefixes.iter().any(|p| p.contains(&ip))
            })
            .map(|e| {
                let index = e.attachment.as_ref().map_or(u32::MAX, |a| a.device_index);
                (e.id, index)
            })
            .unwrap_or_else(|| panic!("no ENI holds {ip}"))
    }

    /// No packet dropped by EC2's source/destination check on any attached ENI, none sent to a VPC
    /// address no ENI holds.
    pub async fn assert_no_drops(&self) {
        let drops = self.lab.src_dst_drops().await.expect("counters");
        assert!(
            drops.values().all(|n| *n == 0),
            "source/destination check drops: {drops:?}"
        );
        assert_eq!(
            self.lab.unassigned_drops().await.expect("counter"),
            0,
            "packets to VPC addresses no ENI holds"
        );
    }

    /// The drops counted on one ENI.
    pub async fn drops_on(&self, eni: &str) -> u64 {
        self.lab.src_dst_drops().await.expect("counters")[eni]
    }
}

/// Counts the packets between two pod addresses (either direction) that leave their node by one of
/// its ENIs (postrouting in the node, any interface but a pod's host veth) or reach the VPC router
/// (prerouting in the vpc namespace): traffic between two pods of one node must do neither.
pub struct FlowProbe {
    probes: Vec<(NetNs, String)>,
}

impl FlowProbe {
    pub async fn start(cluster: &Cluster, node: &NetNs, a: Ipv4Addr, b: Ipv4Addr) -> FlowProbe {
        let table = format!("probe_{:08x}", rand::random::<u32>());
        let flows = format!(
            "ip saddr {a} ip daddr {b} counter name \"seen\"
    ip saddr {b} ip daddr {a} counter name \"seen\""
        );
        let vpc = cluster.lab.vpc().clone();
        vpc.nft(&format!(
            "table ip {table} {{
  counter seen {{}}
  chain pre {{
    type filter hook prerouting priority raw - 10; policy accept;
    {flows}
  }}
}}
"
        ))
        .await
        .expect("flow probe in the vpc namespace");
        node.nft(&format!(
            "table ip {table} {{
  counter seen {{}}
  chain post {{
    type filter hook postrouting priority 300; policy accept;
    oifname != \"eni*\" oifname != \"lo\" jump flows
  }}
  chain flows {{
    {flows}
  }}
}}
"
        ))
        .await
        .expect("flow probe in the node");
        FlowProbe {
            probes: vec![(vpc, table.clone()), (node.clone(), table)],
        }
    }

    /// Packets seen so far: (left the node by an ENI, reached the VPC router).
    pub async fn packets(&self) -> (u64, u64) {
        let mut counts = Vec::new();
        for (ns, table) in &self.probes {
            let json = ns
                .nft_json(&["list", "counter", "ip", table, "seen"])
                .await
                .expect("flow probe counter");
            counts.push(
                json["nftables"]
                    .as_array()
                    .and_then(|items| items.iter().find_map(|i| i["counter"]["packets"].as_u64()))
                    .expect("the probe's packet count"),
            );
        }
        (counts[1], counts[0])
    }
}

pub use daemon::Daemon;

/// Registers node `node` in the API-server double `api` and forwards the double into the node's
/// namespace (nothing there reaches the machine's loopback otherwise): the forward, kept as long as
/// the node's daemon runs, and the URL that daemon is given (`ENIIPAM_API_SERVER_URL`).
pub async fn forward_api(
    c: &Cluster,
    api: &eniipam_kubeapi::FakeApiServer,
    instance_id: &str,
    node: &str,
) -> (PortForward, String) {
    // A node the test registered itself (with taints, say) stays as it is.
    if api.node(node).is_none() {
        api.add_node(node, &[]);
    }
    let target: SocketAddr = api
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("the API server's address");
    let forward = PortForward::start(
        &c.node_ns(instance_id),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        target,
    )
    .await
    .expect("API server port forward");
    let url = format!("http://{}", forward.listen_addr());
    (forward, url)
}

/// What a pod asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodOptions {
    /// Chain portmap with this hostPort → `ECHO_PORT`.
    pub host_port: Option<u16>,
    /// The `eniipam.io/ip` annotation.
    pub want_ip: Option<Ipv4Addr>,
}

/// A pod made through the CNI chain.
#[derive(Clone, Debug)]
pub struct CniPod {
    pub name: String,
    /// Its Kubernetes namespace (`K8S_POD_NAMESPACE`).
    pub namespace: String,
    pub container_id: String,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
    /// The ENI holding its IP, and that ENI's device index.
    pub eni: String,
    pub device_index: u32,
    /// The chain's result (what a runtime caches).
    pub result: Value,
    pub host_port: Option<u16>,
}

impl CniPod {
    /// Asserts the pod landed where the case wants it.
    pub fn assert_placed(&self, placement: Placement) {
        match placement {
            Placement::Eth0 => assert_eq!(
                self.device_index, 0,
                "{} ({}) should be on eth0, is on {} (device {})",
                self.name, self.ip, self.eni, self.device_index
            ),
            Placement::SecondaryEni => assert!(
                self.device_index > 0 && self.device_index != u32::MAX,
                "{} ({}) should be on a secondary ENI, is on {} (device {})",
                self.name,
                self.ip,
                self.eni,
                self.device_index
            ),
        }
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// An echo server on `ECHO_PORT` in `ns`.
pub fn serve(ns: &NetNs) -> EchoServer {
    EchoServer::start(ns, SocketAddr::from((Ipv4Addr::UNSPECIFIED, ECHO_PORT)))
        .expect("echo server")
}

/// One TCP exchange from `from` to `to:port` that must succeed; what the server saw.
pub async fn reaches(from: &NetNs, to: Ipv4Addr, port: u16) -> EchoReply {
    echo(
        from,
        SocketAddr::from((to, port)),
        &EchoOptions {
            timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{} → {to}:{port}: {e}", from.name()))
}

/// One TCP exchange that must get no answer (a dropped packet).
pub async fn dropped(from: &NetNs, to: Ipv4Addr, port: u16) {
    match echo(
        from,
        SocketAddr::from((to, port)),
        &EchoOptions {
            timeout: Duration::from_millis(800),
            ..Default::default()
        },
    )
    .await
    {
        Err(EchoError::Timeout(_)) => {}
        other => panic!(
            "{} → {to}:{port}: expected a drop, got {other:?}",
            from.name()
        ),
    }
}
