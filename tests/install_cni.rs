//! Issue 14: `eniipamctl install-cni` makes a fresh node ready.
//!
//! 1. On an empty fake host root (a temp dir laid out like `/opt/cni/bin` and `/etc/cni/net.d`), the
//!    installer copies `eniipam`, `loopback` and `portmap` and the shipped conflist once the real
//!    `eniipamd` (on mockcloud, in a test node) is healthy; then containerd's CRI plugin, with
//!    exactly those directories as its `bin_dir` and `conf_dir`, runs pods through them as the
//!    kubelet would; `uninstall-cni` takes the network away again (containerd reports NetworkReady
//!    false). Needs root and the runtimes (`.ci/install-runtimes.sh`), like `tests/cri_containerd.rs`.
//! 2. `--wait` (the DaemonSet's sidecar): plugins at once, the conflist only once the daemon is
//!    healthy, a changed ConfigMap re-installed, the conflist removed on SIGTERM, the plugins kept.

// The runtime test drives real processes on the wall clock (see tests/cri_containerd.rs).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "daemon_support/mod.rs"]
mod daemon_support;
mod runtime_support;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use eniipam_cri_api::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StatusRequest, StopPodSandboxRequest,
};
use runtime_support::containerd::{self, Containerd};
use runtime_support::daemon::{self, Eniipamd, MockInNetns};
use runtime_support::node::Node;
use runtime_support::{reference_plugin, repo_file, root_or_skip, target_bin};

const PLUGINS: [&str; 3] = ["eniipam", "loopback", "portmap"];

/// A host root with empty `/opt/cni/bin` and `/etc/cni/net.d`, and a directory holding the plugins
/// as the image ships them (`/opt/eniipam/cni-bin`).
struct FakeHost {
    _dir: tempfile::TempDir,
    root: PathBuf,
    plugins_from: PathBuf,
}

impl FakeHost {
    fn new(plugin_bytes: impl Fn(&str) -> Vec<u8>) -> FakeHost {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("host");
        for d in ["opt/cni/bin", "etc/cni/net.d"] {
            std::fs::create_dir_all(root.join(d)).expect("host dirs");
        }
        let plugins_from = dir.path().join("image-cni-bin");
        std::fs::create_dir_all(&plugins_from).expect("plugin source dir");
        for p in PLUGINS {
            let path = plugins_from.join(p);
            std::fs::write(&path, plugin_bytes(p)).expect("plugin");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        FakeHost {
            _dir: dir,
            root,
            plugins_from,
        }
    }

    fn bin(&self) -> PathBuf {
        self.root.join("opt/cni/bin")
    }

    fn conf(&self) -> PathBuf {
        self.root.join("etc/cni/net.d")
    }

    fn install_args(&self, conflist: &Path) -> Vec<String> {
        vec![
            "install-cni".into(),
            format!("--host-root={}", self.root.display()),
            format!("--plugins-from={}", self.plugins_from.display()),
            format!("--conflist={}", conflist.display()),
        ]
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn ctl(socket: &Path, args: &[String]) -> std::process::Output {
    Command::new(target_bin("eniipamctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("eniipamctl runs")
}

fn pod_config(node: &Node, i: usize) -> PodSandboxConfig {
    let uid = format!("{:08x}-0000-4000-9000-{:012x}", std::process::id(), i);
    let name = format!("installed-{i}");
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: node.dir.join("logs/pods").join(&uid).display().to_string(),
        labels: HashMap::from([
            ("io.kubernetes.pod.name".to_owned(), name),
            ("io.kubernetes.pod.namespace".to_owned(), "default".into()),
            ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
        ]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/{}/pod{uid}", node.cgroup_parent),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_cni_makes_an_empty_host_a_node_containerd_can_use() {
    if !root_or_skip("install_cni_makes_an_empty_host_a_node_containerd_can_use") {
        return;
    }
    // The real plugin and the reference plugins this machine has (the image ships upstream's).
    let host = FakeHost::new(|p| {
        let src = if p == "eniipam" {
            target_bin("eniipam")
        } else {
            reference_plugin(p)
        };
        std::fs::read(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()))
    });
    let conflist = repo_file("deploy/10-eniipam.conflist");
    let (mut node, mock, eniipamd) = tokio::task::block_in_place(|| {
        let mut node = Node::start("install");
        let mock = MockInNetns::start(&node.netns_path(), "m5.xlarge");
        let eniipamd = Eniipamd::start(&mut node, &mock);
        (node, mock, eniipamd)
    });

    // 1. Install: one shot, the daemon is already healthy.
    let mut args = host.install_args(&conflist);
    args.push("--timeout-secs=30".into());
    let out = ctl(&eniipamd.socket, &args);
    assert!(
        out.status.success(),
        "install-cni failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for p in PLUGINS {
        let installed = host.bin().join(p);
        assert_eq!(
            std::fs::read(&installed).expect("installed plugin"),
            std::fs::read(host.plugins_from.join(p)).expect("source plugin"),
            "{p}"
        );
        assert_eq!(mode(&installed), 0o755, "{p}");
    }
    let installed_conflist = host.conf().join("10-eniipam.conflist");
    assert_eq!(
        std::fs::read(&installed_conflist).expect("the conflist"),
        std::fs::read(&conflist).expect("the shipped conflist"),
        "byte for byte the shipped conflist"
    );
    assert_eq!(mode(&installed_conflist), 0o644);
    assert_eq!(
        mode(&host.root.join("var/lib/cni/eniipam")),
        0o700,
        "the plugin's cache dir"
    );
    let mut all: Vec<String> = runtime_support::files_under(&host.root);
    all.sort();
    assert_eq!(
        all,
        [
            "etc/cni/net.d/10-eniipam.conflist",
            "opt/cni/bin/eniipam",
            "opt/cni/bin/loopback",
            "opt/cni/bin/portmap",
        ],
        "nothing else (no temp files) on the host"
    );
    let mut check = host.install_args(&conflist);
    check.push("--check".into());
    assert!(ctl(&eniipamd.socket, &check).status.success());

    // 2. containerd with exactly those directories runs pods, as the kubelet would.
    let mut cri = Containerd::start_with_dirs(&mut node, &host.bin(), &host.conf()).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = cri
            .runtime
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(pod_config(&node, i)),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("RunPodSandbox {i}: {}\n{}", s.message(), cri.cni_log(30)))
            .into_inner()
            .pod_sandbox_id;
        let status = cri
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .into_inner()
            .status
            .expect("a status");
        let ip: std::net::Ipv4Addr = status
            .network
            .map(|n| n.ip)
            .unwrap_or_default()
            .parse()
            .expect("the pod has an IPv4 address");
        assert!(mock.subnet().contains(&ip), "{ip} is a VPC address");
        let held = eniipamd.allocations();
        assert!(
            held.iter()
                .any(|a| a.container_id == id && a.ip == Some(ip)),
            "eniipamd holds {ip} for sandbox {id}: {held:?}"
        );
        ids.push(id);
    }
    for id in &ids {
        cri.runtime
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .expect("StopPodSandbox");
        cri.runtime
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .expect("RemovePodSandbox");
    }
    assert!(eniipamd.allocations().is_empty(), "every IP came back");

    // 3. Uninstall: the conflist goes, containerd's network is no longer ready, the plugins stay.
    let out = ctl(
        &eniipamd.socket,
        &[
            "uninstall-cni".into(),
            format!("--host-root={}", host.root.display()),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!installed_conflist.exists());
    assert!(
        host.bin().join("eniipam").exists(),
        "pods' DEL still needs it"
    );
    let mut network_ready = true;
    for _ in 0..100 {
        let conditions = cri
            .runtime
            .status(StatusRequest { verbose: false })
            .await
            .expect("CRI Status")
            .into_inner()
            .status
            .map(|s| s.conditions)
            .unwrap_or_default();
        network_ready = conditions
            .iter()
            .any(|c| c.r#type == "NetworkReady" && c.status);
        if !network_ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !network_ready,
        "containerd still reports NetworkReady without a conflist"
    );

    containerd::stop(&mut node);
    daemon::stop(&mut node);
    drop(mock);
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_gates_the_conflist_on_health_and_removes_it_on_sigterm() {
    let host = FakeHost::new(|p| format!("plugin {p}\n").into_bytes());
    let dir = daemon_support::TempDir::new("install-wait");
    let conflist = dir.0.join("10-eniipam.conflist");
    let shipped = std::fs::read_to_string(repo_file("deploy/10-eniipam.conflist")).unwrap();
    std::fs::write(&conflist, &shipped).unwrap();
    let socket = dir.0.join("eniipam.sock");

    let mut args = host.install_args(&conflist);
    args.extend([
        "--wait".into(),
        "--health-interval-secs=1".into(),
        "--recheck-secs=1".into(),
    ]);
    let mut child = tokio::process::Command::new(target_bin("eniipamctl"))
        .arg("--socket")
        .arg(&socket)
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("eniipamctl install-cni --wait");
    let installed_conflist = host.conf().join("10-eniipam.conflist");

    // The plugins at once; no conflist while no daemon answers.
    wait_for("the plugins", || host.bin().join("portmap").exists()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !installed_conflist.exists(),
        "the conflist was written before eniipamd was healthy"
    );

    // The daemon comes up: the conflist follows.
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let d = daemon_support::start(daemon_support::config(&mock, &dir.0)).await;
    assert_eq!(d.socket_path, socket);
    wait_for("the conflist", || installed_conflist.exists()).await;
    assert_eq!(
        std::fs::read_to_string(&installed_conflist).unwrap(),
        shipped
    );

    // A ConfigMap update reaches the node.
    let edited = shipped.replace("\"mtu\": 9001", "\"mtu\": 1500");
    assert_ne!(edited, shipped);
    std::fs::write(&conflist, &edited).unwrap();
    wait_for("the edited conflist", || {
        std::fs::read_to_string(&installed_conflist).is_ok_and(|c| c == edited)
    })
    .await;

    // SIGTERM: exit 0, the conflist removed, the plugins kept.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().expect("running") as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("install-cni exits on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !installed_conflist.exists(),
        "the conflist outlived install-cni"
    );
    for p in PLUGINS {
        assert!(host.bin().join(p).exists(), "{p} was removed");
    }
    d.shutdown().await;
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}
