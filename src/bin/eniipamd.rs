//! `eniipamd`: the node daemon. A thin main over [`eniipam::daemon::Daemon`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use eniipam::config::{DaemonConfig, ProcessEnv};
use eniipam::daemon::Daemon;

/// Pod IP address management for Kubernetes on EC2: keeps a warm pool of VPC secondary IPs on this
/// node's ENIs and serves them to the `eniipam` CNI plugin over a unix socket.
#[derive(Parser, Debug)]
#[command(name = "eniipamd", version)]
struct Args {
    /// TOML config file; `ENIIPAM_*` environment variables override it (see docs/config.md).
    #[arg(long, env = "ENIIPAM_CONFIG")]
    config: Option<PathBuf>,
    /// Run against an embedded simulated EC2 + IMDS (mockcloud) with one simulated node: no AWS
    /// account and no root needed. State goes under a per-user directory.
    #[arg(long)]
    simulate: bool,
    /// With --simulate: the simulated node's instance type.
    #[arg(long, default_value = eniipam_simulate_default_type(), requires = "simulate")]
    instance_type: String,
    /// With --simulate: drive synthetic pod ADD/DEL through the plugin's own code path (IPAM role, no
    /// wiring) at this many pods per second (0 = none).
    #[arg(
        long,
        default_value_t = 0.0,
        requires = "simulate",
        allow_negative_numbers = true
    )]
    churn: f64,
    /// With --simulate: where to keep state and the socket (default: $XDG_STATE_HOME/eniipam-simulate
    /// or ~/.local/state/eniipam-simulate).
    #[arg(long, requires = "simulate")]
    state_dir: Option<PathBuf>,
    /// With --simulate: metrics address (default 127.0.0.1:0, a free port).
    #[arg(long, requires = "simulate")]
    metrics_addr: Option<SocketAddr>,
    /// With --simulate: mockcloud latency profile, `realistic` or `fast`.
    #[arg(long, default_value = "realistic", requires = "simulate")]
    profile: String,
    /// With --simulate --churn: run even when the churn needs more IP slots than the node has, to
    /// watch the pool run out (EXHAUSTED in the status lines, CNI error 11 on ADD). Without it such a
    /// combination is refused with what would fit.
    #[arg(long, requires = "simulate")]
    exhaust: bool,
    /// Remove the host rules eniipamd keeps (the nftables table `ip eniipam`, the `fwmark` policy
    /// rule) and exit. For a node eniipam is being removed from: a stopping daemon leaves them in
    /// place so pod egress and NodePort replies survive restarts.
    #[arg(long, conflicts_with = "simulate")]
    uninstall_host_rules: bool,
    /// Prepare the node's kernel settings the data path needs and exit: the primary interface (found
    /// by eth0's MAC from IMDS) gets `rp_filter` 2 (loose) when it is 1 (strict), so the SNATed
    /// replies of pods on secondary ENIs and their NodePort and load-balancer traffic are not
    /// dropped (needed with `manage_eni_routes` when SNAT is on, `external_snat` off, or
    /// `node_port_support` is on). For a privileged init container: the daemon's own container sees
    /// `/proc/sys` read-only.
    #[arg(long, conflicts_with_all = ["simulate", "uninstall_host_rules"])]
    prepare_host: bool,
}

/// `--instance-type`'s default (the simulated node's; a constant string when `simulate` is off).
const fn eniipam_simulate_default_type() -> &'static str {
    #[cfg(feature = "simulate")]
    {
        eniipam::simulate::DEFAULT_INSTANCE_TYPE
    }
    #[cfg(not(feature = "simulate"))]
    {
        "m5.4xlarge"
    }
}

/// How `eniipamd` ends, and its exit code: the one place errors become exit codes (listed in
/// `docs/operations.md`).
enum Exit {
    /// Stopped by SIGTERM or Ctrl-C after serving.
    Stopped,
    /// The configuration (file, `ENIIPAM_*` variables or flags) is invalid: fix it, restarting won't help.
    BadConfig(anyhow::Error),
    /// Starting or running failed (EC2 or IMDS unreachable, state file, socket in use...): a restart
    /// may help once the cause is gone.
    Failed(anyhow::Error),
}

impl Exit {
    fn code(&self) -> ExitCode {
        match self {
            Self::Stopped => ExitCode::SUCCESS,
            Self::Failed(_) => ExitCode::from(1),
            // EX_CONFIG from sysexits.h (2 is clap's for a malformed command line).
            Self::BadConfig(_) => ExitCode::from(78),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let exit = if args.simulate {
        run_simulate(args).await
    } else if args.uninstall_host_rules {
        uninstall_host_rules(args).await
    } else if args.prepare_host {
        prepare_host(args).await
    } else {
        run(args).await
    };
    match &exit {
        Exit::Stopped => {}
        Exit::BadConfig(e) => eprintln!("eniipamd: invalid configuration: {e:#}"),
        Exit::Failed(e) => eprintln!("eniipamd: {e:#}"),
    }
    exit.code()
}

async fn run(args: Args) -> Exit {
    let config = match DaemonConfig::load(args.config.as_deref(), &ProcessEnv) {
        Ok(c) => c,
        Err(e) => return Exit::BadConfig(e.into()),
    };
    if config.cluster_name.is_empty() {
        return Exit::BadConfig(anyhow::anyhow!(
            "cluster_name is empty: set ENIIPAM_CLUSTER_NAME (in the DaemonSet: the ENIIPAM_CLUSTER_NAME key of \
             the eniipam-config ConfigMap, deploy/configmap.yaml) or `cluster_name` in the config file. It tags \
             the ENIs eniipam creates, the IAM policy is scoped to it, and the leaked-ENI collector uses it \
             (use --simulate to try eniipam without a cluster)"
        ));
    }
    eniipam::telemetry::init_logging(config.log_format, &config.log_level);
    let daemon = match Daemon::start(config).await {
        Ok(d) => d,
        Err(e @ eniipam::daemon::DaemonError::Config(_)) => return Exit::BadConfig(e.into()),
        Err(e) => return Exit::Failed(anyhow::Error::new(e).context("eniipamd failed to start")),
    };
    let signal = wait_for_signal().await;
    daemon.shutdown().await;
    match signal {
        Ok(()) => Exit::Stopped,
        Err(e) => Exit::Failed(e),
    }
}

async fn uninstall_host_rules(args: Args) -> Exit {
    let config = match DaemonConfig::load(args.config.as_deref(), &ProcessEnv) {
        Ok(c) => c,
        Err(e) => return Exit::BadConfig(e.into()),
    };
    let removed = async {
        eniipam::host::HostRules::new(eniipam::host::Nft::default())?
            .uninstall(config.connmark)
            .await
    };
    match removed.await {
        Ok(r) => {
            println!(
                "eniipamd: host rules removed (nftables table ip {}: {}; fwmark rules: {})",
                eniipam::host::TABLE,
                if r.table { "deleted" } else { "absent" },
                r.fwmark_rules
            );
            Exit::Stopped
        }
        Err(e) => Exit::Failed(anyhow::Error::new(e).context("removing the host rules")),
    }
}

async fn prepare_host(args: Args) -> Exit {
    let config = match DaemonConfig::load(args.config.as_deref(), &ProcessEnv) {
        Ok(c) => c,
        Err(e) => return Exit::BadConfig(e.into()),
    };
    // SNAT needs a loose rp_filter as much as NodePort support does (issue 23): see
    // `HostRulesConfig::needs_loose_rp_filter`.
    if !(config.manage_eni_routes && config.host_rules_config().needs_loose_rp_filter()) {
        println!(
            "eniipamd: nothing to prepare (manage_eni_routes is off, or external_snat is on and node_port_support \
             off): rp_filter left as it is"
        );
        return Exit::Stopped;
    }
    let prepared = async {
        let clients = eniipam::daemon::CloudClients::from_config(&config, None)
            .await
            .context("building the IMDS client")?;
        let mac = clients
            .metadata
            .identity()
            .await
            .context("reading eth0's MAC from IMDS")?
            .mac;
        let rules = eniipam::host::HostRules::new(eniipam::host::Nft::default())?;
        let link = rules.primary_link(&mac).await?;
        let changed = eniipam::host::nodeport::loosen_rp_filter(&link.name)
            .with_context(|| format!("setting {}'s rp_filter", link.name))?;
        anyhow::Ok((link.name, changed))
    };
    match prepared.await {
        Ok((ifname, changed)) => {
            println!(
                "eniipamd: {ifname} (primary interface): rp_filter {}",
                if changed {
                    "set to 2 (loose)"
                } else {
                    "already not strict, left as it is"
                }
            );
            Exit::Stopped
        }
        Err(e) => Exit::Failed(e.context("preparing the host")),
    }
}

#[cfg(not(feature = "simulate"))]
async fn run_simulate(_: Args) -> Exit {
    Exit::BadConfig(anyhow::anyhow!(
        "--simulate is not available: this eniipamd was built without the `simulate` feature"
    ))
}

#[cfg(feature = "simulate")]
async fn run_simulate(args: Args) -> Exit {
    match simulate_main(args).await {
        Ok(()) => Exit::Stopped,
        Err(e)
            if e.is::<BadArgs>()
                || matches!(
                    e.downcast_ref::<eniipam::daemon::DaemonError>(),
                    Some(eniipam::daemon::DaemonError::Config(_))
                ) =>
        {
            Exit::BadConfig(e)
        }
        Err(e) => Exit::Failed(e),
    }
}

/// A `--simulate` flag or variable with a bad value.
#[cfg(feature = "simulate")]
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadArgs(String);

#[cfg(feature = "simulate")]
async fn simulate_main(args: Args) -> anyhow::Result<()> {
    use eniipam::simulate;
    if !(0.0..=1000.0).contains(&args.churn) {
        return Err(BadArgs(format!(
            "--churn must be between 0 and 1000 pods per second, not {}",
            args.churn
        ))
        .into());
    }
    let state_dir = match args.state_dir {
        Some(d) => d,
        None => simulate::default_state_dir()
            .context("cannot find a per-user state directory: pass --state-dir")?,
    };
    let mut env_config =
        DaemonConfig::load(None, &ProcessEnv).map_err(|e| BadArgs(e.to_string()))?;
    env_config.log_format = eniipam::config::LogFormat::Text;
    eniipam::telemetry::init_logging(env_config.log_format, &env_config.log_level);
    let sim = simulate::Simulation::start(simulate::SimulationOptions {
        instance_type: args.instance_type,
        state_dir,
        metrics_addr: args
            .metrics_addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        profile: args.profile,
        base: env_config,
    })
    .await?;
    print_where(&sim.daemon, &sim);
    if args.churn > 0.0 {
        let capacity = sim.daemon.pool.snapshot().capacity;
        let budget = simulate::ChurnBudget::new(args.churn, sim.reuse_cooldown, sim.max_idle);
        let need = format!(
            "--churn {} needs about {} IP slots ({:.0} pods alive, {:.0} released IPs cooling down, up to {} idle)",
            args.churn,
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
        } else if args.exhaust {
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
                instance_type,
                simulate::DEFAULT_INSTANCE_TYPE
            ))
            .into());
        }
    }
    let churn = (args.churn > 0.0).then(|| {
        simulate::spawn_churn(
            sim.daemon.socket_path.clone(),
            sim.cni_cache_dir.clone(),
            args.churn,
        )
    });
    let status = simulate::spawn_status(sim.daemon.pool.clone(), Duration::from_secs(5));
    wait_for_signal().await?;
    if let Some(c) = churn {
        c.abort();
    }
    status.abort();
    sim.daemon.shutdown().await;
    Ok(())
}

#[cfg(feature = "simulate")]
fn print_where(d: &eniipam::daemon::DaemonHandle, sim: &eniipam::simulate::Simulation) {
    println!(
        "eniipamd is serving (simulated node {} {})",
        d.node.instance_id, d.node.instance_type
    );
    println!("  socket:   {}", d.socket_path.display());
    println!("  metrics:  http://{}/metrics", d.metrics_addr);
    println!("  ready:    http://{}/readyz", d.metrics_addr);
    println!("  state:    {}", sim.state_path.display());
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

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("cannot listen for Ctrl-C")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}
