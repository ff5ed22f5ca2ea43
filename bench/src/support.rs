//! Shared set-up: temp dirs, the binaries next to this one, mockcloud, a real daemon, gRPC clients.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use aws_sdk_ec2::config::Credentials;
use eniipam::config::DaemonConfig;
use eniipam::daemon::{CloudClients, Daemon, DaemonHandle};
use eniipam_api::pb::ipam_client::IpamClient;
use eniipam_api::{API_VERSION, pb};
use mockcloud::MockCloud;
use tonic::transport::Channel;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!(
            "eniipam-bench-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The directory holding this binary (`target/release`): the plugin and daemon binaries live there.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the running binary")?;
    exe.parent()
        .map(Path::to_path_buf)
        .context("the running binary has no parent directory")
}

/// Builds `eniipamd` with cargo into this binary's target directory and profile, and the CNI plugin
/// `eniipam` exactly as it ships (`crates/cni/build-plugin.sh`, which deploy/Dockerfile runs too:
/// static, not position-independent, profile `plugin`), placed next to this binary; so a
/// `cargo run --release -p eniipam-bench` measures the daemon of this source tree and the plugin as the
/// image carries it.
pub fn build_binaries() -> anyhow::Result<()> {
    let dir = bin_dir()?;
    let profile = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("release")
        .to_owned();
    let target_dir = dir.parent().context("no target directory")?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("no workspace")?;

    let mut daemon = plain_cargo_env(Command::new(
        std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
    ));
    daemon
        .current_dir(workspace)
        .arg("build")
        // With the bench selected too, cargo unifies features as it did for this binary, so the
        // shared dependency tree (the AWS SDK) is reused instead of being built a second time. The
        // plugin's package stays selected for the same reason (the same feature set as every earlier
        // build); its workspace-profile binary is replaced below by the one that ships.
        .args(["-p", "eniipam-bench", "-p", "eniipam", "-p", "eniipam-cni"])
        .args(["--bin", "eniipam", "--bin", "eniipamd"])
        .arg("--target-dir")
        .arg(target_dir);
    match profile.as_str() {
        "release" => {
            daemon.arg("--release");
        }
        "debug" => {}
        other => {
            daemon.args(["--profile", other]);
        }
    }
    eprintln!(
        "building eniipamd ({profile}) into {} ...",
        target_dir.display()
    );
    let status = daemon.status().context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build of eniipamd failed ({status})");
    }

    let script = workspace.join("crates/cni/build-plugin.sh");
    eprintln!(
        "building the eniipam plugin as shipped ({} host) ...",
        script.display()
    );
    let mut plugin = plain_cargo_env(Command::new("bash"));
    let out = plugin
        .current_dir(workspace)
        .arg(&script)
        .arg("host")
        .arg("--target-dir")
        .arg(target_dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let built = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // Next to this binary, where every scenario looks for it. Through a rename, so a hard link cargo
    // may have left at that name (to an artifact in deps/) is replaced, never written through.
    let placed = dir.join("eniipam");
    let staging = dir.join(".eniipam.shipped");
    std::fs::copy(&built, &staging)
        .with_context(|| format!("copying {} to {}", built.display(), staging.display()))?;
    std::fs::rename(&staging, &placed)
        .with_context(|| format!("moving {} to {}", staging.display(), placed.display()))?;
    eprintln!(
        "the plugin measured: {} (from {})",
        placed.display(),
        built.display()
    );
    Ok(())
}

/// `cmd` without the variables `cargo run` gave this process: the bench package's CARGO_PKG_*,
/// CARGO_MANIFEST_* ... Build scripts (ring, aws-lc-sys) track some of them, so passing them on would
/// make cargo see a changed environment and rebuild the whole AWS SDK tree. Build as from a plain
/// shell.
fn plain_cargo_env(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let keep = matches!(
            k.as_ref(),
            "CARGO_HOME" | "CARGO_TARGET_DIR" | "CARGO_BUILD_JOBS"
        );
        if (k.starts_with("CARGO_") && !keep) || k == "OUT_DIR" || k == "LD_LIBRARY_PATH" {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// A binary next to this one, which must exist.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let p = bin_dir()?.join(name);
    if !p.is_file() {
        bail!(
            "{} not found: run without --no-build (the bench builds eniipamd, and the plugin with crates/cni/build-plugin.sh)",
            p.display()
        );
    }
    Ok(p)
}

/// mockcloud with one instance of `instance_type`, fast or realistic.
pub async fn mock(instance_type: &str, realistic: bool) -> anyhow::Result<MockCloud> {
    let base = if realistic {
        mockcloud::Config::realistic()
    } else {
        mockcloud::Config::fast()
    };
    MockCloud::start(mockcloud::Config {
        default_instance_type: instance_type.into(),
        ..base
    })
    .await
    .context("cannot start mockcloud")
}

/// The cluster name of the benchmark's daemons.
pub const CLUSTER: &str = "bench";

/// A daemon config for `mock`'s default instance with its state under `dir`; node rate limits as
/// shipped (the limiter is part of what is measured). `mock` enforces the shipped IAM policy for
/// the benchmark's cluster in its default VPC, as EC2 would.
pub fn daemon_config(mock: &MockCloud, dir: &Path) -> DaemonConfig {
    let inst = mock.default_instance();
    mock.enforce_shipped_policy(CLUSTER);
    DaemonConfig {
        cluster_name: CLUSTER.into(),
        socket_path: dir.join("eniipam.sock"),
        state_path: dir.join("state.db"),
        metrics_addr: "127.0.0.1:0".parse().expect("literal"),
        cni_cache_dir: dir.join("cni-cache"),
        region: Some("us-east-1".into()),
        ec2_endpoint: Some(mock.ec2_url()),
        imds_endpoint: Some(inst.imds_url),
        reconcile_period_secs: 3600,
        shutdown_grace_secs: 5,
        // The benchmark's ENIs are mockcloud's: no routing of them in the machine's namespace.
        manage_eni_routes: false,
        ..DaemonConfig::default()
    }
}

pub fn credentials() -> Credentials {
    Credentials::new("BENCH", "bench", None, None, "eniipam-bench")
}

pub async fn clients(config: &DaemonConfig) -> anyhow::Result<CloudClients> {
    CloudClients::from_config(config, Some(credentials()))
        .await
        .context("cannot build the cloud clients")
}

/// `Daemon::start_with` with the usual clients.
pub async fn start_daemon(config: DaemonConfig) -> anyhow::Result<DaemonHandle> {
    let clients = clients(&config).await?;
    Daemon::start_with(config, clients)
        .await
        .context("eniipamd failed to start")
}

/// Waits until the pool has at least `n` idle IPs any pod may take.
pub async fn wait_idle(d: &DaemonHandle, n: u32, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let s = d.pool.snapshot();
        if s.idle_eligible >= n && s.in_flight == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the pool did not warm to {n} idle IPs within {timeout:?} (idle {}, in flight {})",
                s.idle_eligible,
                s.in_flight
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn client(socket: &Path) -> anyhow::Result<IpamClient<Channel>> {
    Ok(IpamClient::new(
        eniipam_api::connect(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?,
    ))
}

/// The namespace of every pod the benchmarks start.
pub const POD_NAMESPACE: &str = "bench";

/// The UID of the benchmarks' pod `name`.
pub fn pod_uid(name: &str) -> String {
    format!("uid-{name}")
}

pub fn alloc_req(container: &str) -> pb::AllocateRequest {
    pb::AllocateRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        pod: Some(pb::Pod {
            namespace: POD_NAMESPACE.into(),
            name: container.into(),
            uid: pod_uid(container),
        }),
        network: "bench".into(),
        ..Default::default()
    }
}

pub fn release_req(container: &str) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        api_version: API_VERSION,
        container_id: container.into(),
        ifname: "eth0".into(),
        sticky: false,
        network: "bench".into(),
        ..Default::default()
    }
}

/// Allocates `n` pods named `{prefix}-{i}` with `concurrency` clients, retrying "exhausted" answers a
/// bounded number of times (and saying so on stderr); returns how many succeeded and the first error.
pub async fn fill(
    socket: &Path,
    prefix: &str,
    n: u32,
    concurrency: u32,
) -> anyhow::Result<(u32, Option<String>)> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let retries = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let mut c = client(socket).await?;
        let next = next.clone();
        let retries = retries.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            let mut err = None;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                // Near full capacity an ADD can find every slot taken by IPs still in flight (a
                // warm-up racing the last pods): the pool answers "exhausted" rather than waiting.
                // The runtime would retry such a pod; so do we, a bounded number of times.
                let mut attempts = 0;
                loop {
                    match c.allocate(alloc_req(&format!("{prefix}-{i}"))).await {
                        Ok(_) => {
                            ok += 1;
                            break;
                        }
                        Err(s) if s.code() == tonic::Code::ResourceExhausted && attempts < 50 => {
                            attempts += 1;
                            retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(s) => {
                            err.get_or_insert_with(|| format!("{:?}: {}", s.code(), s.message()));
                            break;
                        }
                    }
                }
            }
            (ok, err)
        }));
    }
    let mut ok = 0;
    let mut first_err = None;
    for t in tasks {
        let (o, e) = t.await?;
        ok += o;
        if first_err.is_none() {
            first_err = e;
        }
    }
    let retries = retries.load(std::sync::atomic::Ordering::Relaxed);
    if retries > 0 {
        eprintln!(
            "fill {prefix}: {retries} ADDs answered \"exhausted\" near capacity and were retried"
        );
    }
    Ok((ok, first_err))
}

/// Peak and current resident set of a process, in KiB, from `/proc/<pid>/status`.
pub fn proc_rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}
