//! Issue 28, the kernel half: NetworkPolicy compiled by the model (`eniipam::network_policy`),
//! rendered by `network_policy::nft` into table `inet eniipam_policy`, loaded with the daemon's own
//! `host::Nft` inside a "node" network namespace, and probed with real traffic.
//!
//! The world is upstream's (as in `tests/network_policy_cases.rs`): namespaces `x`, `y`, `z`, pods
//! `a`, `b`, `c` in each, each pod a network namespace on a host veth `eni<ns><pod>` of the node
//! (address /32, default route via 169.254.1.1 on the veth, as the plugin wires pods), serving TCP
//! and UDP on 80 and 81. Each case probes every client × server × {TCP, UDP} × {80, 81} from inside
//! the client's namespace and asserts the observed matrix equals the model's `connection_allowed`
//! cell by cell (a pod reaching itself never leaves its namespace: always allowed). Then a policy
//! change, re-rendered and re-applied, must take effect.
//!
//! Needs root, `ip` and `nft`; skipped with a notice otherwise, a failure under `CI=true`.
//! Namespaces are deleted on drop, also when a case fails.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use eniipam::host::Nft;
use eniipam::network_policy::nft::{LocalPod, render};
use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol, compile, connection_allowed};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sched::CloneFlags;
use serde_json::{Value, json};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];
/// How long a probe waits: a dropped SYN or datagram is a denial after this.
const PROBE_WAIT: Duration = Duration::from_millis(1500);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn ip_of(ns: &str, pod: &str) -> Ipv4Addr {
    let n = NAMESPACES.iter().position(|x| *x == ns).unwrap() as u8;
    let p = PODS.iter().position(|x| *x == pod).unwrap() as u8;
    Ipv4Addr::new(10, 1, n, 10 + p)
}

fn world(policies: &[Value]) -> Cluster {
    let mut c = Cluster::default();
    for ns in NAMESPACES {
        c.namespaces.insert(
            ns.into(),
            BTreeMap::from([
                ("ns".to_owned(), ns.to_owned()),
                ("kubernetes.io/metadata.name".to_owned(), ns.to_owned()),
            ]),
        );
        for pod in PODS {
            let mut ports = Vec::new();
            for port in PORTS {
                for (protocol, p) in [(Protocol::Tcp, "tcp"), (Protocol::Udp, "udp")] {
                    ports.push(NamedPort {
                        name: format!("serve-{port}-{p}"),
                        protocol,
                        port,
                    });
                }
            }
            c.pods.push(PodView {
                namespace: ns.into(),
                name: pod.into(),
                labels: BTreeMap::from([("pod".to_owned(), pod.to_owned())]),
                ips: vec![IpAddr::V4(ip_of(ns, pod))],
                host_network: false,
                ports,
            });
        }
    }
    c.policies = policies
        .iter()
        .map(|p| serde_json::from_value::<NetworkPolicy>(p.clone()).expect("a NetworkPolicy"))
        .collect();
    c
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn veth(ns: &str, pod: &str) -> String {
    format!("eni{ns}{pod}")
}

fn run(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    let mut pipe = child.stdin.take().expect("stdin");
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes()).expect("stdin");
    }
    drop(pipe);
    let out = child.wait_with_output().expect("wait");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Enters the namespace at `/run/netns/<name>` on the current thread.
fn enter(name: &str) {
    let f = std::fs::File::open(format!("/run/netns/{name}")).expect("netns file");
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).expect("setns");
}

/// The node namespace and the nine pod namespaces, with their servers; all deleted on drop.
struct Lab {
    node: String,
    /// `ns/pod` → its namespace's name.
    pods: BTreeMap<String, String>,
    stop: Arc<AtomicBool>,
    servers: Vec<std::thread::JoinHandle<()>>,
}

impl Lab {
    fn new(test: &str) -> Option<Lab> {
        for tool in ["ip", "nft"] {
            if run(&["which", tool], None).is_err() {
                mockcloud::ci::skip(test, &format!("`{tool}` is not installed"));
                return None;
            }
        }
        let base = format!(
            "eniipam-npn-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let node = format!("{base}-node");
        if let Err(e) = run(&["ip", "netns", "add", &node], None) {
            mockcloud::ci::skip(test, &format!("cannot create network namespaces: {e}"));
            return None;
        }
        let mut lab = Lab {
            node,
            pods: BTreeMap::new(),
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
        };
        let mut node_batch = vec!["link set lo up".to_owned()];
        for ns in NAMESPACES {
            for pod in PODS {
                let name = format!("{base}-{ns}{pod}");
                run(&["ip", "netns", "add", &name], None).expect("pod netns");
                lab.pods.insert(format!("{ns}/{pod}"), name.clone());
                let v = veth(ns, pod);
                node_batch.extend([
                    format!("link add {v} type veth peer name eth0 netns {name}"),
                    format!("addr add 169.254.1.1/32 dev {v}"),
                    format!("link set {v} up"),
                    format!("route add {}/32 dev {v} scope link", ip_of(ns, pod)),
                ]);
            }
        }
        run(
            &["ip", "-n", &lab.node, "-batch", "-"],
            Some(&node_batch.join("\n")),
        )
        .expect("node links");
        run(
            &[
                "ip",
                "netns",
                "exec",
                &lab.node,
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
            None,
        )
        .expect("ip_forward");
        for ns in NAMESPACES {
            for pod in PODS {
                let name = lab.pods[&format!("{ns}/{pod}")].clone();
                let batch = [
                    "link set lo up".to_owned(),
                    format!("addr add {}/32 dev eth0", ip_of(ns, pod)),
                    "link set eth0 up".to_owned(),
                    "route add 169.254.1.1 dev eth0 scope link".to_owned(),
                    "route add default via 169.254.1.1 dev eth0".to_owned(),
                ];
                run(&["ip", "-n", &name, "-batch", "-"], Some(&batch.join("\n")))
                    .expect("pod links");
                lab.serve(&name);
            }
        }
        Some(lab)
    }

    /// TCP and UDP on 80 and 81 inside pod namespace `name`, until the lab is dropped.
    fn serve(&mut self, name: &str) {
        let (name, stop) = (name.to_owned(), self.stop.clone());
        let (tx, rx) = mpsc::channel();
        self.servers.push(std::thread::spawn(move || {
            enter(&name);
            let tcp: Vec<TcpListener> = PORTS
                .iter()
                .map(|p| TcpListener::bind(("0.0.0.0", *p)).expect("tcp bind"))
                .collect();
            let udp: Vec<UdpSocket> = PORTS
                .iter()
                .map(|p| UdpSocket::bind(("0.0.0.0", *p)).expect("udp bind"))
                .collect();
            for l in &tcp {
                l.set_nonblocking(true).unwrap();
            }
            for u in &udp {
                u.set_nonblocking(true).unwrap();
            }
            tx.send(()).unwrap();
            while !stop.load(Ordering::Acquire) {
                let mut fds: Vec<PollFd<'_>> = tcp
                    .iter()
                    .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
                    .chain(
                        udp.iter()
                            .map(|u| PollFd::new(u.as_fd(), PollFlags::POLLIN)),
                    )
                    .collect();
                if poll(&mut fds, 20u16).unwrap_or(0) == 0 {
                    continue;
                }
                for l in &tcp {
                    while let Ok((mut conn, _)) = l.accept() {
                        let _ = conn.write_all(b"ok\n");
                    }
                }
                let mut buf = [0u8; 64];
                for u in &udp {
                    while let Ok((n, from)) = u.recv_from(&mut buf) {
                        let _ = u.send_to(&buf[..n], from);
                    }
                }
            }
        }));
        rx.recv().expect("the server started");
    }

    /// Loads the ruleset for `cluster`'s policies into the node, with the daemon's `Nft`.
    fn apply(&self, cluster: &Cluster) -> String {
        let pods: Vec<LocalPod> = cluster
            .pods
            .iter()
            .map(|p| LocalPod {
                name: format!("{}/{}", p.namespace, p.name),
                veth: veth(&p.namespace, &p.name),
                compiled: compile(cluster, p),
            })
            .collect();
        let ruleset = render(&pods).expect("render");
        assert!(
            ruleset.not_enforced.is_empty(),
            "{:?}",
            ruleset.not_enforced
        );
        let (node, script) = (self.node.clone(), ruleset.script.clone());
        std::thread::spawn(move || {
            enter(&node);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(Nft::default().apply(&script))
        })
        .join()
        .expect("the nft thread")
        .unwrap_or_else(|e| panic!("loading the ruleset: {e}\n{}", ruleset.script));
        ruleset.script
    }

    /// Every cell: client → server, protocol, port → connected.
    fn probe_all(&self) -> BTreeMap<(String, String, Protocol, u16), bool> {
        let mut clients = Vec::new();
        for (client, name) in &self.pods {
            let (client, name) = (client.clone(), name.clone());
            clients.push(std::thread::spawn(move || {
                enter(&name);
                // Threads spawned here share this thread's namespace.
                let mut probes = Vec::new();
                for ns in NAMESPACES {
                    for pod in PODS {
                        for protocol in [Protocol::Tcp, Protocol::Udp] {
                            for port in PORTS {
                                let to = SocketAddr::from((ip_of(ns, pod), port));
                                let key = (client.clone(), format!("{ns}/{pod}"), protocol, port);
                                probes.push(std::thread::spawn(move || (key, probe(protocol, to))));
                            }
                        }
                    }
                }
                probes
                    .into_iter()
                    .map(|p| p.join().expect("probe"))
                    .collect::<Vec<_>>()
            }));
        }
        clients
            .into_iter()
            .flat_map(|c| c.join().expect("client"))
            .collect()
    }

    /// Probes everything and compares with the model: the cells that differ, and how many cells
    /// the kernel denied.
    fn disagreements(&self, cluster: &Cluster) -> (Vec<String>, usize) {
        let pod = |key: &str| {
            let (ns, name) = key.split_once('/').unwrap();
            cluster
                .pods
                .iter()
                .find(|p| p.namespace == ns && p.name == name)
                .unwrap()
        };
        let mut wrong = Vec::new();
        let mut denied = 0;
        for ((c, s, protocol, port), got) in self.probe_all() {
            denied += usize::from(!got);
            let want = c == s || connection_allowed(cluster, pod(&c), pod(&s), protocol, port);
            if got != want {
                wrong.push(format!(
                    "{c} → {s} {protocol:?}/{port}: kernel {}, model {}",
                    verb(got),
                    verb(want)
                ));
            }
        }
        (wrong, denied)
    }

    /// Applies `policies`, probes, and fails naming every cell where kernel and model differ;
    /// returns how many of the 324 cells were denied.
    fn case(&self, name: &str, policies: &[Value]) -> usize {
        let cluster = world(policies);
        for p in &cluster.pods {
            let problems = compile(&cluster, p).problems;
            assert!(problems.is_empty(), "{name}: {problems:?}");
        }
        let script = self.apply(&cluster);
        let (wrong, denied) = self.disagreements(&cluster);
        assert!(
            wrong.is_empty(),
            "{name}: {} cells differ:\n{}\nruleset:\n{script}",
            wrong.len(),
            wrong.join("\n")
        );
        denied
    }
}

fn verb(allowed: bool) -> &'static str {
    if allowed { "connects" } else { "is denied" }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for s in self.servers.drain(..) {
            let _ = s.join();
        }
        for name in self.pods.values().chain([&self.node]) {
            let _ = run(&["ip", "netns", "del", name], None);
        }
    }
}

/// One connection attempt: a TCP handshake and the server's line, or a UDP datagram echoed back.
fn probe(protocol: Protocol, to: SocketAddr) -> bool {
    match protocol {
        Protocol::Tcp => TcpStream::connect_timeout(&to, PROBE_WAIT).is_ok_and(|mut s| {
            s.set_read_timeout(Some(PROBE_WAIT)).unwrap();
            let mut line = [0u8; 3];
            s.read_exact(&mut line).is_ok() && &line == b"ok\n"
        }),
        Protocol::Udp => {
            let s = UdpSocket::bind("0.0.0.0:0").expect("udp client");
            s.set_read_timeout(Some(PROBE_WAIT)).unwrap();
            s.connect(to).expect("udp connect");
            let _ = s.send(b"probe");
            let mut buf = [0u8; 16];
            match s.recv(&mut buf) {
                Ok(n) => &buf[..n] == b"probe",
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
                Err(_) => false,
            }
        }
        Protocol::Sctp => unreachable!("SCTP is not probed here"),
    }
}

fn pod_a() -> Value {
    json!({"matchLabels": {"pod": "a"}})
}

/// Every pod of `ns` as a client: 9 servers × 2 protocols × 2 ports each.
const ROW: usize = 9 * 2 * 2;

#[test]
fn ingress_cases_agree_with_the_model() {
    let Some(lab) = Lab::new("ingress_cases_agree_with_the_model") else {
        return;
    };
    assert_eq!(lab.case("no policy: everything open", &[]), 0);
    // Every other pod (8) × the 3 servers of x × 2 protocols × 2 ports: x's own pods too.
    let denied = lab.case(
        "default-deny-ingress",
        &[policy(
            "x",
            "deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )],
    );
    assert_eq!(denied, 3 * 8 * 4);
    let from = |peers: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": peers}]}),
        )
    };
    // Only x/b (and x/a itself) reach x/a.
    let denied = lab.case(
        "allow from a pod selector",
        &[from(
            json!([{"podSelector": {"matchLabels": {"pod": "b"}}}]),
        )],
    );
    assert_eq!(denied, 7 * 4);
    let denied = lab.case(
        "allow from a namespace selector",
        &[from(
            json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
        )],
    );
    assert_eq!(denied, 5 * 4);
    lab.case(
        "pod and namespace selectors in one peer",
        &[from(json!([{"namespaceSelector": {"matchExpressions":
            [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
            "podSelector": {"matchLabels": {"pod": "b"}}}]))],
    );
    let from_y_on = |ports: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": ports}]}),
        )
    };
    // From y on TCP/81 only: the 3 pods of y lose 3 of 4 cells, the 5 others all 4.
    let denied = lab.case("ports: TCP 81 from y", &[from_y_on(json!([{"port": 81}]))]);
    assert_eq!(denied, 3 * 3 + 5 * 4);
    lab.case(
        "a named port, UDP",
        &[from_y_on(
            json!([{"port": "serve-80-udp", "protocol": "UDP"}]),
        )],
    );
    lab.case(
        "a port range (endPort) and a whole protocol, stacked",
        &[
            from_y_on(json!([{"port": 80, "endPort": 81}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "ingress": [{"ports": [{"protocol": "UDP"}]}]}),
            ),
        ],
    );
    lab.case(
        "ingress ipBlock with except",
        &[from(
            json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}]),
        )],
    );
}

#[test]
fn egress_cases_agree_with_the_model() {
    let Some(lab) = Lab::new("egress_cases_agree_with_the_model") else {
        return;
    };
    let egress = |to: Value| {
        policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": to}]}),
        )
    };
    let denied = lab.case(
        "deny egress from x/a",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
        )],
    );
    assert_eq!(denied, ROW - 4);
    let denied = lab.case(
        "deny egress from all of x",
        &[policy(
            "x",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
        )],
    );
    assert_eq!(denied, 3 * (ROW - 4));
    // To y's /24 except y/b: x/a reaches y/a and y/c (and itself).
    let denied = lab.case(
        "egress ipBlock with except",
        &[egress(
            json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}]),
        )],
    );
    assert_eq!(denied, ROW - 3 * 4);
    lab.case(
        "an address both excepted and allowed by another policy",
        &[
            egress(json!([{"ipBlock": {"cidr": "10.1.1.0/24", "except": ["10.1.1.11/32"]}}])),
            policy(
                "x",
                "q",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.1.1.11/32"}}]}]}),
            ),
        ],
    );
    // Egress named port: resolved on each peer pod (a set of address . protocol . port).
    let denied = lab.case(
        "egress on one named port",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}),
        )],
    );
    assert_eq!(denied, 8 * 3);
    lab.case(
        "the client's egress denies what the server's ingress allows",
        &[
            policy(
                "x",
                "client",
                json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
            ),
            policy(
                "y",
                "server",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
            ),
        ],
    );
    // Both chains meet one packet: x/a's egress says yes, y's ingress says no.
    let denied = lab.case(
        "the server's ingress denies what the client's egress allows",
        &[
            egress(json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}])),
            policy(
                "y",
                "server",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            ),
        ],
    );
    // x/a reaches none but itself; every other pod but x/b (and y's own to themselves) loses y.
    assert_eq!(denied, (ROW - 4) + 7 * 3 * 4 - 3 * 4);
    lab.case(
        "ingress and egress together",
        &[policy(
            "x",
            "p",
            json!({"podSelector": pod_a(), "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80}]}]}),
        )],
    );
}

#[test]
fn a_changed_policy_re_rendered_and_re_applied_takes_effect() {
    let Some(lab) = Lab::new("a_changed_policy_re_rendered_and_re_applied_takes_effect") else {
        return;
    };
    let deny_x = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let first = lab.case("deny ingress to x", std::slice::from_ref(&deny_x));
    assert!(first > 0);
    // Open x/a to y: fewer denials, and the kernel agrees cell by cell.
    let open_a = policy(
        "x",
        "open-a",
        json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    );
    let second = lab.case("then allow y into x/a", &[deny_x, open_a]);
    assert_eq!(first - second, 3 * 4);
    // Every policy removed: everything connects again.
    assert_eq!(lab.case("then no policy", &[]), 0);
}
