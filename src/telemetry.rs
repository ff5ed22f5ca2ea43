//! Logs (tracing), and the daemon's HTTP listener: `/metrics` (OpenMetrics: the families the request
//! path records in [`crate::metrics`], and gauges read from the pool's snapshot, EC2/IMDS call
//! statistics and the leaked-ENI collector at scrape time), `/healthz` and `/readyz`.
//!
//! Metric names follow the AWS VPC CNI's where one measures the same thing, with `eniipam_` for
//! `awscni_` (mapping in `docs/metrics.md`), so existing dashboards port by a prefix change.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cloud::calls::{CallStats, HISTOGRAM_BOUNDS_SECONDS};
use crate::cloud::leak::LeakCollector;
use crate::config::LogFormat;
use crate::metrics::{Metrics, ProfileLabel};
use crate::pool::{Pool, ProfileCapacity, ProfileName};

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
    s.metrics.register(&mut reg);
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
        s.metrics.startup_ms() as i64,
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
        register_profiles(&mut reg, &pool.profile_capacity());
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

/// Network profiles: each profile's use of the node, labelled `profile` (none without profiles).
fn register_profiles(reg: &mut Registry, caps: &BTreeMap<ProfileName, ProfileCapacity>) {
    if caps.is_empty() {
        return;
    }
    type Gauged = (&'static str, &'static str, fn(&ProfileCapacity) -> u32);
    let families: [Gauged; 5] = [
        (
            "eniipam_network_profile_enis",
            "ENIs of the profile (attached and being created)",
            |c| c.enis,
        ),
        (
            "eniipam_network_profile_assigned_ip_addresses",
            "IPs of the profile's ENIs held by its pods",
            |c| c.assigned,
        ),
        (
            "eniipam_network_profile_idle_ip_addresses",
            "IPs of the profile's ENIs idle (cooling, or waiting to go back to EC2)",
            |c| c.idle,
        ),
        (
            "eniipam_network_profile_total_slots",
            "Pods of the profile the node can hold in all (what it advertises as eniipam.io/network-<profile>)",
            |c| c.total,
        ),
        (
            "eniipam_network_profile_free_slots",
            "Of the profile's total slots, those no pod holds and no cooling IP waits on",
            |c| c.free,
        ),
    ];
    for (name, help, value) in families {
        let family: Family<ProfileLabel, Gauge> = Family::default();
        for (p, c) in caps {
            family
                .get_or_create(&ProfileLabel::of(p))
                .set(i64::from(value(c)));
        }
        reg.register(name, help, family);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EniLabel {
    eni: String,
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
