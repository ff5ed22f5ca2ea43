//! NetworkPolicy on the data path (issue 28): the real `eniipamd` with `ENIIPAM_NETWORK_POLICY=true`
//! in a lab node, watching NetworkPolicies, pods and namespaces in the API-server double through a
//! port forward into the node; pods that exist in the double (labels, named container ports) before
//! their CNI ADD and get their `status.podIPs` after it, as the kubelet writes them, so the other
//! nodes learn the address; TCP and UDP servers on 80 and 81 in every pod; and the probe matrix
//! (every client pod → every server pod, TCP and UDP, 80 and 81) compared cell by cell with the
//! policy model's `connection_allowed`. The probes, their sweeps and rounds are in [`probe`].

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol, connection_allowed};
use eniipam_kubeapi::{FakeApiServer, pod_json};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use vpclab::{NetNs, PortForward};

mod probe;
pub use probe::*;

use super::{Cluster as Lab, CniPod, Daemon, Placement, PodOptions};
use crate::bins::target_bin;

/// The ports every pod serves, over TCP and UDP.
pub const PORTS: [u16; 2] = [80, 81];
/// The protocols probed. SCTP is not: the lab's kernel may lack it (the model's and the nft
/// tests cover its rendering).
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];
/// How long a probe waits for its answer: under 1 s, so an allowed TCP probe connects on its first
/// SYN (the kernel resends at 1 s) and a denied one is known quickly.
pub const PROBE_WAIT: Duration = Duration::from_millis(800);

/// A node's `eniipamd` with NetworkPolicy enforcement on, and the port forward that lets it reach
/// the API-server double from inside the node.
pub struct PolicyDaemon {
    pub daemon: Daemon,
    /// The node's name in the API server (`ENIIPAM_NODE_NAME`, the pods' `spec.nodeName`).
    pub node: String,
    _forward: PortForward,
}

impl Deref for PolicyDaemon {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl DerefMut for PolicyDaemon {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

/// A pod of the policy world: its place in the API server and its sandbox.
#[derive(Clone, Debug)]
pub struct PolicyPod {
    /// `namespace/name`.
    pub key: String,
    /// The API server's name of its node.
    pub node: String,
    pub cni: CniPod,
}

/// The pod as the API server holds it: labelled `pod=<name>`, bound to `node`, with upstream's
/// named container ports (`serve-<port>-<tcp|udp|sctp>`) on 80 and 81.
pub fn pod_object(namespace: &str, name: &str, node: &str) -> Value {
    let mut pod = pod_json(
        namespace,
        name,
        &format!("uid-{namespace}-{name}"),
        node,
        "Pending",
    );
    pod["metadata"]["labels"] = json!({"pod": name});
    let mut ports = Vec::new();
    for port in PORTS {
        for protocol in ["TCP", "UDP", "SCTP"] {
            ports.push(json!({
                "name": format!("serve-{port}-{}", protocol.to_lowercase()),
                "containerPort": port,
                "protocol": protocol,
            }));
        }
    }
    pod["spec"]["containers"][0]["ports"] = json!(ports);
    pod
}

impl PolicyDaemon {
    /// Registers node `node` (instance `instance_id`) in `api` and starts its `eniipamd` with
    /// NetworkPolicy enforcement on, a released IP reusable at once (so a test can hand a deleted
    /// pod's address to a new one).
    pub async fn start(
        c: &Lab,
        api: &FakeApiServer,
        instance_id: &str,
        node: &str,
        placement: Placement,
    ) -> PolicyDaemon {
        Self::start_with(c, api, instance_id, node, placement, &[]).await
    }

    /// [`Self::start`] with `extra` variables after the harness's (a later one wins).
    pub async fn start_with(
        c: &Lab,
        api: &FakeApiServer,
        instance_id: &str,
        node: &str,
        placement: Placement,
        extra: &[(&str, &str)],
    ) -> PolicyDaemon {
        let (forward, url) = super::forward_api(c, api, instance_id, node).await;
        let mut env = vec![
            ("ENIIPAM_NETWORK_POLICY", "true"),
            ("ENIIPAM_API_SERVER_URL", url.as_str()),
            ("ENIIPAM_API_SERVER_GC", "false"),
            ("ENIIPAM_NODE_CONDITION", "false"),
            ("ENIIPAM_NODE_NAME", node),
            ("ENIIPAM_REUSE_COOLDOWN_SECS", "0"),
        ];
        env.extend_from_slice(extra);
        let daemon = Daemon::start(c, instance_id, placement, &env).await;
        PolicyDaemon {
            daemon,
            node: node.to_owned(),
            _forward: forward,
        }
    }

    /// Puts pod `namespace/name` in `api` ([`pod_object`]), runs the CNI ADD for it (asking for
    /// `want_ip` when given) and, once the plugin has answered, writes its `status.podIP(s)` as
    /// the kubelet does. Returns as soon as that is written: no waiting for the lab's fabric.
    pub async fn add_pod(
        &self,
        c: &Lab,
        api: &FakeApiServer,
        namespace: &str,
        name: &str,
        want_ip: Option<Ipv4Addr>,
    ) -> PolicyPod {
        let pod = self
            .add_pod_unposted(c, api, namespace, name, want_ip)
            .await;
        self.post_ip(api, &pod);
        pod
    }

    /// [`Self::add_pod`] without the kubelet's `status.podIPs`: the API server still shows the pod
    /// `Pending` with no address (a kubelet that has not written it yet, or an API server slow to
    /// take it). [`Self::post_ip`] writes it.
    pub async fn add_pod_unposted(
        &self,
        c: &Lab,
        api: &FakeApiServer,
        namespace: &str,
        name: &str,
        want_ip: Option<Ipv4Addr>,
    ) -> PolicyPod {
        api.put_pod(pod_object(namespace, name, &self.node));
        let opts = PodOptions {
            want_ip,
            ..PodOptions::default()
        };
        let cni = self.daemon.add_pod_now_in(c, namespace, name, opts).await;
        PolicyPod {
            key: format!("{namespace}/{name}"),
            node: self.node.clone(),
            cni,
        }
    }

    /// Writes `pod`'s `status.podIP(s)` as the kubelet does once the sandbox is up.
    pub fn post_ip(&self, api: &FakeApiServer, pod: &PolicyPod) {
        let mut object = pod_object(&pod.cni.namespace, &pod.cni.name, &self.node);
        object["status"] = json!({
            "phase": "Running",
            "podIP": pod.cni.ip.to_string(),
            "podIPs": [{"ip": pod.cni.ip.to_string()}],
        });
        api.put_pod(object);
    }

    /// Deletes a pod as the kubelet does: the CNI DEL, then the object.
    pub async fn delete_pod(&self, api: &FakeApiServer, pod: &PolicyPod) {
        self.daemon.del_pod(&pod.cni).await;
        api.delete_pod(&pod.cni.namespace, &pod.cni.name);
    }

    /// The chains of the node's table `inet eniipam_policy` (none when there is no table).
    pub async fn chains(&self) -> std::collections::BTreeSet<String> {
        let Ok(json) = self
            .ns
            .nft_json(&["list", "table", "inet", "eniipam_policy"])
            .await
        else {
            return Default::default();
        };
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["chain"]["name"].as_str())
            .map(str::to_owned)
            .collect()
    }

    /// `nft list table inet eniipam_policy` in the node (`None`: no table).
    pub async fn policy_table(&self) -> Option<String> {
        self.ns
            .exec("nft", &["list", "table", "inet", "eniipam_policy"])
            .await
            .ok()
    }

    /// This daemon's `/metrics` text, read inside the node, from the address its last start
    /// logged (each start binds a port of its own).
    pub async fn metrics_text(&self) -> String {
        let log = self.log_text();
        let addr = log
            .split_whitespace()
            .rev()
            .find_map(|w| w.strip_prefix("metrics="))
            .unwrap_or_else(|| panic!("no metrics address in the daemon's log:\n{}", self.tail()));
        self.ns
            .exec("curl", &["-sf", &format!("http://{addr}/metrics")])
            .await
            .expect("curl /metrics")
    }

    /// A value of this daemon's `/metrics` (`None`: not exported).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        self.metrics_text()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// This daemon's policy syncs, by outcome (`eniipam_network_policy_syncs_total`), from one
    /// reading of its `/metrics`.
    pub async fn syncs(&self) -> Syncs {
        let text = self.metrics_text().await;
        let kind = |kind: &str| {
            let line = format!("eniipam_network_policy_syncs_total{{kind=\"{kind}\"}}");
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(line.as_str())?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(0.0)
        };
        Syncs {
            full: kind("full"),
            update: kind("update"),
            unchanged: kind("unchanged"),
        }
    }

    /// `eniipamctl --json policy <pod>` against this node's daemon.
    pub fn ctl_policy(&self, pod: &str) -> Value {
        let out = std::process::Command::new(target_bin("eniipamctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(["--json", "policy", pod])
            .output()
            .expect("eniipamctl runs");
        assert!(
            out.status.success(),
            "eniipamctl policy {pod}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "eniipamctl policy {pod} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

/// A daemon's policy syncs that reached the kernel, by kind (0 before the first of a kind).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Syncs {
    /// The table loaded whole.
    pub full: f64,
    /// Only the changes sent.
    pub update: f64,
    /// The kernel already held the table.
    pub unchanged: f64,
}

impl Syncs {
    /// Every sync that put the daemon's view in force.
    pub fn in_force(&self) -> f64 {
        self.full + self.update + self.unchanged
    }
}

/// The host veth of a pod, from the plugin's result (the interface without a sandbox).
pub fn host_veth(pod: &CniPod) -> String {
    pod.result["interfaces"]
        .as_array()
        .and_then(|ifs| {
            ifs.iter()
                .find(|i| i.get("sandbox").is_none_or(Value::is_null))
        })
        .and_then(|i| i["name"].as_str())
        .unwrap_or_else(|| panic!("no host interface in {}", pod.result))
        .to_owned()
}

/// TCP and UDP servers on [`PORTS`] in one pod: a TCP client gets `ok\n`, a datagram comes back.
/// Stopped when dropped.
pub struct Servers(Vec<JoinHandle<()>>);

impl Drop for Servers {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Starts [`Servers`] in `ns`; they listen before this returns.
pub async fn serve_ports(ns: &NetNs) -> Servers {
    let (tcp, udp) = ns
        .run_async(|| {
            let tcp: Vec<std::net::TcpListener> = PORTS
                .iter()
                .map(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).expect("tcp bind"))
                .collect();
            let udp: Vec<std::net::UdpSocket> = PORTS
                .iter()
                .map(|p| std::net::UdpSocket::bind(("0.0.0.0", *p)).expect("udp bind"))
                .collect();
            (tcp, udp)
        })
        .await
        .expect("sockets in the pod");
    let mut tasks = Vec::new();
    for l in tcp {
        l.set_nonblocking(true).expect("nonblocking");
        let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
        tasks.push(tokio::spawn(async move {
            while let Ok((mut conn, _)) = l.accept().await {
                let _ = conn.write_all(b"ok\n").await;
            }
        }));
    }
    for u in udp {
        u.set_nonblocking(true).expect("nonblocking");
        let u = tokio::net::UdpSocket::from_std(u).expect("tokio socket");
        tasks.push(tokio::spawn(async move {
            let mut buf = [0u8; 64];
            while let Ok((n, from)) = u.recv_from(&mut buf).await {
                let _ = u.send_to(&buf[..n], from).await;
            }
        }));
    }
    Servers(tasks)
}

/// The pods as the policy model sees them: namespaces labelled `ns=<name>` (and
/// `kubernetes.io/metadata.name`), pods labelled `pod=<name>` with their lab addresses and named
/// ports, and `policies`.
pub fn model(pods: &BTreeMap<String, PolicyPod>, policies: &[Value]) -> Cluster {
    let mut c = Cluster::default();
    for pod in pods.values() {
        let ns = pod.cni.namespace.clone();
        c.namespaces.entry(ns.clone()).or_insert_with(|| {
            BTreeMap::from([
                ("ns".to_owned(), ns.clone()),
                ("kubernetes.io/metadata.name".to_owned(), ns.clone()),
            ])
        });
        let mut ports = Vec::new();
        for port in PORTS {
            for (protocol, p) in [
                (Protocol::Tcp, "tcp"),
                (Protocol::Udp, "udp"),
                (Protocol::Sctp, "sctp"),
            ] {
                ports.push(NamedPort {
                    name: format!("serve-{port}-{p}"),
                    protocol,
                    port,
                });
            }
        }
        c.pods.push(PodView {
            namespace: ns,
            name: pod.cni.name.clone(),
            labels: BTreeMap::from([("pod".to_owned(), pod.cni.name.clone())]),
            ips: vec![IpAddr::V4(pod.cni.ip)],
            host_network: false,
            ports,
        });
    }
    c.policies = policies
        .iter()
        .map(|p| serde_json::from_value::<NetworkPolicy>(p.clone()).expect("a NetworkPolicy"))
        .collect();
    c
}

/// Every cell between `pods`: each client, each server, [`PROTOCOLS`] × [`PORTS`].
pub fn all_cells(pods: &BTreeMap<String, PolicyPod>) -> Vec<Cell> {
    let mut cells = Vec::new();
    for client in pods.keys() {
        for server in pods.keys() {
            for protocol in PROTOCOLS {
                for port in PORTS {
                    cells.push(Cell {
                        client: client.clone(),
                        server: server.clone(),
                        protocol,
                        port,
                    });
                }
            }
        }
    }
    cells
}

/// What the model says of each cell (a pod reaching itself never leaves its namespace: allowed).
pub fn expected(cluster: &Cluster, cells: &[Cell]) -> BTreeMap<Cell, bool> {
    let view = |key: &str| {
        let (ns, name) = key.split_once('/').expect("namespace/name");
        cluster
            .pods
            .iter()
            .find(|p| p.namespace == ns && p.name == name)
            .unwrap_or_else(|| panic!("{key} is not in the model"))
    };
    cells
        .iter()
        .map(|cell| {
            let allowed = cell.client == cell.server
                || connection_allowed(
                    cluster,
                    view(&cell.client),
                    view(&cell.server),
                    cell.protocol,
                    cell.port,
                );
            (cell.clone(), allowed)
        })
        .collect()
}
