//! The kubelet's path: containerd's CRI plugin (Debian's containerd, libcni inside) executes the real
//! `eniipam` plugin with a conflist exactly as shipped in `deploy/` (read from disk, copied byte for
//! byte into the CRI plugin's `conf_dir`), chained with the reference `portmap`, against the real
//! `eniipamd` binary on mockcloud. The test speaks CRI v1 over containerd's socket as the kubelet does:
//! RunPodSandbox for a dozen pods (one with a hostPort), PodSandboxStatus, StopPodSandbox,
//! RemovePodSandbox; the daemon, EC2, the pods' namespaces and iptables are checked at each step.
//! The same scenario runs for each `ip_family` of the daemon (ipv4, ipv6, dual: issue 26) with the
//! same shipped conflist: the family is the daemon's choice, not the plugin's configuration.
//!
//! Everything runs in a network namespace and a private mount namespace the test makes (see
//! `tests/runtime_support/`); needs root, and containerd/runc/CNI plugins installed by
//! `.ci/install-runtimes.sh`. `ENIIPAM_TEST_CONFLIST=<file>` runs the scenarios with another conflist;
//! `ENIIPAM_TEST_KEEP=1` keeps the node's temp dir (logs) after the run.

// These tests drive real processes (containerd, runc, podman) that live on the wall clock: waiting
// for them uses std time, not tokio's pausable clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod runtime_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use eniipam_cri_api::v1::{ListPodSandboxRequest, PodSandboxState, PodSandboxStatusRequest};
use runtime_support::containerd::{self, Containerd};
use runtime_support::cri::{
    CONTAINER_PORT, HOST_PORT, PARALLEL, PODS, PodSpec, Started, failure_report, kubelet_cleanup,
    pod_specs, run_pods, stop_and_remove, versions,
};
use runtime_support::daemon::{self, Allocation, Eniipamd, MockInNetns};
use runtime_support::node::{Node, describe};
use runtime_support::{
    conflist_under_test, dir_entries, files_under, in_netns, require_program, root_or_skip,
    tcp_roundtrip,
};

/// One containerd at a time: the tests measure wall time and share two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shipped conflist: the same file serves every family.
const SHIPPED: &str = "deploy/10-eniipam.conflist";

/// The node address the IPv6 hostPort is reached on (a ULA on the node's loopback: no VPC address).
const NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xe1, 0, 0, 0, 0, 0, 1);

/// The daemon's `ip_family` a scenario runs with (`ENIIPAM_IP_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Ipv4,
    Ipv6,
    Dual,
}

impl Family {
    fn env(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Dual => "dual",
        }
    }

    fn has_v4(self) -> bool {
        self != Self::Ipv6
    }

    fn has_v6(self) -> bool {
        self != Self::Ipv4
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_cri_pods_with_the_shipped_conflist() {
    if !root_or_skip("containerd_cri_pods_with_the_shipped_conflist") {
        return;
    }
    let _serial = SERIAL.lock().await;
    scenario(&conflist_under_test(SHIPPED), Family::Ipv4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_cri_ipv6_only_pods_with_the_shipped_conflist() {
    if !root_or_skip("containerd_cri_ipv6_only_pods_with_the_shipped_conflist") {
        return;
    }
    let _serial = SERIAL.lock().await;
    scenario(&conflist_under_test(SHIPPED), Family::Ipv6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_cri_dual_stack_pods_with_the_shipped_conflist() {
    if !root_or_skip("containerd_cri_dual_stack_pods_with_the_shipped_conflist") {
        return;
    }
    let _serial = SERIAL.lock().await;
    scenario(&conflist_under_test(SHIPPED), Family::Dual).await;
}

/// eniipam as IPAM under the reference `ptp` cannot work: ptp applies the IPAM result with
/// `ipam.ConfigureIface`, which adds the default route via 169.254.1.1 before anything makes that
/// gateway reachable from a /32 (a session saw "network is unreachable" on every ADD). So the plugin
/// refuses such a parent before taking an IP. Through containerd: every sandbox fails with that
/// reason, the kubelet's cleanup succeeds, and the daemon holds nothing and leaks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_refuses_eniipam_as_ipam_under_ptp() {
    if !root_or_skip("containerd_refuses_eniipam_as_ipam_under_ptp") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let conflist = dir.path().join("10-eniipam-ptp.conflist");
    std::fs::write(
        &conflist,
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "eniipam-ptp",
            "plugins": [
                {"type": "ptp", "mtu": 9001, "ipam": {"type": "eniipam"}},
                {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            ],
        })
        .to_string(),
    )
    .expect("writing the conflist");
    let (mut node, mock, eniipamd) = tokio::task::block_in_place(|| {
        let mut node = Node::start("cri-ptp");
        let mock = MockInNetns::start(&node.netns_path(), "m5.xlarge");
        let eniipamd = Eniipamd::start(&mut node, &mock);
        (node, mock, eniipamd)
    });
    let mut cri = Containerd::start(&mut node, &conflist).await;
    let specs: Vec<PodSpec> = pod_specs().into_iter().take(3).collect();
    let (started, failed) = run_pods(&cri.runtime, &node, &specs).await;
    assert!(
        started.is_empty(),
        "a sandbox came up under ptp + eniipam IPAM: {:?}",
        started.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
    assert_eq!(failed.len(), specs.len());
    for (spec, msg) in &failed {
        assert!(
            msg.contains("cannot work") && msg.contains("\"ptp\""),
            "{}: not the plugin's refusal: {msg}",
            spec.key()
        );
    }
    let report = kubelet_cleanup(&mut cri.runtime, &eniipamd).await;
    let held = eniipamd.allocations();
    assert!(
        held.is_empty(),
        "refused ADDs took IPs: {held:#?}\n{report}"
    );
    let left = cri
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    assert!(
        left.is_empty(),
        "sandboxes left after the cleanup: {left:?}\n{report}"
    );
    let pod_netns_left: Vec<String> = dir_entries(&node.inside("/run/netns"));
    assert!(
        pod_netns_left.is_empty(),
        "pod netns left: {pod_netns_left:?}"
    );
    containerd::stop(&mut node);
    daemon::stop(&mut node);
    drop(mock);
    drop(node);
}

/// A running pod's addresses as CRI reports them, and its network namespace.
struct PodNet {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
    netns: PathBuf,
}

/// Runs a command in a pod's network namespace; its output (stdout and stderr).
fn in_pod(netns: &Path, args: &[&str]) -> std::process::Output {
    Command::new(require_program("nsenter"))
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output()
        .expect("nsenter")
}

fn pod_shows(netns: &Path, args: &[&str]) -> String {
    describe(
        Command::new(require_program("nsenter"))
            .arg(format!("--net={}", netns.display()))
            .args(args),
    )
}

/// Checks one pod against CRI's PodSandboxStatus, the daemon's allocation, EC2 and its namespace.
fn check_pod(
    pod: &Started,
    cri_ips: &[String],
    alloc: &Allocation,
    family: Family,
    node: &Node,
    mock: &MockInNetns,
    node_prefix: Option<ipnet::Ipv6Net>,
) -> PodNet {
    let key = pod.spec.key();
    let parsed: Vec<IpAddr> = cri_ips
        .iter()
        .map(|s| {
            s.parse()
                .unwrap_or_else(|e| panic!("pod {key}: PodSandboxStatus IP {s:?}: {e}"))
        })
        .collect();
    let v4s: Vec<Ipv4Addr> = parsed
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6s: Vec<Ipv6Addr> = parsed
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
        .collect();
    assert_eq!(
        (v4s.len(), v6s.len()),
        (usize::from(family.has_v4()), usize::from(family.has_v6())),
        "{key}: CRI reports {cri_ips:?} for a {} pod",
        family.env()
    );
    let (v4, v6) = (v4s.first().copied(), v6s.first().copied());
    assert_eq!(alloc.ip, v4, "{key}: CRI and eniipamd disagree on the IPv4");
    assert_eq!(
        alloc.ipv6, v6,
        "{key}: CRI and eniipamd disagree on the IPv6"
    );
    assert_eq!(alloc.ifname, "eth0");
    assert_eq!(
        (alloc.pod_namespace.as_str(), alloc.pod_name.as_str()),
        (pod.spec.namespace.as_str(), pod.spec.name.as_str()),
        "K8S_POD_* reached the daemon"
    );
    // The pod's namespace (CNI_NETNS as the plugin got it) holds the addresses on eth0.
    let netns = node.inside(&alloc.netns);
    assert!(netns.exists(), "{key}: no netns {}", alloc.netns);
    if let Some(ip) = v4 {
        let subnet = mock.subnet();
        assert!(
            subnet.contains(&ip),
            "{ip} is outside the VPC subnet {subnet}"
        );
        let ec2 = mock.ec2_pod_ips();
        assert!(
            ec2.contains(&ip),
            "{ip} is not a secondary IP EC2 shows on the node's ENIs: {ec2:?}"
        );
        let addrs = pod_shows(&netns, &["ip", "-o", "-4", "addr", "show", "dev", "eth0"]);
        assert!(
            addrs.contains(&format!("inet {ip}/")),
            "{key}: eth0 in the pod does not hold {ip}: {addrs}"
        );
    }
    if let Some(ip) = v6 {
        let prefix = node_prefix.expect("the node's /80");
        assert!(
            prefix.contains(&ip),
            "{key}: {ip} is outside the node's /80 {prefix}"
        );
        let addrs = pod_shows(
            &netns,
            &[
                "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global",
            ],
        );
        assert!(
            addrs.contains(&format!("inet6 {ip}/128")),
            "{key}: eth0 in the pod does not hold {ip}/128: {addrs}"
        );
        let routes = pod_shows(&netns, &["ip", "-6", "route", "show", "default"]);
        assert!(
            routes.contains("via fe80::1") && routes.contains("dev eth0"),
            "{key}: no default route via fe80::1 on eth0: {routes}"
        );
    }
    PodNet { v4, v6, netns }
}

/// The pods reach each other through the node, in every family they have.
fn check_pings(started: &[Started], pods: &BTreeMap<String, PodNet>) {
    if !Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        mockcloud::ci::skip(
            "the CRI pods' pod-to-pod connectivity check",
            "ping is not installed (package iputils-ping)",
        );
        return;
    }
    for (from, to) in [(0, 1), (1, 0), (2, 5)] {
        let (a, b) = (&started[from].spec.key(), &started[to].spec.key());
        let targets = [
            pods[b].v4.map(|ip| ("-4", ip.to_string())),
            pods[b].v6.map(|ip| ("-6", ip.to_string())),
        ];
        for (flag, target) in targets.into_iter().flatten() {
            let out = in_pod(
                &pods[a].netns,
                &["ping", flag, "-c", "1", "-W", "2", &target],
            );
            assert!(
                out.status.success(),
                "{a} cannot ping {flag} {b} ({target}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The hostPort went through the chained portmap (iptables for IPv4, ip6tables for IPv6) and works:
/// a connection to the node's address on the hostPort reaches a listener on the container port
/// inside the pod.
fn check_host_port(node: &Node, mock: &MockInNetns, pod: &PodNet) {
    let mut targets: Vec<(IpAddr, IpAddr, String)> = Vec::new();
    if let Some(ip) = pod.v4 {
        let node_ip = mock.mock.default_instance().private_ip;
        node.add_local_address(node_ip);
        targets.push((node_ip.into(), ip.into(), node.nat_rules()));
    }
    if let Some(ip) = pod.v6 {
        node.add_local_address6(NODE_IPV6);
        targets.push((NODE_IPV6.into(), ip.into(), node.nat6_rules()));
    }
    for (node_ip, pod_ip, nat) in targets {
        let dnat = format!(
            "--to-destination {}",
            std::net::SocketAddr::new(pod_ip, CONTAINER_PORT as u16)
        );
        assert!(
            nat.lines()
                .any(|l| l.contains(&format!("--dport {HOST_PORT}")) && l.contains(&dnat)),
            "no hostPort DNAT {HOST_PORT} -> {pod_ip}:{CONTAINER_PORT} in the node's nat table:\n{nat}"
        );
        let unspecified: IpAddr = match pod_ip {
            IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let listener = in_netns(&pod.netns, move || {
            std::net::TcpListener::bind((unspecified, CONTAINER_PORT as u16))
        })
        .expect("listening inside the pod");
        tcp_roundtrip(
            listener,
            Path::new(&node.netns_path()),
            (node_ip, HOST_PORT as u16).into(),
        )
        .unwrap_or_else(|e| {
            panic!("{node_ip} port {HOST_PORT} (hostPort) does not reach {pod_ip}:{CONTAINER_PORT}: {e}\n{nat}")
        });
    }
}

async fn scenario(conflist: &Path, family: Family) {
    let t0 = Instant::now();
    let network = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(conflist).expect("reading the conflist"),
    )
    .expect("the conflist is JSON")["name"]
        .as_str()
        .expect("the conflist has a name")
        .to_owned();

    // Starting the node and the daemon waits on processes: off the async workers.
    let (mut node, mock, eniipamd) = tokio::task::block_in_place(|| {
        let mut node = Node::start(&format!("cri-{}", family.env()));
        if family.has_v6() {
            node.enable_ipv6_forwarding();
        }
        let mock = MockInNetns::start(&node.netns_path(), "m5.xlarge");
        let eniipamd =
            Eniipamd::start_with(&mut node, &mock, &[("ENIIPAM_IP_FAMILY", family.env())]);
        (node, mock, eniipamd)
    });
    let mut cri = Containerd::start(&mut node, conflist).await;
    let setup = t0.elapsed();
    eprintln!("{}", versions(&cri));
    eprintln!(
        "conflist {} (network {network:?}); ip_family {}; node {} ready in {setup:?}",
        conflist.display(),
        family.env(),
        node.netns
    );

    // The node's /80 as EC2 shows it on eth0, and as the daemon reports it.
    let node_prefix = family.has_v6().then(|| {
        let prefixes = mock.ec2_eth0_ipv6_prefixes();
        assert_eq!(prefixes.len(), 1, "one /80 on eth0 in EC2: {prefixes:?}");
        let status = eniipamd.status();
        assert_eq!(status["ip_family"], family.env(), "{status}");
        assert_eq!(status["ipv6_prefix"], prefixes[0].to_string(), "{status}");
        prefixes[0]
    });

    // 1. RunPodSandbox.
    let specs = pod_specs();
    let t_run = Instant::now();
    let (started, failed) = run_pods(&cri.runtime, &node, &specs).await;
    let run_wall = t_run.elapsed();
    if !failed.is_empty() {
        let mut report = failure_report(conflist, &failed, &eniipamd, &cri, &node);
        report.push_str(&kubelet_cleanup(&mut cri.runtime, &eniipamd).await);
        panic!("{report}");
    }

    // 2. PodSandboxStatus against the daemon, EC2 and the pods' namespaces.
    let held: HashMap<String, Allocation> = eniipamd
        .allocations()
        .into_iter()
        .map(|a| (a.container_id.clone(), a))
        .collect();
    assert_eq!(
        held.len(),
        PODS,
        "the daemon should hold one allocation per pod: {held:#?}"
    );
    if family.has_v6() {
        assert_eq!(
            eniipamd.status()["ipv6_assigned"],
            PODS,
            "{}",
            eniipamd.status_text()
        );
    }
    let mut pods: BTreeMap<String, PodNet> = BTreeMap::new();
    for pod in &started {
        let status = cri
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.id.clone(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .into_inner()
            .status
            .expect("a status");
        assert_eq!(
            status.state,
            PodSandboxState::SandboxReady as i32,
            "{}",
            pod.spec.key()
        );
        let cri_ips: Vec<String> = status
            .network
            .iter()
            .flat_map(|n| {
                std::iter::once(n.ip.clone()).chain(n.additional_ips.iter().map(|a| a.ip.clone()))
            })
            .filter(|ip| !ip.is_empty())
            .collect();
        let alloc = held.get(&pod.id).unwrap_or_else(|| {
            panic!(
                "{}: the daemon has no allocation for sandbox {}",
                pod.spec.key(),
                pod.id
            )
        });
        let net = check_pod(pod, &cri_ips, alloc, family, &node, &mock, node_prefix);
        if pods.insert(pod.spec.key(), net).is_some() {
            panic!("{} twice", pod.spec.key());
        }
    }
    let distinct4: HashSet<_> = pods.values().filter_map(|p| p.v4).collect();
    let distinct6: HashSet<_> = pods.values().filter_map(|p| p.v6).collect();
    assert_eq!(
        (distinct4.len(), distinct6.len()),
        (
            if family.has_v4() { PODS } else { 0 },
            if family.has_v6() { PODS } else { 0 }
        ),
        "pod IPs are not distinct"
    );

    check_pings(&started, &pods);
    let with_port = started
        .iter()
        .find(|p| p.spec.host_port.is_some())
        .expect("a pod with a hostPort");
    check_host_port(&node, &mock, &pods[&with_port.spec.key()]);

    // 3. StopPodSandbox + RemovePodSandbox.
    let t_down = Instant::now();
    let ids: Vec<String> = started.iter().map(|s| s.id.clone()).collect();
    stop_and_remove(&cri.runtime, &ids).await;
    let down_wall = t_down.elapsed();

    let left = cri
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    let held = eniipamd.allocations();
    assert!(
        held.is_empty(),
        "the daemon still holds IPs after every pod was removed (leaked): {held:#?}\n{}\n{}",
        eniipamd.status_text(),
        cri.cni_log(30)
    );
    let status = eniipamd.status();
    assert_eq!(status["assigned"], 0, "{status}");
    assert_eq!(
        status["ipv6_assigned"], 0,
        "IPv6 addresses leaked: {status}"
    );
    for p in pods.values() {
        assert!(
            !p.netns.exists(),
            "pod netns {} is still there",
            p.netns.display()
        );
    }
    let pod_netns_left: Vec<String> = dir_entries(&node.inside("/run/netns"));
    assert!(
        pod_netns_left.is_empty(),
        "pod netns left: {pod_netns_left:?}"
    );
    for nat in [node.nat_rules(), node.nat6_rules()] {
        assert!(
            !nat.contains(&format!("--dport {HOST_PORT}")),
            "the hostPort rule outlived its pod:\n{nat}"
        );
    }
    // The plugin's and libcni's caches are empty again.
    let cache = files_under(&node.dir.join("var-lib-cni"));
    assert!(cache.is_empty(), "CNI cache files left: {cache:?}");

    containerd::stop(&mut node);
    daemon::stop(&mut node);
    drop(mock);
    drop(node);

    let mut took: Vec<Duration> = started.iter().map(|s| s.took).collect();
    took.sort();
    eprintln!(
        "TIMING {} ({network}, {}): setup {setup:?}; {PODS} RunPodSandbox ({PARALLEL} in flight) {run_wall:?} \
         (each: median {:?}, max {:?}); stop+remove {down_wall:?}; total {:?}",
        conflist.display(),
        family.env(),
        took[took.len() / 2],
        took[took.len() - 1],
        t0.elapsed()
    );
}
