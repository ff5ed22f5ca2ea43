//! Scenario `fleet`: many nodes (500 by default), each a real in-process eniipamd with its own IMDS
//! view, against one mockcloud whose EC2 throttling buckets are the account's; a cluster-wide
//! scale-up of 20 pods per node. The same run with the AWS VPC CNI's default warm policy emulated
//! (same code, its knobs) is the comparison.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use eniipam::config::DaemonConfig;
use eniipam::daemon::DaemonHandle;
use ipnet::Ipv4Net;
use mockcloud::{ActionClass, LatencyProfile, MockCloud, Throttling};
use tokio::time::Instant;

use crate::Ctx;
use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::{AcrossRuns, percentile};
use crate::support::{self, TempDir};

pub const INSTANCE: &str = "m5.xlarge";
/// The pods' subnet: room for 500 nodes × (primary + 3 ENI primaries + 42 pod IPs).
const SUBNET: &str = "10.0.64.0/18";
/// How long a pod waits before its runtime retries a failed ADD (kubelet re-syncs the sandbox).
const POD_RETRY: Duration = Duration::from_secs(2);
/// The scheduler binds the scale-up's pods over this window (each pod's ADD starts at a uniformly
/// random instant in it), as a real cluster-wide scale-up does not reach every node in the same
/// millisecond.
const SPREAD: Duration = Duration::from_secs(10);
/// Longest a run may take before it is reported as failed.
const RUN_LIMIT: Duration = Duration::from_secs(20 * 60);

/// A warm-pool policy: eniipam's defaults, or the AWS VPC CNI's emulated.
#[derive(Clone, Debug)]
struct Policy {
    name: &'static str,
    min_idle: u32,
    max_idle: u32,
    mutating_qps: f64,
    mutating_burst: u32,
    describe_qps: f64,
    describe_burst: u32,
}

fn policies(pod_ips_per_eni: u32) -> [Policy; 2] {
    let ours = DaemonConfig::default();
    [
        Policy {
            name: "eniipam (defaults)",
            min_idle: ours.min_idle,
            max_idle: ours.max_idle,
            mutating_qps: ours.ec2_mutating_qps,
            mutating_burst: ours.ec2_mutating_burst,
            describe_qps: ours.ec2_describe_qps,
            describe_burst: ours.ec2_describe_burst,
        },
        // WARM_ENI_TARGET=1 on a node whose eth0 secondaries also serve pods: a fresh node holds
        // eth0's IPs plus one spare ENI's free. eniipam leaves eth0 alone, so the same number of
        // free IPs is two ENIs' worth; ipamd frees an ENI only when a whole spare one is beyond
        // the target. ipamd has no client-side rate limiter of its own (reference §4.2): the node
        // buckets are opened wide.
        Policy {
            name: "AWS VPC CNI warm policy (emulated)",
            min_idle: 2 * pod_ips_per_eni,
            max_idle: 3 * pod_ips_per_eni,
            mutating_qps: 10_000.0,
            mutating_burst: 10_000,
            describe_qps: 10_000.0,
            describe_burst: 10_000,
        },
    ]
}

/// What one run of one policy measured.
struct RunResult {
    /// Seconds from the scale-up's start until the last pod had an IP.
    all_done_s: f64,
    /// Each pod's wait, ms, from its ADD's start to its IP.
    waits_ms: Vec<f64>,
    calls: u64,
    mutating: u64,
    throttled: u64,
    pods: u64,
    /// ADDs that failed and were retried.
    retried: u64,
    /// Free IPs held across the fleet at the end (VPC addresses not serving pods).
    idle_at_end: u64,
    /// Seconds to start every daemon and settle its warm pool (throttling off, fast EC2).
    warm_up_s: f64,
}

struct Node {
    dir: std::path::PathBuf,
    handle: DaemonHandle,
}

async fn start_nodes(
    mock: &MockCloud,
    subnet_id: &str,
    policy: &Policy,
    nodes: usize,
    root: &std::path::Path,
) -> anyhow::Result<Vec<Node>> {
    let mut launched = Vec::with_capacity(nodes);
    for _ in 0..nodes {
        launched.push(
            mock.launch_instance(INSTANCE, subnet_id)
                .await
                .context("launching a node")?,
        );
    }
    let mut started = Vec::with_capacity(nodes);
    // Start in waves so file descriptors and the 2 CPUs are not swamped at once.
    for (wave, chunk) in launched.chunks(50).enumerate() {
        let mut tasks = Vec::new();
        for (i, inst) in chunk.iter().enumerate() {
            let dir = root.join(format!("n{}", wave * 50 + i));
            std::fs::create_dir_all(&dir)?;
            let config = DaemonConfig {
                imds_endpoint: Some(inst.imds_url.clone()),
                min_idle: policy.min_idle,
                max_idle: policy.max_idle,
                ec2_mutating_qps: policy.mutating_qps,
                ec2_mutating_burst: policy.mutating_burst,
                ec2_describe_qps: policy.describe_qps,
                ec2_describe_burst: policy.describe_burst,
                reconcile_period_secs: DaemonConfig::default().reconcile_period_secs,
                log_level: "error".into(),
                ..support::daemon_config(mock, &dir)
            };
            tasks.push(tokio::spawn(async move {
                let handle = support::start_daemon(config).await?;
                anyhow::Ok(Node { dir, handle })
            }));
        }
        for t in tasks {
            started.push(t.await??);
        }
    }
    Ok(started)
}

/// Waits until every node's pool holds `min_idle` eligible idle IPs with nothing in flight.
async fn settle(nodes: &[Node], min_idle: u32, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let unsettled = nodes
            .iter()
            .filter(|n| {
                let s = n.handle.pool.snapshot();
                s.idle_eligible < min_idle || s.in_flight > 0 || s.creating_enis > 0
            })
            .count();
        if unsettled == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{unsettled} nodes did not warm to {min_idle} idle IPs within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cheap deterministic spread of start offsets (no RNG dependency): pod `i`'s offset in
/// `[0, SPREAD)`, well mixed across nodes.
fn offset(i: u64) -> Duration {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    SPREAD.mul_f64((h % 1_000_000) as f64 / 1_000_000.0)
}

async fn one_run(policy: &Policy, nodes: usize, pods_per_node: u32) -> anyhow::Result<RunResult> {
    let dir = TempDir::new("fleet")?;
    // Start quiet (fast EC2, no throttling) so the fleet's boot is not what is measured.
    let mock = MockCloud::start(mockcloud::Config {
        default_instance_type: INSTANCE.into(),
        ..mockcloud::Config::fast()
    })
    .await
    .context("cannot start mockcloud")?;
    let world = mock.default_world().context("no default world")?;
    let cidr: Ipv4Net = SUBNET.parse().expect("literal");
    let subnet_id = mock
        .create_subnet(&world.vpc_id, cidr, &world.instance.availability_zone)
        .map_err(|e| anyhow::anyhow!("creating the fleet's subnet: {e}"))?;

    let warm_started = Instant::now();
    let fleet = start_nodes(&mock, &subnet_id, policy, nodes, &dir.0).await?;
    settle(&fleet, policy.min_idle, Duration::from_secs(300)).await?;
    let warm_up_s = warm_started.elapsed().as_secs_f64();

    // The scale-up, with realistic latency and the account's throttling buckets, full.
    mock.set_latency(LatencyProfile::realistic());
    mock.set_imds_lag(LatencyProfile::realistic().imds_lag);
    mock.set_throttling(Throttling::default());
    mock.reset_counters();

    let retried = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (n, node) in fleet.iter().enumerate() {
        // One connection per node, shared by its pods' calls (HTTP/2 streams): 10,000 sockets
        // at once would measure file-descriptor limits, not the pool.
        let client = support::client(&node.handle.socket_path).await?;
        for p in 0..pods_per_node {
            let mut c = client.clone();
            let retried = retried.clone();
            let i = (n as u64) * u64::from(pods_per_node) + u64::from(p);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(t0 + offset(i)).await;
                let started = Instant::now();
                let container = format!("pod-{n}-{p}");
                loop {
                    match c.allocate(support::alloc_req(&container)).await {
                        Ok(_) => break,
                        Err(s) => {
                            if started.elapsed() > RUN_LIMIT {
                                bail!("pod {container}: no IP after {RUN_LIMIT:?}: {s}");
                            }
                            retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(POD_RETRY).await;
                        }
                    }
                }
                anyhow::Ok(started.elapsed().as_secs_f64() * 1e3)
            }));
        }
    }
    let mut waits_ms = Vec::with_capacity(tasks.len());
    for t in tasks {
        waits_ms.push(t.await??);
    }
    let all_done_s = t0.elapsed().as_secs_f64();
    let counters = mock.counters();
    let mut mutating = 0;
    let mut by_action = Vec::new();
    for (action, c) in &counters.actions {
        if ActionClass::of(action) == ActionClass::Mutating {
            mutating += c.calls;
        }
        by_action.push(format!("{action} {} ({} throttled)", c.calls, c.throttled));
    }
    eprintln!(
        "fleet: {}: calls by action: {}",
        policy.name,
        by_action.join(", ")
    );
    let idle_at_end = fleet
        .iter()
        .map(|n| u64::from(n.handle.pool.snapshot().idle))
        .sum();
    // All at once: a daemon whose calls are still waiting out a throttling pause takes its grace
    // period to stop, and 500 of those one after another would take many minutes.
    futures::future::join_all(fleet.into_iter().map(|n| async move {
        n.handle.shutdown().await;
        let _ = std::fs::remove_dir_all(&n.dir);
    }))
    .await;
    Ok(RunResult {
        all_done_s,
        pods: waits_ms.len() as u64,
        waits_ms,
        calls: counters.total_calls(),
        mutating,
        throttled: counters.total_throttled(),
        retried: retried.load(std::sync::atomic::Ordering::Relaxed),
        idle_at_end,
        warm_up_s,
    })
}

fn share(r: &RunResult) -> f64 {
    if r.calls == 0 {
        0.0
    } else {
        100.0 * r.throttled as f64 / r.calls as f64
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let nodes = ctx.fleet_nodes;
    let pods_per_node = ctx.fleet_pods;
    let limits =
        mockcloud::catalog::lookup(INSTANCE).context("instance type not in the catalog")?;
    let pod_ips_per_eni = limits.ipv4_per_eni - 1;
    let [ours_policy, theirs_policy] = policies(pod_ips_per_eni);
    // eniipam with its warm pool sized for the scale-up, holding no more free IPs at rest than the
    // VPC CNI's policy does: the same code and knobs an operator expecting such bursts would set.
    let sized_policy = Policy {
        name: "eniipam (min_idle sized for the scale-up)",
        min_idle: pods_per_node,
        max_idle: (2 * pod_ips_per_eni).max(pods_per_node),
        ..ours_policy.clone()
    };
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut sized = Vec::new();
    for r in 0..ctx.fleet_runs {
        for (policy, into) in [
            (&ours_policy, &mut ours),
            (&theirs_policy, &mut theirs),
            (&sized_policy, &mut sized),
        ] {
            let res = one_run(policy, nodes, pods_per_node).await?;
            eprintln!(
                "fleet: run {} {}: {} pods in {:.1} s, p99 wait {:.0} ms, {} EC2 calls ({} mutating, {} throttled = {:.1} %), {} ADDs retried, {} idle IPs held",
                r + 1,
                policy.name,
                res.pods,
                res.all_done_s,
                percentile(&res.waits_ms, 99.0).unwrap_or(0.0),
                res.calls,
                res.mutating,
                res.throttled,
                share(&res),
                res.retried,
                res.idle_at_end
            );
            into.push(res);
        }
    }
    let across = |runs: &[RunResult], f: &dyn Fn(&RunResult) -> f64| {
        AcrossRuns::of(&runs.iter().map(f).collect::<Vec<_>>()).context("no runs")
    };
    let measured = |v: AcrossRuns| Anchor::Measured {
        name: "VPC CNI policy".into(),
        value: v.median,
    };
    let p = |q: f64| move |r: &RunResult| percentile(&r.waits_ms, q).unwrap_or(0.0) / 1e3;
    let per_pod = |f: fn(&RunResult) -> u64| move |r: &RunResult| f(r) as f64 / r.pods as f64;
    let mut rows = Vec::new();
    let mut row_of = |runs: &[RunResult],
                      metric: &str,
                      unit: Unit,
                      f: &dyn Fn(&RunResult) -> f64,
                      target: Target| {
        let o = across(runs, f)?;
        let t = across(&theirs, f)?;
        rows.push(Row::new(metric, unit, o).anchor(measured(t)).target(target));
        anyhow::Ok(())
    };
    let mut row = |metric: &str, unit: Unit, f: &dyn Fn(&RunResult) -> f64, target: Target| {
        row_of(&ours, metric, unit, f, target)
    };
    row(
        "time until every pod has an IP",
        Unit::Secs,
        &|r| r.all_done_s,
        Target::Info,
    )?;
    row("per-pod wait, p50", Unit::Secs, &p(50.0), Target::Info)?;
    row("per-pod wait, p99", Unit::Secs, &p(99.0), Target::Info)?;
    row(
        "throttled share of EC2 calls, %",
        Unit::Ratio,
        &share,
        Target::AtMost(1.0),
    )?;
    row(
        "EC2 calls per pod",
        Unit::Ratio,
        &per_pod(|r| r.calls),
        Target::Info,
    )?;
    row(
        "mutating EC2 calls per pod",
        Unit::Ratio,
        &per_pod(|r| r.mutating),
        Target::Info,
    )?;
    row(
        "ADDs that failed and were retried",
        Unit::Count,
        &|r| r.retried as f64,
        Target::Info,
    )?;
    row(
        "free VPC IPs held by the fleet at the end",
        Unit::Count,
        &|r| r.idle_at_end as f64,
        Target::Info,
    )?;
    row(
        "boot: every daemon ready and warm (fast EC2, no throttling)",
        Unit::Secs,
        &|r| r.warm_up_s,
        Target::Info,
    )?;
    let sized_label = |m: &str| {
        format!(
            "min_idle {} / max_idle {}: {m}",
            sized_policy.min_idle, sized_policy.max_idle
        )
    };
    row_of(
        &sized,
        &sized_label("time until every pod has an IP"),
        Unit::Secs,
        &|r| r.all_done_s,
        Target::Info,
    )?;
    row_of(
        &sized,
        &sized_label("per-pod wait, p99"),
        Unit::Secs,
        &p(99.0),
        Target::Info,
    )?;
    row_of(
        &sized,
        &sized_label("throttled share of EC2 calls, %"),
        Unit::Ratio,
        &share,
        Target::AtMost(1.0),
    )?;
    row_of(
        &sized,
        &sized_label("EC2 calls per pod"),
        Unit::Ratio,
        &per_pod(|r| r.calls),
        Target::Info,
    )?;
    row_of(
        &sized,
        &sized_label("free VPC IPs held by the fleet at the end"),
        Unit::Count,
        &|r| r.idle_at_end as f64,
        Target::Info,
    )?;
    let series = vec![
        Series {
            label: "fleet: pod wait, eniipam".into(),
            samples: ours.iter().flat_map(|r| r.waits_ms.clone()).collect(),
        },
        Series {
            label: "fleet: pod wait, eniipam sized".into(),
            samples: sized.iter().flat_map(|r| r.waits_ms.clone()).collect(),
        },
        Series {
            label: "fleet: pod wait, VPC CNI policy".into(),
            samples: theirs.iter().flat_map(|r| r.waits_ms.clone()).collect(),
        },
    ];
    let b = Throttling::default();
    Ok(ScenarioReport {
        id: "fleet",
        title: format!(
            "{nodes} nodes, one account's EC2 throttling, a scale-up of {pods_per_node} pods per node"
        ),
        reproduce: format!(
            "cargo run --release -p eniipam-bench -- fleet --fleet-runs {} --nodes {nodes} --pods-per-node {pods_per_node}",
            ctx.fleet_runs
        ),
        setup: vec![
            format!(
                "one mockcloud; {nodes} {INSTANCE} instances launched in one /18 subnet, each with its own IMDS listener; one real eniipamd per node in this process (`Daemon::start_with`: its own SQLite file, gRPC socket, metrics listener, SDK clients, node rate limiter, reconcile every {} s)",
                DaemonConfig::default().reconcile_period_secs
            ),
            "boot with fast EC2 and throttling off until every pool is warm; then mockcloud switches to the realistic latency profile (create 400 ms, attach 250 ms + 2 s attaching, assign 150 ms, IMDS lag 1 s, ±20 % jitter) and EC2's account buckets, full, and the counters are reset".into(),
            format!(
                "scale-up: {} pods, each a gRPC Allocate to its node's daemon starting at a uniformly spread instant within {} s (the scheduler binding them); a failed ADD is retried after {} s, as kubelet re-syncs a sandbox",
                nodes as u64 * u64::from(pods_per_node),
                SPREAD.as_secs(),
                POD_RETRY.as_secs()
            ),
            format!(
                "account buckets (mockcloud = EC2's defaults): mutating {} burst, {}/s refill; describe {} burst, {}/s refill",
                b.mutating.capacity, b.mutating.refill_per_sec, b.describe.capacity, b.describe.refill_per_sec
            ),
            format!(
                "policies: eniipam as shipped (min_idle {}, max_idle {}, node buckets mutating {}/s burst {}, describe {}/s burst {}); the AWS VPC CNI's default WARM_ENI_TARGET=1 emulated with the same code: min_idle {} (eth0's {pod_ips_per_eni} plus one spare ENI's {pod_ips_per_eni}, eth0 being eniipam's own), max_idle {}, and no node rate limiter (ipamd has none); and eniipam with its warm pool sized for the scale-up (min_idle {}, max_idle {}: no more free IPs at rest than the VPC CNI policy holds)",
                ours_policy.min_idle,
                ours_policy.max_idle,
                ours_policy.mutating_qps,
                ours_policy.mutating_burst,
                ours_policy.describe_qps,
                ours_policy.describe_burst,
                theirs_policy.min_idle,
                theirs_policy.max_idle,
                sized_policy.min_idle,
                sized_policy.max_idle
            ),
        ],
        rows,
        notes: vec![
            "Anchor = the same run with the VPC CNI's warm policy; ratio = eniipam / that. Calls, throttles and retries are counted by mockcloud over the scale-up window (background reconciles included).".into(),
        ],
        plot_unit: "ms",
        series,
    })
}
