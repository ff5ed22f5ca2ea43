//! `eniipam-bench`: eniipam's benchmark program (issue 8). Each scenario measures eniipam and, where
//! it can run here, its anchor in the same run and harness; prints a markdown table of figures,
//! ratios and targets; writes `report.md` and a latency-distribution plot.
//!
//! ```text
//! cargo run --release -p eniipam-bench -- <ipam|wiring|grpc|cold-burst|startup|memory|fleet|all>... [--runs N] [--out DIR]
//! cargo run --release -p eniipam-bench -- netpol
//! cargo run --release -p eniipam-bench -- soak [--minutes 30] [--seed N] [--soak-steps N] [--soak-faults LIST] [--ip-family ipv4|ipv6|dual] [--network-profiles]
//! ```
//!
//! `soak` is the fault soak with its invariant checker (issue 13): it reports violations, not
//! figures, and is not part of `all`.

mod cni;
mod plot;
mod report;
mod scenarios;
mod soak;
mod stats;
mod support;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context;
use clap::{Parser, ValueEnum};

use report::ScenarioReport;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// IPAM-only ADD+DEL through the plugin binary vs host-local.
    Ipam,
    /// Full pod ADD+DEL with wiring in network namespaces vs ptp + host-local.
    Wiring,
    /// Warm-pool gRPC latency and throughput, 64 clients.
    Grpc,
    /// 100 pods at once on an empty c5.4xlarge, realistic EC2.
    ColdBurst,
    /// Startup rebuild of a full m5.24xlarge.
    Startup,
    /// Peak RSS of eniipamd (full m5.24xlarge) and of the plugin.
    Memory,
    /// 500 simulated nodes against one mockcloud on simulated time: traffic patterns under eniipam's
    /// and the AWS VPC CNI's warm policies (`--fleet-patterns`, `--fleet-policies`).
    Fleet,
    /// Whole /28s left for prefixes after single-address churn: packed picks vs EC2's.
    Fragmentation,
    /// Every scenario above, in this order.
    All,
    /// The fault soak with the invariant checker (issue 13; not in `all`): `--minutes`, `--seed`.
    Soak,
    /// NetworkPolicy at scale (issue 28; not in `all`): change-to-enforced latency, rule count,
    /// memory, a packet's cost; in network namespaces (root).
    Netpol,
}

impl Scenario {
    const EACH: [Scenario; 8] = [
        Scenario::Ipam,
        Scenario::Wiring,
        Scenario::Grpc,
        Scenario::ColdBurst,
        Scenario::Startup,
        Scenario::Memory,
        Scenario::Fleet,
        Scenario::Fragmentation,
    ];

    fn needs_binaries(self) -> bool {
        matches!(
            self,
            Scenario::Ipam | Scenario::Wiring | Scenario::Memory | Scenario::All | Scenario::Soak
        )
    }
}

/// eniipam's benchmarks: figures against their anchors and targets.
#[derive(Parser, Debug)]
#[command(name = "eniipam-bench", version)]
struct Args {
    /// What to run: one or more scenarios, or `all`.
    #[arg(value_enum, required = true, num_args = 1..)]
    scenarios: Vec<Scenario>,
    /// Repetitions of each scenario; figures are medians (and percentiles) over them. Default 5;
    /// the fleet's default is 1 (a 500-node run of every pattern takes hours): `--runs N` runs every
    /// pair N times, run r on seed `--seed` + r, and its tables show the median run and the range.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: Option<u32>,
    /// Where report.md and latency.png go.
    /// (Default `bench/results`; `bench/results/soak` when `soak` is the only scenario, so a soak
    /// never overwrites the benchmark's report, and `bench/results/netpol` for `netpol` alone.)
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scenario `fleet`: how many nodes.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=2000))]
    nodes: u32,
    /// Scenario `fleet`: pods scheduled onto each node in the scale-up (and down-up, node-boot,
    /// account-contention).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=40))]
    pods_per_node: u32,
    /// Scenario `fleet`: traffic patterns, `all` or a comma list of scale-up, churn, down-up, mixed,
    /// node-boot, account-contention.
    #[arg(long, default_value = "all", value_parser = scenarios::fleet::parse_patterns)]
    fleet_patterns: std::collections::BTreeSet<scenarios::fleet::Pattern>,
    /// Scenario `fleet`: warm-pool policies, `all` or a comma list of eniipam, eniipam-pd, warm-eni,
    /// warm-ip, warm-prefix (the last three: the AWS VPC CNI's, emulated).
    #[arg(long, default_value = "all", value_parser = scenarios::fleet::parse_policies)]
    fleet_policies: std::collections::BTreeSet<scenarios::fleet::Policy>,
    /// Scenario `fleet`: `on` feeds each daemon's lookahead the pods bound to its node, from their
    /// binding, a kubelet's lead before their ADD (as eniipamd's pod watch does); `off` leaves the
    /// pool to learn of a pod at its ADD (a daemon without API-server access).
    #[arg(long, default_value = "on", action = clap::ArgAction::Set, value_parser = scenarios::fleet::parse_on_off)]
    fleet_lookahead: bool,
    /// Scenario `fleet`, pattern node-boot: `on` models eniipam's startup taint (its nodes take pods
    /// once the daemon would lift it; the VPC CNI's at Ready) and counts pod waits from the node's
    /// launch; `off` is the measure before issue 46 (pods at Ready, waits from the first ADD).
    #[arg(long, default_value = "on", action = clap::ArgAction::Set, value_parser = scenarios::fleet::parse_on_off)]
    fleet_startup_taint: bool,
    /// Scenario `fleet`, pattern node-boot: each node's eth0 carries this many `/28`s from its
    /// launch, as a launch template's `Ipv4PrefixCount` gives them (no EC2 call of the daemon's;
    /// RunInstances carries them), for the policies that take prefixes (eniipam's burst prefixes,
    /// prefix delegation); the others launch bare. 0: every node launches bare.
    #[arg(long, default_value_t = 0)]
    fleet_boot_prefixes: u32,
    /// Do not build eniipam/eniipamd first (use the binaries already next to this one).
    #[arg(long)]
    no_build: bool,
    /// Scenario `soak`: how long to run (minutes of steps, then the final GC and check).
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Scenario `soak`: a fixed number of steps instead of `--minutes`.
    #[arg(long)]
    soak_steps: Option<u64>,
    /// Scenario `soak`: the seed of the fault schedule, the pods and mockcloud's addresses (default:
    /// from the clock; printed, so a run can be repeated). Scenario `fleet`: the seed of the traffic
    /// and of mockcloud's addresses (default 17).
    #[arg(long)]
    seed: Option<u64>,
    /// Scenario `soak`: 1 or 2 networks (conflists).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    soak_networks: u8,
    /// Scenario `soak`: faults to inject: `all`, `none`, a comma list (kill, ec2-error,
    /// ec2-error-rate, ec2-hang, ec2-slow-reply, throttle-burst, oob-unassign, oob-detach, imds-lag,
    /// state-file-removed, disk-full, netns-hidden, pod-death, iam-revoke; opt-in, not in `all`:
    /// oob-prefix-unassign), or `-name,...` for all but those.
    #[arg(long, default_value = "all", allow_hyphen_values = true, value_parser = parse_faults)]
    soak_faults: std::collections::BTreeSet<soak::faults::FaultKind>,
    /// Scenario `soak`: the address families eniipamd gives pods (`ipv4`, `ipv6` or `dual`;
    /// `ENIIPAM_IP_FAMILY`); the checker adds the IPv6 invariants for the last two.
    #[arg(long, default_value = "ipv4")]
    ip_family: soak::IpFamily,
    /// Scenario `soak`: the node's instance type (default c5.xlarge, c5.4xlarge with
    /// `--network-profiles`): a Nitro type soaks the shipped burst prefixes, a Xen one (m4.xlarge,
    /// the same 4 ENIs × 15 IPs) single secondary IPs.
    #[arg(long)]
    soak_instance_type: Option<String>,
    /// Scenario `soak`: keep eniipamd's log in this file (default: with the temporary directory).
    #[arg(long)]
    soak_log: Option<PathBuf>,
    /// Scenario `soak`: the network-profiles mode (IPv4; issue 27): custom networking with two
    /// ENIConfigs switched every few steps, network profiles `db` and `app`, pods of both and of the
    /// default network, served by an API-server double; the checker adds the profiles' invariants.
    /// Results go to `bench/results/soak-profiles` unless `--out` says otherwise.
    #[arg(long)]
    network_profiles: bool,
}

fn parse_faults(s: &str) -> Result<std::collections::BTreeSet<soak::faults::FaultKind>, String> {
    soak::faults::parse_fault_set(s)
}

/// What every scenario gets.
pub struct Ctx {
    pub runs: usize,
    pub fleet: scenarios::fleet::FleetArgs,
    pub soak: scenarios::soak::SoakArgs,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(cni::RUSAGE_WRAPPER) {
        return match cni::rusage_wrapper(&argv[2..]) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("eniipam-bench {}: {e:#}", cni::RUSAGE_WRAPPER);
                ExitCode::from(125)
            }
        };
    }
    let args = Args::parse();
    // The fleet's daemons run in this process: with `RUST_LOG` set, their logs go to stderr (each
    // line names its node only through the ENI and instance ids it carries).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("eniipam-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the scenarios; `Ok(false)` when one of them failed to run (targets missed are not failures).
fn run(args: Args) -> anyhow::Result<bool> {
    if args.scenarios.iter().any(|s| s.needs_binaries()) && !args.no_build {
        support::build_binaries()?;
    }
    let chosen: Vec<Scenario> = if args.scenarios.contains(&Scenario::All) {
        Scenario::EACH.to_vec()
    } else {
        let mut v = Vec::new();
        for s in &args.scenarios {
            if !v.contains(s) {
                v.push(*s);
            }
        }
        v
    };
    let out = args.out.clone().unwrap_or_else(|| {
        if chosen == [Scenario::Soak] && args.network_profiles {
            PathBuf::from("bench/results/soak-profiles")
        } else if chosen == [Scenario::Soak] {
            PathBuf::from("bench/results/soak")
        } else if chosen == [Scenario::Netpol] {
            PathBuf::from("bench/results/netpol")
        } else {
            PathBuf::from("bench/results")
        }
    });
    let ctx = Ctx {
        runs: args.runs.unwrap_or(5) as usize,
        fleet: scenarios::fleet::FleetArgs {
            nodes: args.nodes as usize,
            pods_per_node: args.pods_per_node,
            patterns: args.fleet_patterns.clone(),
            policies: args.fleet_policies.clone(),
            seed: args.seed.unwrap_or(scenarios::fleet::DEFAULT_SEED),
            lookahead: args.fleet_lookahead,
            startup_taint: args.fleet_startup_taint,
            boot_prefixes: args.fleet_boot_prefixes,
            runs: args.runs.unwrap_or(1) as usize,
            out: out.clone(),
            out_given: args.out.clone(),
        },
        soak: scenarios::soak::SoakArgs {
            minutes: args.minutes,
            steps: args.soak_steps,
            seed: args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() % 100_000)
                    .unwrap_or(1)
            }),
            networks: args.soak_networks as usize,
            faults: args.soak_faults.clone(),
            ip_family: args.ip_family,
            log: args.soak_log.clone(),
            network_profiles: args.network_profiles,
            instance_type: args.soak_instance_type.clone(),
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for s in chosen.iter().copied() {
        let name = s
            .to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default();
        eprintln!("== {name} ==");
        let started = std::time::Instant::now();
        let result = runtime.block_on(async {
            match s {
                Scenario::Ipam => scenarios::ipam::run(&ctx).await,
                Scenario::Wiring => scenarios::wiring::run(&ctx).await,
                Scenario::Grpc => scenarios::grpc::run(&ctx).await,
                Scenario::ColdBurst => scenarios::cold_burst::run(&ctx).await,
                Scenario::Startup => scenarios::startup::run(&ctx).await,
                Scenario::Memory => scenarios::memory::run(&ctx).await,
                Scenario::Fleet => scenarios::fleet::run(&ctx.fleet).await,
                Scenario::Fragmentation => scenarios::fragmentation::run(&ctx).await,
                Scenario::Soak => scenarios::soak::run(&ctx.soak).await,
                Scenario::Netpol => scenarios::netpol::run(&ctx).await,
                Scenario::All => unreachable!("expanded above"),
            }
        });
        match result {
            Ok(rep) => {
                println!("\n{}", rep.markdown());
                eprintln!("({name} took {:.0} s)", started.elapsed().as_secs_f64());
                reports.push(rep);
            }
            Err(e) => {
                eprintln!("SCENARIO {name} FAILED: {e:#}");
                failures.push((name, format!("{e:#}")));
            }
        }
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));

    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let png = out.join("latency.png");
    let plotted = match plot::draw(&reports, &png) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("NOTICE: no plot: {e:#}");
            None
        }
    };
    // The fleet alone runs `--runs` or once; the other scenarios `--runs` or five times.
    let runs = if chosen == [Scenario::Fleet] {
        ctx.fleet.runs
    } else {
        ctx.runs
    };
    let md = render(&reports, &failures, runs, plotted);
    let path = out.join("report.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    if plotted.is_some() {
        eprintln!("wrote {}", png.display());
    }
    Ok(failures.is_empty())
}

fn render(
    reports: &[ScenarioReport],
    failures: &[(String, String)],
    runs: usize,
    plotted: Option<bool>,
) -> String {
    let mut s = String::from("# eniipam benchmark report\n\n");
    s.push_str(&format!(
        "{}\n\nFigures: the median run's value, with the range over {} runs in brackets; ratio = eniipam / anchor. Method: docs/performance.md.\n\n",
        machine(),
        runs
    ));
    for r in reports {
        s.push_str(&r.markdown());
        s.push('\n');
    }
    for (name, err) in failures {
        s.push_str(&format!(
            "### `{name}`: FAILED TO RUN\n\n```\n{err}\n```\n\n"
        ));
    }
    match plotted {
        Some(true) => s.push_str("Latency distributions (CDFs): [latency.png](latency.png)\n\n"),
        Some(false) => s.push_str(
            "Latency distributions (CDFs, drawn without text: no TrueType font found): [latency.png](latency.png)\n\n",
        ),
        None => {}
    }
    s
}

/// One line about where this ran.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_owned())
        .unwrap_or_default();
    let out = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let date = out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let commit = out("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = if out("git", &["status", "--porcelain"]).is_empty() {
        ""
    } else {
        " + uncommitted changes"
    };
    format!("Run {date} on {cpus} CPUs ({model}), Linux {kernel}, commit {commit}{dirty}.")
}
