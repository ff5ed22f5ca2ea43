//! `eniipamd --simulate`: the real daemon against an embedded mockcloud with one simulated node, plus
//! optional synthetic pod churn through the plugin's gRPC client path. Needs no AWS account and no root:
//! state and socket live under a per-user directory, metrics on loopback.
//!
//! [`Simulation`] starts one; `churn` holds the synthetic pods and the status lines; `run` is the
//! binary's `--simulate` mode ([`run()`]: flags checked, the simulation started, served until a signal).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_ec2::config::Credentials;

use crate::config::DaemonConfig;
use crate::daemon::{CloudClients, Daemon, DaemonHandle};

mod churn;
mod run;

pub use churn::{spawn_churn, spawn_status};
pub use run::{SimulateMode, is_bad_config, run};

/// The simulated node when `--instance-type` is not given: an m5.4xlarge holds 7 secondary ENIs ×
/// 29 IPs = 203 pod IP slots, so the README's `--churn 1` settles at about 60 of them in use (see
/// [`ChurnBudget`]) and the pool reaches a steady state; an m5.large (18 slots) would run out.
pub const DEFAULT_INSTANCE_TYPE: &str = "m5.4xlarge";

/// How long a synthetic pod lives, in milliseconds (uniform).
pub const CHURN_LIFETIME_MS: std::ops::Range<u64> = 5_000..30_000;

/// What a churn rate costs the pool in steady state: pods alive (rate × mean lifetime), released IPs
/// still cooling down (rate × `reuse_cooldown`), and up to `max_idle` idle ones. The pool reaches a
/// steady state when that fits the node's capacity; otherwise it runs out of IPs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnBudget {
    pub alive: f64,
    pub cooling: f64,
    pub idle: u32,
}

impl ChurnBudget {
    pub fn new(rate: f64, reuse_cooldown: Duration, max_idle: u32) -> Self {
        let mean_lifetime =
            Duration::from_millis((CHURN_LIFETIME_MS.start + CHURN_LIFETIME_MS.end) / 2);
        Self {
            alive: rate * mean_lifetime.as_secs_f64(),
            cooling: rate * reuse_cooldown.as_secs_f64(),
            idle: max_idle,
        }
    }

    /// IP slots the churn needs at most, rounded up.
    pub fn slots(&self) -> u32 {
        (self.alive + self.cooling).ceil() as u32 + self.idle
    }

    /// Whether `capacity` slots hold it.
    pub fn fits(&self, capacity: u32) -> bool {
        self.slots() <= capacity
    }
}

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
    /// The pool knobs a churn's [`ChurnBudget`] depends on.
    pub reuse_cooldown: Duration,
    pub max_idle: u32,
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
            // Set below, once the simulated VPC exists.
            iam_policy: None,
        })
        .await
        .context("cannot start the embedded mockcloud")?;
        let instance = mock.default_instance();
        let state_path = o.state_dir.join("state.db");
        let cluster_name = if o.base.cluster_name.is_empty() {
            "simulate".to_owned()
        } else {
            o.base.cluster_name.clone()
        };
        // EC2 as a real account has it: the shipped IAM policy (deploy/iam-policy.json) for this
        // cluster and the simulated VPC, evaluated on every call.
        mock.enforce_shipped_policy(&cluster_name)
            .context("the embedded mockcloud has no default world")?;
        let config = DaemonConfig {
            cluster_name,
            socket_path: o.state_dir.join("eniipam.sock"),
            state_path: state_path.clone(),
            metrics_addr: o.metrics_addr,
            // No pods are wired in a simulation: the host's own plugin cache is not ours to read.
            cni_cache_dir: o.state_dir.join("cni-cache"),
            // The simulated ENIs have no links on this machine, and its routing is not ours to change.
            manage_eni_routes: false,
            // The simulated node is in no cluster: the API-server pod GC only when asked for.
            api_server_gc: Some(o.base.api_server_gc == Some(true)),
            region: Some("us-east-1".to_owned()),
            ec2_endpoint: Some(mock.ec2_url()),
            imds_endpoint: Some(instance.imds_url.clone()),
            ..o.base
        };
        config.validate().context("invalid configuration")?;
        let (reuse_cooldown, max_idle) = (
            Duration::from_secs(config.reuse_cooldown_secs),
            config.max_idle,
        );
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
            reuse_cooldown,
            max_idle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_churn_fits_the_default_node_and_not_an_m5_large() {
        // 1 pod/s with the defaults (cooldown 30 s, max_idle 16): 17.5 alive + 30 cooling + 16 idle.
        let b = ChurnBudget::new(1.0, Duration::from_secs(30), 16);
        assert_eq!(b.slots(), 64);
        let m5_4xl = mockcloud::catalog::lookup(DEFAULT_INSTANCE_TYPE).unwrap();
        // eth0's IPs do not serve pods yet: (ENIs − 1) × (IPs − 1).
        assert!(b.fits((m5_4xl.max_enis - 1) * (m5_4xl.ipv4_per_eni - 1)));
        let m5_large = mockcloud::catalog::lookup("m5.large").unwrap();
        assert!(!b.fits((m5_large.max_enis - 1) * (m5_large.ipv4_per_eni - 1)));
        assert!(
            !b.fits(m5_large.max_enis * (m5_large.ipv4_per_eni - 1)),
            "27 slots are not enough either"
        );
        // Without churn only the idle pool counts.
        assert_eq!(
            ChurnBudget::new(0.0, Duration::from_secs(30), 10).slots(),
            10
        );
    }
}
