//! The kubelet's side of the containerd CRI tests (`tests/cri_containerd.rs`): pod sandbox configs as
//! the kubelet writes them, RunPodSandbox / StopPodSandbox / RemovePodSandbox in parallel, and the
//! kubelet's cleanup of sandboxes left behind. Shared by every address family's scenario, so IPv4,
//! IPv6-only and dual-stack runs differ only in what they check.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eniipam_cri_api::v1::runtime_service_client::RuntimeServiceClient;
use eniipam_cri_api::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PortMapping, Protocol,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest,
};
use tonic::transport::Channel;

use super::containerd::Containerd;
use super::daemon::Eniipamd;
use super::node::Node;
use super::{dir_entries, files_under, reference_plugin, require_program, version_line};

/// How many pods each test runs, and how many RunPodSandbox calls are in flight at once (the kubelet
/// starts pods in parallel).
pub const PODS: usize = 12;
pub const PARALLEL: usize = 4;
pub const HOST_PORT: i32 = 30080;
pub const CONTAINER_PORT: i32 = 80;
pub const CRI_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub host_port: Option<i32>,
}

impl PodSpec {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn config(&self, node: &Node) -> PodSandboxConfig {
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

pub fn pod_specs() -> Vec<PodSpec> {
    (0..PODS)
        .map(|i| PodSpec {
            namespace: if i % 3 == 2 { "team-a" } else { "default" }.to_owned(),
            name: format!("web-{i}"),
            uid: format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), i),
            host_port: (i == 0).then_some(HOST_PORT),
        })
        .collect()
}

pub struct Started {
    pub spec: PodSpec,
    pub id: String,
    pub took: Duration,
}

/// RunPodSandbox for every spec, `PARALLEL` at a time. Returns the started pods and the failures.
pub async fn run_pods(
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
pub async fn stop_and_remove(client: &RuntimeServiceClient<Channel>, ids: &[String]) {
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
pub fn versions(containerd: &Containerd) -> String {
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
pub fn failure_report(
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
            .map(|a| format!("{:?} {:?} {}", a.ip, a.ipv6, a.container_id))
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
pub async fn kubelet_cleanup(
    client: &mut RuntimeServiceClient<Channel>,
    daemon: &Eniipamd,
) -> String {
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
