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

pub mod egress;
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

    /// The ENI holding `ip` and its device index, in EC2.
    pub fn eni_of(&self, ip: Ipv4Addr) -> (String, u32) {
        self.mock
            .network_interfaces()
            .into_iter()
            .find(|e| e.primary_ip == ip || e.secondary_ips.contains(&ip))
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

/// The real `eniipamd`, running in a node.
pub struct Daemon {
    pub instance_id: String,
    pub ns: NetNs,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    /// Run with `/proc/sys` read-only, as the DaemonSet's (unprivileged) daemon container sees it.
    read_only_sysctls: bool,
    child: Option<tokio::process::Child>,
    _imds: PortForward,
    _ec2: PortForward,
}

impl Daemon {
    /// Starts `eniipamd` on `instance_id` with `extra` variables on top of the harness's, and
    /// waits until it serves (its host rules are installed before that).
    pub async fn start(
        cluster: &Cluster,
        instance_id: &str,
        placement: Placement,
        extra: &[(&str, &str)],
    ) -> Daemon {
        Self::start_opts(cluster, instance_id, placement, extra, false).await
    }

    /// [`Daemon::start`]; with `read_only_sysctls`, `eniipamd` runs in a mount namespace where
    /// `/proc/sys` is read-only, as in the DaemonSet's daemon container: it cannot loosen
    /// `rp_filter` itself (the privileged init container's `--prepare-host` does).
    pub async fn start_opts(
        cluster: &Cluster,
        instance_id: &str,
        placement: Placement,
        extra: &[(&str, &str)],
        read_only_sysctls: bool,
    ) -> Daemon {
        let ns = cluster.node_ns(instance_id);
        let imds = cluster.lab.expose_imds(instance_id).await.expect("IMDS");
        let ec2_target: SocketAddr = cluster
            .mock
            .ec2_url()
            .trim_start_matches("http://")
            .parse()
            .expect("EC2 address");
        let ec2 = PortForward::start(&ns, SocketAddr::from(([127, 0, 0, 1], 0)), ec2_target)
            .await
            .expect("EC2 port forward");
        let dir = cluster.dir.path().join(instance_id);
        std::fs::create_dir_all(&dir).expect("daemon dir");
        let (socket, cache_dir) = (dir.join("eniipam.sock"), dir.join("cni-cache"));
        let s = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
        let mut env: Vec<(String, String)> = [
            ("AWS_ACCESS_KEY_ID", "AKIDDATAPATH".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "secret".to_owned()),
            ("ENIIPAM_CLUSTER_NAME", CLUSTER.to_owned()),
            ("ENIIPAM_REGION", cluster.mock.region().to_owned()),
            (
                "ENIIPAM_EC2_ENDPOINT",
                format!("http://{}", ec2.listen_addr()),
            ),
            (
                "ENIIPAM_IMDS_ENDPOINT",
                format!("http://{}", vpclab::IMDS_ADDR),
            ),
            ("ENIIPAM_STATE_PATH", s(&dir.join("state.db"))),
            ("ENIIPAM_SOCKET_PATH", s(&socket)),
            ("ENIIPAM_CNI_CACHE_DIR", s(&cache_dir)),
            ("ENIIPAM_METRICS_ADDR", "127.0.0.1:0".to_owned()),
            ("ENIIPAM_MANAGE_ENI_ROUTES", "true".to_owned()),
            ("ENIIPAM_LOG_FORMAT", "text".to_owned()),
            ("ENIIPAM_LOG_LEVEL", "info".to_owned()),
            ("ENIIPAM_EC2_MUTATING_QPS", "100".to_owned()),
            ("ENIIPAM_EC2_MUTATING_BURST", "100".to_owned()),
            ("ENIIPAM_EC2_DESCRIBE_QPS", "100".to_owned()),
            ("ENIIPAM_EC2_DESCRIBE_BURST", "100".to_owned()),
            ("NO_COLOR", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let (k, v) = placement.env();
        env.push((k.to_owned(), v.to_owned()));
        for (k, v) in extra {
            env.retain(|(key, _)| key != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        let mut d = Daemon {
            instance_id: instance_id.to_owned(),
            ns,
            socket,
            cache_dir,
            log: dir.join("eniipamd.log"),
            env,
            read_only_sysctls,
            child: None,
            _imds: imds,
            _ec2: ec2,
        };
        d.spawn().await;
        d
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let lines_before = self.log_text().lines().count();
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("--");
        if self.read_only_sysctls {
            command.args([
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$0\"",
            ]);
        }
        let child = command
            .arg(env!("CARGO_BIN_EXE_eniipamd"))
            .env_clear()
            .env("PATH", PATH)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting eniipamd");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let text = self.log_text();
            if text
                .lines()
                .skip(lines_before)
                .any(|l| l.contains("eniipamd ready"))
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("eniipamd exited ({status}):\n{}", tail(&text, 60));
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "eniipamd not ready within 60 s:\n{}",
                tail(&text, 60)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops it with SIGTERM (as the kubelet does) and waits for it.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(status) => {
                let status = status.expect("waiting for eniipamd");
                assert!(
                    status.success(),
                    "eniipamd stopped with {status}:\n{}",
                    self.tail()
                );
            }
            Err(_) => panic!("eniipamd did not stop within 30 s:\n{}", self.tail()),
        }
    }

    /// Starts it again after [`Daemon::stop`], with `changes` applied to its variables.
    pub async fn restart_with(&mut self, changes: &[(&str, &str)]) {
        self.stop().await;
        for (k, v) in changes {
            self.env.retain(|(key, _)| key != k);
            self.env.push(((*k).to_owned(), (*v).to_owned()));
        }
        self.spawn().await;
    }

    /// Runs `eniipamd <args>` once in the node with the daemon's variables (e.g.
    /// `--uninstall-host-rules`); returns stdout.
    pub async fn run_once(&self, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_eniipamd"))
            .args(args)
            .env_clear()
            .env("PATH", PATH)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .await
            .expect("eniipamd");
        assert!(
            out.status.success(),
            "eniipamd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn tail(&self) -> String {
        tail(&self.log_text(), 60)
    }

    /// `nft list table ip eniipam` in the node (`None`: no table).
    pub async fn rules(&self) -> Option<String> {
        self.ns
            .exec("nft", &["list", "table", "ip", "eniipam"])
            .await
            .ok()
    }

    /// The node's `ip rule` lines.
    pub async fn ip_rules(&self) -> String {
        self.ns.ip(&["rule", "show"]).await.expect("ip rule")
    }

    /// Runs the plugin chain's ADD for a new pod and waits until the node can route it.
    pub async fn add_pod(&self, cluster: &Cluster, name: &str, opts: PodOptions) -> CniPod {
        self.add_pod_in(cluster, "default", name, opts).await
    }

    /// [`Daemon::add_pod`] for a pod of Kubernetes namespace `namespace` (`K8S_POD_NAMESPACE`).
    pub async fn add_pod_in(
        &self,
        cluster: &Cluster,
        namespace: &str,
        name: &str,
        opts: PodOptions,
    ) -> CniPod {
        let pod = self.add_pod_now_in(cluster, namespace, name, opts).await;
        // The lab routes the new address to its ENI (the follower does too, every 200 ms); the
        // daemon's ENI table is in place before the ADD returns (the pool's readiness gate), this
        // only double-checks it.
        cluster.lab.sync().await.expect("lab sync");
        if pod.device_index > 0 {
            self.wait_for_table(pod.device_index + 1).await;
        }
        pod
    }

    /// Runs the plugin chain's ADD for a new pod and returns as soon as the chain has answered:
    /// no waiting for the lab or the node, as a container starts right after its sandbox's ADD.
    pub async fn add_pod_now(&self, cluster: &Cluster, name: &str, opts: PodOptions) -> CniPod {
        self.add_pod_now_in(cluster, "default", name, opts).await
    }

    async fn add_pod_now_in(
        &self,
        cluster: &Cluster,
        namespace: &str,
        name: &str,
        opts: PodOptions,
    ) -> CniPod {
        let ns = cluster
            .lab
            .add_namespace("pod")
            .await
            .expect("pod namespace");
        let container_id = format!("{name}-{:08x}", rand::random::<u32>());
        let mut pod = CniPod {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            container_id,
            ns,
            ip: Ipv4Addr::UNSPECIFIED,
            eni: String::new(),
            device_index: 0,
            result: Value::Null,
            host_port: opts.host_port,
        };
        let mut conf = self.plugin_conf(0);
        if let Some(ip) = opts.want_ip {
            conf["runtimeConfig"] =
                json!({"io.kubernetes.cri.pod-annotations": {"eniipam.io/ip": ip.to_string()}});
        }
        let out = self.cni(&target_bin("eniipam"), "ADD", &pod, &conf).await;
        let result: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("eniipam ADD answered {out:?}: {e}"));
        let address = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no IP in {result}"));
        pod.ip = address
            .trim_end_matches("/32")
            .parse()
            .unwrap_or_else(|_| panic!("bad address {address}"));
        pod.result = result;
        if let Some(host_port) = opts.host_port {
            let mut pm = self.plugin_conf(1);
            pm["runtimeConfig"] = json!({"portMappings": [
                {"hostPort": host_port, "containerPort": ECHO_PORT, "protocol": "tcp"}
            ]});
            pm["prevResult"] = pod.result.clone();
            let out = self.cni(Path::new(PORTMAP), "ADD", &pod, &pm).await;
            let chained: Value = serde_json::from_str(&out).expect("portmap's result");
            pod.result = chained;
        }
        let (eni, device_index) = cluster.eni_of(pod.ip);
        pod.eni = eni;
        pod.device_index = device_index;
        pod
    }

    /// Runs the chain's DEL (portmap first, as a runtime does) and deletes the pod's namespace.
    pub async fn del_pod(&self, pod: &CniPod) {
        if pod.host_port.is_some() {
            let mut pm = self.plugin_conf(1);
            pm["runtimeConfig"] = json!({"portMappings": [
                {"hostPort": pod.host_port, "containerPort": ECHO_PORT, "protocol": "tcp"}
            ]});
            pm["prevResult"] = pod.result.clone();
            self.cni(Path::new(PORTMAP), "DEL", pod, &pm).await;
        }
        let mut conf = self.plugin_conf(0);
        conf["prevResult"] = pod.result.clone();
        self.cni(&target_bin("eniipam"), "DEL", pod, &conf).await;
        let _ = pod.ns.ip(&["link", "del", "eth0"]).await;
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", pod.ns.name()])
            .output();
    }

    /// Waits until the node's table `table` has its default route (the daemon's RouteKeeper).
    pub async fn wait_for_table(&self, table: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let routes = self.ns.routes(Some(table)).await.unwrap_or_default();
            if routes.iter().any(|r| r.dst == vpclab::RouteDst::Default) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "table {table} has no default route after 20 s:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Plugin `index` of the shipped conflist as libcni hands it to the plugin: its own keys plus
    /// the list's `name` and `cniVersion`, with this daemon's socket and cache directory.
    fn plugin_conf(&self, index: usize) -> Value {
        let list: Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/deploy/10-eniipam.conflist"
            ))
            .expect("the shipped conflist"),
        )
        .expect("the shipped conflist is JSON");
        let mut conf = list["plugins"][index].clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        if index == 0 {
            assert_eq!(conf["type"], "eniipam");
            conf["socket"] = json!(self.socket);
            conf["cache_dir"] = json!(self.cache_dir);
        } else {
            assert_eq!(conf["type"], "portmap");
        }
        conf
    }

    /// Runs one CNI plugin in the node namespace, as a runtime would; returns its stdout.
    async fn cni(&self, binary: &Path, command: &str, pod: &CniPod, conf: &Value) -> String {
        let cni_path = format!(
            "{}:/usr/lib/cni",
            target_bin("eniipam").parent().expect("dir").display()
        );
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("--")
            .arg(binary)
            .env_clear()
            .env("PATH", PATH)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", pod.ns.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni_path)
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=uid-{}",
                    pod.namespace, pod.name, pod.container_id, pod.name
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a CNI plugin");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(conf.to_string().as_bytes())
            .await
            .expect("plugin stdin");
        drop(stdin);
        let out = child.wait_with_output().await.expect("plugin");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} {command} for {} failed ({}): {stdout} {}\ndaemon:\n{}",
            binary.display(),
            pod.name,
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.tail()
        );
        stdout
    }

    /// Adds kube-proxy's NodePort DNAT (iptables mode, as kube-proxy writes it into the nat
    /// table's PREROUTING through KUBE-SERVICES → KUBE-NODEPORTS → a service endpoint chain;
    /// `externalTrafficPolicy: Local`, so no masquerade) towards `pod:ECHO_PORT`.
    pub async fn add_node_port(&self, pod: Ipv4Addr) {
        let rules = format!(
            "*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SEP-DATAPATH - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/echo\" -m tcp --dport {NODE_PORT} -j KUBE-SEP-DATAPATH
-A KUBE-SEP-DATAPATH -p tcp -m comment --comment \"default/echo\" -m tcp -j DNAT --to-destination {pod}:{ECHO_PORT}
COMMIT
"
        );
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .args(["--", "iptables-restore", "--noflush"])
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("iptables-restore");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(rules.as_bytes()).await.expect("stdin");
        drop(stdin);
        let out = child.wait_with_output().await.expect("iptables-restore");
        assert!(
            out.status.success(),
            "iptables-restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `iptables-save -t nat` in the node.
    pub async fn iptables_nat(&self) -> String {
        self.ns
            .exec("iptables-save", &["-t", "nat"])
            .await
            .expect("iptables-save")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
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
