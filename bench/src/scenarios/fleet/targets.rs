//! The fleet's scenario report: eniipam's defaults against each VPC CNI policy on issue 25's
//! targets, the account bound of the scale-up (the least over call structures, and eniipam's own
//! structure's last-call time beside it), and the set-up lines.

use eniipam::config::DaemonConfig;
use mockcloud::{LatencyProfile, Throttling};

use super::boot::SETTLE_HOLD;
use super::bound::{account_bound, least_bound};
use super::floor::PathLatency;
use super::harness::PairResult;
use super::pareto::{dominance, sentence};
use super::pods::{BIND_TO_ADD, KUBELET_BACKOFF, KUBELET_JITTER, add_deadline};
use super::runs::Runs;
use super::spec::INSTANCE;
use super::tenant::buckets_left;
use super::traffic::TAINT_TO_BIND;
use super::{FleetArgs, Pattern, Policy, p, pod_ips_per_eni, spelled};
use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::AcrossRuns;

/// The p99 pod wait, s, the issue allows eniipam's default in churn, mixed and node-boot: the
/// Kubernetes pod-startup SLO excludes image pulls, so the network's share must be far under it.
pub const P99_LIMIT_S: f64 = 5.0;
/// Node-boot with the startup taint modelled: the p99 pod wait from the node's launch the issue allows
/// eniipam's default (issue 46), which includes the node's boot and its pods' arrival spread.
pub const NODE_BOOT_FROM_LAUNCH_S: f64 = 20.0;
/// eniipam's free IPs at most this share of `warm-prefix`'s (issue 25), and of `warm-eni`'s where
/// [`free_ratio_vs_warm_eni`] sets no other.
pub const FREE_RATIO: f64 = 0.6;
/// eniipam's throttled calls at most this share of each VPC CNI policy's, or
/// [`bursts_per_node`] calls per node when that is more (issue 46).
pub const THROTTLED_RATIO: f64 = 0.1;
/// Account-contention: the p99 pod wait issue 46 allows, s, besides the ratio to its bound.
pub const CONTENTION_P99_S: f64 = 100.0;

/// eniipam's free IPs (time-weighted mean) at most this share of `warm-eni`'s, per pattern
/// (issue 46's table).
pub fn free_ratio_vs_warm_eni(p: Pattern) -> f64 {
    match p {
        Pattern::ScaleUp => 0.35,
        Pattern::AccountContention => 0.4,
        Pattern::Mixed => 0.2,
        Pattern::NodeBoot | Pattern::Churn | Pattern::DownUp => FREE_RATIO,
    }
}

/// The bursts each node takes in the pattern: issue 46 allows one throttled call per node per
/// burst where that is more than a tenth of the VPC CNI policy's. Churn's arrivals are no burst.
pub fn bursts_per_node(p: Pattern) -> u32 {
    match p {
        Pattern::ScaleUp | Pattern::AccountContention | Pattern::NodeBoot | Pattern::Mixed => 1,
        Pattern::DownUp => 2,
        Pattern::Churn => 0,
    }
}

/// The throttled calls eniipam may make against an anchor's `anchor` (median):
/// max([`THROTTLED_RATIO`] × the anchor's, one per node per burst).
pub fn throttled_limit(p: Pattern, nodes: usize, anchor: f64) -> f64 {
    (THROTTLED_RATIO * anchor).max(f64::from(bursts_per_node(p)) * nodes as f64)
}
/// In the cold scale-up, eniipam's p99 at most this multiple of the account bound (the least over
/// call structures, [`least_of`]).
pub const BOUND_RATIO: f64 = 1.2;
/// Failed ADDs, whatever the cause, at most this percentage of the pods.
pub const RETRY_PCT: f64 = 1.0;

/// Whether the issue holds eniipam's p99 wait to [`P99_LIMIT_S`] in this pattern.
fn has_p99_limit(p: Pattern) -> bool {
    matches!(p, Pattern::Churn | Pattern::Mixed | Pattern::NodeBoot)
}

/// Whether the pattern is a cold scale-up, held to warm-ip's p99 and to [`BOUND_RATIO`] × its own
/// account bound: the scale-up, and the scale-up with another tenant (its bound on what is left).
fn is_cold_scale_up(p: Pattern) -> bool {
    matches!(p, Pattern::ScaleUp | Pattern::AccountContention)
}

/// Whether the pattern has an account bound worth printing: the ones whose pods start at once.
pub fn has_bound(p: Pattern) -> bool {
    is_cold_scale_up(p) || matches!(p, Pattern::Mixed | Pattern::NodeBoot)
}

/// The pattern's account bound, s: the least time the buckets the fleet has to itself
/// ([`buckets_left`]) need for one of each node's ways to serve its first wave, whatever the
/// structure (`bound::least_bound`), and the calls per API of the way that reaches it as a phrase.
pub fn least_of(r: &PairResult) -> (f64, String) {
    let (secs, used) = least_bound(&r.alternatives, &buckets_left(r.pattern));
    let parts: Vec<String> = used.iter().map(|(api, n)| format!("{api} {n}")).collect();
    if parts.is_empty() {
        return (secs, "no call needed: the nodes held enough".into());
    }
    (secs, parts.join(", "))
}

/// The last-call time of eniipam's call structure (`bound::account_bound`: an assign for the room,
/// a create + attach + modify per new ENI) from the minimum calls `r` needs, on the buckets the
/// fleet has to itself ([`buckets_left`]), s, and each API's share as a phrase. Not a bound on
/// every design: [`least_of`] is.
pub fn bound_of(r: &PairResult) -> (f64, String) {
    let (secs, per_api) = account_bound(&r.min_calls, &buckets_left(r.pattern));
    let parts: Vec<String> = per_api
        .iter()
        .map(|a| {
            format!(
                "{} {} calls, burst {} + {}/s → {:.1} s",
                a.api, a.calls, a.burst, a.refill_per_sec, a.secs
            )
        })
        .collect();
    if parts.is_empty() {
        return (secs, "no call needed: the nodes held enough".into());
    }
    (secs, parts.join("; "))
}

/// Throttled calls per API, each the median over the runs: eniipam's, then each VPC CNI policy's,
/// for the APIs any of them had throttled.
fn throttled_per_api(ours: &Runs<'_>, theirs: &[&Runs<'_>]) -> String {
    let mut apis: Vec<&str> = Vec::new();
    for g in std::iter::once(ours).chain(theirs.iter().copied()) {
        for r in &g.runs {
            for (a, _, t) in &r.by_action {
                if *t > 0 && !apis.contains(&a.as_str()) {
                    apis.push(a);
                }
            }
        }
    }
    if apis.is_empty() {
        return "none".into();
    }
    apis.sort_unstable();
    let of = |g: &Runs<'_>, api: &str| {
        let n = g.across(|r| r.by_action.iter().find(|a| a.0 == api).map_or(0, |a| a.2) as f64);
        n.shown(|v| format!("{v:.0}"))
    };
    apis.iter()
        .map(|api| {
            let them: Vec<String> = theirs
                .iter()
                .map(|t| format!("{} {}", t.policy, of(t, api)))
                .collect();
            format!("{api}: eniipam {} vs {}", of(ours, api), them.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A figure of each run as a table's anchor: measured in the same runs, or computed from each.
fn across(name: impl Into<String>, across: AcrossRuns, measured: bool) -> Anchor {
    Anchor::Across {
        name: name.into(),
        across,
        measured,
    }
}

/// The scenario report: eniipam's defaults against issue 25's and 46's targets, each figure the
/// median run with its range.
pub fn report(args: &FleetArgs, groups: &[Runs<'_>]) -> ScenarioReport {
    let find = |pattern: Pattern, policy: Policy| {
        groups
            .iter()
            .find(|g| g.pattern == pattern && g.policy == policy)
    };
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for &pattern in &args.patterns {
        let Some(ours) = find(pattern, Policy::Eniipam) else {
            continue;
        };
        let p99 = ours.across(|r| p(&r.waits_ms, 99.0));
        let done: Vec<f64> = ours.runs.iter().filter_map(|r| r.all_done_s).collect();
        if let Some(d) = AcrossRuns::of(&done) {
            let partial = if done.len() < ours.runs.len() {
                format!(
                    " ({} of {} runs served every pod)",
                    done.len(),
                    ours.runs.len()
                )
            } else {
                String::new()
            };
            rows.push(Row::new(
                format!("{pattern}: eniipam, time until every pod has an IP{partial}"),
                Unit::Secs,
                d,
            ));
        }
        if pattern == Pattern::AccountContention {
            rows.push(
                Row::new(format!("{pattern}: p99 pod wait"), Unit::Secs, p99)
                    .target(Target::AtMost(CONTENTION_P99_S)),
            );
        }
        if has_p99_limit(pattern) {
            let (from, limit) = if pattern == Pattern::NodeBoot && args.startup_taint {
                (" from the node's launch", NODE_BOOT_FROM_LAUNCH_S)
            } else {
                ("", P99_LIMIT_S)
            };
            rows.push(
                Row::new(format!("{pattern}: p99 pod wait{from}"), Unit::Secs, p99)
                    .target(Target::AtMost(limit)),
            );
        }
        let least = ours.across(|r| least_of(r).0);
        let (_, ways) = least_of(ours.first());
        let (_, parts) = bound_of(ours.first());
        let structure = ours.across(|r| bound_of(r).0);
        let floor = ours.across(|r| r.floor.p99_s);
        let secs = |a: &AcrossRuns| a.shown(|v| format!("{v:.1} s"));
        let run1 = if ours.runs.len() > 1 { " (run 1)" } else { "" };
        if pattern == Pattern::NodeBoot {
            notes.push(format!(
                "{pattern}: the account bound, {}, the least over call structures{run1}: {ways}; eniipam's structure's last-call time {} (shown, not targets; each node counted from empty, its first pod ENI's room with nothing assigned, launches and boot not in them){run1}: {parts}",
                secs(&least),
                secs(&structure)
            ));
        }
        if is_cold_scale_up(pattern) {
            let buckets = if pattern.has_tenant() {
                format!(
                    "the buckets the other tenant leaves (burst/2 and refill/2 of {})",
                    super::traffic::TENANT_APIS.join(", ")
                )
            } else {
                "EC2's buckets".into()
            };
            rows.push(
                Row::new(
                    format!("{pattern}: p99 pod wait vs the account bound"),
                    Unit::Secs,
                    p99,
                )
                .anchor(across("account bound", least, false))
                // Within every burst (a bound of 0) only latency is left: the churn and mixed
                // patterns' limit over the bound then.
                .target(if least.median > 0.0 {
                    Target::RatioAtMost(BOUND_RATIO)
                } else {
                    Target::AtMostAnchorPlus(P99_LIMIT_S)
                }),
            );
            notes.push(format!(
                "{pattern}: the account bound, {} = the least time {buckets} need for one growth structure per node, each node's chosen among the ways EC2 allows (one prefix assign, or creates carrying their addresses, or both), from eniipam's nodes at the start; the choice that reaches it{run1}: {ways}. Not a p99 floor: create, attach and IMDS latency come on top. eniipam's own structure's last-call time (an assign for the room, a chain per new ENI; not a bound), {}{run1}: {parts}",
                secs(&least),
                secs(&structure)
            ));
        }
        if has_bound(pattern) {
            rows.push(
                Row::new(
                    format!("{pattern}: p99 pod wait vs the modelled p99 floor"),
                    Unit::Secs,
                    p99,
                )
                .anchor(across(
                    "modelled floor (a model, not a bound)",
                    floor,
                    false,
                )),
            );
            let f = &ours.first().floor;
            notes.push(format!(
                "{pattern}: the modelled p99 floor, {} (beside the account bound, {}): the p99 of one greedy schedule of the least structure from eniipam's nodes at the start{run1}: {} nodes by one assign, {} by creates, {} by both; what it assumes is in the legend above",
                secs(&floor),
                secs(&least),
                f.by_assign,
                f.by_chains,
                f.by_both
            ));
        }
        let theirs: Vec<&Runs<'_>> = Policy::ALL
            .into_iter()
            .filter(|p| p.is_vpc_cni())
            .filter_map(|p| find(pattern, p))
            .collect();
        for t in &theirs {
            let name = t.policy.name();
            let wait_target = if is_cold_scale_up(pattern) && t.policy == Policy::WarmIp {
                Target::AtMostAnchorPlus(0.0)
            } else {
                Target::Info
            };
            rows.push(
                Row::new(
                    format!("{pattern}: p99 pod wait vs {}", t.policy),
                    Unit::Secs,
                    p99,
                )
                .anchor(across(name, t.across(|r| p(&r.waits_ms, 99.0)), true))
                .target(wait_target),
            );
            let free_target = match t.policy {
                Policy::WarmEni => Target::RatioAtMost(free_ratio_vs_warm_eni(pattern)),
                Policy::WarmPrefix => Target::RatioAtMost(FREE_RATIO),
                _ => Target::Info,
            };
            rows.push(
                Row::new(
                    format!(
                        "{pattern}: free IPs held, time-weighted mean, vs {}",
                        t.policy
                    ),
                    Unit::Count,
                    ours.across(|r| r.free_mean),
                )
                .anchor(across(name, t.across(|r| r.free_mean), true))
                .target(free_target),
            );
            rows.push(
                Row::new(
                    format!("{pattern}: throttled EC2 calls vs {}", t.policy),
                    Unit::Count,
                    ours.across(|r| r.throttled as f64),
                )
                .anchor(across(name, t.across(|r| r.throttled as f64), true))
                .target(Target::AtMost(throttled_limit(
                    pattern,
                    args.nodes,
                    t.across(|r| r.throttled as f64).median,
                ))),
            );
        }
        let of: Vec<&Runs<'_>> = groups.iter().filter(|g| g.pattern == pattern).collect();
        if let Some(d) = dominance(&of).filter(|_| !theirs.is_empty()) {
            rows.push(
                Row::single(
                    format!("{pattern}: VPC CNI points dominating eniipam's default (p99 wait, free IPs; median runs)"),
                    Unit::Count,
                    d.dominating_ours.len() as f64,
                )
                .target(Target::AtMost(0.0)),
            );
            notes.push(sentence(pattern, &d));
        }
        // Every failed ADD counts, whatever its text (issue 46): a retry is a pod's wait however
        // the daemon words the refusal. The throttling share is shown beside it.
        rows.push(
            Row::new(
                format!("{pattern}: ADDs failed, any cause, % of pods"),
                Unit::Ratio,
                ours.across(|r| 100.0 * r.retries as f64 / r.pods.max(1) as f64),
            )
            .target(Target::AtMost(RETRY_PCT)),
        );
        rows.push(Row::new(
            format!("{pattern}: of which EC2 throttling or back-off, % of pods"),
            Unit::Ratio,
            ours.across(|r| 100.0 * r.throttle_retries as f64 / r.pods.max(1) as f64),
        ));
        if !theirs.is_empty() {
            notes.push(format!(
                "{pattern}: throttled calls per API, {}",
                throttled_per_api(ours, &theirs)
            ));
        }
    }
    let first = args.patterns.iter().next().copied();
    let series = groups
        .iter()
        .filter(|g| Some(g.pattern) == first)
        .map(|g| Series {
            label: format!("fleet {}: pod wait, {}", g.pattern, g.policy),
            samples: g.first().waits_ms.clone(),
        })
        .collect();
    notes.insert(0, legend(args));
    notes.push(format!(
        "The full matrix (every policy, calls by purpose) and the plots: {}; every run's figures: {}",
        args.out.join("fleet.md").display(),
        args.out.join("fleet.json").display()
    ));
    ScenarioReport {
        id: "fleet",
        title: format!(
            "{} nodes on simulated time, one account's EC2 throttling: {} under {}{}",
            args.nodes,
            spelled(&args.patterns, &Pattern::ALL),
            spelled(&args.policies, &Policy::ALL),
            if args.runs > 1 {
                format!(
                    ", {} runs each (seeds {}–{})",
                    args.runs,
                    args.seed,
                    super::runs::seed_of(args.seed, args.runs - 1)
                )
            } else {
                String::new()
            }
        ),
        reproduce: args.reproduce(),
        setup: setup(args),
        rows,
        notes,
        plot_unit: "ms",
        series,
    }
}

/// The report's legend: the targets, what the anchors are, and what the modelled floor assumes.
fn legend(args: &FleetArgs) -> String {
    let runs = if args.runs > 1 {
        format!(
            " Each figure is the median of {} runs (run r on seed {} + r), its range [min – max] beside it; the ratio and the verdict use the medians; the plots draw run 1, the Pareto points are the median runs'.",
            args.runs, args.seed
        )
    } else {
        String::new()
    };
    let free_up = free_ratio_vs_warm_eni(Pattern::ScaleUp);
    let free_contention = free_ratio_vs_warm_eni(Pattern::AccountContention);
    let free_mixed = free_ratio_vs_warm_eni(Pattern::Mixed);
    let down_up_bursts = bursts_per_node(Pattern::DownUp);
    format!(
        "Targets (issue 25): p99 wait ≤ {P99_LIMIT_S} s in churn, mixed and node-boot ({}); in scale-up and account-contention p99 ≤ warm-ip's and ≤ {BOUND_RATIO} × the pattern's account bound, the least over call structures (account-contention's on the buckets the other tenant leaves; ≤ the bound + {P99_LIMIT_S} s when it is 0); account-contention's p99 ≤ {CONTENTION_P99_S} s; free IPs ≤ {FREE_RATIO} × warm-prefix's and, against warm-eni's, ≤ {free_up} × in scale-up, {free_contention} × in account-contention, {free_mixed} × in mixed, {FREE_RATIO} × in the others (issue 46); throttled calls ≤ max({THROTTLED_RATIO} × each VPC CNI policy's, one per node per burst: {down_up_bursts} per node in down-up, none in churn); ADDs failed, whatever the cause, ≤ {RETRY_PCT} % of pods (issue 46; the throttling share beside it). Anchor = the same pattern under that VPC CNI policy, same run and code; ratio = eniipam / anchor; rows marked — are shown for comparison. EC2 calls are mockcloud's counts over the pattern (background reconciles included).{runs} The account bound is a bound: no call structure EC2 allows serves the first wave's growth calls sooner (latency not counted). The modelled p99 floor is a model, not a bound (`floor.rs`): one growth call structure per node for its whole wave, asked for when its first pod beyond its free IPs is bound (node-boot: at its launch), served by the account's buckets FIFO in that order, each node on the way (one prefix assign, creates carrying the addresses, or both) whose addresses are usable sooner; usable at EC2's reply (assign {}), or the create's reply then the attach's and the attachment's `attaching` time (create {}, attach + attaching {}), nominal latencies, no jitter, no IMDS or describe lag, no daemon or gRPC time, no failed ADD; a pod on a free IP waits nothing, the others from their ADD (the leads the run drew) until their node's addresses are usable{}.",
        if args.startup_taint {
            format!(
                "with the startup taint modelled, node-boot's from the node's launch: ≤ {NODE_BOOT_FROM_LAUNCH_S} s, issue 46"
            )
        } else {
            "from the first ADD".into()
        },
        fmt_s(PathLatency::of(&LatencyProfile::realistic()).assign),
        fmt_s(PathLatency::of(&LatencyProfile::realistic()).create),
        fmt_s(PathLatency::of(&LatencyProfile::realistic()).attach),
        if args.startup_taint {
            format!(
                "; in node-boot the taint is lifted the instant they are (no check period), the pods bound {} s later or at Ready, whichever is later, and waits run from the launch",
                TAINT_TO_BIND.as_secs()
            )
        } else {
            String::new()
        }
    )
}

fn fmt_s(v: f64) -> String {
    format!("{v:.2} s")
}

pub fn setup(args: &FleetArgs) -> Vec<String> {
    let per_eni = pod_ips_per_eni();
    let mut lines = vec![
        format!(
            "one mockcloud; {} {INSTANCE} instances, one VPC and /16 subnet per 500 of them, each with its own IMDS; one real eniipamd per node in this process (`Daemon::start_with`: its own SQLite file, gRPC socket, metrics listener, SDK clients, node rate limiter, reconcile every {} s)",
            args.nodes,
            DaemonConfig::default().reconcile_period_secs
        ),
        "simulated time: each (pattern, policy) pair runs on its own current-thread tokio runtime with a paused clock, mockcloud and every daemon on it; the clock moves only when nothing is runnable (SQLite waits hold it: `store::hold_the_clock_on_disk_waits`), so CPU time costs no simulated time".into(),
        format!(
            "boot (every pattern but node-boot) with fast EC2 and throttling off; settled = every node with nothing in flight or waiting and its warm target of free IPs, held {} s; then the realistic latency profile (create 400 ms, attach 250 ms + 2 s attaching, assign 250 ms, IMDS lag 1 s, ±20 % jitter) and EC2's account buckets, full, counters reset",
            SETTLE_HOLD.as_secs()
        ),
        account_buckets(&Throttling::default()),
        format!(
            "pods: gRPC Allocate/Release to the node's daemon; each ADD attempt carries the CNI plugin's deadline, {} s (`eniipam_cni::netconf::DEFAULT_TIMEOUT_MS`, sent as the gRPC timeout header; the kubelet's CRI `runtimeRequestTimeout`, 2 min, never binds first); an attempt that fails or times out is retried as the kubelet's pod worker requeues a failed sync, after `wait.Jitter({} s, {})` = U[{} s, {} s) from the seeded RNG (kubernetes `pkg/kubelet/pod_workers.go`, `pkg/kubelet/kubelet.go`); a pod's wait is from its ADD's first attempt to its IP. Free IPs: VPC addresses the nodes hold serving no pod (idle, cooling, being given back), sampled every simulated second. Seeded traffic (seed {})",
            add_deadline().as_secs(),
            KUBELET_BACKOFF.as_secs(),
            KUBELET_JITTER,
            KUBELET_BACKOFF.as_secs(),
            KUBELET_BACKOFF.mul_f64(1.0 + KUBELET_JITTER).as_secs(),
            args.seed
        ),
    ];
    let (lo, hi) = BIND_TO_ADD;
    lines.push(if args.lookahead {
        format!(
            "a pod's ADD comes U[{} s, {} s) after the scheduler binds it (the kubelet's watch, volume mounts, the sandbox; `pods::BIND_TO_ADD`); the lookahead is on: from the binding each daemon's pool is told the pods bound to its node and not deleted (`Pool::announce_bound_pods`, as eniipamd's pod watch feeds it), so it sees a pod before its ADD",
            lo.as_secs_f64(),
            hi.as_secs_f64()
        )
    } else {
        format!(
            "a pod's ADD comes U[{} s, {} s) after the scheduler binds it (`pods::BIND_TO_ADD`); the lookahead is off (`--fleet-lookahead off`): a pool learns of a pod at its ADD",
            lo.as_secs_f64(),
            hi.as_secs_f64()
        )
    });
    for pattern in &args.patterns {
        lines.push(pattern.describe(args.pods_per_node));
    }
    if args.patterns.contains(&Pattern::NodeBoot) {
        lines.push(if args.startup_taint {
            format!(
                "node-boot's startup taint (`--fleet-startup-taint on`): eniipam's nodes register with it and take pods only once the daemon would lift it, at the first look of its keeper (one as the pool starts, then every `node_check_secs`, {} s) that finds the pool warm (`reconcile::api_server::node::warm`: an idle IP any pod may have), the pods bound {} s later or at Ready if that is later; the VPC CNI has no such taint (aws/amazon-vpc-cni-k8s#2808), so its policies' nodes take pods at Ready. Every policy's pod waits run from the node's launch (its daemon's start); the matrix shows the p99 from the first ADD beside it",
                DaemonConfig::default().node_check_secs,
                TAINT_TO_BIND.as_secs()
            )
        } else {
            "node-boot without the startup taint (`--fleet-startup-taint off`): every node takes pods at Ready, and a pod's wait runs from its ADD's first attempt (the measure before issue 46)".into()
        });
        if args.boot_prefixes > 0 {
            lines.push(format!(
                "node-boot's launch addresses (`--fleet-boot-prefixes {n}`): the nodes of the policies that take prefixes ({}) launch with {n} `/28`s on eth0, as their node group's launch template asks RunInstances for them (`NetworkInterfaces[0].Ipv4PrefixCount`, `deploy/launch-template.md`): no EC2 call of the daemon's, no account bucket but RunInstances', which every policy's launch spends alike; a first start adopts them as idle at once (no pod ever held them). The other policies' nodes launch bare",
                args.policies
                    .iter()
                    .filter(|p| p.takes_prefixes())
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                n = args.boot_prefixes
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttled_calls_may_be_a_tenth_of_the_anchors_or_one_per_node_per_burst() {
        // A tenth of warm-ip's 9,302 is 930: more than one per node (500), so it rules.
        assert_eq!(throttled_limit(Pattern::ScaleUp, 500, 9302.0), 930.2);
        // A tenth of warm-prefix's 762 is 76: one per node per burst rules.
        assert_eq!(throttled_limit(Pattern::ScaleUp, 500, 762.0), 500.0);
        // Down-up is two bursts; churn none.
        assert_eq!(throttled_limit(Pattern::DownUp, 500, 0.0), 1000.0);
        assert_eq!(throttled_limit(Pattern::Churn, 500, 100.0), 10.0);
    }

    #[test]
    fn free_ips_against_warm_eni_follow_issue_46s_table() {
        assert_eq!(free_ratio_vs_warm_eni(Pattern::ScaleUp), 0.35);
        assert_eq!(free_ratio_vs_warm_eni(Pattern::AccountContention), 0.4);
        assert_eq!(free_ratio_vs_warm_eni(Pattern::Mixed), 0.2);
        assert_eq!(free_ratio_vs_warm_eni(Pattern::NodeBoot), 0.6);
        assert_eq!(free_ratio_vs_warm_eni(Pattern::Churn), 0.6);
        assert_eq!(free_ratio_vs_warm_eni(Pattern::DownUp), 0.6);
    }
}
