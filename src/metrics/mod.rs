//! The metrics the request path and the reconcile record as they go (Prometheus families from
//! `prometheus-client`): `ipam`, `rpc` and `reconcile` count into one [`Metrics`], and
//! [`crate::telemetry`] renders it with the gauges it reads from snapshots at scrape time.
//!
//! Metric names follow the AWS VPC CNI's where one measures the same thing, with `eniipam_` for
//! `awscni_` (mapping in `docs/metrics.md`), so existing dashboards port by a prefix change.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The label of per-profile metrics: a NetworkProfile's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProfileLabel {
    pub profile: String,
}

impl ProfileLabel {
    pub fn of(profile: &str) -> Self {
        Self {
            profile: profile.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

/// Metrics recorded on the request path; the rest is read from snapshots at scrape time.
#[derive(Clone)]
pub struct Metrics {
    add_requests: Family<OutcomeLabel, Counter>,
    del_requests: Family<OutcomeLabel, Counter>,
    add_latency: Histogram,
    del_latency: Histogram,
    pub reconcile_dropped: Counter,
    pub reconcile_released: Counter,
    pub reconcile_unknown: Counter,
    pub gc_released: Counter,
    /// Pods released by the running reconcile because their netns is gone.
    pub netns_gc_released: Counter,
    /// Pool IPs EC2 no longer has on the ENI, and EC2 IPs on our ENIs the pool does not know (last pass).
    pub drift_missing_in_ec2: Gauge,
    pub drift_unknown_to_pool: Gauge,
    /// Pods whose IP went away with EC2 (out of band, or with its ENI).
    pub lost_pods: Counter,
    /// ENIs EC2 confirmed gone from the node (forgotten by the pool).
    pub forgotten_enis: Counter,
    /// New ENIs whose route table the host did not install within `eni_route_wait_secs`.
    pub eni_route_timeouts: Counter,
    /// Quarantined IPs released into the idle queue (evidence or operator).
    pub quarantine_lifted: Counter,
    /// State-file rows repaired from the pool by the running reconcile.
    pub store_repairs: Counter,
    /// Pods released because the API server says they are gone (src/reconcile/api_server).
    pub api_server_released: Counter,
    /// API-server releases put off because the pod's network namespace is still on the host.
    pub api_server_release_deferred: Counter,
    /// Errors of the API server pod watch (each one drops the view until a fresh list).
    pub api_server_watch_errors: Counter,
    /// 1 while the API server pod view is synced (initial list done, watch healthy).
    pub api_server_synced: Gauge,
    /// Pods bound to this node that the API server watch knows.
    pub api_server_bound_pods: Gauge,
    /// How long before its ADD each pod was first seen bound to the node (the API-server lookahead).
    pub demand_lead_time: Histogram,
    /// IPv6 addresses of the node's /80 that pods hold (ipv6 and dual).
    pub ipv6_assigned: Gauge,
    /// 1 once the node holds its /80 (ipv6 and dual).
    pub ipv6_prefixes: Gauge,
    /// Custom networking: 1 while the node's ENIConfig is usable (new ENIs can be created), 0 while
    /// it is missing, invalid or not known yet. Not set without custom networking.
    pub pod_network_ready: Gauge,
    /// Custom networking: times the node's ENIConfig (its name, subnet or groups) changed while the
    /// daemon ran; each change applies to new ENIs only.
    pub pod_network_changes: Counter,
    /// Network profiles: 1 while a profile is usable on this node (a valid NetworkProfile whose subnet
    /// and groups EC2 accepts here), 0 while not; a profile that is gone has no series.
    pub network_profile_usable: Family<ProfileLabel, Gauge>,
    /// NetworkPolicy enforcement (`eniipam_network_policy_*`, the `eniipam-netpol` crate's).
    pub network_policy: crate::network_policy::PolicyMetrics,
    startup_ms: Arc<AtomicU64>,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            add_requests: Family::default(),
            del_requests: Family::default(),
            add_latency: latency_histogram(),
            del_latency: latency_histogram(),
            reconcile_dropped: Counter::default(),
            reconcile_released: Counter::default(),
            reconcile_unknown: Counter::default(),
            gc_released: Counter::default(),
            netns_gc_released: Counter::default(),
            drift_missing_in_ec2: Gauge::default(),
            drift_unknown_to_pool: Gauge::default(),
            lost_pods: Counter::default(),
            forgotten_enis: Counter::default(),
            eni_route_timeouts: Counter::default(),
            quarantine_lifted: Counter::default(),
            store_repairs: Counter::default(),
            api_server_released: Counter::default(),
            api_server_release_deferred: Counter::default(),
            api_server_watch_errors: Counter::default(),
            api_server_synced: Gauge::default(),
            api_server_bound_pods: Gauge::default(),
            demand_lead_time: Histogram::new([
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
            ]),
            ipv6_assigned: Gauge::default(),
            ipv6_prefixes: Gauge::default(),
            pod_network_ready: Gauge::default(),
            network_profile_usable: Family::default(),
            pod_network_changes: Counter::default(),
            network_policy: Default::default(),
            startup_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Metrics {
    /// An Allocate finished with `outcome` (`ok` or a gRPC code) after `secs`.
    pub fn add(&self, outcome: &str, secs: f64) {
        self.add_requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.add_latency.observe(secs);
    }

    /// A Release finished.
    pub fn del(&self, outcome: &str, secs: f64) {
        self.del_requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.del_latency.observe(secs);
    }

    pub fn set_startup_ms(&self, ms: u64) {
        self.startup_ms.store(ms, Ordering::Relaxed);
    }

    /// Time from start to ready, once ready (0 before).
    pub fn startup_ms(&self) -> u64 {
        self.startup_ms.load(Ordering::Relaxed)
    }

    /// Registers every family recorded here in `reg` (names and help texts are this module's).
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "eniipam_add_ip_req",
            "Allocate requests by outcome (awscni_add_ip_req_count)",
            self.add_requests.clone(),
        );
        reg.register(
            "eniipam_del_ip_req",
            "Release requests by outcome (awscni_del_ip_req_count)",
            self.del_requests.clone(),
        );
        reg.register(
            "eniipam_add_ip_latency_seconds",
            "Allocate latency, durable commit included",
            self.add_latency.clone(),
        );
        reg.register(
            "eniipam_del_ip_latency_seconds",
            "Release latency",
            self.del_latency.clone(),
        );
        reg.register(
            "eniipam_reconcile_dropped_assignments",
            "Assignments dropped at startup: IP on no ENI any more",
            self.reconcile_dropped.clone(),
        );
        reg.register(
            "eniipam_reconcile_released_assignments",
            "Assignments released at startup: pod netns gone",
            self.reconcile_released.clone(),
        );
        reg.register(
            "eniipam_reconcile_unknown_ips",
            "IPs on our ENIs the state file did not know",
            self.reconcile_unknown.clone(),
        );
        reg.register(
            "eniipam_gc_released_attachments",
            "Attachments released by CNI GC",
            self.gc_released.clone(),
        );
        reg.register(
            "eniipam_reconcile_netns_released",
            "Pods released by the running reconcile: network namespace gone",
            self.netns_gc_released.clone(),
        );
        reg.register(
            "eniipam_reconcile_drift_missing_in_ec2",
            "Pool IPs that EC2 no longer shows on their ENI (last reconcile pass)",
            self.drift_missing_in_ec2.clone(),
        );
        reg.register(
            "eniipam_reconcile_drift_unknown_to_pool",
            "IPs EC2 shows on our ENIs that the pool does not know (last reconcile pass)",
            self.drift_unknown_to_pool.clone(),
        );
        reg.register(
            "eniipam_reconcile_lost_pods",
            "Pods whose IP went away with EC2 (unassigned out of band, or its ENI detached)",
            self.lost_pods.clone(),
        );
        reg.register(
            "eniipam_reconcile_forgotten_enis",
            "ENIs EC2 showed no longer attached to the node twice in a row (forgotten)",
            self.forgotten_enis.clone(),
        );
        reg.register(
            "eniipam_eni_route_table_timeouts",
            "New ENIs whose route table the host did not install within eni_route_wait_secs (given back)",
            self.eni_route_timeouts.clone(),
        );
        reg.register(
            "eniipam_quarantine_lifted_ips",
            "Quarantined IPs released into the idle queue (evidence visible, or an operator)",
            self.quarantine_lifted.clone(),
        );
        reg.register(
            "eniipam_reconcile_store_repairs",
            "State-file rows the running reconcile repaired from the pool",
            self.store_repairs.clone(),
        );
        reg.register(
            "eniipam_api_server_released",
            "Pods released by the running reconcile: gone from the Kubernetes API server",
            self.api_server_released.clone(),
        );
        reg.register(
            "eniipam_api_server_release_deferred",
            "API-server releases put off: the pod is gone from the API server, its network namespace is still on the host",
            self.api_server_release_deferred.clone(),
        );
        reg.register(
            "eniipam_api_server_watch_errors",
            "Errors of the API server pod watch (each one re-lists)",
            self.api_server_watch_errors.clone(),
        );
        reg.register(
            "eniipam_api_server_synced",
            "1 while the API server pod view is synced (0 also when the source is off)",
            self.api_server_synced.clone(),
        );
        reg.register(
            "eniipam_api_server_bound_pods",
            "Pods bound to this node that the API server watch knows",
            self.api_server_bound_pods.clone(),
        );
        reg.register(
            "eniipam_demand_lead_seconds",
            "How long before its CNI ADD a pod was first seen bound to this node (the API-server lookahead counts it as demand from then)",
            self.demand_lead_time.clone(),
        );
        reg.register(
            "eniipam_ipv6_assigned_ips",
            "IPv6 addresses of the node's /80 that pods hold (ip_family ipv6 or dual)",
            self.ipv6_assigned.clone(),
        );
        reg.register(
            "eniipam_ipv6_prefixes",
            "IPv6 /80 prefixes the node holds for pods (1 with ip_family ipv6 or dual, once taken)",
            self.ipv6_prefixes.clone(),
        );
        reg.register(
            "eniipam_pod_network_ready",
            "Custom networking: 1 while the node's ENIConfig is usable for new ENIs, 0 while it is missing, invalid or not known yet",
            self.pod_network_ready.clone(),
        );
        reg.register(
            "eniipam_pod_network_changes",
            "Custom networking: changes of the node's ENIConfig (name, subnet or security groups) while running; each applies to new ENIs only",
            self.pod_network_changes.clone(),
        );
        reg.register(
            "eniipam_network_profile_usable",
            "Network profiles: 1 while the profile is usable on this node (valid, its subnet and security groups accepted by EC2 here), 0 while not",
            self.network_profile_usable.clone(),
        );
        self.network_policy.register(reg);
    }
}
