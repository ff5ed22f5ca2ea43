//! Logs (tracing), Prometheus metrics (prometheus-client) and `/healthz` `/readyz` over HTTP.
//!
//! Metric names follow the AWS VPC CNI's where one measures the same thing, with `eniipam_` for
//! `awscni_` (mapping in `docs/metrics.md`), so existing dashboards port by a prefix change.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cloud::calls::{CallStats, HISTOGRAM_BOUNDS_SECONDS};
use crate::cloud::leak::LeakCollector;
use crate::config::LogFormat;
use crate::pool::Pool;

/// Sets up tracing: JSON lines or human text, filtered by `level` (e.g. `info`, `eniipam=debug`).
pub fn init_logging(format: LogFormat, level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| "info".into());
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    // Colour only on a terminal: a file or a pipe (the container runtime's log) gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
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
}

/// What `/metrics` reads.
#[derive(Clone)]
pub struct Sources {
    pub metrics: Metrics,
    pub pool: Arc<std::sync::OnceLock<Pool>>,
    pub calls: Arc<CallStats>,
    pub leak: Arc<std::sync::OnceLock<Arc<LeakCollector>>>,
    pub ready: Arc<AtomicBool>,
}

fn gauge(reg: &mut Registry, name: &str, help: &str, v: i64) {
    let g: Gauge = Gauge::default();
    g.set(v);
    reg.register(name, help, g);
}

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// The metrics text (OpenMetrics).
pub fn render(s: &Sources) -> String {
    let mut reg = Registry::default();
    let m = &s.metrics;
    reg.register(
        "eniipam_add_ip_req",
        "Allocate requests by outcome (awscni_add_ip_req_count)",
        m.add_requests.clone(),
    );
    reg.register(
        "eniipam_del_ip_req",
        "Release requests by outcome (awscni_del_ip_req_count)",
        m.del_requests.clone(),
    );
    reg.register(
        "eniipam_add_ip_latency_seconds",
        "Allocate latency, durable commit included",
        m.add_latency.clone(),
    );
    reg.register(
        "eniipam_del_ip_latency_seconds",
        "Release latency",
        m.del_latency.clone(),
    );
    reg.register(
        "eniipam_reconcile_dropped_assignments",
        "Assignments dropped at startup: IP on no ENI any more",
        m.reconcile_dropped.clone(),
    );
    reg.register(
        "eniipam_reconcile_released_assignments",
        "Assignments released at startup: pod netns gone",
        m.reconcile_released.clone(),
    );
    reg.register(
        "eniipam_reconcile_unknown_ips",
        "IPs on our ENIs the state file did not know",
        m.reconcile_unknown.clone(),
    );
    reg.register(
        "eniipam_gc_released_attachments",
        "Attachments released by CNI GC",
        m.gc_released.clone(),
    );
    reg.register(
        "eniipam_reconcile_netns_released",
        "Pods released by the running reconcile: network namespace gone",
        m.netns_gc_released.clone(),
    );
    reg.register(
        "eniipam_reconcile_drift_missing_in_ec2",
        "Pool IPs that EC2 no longer shows on their ENI (last reconcile pass)",
        m.drift_missing_in_ec2.clone(),
    );
    reg.register(
        "eniipam_reconcile_drift_unknown_to_pool",
        "IPs EC2 shows on our ENIs that the pool does not know (last reconcile pass)",
        m.drift_unknown_to_pool.clone(),
    );
    reg.register(
        "eniipam_reconcile_lost_pods",
        "Pods whose IP went away with EC2 (unassigned out of band, or its ENI detached)",
        m.lost_pods.clone(),
    );
    reg.register(
        "eniipam_reconcile_forgotten_enis",
        "ENIs EC2 showed no longer attached to the node twice in a row (forgotten)",
        m.forgotten_enis.clone(),
    );
    reg.register(
        "eniipam_eni_route_table_timeouts",
        "New ENIs whose route table the host did not install within eni_route_wait_secs (given back)",
        m.eni_route_timeouts.clone(),
    );
    reg.register(
        "eniipam_quarantine_lifted_ips",
        "Quarantined IPs released into the idle queue (evidence visible, or an operator)",
        m.quarantine_lifted.clone(),
    );
    reg.register(
        "eniipam_reconcile_store_repairs",
        "State-file rows the running reconcile repaired from the pool",
        m.store_repairs.clone(),
    );
    reg.register(
        "eniipam_api_server_released",
        "Pods released by the running reconcile: gone from the Kubernetes API server",
        m.api_server_released.clone(),
    );
    reg.register(
        "eniipam_api_server_release_deferred",
        "API-server releases put off: the pod is gone from the API server, its network namespace is still on the host",
        m.api_server_release_deferred.clone(),
    );
    reg.register(
        "eniipam_api_server_watch_errors",
        "Errors of the API server pod watch (each one re-lists)",
        m.api_server_watch_errors.clone(),
    );
    reg.register(
        "eniipam_api_server_synced",
        "1 while the API server pod view is synced (0 also when the source is off)",
        m.api_server_synced.clone(),
    );
    reg.register(
        "eniipam_api_server_bound_pods",
        "Pods bound to this node that the API server watch knows",
        m.api_server_bound_pods.clone(),
    );
    gauge(
        &mut reg,
        "eniipam_ready",
        "1 once the startup rebuild is done",
        i64::from(s.ready.load(Ordering::Acquire)),
    );
    gauge(
        &mut reg,
        "eniipam_startup_milliseconds",
        "Time from start to ready",
        s.startup_ms() as i64,
    );
    if let Some(pool) = s.pool.get() {
        let snap = pool.snapshot();
        gauge(
            &mut reg,
            "eniipam_ip_max",
            "IP slots this node may hold (awscni_ip_max)",
            i64::from(snap.capacity),
        );
        gauge(
            &mut reg,
            "eniipam_eni_max",
            "ENIs this node may have (awscni_eni_max)",
            i64::from(snap.max_enis),
        );
        gauge(
            &mut reg,
            "eniipam_eni_allocated",
            "ENIs attached (awscni_eni_allocated)",
            snap.enis.len() as i64,
        );
        gauge(
            &mut reg,
            "eniipam_quarantined_ip_addresses",
            "IPs held out of circulation: history unknown and no evidence of who holds them",
            i64::from(snap.quarantined),
        );
        gauge(
            &mut reg,
            "eniipam_held_back_ip_addresses",
            "Idle IPs held back on ENIs EC2 did not show attached",
            i64::from(snap.held_back),
        );
        let held = snap.idle + snap.assigned + snap.releasing + snap.quarantined + snap.held_back;
        gauge(
            &mut reg,
            "eniipam_total_ip_addresses",
            "Pod IPs held by the node (awscni_total_ip_addresses)",
            i64::from(held),
        );
        gauge(
            &mut reg,
            "eniipam_assigned_ip_addresses",
            "Pod IPs assigned to pods (awscni_assigned_ip_addresses)",
            i64::from(snap.assigned),
        );
        gauge(
            &mut reg,
            "eniipam_idle_ip_addresses",
            "Idle IPs free for any pod now",
            i64::from(snap.idle_eligible),
        );
        gauge(
            &mut reg,
            "eniipam_cooling_ip_addresses",
            "Idle IPs in their reuse cooldown",
            i64::from(snap.cooling),
        );
        gauge(
            &mut reg,
            "eniipam_sticky_ip_addresses",
            "Idle IPs reserved for a sticky key",
            i64::from(snap.reserved),
        );
        gauge(
            &mut reg,
            "eniipam_capacity_tokens_used",
            "Capacity tokens taken (idle + assigned + in flight)",
            i64::from(snap.tokens_used),
        );
        gauge(
            &mut reg,
            "eniipam_in_flight_ip_requests",
            "IPs being fetched from EC2",
            i64::from(snap.in_flight),
        );
        gauge(
            &mut reg,
            "eniipam_warm_target_ip_addresses",
            "The warm level now: below it (idle + arriving) the pool tops up",
            i64::from(snap.warm_target),
        );
        gauge(
            &mut reg,
            "eniipam_warm_fill_ip_addresses",
            "What a top-up fills the idle IPs to now",
            i64::from(snap.warm_fill),
        );
        gauge(
            &mut reg,
            "eniipam_warm_keep_ip_addresses",
            "Idle IPs beyond this are given back now",
            i64::from(snap.warm_keep),
        );
        gauge(
            &mut reg,
            "eniipam_exhausted",
            "1 while the pool cannot get more IPs",
            i64::from(snap.exhaustion.is_some()),
        );
        let backlog: Family<EniLabel, Gauge> = Family::default();
        for e in &snap.enis {
            backlog
                .get_or_create(&EniLabel {
                    eni: e.id.to_string(),
                })
                .set(i64::from(e.in_flight));
        }
        reg.register(
            "eniipam_eni_backlog",
            "Requests queued on each ENI's ipBacklog",
            backlog,
        );
    }
    if let Some(leak) = s.leak.get() {
        let t = leak.totals();
        counter(
            &mut reg,
            "eniipam_leaked_eni_deleted",
            "Leaked ENIs deleted by the collector",
            t.deleted,
        );
        counter(
            &mut reg,
            "eniipam_leaked_eni_found",
            "Leaked-ENI candidates found",
            t.found,
        );
    }
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    // Append the call histograms before the closing `# EOF`.
    let mut out = out.trim_end().trim_end_matches("# EOF").to_owned();
    render_calls(&mut out, &s.calls);
    out.push_str("# EOF\n");
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EniLabel {
    eni: String,
}

impl Sources {
    fn startup_ms(&self) -> u64 {
        self.metrics.startup_ms.load(Ordering::Relaxed)
    }
}

/// EC2/IMDS call histograms, retry counters and EC2 calls by purpose from [`CallStats`], in
/// OpenMetrics text.
fn render_calls(out: &mut String, calls: &CallStats) {
    let snap = calls.snapshot();
    let _ = writeln!(
        out,
        "# HELP eniipam_aws_api_latency_seconds EC2 and IMDS calls by API and outcome (awscni_aws_api_latency_ms)"
    );
    let _ = writeln!(out, "# TYPE eniipam_aws_api_latency_seconds histogram");
    for s in &snap.calls {
        let labels = format!("api=\"{}\",outcome=\"{}\"", s.api, s.outcome.as_str());
        let mut cumulative = 0;
        for (i, le) in HISTOGRAM_BOUNDS_SECONDS.iter().enumerate() {
            cumulative += s.latency.buckets[i];
            let _ = writeln!(
                out,
                "eniipam_aws_api_latency_seconds_bucket{{{labels},le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "eniipam_aws_api_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
            s.latency.count
        );
        let _ = writeln!(
            out,
            "eniipam_aws_api_latency_seconds_sum{{{labels}}} {}",
            s.latency.sum.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "eniipam_aws_api_latency_seconds_count{{{labels}}} {}",
            s.latency.count
        );
    }
    let _ = writeln!(
        out,
        "# HELP eniipam_aws_api_retries EC2 call retries after throttling or transient errors"
    );
    let _ = writeln!(out, "# TYPE eniipam_aws_api_retries counter");
    for (api, n) in &snap.retries {
        let _ = writeln!(out, "eniipam_aws_api_retries_total{{api=\"{api}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP eniipam_ec2_calls EC2 call attempts by purpose, API and whether EC2 throttled them"
    );
    let _ = writeln!(out, "# TYPE eniipam_ec2_calls counter");
    for p in &snap.by_purpose {
        for (throttled, n) in [(false, p.calls - p.throttled), (true, p.throttled)] {
            let _ = writeln!(
                out,
                "eniipam_ec2_calls_total{{purpose=\"{}\",api=\"{}\",throttled=\"{throttled}\"}} {n}",
                p.purpose.as_str(),
                p.api
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP eniipam_rate_limiter_wait_seconds Time EC2 calls waited for a rate-limit token"
    );
    let _ = writeln!(out, "# TYPE eniipam_rate_limiter_wait_seconds counter");
    for (bucket, h) in &snap.limiter_waits {
        let _ = writeln!(
            out,
            "eniipam_rate_limiter_wait_seconds_total{{bucket=\"{bucket}\"}} {}",
            h.sum.as_secs_f64()
        );
    }
}

async fn metrics(State(s): State<Sources>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(&s),
    )
}

async fn readyz(State(s): State<Sources>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: rebuilding state",
        )
    }
}

/// Binds the metrics listener (so the address is known before startup continues).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `cancel`.
pub async fn serve(listener: TcpListener, sources: Sources, cancel: CancellationToken) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(sources);
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
}
