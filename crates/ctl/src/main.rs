//! `eniipamctl`: the operator's CLI for eniipam on a node and for setting a cluster up.
//!
//! Modules:
//! - [`introspect`]: `status`, `allocations`, `enis`, `health` and `quarantine release` over
//!   eniipamd's gRPC socket;
//! - [`install`]: `install-cni` / `uninstall-cni`, the DaemonSet's installer (plugins copied
//!   atomically into the host's CNI bin dir, the conflist written only once eniipamd is healthy);
//! - [`max_pods`]: `max-pods`, what kubelet's `maxPods` should be on an eniipam node;
//! - [`iam`]: `iam-policy`, the least-privilege IAM policy for one cluster.

mod iam;
mod install;
mod introspect;
mod max_pods;
mod policy;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Operate eniipam: inspect eniipamd on this node, install the CNI plugin, compute max-pods and the
/// IAM policy.
#[derive(Parser, Debug)]
#[command(name = "eniipamctl", version)]
struct Args {
    /// eniipamd's socket.
    #[arg(long, global = true, env = "ENIIPAM_SOCKET_PATH", default_value = eniipam_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Capacity, ENIs, idle / assigned / cooling / sticky IPs, min/max idle, back-offs.
    Status,
    /// Every pod IP assignment.
    Allocations,
    /// The ENIs and their IPs.
    Enis,
    /// Exit 0 when eniipamd's gRPC health service reports SERVING (for liveness/readiness probes).
    Health,
    /// Install the CNI plugins and, once eniipamd is healthy, the conflist into the host's CNI
    /// directories (the DaemonSet's `install-cni` container).
    InstallCni(install::InstallArgs),
    /// Remove the conflist (and with --remove-plugin the `eniipam` binary) from the host.
    UninstallCni(install::UninstallArgs),
    /// What kubelet's maxPods should be for an instance type on eniipam (and on the AWS VPC CNI).
    MaxPods(max_pods::MaxPodsArgs),
    /// Print the least-privilege IAM policy for eniipamd in one cluster.
    IamPolicy(iam::IamPolicyArgs),
    /// IPs eniipamd holds out of circulation after its state file was lost without evidence of who
    /// holds them (docs/operations.md).
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
    /// What NetworkPolicy says of a pod of this node and why: the policies isolating each
    /// direction, the rules allowing peers and ports, the connections allowed and denied.
    Policy {
        /// The pod, as <namespace>/<name> (a bare name: namespace default).
        pod: String,
    },
}

#[derive(Subcommand, Debug)]
enum QuarantineCommand {
    /// Release quarantined IPs into the idle queue (they cool down first), when you know no pod holds
    /// them (e.g. the node was drained). Names an IP that is not quarantined: error, nothing released.
    Release {
        /// Every quarantined IP.
        #[arg(long, conflicts_with = "ips", required_unless_present = "ips")]
        all: bool,
        /// One quarantined IP (repeat for several).
        #[arg(long = "ip", value_name = "IPV4")]
        ips: Vec<std::net::Ipv4Addr>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.command {
        Command::Status => introspect::status(&args.socket, args.json).await,
        Command::Allocations => introspect::allocations(&args.socket, args.json).await,
        Command::Enis => introspect::enis(&args.socket, args.json).await,
        Command::Health => introspect::health(&args.socket, args.json).await,
        Command::InstallCni(a) => install::install(a, &args.socket).await,
        Command::UninstallCni(a) => install::uninstall(a),
        Command::MaxPods(a) => max_pods::run(a, args.json),
        Command::IamPolicy(a) => iam::run(a),
        Command::Policy { pod } => policy::run(&args.socket, pod, args.json).await,
        Command::Quarantine(QuarantineCommand::Release { all, ips }) => {
            introspect::release_quarantined(&args.socket, *all, ips, args.json).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eniipamctl: {e}");
            ExitCode::from(1)
        }
    }
}
