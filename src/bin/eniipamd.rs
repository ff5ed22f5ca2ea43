//! `eniipamd`: the node daemon. A thin main: it parses the command line into a [`Mode`], runs the
//! library function of that mode ([`eniipam::daemon::run`], [`eniipam::simulate::run`]) and maps
//! its error to an exit code (the one place errors become exit codes, listed in `docs/operations.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use eniipam::config::ProcessEnv;
use eniipam::daemon::run::{self as modes, ModeError};

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
    /// With --simulate: which addresses pods get, `ipv4`, `ipv6` (from one /80 the node takes on eth0)
    /// or `dual` (both); overrides ENIIPAM_IP_FAMILY.
    #[arg(long, requires = "simulate")]
    ip_family: Option<String>,
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

/// What `eniipamd` was asked to do: one mode per run (the flags that select them conflict).
enum Mode {
    /// The daemon on this node, until SIGTERM or Ctrl-C.
    Serve,
    /// `--simulate`: the daemon on an embedded mockcloud.
    Simulate,
    /// `--prepare-host`: the kernel settings the data path needs, then exit.
    PrepareHost,
    /// `--uninstall-host-rules`: remove the host rules, then exit.
    UninstallHostRules,
}

impl Args {
    fn mode(&self) -> Mode {
        if self.simulate {
            Mode::Simulate
        } else if self.uninstall_host_rules {
            Mode::UninstallHostRules
        } else if self.prepare_host {
            Mode::PrepareHost
        } else {
            Mode::Serve
        }
    }
}

/// How `eniipamd` ends, and its exit code.
enum Exit {
    /// Stopped by SIGTERM or Ctrl-C after serving, or a one-shot mode done.
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

impl From<Result<(), ModeError>> for Exit {
    fn from(r: Result<(), ModeError>) -> Self {
        match r {
            Ok(()) => Self::Stopped,
            Err(e) if e.is_config() => Self::BadConfig(e.into()),
            Err(e) => Self::Failed(e.into()),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let file = args.config.as_deref();
    let exit = match args.mode() {
        Mode::Serve => modes::serve(file, &ProcessEnv).await.into(),
        Mode::PrepareHost => modes::prepare_host(file, &ProcessEnv)
            .await
            .map(|done| println!("eniipamd: {done}"))
            .into(),
        Mode::UninstallHostRules => modes::uninstall_host_rules(file, &ProcessEnv)
            .await
            .map(|done| println!("eniipamd: {done}"))
            .into(),
        Mode::Simulate => simulate(args).await,
    };
    match &exit {
        Exit::Stopped => {}
        Exit::BadConfig(e) => eprintln!("eniipamd: invalid configuration: {e:#}"),
        Exit::Failed(e) => eprintln!("eniipamd: {e:#}"),
    }
    exit.code()
}

#[cfg(feature = "simulate")]
async fn simulate(args: Args) -> Exit {
    let mode = eniipam::simulate::SimulateMode {
        instance_type: args.instance_type,
        churn: args.churn,
        state_dir: args.state_dir,
        metrics_addr: args.metrics_addr,
        profile: args.profile,
        exhaust: args.exhaust,
        ip_family: args.ip_family,
    };
    match eniipam::simulate::run(mode, &ProcessEnv).await {
        Ok(()) => Exit::Stopped,
        Err(e) if eniipam::simulate::is_bad_config(&e) => Exit::BadConfig(e),
        Err(e) => Exit::Failed(e),
    }
}

#[cfg(not(feature = "simulate"))]
async fn simulate(_: Args) -> Exit {
    Exit::BadConfig(anyhow::anyhow!(
        "--simulate is not available: this eniipamd was built without the `simulate` feature"
    ))
}
