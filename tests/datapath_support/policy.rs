//! NetworkPolicy on the data path (issue 28): the real `eniipamd` with `ENIIPAM_NETWORK_POLICY=true`
//! in a lab node, watching NetworkPolicies, pods and namespaces in the API-server double through a
//! port forward into the node; pods that exist in the double (labels, named container ports) before
//! their CNI ADD and get their `status.podIPs` after it, as the kubelet writes them, so the other
//! nodes learn the address; TCP and UDP servers on 80 and 81 in every pod; and the probe matrix
//! (every client pod → every server pod, TCP and UDP, 80 and 81) compared cell by cell with the
//! policy model's `connection_allowed`.
//!
//! Probes run all at once on the test's runtime, their sockets made inside the client pods'
//! namespaces; a probe is denied when the SYN or datagram gets no answer within [`PROBE_WAIT`], or
//! sooner in a sweep of cells ([`probe_cells`]) once the answers have settled. Each
//! probe binds a source port of its own from a cycle of 40,000, so no probe reuses a 5-tuple whose
//! conntrack entry (30 s for UDP) a probe before a policy change left: an entry of an allowed flow
//! would let a now-denied one through as `established`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol, connection_allowed};
use eniipam_kubeapi::{FakeApiServer, pod_json};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use vpclab::{NetNs, PortForward};

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

/// The next probe's source port: a cycle over 20000..60000.
fn source_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    20_000 + (NEXT.fetch_add(1, Ordering::Relaxed) % 40_000) as u16
}

/// A client socket made in a pod's namespace, bound to its own source port.
enum ClientSocket {
    Tcp(tokio::net::TcpSocket),
    Udp(std::net::UdpSocket),
}

impl ClientSocket {
    /// Made on a thread inside the pod's namespace (the socket stays there).
    fn new(protocol: Protocol) -> ClientSocket {
        let local = SocketAddr::from((Ipv4Addr::UNSPECIFIED, source_port()));
        match protocol {
            Protocol::Tcp => {
                let s = tokio::net::TcpSocket::new_v4().expect("tcp socket");
                s.set_reuseaddr(true).expect("SO_REUSEADDR");
                s.bind(local).expect("tcp client bind");
                ClientSocket::Tcp(s)
            }
            Protocol::Udp => {
                let s = std::net::UdpSocket::bind(local).expect("udp client bind");
                s.set_nonblocking(true).expect("nonblocking");
                ClientSocket::Udp(s)
            }
            Protocol::Sctp => unreachable!("SCTP is not probed"),
        }
    }

    /// One attempt: a TCP handshake and the server's line, or a datagram echoed back, within `wait`.
    async fn probe(self, to: SocketAddr, wait: Duration) -> bool {
        let attempt = async move {
            match self {
                ClientSocket::Tcp(s) => {
                    let mut conn = s.connect(to).await?;
                    let mut line = [0u8; 3];
                    conn.read_exact(&mut line).await?;
                    Ok::<bool, std::io::Error>(&line == b"ok\n")
                }
                ClientSocket::Udp(s) => {
                    let s = tokio::net::UdpSocket::from_std(s)?;
                    s.connect(to).await?;
                    s.send(b"probe").await?;
                    let mut buf = [0u8; 16];
                    let n = s.recv(&mut buf).await?;
                    Ok(&buf[..n] == b"probe")
                }
            }
        };
        matches!(tokio::time::timeout(wait, attempt).await, Ok(Ok(true)))
    }
}

/// One probe from the pod whose namespace is `from` to any address (a Service's, say): the
/// handshake or the echo within [`PROBE_WAIT`].
pub async fn probe_address(from: &NetNs, to: SocketAddr, protocol: Protocol) -> bool {
    let socket = from
        .run_async(move || ClientSocket::new(protocol))
        .await
        .expect("a client socket in the pod");
    socket.probe(to, PROBE_WAIT).await
}

/// One probe to run: from a client (its key), to a server (its key and address).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cell {
    pub client: String,
    pub server: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// Runs every `cells` probe at once, `wait` each; each cell's outcome (connected or not).
pub async fn probe_cells(
    pods: &BTreeMap<String, PolicyPod>,
    cells: &[Cell],
    wait: Duration,
) -> BTreeMap<Cell, bool> {
    // Sockets are made per client, on one thread inside its namespace.
    let mut by_client: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
    for cell in cells {
        by_client.entry(&cell.client).or_default().push(cell);
    }
    let made = futures::future::join_all(by_client.into_iter().map(|(client, cells)| {
        let protocols: Vec<Protocol> = cells.iter().map(|c| c.protocol).collect();
        let ns = pods[client].cni.ns.clone();
        async move {
            let sockets = ns
                .run_async(move || {
                    protocols
                        .into_iter()
                        .map(ClientSocket::new)
                        .collect::<Vec<_>>()
                })
                .await
                .expect("client sockets in the pod");
            cells.into_iter().zip(sockets).collect::<Vec<_>>()
        }
    }))
    .await;
    // One sweep (as `network_policy_support::sweep` does it): every probe starts now, and once the
    // last answer has come the silent ones get `settle` more before they count as denials (a cell
    // wrongly allowed answers along the same paths as the allowed ones; a sweep where nothing
    // answers waits the whole `wait`).
    let start = tokio::time::Instant::now();
    let (over, ended) = tokio::sync::watch::channel(false);
    let mut probes: futures::stream::FuturesUnordered<_> = made
        .into_iter()
        .flatten()
        .map(|(cell, socket)| {
            let to = SocketAddr::from((pods[&cell.server].cni.ip, cell.port));
            let mut ended = ended.clone();
            async move {
                let got = tokio::select! {
                    got = socket.probe(to, wait) => got,
                    _ = ended.wait_for(|over| *over) => false,
                };
                (cell.clone(), got)
            }
        })
        .collect();
    let mut got = BTreeMap::new();
    let mut last = None;
    loop {
        let deadline = start + settle(last, wait);
        tokio::select! {
            next = futures::StreamExt::next(&mut probes) => match next {
                Some((cell, ok)) => {
                    if ok {
                        last = Some(start.elapsed());
                    }
                    got.insert(cell, ok);
                }
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => {
                let _ = over.send(true);
                while let Some((cell, ok)) = futures::StreamExt::next(&mut probes).await {
                    got.insert(cell, ok);
                }
                break;
            }
        }
    }
    got
}

/// How long after its start a sweep of probes waits when its last answer came `last` after the
/// start: three times as long, and 250 ms more, at least 400 ms, never past `wait` (all of `wait`
/// when nothing answered). A loaded machine slows the answers and lengthens the wait with them.
fn settle(last: Option<Duration>, wait: Duration) -> Duration {
    match last {
        None => wait,
        Some(t) => (t * 3 + Duration::from_millis(250))
            .max(Duration::from_millis(400))
            .min(wait),
    }
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

pub fn verb(allowed: bool) -> &'static str {
    if allowed { "connects" } else { "is denied" }
}

/// The cells where `got` differs from `want`, in words.
pub fn differences(
    pods: &BTreeMap<String, PolicyPod>,
    got: &BTreeMap<Cell, bool>,
    want: &BTreeMap<Cell, bool>,
) -> Vec<String> {
    want.iter()
        .filter(|(cell, w)| got.get(*cell) != Some(*w))
        .map(|(cell, w)| {
            let (c, s) = (&pods[&cell.client], &pods[&cell.server]);
            format!(
                "{} ({}, {}) → {} ({}, {}) {:?}/{}: kernel {}, model {}",
                cell.client,
                c.cni.ip,
                c.node,
                cell.server,
                s.cni.ip,
                s.node,
                cell.protocol,
                cell.port,
                got.get(cell).map_or("unprobed", |g| verb(*g)),
                verb(*w)
            )
        })
        .collect()
}

/// Probes `cells` until every one gives what `want` says, for up to `within`: the daemons put a
/// change in force asynchronously, and the matrix itself is what must come out. Returns how many
/// rounds it took; panics naming every differing cell of the last round.
pub async fn until_matrix(
    what: &str,
    pods: &BTreeMap<String, PolicyPod>,
    cells: &[Cell],
    want: &BTreeMap<Cell, bool>,
    within: Duration,
    logs: impl Fn() -> String,
) -> u32 {
    let deadline = tokio::time::Instant::now() + within;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let got = probe_cells(pods, cells, PROBE_WAIT).await;
        let wrong = differences(pods, &got, want);
        if wrong.is_empty() {
            return rounds;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{what}: {} of {} cells differ from the model after {rounds} rounds ({within:?}):\n{}\n{}",
                wrong.len(),
                cells.len(),
                wrong.join("\n"),
                logs()
            );
        }
    }
}
