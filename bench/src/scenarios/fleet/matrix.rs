//! `fleet.md`: the full matrix of a run, every policy of every pattern, with the calls by action and
//! by purpose, the targets and the plots.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use super::harness::{self, PairResult};
use super::{FleetArgs, Pattern, p};
use crate::report::ScenarioReport;

fn secs(v: f64) -> String {
    format!("{v:.2}")
}

/// `fleet.md`: the full matrix, calls by purpose, the targets and the plots.
pub fn matrix(
    args: &FleetArgs,
    results: &[PairResult],
    report: &ScenarioReport,
    plots: &BTreeMap<Pattern, (PathBuf, PathBuf, PathBuf)>,
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
            " free IPs, mean | free IPs, window's end | EC2 calls | per pod | mutating | throttled | ADD retries | of them throttling / back-off | free per node at start, min / median | boot + settle, sim. s | pattern, sim. s | real s |\n|---|---|---|---|---|",
        );
        if two_waves {
            s.push_str("---|");
        }
        s.push_str("---|---|---|---|---|---|---|---|---|---|---|---|\n");
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
                " {:.0} | {} | {} | {:.2} | {} | {} | {} | {} | {} / {} | {:.0} | {:.0} | {:.0} |",
                r.free_mean,
                r.free_end,
                r.calls,
                r.calls as f64 / r.pods.max(1) as f64,
                r.mutating,
                r.throttled,
                r.retries,
                r.throttle_retries,
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
                    "{}: {} nodes below their warm target {}, {} pods unserved, {} releases failed",
                    r.policy,
                    r.start_short,
                    if pattern.boots_in_pattern() {
                        "when Ready"
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
        if super::targets::has_bound(pattern) {
            let bounds: Vec<String> = of
                .iter()
                .map(|r| {
                    let (least, ways) = super::targets::least_of(r);
                    let (secs, parts) = super::targets::bound_of(r);
                    format!(
                        "- {}: {least:.1} s, least over call structures ({ways}); its own structure's last-call time {secs:.1} s ({parts})",
                        r.policy
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "\nThe account bound, per policy (the least time the account's buckets need for one of the ways EC2 allows each node to grow, from that policy's nodes at the start{}; beside it the last-call time of the policy's own structure, which is not a bound; `docs/performance.md`):\n\n{}",
                match pattern {
                    Pattern::NodeBoot => ", each node counted from empty",
                    Pattern::AccountContention =>
                        ", on the buckets the other tenant leaves: burst/2 and refill/2",
                    _ => "",
                },
                bounds.join("\n")
            );
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
