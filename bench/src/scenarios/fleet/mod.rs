//! Scenario `fleet` (issue 17): many nodes (500 by default), each a real in-process eniipamd with its
//! own IMDS, against one mockcloud whose EC2 throttling buckets are the account's, on simulated time;
//! traffic patterns (a scale-up, churn, a scale-down and back up after an hour, a skewed scale-up,
//! nodes booting into their pods, a scale-up sharing the account's buckets with another tenant)
//! under eniipam's policy and the AWS VPC CNI's three warm modes emulated with the same code.
//!
//! - `policy`: the policies and the knobs that emulate them.
//! - `traffic`: the patterns, drawn from a seeded RNG.
//! - `harness`: one (pattern, policy) pair on its own paused-clock runtime: boot, settle, the
//!   pattern, the measurements.
//! - `boot`: the nodes' instances and daemons, started before the pattern or (node-boot) within it.
//! - `tenant`: account-contention's other tenant, spending the account's buckets.
//! - `bound`: the account bound of a pattern's pods.
//! - `floor`: the modelled p99 floor (a model, not a bound) of a pattern's pods.
//! - `runs`: `--runs N`, every pair N times; the median run and the range.
//! - `pods`: the pattern's pods (ADD retried as kubelet does, DEL at the end of their life) and the
//!   recorder of what they saw.
//! - `chart`: the per-pattern plots.
//!
//! The report compares eniipam's defaults with each VPC CNI policy on the three targets; the
//! full matrix, calls by purpose and the plots go to `fleet.md` and `fleet-*.png` in `--out`.

mod boot;
mod bound;
mod chart;
mod floor;
mod harness;
mod json;
mod matrix;
mod pareto;
mod pods;
mod policy;
mod runs;
mod spec;
mod tail;
mod targets;
mod tenant;
mod traffic;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, anyhow};

pub use policy::Policy;
pub use traffic::Pattern;

use crate::report::ScenarioReport;
use crate::stats::percentile;
use harness::PairResult;
use spec::{INSTANCE, PairSpec};

/// Pairs run at most at once (each on its own thread and runtime; the machine has 2 cores).
const PARALLEL: usize = 2;
/// File descriptors one node takes, about (listeners for IMDS, metrics and gRPC, both ends of its
/// gRPC, EC2 and IMDS connections, the SQLite file and its WAL): 30 measured, with a margin.
const FDS_PER_NODE: u64 = 40;

/// Pairs that fit in the open-file limit at once (raised to the hard limit first), 1 to `PARALLEL`.
fn parallel_pairs(nodes: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1;
    };
    let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let fit = limit.saturating_sub(1000) / (nodes as u64 * FDS_PER_NODE).max(1);
    (fit as usize).clamp(1, PARALLEL)
}
/// The seed when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 17;

/// The fleet's command-line arguments.
#[derive(Clone, Debug)]
pub struct FleetArgs {
    pub nodes: usize,
    pub pods_per_node: u32,
    pub patterns: BTreeSet<Pattern>,
    pub policies: BTreeSet<Policy>,
    pub seed: u64,
    /// Each daemon's lookahead is fed the pods bound to its node (`--fleet-lookahead`).
    pub lookahead: bool,
    /// Node-boot models eniipam's startup taint and counts waits from launch
    /// (`--fleet-startup-taint`).
    pub startup_taint: bool,
    /// Node-boot: `/28`s each node's eth0 carries from its launch, for the policies that take
    /// prefixes (`--fleet-boot-prefixes`; 0: launched bare).
    pub boot_prefixes: u32,
    /// Every pair this many times, run `r` on seed `seed + r` (`--runs`).
    pub runs: usize,
    /// Where `fleet.md` and the plots go.
    pub out: PathBuf,
    /// `--out` as given, for the reproduce line.
    pub out_given: Option<PathBuf>,
}

/// `--fleet-lookahead`: `on` or `off`.
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: on or off")),
    }
}

/// `--fleet-patterns`: `all` or a comma list.
pub fn parse_patterns(s: &str) -> Result<BTreeSet<Pattern>, String> {
    parse_list(s, &Pattern::ALL)
}

/// `--fleet-policies`: `all` or a comma list.
pub fn parse_policies(s: &str) -> Result<BTreeSet<Policy>, String> {
    parse_list(s, &Policy::ALL)
}

fn parse_list<T>(s: &str, all: &[T]) -> Result<BTreeSet<T>, String>
where
    T: Copy + Ord + std::str::FromStr<Err = String>,
{
    if s.trim() == "all" {
        return Ok(all.iter().copied().collect());
    }
    let set = s
        .split(',')
        .filter(|w| !w.trim().is_empty())
        .map(str::parse)
        .collect::<Result<BTreeSet<T>, String>>()?;
    if set.is_empty() {
        return Err("empty list".into());
    }
    Ok(set)
}

/// A set as the command line spells it.
fn spelled<T: Copy + Ord + std::fmt::Display>(set: &BTreeSet<T>, all: &[T]) -> String {
    if set.len() == all.len() {
        "all".into()
    } else {
        set.iter().map(T::to_string).collect::<Vec<_>>().join(",")
    }
}

impl FleetArgs {
    fn reproduce(&self) -> String {
        let mut s = format!(
            "cargo run --release -p eniipam-bench -- fleet --nodes {} --pods-per-node {} --fleet-patterns {} --fleet-policies {} --seed {}",
            self.nodes,
            self.pods_per_node,
            spelled(&self.patterns, &Pattern::ALL),
            spelled(&self.policies, &Policy::ALL),
            self.seed
        );
        if !self.lookahead {
            s.push_str(" --fleet-lookahead off");
        }
        if !self.startup_taint {
            s.push_str(" --fleet-startup-taint off");
        }
        if self.boot_prefixes > 0 {
            let _ = write!(s, " --fleet-boot-prefixes {}", self.boot_prefixes);
        }
        if self.runs > 1 {
            let _ = write!(s, " --runs {}", self.runs);
        }
        if let Some(out) = &self.out_given {
            let _ = write!(s, " --out {}", out.display());
        }
        s
    }
}

pub async fn run(args: &FleetArgs) -> anyhow::Result<ScenarioReport> {
    // Run by run: the first run's pairs all come before the second's.
    let specs: Vec<PairSpec> = (0..args.runs.max(1))
        .flat_map(|run| {
            args.patterns.iter().flat_map(move |&pattern| {
                args.policies.iter().map(move |&policy| PairSpec {
                    pattern,
                    policy,
                    nodes: args.nodes,
                    pods_per_node: args.pods_per_node,
                    seed: runs::seed_of(args.seed, run),
                    lookahead: args.lookahead,
                    startup_taint: args.startup_taint,
                    launch_prefixes: if pattern == Pattern::NodeBoot && policy.takes_prefixes() {
                        args.boot_prefixes
                    } else {
                        0
                    },
                    run,
                })
            })
        })
        .collect();
    eniipam::store::hold_the_clock_on_disk_waits(true);
    let parallel = parallel_pairs(args.nodes);
    let outcomes = tokio::task::spawn_blocking(move || run_pairs(specs, parallel)).await;
    eniipam::store::hold_the_clock_on_disk_waits(false);
    let outcomes = outcomes.context("the fleet's pairs")?;
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (spec, outcome) in outcomes {
        match outcome {
            Ok(r) => results.push(r),
            Err(e) => failures.push(format!("{}: {e:#}", spec.tag())),
        }
    }
    let groups = runs::group(&results);
    let report = targets::report(args, &groups);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut plots = BTreeMap::new();
    for &pattern in &args.patterns {
        let of: Vec<&runs::Runs<'_>> = groups.iter().filter(|g| g.pattern == pattern).collect();
        if of.is_empty() {
            continue;
        }
        // The time series of the first run; the Pareto points are the median runs'.
        let first: Vec<&PairResult> = of.iter().map(|g| g.first()).collect();
        let drawn = chart::fleet_free(&args.out, pattern, &first).and_then(|a| {
            Ok((
                a,
                chart::one_node(&args.out, pattern, &first)?,
                pareto::plot(&args.out, pattern, &of)?,
            ))
        });
        match drawn {
            Ok(paths) => {
                plots.insert(pattern, paths);
            }
            Err(e) => eprintln!("NOTICE: fleet {pattern}: no plot: {e:#}"),
        }
    }
    let md = matrix::matrix(args, &groups, &report, &plots, &failures);
    let path = args.out.join("fleet.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    let path = args.out.join("fleet.json");
    let json =
        serde_json::to_string_pretty(&json::json(args, &results)).context("the runs as JSON")?;
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    if !failures.is_empty() {
        return Err(anyhow!(
            "{} of the fleet's pairs failed: {}",
            failures.len(),
            failures.join("; ")
        ));
    }
    Ok(report)
}

/// Runs the pairs `parallel` at a time; outcomes in the order given.
fn run_pairs(specs: Vec<PairSpec>, parallel: usize) -> Vec<(PairSpec, anyhow::Result<PairResult>)> {
    let queue = Mutex::new(specs.iter().cloned().enumerate().collect::<VecDeque<_>>());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..parallel.min(specs.len()) {
            s.spawn(|| {
                loop {
                    let Some((i, spec)) = queue.lock().expect("queue").pop_front() else {
                        break;
                    };
                    let outcome = harness::run_pair(spec.clone());
                    if let Err(e) = &outcome {
                        eprintln!(
                            "fleet {}/{}: FAILED: {e:#}",
                            spec.pattern.name(),
                            spec.policy.name()
                        );
                    }
                    done.lock().expect("done").push((i, spec, outcome));
                }
            });
        }
    });
    let mut done = done.into_inner().expect("done");
    done.sort_by_key(|(i, _, _)| *i);
    done.into_iter().map(|(_, s, o)| (s, o)).collect()
}

fn p(waits_ms: &[f64], q: f64) -> f64 {
    percentile(waits_ms, q).unwrap_or(0.0) / 1e3
}

fn pod_ips_per_eni() -> u32 {
    mockcloud::catalog::lookup(INSTANCE).map_or(14, |l| l.ipv4_per_eni - 1)
}
