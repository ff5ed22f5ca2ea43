//! `eniipamd --simulate`: the real daemon against an embedded mockcloud with one simulated node, plus
//! optional synthetic pod churn through the plugin's gRPC client path. Needs no AWS account and no root:
//! state and socket live under a per-user directory, metrics on loopback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_ec2::config::Credentials;
use rand::Rng;
use tokio::task::JoinHandle;

use crate::config::DaemonConfig;
use crate::daemon::{CloudClients, Daemon, DaemonHandle};
use crate::pool::Pool;

/// Per-user state directory: `$XDG_STATE_HOME/eniipam-simulate` or `~/.local/state/eniipam-simulate`.
pub fn default_state_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("eniipam-simulate"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/eniipam-simulate"))
}

/// What a simulation needs.
pub struct SimulationOptions {
    pub instance_type: String,
    pub state_dir: PathBuf,
    pub metrics_addr: SocketAddr,
    /// mockcloud profile: `realistic` or `fast`.
    pub profile: String,
    /// Knobs from the environment (pool sizes, rates...); endpoints and paths are set here.
    pub base: DaemonConfig,
}

/// A running simulation.
pub struct Simulation {
    pub mock: mockcloud::MockCloud,
    pub daemon: DaemonHandle,
    pub state_path: PathBuf,
    /// The plugin result cache churn writes to (also what the daemon reads at startup).
    pub cni_cache_dir: PathBuf,
}

impl Simulation {
    pub async fn start(o: SimulationOptions) -> anyhow::Result<Self> {
        let latency = mockcloud::LatencyProfile::named(&o.profile).with_context(|| {
            format!(
                "--profile must be `fast` or `realistic`, not {:?}",
                o.profile
            )
        })?;
        if mockcloud::catalog::lookup(&o.instance_type).is_none() {
            anyhow::bail!(
                "--instance-type {:?} is not simulated (known: {})",
                o.instance_type,
                mockcloud::catalog::CATALOG
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        std::fs::create_dir_all(&o.state_dir).with_context(|| {
            format!(
                "cannot create the state directory {}",
                o.state_dir.display()
            )
        })?;
        let mock = mockcloud::MockCloud::start(mockcloud::Config {
            latency,
            throttling: mockcloud::Throttling::default(),
            seed_default_world: true,
            default_instance_type: o.instance_type.clone(),
            region: "us-east-1".to_owned(),
        })
        .await
        .context("cannot start the embedded mockcloud")?;
        let instance = mock.default_instance();
        let state_path = o.state_dir.join("state.db");
        let config = DaemonConfig {
            cluster_name: if o.base.cluster_name.is_empty() {
                "simulate".to_owned()
            } else {
                o.base.cluster_name.clone()
            },
            socket_path: o.state_dir.join("eniipam.sock"),
            state_path: state_path.clone(),
            metrics_addr: o.metrics_addr,
            // No pods are wired in a simulation: the host's own plugin cache is not ours to read.
            cni_cache_dir: o.state_dir.join("cni-cache"),
            // The simulated ENIs have no links on this machine, and its routing is not ours to change.
            manage_eni_routes: false,
            region: Some("us-east-1".to_owned()),
            ec2_endpoint: Some(mock.ec2_url()),
            imds_endpoint: Some(instance.imds_url.clone()),
            ..o.base
        };
        config.validate().context("invalid configuration")?;
        // Every simulation is a fresh instance: a state file from an earlier run belongs to another
        // instance id, and the daemon ignores it (and says so).
        let clients = CloudClients::from_config(
            &config,
            Some(Credentials::new(
                "SIMULATE",
                "simulate",
                None,
                None,
                "eniipamd-simulate",
            )),
        )
        .await?;
        let daemon = Daemon::start_with(config, clients)
            .await
            .context("eniipamd failed to start")?;
        Ok(Self {
            mock,
            daemon,
            state_path,
            cni_cache_dir: o.state_dir.join("cni-cache"),
        })
    }
}

/// Synthetic pods through the plugin's own code path: every `1/rate` s one pod is added with
/// [`crate::cni::command::run`] in its IPAM role (exactly what the `eniipam` binary executes, with a CNI
/// environment and stdin; the IPAM role wires nothing), lives 5–30 s, and is deleted the same way.
/// Pods name the daemon's own network namespace (`/proc/self/ns/net`), which always exists.
pub fn spawn_churn(socket: PathBuf, cache_dir: PathBuf, rate: f64) -> JoinHandle<()> {
    let config = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "simulate",
        "type": "ptp",
        "ipam": {"type": "eniipam", "socket": socket, "cache_dir": cache_dir},
    })
    .to_string();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            let config = config.clone();
            let lifetime = Duration::from_millis(rand::rng().random_range(5_000..30_000));
            tokio::spawn(async move {
                let id = format!("churn-{n:08}");
                let env = |command: &str| -> std::collections::BTreeMap<String, String> {
                    [
                        ("CNI_COMMAND", command.to_owned()),
                        ("CNI_CONTAINERID", id.clone()),
                        ("CNI_NETNS", "/proc/self/ns/net".to_owned()),
                        ("CNI_IFNAME", "eth0".to_owned()),
                        ("CNI_PATH", "/opt/cni/bin".to_owned()),
                        (
                            "CNI_ARGS",
                            format!(
                                "K8S_POD_NAMESPACE=churn;K8S_POD_NAME=pod-{n};K8S_POD_UID={id}"
                            ),
                        ),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect()
                };
                let add = run_plugin(env("ADD"), config.clone()).await;
                if add.exit_code != 0 {
                    tracing::warn!(pod = %id, error = %add.stdout, "churn ADD failed");
                    return;
                }
                tracing::debug!(pod = %id, result = %add.stdout, "churn ADD");
                tokio::time::sleep(lifetime).await;
                let del = run_plugin(env("DEL"), config).await;
                if del.exit_code != 0 {
                    tracing::warn!(pod = %id, error = %del.stdout, "churn DEL failed");
                }
            });
        }
    })
}

/// One plugin invocation, on its own thread with a current-thread runtime, as the binary runs it.
async fn run_plugin(
    env: std::collections::BTreeMap<String, String>,
    stdin: String,
) -> crate::cni::command::Outcome {
    let failed = |msg: String| crate::cni::command::Outcome {
        stdout: msg,
        exit_code: 1,
    };
    tokio::task::spawn_blocking(move || {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(crate::cni::command::run(&env, stdin.as_bytes())),
            Err(e) => failed(format!("cannot start a runtime: {e}")),
        }
    })
    .await
    .unwrap_or_else(|e| crate::cni::command::Outcome {
        stdout: format!("plugin invocation panicked: {e}"),
        exit_code: 1,
    })
}

/// One status line every `every`.
pub fn spawn_status(pool: Pool, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let s = pool.snapshot();
            println!(
                "pool: {} ENIs, capacity {}, assigned {}, idle {} (+{} cooling, {} sticky), in flight {}{}",
                s.enis.len(),
                s.capacity,
                s.assigned,
                s.idle_eligible,
                s.cooling,
                s.reserved,
                s.in_flight,
                s.exhaustion
                    .as_ref()
                    .map(|r| format!(", EXHAUSTED: {r}"))
                    .unwrap_or_default()
            );
        }
    })
}
