//! The tail, node by node: which nodes kept their pods waiting longest, and what their growth
//! calls did. A p99 over 10,000 pods is set by a few nodes; whether those nodes waited in line for
//! their one growth call, spent several, or failed their pods' ADDs past the plugin's deadline is
//! what says where the time went (the account's buckets, the node's back-off, a second call).

use std::collections::BTreeMap;

use super::bound::GROWTH_APIS;
use super::pods::PodRecord;

/// Attempts by (purpose, API): (calls, throttled), as a daemon's call stats count them.
pub type Purposes = BTreeMap<(&'static str, String), (u64, u64)>;

/// How many of the slowest nodes a pair's report names.
pub const TAIL_NODES: usize = 8;

/// A node's attempts over the pattern: all of them (`now`) less those before it started.
pub fn over_pattern(mut now: Purposes, before: &Purposes) -> Purposes {
    for (k, (c, t)) in before {
        let e = now.entry(k.clone()).or_default();
        e.0 -= c;
        e.1 -= t;
    }
    now
}

/// Adds `more` attempts into `sum`.
pub fn add_calls(sum: &mut Purposes, more: &Purposes) {
    for (k, (c, t)) in more {
        let e = sum.entry(k.clone()).or_default();
        e.0 += c;
        e.1 += t;
    }
}

/// One of the slowest nodes of a pair.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTail {
    pub node: usize,
    /// Its longest wait of a pod for an IP, from the pod's ADD's first attempt, s.
    pub max_add_wait_s: f64,
    /// When its last pod had its IP, from the pattern's start, s.
    pub last_done_s: f64,
    /// ADD attempts of its pods that failed (each retried by the kubelet).
    pub failed_adds: u32,
    /// Its growth attempts over the pattern (pods' and refills'), per API: (attempts, throttled).
    pub growth: BTreeMap<String, (u64, u64)>,
}

/// What the harness knows of one node at the end of a pair.
pub struct NodeOutcome {
    /// (max ADD wait s, last done s, failed ADDs) over its pods.
    pub pods: (f64, f64, u32),
    /// Its attempts over the pattern by (purpose, API): (attempts, throttled).
    pub calls: Purposes,
}

/// Each node's outcome: its attempts over the pattern (`calls`, by node) and its pods' records.
pub fn outcomes(calls: Vec<Purposes>, records: &[PodRecord]) -> Vec<NodeOutcome> {
    let mut outcomes: Vec<NodeOutcome> = calls
        .into_iter()
        .map(|calls| NodeOutcome {
            pods: (0.0, 0.0, 0),
            calls,
        })
        .collect();
    for r in records {
        if let Some(o) = outcomes.get_mut(r.node) {
            o.pods.0 = o.pods.0.max(r.add_wait_ms / 1e3);
            o.pods.1 = o.pods.1.max(r.done_at_s);
            o.pods.2 += r.failed_adds;
        }
    }
    outcomes
}

/// The `n` nodes whose pods waited longest (a node whose pods never waited is left out), slowest
/// first.
pub fn slowest(outcomes: &[NodeOutcome], n: usize) -> Vec<NodeTail> {
    let mut tails: Vec<NodeTail> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.pods.0 > 0.0)
        .map(|(node, o)| {
            let mut growth: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            for ((purpose, api), (calls, throttled)) in &o.calls {
                if matches!(*purpose, "pod" | "refill") && GROWTH_APIS.contains(&api.as_str()) {
                    let e = growth.entry(api.clone()).or_default();
                    e.0 += calls;
                    e.1 += throttled;
                }
            }
            NodeTail {
                node,
                max_add_wait_s: o.pods.0,
                last_done_s: o.pods.1,
                failed_adds: o.pods.2,
                growth,
            }
        })
        .collect();
    tails.sort_by(|a, b| b.max_add_wait_s.total_cmp(&a.max_add_wait_s));
    tails.truncate(n);
    tails
}

/// One line per node: `node 17: waited 112.3 s (last pod at 131.0 s), 20 failed ADDs; Assign… 1
/// of 9 not throttled, …`.
pub fn lines(tails: &[NodeTail]) -> Vec<String> {
    tails
        .iter()
        .map(|t| {
            let calls: Vec<String> = t
                .growth
                .iter()
                .map(|(api, (calls, throttled))| {
                    format!("{api} {} of {calls} not throttled", calls - throttled)
                })
                .collect();
            format!(
                "node {}: waited {:.1} s (its last pod served at {:.1} s), {} failed ADDs; {}",
                t.node,
                t.max_add_wait_s,
                t.last_done_s,
                t.failed_adds,
                if calls.is_empty() {
                    "no growth call".to_owned()
                } else {
                    calls.join(", ")
                }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(wait: f64, failed: u32, calls: &[(&'static str, &str, u64, u64)]) -> NodeOutcome {
        NodeOutcome {
            pods: (wait, wait + 5.0, failed),
            calls: calls
                .iter()
                .map(|(p, a, c, t)| ((*p, (*a).to_owned()), (*c, *t)))
                .collect(),
        }
    }

    #[test]
    fn the_slowest_nodes_come_first_with_their_growth_calls_only() {
        let outcomes = [
            outcome(0.0, 0, &[("pod", "AssignPrivateIpAddresses", 1, 0)]),
            outcome(
                112.0,
                20,
                &[
                    ("pod", "AssignPrivateIpAddresses", 9, 8),
                    ("refill", "AssignPrivateIpAddresses", 2, 2),
                    ("reconcile", "DescribeNetworkInterfaces", 3, 0),
                ],
            ),
            outcome(40.0, 0, &[("pod", "CreateNetworkInterface", 3, 2)]),
        ];
        let t = slowest(&outcomes, 2);
        assert_eq!(t.iter().map(|t| t.node).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            t[0].growth,
            BTreeMap::from([("AssignPrivateIpAddresses".to_owned(), (11, 10))])
        );
        assert_eq!(
            lines(&t[..1]),
            [
                "node 1: waited 112.0 s (its last pod served at 117.0 s), 20 failed ADDs; AssignPrivateIpAddresses 1 of 11 not throttled"
            ]
        );
        // A node whose pods never waited is not in the tail.
        assert_eq!(slowest(&outcomes[..1], 5), []);
    }
}
