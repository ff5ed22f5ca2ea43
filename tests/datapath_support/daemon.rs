//! The real `eniipamd` in a lab node (split from the harness's `mod.rs`): its environment, its start,
//! the pods it serves through the real plugin, and its end.

use super::*;

/// The real `eniipamd`, running in a node.
pub struct Daemon {
    pub instance_id: String,
    pub ns: NetNs,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub log: PathBuf,
    pub(super) env: Vec<(String, String)>,
    /// Run with `/proc/sys` read-only, as the DaemonSet's (unprivileged) daemon container sees it.
    pub(super) read_only_sysctls: bool,
    pub(super) child: Option<tokio::process::Child>,
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

    pub(super) async fn spawn(&mut self) {
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

    /// Kills it with SIGKILL, as a crash or an OOM kill does (nothing is cleaned up: what it put
    /// in the kernel stays), and waits for it; [`Daemon::start_again`] starts it again.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts it again after [`Daemon::kill`] or [`Daemon::stop`], with the same variables, and
    /// waits until it serves.
    pub async fn start_again(&mut self) {
        self.spawn().await;
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

    pub(super) async fn add_pod_now_in(
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

    /// The plugin's ADD in the IPAM role, as a parent plugin that wires the pod itself (Calico's
    /// way: `"ipam": {"type": "eniipam"}`) runs it, with the parent's configuration and the
    /// runtime's variables: eniipam wires nothing. Returns the pod (its namespace made, nothing in
    /// it) and the plugin's result.
    pub async fn add_pod_ipam_role(
        &self,
        cluster: &Cluster,
        namespace: &str,
        name: &str,
    ) -> CniPod {
        let ns = cluster
            .lab
            .add_namespace("pod")
            .await
            .expect("pod namespace");
        let mut pod = CniPod {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            container_id: format!("{name}-{:08x}", rand::random::<u32>()),
            ns,
            ip: Ipv4Addr::UNSPECIFIED,
            eni: String::new(),
            device_index: 0,
            result: Value::Null,
            host_port: None,
        };
        let main = self.plugin_conf(0);
        let conf = json!({
            "cniVersion": main["cniVersion"],
            "name": main["name"],
            "type": "calico",
            "ipam": {"type": "eniipam", "socket": self.socket, "cache_dir": self.cache_dir},
        });
        let out = self.cni(&target_bin("eniipam"), "ADD", &pod, &conf).await;
        pod.result = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("eniipam ADD (IPAM role) answered {out:?}: {e}"));
        let address = pod.result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no IP in {}", pod.result));
        pod.ip = address
            .trim_end_matches("/32")
            .parse()
            .unwrap_or_else(|_| panic!("bad address {address}"));
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
    pub(super) fn plugin_conf(&self, index: usize) -> Value {
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
    pub(super) async fn cni(
        &self,
        binary: &Path,
        command: &str,
        pod: &CniPod,
        conf: &Value,
    ) -> String {
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
