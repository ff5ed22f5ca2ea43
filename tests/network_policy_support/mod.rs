//! Test support for `tests/network_policy_nft.rs`: upstream's world (namespaces `x`, `y`, `z`,
//! pods `a`, `b`, `c`) as network namespaces on host veths of a node namespace, TCP and UDP
//! servers on 80 and 81 in every pod and an SCTP `INIT` listener ([`sctp`]: the lab's kernel has no
//! SCTP sockets), the ruleset loaded with the daemon's `Nft`, and the probe matrix (TCP, UDP and
//! SCTP on 80 and 81) compared with the model cell by cell. Everything it makes is deleted on drop.
//!
//! The world as the model sees it ([`world`], [`policy`], [`ip_of`]) also serves
//! `tests/network_policy_cases.rs`, which checks the model alone. [`Lab::with_stack`] and
//! [`world_in`] make the same world with IPv6-only or dual-stack pods ([`stack`]).

#![allow(dead_code)]

pub mod sctp;
mod world;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use eniipam::host::Nft;
use eniipam::network_policy::nft::{LocalPod, Ruleset, render};
use eniipam::network_policy::{Cluster, PodView, Protocol, compile, connection_allowed};
use nix::poll::{PollFd, PollFlags, poll};
use nix::sched::CloneFlags;
use serde_json::{Value, json};
#[allow(unused_imports)] // each test binary reads its own part
pub use world::{ip_of, policy, world, world_at, world_at_in, world_in};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];
pub const PORTS: [u16; 2] = [80, 81];
/// How long a probe waits at most: a dropped SYN or datagram is a denial after this, or sooner once
/// the sweep it belongs to has settled ([`sweep`]).
pub const PROBE_WAIT: Duration = Duration::from_millis(1500);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

mod stack;
pub use stack::{Stack, twin};
pub mod sweep;
use sweep::{SourcePorts, Sweep};

pub fn veth(ns: &str, pod: &str) -> String {
    format!("eni{ns}{pod}")
}

pub fn run(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
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
pub fn enter(name: &str) {
    let f = std::fs::File::open(format!("/run/netns/{name}")).expect("netns file");
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).expect("setns");
}

/// The node namespace and the nine pod namespaces, with their servers; all deleted on drop.
pub struct Lab {
    pub node: String,
    /// The pods' addresses.
    pub stack: Stack,
    /// `ns/pod` → its namespace's name.
    pods: BTreeMap<String, String>,
    /// `ns/pod` → the UDP source ports its probes take, in turn.
    ports: BTreeMap<String, Arc<SourcePorts>>,
    /// (`ns/pod`, IPv6?) → the SCTP `INIT`s its namespace receives in that family.
    sctp: BTreeMap<(String, bool), Arc<sctp::InitListener>>,
    /// What [`Lab::check`] probes: TCP and UDP, and SCTP after [`Lab::probe_sctp_too`].
    protocols: Vec<Protocol>,
    stop: Arc<AtomicBool>,
    servers: Vec<std::thread::JoinHandle<()>>,
}

impl Lab {
    pub fn new(test: &str) -> Option<Lab> {
        Self::with_stack(test, Stack::V4)
    }

    /// The lab with `stack`'s addresses on the pods (an IPv6 pod routes by the node's `fe80::1` on
    /// its veth, as an IPv4 one by 169.254.1.1).
    pub fn with_stack(test: &str, stack: Stack) -> Option<Lab> {
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
            stack,
            pods: BTreeMap::new(),
            ports: BTreeMap::new(),
            sctp: BTreeMap::new(),
            protocols: vec![Protocol::Tcp, Protocol::Udp],
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
        };
        let mut node_batch = vec!["link set lo up".to_owned()];
        for ns in NAMESPACES {
            for pod in PODS {
                let name = format!("{base}-{ns}{pod}");
                run(&["ip", "netns", "add", &name], None).expect("pod netns");
                lab.pods.insert(format!("{ns}/{pod}"), name.clone());
                lab.ports.insert(format!("{ns}/{pod}"), Arc::default());
                let v = veth(ns, pod);
                node_batch.extend([
                    format!("link add {v} type veth peer name eth0 netns {name}"),
                    format!("link set {v} up"),
                ]);
                if stack.has_ipv4() {
                    node_batch.extend([
                        format!("addr add 169.254.1.1/32 dev {v}"),
                        format!("route add {}/32 dev {v} scope link", ip_of(ns, pod)),
                    ]);
                }
                if stack.has_ipv6() {
                    node_batch.extend([
                        format!("addr add fe80::1/64 dev {v} nodad"),
                        format!("route add {}/128 dev {v}", twin(ip_of(ns, pod))),
                    ]);
                }
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
                "echo 1 > /proc/sys/net/ipv4/ip_forward; \
                 echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
            ],
            None,
        )
        .expect("ip_forward");
        for ns in NAMESPACES {
            for pod in PODS {
                let name = lab.pods[&format!("{ns}/{pod}")].clone();
                let mut batch = vec!["link set lo up".to_owned(), "link set eth0 up".to_owned()];
                if stack.has_ipv4() {
                    batch.extend([
                        format!("addr add {}/32 dev eth0", ip_of(ns, pod)),
                        "route add 169.254.1.1 dev eth0 scope link".to_owned(),
                        "route add default via 169.254.1.1 dev eth0".to_owned(),
                    ]);
                }
                if stack.has_ipv6() {
                    batch.extend([
                        format!("addr add {}/128 dev eth0 nodad", twin(ip_of(ns, pod))),
                        "route add ::/0 via fe80::1 dev eth0".to_owned(),
                    ]);
                }
                run(&["ip", "-n", &name, "-batch", "-"], Some(&batch.join("\n")))
                    .expect("pod links");
                lab.serve(&name);
                let families = [(false, stack.has_ipv4()), (true, stack.has_ipv6())];
                for (v6, _) in families.into_iter().filter(|(_, on)| *on) {
                    let name = name.clone();
                    let fd = std::thread::spawn(move || {
                        enter(&name);
                        sctp::raw_socket(v6)
                    })
                    .join()
                    .expect("the SCTP socket");
                    lab.sctp.insert(
                        (format!("{ns}/{pod}"), v6),
                        Arc::new(sctp::InitListener::start(fd, v6)),
                    );
                }
            }
        }
        // IPv6 only: the failure seen was a first neighbour solicitation's.
        let pods = NAMESPACES.iter().flat_map(|ns| PODS.map(|pod| (*ns, pod)));
        let v6 = pods
            .flat_map(|(ns, pod)| stack.addresses(ns, pod))
            .filter(IpAddr::is_ipv6);
        sweep::warm_up(&lab.node, v6.map(|ip| SocketAddr::from((ip, 80))).collect());
        Some(lab)
    }

    /// Makes the node send its link messages on pod veth `veth`: an IPv6 address added there is
    /// probed (duplicate address detection, source `::`) and its solicited-node group reported
    /// (MLD); returns once the probe is over (the address no longer tentative), and removes it.
    pub fn node_link_messages(&self, veth: &str) {
        use std::io::{BufRead, BufReader};
        let addr = "fd00:ffff::1";
        let ip = |args: &[&str]| {
            let mut all = vec!["ip", "-n", &self.node];
            all.extend_from_slice(args);
            run(&all, None).unwrap_or_else(|e| panic!("{e}"))
        };
        // The kernel's address notifications, read on a thread; `timeout` bounds the monitor.
        let mut monitor = Command::new("timeout")
            .args([
                "20", "ip", "-n", &self.node, "monitor", "address", "dev", veth,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("ip monitor");
        let out = BufReader::new(monitor.stdout.take().expect("stdout"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let seen = |what: &dyn Fn(&str) -> bool, within: Duration| {
            let mut left = within;
            loop {
                let step = left.min(Duration::from_millis(100));
                match lines.recv_timeout(step) {
                    Ok(l) if what(&l) => return true,
                    Ok(_) => {}
                    Err(mpsc::RecvTimeoutError::Timeout) if left > step => left -= step,
                    Err(_) => return false,
                }
            }
        };
        // `ip monitor` prints nothing once it subscribes: a marker address of our own, added
        // until one is seen, says it listens.
        let mut marker = 0;
        loop {
            marker += 1;
            assert!(marker < 50, "ip monitor saw nothing on {veth}");
            let m = format!("fd00:ffff::2:{marker}");
            ip(&["addr", "add", &format!("{m}/128"), "dev", veth, "nodad"]);
            ip(&["addr", "del", &format!("{m}/128"), "dev", veth]);
            if seen(&|l| l.contains(&m), Duration::from_millis(200)) {
                break;
            }
        }
        ip(&["addr", "add", &format!("{addr}/128"), "dev", veth]);
        let done = seen(
            &|l| l.contains(addr) && !l.contains("tentative") && !l.starts_with("Deleted"),
            Duration::from_secs(10),
        );
        let _ = monitor.kill();
        let _ = monitor.wait();
        assert!(
            done,
            "duplicate address detection of {addr} on {veth} never ended"
        );
        ip(&["addr", "del", &format!("{addr}/128"), "dev", veth]);
    }

    /// Probes SCTP too (by its `INIT`, [`sctp`]) in every matrix from now on: 486 cells instead
    /// of 324 (per family).
    pub fn probe_sctp_too(&mut self) {
        self.protocols = vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
    }

    /// TCP and UDP on 80 and 81 inside pod namespace `name`, until the lab is dropped (on `::`,
    /// which takes IPv4 too).
    fn serve(&mut self, name: &str) {
        let (name, stop) = (name.to_owned(), self.stop.clone());
        let (tx, rx) = mpsc::channel();
        self.servers.push(std::thread::spawn(move || {
            enter(&name);
            let tcp: Vec<TcpListener> = PORTS
                .iter()
                .map(|p| TcpListener::bind(("::", *p)).expect("tcp bind"))
                .collect();
            let udp: Vec<UdpSocket> = PORTS
                .iter()
                .map(|p| UdpSocket::bind(("::", *p)).expect("udp bind"))
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
    pub fn apply(&self, cluster: &Cluster) -> String {
        let script = ruleset(cluster, |_| true).script();
        self.load(&script);
        script
    }

    /// The table as the kernel lists it (`nft -j`), with what depends on the history of the
    /// table left out: handles, counter values, the order of objects and of set elements. The
    /// order of rules in a chain is kept.
    pub fn listing(&self) -> Value {
        let text = run(
            &[
                "ip",
                "netns",
                "exec",
                &self.node,
                "nft",
                "-j",
                "list",
                "table",
                "inet",
                "eniipam_policy",
            ],
            None,
        )
        .expect("nft list");
        let doc: Value = serde_json::from_str(&text).expect("nft -j");
        let mut seq: BTreeMap<String, usize> = BTreeMap::new();
        let mut items: Vec<(String, Value)> = Vec::new();
        for item in doc["nftables"].as_array().expect("nftables").iter() {
            let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
                continue;
            };
            if kind == "metainfo" {
                continue;
            }
            let mut body = body.clone();
            let o = body.as_object_mut().expect("an object");
            o.remove("handle");
            if kind == "counter" {
                o.remove("packets");
                o.remove("bytes");
            }
            if let Some(Value::Array(elems)) = o.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
            let key = if kind == "rule" {
                let chain = o["chain"].as_str().unwrap_or_default().to_owned();
                let n = seq.entry(chain.clone()).or_default();
                *n += 1;
                format!("rule {chain} {:06}", *n)
            } else {
                format!(
                    "{kind} {}",
                    o.get("name").and_then(Value::as_str).unwrap_or_default()
                )
            };
            items.push((key, json!({ kind: body })));
        }
        items.sort_by(|a, b| a.0.cmp(&b.0));
        Value::Array(items.into_iter().map(|(_, v)| v).collect())
    }

    /// The table's counters, read with `nft -j list counters`.
    pub fn counters(&self) -> Vec<eniipam::network_policy::nft::CounterReading> {
        let text = run(
            &[
                "ip",
                "netns",
                "exec",
                &self.node,
                "nft",
                "-j",
                "list",
                "counters",
                "table",
                "inet",
                "eniipam_policy",
            ],
            None,
        )
        .expect("nft list counters");
        eniipam::network_policy::nft::parse_counters(&text).expect("counters")
    }

    /// One probe from inside `client`'s namespace (`ns/pod`) to `server`'s address.
    pub fn probe_one(
        &self,
        client: &str,
        server: (&str, &str),
        protocol: Protocol,
        port: u16,
    ) -> bool {
        let name = self.pods[client].clone();
        let to = SocketAddr::from((ip_of(server.0, server.1), port));
        let listener = self.sctp[&(format!("{}/{}", server.0, server.1), false)].clone();
        let ports = self.ports[client].clone();
        std::thread::spawn(move || {
            enter(&name);
            match protocol {
                Protocol::Sctp => sweep::sctp_in(&Sweep::default(), &listener, to),
                _ => sweep::probe_in(&Sweep::default(), protocol, to, &ports),
            }
        })
        .join()
        .expect("probe")
    }
}

/// The ruleset of `cluster`'s policies for the pods `local` keeps (the node's), each on its veth.
pub fn ruleset(cluster: &Cluster, local: impl Fn(&PodView) -> bool) -> Ruleset {
    let pods: Vec<LocalPod> = cluster
        .pods
        .iter()
        .filter(|p| local(p))
        .map(|p| LocalPod {
            name: format!("{}/{}", p.namespace, p.name),
            veth: veth(&p.namespace, &p.name),
            ips: p.ips.clone(),
            compiled: compile(cluster, p),
        })
        .collect();
    render(&pods).expect("render")
}

impl Lab {
    /// Loads a script into the node with the daemon's `Nft` (one transaction); how long it took.
    /// Wall-clock time on purpose: the figure is the kernel's and `nft`'s real work, which no
    /// paused clock can see.
    #[allow(clippy::disallowed_types)]
    pub fn load(&self, script: &str) -> Duration {
        let (node, owned) = (self.node.clone(), script.to_owned());
        let (took, loaded) = std::thread::spawn(move || {
            enter(&node);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let start = std::time::Instant::now();
            let loaded = rt.block_on(Nft::default().apply(&owned));
            (start.elapsed(), loaded)
        })
        .join()
        .expect("the nft thread");
        loaded.unwrap_or_else(|e| panic!("loading the ruleset: {e}\n{script}"));
        took
    }

    /// Every cell: client → server's address (each of its families), protocol, port → connected.
    /// All at once, as one [`Sweep`]: the silent cells are denials once the answers have settled.
    fn probe_all(&self) -> BTreeMap<(String, String, IpAddr, Protocol, u16), bool> {
        let servers = NAMESPACES.len() * PODS.len() * self.stack.families();
        let cells = self.pods.len() * servers * self.protocols.len() * PORTS.len();
        let sweep = Arc::new(Sweep::new(cells));
        let (tx, rx) = mpsc::channel();
        let mut total = 0;
        let mut clients = Vec::new();
        for (client, name) in &self.pods {
            let mut cells = Vec::new();
            for ns in NAMESPACES {
                for pod in PODS {
                    let server = format!("{ns}/{pod}");
                    for ip in self.stack.addresses(ns, pod) {
                        for protocol in self.protocols.iter().copied() {
                            for port in PORTS {
                                let listener = self.sctp[&(server.clone(), ip.is_ipv6())].clone();
                                let key = (client.clone(), server.clone(), ip, protocol, port);
                                cells.push((key, listener));
                            }
                        }
                    }
                }
            }
            total += cells.len();
            let (name, tx, sweep) = (name.clone(), tx.clone(), sweep.clone());
            let ports = self.ports[client].clone();
            clients.push(std::thread::spawn(move || {
                enter(&name);
                // Threads spawned here share this thread's namespace.
                let probes: Vec<_> = cells
                    .into_iter()
                    .map(|(key, listener)| {
                        let (tx, sweep, ports) = (tx.clone(), sweep.clone(), ports.clone());
                        std::thread::spawn(move || {
                            let (_, _, ip, protocol, port) = key;
                            let to = SocketAddr::from((ip, port));
                            let got = match protocol {
                                Protocol::Sctp => sweep::sctp_in(&sweep, &listener, to),
                                _ => sweep::probe_in(&sweep, protocol, to, &ports),
                            };
                            let _ = tx.send((key, got));
                        })
                    })
                    .collect();
                for p in probes {
                    p.join().expect("probe");
                }
            }));
        }
        drop(tx);
        assert_eq!(total, cells, "the sweep counts every probe");
        sweep.collect(rx, total, || {
            for c in clients {
                c.join().expect("client");
            }
        })
    }

    /// Probes everything and compares with the model, its verdicts enforced on the pods `local`
    /// keeps (the others are on other nodes here: nothing enforces their policies): the cells
    /// that differ, and how many cells the kernel denied.
    fn disagreements(
        &self,
        cluster: &Cluster,
        local: &dyn Fn(&PodView) -> bool,
    ) -> (Vec<String>, usize) {
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
        for ((c, s, to, protocol, port), got) in self.probe_all() {
            denied += usize::from(!got);
            let (client, server) = (pod(&c), pod(&s));
            // The client's address of the server's family: the one its packets carry.
            let from = *client
                .ips
                .iter()
                .find(|ip| ip.is_ipv6() == to.is_ipv6())
                .expect("the client has the server's family");
            let want = c == s
                || if local(client) && local(server) && self.stack == Stack::V4 {
                    connection_allowed(cluster, client, server, protocol, port)
                } else {
                    // Per family (the model's `connection_allowed` reads a pod's first address):
                    // the client's egress to the server's address, the server's ingress from the
                    // client's, each only where its pod is the node's.
                    (!local(client)
                        || compile(cluster, client)
                            .egress
                            .verdict(to, protocol, port)
                            .is_allowed())
                        && (!local(server)
                            || compile(cluster, server)
                                .ingress
                                .verdict(from, protocol, port)
                                .is_allowed())
                };
            if got != want {
                wrong.push(format!(
                    "{c} → {s} ({to}) {protocol:?}/{port}: kernel {}, model {}",
                    verb(got),
                    verb(want)
                ));
            }
        }
        (wrong, denied)
    }

    /// Applies `policies`, probes, and fails naming every cell where kernel and model differ;
    /// returns how many of the cells (324, or 486 with SCTP; twice that dual-stack) were denied.
    pub fn case(&self, name: &str, policies: &[Value]) -> usize {
        let cluster = world_in(policies, self.stack);
        for p in &cluster.pods {
            let problems = compile(&cluster, p).problems;
            assert!(problems.is_empty(), "{name}: {problems:?}");
        }
        let script = self.apply(&cluster);
        self.check(name, &cluster, &|_| true, &script)
    }

    /// Loads the ruleset of `cluster` (a stage of a shared case: its policies and labels; a part
    /// the compiler refuses is allowed here, the model judges it alike), probes, and fails naming
    /// every cell where kernel and model differ; returns how many cells were denied.
    pub fn case_in(&self, name: &str, cluster: &Cluster) -> usize {
        let script = self.apply(cluster);
        self.check(name, cluster, &|_| true, &script)
    }

    /// Probes everything and fails naming every cell where the kernel differs from the model
    /// enforced on the pods `local` keeps; returns how many cells were denied. `script` is shown
    /// on failure.
    pub fn check(
        &self,
        name: &str,
        cluster: &Cluster,
        local: &dyn Fn(&PodView) -> bool,
        script: &str,
    ) -> usize {
        let (wrong, denied) = self.disagreements(cluster, local);
        assert!(
            wrong.is_empty(),
            "{name}: {} cells differ:\n{}\nruleset:\n{script}",
            wrong.len(),
            wrong.join("\n")
        );
        denied
    }
}

pub fn verb(allowed: bool) -> &'static str {
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
