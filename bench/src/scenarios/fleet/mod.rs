//! Scenario `fleet` (issue 17): many nodes (500 by default), each a real in-process eniipamd with its
//! own IMDS, against one mockcloud whose EC2 throttling buckets are the account's, on simulated time;
//! traffic patterns (a scale-up, churn, a scale-down and back up after an hour, a skewed scale-up)
//! under eniipam's policy and the AWS VPC CNI's three warm modes emulated with the same code.
//!
//! - `policy`: the policies and the knobs that emulate them.
//! - `traffic`: the patterns, drawn from a seeded RNG.
//! - `harness`: one (pattern, policy) pair on its own paused-clock runtime: boot, settle, the
//!   pattern, the measurements.
//! - `pods`: the pattern's pods (ADD retried as kubelet does, DEL at the end of their life) and the
//!   recorder of what they saw.
//! - `chart`: the per-pattern plots.
//!
//! The report compares eniipam's defaults with each VPC CNI policy on the three targets; the
//! full matrix, calls by purpose and the plots go to `fleet.md` and `fleet-*.png` in `--out`.

mod chart;
mod harness;
mod pods;
mod policy;
mod traffic;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, anyhow};
use eniipam::config::DaemonConfig;
use mockcloud::Throttling;

pub use policy::Policy;
pub use traffic::Pattern;

use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::percentile;
use harness::{INSTANCE, PairResult, PairSpec, SETTLE_HOLD};
use pods::POD_RETRY;

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
    /// Where `fleet.md` and the plots go.
    pub out: PathBuf,
    /// `--out` as given, for the reproduce line.
    pub out_given: Option<PathBuf>,
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
        if let Some(out) = &self.out_given {
            let _ = write!(s, " --out {}", out.display());
        }
        s
    }
}

pub async fn run(args: &FleetArgs) -> anyhow::Result<ScenarioReport> {
    let specs: Vec<PairSpec> = args
        .patterns
        .iter()
        .flat_map(|&pattern| {
            args.policies.iter().map(move |&policy| PairSpec {
                pattern,
                policy,
                nodes: args.nodes,
                pods_per_node: args.pods_per_node,
                seed: args.seed,
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
            Err(e) => failures.push(format!(
                "{}/{}: {e:#}",
                spec.pattern.name(),
                spec.policy.name()
            )),
        }
    }
    let report = report(args, &results);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut plots = BTreeMap::new();
    for &pattern in &args.patterns {
        let of: Vec<&PairResult> = results.iter().filter(|r| r.pattern == pattern).collect();
        if of.is_empty() {
            continue;
        }
        let drawn = chart::fleet_free(&args.out, pattern, &of)
            .and_then(|a| Ok((a, chart::one_node(&args.out, pattern, &of)?)));
        match drawn {
            Ok(paths) => {
                plots.insert(pattern, paths);
            }
            Err(e) => eprintln!("NOTICE: fleet {pattern}: no plot: {e:#}"),
        }
    }
    let md = matrix(args, &results, &report, &plots, &failures);
    let path = args.out.join("fleet.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
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

/// The scenario report: eniipam's defaults against each VPC CNI policy on the targets.
fn report(args: &FleetArgs, results: &[PairResult]) -> ScenarioReport {
    let find = |pattern: Pattern, policy: Policy| {
        results
            .iter()
            .find(|r| r.pattern == pattern && r.policy == policy)
    };
    let mut rows = Vec::new();
    for &pattern in &args.patterns {
        let Some(ours) = find(pattern, Policy::Eniipam) else {
            continue;
        };
        if let Some(s) = ours.all_done_s {
            rows.push(Row::single(
                format!("{pattern}: eniipam, time until every pod has an IP"),
                Unit::Secs,
                s,
            ));
        }
        for theirs in Policy::ALL.into_iter().filter(|p| p.is_vpc_cni()) {
            let Some(t) = find(pattern, theirs) else {
                continue;
            };
            let measured = |value: f64| Anchor::Measured {
                name: theirs.name().into(),
                value,
            };
            rows.push(
                Row::single(
                    format!("{pattern}: p99 pod wait vs {theirs}"),
                    Unit::Secs,
                    p(&ours.waits_ms, 99.0),
                )
                .anchor(measured(p(&t.waits_ms, 99.0)))
                .target(Target::AtMostAnchorPlus(1.0)),
            );
            rows.push(
                Row::single(
                    format!("{pattern}: free IPs held, time-weighted mean, vs {theirs}"),
                    Unit::Count,
                    ours.free_mean,
                )
                .anchor(measured(t.free_mean))
                .target(Target::RatioAtMost(0.6)),
            );
            rows.push(
                Row::single(
                    format!("{pattern}: throttled EC2 calls vs {theirs}"),
                    Unit::Count,
                    ours.throttled as f64,
                )
                .anchor(measured(t.throttled as f64))
                .target(Target::RatioAtMost(0.1)),
            );
        }
    }
    let first = args.patterns.iter().next().copied();
    let series = results
        .iter()
        .filter(|r| Some(r.pattern) == first)
        .map(|r| Series {
            label: format!("fleet {}: pod wait, {}", r.pattern, r.policy),
            samples: r.waits_ms.clone(),
        })
        .collect();
    ScenarioReport {
        id: "fleet",
        title: format!(
            "{} nodes on simulated time, one account's EC2 throttling: {} under {}",
            args.nodes,
            spelled(&args.patterns, &Pattern::ALL),
            spelled(&args.policies, &Policy::ALL)
        ),
        reproduce: args.reproduce(),
        setup: setup(args),
        rows,
        notes: vec![
            "Anchor = the same pattern under that VPC CNI policy, same run and code; ratio = eniipam / anchor. Targets (issue 17): p99 wait ≤ theirs + 1 s, free IPs ≤ 0.6 × theirs, throttled calls ≤ 0.1 × theirs. EC2 calls are mockcloud's counts over the pattern (background reconciles included).".into(),
            format!(
                "The full matrix (every policy, calls by purpose) and the plots: {}",
                args.out.join("fleet.md").display()
            ),
        ],
        plot_unit: "ms",
        series,
    }
}

fn setup(args: &FleetArgs) -> Vec<String> {
    let per_eni = pod_ips_per_eni();
    let mut lines = vec![
        format!(
            "one mockcloud; {} {INSTANCE} instances, one VPC and /16 subnet per 500 of them, each with its own IMDS; one real eniipamd per node in this process (`Daemon::start_with`: its own SQLite file, gRPC socket, metrics listener, SDK clients, node rate limiter, reconcile every {} s)",
            args.nodes,
            DaemonConfig::default().reconcile_period_secs
        ),
        "simulated time: each (pattern, policy) pair runs on its own current-thread tokio runtime with a paused clock, mockcloud and every daemon on it; the clock moves only when nothing is runnable (SQLite waits hold it: `store::hold_the_clock_on_disk_waits`), so CPU time costs no simulated time".into(),
        format!(
            "boot with fast EC2 and throttling off; settled = every node with nothing in flight or waiting and its warm target of free IPs, held {} s; then the realistic latency profile (create 400 ms, attach 250 ms + 2 s attaching, assign 250 ms, IMDS lag 1 s, ±20 % jitter) and EC2's account buckets, full, counters reset",
            SETTLE_HOLD.as_secs()
        ),
        account_buckets(&Throttling::default()),
        format!(
            "pods: gRPC Allocate/Release to the node's daemon; a failed ADD is retried after {} s (kubelet); a pod's wait is from its ADD's first attempt to its IP. Free IPs: VPC addresses the nodes hold serving no pod (idle, cooling, being given back), sampled every simulated second. Seeded traffic (seed {})",
            POD_RETRY.as_secs(),
            args.seed
        ),
    ];
    for pattern in &args.patterns {
        lines.push(pattern.describe(args.pods_per_node));
    }
    for policy in &args.policies {
        lines.push(format!("policy {policy}: {}", policy.knobs(per_eni)));
    }
    lines
}

/// The account's buckets as the pattern runs them: one per API, EC2's published table.
fn account_buckets(t: &Throttling) -> String {
    let sizes: Vec<String> = mockcloud::throttling::bucket_names()
        .iter()
        .map(|name| {
            let b = t.bucket(name);
            format!("{name} {} + {}/s", b.capacity, b.refill_per_sec)
        })
        .collect();
    format!(
        "account buckets (mockcloud = EC2's published table, one bucket per API; a call throttled on one API spends no other's): {}",
        sizes.join(", ")
    )
}

fn secs(v: f64) -> String {
    format!("{v:.2}")
}

/// `fleet.md`: the full matrix, calls by purpose, the targets and the plots.
fn matrix(
    args: &FleetArgs,
    results: &[PairResult],
    report: &ScenarioReport,
    plots: &BTreeMap<Pattern, (PathBuf, PathBuf)>,
    failures: &[String],
) -> String {
    let mut s = format!("# Fleet: {}\n\n", report.title);
    for line in &report.setup {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s, "\nReproduce: `{}`\n", report.reproduce);
    for &pattern in &args.patterns {
        let of: Vec<&PairResult> = results.iter().filter(|r| r.pattern == pattern).collect();
        if of.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "## {pattern}\n\n{}\n",
            pattern.describe(args.pods_per_node)
        );
        let two_waves = pattern == Pattern::DownUp;
        s.push_str("| policy | pods | all have IPs, s | p50 wait, s | p99 wait, s |");
        if two_waves {
            s.push_str(" 2nd scale-up p50 / p99, s |");
        }
        s.push_str(
            " free IPs, mean | free IPs, window's end | EC2 calls | per pod | mutating | throttled | ADD retries | free per node at start, min / median | boot + settle, sim. s | pattern, sim. s | real s |\n|---|---|---|---|---|",
        );
        if two_waves {
            s.push_str("---|");
        }
        s.push_str("---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &of {
            let done = match (r.all_done_s, pattern.has_finish()) {
                (Some(v), _) => secs(v),
                (None, false) => "n/a".into(),
                (None, true) => format!("NO: {} unserved", r.unserved),
            };
            let _ = write!(
                s,
                "| {} | {} | {} | {} | {} |",
                r.policy,
                r.pods,
                done,
                secs(p(&r.waits_ms, 50.0)),
                secs(p(&r.waits_ms, 99.0))
            );
            if two_waves {
                let _ = write!(
                    s,
                    " {} / {} |",
                    secs(p(&r.last_wave_waits_ms, 50.0)),
                    secs(p(&r.last_wave_waits_ms, 99.0))
                );
            }
            let _ = writeln!(
                s,
                " {:.0} | {} | {} | {:.2} | {} | {} | {} | {} / {} | {:.0} | {:.0} | {:.0} |",
                r.free_mean,
                r.free_end,
                r.calls,
                r.calls as f64 / r.pods.max(1) as f64,
                r.mutating,
                r.throttled,
                r.retries,
                r.start_free.0,
                r.start_free.1,
                r.boot_s,
                r.ran_s,
                r.real_s
            );
        }
        let odd: Vec<String> = of
            .iter()
            .filter(|r| r.start_short > 0 || r.unserved > 0 || r.release_errors > 0)
            .map(|r| {
                format!(
                    "{}: {} nodes below their warm target at the start, {} pods unserved, {} releases failed",
                    r.policy, r.start_short, r.unserved, r.release_errors
                )
            })
            .collect();
        if !odd.is_empty() {
            let _ = writeln!(s, "\nNote: {}.", odd.join("; "));
        }
        let reasons: Vec<String> = of
            .iter()
            .filter(|r| !r.retry_reasons.is_empty())
            .map(|r| {
                let top: Vec<String> = r
                    .retry_reasons
                    .iter()
                    .take(3)
                    .map(|(why, n)| format!("{n} × `{why}`"))
                    .collect();
                format!("- {}: {}", r.policy, top.join("; "))
            })
            .collect();
        if !reasons.is_empty() {
            let _ = writeln!(
                s,
                "\nWhy ADDs failed (and were retried), the most frequent reasons:\n\n{}",
                reasons.join("\n")
            );
        }
        // Calls by action, as EC2 (mockcloud) counted them: rows actions, a column per policy.
        let actions: BTreeSet<&str> = of
            .iter()
            .flat_map(|r| r.by_action.iter().map(|a| a.0.as_str()))
            .collect();
        if !actions.is_empty() {
            let _ = writeln!(
                s,
                "\nEC2 calls by action, as mockcloud counted them (throttled in brackets):\n"
            );
            s.push_str("| action |");
            for r in &of {
                let _ = write!(s, " {} |", r.policy);
            }
            s.push_str("\n|---|");
            for _ in &of {
                s.push_str("---|");
            }
            s.push('\n');
            for action in actions {
                let _ = write!(s, "| {action} |");
                for r in &of {
                    let cell = r
                        .by_action
                        .iter()
                        .find(|a| a.0 == action)
                        .map_or("—".into(), |a| format!("{} ({})", a.1, a.2));
                    let _ = write!(s, " {cell} |");
                }
                s.push('\n');
            }
        }
        // Calls by purpose: rows (purpose, api), a column per policy.
        let mut keys: BTreeSet<(&str, &str)> = BTreeSet::new();
        for r in &of {
            for c in &r.by_purpose {
                keys.insert((c.purpose, c.api.as_str()));
            }
        }
        if !keys.is_empty() {
            let _ = writeln!(
                s,
                "\nEC2 attempts by purpose, summed over the daemons (throttled in brackets):\n"
            );
            s.push_str("| purpose | API |");
            for r in &of {
                let _ = write!(s, " {} |", r.policy);
            }
            s.push_str("\n|---|---|");
            for _ in &of {
                s.push_str("---|");
            }
            s.push('\n');
            let purposes: BTreeSet<&str> = keys.iter().map(|k| k.0).collect();
            for purpose in purposes {
                for &(_, api) in keys.iter().filter(|k| k.0 == purpose) {
                    let _ = write!(s, "| {purpose} | {api} |");
                    for r in &of {
                        let cell = r
                            .by_purpose
                            .iter()
                            .find(|c| c.purpose == purpose && c.api == api)
                            .map_or("—".into(), |c| format!("{} ({})", c.calls, c.throttled));
                        let _ = write!(s, " {cell} |");
                    }
                    s.push('\n');
                }
                let _ = write!(s, "| **{purpose}, all** | |");
                for r in &of {
                    let (c, t) = r
                        .by_purpose
                        .iter()
                        .filter(|c| c.purpose == purpose)
                        .fold((0, 0), |(c, t), x| (c + x.calls, t + x.throttled));
                    let _ = write!(s, " **{c} ({t})** |");
                }
                s.push('\n');
            }
        }
        if let Some((free, node)) = plots.get(&pattern) {
            let name = |p: &PathBuf| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            let _ = writeln!(
                s,
                "\n![fleet free IPs, {pattern}]({})\n\n![node {} free IPs and pods, {pattern}]({})",
                name(free),
                harness::TRACKED_NODE,
                name(node)
            );
        }
        s.push('\n');
    }
    if !report.rows.is_empty() {
        let _ = writeln!(
            s,
            "## Targets: eniipam's defaults against each VPC CNI policy\n\n{}",
            report.table()
        );
    }
    for f in failures {
        let _ = writeln!(s, "\n**FAILED**: {f}");
    }
    s
}
