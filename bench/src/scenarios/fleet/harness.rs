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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use eniipam::pool::snapshot::PoolSnapshot;
use mockcloud::{ActionClass, LatencyProfile, MockCloud, Throttling};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::boot::{self, Launched, Node, warm_target};
use super::bound::{Calls, NodeStart, fleet_min_calls, node_alternatives};
use super::floor::{Floor, PathLatency, model_floor};
use super::pods::{Drive, NodeIo, Recorder, running_name, spawn_drivers, spawn_node_driver};
use super::policy::Policy;
use super::spec::{INSTANCE, PairSpec};
use super::tail::{NodeTail, Purposes, TAIL_NODES, add_calls, outcomes, over_pattern, slowest};
use super::traffic::{KUBELET_READY, Life, Pattern, Plan, TAINT_TO_BIND};
use crate::support::TempDir;

/// A pod still without an IP this long after the pattern's window is given up (counted unserved,
/// its wait censored there).
const OVERTIME: Duration = Duration::from_secs(30 * 60);
/// Free IPs are sampled this often (simulated).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A progress line at most this often (real time).
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// The node whose free IPs and pods are kept second by second (a busy one in `mixed`).
pub const TRACKED_NODE: usize = 0;

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
    /// Which of `--runs` (0-based), and its seed.
    pub run: usize,
    pub seed: u64,
    /// Pods started during the pattern (not the ones running before it).
    pub pods: u64,
    /// From the last wave's start until its last pod had an IP, s (`None`: churn, or a pod never had
    /// one).
    pub all_done_s: Option<f64>,
    /// Each pod's wait, ms, from its ADD's first attempt to its IP (retries included); node-boot
    /// with the startup taint modelled: from its node's launch.
    pub waits_ms: Vec<f64>,
    /// Each pod's wait from its ADD's first attempt, whatever the pattern counts from.
    pub add_waits_ms: Vec<f64>,
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
    /// Free IPs any pod may take, per node, at the pattern's start (node-boot: at the node's
    /// Ready): the fewest, and the median.
    pub start_free: (u32, u32),
    /// Nodes holding fewer than their warm target then (should be none but in node-boot).
    pub start_short: usize,
    /// The calls per EC2 API the first wave cannot do without, from each node's state at the start
    /// (see `bound`).
    pub min_calls: BTreeMap<String, u64>,
    /// Each node's ways to serve its first wave, whatever the policy's call structure (see
    /// `bound::least_bound`).
    pub alternatives: Vec<Vec<Calls>>,
    /// The modelled p99 floor of the first wave from these nodes' start (`floor`).
    pub floor: Floor,
    /// Node-boot: each node's time from its launch until its pods were bound (Ready, and with the
    /// startup taint the taint lifted), s.
    pub schedulable_s: Vec<f64>,
    /// Boot and settle, simulated seconds (node-boot: from the pattern's start until the last node
    /// took pods).
    pub boot_s: f64,
    /// How long the pattern ran, simulated seconds (the window, or more while pods waited).
    pub ran_s: f64,
    /// Wall-clock seconds for the whole pair.
    pub real_s: f64,
    /// The nodes whose pods waited longest, with their growth calls ([`super::tail`]).
    pub tail: Vec<NodeTail>,
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

/// Free IPs: addresses the node holds on its pod ENIs that serve no pod (idle, cooling and reserved
/// ones, ones being given back, quarantined or held back).
fn free(s: &PoolSnapshot) -> u32 {
    s.idle + s.releasing + s.quarantined + s.held_back
}

/// One node's place in the fleet: its daemon once started, and how it stood when the pattern (or,
/// in node-boot, its Ready) came.
#[derive(Default)]
struct Slot {
    node: Option<Node>,
    /// What its growth needs from the start (`bound`).
    start: Option<NodeStart>,
    /// Idle IPs any pod may take, and whether it held fewer than its warm target, then.
    free: Option<(u32, bool)>,
    /// Its EC2 attempts before the pattern (none when it boots within it).
    calls_before: Purposes,
    /// Node-boot: when it took pods, from the pattern's start, s, and from its launch.
    ready_s: Option<f64>,
    schedulable_s: Option<f64>,
}

/// The fleet's nodes as they come up: all before the pattern, or each at its launch in node-boot.
struct Fleet {
    slots: Mutex<Vec<Slot>>,
    /// The first node that failed to boot within the pattern.
    failed: Mutex<Option<String>>,
}

impl Fleet {
    fn new(nodes: usize) -> Self {
        Self {
            slots: Mutex::new((0..nodes).map(|_| Slot::default()).collect()),
            failed: Mutex::new(None),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<Slot>) -> R) -> R {
        f(&mut self.slots.lock().expect("fleet"))
    }
}

/// Each node's free IPs at the start (or its Ready): the fewest and the median; and how many nodes
/// were below their warm target.
fn at_start(frees: &[(u32, bool)]) -> ((u32, u32), usize) {
    let mut free: Vec<u32> = frees.iter().map(|f| f.0).collect();
    free.sort_unstable();
    let short = frees.iter().filter(|f| f.1).count();
    (
        (
            free.first().copied().unwrap_or(0),
            free.get(free.len() / 2).copied().unwrap_or(0),
        ),
        short,
    )
}

/// How node `s` stands: its free IPs any pod may take, and whether below its warm target.
fn standing(s: &PoolSnapshot) -> (u32, bool) {
    (s.idle_eligible, s.idle_eligible < warm_target(s))
}

fn purposes(n: &Node) -> Purposes {
    n.handle
        .calls
        .snapshot()
        .by_purpose
        .iter()
        .map(|s| ((s.purpose.as_str(), s.api.clone()), (s.calls, s.throttled)))
        .collect()
}

/// The pattern's cloud: the realistic latency profile and the account's throttling buckets (one per
/// API, EC2's published table: mockcloud's default), full, counters reset; and in account-contention
/// the other tenant spending them from now on (its task's handle added to `tasks`).
fn go_realistic(mock: &MockCloud, pattern: Pattern, tasks: &Mutex<Vec<AbortHandle>>) {
    let realistic = LatencyProfile::realistic();
    mock.set_imds_lag(realistic.imds_lag);
    mock.set_latency(realistic);
    mock.set_throttling(Throttling::default());
    mock.reset_counters();
    if pattern.has_tenant() {
        let h = tokio::spawn(super::tenant::spend(mock.clone()));
        tasks.lock().expect("tasks").push(h.abort_handle());
    }
}

/// Node-boot: node `i`'s eniipamd starts at its launch instant on the pattern's cloud; it is
/// counted from empty; `KUBELET_READY` after its gRPC server answers its pods start, or with the
/// startup taint on eniipam's nodes, `TAINT_TO_BIND` after the daemon would lift the taint if that is
/// later (the VPC CNI has no such taint: its nodes take pods at Ready). With the taint modelled,
/// every policy's pod waits run from the node's launch.
fn spawn_node_boot(
    i: usize,
    launched: &Arc<Launched>,
    fleet: &Arc<Fleet>,
    plan: &Plan,
    drive: &Drive,
    spec: &PairSpec,
    slots_per_eni: u32,
) {
    let (launched, fleet, d) = (launched.clone(), fleet.clone(), drive.clone());
    let launch = plan.launches[i];
    let pods: Vec<_> = plan.pods.iter().filter(|p| p.node == i).copied().collect();
    let (prefix, lookahead) = (spec.policy.takes_prefixes(), spec.lookahead);
    let gated = spec.startup_taint && !spec.policy.is_vpc_cni();
    let from_launch = spec.startup_taint;
    let h = tokio::spawn(async move {
        let launched_at = d.t0 + launch;
        tokio::time::sleep_until(launched_at).await;
        let started = async {
            let config = launched.config(i)?;
            let check = Duration::from_secs(config.node_check_secs);
            anyhow::Ok((boot::start(config).await?, check))
        };
        let (node, check) = match started.await {
            Ok(n) => n,
            Err(e) => {
                let mut failed = fleet.failed.lock().expect("failed");
                failed.get_or_insert_with(|| format!("node {i} did not boot: {e:#}"));
                return;
            }
        };
        let io = NodeIo {
            client: node.client.clone(),
            lookahead: lookahead.then(|| node.handle.pool.clone()),
        };
        let empty = NodeStart::empty(&node.handle.pool.snapshot(), slots_per_eni, prefix);
        let pool = node.handle.pool.clone();
        fleet.with(|s| {
            s[i].start = Some(empty);
            s[i].node = Some(node);
        });
        let mut ready = Instant::now() + KUBELET_READY;
        if gated {
            // The keeper starts with the pool (`Daemon::start_with` spawns it before it returns)
            // and takes its first look at once: `interval`'s first tick.
            let keeper_started = Instant::now();
            ready =
                ready.max(boot::taint_lifted(&pool, keeper_started, check).await + TAINT_TO_BIND);
        }
        tokio::time::sleep_until(ready).await;
        fleet.with(|s| {
            s[i].free = Some(standing(&pool.snapshot()));
            s[i].ready_s = Some((ready - d.t0).as_secs_f64());
            s[i].schedulable_s = Some((ready - launched_at).as_secs_f64());
        });
        let since = from_launch.then_some(launched_at);
        spawn_node_driver(i, pods, io, (ready, since), &d);
    });
    drive.tasks.lock().expect("tasks").push(h.abort_handle());
}

async fn simulate(spec: PairSpec) -> anyhow::Result<PairResult> {
    let real = std::time::Instant::now();
    let tag = spec.tag();
    let plan = spec.pattern.plan(spec.nodes, spec.pods_per_node, spec.seed);
    let dir = TempDir::new("fleet")?;
    // Boot quiet (fast EC2, no throttling): a fleet-wide boot is not what is measured, but in
    // node-boot, where it is the pattern.
    let mock = MockCloud::start_seeded(
        mockcloud::Config {
            default_instance_type: INSTANCE.into(),
            ..mockcloud::Config::fast()
        },
        spec.seed,
    )
    .await
    .context("cannot start mockcloud")?;
    let slots_per_eni = mockcloud::catalog::lookup(INSTANCE)
        .context("instance type not in the catalog")?
        .ipv4_per_eni
        - 1;
    let launched = Arc::new(boot::launch(&mock, &spec, &dir.0).await?);
    let fleet = Arc::new(Fleet::new(spec.nodes));
    let tasks = Arc::new(Mutex::new(Vec::<AbortHandle>::new()));
    let rec = Arc::new(Recorder::new());
    let booted = Instant::now();
    let settled_s = if spec.pattern.boots_in_pattern() {
        None
    } else {
        let nodes = launched.boot_all().await?;
        if !plan.prepopulated.is_empty() {
            boot::prepopulate(&nodes, &plan.prepopulated).await?;
        }
        boot::settle(&nodes, &tag, real).await?;
        fleet.with(|slots| {
            for (slot, n) in slots.iter_mut().zip(nodes) {
                let s = n.handle.pool.snapshot();
                let prefixes = spec.policy.takes_prefixes();
                slot.start = Some(NodeStart::of(&s, slots_per_eni, prefixes));
                slot.free = Some(standing(&s));
                slot.calls_before = purposes(&n);
                slot.node = Some(n);
            }
        });
        Some(booted.elapsed().as_secs_f64())
    };
    if let Some(s) = settled_s {
        let ((min, median), _) = at_start(&fleet.with(|s| {
            s.iter()
                .map(|s| s.free.unwrap_or((0, true)))
                .collect::<Vec<_>>()
        }));
        eprintln!(
            "fleet {tag}: booted and settled in {s:.0} s simulated ({:.0} s real); free IPs per node at the start: min {min}, median {median}",
            real.elapsed().as_secs_f64(),
        );
    }

    go_realistic(&mock, spec.pattern, &tasks);
    let t0 = Instant::now();
    let drive = Drive {
        t0,
        deadline: t0 + plan.window + OVERTIME,
        rec: rec.clone(),
        tasks: tasks.clone(),
        seed: spec.seed,
    };
    if spec.pattern.boots_in_pattern() {
        for i in 0..spec.nodes {
            spawn_node_boot(i, &launched, &fleet, &plan, &drive, &spec, slots_per_eni);
        }
    } else {
        let nodes: Vec<NodeIo> = fleet.with(|s| {
            s.iter()
                .filter_map(|s| s.node.as_ref())
                .map(|n| NodeIo {
                    client: n.client.clone(),
                    lookahead: spec.lookahead.then(|| n.handle.pool.clone()),
                })
                .collect()
        });
        for (i, p) in plan.prepopulated.iter().enumerate() {
            let Life::Until(at) = p.life else { continue };
            let mut c = nodes[p.node].client.clone();
            let rec = rec.clone();
            let name = running_name(p.node, i);
            let h = tokio::spawn(async move {
                tokio::time::sleep_until(t0 + at).await;
                rec.release(&mut c, &name).await;
            });
            tasks.lock().expect("tasks").push(h.abort_handle());
        }
        spawn_drivers(&plan, &nodes, &drive);
    }

    // Sample every second until the window is over and every pod has been resolved.
    let expected = plan.pods.len() as u64;
    let mut free_series = Vec::new();
    let mut node_series = Vec::new();
    let mut ticks = tokio::time::interval_at(t0, SAMPLE_EVERY);
    let mut last_progress = std::time::Instant::now();
    loop {
        ticks.tick().await;
        if let Some(e) = fleet.failed.lock().expect("failed").take() {
            bail!("{tag}: {e}");
        }
        let mut fleet_free = 0u64;
        fleet.with(|slots| {
            for (i, slot) in slots.iter().enumerate() {
                // A node not booted yet holds nothing.
                let Some(n) = &slot.node else { continue };
                let s = n.handle.pool.snapshot();
                fleet_free += u64::from(free(&s));
                if i == TRACKED_NODE {
                    node_series.push((free(&s), s.assigned));
                }
            }
            if slots[TRACKED_NODE].node.is_none() {
                node_series.push((0, 0));
            }
        });
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
        if now > drive.deadline + SAMPLE_EVERY {
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
    let slots = std::mem::take(&mut *fleet.slots.lock().expect("fleet"));
    let mut by_purpose: Purposes = BTreeMap::new();
    let mut starts = Vec::with_capacity(slots.len());
    let mut frees = Vec::with_capacity(slots.len());
    let mut nodes = Vec::with_capacity(slots.len());
    let mut boot_s = settled_s.unwrap_or(0.0);
    let mut schedulable_s = Vec::new();
    let mut node_calls = Vec::with_capacity(slots.len());
    for (i, slot) in slots.into_iter().enumerate() {
        let n = slot
            .node
            .ok_or_else(|| anyhow!("{tag}: node {i} never booted"))?;
        let own = over_pattern(purposes(&n), &slot.calls_before);
        add_calls(&mut by_purpose, &own);
        node_calls.push(own);
        starts.push(slot.start.context("a node with no start")?);
        frees.push(slot.free.unwrap_or((0, true)));
        boot_s = boot_s.max(slot.ready_s.unwrap_or(0.0));
        schedulable_s.extend(slot.schedulable_s);
        nodes.push(n);
    }
    let by_purpose = by_purpose
        .into_iter()
        .filter(|(_, (c, _))| *c > 0)
        .map(|((purpose, api), (calls, throttled))| PurposeCount {
            purpose,
            api,
            calls,
            throttled,
        })
        .collect();
    let mut first_wave = vec![0u32; starts.len()];
    for p in plan.pods.iter().filter(|p| p.wave == 0) {
        first_wave[p.node] += 1;
    }
    let min_calls = fleet_min_calls(&first_wave, &starts);
    let alternatives: Vec<Vec<Calls>> = first_wave
        .iter()
        .zip(&starts)
        .map(|(p, n)| node_alternatives(*p, n))
        .collect();
    let floor = model_floor(
        &super::floor::nodes_of(&spec, &plan, &starts, &alternatives),
        &super::tenant::buckets_left(spec.pattern),
        &PathLatency::of(&LatencyProfile::realistic()),
    );
    let (start_free, start_short) = at_start(&frees);
    // All at once: a daemon waiting out a throttling pause takes its grace period to stop.
    futures::future::join_all(nodes.into_iter().map(|n| n.handle.shutdown())).await;
    drop(mock);

    let window_samples = (plan.window.as_secs_f64() / SAMPLE_EVERY.as_secs_f64()) as usize;
    let in_window = &free_series[..window_samples.min(free_series.len())];
    let free_mean = in_window.iter().sum::<u64>() as f64 / in_window.len().max(1) as f64;
    let free_end = in_window.last().copied().unwrap_or(0);
    let last_wave = plan.last_wave();
    let records = std::mem::take(&mut *rec.records.lock().expect("records"));
    let tail = slowest(&outcomes(node_calls, &records), TAIL_NODES);
    let unserved = records.iter().filter(|r| !r.served).count() as u64;
    let waits_ms: Vec<f64> = records.iter().map(|r| r.wait_ms).collect();
    let add_waits_ms: Vec<f64> = records.iter().map(|r| r.add_wait_ms).collect();
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
        tail,
        pattern: spec.pattern,
        policy: spec.policy,
        run: spec.run,
        seed: spec.seed,
        pods: expected,
        all_done_s,
        waits_ms,
        add_waits_ms,
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
        alternatives,
        floor,
        schedulable_s,
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

/// A percentile of the pods' waits, in seconds, for the progress line.
fn wait_s(waits_ms: &[f64], p: f64) -> String {
    crate::stats::percentile(waits_ms, p).map_or("—".into(), |ms| format!("{:.2} s", ms / 1000.0))
}
