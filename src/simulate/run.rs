//! The binary's `--simulate` mode: its flags checked, the simulation started and described, an
//! optional churn checked against the node's capacity and started, status lines, until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::{
    ChurnBudget, DEFAULT_INSTANCE_TYPE, Simulation, SimulationOptions, default_state_dir,
    spawn_churn, spawn_status,
};
use crate::config::{DaemonConfig, Env, LogFormat};
use crate::daemon::DaemonError;

/// What `eniipamd --simulate` was asked for (its flags, see `eniipamd --help`).
#[derive(Clone, Debug)]
pub struct SimulateMode {
    /// The simulated node's instance type.
    pub instance_type: String,
    /// Synthetic pods per second (0 = none), at most 1000.
    pub churn: f64,
    /// Where state and the socket go (default: [`default_state_dir`]).
    pub state_dir: Option<PathBuf>,
    /// Metrics address (default 127.0.0.1:0, a free port).
    pub metrics_addr: Option<SocketAddr>,
    /// mockcloud latency profile, `realistic` or `fast`.
    pub profile: String,
    /// Run a churn the node cannot hold, to watch it run out.
    pub exhaust: bool,
    /// `ipv4`, `ipv6` or `dual`: overrides `ENIIPAM_IP_FAMILY`.
    pub ip_family: Option<String>,
}

/// A `--simulate` flag or variable with a bad value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadArgs(String);

/// Whether `e` (from [`run`]) is a bad flag or configuration (exit 78) rather than a failure.
pub fn is_bad_config(e: &anyhow::Error) -> bool {
    e.is::<BadArgs>()
        || matches!(
            e.downcast_ref::<DaemonError>(),
            Some(DaemonError::Config(_))
        )
}

/// `eniipamd --simulate`: knobs from `env` (`ENIIPAM_*`; endpoints and paths are the simulation's),
/// text logs, the simulation started and described on stdout, the churn (refused with what would
/// fit when the node cannot hold it, unless `exhaust`), status lines every 5 s, until SIGTERM or
/// Ctrl-C.
pub async fn run(mode: SimulateMode, env: &dyn Env) -> anyhow::Result<()> {
    if !(0.0..=1000.0).contains(&mode.churn) {
        return Err(BadArgs(format!(
            "--churn must be between 0 and 1000 pods per second, not {}",
            mode.churn
        ))
        .into());
    }
    let state_dir = match mode.state_dir {
        Some(d) => d,
        None => default_state_dir()
            .context("cannot find a per-user state directory: pass --state-dir")?,
    };
    let mut env_config = DaemonConfig::load(None, env).map_err(|e| BadArgs(e.to_string()))?;
    if let Some(f) = &mode.ip_family {
        env_config.ip_family = f
            .parse()
            .map_err(|e: String| BadArgs(format!("--ip-family: {e}")))?;
        env_config.validate().map_err(|e| BadArgs(e.to_string()))?;
    }
    if env_config.ip_family == crate::ipv6::IpFamily::Ipv6 && mode.churn > 0.0 {
        return Err(BadArgs(
            "--churn drives IPv4 pods (it writes the plugin's IPv4 result cache); with --ip-family ipv6 \
             there are none: use --ip-family dual, or drive IPv6 pods with the CNI plugin"
                .to_owned(),
        )
        .into());
    }
    env_config.log_format = LogFormat::Text;
    crate::telemetry::init_logging(env_config.log_format, &env_config.log_level);
    let sim = Simulation::start(SimulationOptions {
        instance_type: mode.instance_type,
        state_dir,
        metrics_addr: mode
            .metrics_addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        profile: mode.profile,
        base: env_config,
    })
    .await?;
    print_where(&sim);
    if mode.churn > 0.0 {
        let capacity = sim.daemon.pool.snapshot().capacity;
        let budget = ChurnBudget::new(mode.churn, sim.reuse_cooldown, sim.max_idle);
        let need = format!(
            "--churn {} needs about {} IP slots ({:.0} pods alive, {:.0} released IPs cooling down, up to {} idle)",
            mode.churn,
            budget.slots(),
            budget.alive,
            budget.cooling,
            budget.idle
        );
        if budget.fits(capacity) {
            println!(
                "churn:    {need}; this node has {capacity}: it settles into a steady state. Watch `assigned` \
                 and `cooling` level off in the status lines."
            );
        } else if mode.exhaust {
            println!(
                "churn:    {need}; this node has {capacity}: it will run out (--exhaust). Watch for EXHAUSTED \
                 in the status lines and `eniipam_exhausted 1` in the metrics."
            );
        } else {
            let instance_type = sim.daemon.node.instance_type.clone();
            sim.daemon.shutdown().await;
            return Err(BadArgs(format!(
                "{need}, but a simulated {} has {capacity}: it would run out of IPs. Pick a lower --churn, a \
                 larger --instance-type (the default {} has room for --churn 1), or add --exhaust to watch it \
                 run out",
                instance_type, DEFAULT_INSTANCE_TYPE
            ))
            .into());
        }
    }
    let churn = (mode.churn > 0.0).then(|| {
        spawn_churn(
            sim.daemon.socket_path.clone(),
            sim.cni_cache_dir.clone(),
            mode.churn,
        )
    });
    let status = spawn_status(sim.daemon.pool.clone(), Duration::from_secs(5));
    crate::daemon::run::wait_for_signal().await?;
    if let Some(c) = churn {
        c.abort();
    }
    status.abort();
    sim.daemon.shutdown().await;
    Ok(())
}

/// Where everything is, on stdout.
fn print_where(sim: &Simulation) {
    let d = &sim.daemon;
    println!(
        "eniipamd is serving (simulated node {} {})",
        d.node.instance_id, d.node.instance_type
    );
    println!("  socket:   {}", d.socket_path.display());
    println!("  metrics:  http://{}/metrics", d.metrics_addr);
    println!("  ready:    http://{}/readyz", d.metrics_addr);
    println!("  state:    {}", sim.state_path.display());
    if let Some(p) = d.ipam().ipv6() {
        println!(
            "  ipv6:     {} on {} ({}): pods get addresses of it",
            p.prefix(),
            p.eni_id,
            d.ipam().family()
        );
    }
    println!(
        "  mockcloud EC2: {}   control: {}",
        sim.mock.ec2_url(),
        sim.mock.control_url()
    );
    println!(
        "  try:      cargo run --bin eniipamctl -- --socket {} status",
        d.socket_path.display()
    );
    println!("Ctrl-C (or SIGTERM) stops it; pods' IPs stay recorded in the state file.");
}
