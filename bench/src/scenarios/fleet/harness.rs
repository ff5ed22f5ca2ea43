//! One (pattern, policy) pair on simulated time: its own OS thread and `current_thread` tokio runtime
//! with a paused clock, on which mockcloud, every node's eniipamd and every pod run. The clock moves
//! only when nothing is runnable, straight to the next timer, so an hour of traffic costs what its
//! work costs and no more; CPU time costs no simulated time.
//!
//! The daemons' SQLite stores answer from their own threads, outside the runtime; while one of their
//! answers is awaited the runtime would see no work and jump the clock ahead. The bench therefore
//! turns on `eniipam::store::hold_the_clock_on_disk_waits` (store calls then wait inside
//! `spawn_blocking`, which holds a paused clock). Everything else talks over sockets within the
//! runtime (gRPC over unix sockets, EC2 and IMDS over loopback HTTP), whose readiness the runtime
//! polls before it advances the clock.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use eniipam::config::DaemonConfig;
use eniipam::daemon::DaemonHandle;
use eniipam::pool::snapshot::PoolSnapshot;
use eniipam_api::pb::ipam_client::IpamClient;
use ipnet::Ipv4Net;
use mockcloud::{ActionClass, LatencyProfile, MockCloud, Throttling};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::bound::{NodeStart, fleet_min_calls};
use super::pods::{Recorder, running_name, spawn_drivers};
use super::policy::Policy;
use super::traffic::{Life, Pattern, PodPlan};
use crate::support::{self, TempDir};

pub const INSTANCE: &str = "m5.xlarge";
/// Nodes per subnet: each gets its own VPC and `/16` (EC2's largest), so a node has 128 addresses of
/// room (primary, ENI primaries, up to 56 pod IPs, the warm pool, `/28` alignment).
const NODES_PER_SUBNET: usize = 500;
/// Daemons started at once while the fleet boots.
const BOOT_WAVE: usize = 50;
/// The fleet is settled once every node has held nothing in flight and its warm target this long.
pub const SETTLE_HOLD: Duration = Duration::from_secs(30);
/// Longest boot-and-settle before the pair is reported as failed.
const SETTLE_LIMIT: Duration = Duration::from_secs(30 * 60);
/// A pod still without an IP this long after the pattern's window is given up (counted unserved,
/// its wait censored there).
const OVERTIME: Duration = Duration::from_secs(30 * 60);
/// Free IPs are sampled this often (simulated).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A progress line at most this often (real time).
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Before the pattern (boot time, quiet cloud, not measured), a running pod's failed ADD is retried
/// after this long: only the fleet's start, not the kubelet model, is at stake.
const PREPOPULATE_RETRY: Duration = Duration::from_secs(2);
/// The node whose free IPs and pods are kept second by second (a busy one in `mixed`).
pub const TRACKED_NODE: usize = 0;

/// What to run.
#[derive(Clone, Debug)]
pub struct PairSpec {
    pub pattern: Pattern,
    pub policy: Policy,
    pub nodes: usize,
    pub pods_per_node: u32,
    pub seed: u64,
}

impl PairSpec {
    fn tag(&self) -> String {
        format!("{}/{}", self.pattern, self.policy)
    }
}

/// EC2 attempts of one purpose and API, summed over the fleet's daemons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurposeCount {
    pub purpose: &'static str,
    pub api: String,
    pub calls: u64,
    pub throttled: u64,
}

/// What one pair measured. Times are simulated.
#[derive(Clone, Debug)]
pub struct PairResult {
    pub pattern: Pattern,
    pub policy: Policy,
    /// Pods started during the pattern (not the ones running before it).
    pub pods: u64,
    /// From the last wave's start until its last pod had an IP, s (`None`: churn, or a pod never had
    /// one).
    pub all_done_s: Option<f64>,
    /// Each pod's wait, ms, from its ADD's first attempt to its IP (retries included).
    pub waits_ms: Vec<f64>,
    /// The same for the last wave alone (down-up's second scale-up).
    pub last_wave_waits_ms: Vec<f64>,
    /// Pods that had no IP `OVERTIME` after the window (their waits are censored there).
    pub unserved: u64,
    /// ADDs that failed and were retried.
    pub retries: u64,
    /// Of those, the ones whose error names EC2's throttling or the daemon's back-off.
    pub throttle_retries: u64,
    /// Why ADDs failed: (gRPC code and message, digits blanked; count), most frequent first.
    pub retry_reasons: Vec<(String, u64)>,
    /// Releases that failed.
    pub release_errors: u64,
    /// EC2 calls, mutating ones and throttled ones, as mockcloud counted them over the pattern.
    pub calls: u64,
    pub mutating: u64,
    pub throttled: u64,
    /// Fleet-wide free IPs (VPC addresses held by the nodes and serving no pod), one sample per
    /// `SAMPLE_EVERY` from the pattern's start.
    pub free_series: Vec<u64>,
    /// Time-weighted mean of `free_series` over the pattern's window.
    pub free_mean: f64,
    /// `free_series` at the window's end.
    pub free_end: u64,
    /// `TRACKED_NODE`'s free IPs and pods, per sample.
    pub node_series: Vec<(u32, u32)>,
    /// EC2 attempts by purpose and API over the pattern, summed over the daemons.
    pub by_purpose: Vec<PurposeCount>,
    /// EC2 calls by action as mockcloud counted them: (action, calls, throttled).
    pub by_action: Vec<(String, u64, u64)>,
    /// Free IPs any pod may take, per node, at the pattern's start: the fewest, and the median.
    pub start_free: (u32, u32),
    /// Nodes holding fewer than their warm target at the start (should be none).
    pub start_short: usize,
    /// The calls per EC2 API the first wave cannot do without, from each node's state at the start
    /// (see `bound`).
    pub min_calls: BTreeMap<String, u64>,
    /// Boot and settle, simulated seconds.
    pub boot_s: f64,
    /// How long the pattern ran, simulated seconds (the window, or more while pods waited).
    pub ran_s: f64,
    /// Wall-clock seconds for the whole pair.
    pub real_s: f64,
}

/// Runs the pair on its own thread and paused-clock runtime; blocks until it is done.
pub fn run_pair(spec: PairSpec) -> anyhow::Result<PairResult> {
    let name = format!("fleet-{}", spec.tag().replace('/', "-"));
    std::thread::Builder::new()
        .name(name)
        // Futures run on this thread's stack (the SDK's are deep); a worker's 2 MiB is not assumed.
        .stack_size(32 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .context("tokio runtime")?;
            let result = rt.block_on(simulate(spec));
            rt.shutdown_timeout(Duration::from_secs(10));
            result
        })
        .context("spawning a fleet thread")?
        .join()
        .map_err(|_| anyhow!("the fleet thread panicked"))?
}

/// One node: its daemon, its state directory, a gRPC connection shared by its pods.
struct Node {
    handle: DaemonHandle,
    client: IpamClient<Channel>,
}

/// Free IPs: addresses the node holds on its pod ENIs that serve no pod (idle, cooling and reserved
/// ones, ones being given back, quarantined or held back).
fn free(s: &PoolSnapshot) -> u32 {
    s.idle + s.releasing + s.quarantined + s.held_back
}

/// The free IPs the policy keeps ready.
fn warm_target(s: &PoolSnapshot) -> u32 {
    s.warm_target
}

/// Nothing in flight or waiting, and the warm target held.
fn settled(s: &PoolSnapshot) -> bool {
    s.in_flight == 0
        && s.creating_enis == 0
        && s.waiting_for_eni == 0
        && s.releasing == 0
        && s.idle_eligible >= warm_target(s)
}

async fn simulate(spec: PairSpec) -> anyhow::Result<PairResult> {
    let real = std::time::Instant::now();
    let tag = spec.tag();
    let plan = spec.pattern.plan(spec.nodes, spec.pods_per_node, spec.seed);
    let dir = TempDir::new("fleet")?;
    // Boot quiet (fast EC2, no throttling): a fleet-wide boot is not what is measured.
    let mock = MockCloud::start_seeded(
        mockcloud::Config {
            default_instance_type: INSTANCE.into(),
            ..mockcloud::Config::fast()
        },
        spec.seed,
    )
    .await
    .context("cannot start mockcloud")?;
    let booted = Instant::now();
    let nodes = boot(&mock, &spec, &dir.0).await?;
    if !plan.prepopulated.is_empty() {
        prepopulate(&nodes, &plan.prepopulated).await?;
    }
    settle(&nodes, &tag, real).await?;
    let boot_s = booted.elapsed().as_secs_f64();

    let mut start_frees: Vec<u32> = Vec::with_capacity(nodes.len());
    let mut start_short = 0;
    let slots_per_eni = mockcloud::catalog::lookup(INSTANCE)
        .context("instance type not in the catalog")?
        .ipv4_per_eni
        - 1;
    let mut starts = Vec::with_capacity(nodes.len());
    for n in &nodes {
        let s = n.handle.pool.snapshot();
        starts.push(NodeStart::of(&s, slots_per_eni, spec.policy.prefix()));
        start_frees.push(s.idle_eligible);
        if s.idle_eligible < warm_target(&s) {
            start_short += 1;
        }
    }
    let mut first_wave = vec![0u32; nodes.len()];
    for p in plan.pods.iter().filter(|p| p.wave == 0) {
        first_wave[p.node] += 1;
    }
    let min_calls = fleet_min_calls(&first_wave, &starts);
    start_frees.sort_unstable();
    let start_free = (start_frees[0], start_frees[start_frees.len() / 2]);
    eprintln!(
        "fleet {tag}: booted and settled in {boot_s:.0} s simulated ({:.0} s real); free IPs per node at the start: min {}, median {}",
        real.elapsed().as_secs_f64(),
        start_free.0,
        start_free.1
    );

    // The pattern, with realistic latency and the account's throttling buckets (one per API, EC2's
    // published table: mockcloud's default), full.
    let realistic = LatencyProfile::realistic();
    mock.set_imds_lag(realistic.imds_lag);
    mock.set_latency(realistic);
    mock.set_throttling(Throttling::default());
    mock.reset_counters();
    let calls_before: Vec<_> = nodes.iter().map(|n| n.handle.calls.snapshot()).collect();
    let t0 = Instant::now();
    let deadline = t0 + plan.window + OVERTIME;
    let rec = Arc::new(Recorder::new());
    let tasks = Arc::new(Mutex::new(Vec::<AbortHandle>::new()));
    let clients: Vec<IpamClient<Channel>> = nodes.iter().map(|n| n.client.clone()).collect();
    for (i, p) in plan.prepopulated.iter().enumerate() {
        let Life::Until(at) = p.life else { continue };
        let mut c = clients[p.node].clone();
        let rec = rec.clone();
        let name = running_name(p.node, i);
        let h = tokio::spawn(async move {
            tokio::time::sleep_until(t0 + at).await;
            rec.release(&mut c, &name).await;
        });
        tasks.lock().expect("tasks").push(h.abort_handle());
    }
    spawn_drivers(&plan, &clients, t0, deadline, &rec, &tasks, spec.seed);

    // Sample every second until the window is over and every pod has been resolved.
    let expected = plan.pods.len() as u64;
    let mut free_series = Vec::new();
    let mut node_series = Vec::new();
    let mut ticks = tokio::time::interval_at(t0, SAMPLE_EVERY);
    let mut last_progress = std::time::Instant::now();
    loop {
        ticks.tick().await;
        let mut fleet_free = 0u64;
        for (i, n) in nodes.iter().enumerate() {
            let s = n.handle.pool.snapshot();
            fleet_free += u64::from(free(&s));
            if i == TRACKED_NODE {
                node_series.push((free(&s), s.assigned));
            }
        }
        free_series.push(fleet_free);
        let now = Instant::now();
        let resolved = rec.resolved();
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = std::time::Instant::now();
            eprintln!(
                "fleet {tag}: +{:.0} s simulated, {}/{expected} pods served, {} retries, {fleet_free} free IPs ({:.0} s real)",
                (now - t0).as_secs_f64(),
                rec.served.load(Ordering::Relaxed),
                rec.retries.load(Ordering::Relaxed),
                real.elapsed().as_secs_f64()
            );
        }
        if now >= t0 + plan.window && resolved >= expected {
            break;
        }
        if now > deadline + SAMPLE_EVERY {
            bail!("{tag}: {resolved} of {expected} pods resolved after the deadline");
        }
    }
    let ran_s = (Instant::now() - t0).as_secs_f64();
    for h in tasks.lock().expect("tasks").drain(..) {
        h.abort();
    }

    let counters = mock.counters();
    let mutating = counters
        .actions
        .iter()
        .filter(|(a, _)| ActionClass::of(a) == ActionClass::Mutating)
        .map(|(_, c)| c.calls)
        .sum();
    let mut purposes: BTreeMap<(&'static str, String), (u64, u64)> = BTreeMap::new();
    for (n, before) in nodes.iter().zip(&calls_before) {
        let after = n.handle.calls.snapshot();
        for s in &after.by_purpose {
            let e = purposes
                .entry((s.purpose.as_str(), s.api.clone()))
                .or_default();
            e.0 += s.calls;
            e.1 += s.throttled;
        }
        for s in &before.by_purpose {
            let e = purposes
                .entry((s.purpose.as_str(), s.api.clone()))
                .or_default();
            e.0 -= s.calls;
            e.1 -= s.throttled;
        }
    }
    let by_purpose = purposes
        .into_iter()
        .filter(|(_, (c, _))| *c > 0)
        .map(|((purpose, api), (calls, throttled))| PurposeCount {
            purpose,
            api,
            calls,
            throttled,
        })
        .collect();

    // All at once: a daemon waiting out a throttling pause takes its grace period to stop.
    futures::future::join_all(nodes.into_iter().map(|n| n.handle.shutdown())).await;
    drop(mock);

    let window_samples = (plan.window.as_secs_f64() / SAMPLE_EVERY.as_secs_f64()) as usize;
    let in_window = &free_series[..window_samples.min(free_series.len())];
    let free_mean = in_window.iter().sum::<u64>() as f64 / in_window.len().max(1) as f64;
    let free_end = in_window.last().copied().unwrap_or(0);
    let last_wave = plan.last_wave();
    let records = std::mem::take(&mut *rec.records.lock().expect("records"));
    let unserved = records.iter().filter(|r| !r.served).count() as u64;
    let waits_ms: Vec<f64> = records.iter().map(|r| r.wait_ms).collect();
    let last_wave_waits_ms: Vec<f64> = records
        .iter()
        .filter(|r| r.wave == last_wave)
        .map(|r| r.wait_ms)
        .collect();
    let all_done_s = (spec.pattern.has_finish() && unserved == 0).then(|| {
        records
            .iter()
            .filter(|r| r.wave == last_wave)
            .map(|r| r.done_at_s)
            .fold(0.0, f64::max)
            - plan.waves[usize::from(last_wave)].as_secs_f64()
    });
    let result = PairResult {
        pattern: spec.pattern,
        policy: spec.policy,
        pods: expected,
        all_done_s,
        waits_ms,
        last_wave_waits_ms,
        unserved,
        retries: rec.retries.load(Ordering::Relaxed),
        throttle_retries: rec.throttle_retries.load(Ordering::Relaxed),
        retry_reasons: {
            let mut v: Vec<(String, u64)> =
                std::mem::take(&mut *rec.retry_reasons.lock().expect("reasons"))
                    .into_iter()
                    .collect();
            v.sort_by_key(|r| std::cmp::Reverse(r.1));
            v
        },
        release_errors: rec.release_errors.load(Ordering::Relaxed),
        calls: counters.total_calls(),
        mutating,
        throttled: counters.total_throttled(),
        free_series,
        free_mean,
        free_end,
        node_series,
        by_purpose,
        by_action: counters
            .actions
            .iter()
            .map(|(a, c)| (a.clone(), c.calls, c.throttled))
            .collect(),
        start_free,
        start_short,
        min_calls,
        boot_s,
        ran_s,
        real_s: real.elapsed().as_secs_f64(),
    };
    eprintln!(
        "fleet {tag}: done: {} pods, all served in {}, wait p50 {} p99 {}, {} EC2 calls ({} mutating, {} throttled), {} retries ({} for throttling or back-off), mean free IPs {:.0} ({:.0} s real)",
        result.pods,
        result
            .all_done_s
            .map_or("—".into(), |s| format!("{s:.1} s")),
        wait_s(&result.waits_ms, 50.0),
        wait_s(&result.waits_ms, 99.0),
        result.calls,
        result.mutating,
        result.throttled,
        result.retries,
        result.throttle_retries,
        result.free_mean,
        result.real_s
    );
    Ok(result)
}

/// One VPC with one `/16` subnet per `NODES_PER_SUBNET` nodes, the nodes launched into them, and a
/// daemon started on each (in waves), with the policy's knobs.
async fn boot(mock: &MockCloud, spec: &PairSpec, root: &Path) -> anyhow::Result<Vec<Node>> {
    let world = mock.default_world().context("no default world")?;
    let limits =
        mockcloud::catalog::lookup(INSTANCE).context("instance type not in the catalog")?;
    let pod_ips_per_eni = limits.ipv4_per_eni - 1;
    let mut subnets = Vec::new();
    let mut vpcs = Vec::new();
    for k in 0..spec.nodes.div_ceil(NODES_PER_SUBNET) {
        let cidr: Ipv4Net = format!("10.{}.0.0/16", 64 + k)
            .parse()
            .context("subnet CIDR")?;
        let (vpc, _sg) = mock
            .create_vpc(cidr)
            .map_err(|e| anyhow!("creating the fleet's VPC {cidr}: {e}"))?;
        subnets.push(
            mock.create_subnet(&vpc, cidr, &world.instance.availability_zone)
                .map_err(|e| anyhow!("creating the fleet's subnet {cidr}: {e}"))?,
        );
        vpcs.push(vpc);
    }
    let policy = fleet_policy(&vpcs);
    let mut launched = Vec::with_capacity(spec.nodes);
    for i in 0..spec.nodes {
        launched.push(
            mock.launch_instance(INSTANCE, &subnets[i / NODES_PER_SUBNET])
                .await
                .map_err(|e| anyhow!("launching node {i}: {e}"))?,
        );
    }
    let mut nodes = Vec::with_capacity(spec.nodes);
    for (wave, chunk) in launched.chunks(BOOT_WAVE).enumerate() {
        let mut starting = Vec::new();
        for (i, inst) in chunk.iter().enumerate() {
            let dir = root.join(format!("n{}", wave * BOOT_WAVE + i));
            std::fs::create_dir_all(&dir)?;
            let base = DaemonConfig {
                imds_endpoint: Some(inst.imds_url.clone()),
                reconcile_period_secs: DaemonConfig::default().reconcile_period_secs,
                log_level: "error".into(),
                ..support::daemon_config(mock, &dir)
            };
            // `daemon_config` enforces the shipped policy for the default VPC; the nodes live in
            // the fleet's. Set back at once (no await in between: no daemon calls in the gap).
            mock.set_iam_policy(Some(policy.clone()));
            let config = spec.policy.apply(base, pod_ips_per_eni);
            starting.push(tokio::spawn(async move {
                let handle = support::start_daemon(config).await?;
                let client = support::client(&handle.socket_path).await?;
                anyhow::Ok(Node { handle, client })
            }));
        }
        for t in starting {
            nodes.push(t.await??);
        }
    }
    Ok(nodes)
}

/// The shipped IAM policy for the fleet's VPCs (one per `NODES_PER_SUBNET` nodes): the policy
/// rendered for each, its statements together.
fn fleet_policy(vpcs: &[String]) -> mockcloud::iam::Policy {
    let mut vpcs = vpcs.iter();
    let first = vpcs.next().map_or("", String::as_str);
    let mut policy = mockcloud::iam::shipped_policy(support::CLUSTER, first);
    for vpc in vpcs {
        policy
            .statements
            .extend(mockcloud::iam::shipped_policy(support::CLUSTER, vpc).statements);
    }
    policy
}

/// The pods running before the pattern starts, allocated on the quiet boot-time cloud.
async fn prepopulate(nodes: &[Node], pods: &[PodPlan]) -> anyhow::Result<()> {
    let mut tasks = Vec::with_capacity(pods.len());
    for (i, p) in pods.iter().enumerate() {
        let mut c = nodes[p.node].client.clone();
        let name = running_name(p.node, i);
        tasks.push(tokio::spawn(async move {
            let mut attempts = 0;
            while let Err(s) = c.allocate(support::alloc_req(&name)).await {
                attempts += 1;
                if attempts > 30 {
                    bail!("pod {name} had no IP after {attempts} attempts: {s}");
                }
                tokio::time::sleep(PREPOPULATE_RETRY).await;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Waits until every node has held `settled` for `SETTLE_HOLD`.
async fn settle(nodes: &[Node], tag: &str, real: std::time::Instant) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut steady_since: Option<Instant> = None;
    let mut last_progress = std::time::Instant::now();
    loop {
        let unsettled: Vec<PoolSnapshot> = nodes
            .iter()
            .map(|n| n.handle.pool.snapshot())
            .filter(|s| !settled(s))
            .collect();
        let now = Instant::now();
        if unsettled.is_empty() {
            if now - *steady_since.get_or_insert(now) >= SETTLE_HOLD {
                return Ok(());
            }
        } else {
            steady_since = None;
        }
        if now - started > SETTLE_LIMIT {
            let s = &unsettled[0];
            bail!(
                "{tag}: {} nodes did not settle within {SETTLE_LIMIT:?} (one: idle {} of which eligible {}, warm target {}, in flight {}, creating ENIs {}, waiting for an ENI {}, releasing {})",
                unsettled.len(),
                s.idle,
                s.idle_eligible,
                warm_target(s),
                s.in_flight,
                s.creating_enis,
                s.waiting_for_eni,
                s.releasing
            );
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = std::time::Instant::now();
            eprintln!(
                "fleet {tag}: settling, +{:.0} s simulated, {} of {} nodes not settled ({:.0} s real)",
                (now - started).as_secs_f64(),
                unsettled.len(),
                nodes.len(),
                real.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// A percentile of the pods' waits, in seconds, for the progress line.
fn wait_s(waits_ms: &[f64], p: f64) -> String {
    crate::stats::percentile(waits_ms, p).map_or("—".into(), |ms| format!("{:.2} s", ms / 1000.0))
}
