//! `fleet.json`: every run's figures of every pair, with the bound and the modelled floor of the
//! patterns they frame (beside `runs`, which groups the runs, so the tables' modules and this one do
//! not import each other).

use serde_json::{Value, json};

use super::harness::PairResult;
use super::{FleetArgs, p};
use crate::stats::median;

/// `fleet.json`: the invocation and every run of every pair, each with its own figures (the pods'
/// waits as percentiles, not one by one).
pub fn json(args: &FleetArgs, results: &[PairResult]) -> Value {
    let pairs: Vec<Value> = results
        .iter()
        .map(|r| {
            // The bound and the floor frame a burst: patterns without one (churn, down-up) get none.
            let framed = super::targets::has_bound(r.pattern);
            let (least, structure, floor) = if framed {
                (
                    Some(super::targets::least_of(r).0),
                    Some(super::targets::bound_of(r).0),
                    Some(&r.floor),
                )
            } else {
                (None, None, None)
            };
            let actions: serde_json::Map<String, Value> = r
                .by_action
                .iter()
                .map(|(a, c, t)| (a.clone(), json!({"calls": c, "throttled": t})))
                .collect();
            json!({
                "pattern": r.pattern.name(),
                "policy": r.policy.name(),
                "run": r.run + 1,
                "seed": r.seed,
                "pods": r.pods,
                "all_done_s": r.all_done_s,
                "p50_wait_s": p(&r.waits_ms, 50.0),
                "p99_wait_s": p(&r.waits_ms, 99.0),
                "p99_wait_from_add_s": p(&r.add_waits_ms, 99.0),
                "unserved": r.unserved,
                "add_retries": r.retries,
                "add_retries_throttling": r.throttle_retries,
                "release_errors": r.release_errors,
                "ec2_calls": r.calls,
                "ec2_mutating": r.mutating,
                "ec2_throttled": r.throttled,
                "free_ips_mean": r.free_mean,
                "free_ips_end": r.free_end,
                "free_per_node_at_start_min": r.start_free.0,
                "free_per_node_at_start_median": r.start_free.1,
                "account_bound_s": least,
                "own_structure_last_call_s": structure,
                "modelled_p99_floor_s": floor.map(|f| f.p99_s),
                "floor_nodes_by_assign": floor.map(|f| f.by_assign),
                "floor_nodes_by_creates": floor.map(|f| f.by_chains),
                "floor_nodes_by_both": floor.map(|f| f.by_both),
                "launch_to_pods_bound_median_s": median(&r.schedulable_s),
                "boot_s": r.boot_s,
                "ran_s": r.ran_s,
                "real_s": r.real_s,
                "by_action": actions,
            })
        })
        .collect();
    json!({
        "nodes": args.nodes,
        "pods_per_node": args.pods_per_node,
        "seed": args.seed,
        "runs": args.runs,
        "lookahead": args.lookahead,
        "startup_taint": args.startup_taint,
        "boot_prefixes": args.boot_prefixes,
        "reproduce": args.reproduce(),
        "pairs": pairs,
    })
}
