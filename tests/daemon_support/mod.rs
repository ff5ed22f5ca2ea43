//! Shared setup of the daemon tests: a mockcloud, a daemon config pointed at it, gRPC clients.

#![allow(dead_code)]

pub mod ipv6;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use aws_sdk_ec2::config::Credentials;
use eniipam::config::DaemonConfig;
use eniipam::daemon::{CloudClients, Daemon, DaemonHandle};
use eniipam::rpc::pb::ipam_client::IpamClient;
use eniipam::rpc::{API_VERSION, pb};
use mockcloud::MockCloud;
use tonic::transport::Channel;

/// The cluster name of [`config`].
pub const CLUSTER: &str = "test";

/// A daemon config for `mock`'s default instance with state under `dir`; `mock` enforces the
/// shipped IAM policy for its cluster, as every daemon-level test does (a call the policy refuses
/// fails the daemon as it would on AWS; a test that changes the cluster name calls
/// `MockCloud::enforce_shipped_policy` again with the new name).
///
/// Single secondary IPs (`burst_prefixes` off; the shipped default is on): the daemon-level tests'
/// assertions on ENIs, calls and addresses are written for that structure (a pod beyond eth0's
/// slots starts a new ENI, each assign brings what its batch asked for), which non-Nitro types
/// keep. The shipped burst prefixes are tested through the daemon in `tests/daemon_burst.rs`, through the pool in `tests/pool_mockcloud.rs`, and at fleet
/// scale by `eniipam-bench fleet`.
pub fn config(mock: &MockCloud, dir: &Path) -> DaemonConfig {
    let inst = mock.default_instance();
    mock.enforce_shipped_policy(CLUSTER)
        .expect("a default world");
    DaemonConfig {
        cluster_name: CLUSTER.into(),
        socket_path: dir.join("eniipam.sock"),
        state_path: dir.join("state.db"),
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        cni_cache_dir: dir.join("cni-cache"),
        // Pods' network namespaces in these tests are files in the test's directory, or namespaces
        // `ip netns add` made.
        netns_dirs: vec![
            dir.to_path_buf(),
            "/run/netns".into(),
            "/var/run/netns".into(),
        ],
        manage_eni_routes: false,
        region: Some("us-east-1".into()),
        ec2_endpoint: Some(mock.ec2_url()),
        imds_endpoint: Some(inst.imds_url),
        ec2_mutating_qps: 100.0,
        ec2_mutating_burst: 100,
        ec2_describe_qps: 100.0,
        ec2_describe_burst: 100,
        burst_prefixes: false,
        ..DaemonConfig::default()
    }
}

pub async fn start(config: DaemonConfig) -> DaemonHandle {
    let clients = CloudClients::from_config(
        &config,
        Some(Credentials::new("a", "b", None, None, "test")),
    )
    .await
    .expect("clients");
    Daemon::start_with(config, clients)
        .await
        .expect("daemon starts")
}

pub async fn client(socket: &Path) -> IpamClient<Channel> {
    IpamClient::new(eniipam::rpc::connect(socket).await.expect("connect"))
}

pub fn alloc_req(container: &str, pod: &str) -> pb::AllocateRequest {
    pb::AllocateRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        pod: Some(pb::Pod {
            namespace: "default".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
        }),
        network: "eniipam".into(),
        ..Default::default()
    }
}

/// The instance's eth0 as EC2 has it.
#[allow(dead_code)] // not every binary that includes this module looks at eth0
pub fn eth0_in_ec2(mock: &MockCloud, instance_id: &str) -> mockcloud::world::EniView {
    mock.instance(instance_id)
        .unwrap()
        .enis
        .into_iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .expect("eth0")
}

/// One burst: pods `c{i}`/`p{i}` for each `i` of `range`, every client connected first, then every
/// ADD at once; their IPv4s, in the order the answers came (each ADD must succeed).
#[allow(dead_code)] // not every binary that includes this module bursts
pub async fn allocate_all(socket: &Path, range: std::ops::Range<usize>) -> Vec<Ipv4Addr> {
    let mut clients = Vec::new();
    for i in range {
        clients.push((i, client(socket).await));
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, mut c) in clients {
        set.spawn(async move {
            c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                .await
                .map(|r| r.into_inner().ip.parse::<Ipv4Addr>().unwrap())
        });
    }
    let mut ips = Vec::new();
    while let Some(r) = set.join_next().await {
        ips.push(r.unwrap().expect("every pod of the burst is served"));
    }
    ips
}

/// The IPv4 the daemon answers an ADD of `container` for `pod` with (the ADD must succeed).
pub async fn add_ip(c: &mut IpamClient<Channel>, container: &str, pod: &str) -> Ipv4Addr {
    let r = c
        .allocate(alloc_req(container, pod))
        .await
        .unwrap()
        .into_inner();
    r.ip.parse().expect("an IPv4 in the answer")
}

pub fn release_req(container: &str, sticky: bool) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        sticky,
        network: "eniipam".into(),
        ..Default::default()
    }
}

/// The pod addresses EC2 holds on the instance's ENIs, eth0 included: secondary IPs and the
/// addresses of delegated prefixes.
pub fn ec2_pod_ips(mock: &MockCloud) -> Vec<Ipv4Addr> {
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    let mut ips: Vec<Ipv4Addr> = inst
        .enis
        .iter()
        .filter(|e| e.attachment.is_some())
        .flat_map(|e| {
            e.secondary_ips.iter().copied().chain(
                e.ipv4_prefixes
                    .iter()
                    .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p)),
            )
        })
        .collect();
    ips.sort();
    ips
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new directory `eniipam-{tag}-XXXXXX` (`tempfile` picks a name no other test holds: two
    /// tests of one binary starting in the same clock tick once shared a pid-and-nanoseconds name,
    /// and the second daemon found the first's socket in use).
    pub fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("eniipam-{tag}-"))
            .tempdir()
            .expect("temp dir");
        Self(dir.keep())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small tmpfs the test can fill up (a disk-full state file), unmounted on drop. `None` when the
/// test cannot mount (not root).
pub struct SmallDisk {
    dir: TempDir,
}

impl SmallDisk {
    pub fn mount(tag: &str) -> Option<Self> {
        let dir = TempDir::new(&format!("disk-{tag}"));
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                "size=8m",
                "eniipam-test",
                &dir.0.display().to_string(),
            ])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir.0
    }

    /// Fills every free byte with a ballast file.
    pub fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.0.join("ballast")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }

    /// Removes the ballast.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.dir.0.join("ballast"));
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir.0)
            .status();
    }
}

/// `cond`, polled every 50 ms, or a panic naming `what` after 20 s.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The value of the sample whose line starts with `series` (a name, with its labels if any) in
/// OpenMetrics text.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The daemon's `/metrics` text.
pub async fn scrape(d: &DaemonHandle) -> String {
    reqwest::get(format!("http://{}/metrics", d.metrics_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
