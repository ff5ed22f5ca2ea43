//! Scenario `startup`: the startup rebuild of a full m5.24xlarge, timed from `Daemon::start_with` to
//! ready, against mockcloud with EC2/IMDS latency configured.

use std::time::Duration;

use anyhow::Context;
use eniipam::daemon::Daemon;
use mockcloud::{Counters, LatencyProfile};
use tokio::time::Instant;

use crate::Ctx;
use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::AcrossRuns;
use crate::support::{self, TempDir};

pub const INSTANCE: &str = "m5.24xlarge";

/// What the mock's configured latency adds up to over the calls made: every EC2 action at its
/// nominal latency plus every IMDS request, as if they ran one after another.
pub fn latency_sum_ms(profile: &LatencyProfile, counters: &Counters) -> f64 {
    let ec2: f64 = counters
        .actions
        .iter()
        .map(|(a, c)| c.calls as f64 * profile.latency(a).as_secs_f64() * 1e3)
        .sum();
    ec2 + counters.imds_requests as f64 * profile.imds_latency.as_secs_f64() * 1e3
}

struct RunResult {
    start_ms: f64,
    /// The same start with the mock's latency at zero: the rebuild's own cost.
    start_fast_ms: f64,
    clients_ms: f64,
    latency_sum_ms: f64,
    kept: usize,
    ec2_calls: u64,
    imds_requests: u64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let it = mockcloud::catalog::lookup(INSTANCE).context("instance type")?;
    let dir = TempDir::new("startup")?;
    let mock = support::mock(INSTANCE, false).await?;
    let mut config = support::daemon_config(&mock, &dir.0);
    config.min_idle = 0;
    config.ec2_mutating_qps = 100.0;
    config.ec2_mutating_burst = 100;

    // 1. Fill the node, on the fast profile.
    let d = support::start_daemon(config.clone()).await?;
    let capacity = d.pool.snapshot().capacity;
    let fill_started = Instant::now();
    let (filled, err) = support::fill(&d.socket_path, "pod", capacity, 16).await?;
    anyhow::ensure!(
        filled == capacity,
        "filled {filled} of {capacity}: {}",
        err.unwrap_or_default()
    );
    let fill_s = fill_started.elapsed().as_secs_f64();
    let enis = d.pool.snapshot().enis.len();
    d.shutdown().await;
    eprintln!("startup: filled {filled} pods on {enis} ENIs in {fill_s:.1} s");

    // 2. Restart against EC2/IMDS with latency, no jitter (so the sum is exact).
    let profile = LatencyProfile {
        jitter: 0.0,
        ..LatencyProfile::realistic()
    };
    let mut runs = Vec::new();
    for r in 0..ctx.runs {
        mock.set_latency(LatencyProfile::fast());
        let t = Instant::now();
        let fast = support::start_daemon(config.clone()).await?;
        let start_fast_ms = t.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(
            fast.report.kept == filled as usize,
            "fast restart lost assignments"
        );
        fast.shutdown().await;
        mock.set_latency(profile.clone());
        mock.reset_counters();
        let t0 = Instant::now();
        let clients = support::clients(&config).await?;
        let clients_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let d = Daemon::start_with(config.clone(), clients)
            .await
            .context("restart")?;
        let start_ms = t1.elapsed().as_secs_f64() * 1e3;
        let counters = mock.counters();
        let res = RunResult {
            start_ms,
            start_fast_ms,
            clients_ms,
            latency_sum_ms: latency_sum_ms(&profile, &counters),
            kept: d.report.kept,
            ec2_calls: counters.total_calls(),
            imds_requests: counters.imds_requests,
        };
        anyhow::ensure!(
            res.kept == filled as usize,
            "the rebuild kept {} of {filled} assignments",
            res.kept
        );
        d.shutdown().await;
        eprintln!(
            "startup: run {}/{}: ready in {:.0} ms (configured latency on the path {:.0} ms, {} EC2 calls, {} IMDS requests)",
            r + 1,
            ctx.runs,
            res.start_ms,
            res.latency_sum_ms,
            res.ec2_calls,
            res.imds_requests
        );
        runs.push(res);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let across = |f: fn(&RunResult) -> f64| {
        AcrossRuns::of(&runs.iter().map(f).collect::<Vec<_>>()).context("no runs")
    };
    let start = across(|r| r.start_ms)?;
    let sum = across(|r| r.latency_sum_ms)?;
    let last = runs.last().context("no runs")?;
    let rows = vec![
        Row::new("Daemon::start_with → ready", Unit::Ms, start)
            .anchor(Anchor::Reference {
                name: "configured latency on the path".into(),
                value: sum.median,
            })
            .target(Target::AtMost(500.0 + sum.median)),
        Row::new(
            "same start, mock latency zero (the rebuild's own cost, clients included)",
            Unit::Ms,
            across(|r| r.start_fast_ms)?,
        )
        .target(Target::AtMost(500.0)),
        Row::new(
            "building the SDK clients (before start_with)",
            Unit::Ms,
            across(|r| r.clients_ms)?,
        ),
    ];
    Ok(ScenarioReport {
        id: "startup",
        title: format!("startup rebuild of a full {INSTANCE}"),
        reproduce: format!("cargo run --release -p eniipam-bench -- startup --runs {}", ctx.runs),
        setup: vec![
            format!(
                "state prepared by a real eniipamd on mockcloud (fast profile): {filled} pods allocated over gRPC on {enis} ENIs (eth0 + {} secondary) in {fill_s:.1} s, then a clean shutdown",
                enis.saturating_sub(1)
            ),
            format!(
                "{filled} = 14 secondary ENIs × 49 pod IPs: eniipam's capacity excludes eth0 and each ENI's primary IP. The AWS VPC CNI's max-pods figure for {INSTANCE}, 737 = {} ENIs × ({} − 1) + 2, also counts eth0's 49 secondaries and 2 host-network pods; 737 assignments cannot exist here",
                it.max_enis, it.ipv4_per_eni
            ),
            format!(
                "each run: fresh SDK clients, then `Daemon::start_with` on the same state file against mockcloud with `LatencyProfile::realistic()` without jitter (DescribeInstances 120 ms, DescribeInstanceTypes 100 ms, DescribeNetworkInterfaces 100 ms, IMDS 1 ms per request); last run: {} EC2 calls, {} IMDS requests, configured latency {:.0} ms; the rebuild kept all {filled} assignments every run",
                last.ec2_calls, last.imds_requests, last.latency_sum_ms
            ),
            "the latency sum adds every call as if sequential; the daemon reads IMDS concurrently, so the real wait on the mock is below it (a start can come in under the sum)".into(),
        ],
        rows,
        notes: vec![],
        plot_unit: "ms from start_with to ready",
        series: vec![Series {
            label: "startup".into(),
            samples: runs.iter().map(|r| r.start_ms).collect(),
        }],
    })
}
