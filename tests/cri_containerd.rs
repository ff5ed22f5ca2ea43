//! The kubelet's path: containerd's CRI plugin (Debian's containerd, libcni inside) executes the real
//! `eniipam` plugin with a conflist exactly as shipped in `deploy/` (read from disk, copied byte for
//! byte into the CRI plugin's `conf_dir`), chained with the reference `portmap`, against the real
//! `eniipamd` binary on mockcloud. The test speaks CRI v1 over containerd's socket as the kubelet does:
//! RunPodSandbox for a dozen pods (one with a hostPort), PodSandboxStatus, StopPodSandbox,
//! RemovePodSandbox; the daemon, EC2, the pods' namespaces and iptables are checked at each step.
//!
//! Everything runs in a network namespace and a private mount namespace the test makes (see
//! `tests/runtime_support/`); needs root, and containerd/runc/CNI plugins installed by
//! `.ci/install-runtimes.sh`. `ENIIPAM_TEST_CONFLIST=<file>` runs the first test with another conflist;
//! `ENIIPAM_TEST_KEEP=1` keeps the node's temp dir (logs) after the run.

// These tests drive real processes (containerd, runc, podman) that live on the wall clock: waiting
// for them uses std time, not tokio's pausable clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod runtime_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eniipam_cri_api::v1::runtime_service_client::RuntimeServiceClient;
use eniipam_cri_api::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PodSandboxState,
    PodSandboxStatusRequest, PortMapping, Protocol, RemovePodSandboxRequest, RunPodSandboxRequest,
    StopPodSandboxRequest,
};
use runtime_support::containerd::{self, Containerd};
use runtime_support::daemon::{self, Allocation, Eniipamd, MockInNetns};
use runtime_support::node::{Node, describe};
use runtime_support::{
    conflist_under_test, dir_entries, files_under, in_netns, reference_plugin, require_program,
    root_or_skip, tcp_roundtrip, version_line,
};
use tonic::transport::Channel;

/// One containerd at a time: the tests measure wall time and share two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many pods each test runs, and how many RunPodSandbox calls are in flight at once (the kubelet
/// starts pods in parallel).
const PODS: usize = 12;
const PARALLEL: usize = 4;
const HOST_PORT: i32 = 30080;
const CONTAINER_PORT: i32 = 80;
const CRI_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_cri_pods_with_the_shipped_conflist() {
    if !root_or_skip("containerd_cri_pods_with_the_shipped_conflist") {
        return;
    }
    let _serial = SERIAL.lock().await;
    scenario(&conflist_under_test("deploy/10-eniipam.conflist")).await;
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

#[derive(Clone, Debug)]
struct PodSpec {
    namespace: String,
    name: String,
    uid: String,
    host_port: Option<i32>,
}

impl PodSpec {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn config(&self, node: &Node) -> PodSandboxConfig {
        let log_dir = node.dir.join("logs").join("pods").join(&self.uid);
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: self.name.clone(),
            log_directory: log_dir.display().to_string(),
            port_mappings: self
                .host_port
                .map(|host_port| PortMapping {
                    protocol: Protocol::Tcp as i32,
                    container_port: CONTAINER_PORT,
                    host_port,
                    host_ip: String::new(),
                })
                .into_iter()
                .collect(),
            labels: HashMap::from([
                ("io.kubernetes.pod.name".to_owned(), self.name.clone()),
                (
                    "io.kubernetes.pod.namespace".to_owned(),
                    self.namespace.clone(),
                ),
                ("io.kubernetes.pod.uid".to_owned(), self.uid.clone()),
            ]),
            linux: Some(LinuxPodSandboxConfig {
                // As the kubelet's cgroupfs driver would: a per-pod cgroup under a parent the test owns.
                cgroup_parent: format!("/{}/pod{}", node.cgroup_parent, self.uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod as i32,
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

fn pod_specs() -> Vec<PodSpec> {
    (0..PODS)
        .map(|i| PodSpec {
            namespace: if i % 3 == 2 { "team-a" } else { "default" }.to_owned(),
            name: format!("web-{i}"),
            uid: format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), i),
            host_port: (i == 0).then_some(HOST_PORT),
        })
        .collect()
}

struct Started {
    spec: PodSpec,
    id: String,
    took: Duration,
}

/// RunPodSandbox for every spec, `PARALLEL` at a time. Returns the started pods and the failures.
async fn run_pods(
    client: &RuntimeServiceClient<Channel>,
    node: &Node,
    specs: &[PodSpec],
) -> (Vec<Started>, Vec<(PodSpec, String)>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for spec in specs {
        let mut client = client.clone();
        let config = spec.config(node);
        let spec = spec.clone();
        let permits = permits.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore");
            let t = Instant::now();
            let reply = tokio::time::timeout(
                CRI_TIMEOUT,
                client.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                }),
            )
            .await;
            let took = t.elapsed();
            match reply {
                Ok(Ok(r)) => Ok(Started {
                    spec,
                    id: r.into_inner().pod_sandbox_id,
                    took,
                }),
                Ok(Err(status)) => {
                    Err((spec, format!("{:?}: {}", status.code(), status.message())))
                }
                Err(_) => Err((spec, format!("no answer within {CRI_TIMEOUT:?}"))),
            }
        });
    }
    let mut started = Vec::new();
    let mut failed = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("RunPodSandbox task") {
            Ok(s) => started.push(s),
            Err(f) => failed.push(f),
        }
    }
    started.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    (started, failed)
}

/// StopPodSandbox then RemovePodSandbox for every id, `PARALLEL` at a time; panics on a failure.
async fn stop_and_remove(client: &RuntimeServiceClient<Channel>, ids: &[String]) {
    let permits = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let mut client = client.clone();
        let id = id.clone();
        let permits = permits.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore");
            tokio::time::timeout(
                CRI_TIMEOUT,
                client.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }),
            )
            .await
            .map_err(|_| format!("StopPodSandbox {id}: no answer within {CRI_TIMEOUT:?}"))?
            .map_err(|s| format!("StopPodSandbox {id}: {:?}: {}", s.code(), s.message()))?;
            tokio::time::timeout(
                CRI_TIMEOUT,
                client.remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }),
            )
            .await
            .map_err(|_| format!("RemovePodSandbox {id}: no answer within {CRI_TIMEOUT:?}"))?
            .map_err(|s| format!("RemovePodSandbox {id}: {:?}: {}", s.code(), s.message()))?;
            Ok::<_, String>(())
        });
    }
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined.expect("teardown task") {
            errors.push(e);
        }
    }
    errors.sort();
    assert!(
        errors.is_empty(),
        "pod teardown failed:\n{}",
        errors.join("\n")
    );
}

/// What the runtime tests print about their environment (the lead's report needs the versions).
fn versions(containerd: &Containerd) -> String {
    format!(
        "containerd: {} | runc: {} | CNI plugins: {} | portmap: {}",
        containerd.version,
        version_line(
            require_program("runc").to_str().unwrap_or("runc"),
            &["--version"]
        ),
        dpkg_version("containernetworking-plugins"),
        version_line(
            reference_plugin("portmap").to_str().unwrap_or("portmap"),
            &["--version"]
        )
        .replace("CNI portmap plugin ", ""),
    )
}

fn dpkg_version(package: &str) -> String {
    version_line(
        "dpkg-query",
        &["--showformat=${Version}", "--show", package],
    )
}

/// Everything useful about a failed run (the CRI errors, what the daemon still holds, containerd's CNI
/// log lines, the conflist).
fn failure_report(
    conflist: &Path,
    failed: &[(PodSpec, String)],
    daemon: &Eniipamd,
    containerd: &Containerd,
    node: &Node,
) -> String {
    let mut out = format!(
        "{} of {PODS} RunPodSandbox calls failed with {}:\n",
        failed.len(),
        conflist.display()
    );
    for (spec, err) in failed {
        out.push_str(&format!("  {}: {err}\n", spec.key()));
    }
    let held = daemon.allocations();
    out.push_str(&format!(
        "eniipamd holds {} allocations afterwards: {:?}\n",
        held.len(),
        held.iter()
            .map(|a| format!("{} {}", a.ip, a.container_id))
            .collect::<Vec<_>>()
    ));
    out.push_str(&format!(
        "pod network namespaces left in the node: {:?}\n",
        dir_entries(&node.inside("/run/netns"))
    ));
    out.push_str(&format!(
        "CNI cache files left: {:?}\n",
        files_under(&node.dir.join("var-lib-cni"))
    ));
    out.push_str(&containerd.cni_log(40));
    out.push('\n');
    out.push_str(&format!(
        "conflist:\n{}",
        std::fs::read_to_string(conflist).unwrap_or_default()
    ));
    out
}

/// What the kubelet does with sandboxes left behind (failed ones stay as SANDBOX_NOTREADY / unknown):
/// StopPodSandbox + RemovePodSandbox for every sandbox listed. Returns what happened, including what
/// the daemon still holds afterwards (IPs leaked for good).
async fn kubelet_cleanup(client: &mut RuntimeServiceClient<Channel>, daemon: &Eniipamd) -> String {
    let listed = client
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
        .map(|r| r.into_inner().items)
        .unwrap_or_default();
    let mut out = format!(
        "\nkubelet-style cleanup: {} sandboxes listed; StopPodSandbox + RemovePodSandbox on each:\n",
        listed.len()
    );
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for sandbox in &listed {
        let id = sandbox.id.clone();
        let stop = client
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let result = match stop {
            Ok(_) => client
                .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
                .map(|_| ())
                .map_err(|s| format!("RemovePodSandbox: {}", s.message())),
            Err(s) => Err(format!("StopPodSandbox: {}", s.message())),
        };
        if let Err(e) = result {
            // Sandbox ids differ between calls; count the messages without them.
            let generic = e.replace(&sandbox.id, "<id>");
            *errors.entry(generic).or_default() += 1;
        }
    }
    for (e, n) in &errors {
        out.push_str(&format!("  {n}x {e}\n"));
    }
    let held = daemon.allocations();
    out.push_str(&format!(
        "eniipamd still holds {} allocations after the cleanup\n",
        held.len()
    ));
    out
}

fn ip_of(status_ip: &str, pod: &str) -> Ipv4Addr {
    status_ip
        .parse()
        .unwrap_or_else(|e| panic!("pod {pod}: PodSandboxStatus IP {status_ip:?}: {e}"))
}

async fn scenario(conflist: &Path) {
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
        let mut node = Node::start("cri");
        let mock = MockInNetns::start(&node.netns_path(), "m5.xlarge");
        let eniipamd = Eniipamd::start(&mut node, &mock);
        (node, mock, eniipamd)
    });
    let mut cri = Containerd::start(&mut node, conflist).await;
    let setup = t0.elapsed();
    eprintln!("{}", versions(&cri));
    eprintln!(
        "conflist {} (network {network:?}); node {} ready in {setup:?}",
        conflist.display(),
        node.netns
    );

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
    let subnet = mock.subnet();
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
    let ec2 = mock.ec2_pod_ips();
    let mut ips: BTreeMap<String, Ipv4Addr> = BTreeMap::new();
    let mut netns_paths = Vec::new();
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
        let ip = ip_of(
            &status
                .network
                .as_ref()
                .map(|n| n.ip.clone())
                .unwrap_or_default(),
            &pod.spec.key(),
        );
        let alloc = held.get(&pod.id).unwrap_or_else(|| {
            panic!(
                "{}: the daemon has no allocation for sandbox {}",
                pod.spec.key(),
                pod.id
            )
        });
        assert_eq!(
            alloc.ip,
            ip,
            "{}: CRI and eniipamd disagree",
            pod.spec.key()
        );
        assert_eq!(alloc.ifname, "eth0");
        assert_eq!(
            (alloc.pod_namespace.as_str(), alloc.pod_name.as_str()),
            (pod.spec.namespace.as_str(), pod.spec.name.as_str()),
            "K8S_POD_* reached the daemon"
        );
        assert!(
            subnet.contains(&ip),
            "{ip} is outside the VPC subnet {subnet}"
        );
        assert!(
            ec2.contains(&ip),
            "{ip} is not a secondary IP EC2 shows on the node's ENIs: {ec2:?}"
        );
        // The pod's namespace (CNI_NETNS as the plugin got it) holds the IP on eth0.
        let netns = node.inside(&alloc.netns);
        assert!(
            netns.exists(),
            "{}: no netns {}",
            pod.spec.key(),
            alloc.netns
        );
        let addrs = describe(
            Command::new(require_program("nsenter"))
                .arg(format!("--net={}", netns.display()))
                .args(["ip", "-o", "-4", "addr", "show", "dev", "eth0"]),
        );
        assert!(
            addrs.contains(&format!("inet {ip}/")),
            "{}: eth0 in the pod does not hold {ip}: {addrs}",
            pod.spec.key()
        );
        netns_paths.push(netns);
        if ips.insert(pod.spec.key(), ip).is_some() {
            panic!("{} twice", pod.spec.key());
        }
    }
    let distinct: HashSet<_> = ips.values().collect();
    assert_eq!(distinct.len(), PODS, "pod IPs are not distinct: {ips:?}");

    // Pods reach each other through the node.
    if Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        for (from, to) in [(0, 1), (1, 0), (2, 5)] {
            let target = ips[&started[to].spec.key()].to_string();
            let out = Command::new(require_program("nsenter"))
                .arg(format!("--net={}", netns_paths[from].display()))
                .args(["ping", "-c", "1", "-W", "2", &target])
                .output()
                .expect("ping");
            assert!(
                out.status.success(),
                "{} cannot ping {} ({target}): {}",
                started[from].spec.key(),
                started[to].spec.key(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
    } else {
        mockcloud::ci::skip(
            "the CRI pods' pod-to-pod connectivity check",
            "ping is not installed (package iputils-ping)",
        );
    }

    // The hostPort went through the chained portmap.
    let with_port = started
        .iter()
        .find(|p| p.spec.host_port.is_some())
        .expect("a pod with a hostPort");
    let port_ip = ips[&with_port.spec.key()];
    let nat = node.nat_rules();
    let dnat = format!("--to-destination {port_ip}:{CONTAINER_PORT}");
    assert!(
        nat.lines()
            .any(|l| l.contains(&format!("--dport {HOST_PORT}")) && l.contains(&dnat)),
        "no hostPort DNAT {HOST_PORT} -> {port_ip}:{CONTAINER_PORT} in the node's nat table:\n{nat}"
    );

    // ... and works: a connection to the node's address on the hostPort reaches a listener on the
    // container port inside the pod.
    let node_ip = mock.mock.default_instance().private_ip;
    node.add_local_address(node_ip);
    let port_netns = &netns_paths[started
        .iter()
        .position(|p| p.spec.host_port.is_some())
        .expect("the hostPort pod")];
    let listener = in_netns(port_netns, || {
        std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, CONTAINER_PORT as u16))
    })
    .expect("listening inside the pod");
    tcp_roundtrip(
        listener,
        Path::new(&node.netns_path()),
        (node_ip, HOST_PORT as u16).into(),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{node_ip}:{HOST_PORT} (hostPort) does not reach {port_ip}:{CONTAINER_PORT}: {e}\n{}",
            node.nat_rules()
        )
    });

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
    for netns in &netns_paths {
        assert!(
            !netns.exists(),
            "pod netns {} is still there",
            netns.display()
        );
    }
    let pod_netns_left: Vec<String> = dir_entries(&node.inside("/run/netns"));
    assert!(
        pod_netns_left.is_empty(),
        "pod netns left: {pod_netns_left:?}"
    );
    let nat = node.nat_rules();
    assert!(
        !nat.contains(&format!("--dport {HOST_PORT}")),
        "the hostPort rule outlived its pod:\n{nat}"
    );
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
        "TIMING {} ({network}): setup {setup:?}; {PODS} RunPodSandbox ({PARALLEL} in flight) {run_wall:?} \
         (each: median {:?}, max {:?}); stop+remove {down_wall:?}; total {:?}",
        conflist.display(),
        took[took.len() / 2],
        took[took.len() - 1],
        t0.elapsed()
    );
}
