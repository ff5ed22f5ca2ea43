//! The fault soak (issue 13): the real `eniipamd` binary against an in-process mockcloud, driven by a
//! fake container runtime that runs the real `eniipam` plugin (IPAM role) for ADD/DEL/GC churn on two
//! networks, while a seeded schedule injects faults — SIGKILLs, EC2 errors, hangs, throttling, IMDS lag,
//! out-of-band unassigns and detaches, a lost state file, a full disk, hidden network namespaces,
//! pods dying without a DEL — and an invariant checker ([`checker`]) compares the daemon, the store,
//! EC2 and the host after every step.
//!
//! A run is a sequence of steps. Each step: undo the faults whose time is up, apply the step's
//! planned faults ([`faults::planned`]), maybe GC one network (never concurrently with ADD/DEL: the
//! spec makes the runtime serialise them), run one batch of pod operations concurrently (pods ending by
//! DEL or by dying, late DELs, new pods ADDing to one or both networks), SIGKILL the daemon in the
//! middle of the batch if planned, restart it, then check. Everything random is drawn from an RNG of
//! (seed, step), so a violation is named by its seed and step; the daemon's own timing still varies.
//!
//! Used by the benchmark program (`eniipam-bench soak`) and, through a `#[path]` include, by the short
//! CI test `tests/soak.rs`; so it names only crates both have.

pub mod checker;
pub mod daemon;
pub mod faults;
pub mod host;
pub mod model;
pub mod runtime;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use mockcloud::{Fault, LatencyProfile, MockCloud, Throttling};
use rand::Rng as _;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use tokio::task::JoinSet;
use tokio::time::Instant;

use checker::{CheckerState, Found, Rules, Witnesses};
use daemon::{DaemonKnobs, DaemonProc, StartError};
use faults::{FaultKind, step_rng};
use host::{Host, RACKS};
use model::{AttState, Attachment, Key, Model, OobEvent, OobMark, Pod, PodPhase};
use runtime::{PodArgs, Runtime};

/// How long a run lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Steps(u64),
    Time(Duration),
}

/// Everything a soak is told.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub seed: u64,
    pub budget: Budget,
    pub daemon_bin: PathBuf,
    pub plugin_bin: PathBuf,
    /// 1 or 2 networks (conflists).
    pub networks: usize,
    pub faults: BTreeSet<FaultKind>,
    pub instance_type: String,
    pub knobs: DaemonKnobs,
    /// Keep the daemon's log here (else it goes with the temporary directory).
    pub log_file: Option<PathBuf>,
    /// Print progress and each violation on stderr as found.
    pub progress: bool,
}

impl SoakConfig {
    pub fn new(seed: u64, budget: Budget, daemon_bin: PathBuf, plugin_bin: PathBuf) -> Self {
        Self {
            seed,
            budget,
            daemon_bin,
            plugin_bin,
            networks: 2,
            faults: FaultKind::ALL.into_iter().collect(),
            instance_type: "c5.xlarge".into(),
            knobs: DaemonKnobs::default(),
            log_file: None,
            progress: false,
        }
    }
}

/// What happened, by the numbers.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub steps: u64,
    pub adds_ok: u64,
    pub adds_failed: u64,
    pub dels_ok: u64,
    pub dels_failed: u64,
    pub gcs_ok: u64,
    pub gcs_failed: u64,
    pub kills: u64,
    pub restarts: u64,
    /// Startups that failed while the disk was full (expected).
    pub starts_failed_disk_full: u64,
    pub checks: u64,
    pub checks_skipped: u64,
    pub pods: u64,
    pub peak_live_pods: usize,
    pub distinct_ips: usize,
    pub faults: BTreeMap<&'static str, u64>,
    /// ADD failures by the plugin's error code.
    pub add_errors: BTreeMap<String, u64>,
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub subject: String,
    pub seed: u64,
    pub step: u64,
    pub text: String,
    /// The faults of the steps before.
    pub context: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[seed {} step {}] {}: {}",
            self.seed, self.step, self.kind, self.text
        )?;
        if !self.context.is_empty() {
            write!(f, " (before: {})", self.context)?;
        }
        Ok(())
    }
}

/// A run's result.
#[derive(Clone, Debug)]
pub struct SoakOutcome {
    pub seed: u64,
    pub wall: Duration,
    pub capacity: u32,
    pub counts: Counts,
    /// Distinct violations (kind, subject), in the order found.
    pub violations: Vec<Violation>,
    /// Things worth knowing that are not violations (failed GCs, skipped checks).
    pub notes: Vec<String>,
}

impl SoakOutcome {
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.kind).or_insert(0) += 1;
        }
        m
    }

    /// A plain-text summary: counts, then up to `per_kind` violations of each kind.
    pub fn summary(&self, per_kind: usize) -> String {
        let c = &self.counts;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "soak seed {}: {} steps in {:.0} s, capacity {}; ADD {} ok / {} failed, DEL {} ok / {} failed, \
             GC {} ok / {} failed; {} SIGKILLs, {} restarts; {} pods, peak {} live, {} distinct IPs; \
             {} checks ({} skipped)",
            self.seed,
            c.steps,
            self.wall.as_secs_f64(),
            self.capacity,
            c.adds_ok,
            c.adds_failed,
            c.dels_ok,
            c.dels_failed,
            c.gcs_ok,
            c.gcs_failed,
            c.kills,
            c.restarts,
            c.pods,
            c.peak_live_pods,
            c.distinct_ips,
            c.checks,
            c.checks_skipped
        );
        let faults: Vec<String> = c.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "faults: {}", faults.join(", "));
        let kinds = self.by_kind();
        if kinds.is_empty() {
            let _ = writeln!(s, "violations: none");
        } else {
            let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                s,
                "violations: {} ({})",
                self.violations.len(),
                list.join(", ")
            );
            for k in kinds.keys() {
                for v in self
                    .violations
                    .iter()
                    .filter(|v| v.kind == *k)
                    .take(per_kind)
                {
                    let _ = writeln!(s, "  {v}");
                }
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

/// mockcloud as the soak runs it: EC2's shape of latency at a fifth of the realistic figures (the
/// attach and IMDS delays included), EC2's default account throttling.
pub fn mock_latency() -> LatencyProfile {
    let mut p = LatencyProfile::realistic();
    for v in p.per_action.values_mut() {
        *v /= 5;
    }
    p.default /= 5;
    p.attach_delay = Duration::from_millis(400);
    p.detach_delay = Duration::from_millis(400);
    p.imds_lag = BASE_IMDS_LAG;
    p
}

const BASE_IMDS_LAG: Duration = Duration::from_millis(200);
const NETWORKS: [&str; 2] = ["soak-a", "soak-b"];
const IFNAMES: [&str; 2] = ["eth0", "net1"];
/// Chance a step starts with a GC of one network.
const GC_CHANCE: f64 = 0.12;
/// How long the daemon may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// EC2 actions the error, hang and slow-reply faults pick from.
const ACTIONS: [&str; 9] = [
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "DescribeNetworkInterfaces",
    "ModifyNetworkInterfaceAttribute",
    "CreateTags",
];
const ERROR_CODES: [&str; 3] = ["InternalError", "RequestLimitExceeded", "Unavailable"];

enum Undo {
    ClearEc2Faults,
    Throttling,
    ImdsLag,
    Disk,
    Unhide(usize),
}

struct PendingUndo {
    due_step: u64,
    not_before: Instant,
    undo: Undo,
}

/// A job of one step's batch, run concurrently with the others.
enum Job {
    /// ADD to each network in order; on a failure DEL what was added (the sandbox fails).
    Start {
        pod: usize,
        args: PodArgs,
        plan: Vec<(Key, usize)>,
    },
    /// DEL these attachments (reverse order), then the pod's netns goes when `end_pod`.
    Del {
        pod: usize,
        args: PodArgs,
        keys: Vec<(Key, usize)>,
        end_pod: bool,
    },
}

/// An ADD's outcome: the IP and when it came, or the plugin's error.
type AddOutcome = Result<(Ipv4Addr, Instant), String>;

enum JobResult {
    Started {
        pod: usize,
        adds: Vec<(Key, AddOutcome)>,
        dels: Vec<(Key, Result<(), String>)>,
    },
    Deleted {
        pod: usize,
        dels: Vec<(Key, Result<(), String>)>,
        end_pod: bool,
    },
}

async fn run_job(rt: Runtime, job: Job) -> JobResult {
    match job {
        Job::Start { pod, args, plan } => {
            let mut adds = Vec::new();
            let mut dels = Vec::new();
            for (i, (key, net)) in plan.iter().enumerate() {
                match rt.add(NETWORKS[*net], &key.1, &args).await {
                    Ok(ip) => adds.push((key.clone(), Ok((ip, Instant::now())))),
                    Err(e) => {
                        adds.push((key.clone(), Err(e.error_text())));
                        // The spec: a DEL follows a failed ADD; the sandbox goes, so the others too.
                        for (k, n) in plan[..=i].iter().rev() {
                            let r = rt.del(NETWORKS[*n], &k.1, &args).await;
                            dels.push((k.clone(), r.map_err(|e| e.error_text())));
                        }
                        break;
                    }
                }
            }
            JobResult::Started { pod, adds, dels }
        }
        Job::Del {
            pod,
            args,
            keys,
            end_pod,
        } => {
            let mut dels = Vec::new();
            for (k, n) in keys.iter().rev() {
                let r = rt.del(NETWORKS[*n], &k.1, &args).await;
                dels.push((k.clone(), r.map_err(|e| e.error_text())));
            }
            JobResult::Deleted { pod, dels, end_pod }
        }
    }
}

struct Soak {
    cfg: SoakConfig,
    host: Host,
    mock: MockCloud,
    instance_id: String,
    daemon: DaemonProc,
    runtime: Runtime,
    network_names: Vec<String>,
    model: Model,
    counts: Counts,
    violations: Vec<Violation>,
    reported: BTreeSet<(&'static str, String)>,
    undos: Vec<PendingUndo>,
    checker: CheckerState,
    recent: VecDeque<(u64, String)>,
    notes: Vec<String>,
    capacity: u32,
    target_pods: usize,
    ips_seen: BTreeSet<Ipv4Addr>,
    last_oob: Option<Instant>,
    grace: Duration,
}

/// Runs one soak. Errors are the harness's (cannot mount, cannot start); broken invariants are in the
/// outcome.
pub async fn run(cfg: SoakConfig) -> anyhow::Result<SoakOutcome> {
    anyhow::ensure!(
        (1..=2).contains(&cfg.networks),
        "networks must be 1 or 2, not {}",
        cfg.networks
    );
    for b in [&cfg.daemon_bin, &cfg.plugin_bin] {
        anyhow::ensure!(b.is_file(), "{} is not built", b.display());
    }
    let started = Instant::now();
    let host = Host::new(&format!("s{}", cfg.seed))?;
    let mock = MockCloud::start_seeded(
        mockcloud::Config {
            latency: mock_latency(),
            throttling: Throttling::default(),
            default_instance_type: cfg.instance_type.clone(),
            ..mockcloud::Config::fast()
        },
        cfg.seed,
    )
    .await
    .context("starting mockcloud")?;
    let instance_id = mock.default_instance().instance_id;
    let log = cfg
        .log_file
        .clone()
        .unwrap_or_else(|| host.root.join("eniipamd.log"));
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&log);
    let daemon = DaemonProc::new(
        &cfg.daemon_bin,
        &mock,
        &host.state_dir,
        &host.cache_dir,
        &host.root,
        &log,
        &cfg.knobs,
    );
    let runtime = Runtime {
        plugin: cfg.plugin_bin.clone(),
        socket: daemon.socket.clone(),
        cache_dir: host.cache_dir.clone(),
        cni_path: host.cni_path.clone(),
    };
    // The reconcile runs every period ±20 %: two of them, and a second, to notice an out-of-band change.
    let grace = Duration::from_secs_f64(cfg.knobs.reconcile_period_secs as f64 * 1.2 * 2.0 + 2.0);
    let mut soak = Soak {
        network_names: NETWORKS[..cfg.networks]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        cfg,
        host,
        mock,
        instance_id,
        daemon,
        runtime,
        model: Model::default(),
        counts: Counts::default(),
        violations: Vec::new(),
        reported: BTreeSet::new(),
        undos: Vec::new(),
        checker: CheckerState::default(),
        recent: VecDeque::new(),
        notes: Vec::new(),
        capacity: 0,
        target_pods: 0,
        ips_seen: BTreeSet::new(),
        last_oob: None,
        grace,
    };
    let result = soak.drive(started).await;
    soak.daemon.kill().await;
    result?;
    Ok(SoakOutcome {
        seed: soak.cfg.seed,
        wall: started.elapsed(),
        capacity: soak.capacity,
        counts: soak.counts.clone(),
        violations: soak.violations.clone(),
        notes: soak.notes.clone(),
    })
}

impl Soak {
    async fn drive(&mut self, started: Instant) -> anyhow::Result<()> {
        self.daemon.spawn()?;
        match self.daemon.wait_ready(READY_DEADLINE).await {
            Ok(()) => {}
            Err(e) => anyhow::bail!(
                "eniipamd did not start: {e:?}; log: {}",
                self.daemon.log_tail(10)
            ),
        }
        let pool = self.pool().await.context("the first Pool call")?;
        self.capacity = pool.capacity;
        let per_pod = if self.cfg.networks == 2 { 1.2 } else { 1.0 };
        self.target_pods = ((pool.capacity as f64 * 0.55) / per_pod).max(4.0) as usize;
        if self.cfg.progress {
            eprintln!(
                "soak: seed {}, {} ({} pod IPs), {} network(s), target {} live pods, faults: {}",
                self.cfg.seed,
                self.cfg.instance_type,
                pool.capacity,
                self.cfg.networks,
                self.target_pods,
                self.cfg
                    .faults
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        let mut step = 0u64;
        loop {
            let done = match self.cfg.budget {
                Budget::Steps(n) => step >= n,
                Budget::Time(d) => started.elapsed() >= d,
            };
            if done {
                break;
            }
            self.step(step).await?;
            self.counts.steps = step + 1;
            if self.cfg.progress && step % 25 == 24 {
                eprintln!(
                    "soak: step {} at {:.0} s: {} live pods, {} ADDs ok, {} failed, {} kills, {} violations",
                    step + 1,
                    started.elapsed().as_secs_f64(),
                    self.model.live_pods(),
                    self.counts.adds_ok,
                    self.counts.adds_failed,
                    self.counts.kills,
                    self.violations.len()
                );
            }
            step += 1;
        }
        self.finish(step).await
    }

    async fn pool(&self) -> anyhow::Result<eniipam_api::pb::PoolReply> {
        let ch = self.daemon.channel().context("the daemon is not ready")?;
        Ok(
            eniipam_api::pb::introspect_client::IntrospectClient::new(ch)
                .pool(eniipam_api::pb::PoolRequest {})
                .await?
                .into_inner(),
        )
    }

    fn violation(&mut self, step: u64, kind: &'static str, subject: String, text: String) {
        if !self.reported.insert((kind, subject.clone())) {
            return;
        }
        let context = self
            .recent
            .iter()
            .filter(|(s, _)| s + 12 >= step)
            .map(|(s, t)| format!("step {s} {t}"))
            .collect::<Vec<_>>()
            .join("; ");
        let v = Violation {
            kind,
            subject,
            seed: self.cfg.seed,
            step,
            text,
            context,
        };
        if self.cfg.progress {
            eprintln!("VIOLATION {v}");
        }
        self.violations.push(v);
    }

    fn note_fault(&mut self, step: u64, kind: FaultKind, detail: String) {
        *self.counts.faults.entry(kind.name()).or_insert(0) += 1;
        self.recent.push_back((step, format!("{kind}: {detail}")));
        while self.recent.len() > 16 {
            self.recent.pop_front();
        }
    }

    /// Keeps the first note of each kind (`kind` is the text up to its first ':').
    fn note(&mut self, text: String) {
        let kind = text.split(':').next().unwrap_or_default();
        if self.notes.len() < 20 && !self.notes.iter().any(|n| n.split(':').next() == Some(kind)) {
            self.notes.push(text);
        }
    }

    /// Starts the daemon when it is not running; checks a life that ended by itself.
    async fn ensure_up(&mut self, step: u64) -> anyhow::Result<()> {
        if let Some(status) = self.daemon.exited() {
            let when = if self.host.disk_full() {
                " while the state disk was full"
            } else {
                ""
            };
            let tail = self.daemon.log_tail(4);
            self.violation(
                step,
                "daemon-exited",
                format!("life {}", self.daemon.lives()),
                format!("eniipamd exited by itself{when} ({status}); log: {tail}"),
            );
        }
        if self.daemon.is_running() && self.daemon.channel().is_some() {
            return Ok(());
        }
        if !self.daemon.is_running() {
            self.daemon.spawn()?;
        }
        match self.daemon.wait_ready(READY_DEADLINE).await {
            Ok(()) => {
                self.counts.restarts += 1;
            }
            Err(StartError::Exited(_)) if self.host.disk_full() => {
                self.counts.starts_failed_disk_full += 1;
                let last = self.daemon.log_tail(1);
                self.note(format!(
                    "eniipamd cannot start while its state disk is full (retried each step): {last}"
                ));
            }
            Err(e) => {
                let life = self.daemon.lives();
                self.violation(
                    step,
                    "daemon-down",
                    format!("life {life}"),
                    format!(
                        "eniipamd life {life} did not become ready: {e:?}; log: {}",
                        self.daemon.log_tail(4)
                    ),
                );
                self.daemon.kill().await;
            }
        }
        Ok(())
    }

    async fn step(&mut self, step: u64) -> anyhow::Result<()> {
        let mut rng = step_rng(self.cfg.seed, step, 1);
        self.undo_due(step, false)?;
        self.ensure_up(step).await?;
        let planned = faults::planned(self.cfg.seed, step, &self.cfg.faults);
        let kill = planned.contains(&FaultKind::Kill);
        for k in planned.iter().filter(|k| **k != FaultKind::Kill) {
            self.apply_fault(step, *k).await?;
        }
        if rng.random_bool(GC_CHANCE) {
            let net = rng.random_range(0..self.cfg.networks);
            self.gc(step, net).await;
        }
        let jobs = self.plan_batch(step, &mut rng)?;
        let mut set = JoinSet::new();
        for job in jobs {
            set.spawn(run_job(self.runtime.clone(), job));
        }
        if kill {
            let offset = Duration::from_millis(rng.random_range(0..300));
            tokio::time::sleep(offset).await;
            self.daemon.kill().await;
            self.counts.kills += 1;
            self.note_fault(
                step,
                FaultKind::Kill,
                format!("SIGKILL {} ms into the batch", offset.as_millis()),
            );
        }
        while let Some(r) = set.join_next().await {
            let r = r.context("a pod job panicked")?;
            self.apply(step, r)?;
        }
        self.ensure_up(step).await?;
        self.counts.peak_live_pods = self.counts.peak_live_pods.max(self.model.live_pods());
        self.check(step, false).await;
        Ok(())
    }

    /// Undoes the faults whose time is up (all of them when `all`).
    fn undo_due(&mut self, step: u64, all: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        let (due, keep): (Vec<PendingUndo>, Vec<PendingUndo>) = std::mem::take(&mut self.undos)
            .into_iter()
            .partition(|u| all || (u.due_step <= step && u.not_before <= now));
        self.undos = keep;
        for u in due {
            match u.undo {
                Undo::ClearEc2Faults => self.mock.clear_faults(),
                Undo::Throttling => self.mock.set_throttling(Throttling::default()),
                Undo::ImdsLag => self.mock.set_imds_lag(BASE_IMDS_LAG),
                Undo::Disk => self.host.free_disk()?,
                Undo::Unhide(r) => self.unhide(r)?,
            }
        }
        Ok(())
    }

    fn undo_later(&mut self, step: u64, steps: u64, min: Duration, undo: Undo) {
        self.undos.push(PendingUndo {
            due_step: step + steps,
            not_before: Instant::now() + min,
            undo,
        });
    }

    async fn apply_fault(&mut self, step: u64, kind: FaultKind) -> anyhow::Result<()> {
        let mut rng = step_rng(self.cfg.seed, step, 2);
        let detail = match kind {
            FaultKind::Kill | FaultKind::PodDeath => return Ok(()),
            FaultKind::Ec2Error => {
                let action = *ACTIONS.choose(&mut rng).expect("not empty");
                let code = *ERROR_CODES.choose(&mut rng).expect("not empty");
                let count = rng.random_range(1..=4);
                self.mock.inject_fault(Fault::error(action, code, count));
                format!("next {count} {action} answer {code}")
            }
            FaultKind::Ec2ErrorRate => {
                let code = *ERROR_CODES.choose(&mut rng).expect("not empty");
                let p = rng.random_range(0.1..0.3);
                self.mock.inject_fault(Fault::rate(None, code, p));
                let steps = rng.random_range(2..=5);
                self.undo_later(step, steps, Duration::ZERO, Undo::ClearEc2Faults);
                format!(
                    "{:.0} % of all EC2 calls answer {code} for {steps} steps",
                    p * 100.0
                )
            }
            FaultKind::Ec2Hang => {
                let action = *ACTIONS[..4]
                    .iter()
                    .chain(&ACTIONS[6..7])
                    .collect::<Vec<_>>()
                    .choose(&mut rng)
                    .expect("not empty");
                let ms = rng.random_range(1500..6000);
                let count = rng.random_range(1..=2);
                self.mock
                    .inject_fault(Fault::hang(action, Duration::from_millis(ms), count));
                format!("next {count} {action} hang {ms} ms, then fail")
            }
            FaultKind::Ec2SlowReply => {
                let action = *ACTIONS[..4].choose(&mut rng).expect("not empty");
                let ms = rng.random_range(1000..5000);
                let count = rng.random_range(1..=2);
                self.mock
                    .inject_fault(Fault::slow_reply(action, Duration::from_millis(ms), count));
                format!("next {count} {action} performed, reply held {ms} ms")
            }
            FaultKind::ThrottleBurst => {
                self.mock.set_throttling(Throttling {
                    enabled: true,
                    mutating: mockcloud::Bucket {
                        capacity: 4.0,
                        refill_per_sec: 1.0,
                    },
                    describe: mockcloud::Bucket {
                        capacity: 6.0,
                        refill_per_sec: 2.0,
                    },
                });
                let steps = rng.random_range(3..=7);
                self.undo_later(step, steps, Duration::ZERO, Undo::Throttling);
                format!("account buckets 4 + 1/s mutating, 6 + 2/s describe for {steps} steps")
            }
            FaultKind::ImdsLag => {
                let ms = rng.random_range(1500..5000);
                self.mock.set_imds_lag(Duration::from_millis(ms));
                let steps = rng.random_range(3..=7);
                self.undo_later(step, steps, Duration::ZERO, Undo::ImdsLag);
                format!("IMDS lags EC2 by {ms} ms for {steps} steps")
            }
            FaultKind::OobUnassign => match self.oob_unassign(step, &mut rng)? {
                Some(d) => d,
                None => return Ok(()),
            },
            FaultKind::OobDetach => match self.oob_detach(step, &mut rng)? {
                Some(d) => d,
                None => return Ok(()),
            },
            FaultKind::StateFileRemoved => {
                self.daemon.kill().await;
                self.counts.kills += 1;
                // Half the time the loss meets invisible evidence: one rack's netns hidden across
                // the restart, so the daemon can tell neither who holds those IPs nor that they are free.
                let hidden = if rng.random_bool(0.5) {
                    match self.busiest_visible_rack() {
                        Some(rack) => {
                            self.hide(rack)?;
                            let steps = rng.random_range(6..=10);
                            self.undo_later(
                                step,
                                steps,
                                Duration::from_secs(8),
                                Undo::Unhide(rack),
                            );
                            let pods: Vec<usize> = (0..self.model.pods.len())
                                .filter(|p| {
                                    self.model.pods[*p].rack == rack
                                        && self.model.pods[*p].phase == PodPhase::Running
                                })
                                .collect();
                            for p in &pods {
                                for k in self.model.pods[*p].attachments.clone() {
                                    let a = self.model.atts.get_mut(&k).expect("known");
                                    if a.is_live() {
                                        a.record_lost_hidden = Some(rack);
                                    }
                                }
                            }
                            format!(
                                ", rack {rack} ({} live pods) hidden across the restart for ≥ {steps} steps and 8 s",
                                pods.len()
                            )
                        }
                        None => String::new(),
                    }
                } else {
                    String::new()
                };
                for f in self.host.state_files() {
                    match std::fs::remove_file(&f) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e).with_context(|| format!("removing {}", f.display()));
                        }
                    }
                }
                self.note_fault(
                    step,
                    kind,
                    format!("SIGKILL, state.db + WAL + SHM removed{hidden}, restart"),
                );
                self.ensure_up(step).await?;
                return Ok(());
            }
            FaultKind::DiskFull => {
                // A clean stop checkpoints the WAL away, so the next life's writes need new blocks.
                self.daemon.stop().await;
                self.ensure_up(step).await?;
                let ballast = self.host.fill_disk()?;
                let steps = rng.random_range(6..=10);
                self.undo_later(step, steps, Duration::from_secs(4), Undo::Disk);
                format!(
                    "clean restart, then the state tmpfs filled ({} KiB ballast) for {steps} steps",
                    ballast / 1024
                )
            }
            FaultKind::NetnsHidden => {
                let Some(rack) = self.busiest_visible_rack() else {
                    return Ok(());
                };
                let pods = self
                    .model
                    .pods
                    .iter()
                    .filter(|p| p.rack == rack && p.phase == PodPhase::Running)
                    .count();
                self.hide(rack)?;
                let steps = rng.random_range(6..=10);
                self.undo_later(step, steps, Duration::from_secs(8), Undo::Unhide(rack));
                let restart = rng.random_bool(0.5);
                let detail = format!(
                    "rack {rack} ({pods} live pods) hidden: its netns directory gone for ≥ {steps} steps and 8 s{}",
                    if restart {
                        ", SIGKILL + restart while hidden"
                    } else {
                        ""
                    }
                );
                if restart {
                    self.note_fault(step, kind, detail);
                    self.daemon.kill().await;
                    self.counts.kills += 1;
                    self.ensure_up(step).await?;
                    return Ok(());
                }
                detail
            }
        };
        self.note_fault(step, kind, detail);
        Ok(())
    }

    /// The visible rack with the most live pods, unless half the racks are hidden already (pods
    /// keep coming and going in the others).
    fn busiest_visible_rack(&self) -> Option<usize> {
        let visible: Vec<usize> = (0..RACKS).filter(|r| !self.host.is_hidden(*r)).collect();
        if visible.len() <= RACKS / 2 {
            return None;
        }
        visible.into_iter().max_by_key(|r| {
            self.model
                .pods
                .iter()
                .filter(|p| p.rack == *r && p.phase == PodPhase::Running)
                .count()
        })
    }

    fn hide(&mut self, rack: usize) -> anyhow::Result<()> {
        self.host.hide_rack(rack)?;
        self.model.hidden_racks.insert(rack);
        Ok(())
    }

    fn unhide(&mut self, rack: usize) -> anyhow::Result<()> {
        self.host.unhide_rack(rack)?;
        if self.model.hidden_racks.remove(&rack) {
            self.model.rack_shown_at.insert(rack, Instant::now());
        }
        Ok(())
    }

    fn oob_unassign(
        &mut self,
        step: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> anyhow::Result<Option<String>> {
        let ec2 = checker::Ec2View::read(&self.mock, &self.instance_id)?;
        let candidates: Vec<Key> = self
            .model
            .live()
            .filter(|a| a.oob.is_none() && a.ip.is_some_and(|ip| ec2.ip_eni.contains_key(&ip)))
            .map(|a| a.key.clone())
            .collect();
        let n = rng.random_range(1..=2).min(candidates.len());
        if n == 0 {
            return Ok(None);
        }
        let now = Instant::now();
        let mut done = Vec::new();
        let mut ips = BTreeSet::new();
        for k in candidates.choose_multiple(rng, n) {
            let ip = self.model.atts[k].ip.expect("filtered");
            let eni = ec2.ip_eni[&ip].clone();
            self.mock
                .with_world(|w, at| w.unassign_private_ip_addresses(&eni, &[ip], at))
                .map_err(|e| anyhow::anyhow!("out-of-band unassign of {ip} from {eni}: {e}"))?;
            ips.insert(ip);
            done.push(format!("{ip} of {}/{} from {eni}", k.0, k.1));
        }
        let what = format!("unassigned {}", done.join(", "));
        for a in self.model.atts.values_mut() {
            if a.is_live() && a.ip.is_some_and(|ip| ips.contains(&ip)) {
                a.oob = Some(OobMark {
                    step,
                    at: now,
                    what: what.clone(),
                });
            }
        }
        self.model.oob.push(OobEvent {
            step,
            at: now,
            ips,
            eni: None,
            what: what.clone(),
        });
        self.last_oob = Some(now);
        Ok(Some(what))
    }

    fn oob_detach(
        &mut self,
        step: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> anyhow::Result<Option<String>> {
        let ec2 = checker::Ec2View::read(&self.mock, &self.instance_id)?;
        let live_ips: BTreeSet<Ipv4Addr> = self.model.live().filter_map(|a| a.ip).collect();
        let mut enis: Vec<(&String, &(String, Vec<Ipv4Addr>))> =
            ec2.secondary_enis.iter().collect();
        if enis.is_empty() {
            return Ok(None);
        }
        enis.shuffle(rng);
        let (eni, (att_id, ips)) = enis
            .into_iter()
            .max_by_key(|(_, (_, ips))| ips.iter().filter(|ip| live_ips.contains(ip)).count())
            .expect("not empty");
        let (eni, att_id, ips) = (eni.clone(), att_id.clone(), ips.clone());
        let now = Instant::now();
        self.mock
            .with_world(|w, at| w.detach_network_interface(&att_id, false, at))
            .map_err(|e| anyhow::anyhow!("out-of-band detach of {eni}: {e}"))?;
        let ips: BTreeSet<Ipv4Addr> = ips.into_iter().collect();
        let hit = ips.iter().filter(|ip| live_ips.contains(ip)).count();
        let what = format!(
            "detached {eni} ({} secondary IPs, {hit} held by live pods)",
            ips.len()
        );
        for a in self.model.atts.values_mut() {
            if a.is_live() && a.ip.is_some_and(|ip| ips.contains(&ip)) {
                a.oob = Some(OobMark {
                    step,
                    at: now,
                    what: what.clone(),
                });
            }
        }
        self.model.oob.push(OobEvent {
            step,
            at: now,
            ips,
            eni: Some(eni.clone()),
            what: what.clone(),
        });
        self.last_oob = Some(now);
        Ok(Some(what))
    }

    async fn gc(&mut self, step: u64, net: usize) {
        if self.daemon.channel().is_none() {
            return;
        }
        let valid = self.model.valid_attachments(net);
        match self.runtime.gc(NETWORKS[net], &valid).await {
            Ok(()) => {
                self.counts.gcs_ok += 1;
                for a in self.model.atts.values_mut() {
                    if a.network == net
                        && !a.is_live()
                        && a.state != AttState::Adding
                        && a.collected.is_none()
                    {
                        a.collected = Some(step);
                    }
                }
                self.recent.push_back((
                    step,
                    format!(
                        "GC of {} listing {} live attachments",
                        NETWORKS[net],
                        valid.len()
                    ),
                ));
            }
            Err(e) => {
                self.counts.gcs_failed += 1;
                self.note(format!(
                    "a GC of {} failed: {}",
                    NETWORKS[net],
                    e.error_text()
                ));
            }
        }
    }

    fn pod_args(&self, pod: usize) -> PodArgs {
        let p = &self.model.pods[pod];
        PodArgs {
            container_id: p.container_id.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            netns: p.netns.clone(),
        }
    }

    /// This step's pod operations.
    fn plan_batch(&mut self, step: u64, rng: &mut rand::rngs::StdRng) -> anyhow::Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        // Pods whose time is up (not while their netns is hidden: it cannot be removed then).
        let ending: Vec<usize> = (0..self.model.pods.len())
            .filter(|i| {
                let p = &self.model.pods[*i];
                p.phase == PodPhase::Running && p.end_step <= step && !self.host.is_hidden(p.rack)
            })
            .collect();
        for i in ending {
            let keys: Vec<(Key, usize)> = self.model.pods[i]
                .attachments
                .iter()
                .filter(|k| self.model.atts[*k].is_live())
                .map(|k| (k.clone(), self.model.atts[k].network))
                .collect();
            let dies = self.cfg.faults.contains(&FaultKind::PodDeath)
                && rng.random_bool(faults::DEATH_CHANCE);
            if dies {
                let netns = self.model.pods[i].netns.clone();
                self.host.delete_netns(&netns)?;
                self.model.pods[i].phase = PodPhase::Ended;
                let late = rng.random_bool(0.5).then(|| step + rng.random_range(2..=8));
                for (k, _) in &keys {
                    let a = self.model.atts.get_mut(k).expect("listed");
                    a.state = AttState::Dead;
                    a.ended_step = Some(step);
                    a.late_del = late;
                }
                let cid = self.model.pods[i].container_id.clone();
                self.note_fault(
                    step,
                    FaultKind::PodDeath,
                    format!(
                        "pod {cid} died: netns removed without DEL{}",
                        late.map(|s| format!(", DEL at step {s}"))
                            .unwrap_or_default()
                    ),
                );
                continue;
            }
            busy.insert(i);
            jobs.push(Job::Del {
                pod: i,
                args: self.pod_args(i),
                keys,
                end_pod: true,
            });
        }
        // Late DELs of dead pods, retried DELs.
        let mut extra: BTreeMap<usize, Vec<(Key, usize)>> = BTreeMap::new();
        for a in self.model.atts.values() {
            let due = match a.state {
                AttState::Dead => a.late_del.is_some_and(|s| s <= step),
                AttState::DelFailed => true,
                _ => false,
            };
            if due && !busy.contains(&a.pod) {
                extra
                    .entry(a.pod)
                    .or_default()
                    .push((a.key.clone(), a.network));
            }
        }
        for (pod, keys) in extra {
            for (k, _) in &keys {
                self.model.atts.get_mut(k).expect("listed").late_del = None;
            }
            jobs.push(Job::Del {
                pod,
                args: self.pod_args(pod),
                keys,
                end_pod: false,
            });
        }
        // New pods.
        let live = self.model.live_pods();
        let n = if live < self.target_pods {
            rng.random_range(1..=4)
        } else {
            rng.random_range(0..=1)
        };
        let racks: Vec<usize> = (0..RACKS).filter(|r| !self.host.is_hidden(*r)).collect();
        for j in 0..n {
            let Some(&rack) = racks.choose(rng) else {
                break;
            };
            let nets: Vec<usize> = if self.cfg.networks == 1 {
                vec![0]
            } else {
                match rng.random_range(0.0..1.0) {
                    x if x < 0.45 => vec![0],
                    x if x < 0.80 => vec![1],
                    _ => vec![0, 1],
                }
            };
            let container_id = format!("c{step:05}x{j}s{}", self.cfg.seed);
            let netns = self.host.netns_path(rack, &container_id);
            self.host.create_netns(&netns)?;
            let pod = self.model.pods.len();
            let mut plan = Vec::new();
            for (slot, net) in nets.iter().enumerate() {
                let key = (container_id.clone(), IFNAMES[slot].to_owned());
                self.model.atts.insert(
                    key.clone(),
                    Attachment {
                        key: key.clone(),
                        network: *net,
                        pod,
                        state: AttState::Adding,
                        ip: None,
                        added_step: step,
                        added_at: None,
                        ended_step: None,
                        oob: None,
                        lost_reported: false,
                        collected: None,
                        late_del: None,
                        record_lost_hidden: None,
                    },
                );
                plan.push((key, *net));
            }
            self.model.pods.push(Pod {
                name: format!("pod-{step}-{j}"),
                uid: format!("uid-{step}-{j}-{}", self.cfg.seed),
                container_id,
                rack,
                netns,
                attachments: plan.iter().map(|(k, _)| k.clone()).collect(),
                end_step: step + rng.random_range(2..=30),
                phase: PodPhase::Running,
            });
            self.counts.pods += 1;
            jobs.push(Job::Start {
                pod,
                args: self.pod_args(pod),
                plan,
            });
        }
        Ok(jobs)
    }

    fn record_del(&mut self, step: u64, key: &Key, r: &Result<(), String>, after: AttState) {
        let a = self.model.atts.get_mut(key).expect("known");
        match r {
            Ok(()) => {
                self.counts.dels_ok += 1;
                a.state = after;
                a.ended_step.get_or_insert(step);
            }
            Err(e) => {
                self.counts.dels_failed += 1;
                a.state = AttState::DelFailed;
                let text = format!(
                    "DEL {}/{} failed ({e}); the spec wants DEL to succeed whatever the daemon's state",
                    key.0, key.1
                );
                self.violation(step, "del-failed", format!("{}/{}", key.0, key.1), text);
            }
        }
    }

    fn apply(&mut self, step: u64, r: JobResult) -> anyhow::Result<()> {
        match r {
            JobResult::Started { pod, adds, dels } => {
                let failed = adds.iter().any(|(_, r)| r.is_err());
                for (k, r) in &adds {
                    match r {
                        Ok((ip, at)) => {
                            self.counts.adds_ok += 1;
                            self.ips_seen.insert(*ip);
                            let a = self.model.atts.get_mut(k).expect("known");
                            a.ip = Some(*ip);
                            a.added_at = Some(*at);
                            a.state = AttState::Live;
                        }
                        Err(e) => {
                            self.counts.adds_failed += 1;
                            let code = e.split(' ').take(2).collect::<Vec<_>>().join(" ");
                            *self.counts.add_errors.entry(code).or_insert(0) += 1;
                            self.model.atts.get_mut(k).expect("known").state = AttState::AddFailed;
                        }
                    }
                }
                for (k, r) in &dels {
                    let after = if self.model.atts[k].state == AttState::AddFailed {
                        AttState::AddFailed
                    } else {
                        AttState::Deleted
                    };
                    self.record_del(step, k, r, after);
                }
                if failed {
                    // Attachments never tried (after the failed one) never existed.
                    let keys = self.model.pods[pod].attachments.clone();
                    for k in keys {
                        let a = self.model.atts.get_mut(&k).expect("known");
                        if a.state == AttState::Adding {
                            a.state = AttState::AddFailed;
                            a.ended_step = Some(step);
                        }
                    }
                    let netns = self.model.pods[pod].netns.clone();
                    self.host.delete_netns(&netns)?;
                    self.model.pods[pod].phase = PodPhase::Ended;
                }
            }
            JobResult::Deleted { pod, dels, end_pod } => {
                for (k, r) in &dels {
                    self.record_del(step, k, r, AttState::Deleted);
                }
                if end_pod {
                    let netns = self.model.pods[pod].netns.clone();
                    self.host.delete_netns(&netns)?;
                    self.model.pods[pod].phase = PodPhase::Ended;
                }
            }
        }
        self.counts.distinct_ips = self.ips_seen.len();
        Ok(())
    }

    /// Attachments the pool is asked about: all in the final check, else the live, the dead and
    /// those that ended or were collected lately.
    fn tracked(&self, step: u64, all: bool) -> BTreeSet<Key> {
        self.model
            .atts
            .values()
            .filter(|a| {
                all || a.is_live()
                    || matches!(a.state, AttState::Dead | AttState::DelFailed)
                    || a.ended_step.is_some_and(|s| s + 20 >= step)
                    || a.collected.is_some_and(|s| s + 5 >= step)
            })
            .map(|a| a.key.clone())
            .collect()
    }

    async fn check(&mut self, step: u64, all: bool) {
        let Some(channel) = self.daemon.channel() else {
            self.counts.checks_skipped += 1;
            return;
        };
        let tracked = self.tracked(step, all);
        let store_path = self.host.state_files()[0].clone();
        let rules = Rules {
            grace: self.grace,
            network_names: self.network_names.clone(),
        };
        let witnesses = Witnesses {
            channel,
            store_path: &store_path,
            mock: &self.mock,
            instance_id: &self.instance_id,
            cache_dir: &self.host.cache_dir,
            networks: &self.network_names,
        };
        let obs = match witnesses.observe(&tracked).await {
            Ok(o) => o,
            Err(e) => {
                self.counts.checks_skipped += 1;
                self.note(format!("a check was skipped: {e:#}"));
                return;
            }
        };
        let mut ev = checker::evaluate(&obs, &self.model, &mut self.checker, &rules);
        // Findings that may be a moment between two writes count only if they persist.
        let mut settle: Vec<Found> = ev.found.iter().filter(|f| f.settle).cloned().collect();
        for _ in 0..4 {
            if settle.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok(obs) = witnesses.observe(&tracked).await else {
                settle.clear();
                break;
            };
            let again = checker::evaluate(&obs, &self.model, &mut self.checker, &rules);
            settle.retain(|f| {
                again
                    .found
                    .iter()
                    .any(|g| g.kind == f.kind && g.subject == f.subject)
            });
            ev.reported_lost = again.reported_lost;
        }
        self.counts.checks += 1;
        for k in &ev.reported_lost {
            if let Some(a) = self.model.atts.get_mut(k) {
                a.lost_reported = true;
            }
        }
        let found: Vec<Found> = ev
            .found
            .into_iter()
            .filter(|f| !f.settle)
            .chain(settle)
            .collect();
        for f in found {
            self.violation(step, f.kind, f.subject, f.text);
        }
    }

    /// The end: every fault undone, the out-of-band changes given time to be noticed, a GC of every
    /// network, then a check of every attachment ever made.
    async fn finish(&mut self, step: u64) -> anyhow::Result<()> {
        self.undo_due(step, true)?;
        self.mock.clear_faults();
        self.mock.set_throttling(Throttling::default());
        self.mock.set_imds_lag(BASE_IMDS_LAG);
        for r in self.host.hidden_racks() {
            self.unhide(r)?;
        }
        self.host.free_disk()?;
        self.ensure_up(step).await?;
        // DELs still owed.
        let mut set = JoinSet::new();
        let mut owed: BTreeMap<usize, Vec<(Key, usize)>> = BTreeMap::new();
        for a in self.model.atts.values() {
            if a.state == AttState::DelFailed || (a.state == AttState::Dead && a.late_del.is_some())
            {
                owed.entry(a.pod)
                    .or_default()
                    .push((a.key.clone(), a.network));
            }
        }
        for (pod, keys) in owed {
            set.spawn(run_job(
                self.runtime.clone(),
                Job::Del {
                    pod,
                    args: self.pod_args(pod),
                    keys,
                    end_pod: false,
                },
            ));
        }
        while let Some(r) = set.join_next().await {
            self.apply(step, r.context("a pod job panicked")?)?;
        }
        // Out-of-band changes, and discrepancies the checker is timing, get their grace period.
        self.check(step, false).await;
        let until = [
            self.last_oob.map(|at| at + self.grace),
            self.checker.judged_by(self.grace),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(until) = until {
            let now = Instant::now();
            if until > now {
                tokio::time::sleep(until - now + Duration::from_millis(100)).await;
            }
        }
        self.ensure_up(step).await?;
        for net in 0..self.cfg.networks {
            self.gc(step, net).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.check(step, true).await;
        if self.cfg.progress {
            eprintln!(
                "soak: finished after {step} steps: {} live pods, {} violations",
                self.model.live_pods(),
                self.violations.len()
            );
        }
        Ok(())
    }
}
