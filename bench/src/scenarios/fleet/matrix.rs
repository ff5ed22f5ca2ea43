//! `fleet.md`: the full matrix of a run, every policy of every pattern, with the calls by action and
//! by purpose, the targets and the plots.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use super::harness::{self, PairResult};
use super::runs::Runs;
use super::{FleetArgs, Pattern, p};
use crate::report::ScenarioReport;

fn secs(v: f64) -> String {
    format!("{v:.2}")
}

fn whole(v: f64) -> String {
    format!("{v:.0}")
}

/// `f` over `g`'s runs as a cell: the median run, `[min – max]` when they differ.
fn cell(g: &Runs<'_>, f: impl Fn(&PairResult) -> f64, fmt: fn(f64) -> String) -> String {
    g.across(f).shown(fmt)
}

/// "All have IPs": the time when every run served every pod, else how many runs did not.
fn done_cell(g: &Runs<'_>, pattern: Pattern) -> String {
    if !pattern.has_finish() {
        return "n/a".into();
    }
    let missed: Vec<&&PairResult> = g.runs.iter().filter(|r| r.all_done_s.is_none()).collect();
    match (missed.len(), g.runs.len()) {
        (0, _) => cell(g, |r| r.all_done_s.unwrap_or(0.0), secs),
        (_, 1) => format!("NO: {} unserved", g.first().unserved),
        (k, n) => format!(
            "NO in {k} of {n} runs: {} unserved",
            missed
                .iter()
                .map(|r| r.unserved.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Calls and throttled calls over the runs, `—` when no run made any.
fn calls_cell(g: &Runs<'_>, count: impl Fn(&PairResult) -> Option<(u64, u64)>) -> String {
    if g.runs.iter().all(|r| count(r).is_none()) {
        return "—".into();
    }
    let calls = cell(g, |r| count(r).map_or(0, |c| c.0) as f64, whole);
    let throttled = cell(g, |r| count(r).map_or(0, |c| c.1) as f64, whole);
    format!("{calls} ({throttled})")
}

/// `fleet.md`: the full matrix, calls by purpose, the targets and the plots; with several runs each
/// cell is the median run and its range, and a last table per pattern lists every run.
pub fn matrix(
    args: &FleetArgs,
    groups: &[Runs<'_>],
    report: &ScenarioReport,
    plots: &BTreeMap<Pattern, (PathBuf, PathBuf, PathBuf)>,
    failures: &[String],
) -> String {
    let mut s = format!("# Fleet: {}\n\n", report.title);
    for line in &report.setup {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s, "\nReproduce: `{}`\n", report.reproduce);
    let several = args.runs > 1;
    if several {
        let _ = writeln!(
            s,
            "Each cell is the median of {} runs with its range [min – max] (run r on seed {} + r); every run is listed at the end of each pattern and in `fleet.json`; the plots draw run 1.\n",
            args.runs, args.seed
        );
    }
    for &pattern in &args.patterns {
        let of: Vec<&Runs<'_>> = groups.iter().filter(|g| g.pattern == pattern).collect();
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
            " free IPs, mean | free IPs, window's end | EC2 calls | per pod | mutating | throttled | ADD retries | of them throttling / back-off | free per node at start, min / median | boot + settle, sim. s | pattern, sim. s | real s |\n|---|---|---|---|---|",
        );
        if two_waves {
            s.push_str("---|");
        }
        s.push_str("---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for g in &of {
            let _ = write!(
                s,
                "| {} | {} | {} | {} | {} |",
                g.policy,
                g.first().pods,
                done_cell(g, pattern),
                cell(g, |r| p(&r.waits_ms, 50.0), secs),
                cell(g, |r| p(&r.waits_ms, 99.0), secs)
            );
            if two_waves {
                let _ = write!(
                    s,
                    " {} / {} |",
                    cell(g, |r| p(&r.last_wave_waits_ms, 50.0), secs),
                    cell(g, |r| p(&r.last_wave_waits_ms, 99.0), secs)
                );
            }
            let _ = writeln!(
                s,
                " {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |",
                cell(g, |r| r.free_mean, whole),
                cell(g, |r| r.free_end as f64, whole),
                cell(g, |r| r.calls as f64, whole),
                cell(g, |r| r.calls as f64 / r.pods.max(1) as f64, secs),
                cell(g, |r| r.mutating as f64, whole),
                cell(g, |r| r.throttled as f64, whole),
                cell(g, |r| r.retries as f64, whole),
                cell(g, |r| r.throttle_retries as f64, whole),
                cell(g, |r| f64::from(r.start_free.0), whole),
                cell(g, |r| f64::from(r.start_free.1), whole),
                cell(g, |r| r.boot_s, whole),
                cell(g, |r| r.ran_s, whole),
                cell(g, |r| r.real_s, whole)
            );
        }
        let odd: Vec<String> = of
            .iter()
            .flat_map(|g| g.runs.iter())
            .filter(|r| r.start_short > 0 || r.unserved > 0 || r.release_errors > 0)
            .map(|r| {
                format!(
                    "{}{}: {} nodes below their warm target {}, {} pods unserved, {} releases failed",
                    r.policy,
                    if several { format!(" (run {})", r.run + 1) } else { String::new() },
                    r.start_short,
                    if pattern.boots_in_pattern() {
                        "when they took pods"
                    } else {
                        "at the start"
                    },
                    r.unserved,
                    r.release_errors
                )
            })
            .collect();
        if !odd.is_empty() {
            let _ = writeln!(s, "\nNote: {}.", odd.join("; "));
        }
        if pattern == Pattern::NodeBoot && args.startup_taint {
            let lines: Vec<String> = of
                .iter()
                .map(|g| {
                    format!(
                        "- {}: p99 from the first ADD {} s; from launch to its pods bound, median over nodes {} s, slowest node {} s",
                        g.policy,
                        cell(g, |r| p(&r.add_waits_ms, 99.0), secs),
                        cell(g, |r| crate::stats::median(&r.schedulable_s).unwrap_or(0.0), secs),
                        cell(g, |r| r.schedulable_s.iter().copied().fold(0.0, f64::max), secs)
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "\nWaits above run from each node's launch (the startup taint modelled). Beside them:\n\n{}",
                lines.join("\n")
            );
        }
        if super::targets::has_bound(pattern) {
            let bounds: Vec<String> = of
                .iter()
                .map(|g| {
                    let (_, ways) = super::targets::least_of(g.first());
                    let (_, parts) = super::targets::bound_of(g.first());
                    let f = &g.first().floor;
                    format!(
                        "- {}: account bound {} s, least over call structures ({ways}); modelled p99 floor {} s ({} nodes by one assign, {} by creates, {} by both; a model, not a bound); its own structure's last-call time {} s ({parts})",
                        g.policy,
                        cell(g, |r| super::targets::least_of(r).0, tenth),
                        cell(g, |r| r.floor.p99_s, tenth),
                        f.by_assign,
                        f.by_chains,
                        f.by_both,
                        cell(g, |r| super::targets::bound_of(r).0, tenth),
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "\nThe account bound, per policy (the least time the account's buckets need for one of the ways EC2 allows each node to grow, from that policy's nodes at the start{}), the modelled p99 floor from the same start (the report's legend says what it assumes), and the last-call time of the policy's own structure, which is not a bound; `docs/performance.md`{}:\n\n{}",
                match pattern {
                    Pattern::NodeBoot => ", each node counted from empty",
                    Pattern::AccountContention =>
                        ", on the buckets the other tenant leaves: burst/2 and refill/2",
                    _ => "",
                },
                if several {
                    "; the ways and parts are run 1's"
                } else {
                    ""
                },
                bounds.join("\n")
            );
        }
        let reasons: Vec<String> = of
            .iter()
            .filter_map(|g| {
                let mut sum: BTreeMap<&str, u64> = BTreeMap::new();
                for r in &g.runs {
                    for (why, n) in &r.retry_reasons {
                        *sum.entry(why.as_str()).or_default() += n;
                    }
                }
                let mut v: Vec<(&str, u64)> = sum.into_iter().collect();
                v.sort_by_key(|r| std::cmp::Reverse(r.1));
                let top: Vec<String> = v
                    .iter()
                    .take(3)
                    .map(|(why, n)| format!("{n} × `{why}`"))
                    .collect();
                (!top.is_empty()).then(|| format!("- {}: {}", g.policy, top.join("; ")))
            })
            .collect();
        if !reasons.is_empty() {
            let _ = writeln!(
                s,
                "\nWhy ADDs failed (and were retried), the most frequent reasons{}:\n\n{}",
                if several {
                    ", summed over the runs"
                } else {
                    ""
                },
                reasons.join("\n")
            );
        }
        let tails: Vec<String> = of
            .iter()
            .filter(|g| !g.first().tail.is_empty())
            .map(|g| {
                format!(
                    "- {}{}:\n{}",
                    g.policy,
                    if several { " (run 1)" } else { "" },
                    super::tail::lines(&g.first().tail)
                        .iter()
                        .map(|l| format!("  - {l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            })
            .collect();
        if !tails.is_empty() {
            let _ = writeln!(
                s,
                "\nThe nodes whose pods waited longest (each pod's wait from its ADD's first attempt; growth \
                 attempts over the pattern, pods' and refills'):\n\n{}",
                tails.join("\n")
            );
        }
        calls_tables(&mut s, &of);
        if let Some(d) = super::pareto::dominance(&of) {
            let _ = writeln!(s, "\n{}.", super::pareto::sentence(pattern, &d));
        }
        if let Some((free, node, pareto)) = plots.get(&pattern) {
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
            let _ = writeln!(
                s,
                "\n![p99 pod wait against free IPs held, {pattern}]({})",
                name(pareto)
            );
        }
        if several {
            every_run(&mut s, &of);
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

fn tenth(v: f64) -> String {
    format!("{v:.1}")
}

/// Calls by action as mockcloud counted them, and attempts by purpose as the daemons did: rows the
/// actions (purposes), a column per policy.
fn calls_tables(s: &mut String, of: &[&Runs<'_>]) {
    let actions: BTreeSet<&str> = of
        .iter()
        .flat_map(|g| g.runs.iter())
        .flat_map(|r| r.by_action.iter().map(|a| a.0.as_str()))
        .collect();
    if !actions.is_empty() {
        let _ = writeln!(
            s,
            "\nEC2 calls by action, as mockcloud counted them (throttled in brackets):\n"
        );
        header(s, "| action |", "\n|---|", of);
        for action in actions {
            let _ = write!(s, "| {action} |");
            for g in of {
                let c = calls_cell(g, |r| {
                    r.by_action
                        .iter()
                        .find(|a| a.0 == action)
                        .map(|a| (a.1, a.2))
                });
                let _ = write!(s, " {c} |");
            }
            s.push('\n');
        }
    }
    let mut keys: BTreeSet<(&str, &str)> = BTreeSet::new();
    for r in of.iter().flat_map(|g| g.runs.iter()) {
        for c in &r.by_purpose {
            keys.insert((c.purpose, c.api.as_str()));
        }
    }
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nEC2 attempts by purpose, summed over the daemons (throttled in brackets):\n"
    );
    header(s, "| purpose | API |", "\n|---|---|", of);
    let purposes: BTreeSet<&str> = keys.iter().map(|k| k.0).collect();
    for purpose in purposes {
        for &(_, api) in keys.iter().filter(|k| k.0 == purpose) {
            let _ = write!(s, "| {purpose} | {api} |");
            for g in of {
                let c = calls_cell(g, |r| {
                    r.by_purpose
                        .iter()
                        .find(|c| c.purpose == purpose && c.api == api)
                        .map(|c| (c.calls, c.throttled))
                });
                let _ = write!(s, " {c} |");
            }
            s.push('\n');
        }
        let _ = write!(s, "| **{purpose}, all** | |");
        for g in of {
            let sum = |r: &PairResult| {
                r.by_purpose
                    .iter()
                    .filter(|c| c.purpose == purpose)
                    .fold((0, 0), |(c, t), x| (c + x.calls, t + x.throttled))
            };
            let c = cell(g, |r| sum(r).0 as f64, whole);
            let t = cell(g, |r| sum(r).1 as f64, whole);
            let _ = write!(s, " **{c} ({t})** |");
        }
        s.push('\n');
    }
}

fn header(s: &mut String, first: &str, rule: &str, of: &[&Runs<'_>]) {
    s.push_str(first);
    for g in of {
        let _ = write!(s, " {} |", g.policy);
    }
    s.push_str(rule);
    for _ in of {
        s.push_str("---|");
    }
    s.push('\n');
}

/// The bound's or the floor's figure, for the patterns they frame (a burst), else `—`.
fn framed(r: &PairResult, f: impl Fn(&PairResult) -> f64) -> String {
    if super::targets::has_bound(r.pattern) {
        tenth(f(r))
    } else {
        "—".into()
    }
}

/// Every run of every policy of a pattern, one row each.
fn every_run(s: &mut String, of: &[&Runs<'_>]) {
    let _ = writeln!(
        s,
        "\nEvery run:\n\n| policy | run | seed | all have IPs, s | p50 wait, s | p99 wait, s | free IPs, mean | EC2 calls | throttled | ADD retries | account bound, s | modelled p99 floor, s | real s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in of.iter().flat_map(|g| g.runs.iter()) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.0} |",
            r.policy,
            r.run + 1,
            r.seed,
            match (r.all_done_s, r.pattern.has_finish()) {
                (Some(v), _) => secs(v),
                (None, false) => "n/a".into(),
                (None, true) => format!("NO: {} unserved", r.unserved),
            },
            secs(p(&r.waits_ms, 50.0)),
            secs(p(&r.waits_ms, 99.0)),
            r.free_mean,
            r.calls,
            r.throttled,
            r.retries,
            framed(r, |r| super::targets::least_of(r).0),
            framed(r, |r| r.floor.p99_s),
            r.real_s
        );
    }
}
