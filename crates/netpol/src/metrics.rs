//! NetworkPolicy enforcement's metrics (`eniipam_network_policy_*`, listed in `docs/metrics.md`):
//! the policies, the node's isolated pods, the size of the rules in the kernel, how long a change
//! takes to be in force, and the connections the rules allowed and denied, in all and per policy
//! rule; and the decision log's own counts. The enforcer records them from each sync and its
//! counter readings (`crate::enforcer`, `crate::decisions`'s task); plain numbers in. The daemon's
//! `Metrics` holds one [`PolicyMetrics`] and registers it with its own families.
//!
//! The per-rule family's labels are bounded: its series are the policy rules that select this
//! node's pods (namespace, policy, direction, rule index, verdict: not pods or peers), at most
//! [`MAX_RULE_SERIES`]; past that, new ones count under `policy="_other"` (rule `_other`).

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

/// Distinct label sets of `eniipam_network_policy_rule_verdicts_total` at most; the rest are
/// folded into `policy="_other"`.
pub const MAX_RULE_SERIES: usize = 2000;

/// One per-rule counter's reading: what it counts for, and its total in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleCount {
    /// What its growth is tracked by (the kernel counter, and for a denial the policy).
    pub key: String,
    pub namespace: String,
    pub policy: String,
    pub direction: &'static str,
    /// The rule's index (`none` for a denial: no rule allowed it).
    pub rule: String,
    pub verdict: &'static str,
    pub packets: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub namespace: String,
    pub policy: String,
    pub direction: &'static str,
    pub rule: String,
    pub verdict: &'static str,
}

#[derive(Debug, Default)]
struct RuleTotals {
    last: std::collections::HashMap<String, u64>,
    series: std::collections::HashSet<RuleLabel>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoggedLabel {
    pub verdict: &'static str,
}

/// New connections of the node's isolated pods the kernel counted, by direction and verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerdictCounts {
    pub ingress_allowed: u64,
    pub ingress_denied: u64,
    pub egress_allowed: u64,
    pub egress_denied: u64,
}

/// What one sync put in the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Synced {
    /// `full`, `update` or `unchanged`.
    pub kind: &'static str,
    /// NetworkPolicies in the cluster.
    pub policies: usize,
    pub rules: usize,
    pub elements: usize,
    /// The node's pods isolated for ingress and for egress.
    pub isolated: (usize, usize),
    /// When the oldest change this sync put in force happened.
    pub since: Option<Instant>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub direction: &'static str,
    pub verdict: &'static str,
}

/// The enforcer's metrics. Cloning is cheap (shared).
#[derive(Clone)]
pub struct PolicyMetrics {
    policies: Gauge,
    isolated_pods: Family<DirectionLabel, Gauge>,
    rules: Gauge,
    set_elements: Gauge,
    sync_seconds: Histogram,
    syncs: Family<KindLabel, Counter>,
    connections: Family<VerdictLabel, Counter>,
    superseded: Gauge,
    table_restored: Counter,
    unwired_adds: Counter,
    /// Packets dropped for a spoofed source, and the kernel's total last read.
    spoofed: Counter,
    last_spoofed: Arc<Mutex<u64>>,
    rule_verdicts: Family<RuleLabel, Counter>,
    /// Each per-rule counter's last total, by key, and the family's label sets.
    last_rules: Arc<Mutex<RuleTotals>>,
    decisions_logged: Family<LoggedLabel, Counter>,
    decisions_suppressed: Counter,
    decisions_unmapped: Counter,
    /// The kernel's totals last read (the counters restart when a table is loaded whole).
    last_counts: Arc<Mutex<VerdictCounts>>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        Self {
            policies: Gauge::default(),
            isolated_pods: Family::default(),
            rules: Gauge::default(),
            set_elements: Gauge::default(),
            sync_seconds: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            syncs: Family::default(),
            connections: Family::default(),
            superseded: Gauge::default(),
            table_restored: Counter::default(),
            unwired_adds: Counter::default(),
            spoofed: Counter::default(),
            last_spoofed: Arc::default(),
            rule_verdicts: Family::default(),
            last_rules: Arc::default(),
            decisions_logged: Family::default(),
            decisions_suppressed: Counter::default(),
            decisions_unmapped: Counter::default(),
            last_counts: Arc::default(),
        }
    }
}

impl PolicyMetrics {
    /// A sync reached the kernel.
    pub fn synced(&self, s: Synced) {
        self.policies.set(s.policies as i64);
        self.rules.set(s.rules as i64);
        self.set_elements.set(s.elements as i64);
        self.isolated_pods
            .get_or_create(&DirectionLabel {
                direction: "ingress",
            })
            .set(s.isolated.0 as i64);
        self.isolated_pods
            .get_or_create(&DirectionLabel {
                direction: "egress",
            })
            .set(s.isolated.1 as i64);
        self.syncs.get_or_create(&KindLabel { kind: s.kind }).inc();
        if let Some(t) = s.since {
            self.sync_seconds.observe(t.elapsed().as_secs_f64());
        }
    }

    /// A sync failed.
    pub fn sync_failed(&self) {
        self.syncs
            .get_or_create(&KindLabel { kind: "failed" })
            .inc();
    }

    /// The table was found missing or altered in the kernel and loaded whole again.
    pub fn table_restored(&self) {
        self.table_restored.inc();
    }

    /// An ADD from the plugin in the IPAM role: another plugin wired the pod, so no rule of this
    /// node's table applies to it. Returns the count so far.
    pub fn unwired_add(&self) -> u64 {
        self.unwired_adds.inc() + 1
    }

    /// The kernel's `spoofed` counter (packets from a pod's veth with a source not its own):
    /// what grew since the last reading is added (a smaller total restarted with a reloaded table).
    pub fn spoofed(&self, total: u64) {
        let mut last = self.last_spoofed.lock().unwrap_or_else(|p| p.into_inner());
        self.spoofed
            .inc_by(total.checked_sub(*last).unwrap_or(total));
        *last = total;
    }

    /// Attachments left out of the last sync because a newer one names the same host veth.
    pub fn superseded_attachments(&self, n: usize) {
        self.superseded.set(n as i64);
    }

    /// The kernel's counters summed over the node's pods: what grew since the last reading is
    /// added (a total that shrank restarted with a reloaded table or a gone pod: counted from 0).
    pub fn verdicts(&self, now: VerdictCounts) {
        let mut last = self.last_counts.lock().unwrap_or_else(|p| p.into_inner());
        for (direction, verdict, new, old) in [
            (
                "ingress",
                "allowed",
                now.ingress_allowed,
                last.ingress_allowed,
            ),
            ("ingress", "denied", now.ingress_denied, last.ingress_denied),
            ("egress", "allowed", now.egress_allowed, last.egress_allowed),
            ("egress", "denied", now.egress_denied, last.egress_denied),
        ] {
            let grown = if new >= old { new - old } else { new };
            self.connections
                .get_or_create(&VerdictLabel { direction, verdict })
                .inc_by(grown);
        }
        *last = now;
    }

    /// The per-rule counters read from the kernel: what grew since the last reading is added (a
    /// total that shrank restarted: counted from 0). A counter not read again is forgotten.
    pub fn rule_verdicts(&self, now: &[RuleCount]) {
        let mut totals = self.last_rules.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = std::collections::HashMap::with_capacity(now.len());
        for c in now {
            let old = totals.last.get(&c.key).copied().unwrap_or(0);
            let grown = if c.packets >= old {
                c.packets - old
            } else {
                c.packets
            };
            seen.insert(c.key.clone(), c.packets);
            let mut label = RuleLabel {
                namespace: c.namespace.clone(),
                policy: c.policy.clone(),
                direction: c.direction,
                rule: c.rule.clone(),
                verdict: c.verdict,
            };
            if !totals.series.contains(&label) {
                if totals.series.len() >= MAX_RULE_SERIES {
                    label.namespace = String::new();
                    label.policy = "_other".into();
                    label.rule = "_other".into();
                }
                totals.series.insert(label.clone());
            }
            self.rule_verdicts.get_or_create(&label).inc_by(grown);
        }
        totals.last = seen;
    }

    /// A decision written to the decision log (`deny` or `allow`).
    pub fn decision_logged(&self, verdict: &'static str) {
        self.decisions_logged
            .get_or_create(&LoggedLabel { verdict })
            .inc();
    }

    /// Decisions the log's rate left out.
    pub fn decisions_suppressed(&self, n: u64) {
        self.decisions_suppressed.inc_by(n);
    }

    /// Logged packets the daemon could not map to a pod (the table changed under them) or
    /// lost (the socket overflowed).
    pub fn decision_unmapped(&self) {
        self.decisions_unmapped.inc();
    }

    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "eniipam_network_policy_policies",
            "NetworkPolicies in the cluster, as the enforcer's watch sees them",
            self.policies.clone(),
        );
        reg.register(
            "eniipam_network_policy_isolated_pods",
            "Pods of this node isolated by some NetworkPolicy, by direction",
            self.isolated_pods.clone(),
        );
        reg.register(
            "eniipam_network_policy_rules",
            "Rules in the kernel's table inet eniipam_policy",
            self.rules.clone(),
        );
        reg.register(
            "eniipam_network_policy_set_elements",
            "Elements (addresses, ranges, ports) in the table's sets",
            self.set_elements.clone(),
        );
        reg.register(
            "eniipam_network_policy_sync_seconds",
            "Time from a change (a NetworkPolicy, pod or namespace, or a pod ADDed here) to its rules in force",
            self.sync_seconds.clone(),
        );
        reg.register(
            "eniipam_network_policy_syncs",
            "Syncs of the table by kind: full (loaded whole), update (in place), unchanged, failed",
            self.syncs.clone(),
        );
        reg.register(
            "eniipam_network_policy_connections",
            "New connections of this node's isolated pods the rules allowed or denied, by direction",
            self.connections.clone(),
        );
        reg.register(
            "eniipam_network_policy_superseded_attachments",
            "Pod attachments left out of the rules because a newer attachment names the same host veth (a sandbox recreated before the old one's DEL)",
            self.superseded.clone(),
        );
        reg.register(
            "eniipam_network_policy_table_restored",
            "Times the table inet eniipam_policy was found missing or altered in the kernel (another agent's nft flush ruleset) and loaded whole again",
            self.table_restored.clone(),
        );
        reg.register(
            "eniipam_network_policy_unenforced_adds",
            "Pods given an address in the IPAM role (another plugin wired them) while enforcement is on: no rule applies to them",
            self.unwired_adds.clone(),
        );
        reg.register(
            "eniipam_network_policy_spoofed_packets",
            "Packets from a local pod's veth whose source was not one of the pod's own addresses, dropped (issue 47, case 2)",
            self.spoofed.clone(),
        );
        reg.register(
            "eniipam_network_policy_rule_verdicts",
            "New connections of this node's isolated pods by the policy rule that allowed them (verdict allowed, rule = its index in the policy's ingress/egress) or by each policy isolating the pod when none did (verdict denied, rule none); at most 2000 label sets, the rest under policy _other",
            self.rule_verdicts.clone(),
        );
        reg.register(
            "eniipam_network_policy_decisions_logged",
            "Decisions written to the decision log (the daemon's log and network_policy_log_file), by verdict",
            self.decisions_logged.clone(),
        );
        reg.register(
            "eniipam_network_policy_decisions_suppressed",
            "Decisions the decision log left out to keep to network_policy_log_rate",
            self.decisions_suppressed.clone(),
        );
        reg.register(
            "eniipam_network_policy_decisions_unmapped",
            "Logged packets not written: their pod or rule no longer in the table, or lost when the log socket overflowed",
            self.decisions_unmapped.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_counters_only_grow_across_a_reloaded_table() {
        let m = PolicyMetrics::default();
        let denied = || {
            m.connections
                .get_or_create(&VerdictLabel {
                    direction: "ingress",
                    verdict: "denied",
                })
                .get()
        };
        m.verdicts(VerdictCounts {
            ingress_denied: 5,
            ..VerdictCounts::default()
        });
        m.verdicts(VerdictCounts {
            ingress_denied: 7,
            ..VerdictCounts::default()
        });
        assert_eq!(denied(), 7);
        // The table was loaded whole: the kernel counts from 0 again.
        m.verdicts(VerdictCounts {
            ingress_denied: 2,
            ..VerdictCounts::default()
        });
        assert_eq!(denied(), 9);
    }

    #[test]
    fn rule_verdicts_grow_per_rule_and_fold_past_the_series_bound() {
        let m = PolicyMetrics::default();
        let count = |key: &str, policy: &str, packets| RuleCount {
            key: key.into(),
            namespace: "x".into(),
            policy: policy.into(),
            direction: "ingress",
            rule: "0".into(),
            verdict: "allowed",
            packets,
        };
        let get = |policy: &str| {
            m.rule_verdicts
                .get_or_create(&RuleLabel {
                    namespace: if policy == "_other" { "" } else { "x" }.into(),
                    policy: policy.into(),
                    direction: "ingress",
                    rule: if policy == "_other" { "_other" } else { "0" }.into(),
                    verdict: "allowed",
                })
                .get()
        };
        // Two pods' chains under one rule add up; a reading that shrank restarted from 0.
        m.rule_verdicts(&[count("in_a_r0", "p", 3), count("in_b_r0", "p", 4)]);
        m.rule_verdicts(&[count("in_a_r0", "p", 5), count("in_b_r0", "p", 1)]);
        assert_eq!(get("p"), 3 + 4 + 2 + 1);
        // Past the bound, new label sets go to _other; known ones keep counting.
        let many: Vec<RuleCount> = (0..MAX_RULE_SERIES + 5)
            .map(|i| count(&format!("in_{i}_r0"), &format!("q{i}"), 1))
            .collect();
        m.rule_verdicts(&many);
        assert_eq!(get("_other"), 6, "p and 1,999 q's fit; 6 more fold");
        assert_eq!(get("q0"), 1);
    }
}
