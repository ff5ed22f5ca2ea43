//! NetworkPolicy enforcement's metrics (`eniipam_network_policy_*`, listed in `docs/metrics.md`):
//! the policies, the node's isolated pods, the size of the rules in the kernel, how long a change
//! takes to be in force, and the connections the rules allowed and denied. The daemon records them
//! from each sync (`crate::daemon`'s `network_policy`); plain numbers in, so this layer knows
//! nothing of the enforcer.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

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
}
